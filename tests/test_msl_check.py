"""The strict Metal-language check (tf_metal_ops.msl_check, CLI dev/check_msl.py): today's kernels and shared
headers are clean at MSL 2.4 and 3.0, each rule has a negative control (tests/msl_check/broken_<rule>.metal, whose
`// expect-finding: RULE` comments give every finding it must produce, and nothing else), a clean kernel that uses
the features next to the rules gives nothing, and `#line` directives map the findings.

Every clang run of the module is made once, in parallel on two processes, by the `results` fixture."""

import glob
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tf_metal_ops import msl_check

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = os.path.join(REPO_ROOT, "tests", "msl_check")
VERSIONS = ("2.4", "3.0")
KERNELS = sorted(glob.glob(os.path.join(REPO_ROOT, "metal_kernels", "*.metal")))
HEADERS = sorted(glob.glob(os.path.join(REPO_ROOT, "csrc", "shared", "*.h")))
BROKEN = sorted(glob.glob(os.path.join(CASES, "broken_*.metal")))
GOOD = os.path.join(CASES, "good_kernel.metal")
INCLUDE_DIRS = [os.path.join(REPO_ROOT, "csrc", "shared"), os.path.join(REPO_ROOT, "metal_kernels")]

# #line: the clang error (compile), an AST rule and a kernel-signature rule, all at presumed positions.
LINE_SOURCE = """#include <metal_stdlib>
using namespace metal;
#line 40 "user_kernel.metal"
kernel void k(device float* x [[buffer(0)]], device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  thread float* p = x;
  x[i] = sizeof(double) + y[i];
}
"""
LINE_EXPECTED = {("user_kernel.metal", 40, "buffer-index-duplicate"), ("user_kernel.metal", 41, "compile"),
                 ("user_kernel.metal", 42, "double")}


def rule_of(path):
    return os.path.basename(path)[len("broken_"):-len(".metal")]


