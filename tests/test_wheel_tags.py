"""The rules that decide whether a wheel is written: dev/tag_linux_wheel.py's reading of `auditwheel show` (only
TensorFlow's own library may stand outside the manylinux policy) and dev/build_mac_wheel.py's check of the macOS
wheel (tag, the checked library, nothing of dev/). Pure Python on synthetic inputs: no build."""

import os
import sys
import zipfile

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "dev"))
import build_mac_wheel  # noqa: E402
import tag_linux_wheel  # noqa: E402

TF = "libtensorflow_framework.so.2"


def report(external, blockers, sym_tag="manylinux_2_35_x86_64"):
    return {"sym_tag": sym_tag, "external_libs": {lib: None for lib in external},
            "policy_upgrades": {sym_tag: {"libs_to_eliminate": blockers}}}


def test_tensorflow_alone_outside_the_policy_is_accepted():
    assert tag_linux_wheel.problems_of(report([TF], [TF])) == []


@pytest.mark.parametrize("rep, expected", [
    (report([TF, "libfoo.so.1"], [TF, "libfoo.so.1"]), "besides TensorFlow's"),
    (report([TF], [TF], sym_tag="linux_x86_64"), "allow no manylinux tag"),
])
def test_other_obstacles_are_refused(rep, expected):
    problems = tag_linux_wheel.problems_of(rep)
    assert problems and expected in problems[0], problems


def test_only_py3_none_linux_wheels_are_tagged(tmp_path):
    wheel = tmp_path / "tf_metal_ops-0.1.0-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"")
    with pytest.raises(ValueError, match="py3-none-linux"):
        tag_linux_wheel.tag(str(wheel), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def _wheel(path, files):
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return str(path)


def test_mac_wheel_check_refuses_a_wrong_wheel(tmp_path):
    lib = tmp_path / "libtf_metal_ops.so"
    lib.write_bytes(b"checked library")
    meta = "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: py3-none-macosx_12_0_arm64\n"
    wrong = _wheel(tmp_path / "tf_metal_ops-0.1.0-cp311-cp311-macosx_12_0_arm64.whl", {
        "tf_metal_ops/libtf_metal_ops.so": b"another library",
        "tf_metal_ops-0.1.0.dist-info/WHEEL": meta,
        "dev/check_mac_symbols.py": "",
        "tf_metal_ops/_sources/MacOSX12.0.sdk/usr/lib/libSystem.tbd": "",
    })
    problems = "\n".join(build_mac_wheel.check_wheel(wrong, str(lib)))
    for expected in ("expected the tag py3-none-macosx_12_0_arm64", "not the library that was checked",
                     "dev/check_mac_symbols.py is a development tool", "a macOS SDK"):
        assert expected in problems, problems
