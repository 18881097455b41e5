"""No FMA contraction in the Metal build: the CPU kernels are compiled with -ffp-contract=off, so
the Metal side must not fuse a*b + c either, or GPU results near cell boundaries differ from the CPU's.

- csrc/shared/device_compat.h's Metal branch (included by every .metal file and shared header) turns contraction
  off with `#pragma clang fp contract(off)`: compiled as MSL by clang (msl_check's stub <metal_stdlib>, clang's
  default contraction, -O2), `a * b + c` stays a multiply and an add in the IR, while the same code without the
  pragma is contracted (checked too, so the test cannot pass vacuously).
- The metallib compile flags (tf_metal_ops/metal_sources.py) carry -ffp-contract=off as well.
Whether Apple's compiler honours the pragma in every mode is for a Mac to show (docs/metal_host.md).
"""

import importlib.util
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUB = os.path.join(ROOT, "csrc", "msl_check", "include")
PROBE = "float probe(float a, float b, float c) { return a * b + c; }\n"


def ir(clang16, source, include_dir):
    cmd = [clang16, "-x", "c++", "-std=c++14", "-w", "-nostdinc", "-nostdinc++", "-isystem", STUB, "-include",
           os.path.join(STUB, "msl_check_prelude.h"), "-D__METAL_VERSION__=300", f"-I{include_dir}", "-O2", "-S",
           "-emit-llvm", "-o", "-", "-"]
    return subprocess.run(cmd, input=source, capture_output=True, text=True, check=True).stdout


def contracted(text):
    return re.search(r"llvm\.fmuladd|llvm\.fma\b|\bfma\b", text) is not None


def test_device_compat_turns_contraction_off_in_the_metal_branch(clang16, tmp_path):
    shared = os.path.join(ROOT, "csrc", "shared")
    assert not contracted(ir(clang16, '#include "device_compat.h"\n' + PROBE, shared))
    # Control: the same Metal branch without the pragma contracts.
    with open(os.path.join(shared, "device_compat.h")) as f:
        header = f.read()
    assert "#pragma clang fp contract(off)" in header
    (tmp_path / "device_compat.h").write_text(header.replace("#pragma clang fp contract(off)", ""))
    assert contracted(ir(clang16, '#include "device_compat.h"\n' + PROBE, str(tmp_path)))


def test_metallib_flags_turn_contraction_off():
    spec = importlib.util.spec_from_file_location("metal_sources", os.path.join(ROOT, "tf_metal_ops", "metal_sources.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert "-ffp-contract=off" in mod.METAL_COMPILE_FLAGS