def expected_findings(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    return {(n, rule) for n, text in enumerate(lines, start=1)
            for rule in re.findall(r"expect-finding: ([\w-]+)", text)}


def version_of(path):
    with open(path, encoding="utf-8") as f:
        m = re.search(r"msl-version: (\S+)", f.read())
    return m.group(1) if m else "3.0"


def mutated_hash_grid():
    """hash_grid.metal with the address space of one kernel template's argument removed (so the calls that pass it on
    to `device const float*` parameters do not compile either, in each instance) and a buffer index duplicated."""
    path = os.path.join(REPO_ROOT, "metal_kernels", "hash_grid.metal")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    first = ("[[kernel]] void hash_grid_encode(device const float* positions [[buffer(0)]], "
             "device const T* params [[buffer(1)]],")
    assert first in text
    text = text.replace(first, first.replace("device const float*", "const float*").replace("[[buffer(1)]]",
                                                                                         "[[buffer(0)]]"), 1)
    lines = text.split("\n")
    n1 = next(i for i, ln in enumerate(lines, 1) if "hash_grid_encode(const float* positions" in ln)
    calls = [next(i for i, ln in enumerate(lines, 1) if i > n1 and f"{fn}<T, false>(positions, params" in ln)
             for fn in ("hg_encode_d3f2", "hg_encode")]
    return path, text, {(n1, "pointer-address-space"), (n1, "buffer-index-duplicate"),
                        *((c, "compile") for c in calls)}


@pytest.fixture(scope="module")
def results(clang16):
    """(name, version) -> findings, for every check this module makes; also the time of each run."""
    jobs = {}
    for path in KERNELS + HEADERS + [GOOD]:
        for v in VERSIONS:
            jobs[(path, v)] = lambda p=path, v=v: msl_check.check_file(p, msl_version=v, include_dirs=INCLUDE_DIRS,
                                                                       compiler=clang16)
    for path in BROKEN:
        v = version_of(path)
        jobs[(path, v)] = lambda p=path, v=v: msl_check.check_file(p, msl_version=v, compiler=clang16)
    atomic = os.path.join(CASES, "broken_atomic-float.metal")
    jobs[(atomic, "3.0")] = lambda: msl_check.check_file(atomic, msl_version="3.0", compiler=clang16)
    jobs[("#line", "3.0")] = lambda: msl_check.check_source(LINE_SOURCE, filename="inline.metal", compiler=clang16)
    path, text, _ = mutated_hash_grid()
    jobs[("mutated", "3.0")] = lambda: msl_check.check_source(text, filename=path, include_dirs=INCLUDE_DIRS,
                                                             compiler=clang16)

    def timed(fn):
        t = time.monotonic()
        out = fn()
        return out, time.monotonic() - t

    with ThreadPoolExecutor(2) as pool:
        done = dict(zip(jobs, pool.map(timed, jobs.values())))
    return done


def findings(results, key):
    return results[key][0]


def show(fs):
    return "\n".join(str(f) for f in fs) or "(none)"


# ---- today's sources -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", KERNELS + HEADERS, ids=lambda p: os.path.relpath(p, REPO_ROOT))
def test_todays_kernels_and_shared_headers_are_clean(results, path, version):
    assert findings(results, (path, version)) == [], show(findings(results, (path, version)))


def test_every_kernel_and_header_is_checked():
    """The glob finds the kernels of every op family that has a .metal file and the shared headers of every family
    that has per-element math (names from op_names.h; the layout rule is tests/test_op_layout.py's)."""
    op_names = open(os.path.join(REPO_ROOT, "csrc", "common", "op_names.h"), encoding="utf-8").read()
    families = re.findall(r"^//\s*family:\s*(\w+)\s*$", op_names, re.M)
    assert len(families) >= 6, families
    kernels = {os.path.join(REPO_ROOT, "metal_kernels", f + ".metal") for f in families}
    headers = {os.path.join(REPO_ROOT, "csrc", "shared", f + "_math.h") for f in families}
    assert len(kernels & set(KERNELS)) >= 5 and kernels & set(KERNELS) == {k for k in kernels if os.path.isfile(k)}
    assert len(headers & set(HEADERS)) >= 3 and headers & set(HEADERS) == {h for h in headers if os.path.isfile(h)}
    assert os.path.join(REPO_ROOT, "csrc", "shared", "device_compat.h") in HEADERS


# ---- negative controls --------------------------------------------------------------------------------------------
def test_every_rule_has_a_negative_control():
    assert sorted(rule_of(p) for p in BROKEN) == sorted(msl_check.RULES)


@pytest.mark.parametrize("path", BROKEN, ids=rule_of)
def test_negative_control(results, path):
    expected = expected_findings(path)
    assert rule_of(path) in {rule for _, rule in expected}, "the control does not expect its own rule"
    got = findings(results, (path, version_of(path)))
    assert {(f.line, f.rule) for f in got} == expected, show(got)
    assert all(f.file == path and f.column >= 1 and f.message for f in got), show(got)


def test_atomic_float_is_valid_from_msl_3_0(results):
    got = findings(results, (os.path.join(CASES, "broken_atomic-float.metal"), "3.0"))
    assert got == [], show(got)


def test_a_mutated_kernel_is_caught_through_its_includes(results):
    _, _, expected = mutated_hash_grid()
    got = findings(results, ("mutated", "3.0"))
    assert {(f.line, f.rule) for f in got} == expected, show(got)


# ---- clean source, #line, speed -----------------------------------------------------------------------------------
@pytest.mark.parametrize("version", VERSIONS)
def test_clean_kernel_gives_no_finding(results, version):
    assert findings(results, (GOOD, version)) == [], show(findings(results, (GOOD, version)))


def test_line_directives_give_the_presumed_file_and_line(results):
    got = findings(results, ("#line", "3.0"))
    assert {(f.file, f.line, f.rule) for f in got} == LINE_EXPECTED, show(got)


def test_a_small_kernel_checks_in_well_under_two_seconds(results):
    # Each run above is one clang process; the zero_out kernels are the small case (two processes ran at once).
    elapsed = results[(os.path.join(REPO_ROOT, "metal_kernels", "zero_out.metal"), "3.0")][1]
    assert elapsed < 2.0, elapsed


# ---- API details ----------------------------------------------------------------------------------------------------
def test_finding_and_error_format():
    f = msl_check.Finding("k.metal", 3, 5, "goto", "goto is not supported in MSL")
    assert str(f) == "k.metal:3:5: error: goto is not supported in MSL [goto]"
    err = msl_check.MSLCheckError([f, f])
    assert isinstance(err, ValueError) and err.findings == [f, f]
    assert str(err) == f"{f}\n{f}"
    with pytest.raises(Exception):
        f.line = 4  # frozen


def test_bad_version_is_refused(clang16):
    with pytest.raises(ValueError, match="msl_version"):
        msl_check.check_source("", msl_version="3", compiler=clang16)


def test_missing_compiler_names_the_package(monkeypatch):
    monkeypatch.setenv("TF_METAL_OPS_CLANGXX", "/nonexistent/clang++")
    with pytest.raises(msl_check.MSLCompilerNotFound, match="apt-get install clang-16"):
        msl_check.find_compiler()
    monkeypatch.setenv("TF_METAL_OPS_CLANGXX", sys.executable)  # exists, not clang
    with pytest.raises(msl_check.MSLCompilerNotFound, match="not clang"):
        msl_check.find_compiler()


def test_installed_package_ships_the_stub():
    d = msl_check.include_dir()
    assert (d / "metal_stdlib").is_file() and (d / "msl_check_prelude.h").is_file()
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(msl_check.__file__)))  # tf_metal_ops/
    if not pkg.startswith(REPO_ROOT + os.sep):  # a regular (non-editable) install: the wheel's package data
        assert str(d).startswith(os.path.join(pkg, "_sources") + os.sep), d


