"""Error paths of the GPU host code on the Metal-emulating device (tf_metal_ops/emulated_gpu): invalid shapes and
attrs reaching the GPU kernels through the raw ops, work with nothing to dispatch, and device allocation failures,
each asserting the exact error class and message and that the GPU kernel raised it. Each check runs in a fresh
process under each GPU backend, TF_METAL_OPS_EMULATED_GPU=1 and the metal backend's directory (tests/support/emulated_gpu_error_checks.py holds
the checks).

Needs clang++-16 like the other native checks: skips without it, fails under TFMO_REQUIRE_MAC_CHECKS=1 (CI).
"""

import pytest

from support.gpu_check_runner import run_check


# The checks of one entry run in order in one process (run_check's comma lists: a failure names its check).
CASES = [
    ("hash_grid_errors,hash_grid_empty_work", {}),
    ("render_errors,render_packed_errors", {}),
    ("out_of_memory", {"TF_METAL_OPS_EMULATED_GPU_MEMORY_MB": "12"}),
]


@pytest.mark.parametrize("check,env", CASES, ids=[c for c, _ in CASES])
def test_gpu_error_path_on_emulated_device(gpu_backend, check, env):
    """Under both GPU backends (conftest.gpu_backend); the tensorflow-metal double bounds its memory by the same
    TF_METAL_OPS_EMULATED_GPU_MEMORY_MB."""
    run_check("emulated_gpu_error_checks", check, env={**gpu_backend[1], **env}, timeout=600)
