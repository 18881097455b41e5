"""The Metal backend (csrc/metal/*.mm) over the doubles of Apple's stack (TF_METAL_OPS_EMULATED_GPU=metal, tools/apple_mock):
what a Mac may present that the backend must survive, one case per review defect the doubles can show. Every op
and gradient check also runs under this backend (tests/test_emulated_gpu.py via conftest.gpu_backend); these cases
add the doubles' switches:
  - an MPSCommandBuffer-style stream that commits-and-continues (defect 1: RayMarch's read-back waits for its own
    completion handler; also with TF_METAL_OPS_SYNC=1 and the float16 scratch accumulator, defect 5);
  - streams that keep an encoder of their own open between ops (defect 3);
  - a GPU fault on the asynchronous path (defect 6), buffers no malloc zone claims (defect 4), pipelines with
    threadgroup memory of their own (defect 8) and pipelines smaller than 1024 threads;
  - scratch buffers freed on the op's thread, none left (defect 5); metallibs that do not load (the embedded
    sources compiled at first use) and a GPU without Metal 3 (MSL 2.4).
The doubles end the process on a broken Metal rule, so a regression fails here with the double's message.
"""

import os

import pytest

from support.gpu_check_runner import run_check
from support.native import gpu_backend_env

MPS = {"TFMO_MOCK_TF_METAL_STREAM": "mps"}

# (script, check, environment)
CASES = [
    ("emulated_gpu_checks", "ray_march", MPS),
    ("emulated_gpu_checks", "ray_march", {**MPS, "TF_METAL_OPS_SYNC": "1"}),
    ("emulated_gpu_checks", "hash_grid", {**MPS, "TF_METAL_OPS_SYNC": "1"}),
    ("emulated_gpu_checks", "threads", MPS),
    ("metal_backend_checks", "open_encoder_on_the_stream", {}),
    ("metal_backend_checks", "open_encoder_on_the_stream", MPS),
    ("metal_backend_checks", "gpu_error_reported_on_next_call", {"TF_METAL_OPS_BOUNDS_CHECK": "1"}),
    ("metal_backend_checks", "gpu_error_at_the_op_in_sync_mode",
     {"TF_METAL_OPS_BOUNDS_CHECK": "1", "TF_METAL_OPS_SYNC": "1"}),
    ("metal_backend_checks", "foreign_buffers_explain_themselves", {"TFMO_MOCK_TF_METAL_FOREIGN_BUFFERS": "1"}),
    ("metal_backend_checks", "foreign_buffers_explain_themselves",
     {"TFMO_MOCK_TF_METAL_FOREIGN_BUFFERS": "1", "TF_METAL_OPS_SKIP_OBJECT_CHECK": "1"}),
    ("metal_backend_checks", "static_threadgroup_memory_counts", {"TFMO_MOCK_METAL_STATIC_TG_BYTES": "31744"}),
    ("metal_backend_checks", "small_pipelines", {"TFMO_MOCK_METAL_MAX_THREADS": "64"}),
    ("metal_backend_checks", "scratch_freed", {}),
    ("metal_backend_checks", "scratch_freed", {"TF_METAL_OPS_SYNC": "1"}),
    # No loadable metallib: every pipeline comes from the embedded sources, compiled at first use (MSL 3.0 / 2.4).
    ("emulated_gpu_checks", "hash_grid", {"TFMO_MOCK_METAL_METALLIB_UNLOADABLE": "1"}),
    ("emulated_gpu_checks", "ray_march", {"TFMO_MOCK_METAL_METALLIB_UNLOADABLE": "1", "TFMO_MOCK_METAL_NO_METAL3": "1"}),
    ("emulated_gpu_checks", "volume_render", {"TFMO_MOCK_METAL_NO_METAL3": "1"}),
]


@pytest.fixture(scope="module")
def metal_double(clang16):
    """Builds the Metal double once (cached); returns the environment that selects it. The build reads the switch
    from os.environ, which is restored after it: later tests' subprocesses must not inherit it."""
    from tf_metal_ops import emulated_gpu

    os.environ.setdefault("TF_METAL_OPS_CLANGXX", clang16)
    env = gpu_backend_env("metal")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        emulated_gpu.build(gpu_backend="metal")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return env


@pytest.mark.parametrize("script,check,env", CASES,
                         ids=[f"{c}-{'-'.join(f'{k}={v}' for k, v in e.items())}" for _, c, e in CASES])
def test_metal_backend_on_apples_doubles(metal_double, script, check, env):
    run_check(script, check, 0 if script == "emulated_gpu_checks" else None, {**metal_double, **env})