def test_module_works_without_tensorflow(clang16):
    # As dev/check_msl.py loads it: tf_metal_ops registered as a bare package (its __init__, which imports
    # TensorFlow, not run), then the subpackage imported normally.
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(msl_check.__file__)))
    code = (
        "import sys, importlib, importlib.machinery, importlib.util\n"
        "sys.modules['tensorflow'] = None\n"  # any import of tensorflow now fails
        "p = importlib.util.module_from_spec(importlib.machinery.ModuleSpec('tf_metal_ops', None, is_package=True))\n"
        f"p.__path__ = [{pkg!r}]; sys.modules['tf_metal_ops'] = p\n"
        "m = importlib.import_module('tf_metal_ops.msl_check')\n"
        "fs = m.check_source('kernel void k(device float* x [[buffer(0)]]) { goto e; e: ; }',\n"
        f"                   compiler={clang16!r})\n"
        "print([(f.line, f.rule) for f in fs])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[(1, 'goto')]", r.stdout


def test_cli_reports_findings_and_fails(clang16):
    env = dict(os.environ, TF_METAL_OPS_CLANGXX=clang16)
    r = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "dev", "check_msl.py"), "--version", "3.0", GOOD,
                        os.path.join(CASES, "broken_goto.metal")], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "PASS  tests/msl_check/good_kernel.metal  MSL 3.0" in r.stdout, r.stdout
    finding = r"^  tests/msl_check/broken_goto\.metal:6:\d+: error: .*\[goto\] \(MSL 3\.0\)$"
    assert re.search(finding, r.stdout, re.M), r.stdout
    assert "summary: 1/2 clean" in r.stdout, r.stdout


# ---- against Apple's compiler, where there is one (the macOS CI job) -------------------------------------------------
def _apple_metal():
    import shutil

    if sys.platform != "darwin" or shutil.which("xcrun") is None:
        return None
    r = subprocess.run(["xcrun", "-sdk", "macosx", "-f", "metal"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else None


def test_apple_compiler_agrees(tmp_path):
    """Each negative control is rejected by Apple's Metal compiler at its version and the clean kernel compiles at
    both: the rules are what Apple's compiler enforces. Only where Xcode's Metal toolchain exists (never on Linux)."""
    metal = _apple_metal()
    if metal is None:
        pytest.skip("needs Apple's Metal compiler (xcrun metal, macOS with Xcode)")
    flag = {"2.4": "-std=macos-metal2.4", "3.0": "-std=metal3.0"}
    wrong = []
    for path in BROKEN + [GOOD]:
        for v in VERSIONS if path == GOOD else (version_of(path),):
            r = subprocess.run([metal, flag[v], "-c", path, "-o", str(tmp_path / "out.air")], capture_output=True,
                               text=True, timeout=300)
            if path == GOOD and r.returncode != 0:
                wrong.append(f"Apple's compiler rejected the clean kernel at MSL {v}:\n{r.stderr}")
            if path != GOOD and r.returncode == 0:
                wrong.append(f"Apple's compiler accepted {os.path.basename(path)} at MSL {v}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("status", [0, 1, 139])
def test_a_failed_or_empty_clang_run_is_never_clean(tmp_path, status):
    fake = tmp_path / "clang++"
    fake.write_text(f"#!/bin/sh\ncat > /dev/null\nexit {status}\n")
    fake.chmod(0o755)
    got = msl_check.check_source("kernel void k() {}", compiler=str(fake))
    assert [f.rule for f in got] == ["compile"], show(got)
