"""docs/metal_kernels.md is executable: its ```python blocks run in order in one fresh process outside the
repository, on the CPU and on the emulated GPU (TF_METAL_OPS_EMULATED_GPU=1, where ops without a device go to
/GPU:0), asserting their own results. Needs clang++-16 (skips without it; fails under TFMO_REQUIRE_MAC_CHECKS=1)."""

import os
import re
import subprocess
import sys

import pytest

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "metal_kernels.md")
BLOCK = re.compile(r"```python\n(.*?)```", re.S)

# Appended to the doc's code: every kernel the doc made really ran on the expected device.
EPILOGUE = """
import tf_metal_ops as _t
from tf_metal_ops import msl_check as _msl_check
_made = [v for v in list(globals().values()) if isinstance(v, (_t.MetalKernel, _t.ShaderLibrary))]
print("kernels:", len(_made))
_sources = [i.source.msl for k in _made if isinstance(k, _t.MetalKernel) for i in k._instances.values()]
_sources += [k.source for k in _made if isinstance(k, _t.ShaderLibrary)]
assert len(_sources) >= len(_made), (_sources, _made)
for _src in _sources:  # every example kernel passes the strict Metal-language check (builds also run it)
    assert not _msl_check.check_source(_src), _msl_check.check_source(_src)
if _t.emulated_gpu.enabled():
    _counts = _t.emulated_gpu.dispatch_counts()
    _ran = {k for k, n in _counts.items() if n > 0}
    for _k in _made:
        _name = "custom_kernel_" + _k.name if isinstance(_k, _t.MetalKernel) else _k.kernel_names[0]
        assert _name in _ran, (_name, _counts)
print("ok doc")
"""


def script():
    return "\n".join(BLOCK.findall(open(DOC, encoding="utf-8").read())) + EPILOGUE


def test_doc_covers_the_promised_examples():
    text = open(DOC, encoding="utf-8").read()
    for needle in ("model.compile(", "threadgroup_barrier", "atomic_outputs=True", "init_value=", "grid_sample_bwd", "simd_sum(", "simd_is_first()",
                   "compile_shader", "op kit"):
        assert needle in text, needle
    assert len(BLOCK.findall(text)) >= 8


@pytest.mark.parametrize("device", ["cpu", "emulated_gpu"])
def test_doc_runs(tmp_path, clang16, device):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_METAL_OPS_CLANGXX=clang16, PYTHONWARNINGS="ignore")
    if device == "emulated_gpu":
        env["TF_METAL_OPS_EMULATED_GPU"] = "1"
    r = subprocess.run([sys.executable, "-c", script()], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=1200)
    assert r.returncode == 0, f"--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-6000:]}"
    assert r.stdout.splitlines()[-1] == "ok doc", r.stdout
