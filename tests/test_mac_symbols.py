"""The macOS symbol check (dev/check_mac_symbols.py) on small libraries built here like the op library (setup.py's
build_spec flags, ld64.lld against the 12.0 .tbd stubs): a library with csrc/metal/platform_version.mm passes, the two
negative controls fail for their own reason, and each rule of the library's shape catches its violation. A small
stand-in libtensorflow_framework.2.dylib (built here, exporting TF_GetStream) replaces TF's, so nothing is
downloaded; CI checks the real wheel against TF's own framework dylibs (dev/build_mac_wheel.py)."""

import dataclasses
import importlib.util
import os
import subprocess
import sys

import pytest

from support.native import skip_or_fail

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "dev"))
import check_mac_symbols  # noqa: E402
import macho  # noqa: E402
import macos_cross  # noqa: E402

FAKE_FRAMEWORK = r"""
extern "C" __attribute__((visibility("default"))) void* TF_GetStream(void*, void*) { return nullptr; }
"""


@pytest.fixture(scope="module")
def toolchain(tmp_path_factory):
    """(stand-in TF directory, TF C API headers directory), or skip/fail naming what is missing."""
    try:
        macos_cross.clangxx(), macos_cross.ld64_lld(), macos_cross.sdk_headers()
        stubs = macos_cross.sdk_stubs()
    except macos_cross.Missing as e:
        skip_or_fail(f"the macOS symbol check needs the cross toolchain: {e}")
    spec = importlib.util.find_spec("tensorflow")
    headers = list(spec.submodule_search_locations)[0]  # the C API headers are the same on every platform
    fake = tmp_path_factory.mktemp("fake-tf")
    src, obj, lib = fake / "fw.cc", fake / "fw.o", fake / macos_cross.FRAMEWORK
    src.write_text(FAKE_FRAMEWORK)
    for cmd in ([macos_cross.clangxx(), "--target=" + macos_cross.TARGET, "-c", str(src), "-o", str(obj)],
                [macos_cross.clangxx(), "--target=" + macos_cross.TARGET, "-fuse-ld=lld",
                 "--ld-path=" + macos_cross.ld64_lld(), "-isysroot", stubs, "-dynamiclib", str(obj),
                 "-install_name", "@rpath/" + macos_cross.FRAMEWORK, "-o", str(lib)]):
        subprocess.run(cmd, check=True, capture_output=True)
    return str(fake), headers


@pytest.fixture(scope="module")
def good_library(toolchain, tmp_path_factory):
    fake, headers = toolchain
    return check_mac_symbols.build_control(
        "with_shim", check_mac_symbols.CONTROL_AVAILABLE, str(tmp_path_factory.mktemp("good")), headers,
        link_dir=fake, extra_sources=[os.path.join(REPO_ROOT, "csrc", "metal", "platform_version.mm")])


def test_library_with_the_shim_passes(toolchain, good_library):
    lines = []
    assert check_mac_symbols.check(good_library, {"stand-in": toolchain[0]}, show=lines.append), "\n".join(lines)
    assert any("1 libtensorflow_framework.2.dylib" in line for line in lines), lines


def test_negative_controls_fail(toolchain):
    fake, headers = toolchain
    lines = []
    assert check_mac_symbols.negative_controls("stand-in", fake, headers, show=lines.append), "\n".join(lines)
    assert [line.split(":")[0] for line in lines] == ["negative control without_shim",
                                                       "negative control missing_tf_function"]


@pytest.mark.parametrize("change, expected", [
    (dict(rpaths=["@loader_path/../tensorflow", "/build/site-packages/tensorflow"]), "rpaths"),
    (dict(install_name="/tmp/libtf_metal_ops.so"), "install name"),
    (dict(minos="14.0"), "minimum macOS"),
    (dict(has_code_signature=False), "LC_CODE_SIGNATURE"),
    (dict(cputype=macho.CPU_TYPE_X86_64), "CPU type"),
    (dict(exports={"_tfmo_control": macho.Export(0), "__ZN4absl4CordD1Ev": macho.Export(0)}), "other than tfmo_"),
])
def test_shape_rules(good_library, change, expected):
    img = macho.read_macho(good_library)
    assert check_mac_symbols.check_image(img) == []
    problems = check_mac_symbols.check_image(dataclasses.replace(img, **change))
    assert len(problems) == 1 and expected in problems[0], problems
