"""The GPU host layer's API beyond what the package's ops use, on the emulated GPU: function constants of every
type, threadgroup memory, barriers, whole threadgroups, scratch buffers and two passes in one call (a block sum
against NumPy), and every misuse of the layer or of the binding contract (missing/wrong function constants, a float
tensor bound to a half parameter, a missing slot, missing threadgroup memory, unknown kernels, slots out of range,
empty and null tensors, setBytes sizes, grid limits, a pass without a grid, read-backs not in multiples of 4 bytes)
rejected as a clear op error from the
GPU kernel, with the device left healthy. The probe op is built with the op kit (tests/emulated_gpu_fixture/probe)."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_host_layer_probe_on_the_emulated_gpu(clang16):
    env = dict(os.environ, TF_METAL_OPS_EMULATED_GPU="1", TF_METAL_OPS_CLANGXX=clang16, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run([sys.executable, os.path.join(HERE, "emulated_gpu_fixture", "probe", "run_probe.py")],
                       capture_output=True, text=True, env=env, timeout=900, cwd=HERE)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    assert "block_sum ok" in r.stdout and "ok 21 misuses rejected" in r.stdout, r.stdout
