"""Atomic counting on the emulated GPU (tf_metal_ops.emulated_gpu.count_atomics, the direct backend): the hash grid's
table gradients counted per level at MSL 3.0 (atomic_float) and MSL 2.4 (fixed-point sums with integer atomics, no
CAS loop; TF_METAL_OPS_EMULATED_GPU_MSL=2.4),
and the Python API (off outside a block, errors, inline kernels not counted). The checks run in fresh processes
(tests/support/emulated_gpu_atomic_checks.py says what they assert). Needs clang++-16 (skip, or fail under
TFMO_REQUIRE_MAC_CHECKS=1)."""

import json
import os

import pytest

from support.gpu_check_runner import run_check
from support.native import gpu_backend_env


@pytest.fixture(scope="module")
def direct(clang16):
    os.environ.setdefault("TF_METAL_OPS_CLANGXX", clang16)
    return gpu_backend_env("direct")


def test_hash_grid_counts_per_level_at_both_msl_versions(direct):
    got = {}
    for msl in ("3.0", "2.4"):
        env = {**direct, "TF_METAL_OPS_EMULATED_GPU_MSL": msl, "TF_METAL_OPS_EMULATED_GPU_WORKERS": "2"}
        r = run_check("emulated_gpu_atomic_checks", "hash_grid_levels", env=env)
        got[msl] = json.loads(r.stdout.splitlines()[-1].split(" ", 2)[2])
    for msl in got:
        assert got[msl]["grad_params"][4:] == [0, 0]  # inactive levels
        assert all(c > 0 for c in got[msl]["grad_params"][:4])
    # Without atomic_float the table gradients are the fixed-point sums: bit for bit what deterministic=True gives
    # with atomic_float available, and not the float-atomic sums.
    assert got["2.4"]["digest"] == got["3.0"]["digest_deterministic"]
    assert got["3.0"]["digest"] != got["3.0"]["digest_deterministic"]


def test_api(direct):
    run_check("emulated_gpu_atomic_checks", "api", env=direct)
