"""The Mac build checked on Linux: Objective-C++ host code and CPU sources compiled against the real macOS SDK
headers (dev/check_mac_host.py), negative controls that must be rejected, and the Metal-source tools
(tf_metal_ops/metal_sources.py) that embed the kernels in the op library."""

import glob
import importlib.util
import os
import re
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECK = os.path.join(REPO_ROOT, "dev", "check_mac_host.py")
TARGETS = ("arm64-apple-macos12", "x86_64-apple-macos12")
BROKEN = sorted(glob.glob(os.path.join(REPO_ROOT, "tests", "mac_check", "broken_*")))
FIXTURE = os.path.join(REPO_ROOT, "tests", "mac_check", "metal_fixture")
FIXTURE_DIRS = [os.path.join(FIXTURE, "kernels"), os.path.join(FIXTURE, "shared")]


def _load(name, folder):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO_ROOT, folder, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


metal_sources = _load("metal_sources", "tf_metal_ops")


def run_check(*args):
    r = subprocess.run([sys.executable, CHECK, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    return r.returncode, r.stdout + r.stderr


def expected_errors(path):
    with open(path, encoding="utf-8") as f:
        return re.findall(r"//\s*expect-error:\s*(.+?)\s*$", f.read(), flags=re.M)


# ---- the compile check --------------------------------------------------------------------------------------
def test_sources_compile_for_both_mac_targets(mac_host_check):
    code, out = run_check()
    assert code == 0, out
    sources = [os.path.relpath(p, REPO_ROOT) for p in mac_host_check.discover_sources()]
    assert "csrc/metal/backend.mm" in sources and "csrc/metal/device.mm" in sources and "csrc/gpu/zero_out_gpu.cc" in sources
    assert not [s for s in sources if s.startswith("csrc/emulated_gpu/")]  # Linux-only emulated GPU
    assert any(s.startswith("csrc/cpu/") and s.endswith(".cc") for s in sources)
    for source in sources + ["metal_embedded_sources.cc"]:
        for target in TARGETS:
            assert re.search(r"^PASS  \S*%s\s+%s\s+object: Mach-O 64" % (re.escape(source), target), out,
                             flags=re.M), f"no PASS line for {source} {target}:\n{out}"
    assert "FAIL" not in out
    assert "summary: %d/%d" % (2 * (len(sources) + 1), 2 * (len(sources) + 1)) in out


def test_sdk_is_unpacked_outside_the_repo(mac_host_check):
    sdk = os.path.realpath(mac_host_check.find_sdk())
    assert not sdk.startswith(os.path.realpath(REPO_ROOT) + os.sep)
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True).stdout.split()
    assert not [p for p in tracked if ".sdk/" in p or p.endswith(".tgz")], "SDK files must never be in the repo"


@pytest.mark.parametrize("path", BROKEN, ids=os.path.basename)
def test_broken_file_is_rejected_with_its_error(mac_host_check, path):
    expected = expected_errors(path)
    assert expected, f"{path} declares no // expect-error: line"
    code, out = run_check(path)
    assert code == 1, out
    assert out.count("FAIL  ") == len(TARGETS), out
    for text in expected:
        assert text in out, f"{os.path.basename(path)}: the compiler did not report {text!r}:\n{out}"
    code, out = run_check("--expect-fail", path)
    assert code == 0, out
    assert out.count("rejected: ") == len(TARGETS), out


def test_documented_example_op_compiles(mac_host_check):
    """docs/metal_host.md's example (tests/mac_check/good_example_op.cc) uses the host layer as documented."""
    code, out = run_check(os.path.join(REPO_ROOT, "tests", "mac_check", "good_example_op.cc"))
    assert code == 0, out
    assert out.count("PASS  ") == len(TARGETS), out


def test_expect_fail_mode_is_not_vacuous(mac_host_check):
    code, out = run_check("--expect-fail", os.path.join(REPO_ROOT, "csrc", "gpu", "zero_out_gpu.cc"))
    assert code == 1
    assert "compiled, but it must be rejected" in out


def test_broken_controls_cover_each_error_class():
    names = {os.path.basename(p) for p in BROKEN}
    assert {"broken_selector.mm", "broken_bridge.mm", "broken_availability.mm", "broken_argtype.mm",
            "broken_unused.cc"} <= names


# ---- tf_metal_ops/metal_sources.py ---------------------------------------------------------------------------------
def test_inline_includes_inlines_each_pragma_once_header_once():
    src = metal_sources.inline_includes(os.path.join(FIXTURE, "kernels", "fixture.metal"), FIXTURE_DIRS)
    code = [line for line in src.splitlines() if not line.lstrip().startswith("//")]
    assert not [line for line in code if re.match(r'\s*#\s*include\s*"', line)]
    assert "#include <metal_stdlib>" in code
    assert src.count("inline float fixture_twice") == 1  # common.h: direct, via nested.h, and again
    assert src.count("inline float fixture_nested") == 1
    assert not re.search(r"^\s*#\s*pragma\s+once", src, flags=re.M)
    assert src.index("fixture_twice(float x)") < src.index("fixture_nested(float x)") < src.index("kernel void")
    assert '#line 1 "common.h"' in src and '#line 1 "fixture.metal"' in src


def test_inline_includes_reports_missing_headers_and_cycles(tmp_path):
    (tmp_path / "k.metal").write_text('#include <metal_stdlib>\n#include "nowhere.h"\n')
    with pytest.raises(metal_sources.MetalSourceError, match=r'k\.metal:2: #include "nowhere\.h" not found'):
        metal_sources.inline_includes(str(tmp_path / "k.metal"), [str(tmp_path)])
    (tmp_path / "a.h").write_text('#include "b.h"\n')
    (tmp_path / "b.h").write_text('#include "a.h"\n')
    (tmp_path / "c.metal").write_text('#include "a.h"\n')
    with pytest.raises(metal_sources.MetalSourceError, match="include cycle"):
        metal_sources.inline_includes(str(tmp_path / "c.metal"), [str(tmp_path)])


def test_project_kernels_inline():
    dirs = [os.path.join(REPO_ROOT, "metal_kernels"), os.path.join(REPO_ROOT, "csrc", "shared")]
    files = sorted(glob.glob(os.path.join(REPO_ROOT, "metal_kernels", "*.metal")))
    assert files, "metal_kernels/*.metal missing"
    for path in files:
        src = metal_sources.inline_includes(path, dirs)
        assert not re.search(r'^\s*#\s*include\s*"', src, flags=re.M), path


def test_embedded_source_round_trips_through_the_compiler(clang16, tmp_path):
    """The generated C++ string literals give back exactly the inlined text (quotes, backslashes, ??, tabs,
    UTF-8), and the table ends with the {nullptr, nullptr} sentinel."""
    kernel = os.path.join(FIXTURE, "kernels", "fixture.metal")
    cc = metal_sources.write_embedded_source(str(tmp_path / "gen" / "embedded.cc"), [kernel], FIXTURE_DIRS)
    mtime = os.stat(cc).st_mtime_ns
    metal_sources.write_embedded_source(cc, [kernel], FIXTURE_DIRS)
    assert os.stat(cc).st_mtime_ns == mtime, "an unchanged embedded source must not be rewritten"
    (tmp_path / "main.cc").write_text(
        '#include <cstdio>\n#include "metal/embedded_sources.h"\n'
        "int main() {\n"
        "  const auto* e = tfmo::metal::kEmbeddedMetalSources;\n"
        '  std::fputs(e[0].name, stdout); std::fputc(0, stdout); std::fputs(e[0].source, stdout);\n'
        "  return e[1].name == nullptr && e[1].source == nullptr ? 0 : 3;\n}\n"
    )
    exe = str(tmp_path / "roundtrip")
    subprocess.run([clang16, "-std=c++17", "-Wall", "-Werror", "-I", os.path.join(REPO_ROOT, "csrc"), cc,
                    str(tmp_path / "main.cc"), "-o", exe], check=True)
    r = subprocess.run([exe], capture_output=True, check=True)
    name, source = r.stdout.split(b"\0", 1)
    assert name == b"fixture.metal"
    assert source.decode("utf-8") == metal_sources.inline_includes(kernel, FIXTURE_DIRS)


def test_embedded_source_with_no_kernels_is_just_the_sentinel(tmp_path):
    text = metal_sources.embedded_source_text([], [])
    assert "{nullptr, nullptr}" in text and "kEmbeddedMetalSources[]" in text


def test_duplicate_kernel_file_names_are_rejected(tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "same.metal").write_text("// empty\n")
    with pytest.raises(metal_sources.MetalSourceError, match="share a name"):
        metal_sources.embedded_source_text([str(tmp_path / "a" / "same.metal"), str(tmp_path / "b" / "same.metal")],
                                           [])


@pytest.mark.skipif(sys.platform == "darwin", reason="the Metal toolchain may exist on macOS")
def test_build_metallib_without_xcrun_returns_false_and_removes_stale_outputs(tmp_path, capsys):
    out = tmp_path / metal_sources.METALLIB_NAME
    stale3 = tmp_path / metal_sources.METAL3_METALLIB_NAME
    out.write_bytes(b"stale")
    stale3.write_bytes(b"stale")
    kernel = os.path.join(FIXTURE, "kernels", "fixture.metal")
    assert metal_sources.build_metallib([kernel], FIXTURE_DIRS, str(out)) is False
    assert "xcrun" in capsys.readouterr().out
    assert not out.exists() and not stale3.exists()


def test_metallib_build_commands_turn_fast_math_off(tmp_path, monkeypatch):
    """Both metallib variants are compiled with -fno-fast-math (`xcrun metal` defaults to fast math; the kernels
    rely on IEEE NaN/inf behaviour). The toolchain is faked: only the commands are checked."""
    commands = []

    class Done:
        returncode, stdout = 0, ""

    def fake_run(cmd):
        commands.append(cmd)
        return Done()

    monkeypatch.setattr(metal_sources, "_metal_toolchain", lambda: None)
    monkeypatch.setattr(metal_sources, "_run", fake_run)
    kernel = os.path.join(FIXTURE, "kernels", "fixture.metal")
    assert metal_sources.build_metallib([kernel], FIXTURE_DIRS, str(tmp_path / metal_sources.METALLIB_NAME))
    compiles = [c for c in commands if c[:4] == ["xcrun", "-sdk", "macosx", "metal"]]
    assert sorted(next(a for a in c if a.startswith("-std=")) for c in compiles) == [
        "-std=macos-metal2.4", "-std=metal3.0"]
    for c in compiles:
        assert "-fno-fast-math" in c and "-ffast-math" not in c, c
        assert c[c.index("-c") + 1] == kernel
    assert len([c for c in commands if c[:4] == ["xcrun", "-sdk", "macosx", "metallib"]]) == 2


def test_metal_compile_command_flags():
    cmd = metal_sources.metal_compile_command("k.metal", "k.air", ["inc"], "metal3.0", "13.0")
    assert cmd[:4] == ["xcrun", "-sdk", "macosx", "metal"]
    assert {"-std=metal3.0", "-mmacosx-version-min=13.0", "-fno-fast-math"} <= set(cmd)
    assert cmd[cmd.index("-o") + 1] == "k.air" and cmd[cmd.index("-I") + 1] == "inc"
