"""python -m tf_metal_ops.doctor on Linux: CPU checks (in process), and with TF_METAL_OPS_EMULATED_GPU=1 the same
checks on the emulated /GPU:0 (subprocess: the device must be enabled before TensorFlow's first op)."""

import os
import subprocess
import sys

import pytest

from tf_metal_ops import doctor

OPS = ["ZeroOut", "metal_kernel (inline", "HashGridEncode", "FusedMlp", "VolumeRender", "DistortionLoss",
       "VolumeRenderPacked", "DistortionLossPacked", "RayMarch (occupancy grid)", "RayMarch (3 cascades"]


@pytest.mark.skipif(sys.platform == "darwin", reason="the Linux path")
def test_doctor_on_linux_passes_the_cpu_checks_and_says_there_is_no_metal(capsys, clang16, monkeypatch):
    monkeypatch.setenv("TF_METAL_OPS_CLANGXX", clang16)  # the inline kernel's CPU path compiles with it
    assert doctor.main([]) == 0
    out = capsys.readouterr().out
    assert "TensorFlow" in out and "Python" in out and "tensorflow-metal" in out
    assert "Metal               not usable: Metal needs macOS" in out
    for op in OPS:
        assert f"{op}" in out
    assert out.count("vs pure TF: agree") == len(OPS) and "/GPU:0" not in out  # no GPU without the emulated one
    assert out.strip().splitlines()[-1].startswith("RESULT: usable: CPU kernels pass; no Metal device on Linux")


def test_doctor_fails_on_a_disagreeing_kernel(capsys, monkeypatch):
    import tensorflow as tf

    import tf_metal_ops

    real = tf_metal_ops.zero_out
    monkeypatch.setattr(tf_metal_ops, "zero_out", lambda x: real(x) + 1.0)
    failures = doctor.run_checks(tf, tf_metal_ops, [], out=lambda *a: None)
    assert len(failures) == 1 and failures[0].startswith("ZeroOut on the CPU disagrees with pure TF")


def test_doctor_without_a_compiler_skips_the_inline_kernel_on_the_cpu_only(monkeypatch):
    import tensorflow as tf

    import tf_metal_ops
    from tf_metal_ops.inline_kernels import build

    def missing():
        raise build.KernelCompileError("no clang++ here")

    monkeypatch.setattr(build, "find_compiler", missing)
    lines = []
    assert doctor.run_checks(tf, tf_metal_ops, [], out=lines.append) == []
    assert any("metal_kernel (inline, + gradient)  CPU  skipped: no clang++ here" in line for line in lines), lines


@pytest.mark.skipif(sys.platform == "darwin", reason="the emulated GPU is the Linux development device")
def test_doctor_with_the_emulated_gpu_runs_every_check_on_gpu0(clang16):
    env = dict(os.environ, TF_METAL_OPS_EMULATED_GPU="1", TF_METAL_OPS_CLANGXX=clang16, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run([sys.executable, "-m", "tf_metal_ops.doctor"], capture_output=True, text=True, env=env,
                       cwd=os.path.dirname(os.path.abspath(__file__)), timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "emulated GPU        usable: a ZeroOut probe ran on" in r.stdout
    assert r.stdout.count("vs CPU: agree") == len(OPS), r.stdout
    assert r.stdout.strip().splitlines()[-1].startswith("RESULT: usable: CPU kernels and the emulated GPU")
