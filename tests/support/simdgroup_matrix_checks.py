"""SIMD-group matrices (simdgroup_matrix, simdgroup_load/store/multiply(_accumulate), make_filled_simdgroup_matrix,
the diagonal constructor, thread_elements) in inline kernels on one device, against NumPy float64 (the kernels, the
model and the tolerances: support/simdgroup_matrix_kernels.py).
tests/test_simdgroup_matrix.py runs every check on /CPU:0 in its own process and all of them on the emulated /GPU:0
in one subprocess:

    cd tests && TF_METAL_OPS_EMULATED_GPU=1 python -m support.simdgroup_matrix_checks /GPU:0   # "ok <check>" each
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf

import tf_metal_ops as t
from support.simdgroup_matrix_kernels import (ELEMENTS_INPUT, LANES_LAUNCHES, SOURCE, assert_elements, assert_lanes,
                                              assert_product, assert_threadgroup_products, gemm_inputs,
                                              gemm_reference)

_lib = None


def lib():
    global _lib
    if _lib is None:
        _lib = t.compile_shader(SOURCE)
    return _lib


def on(device):
    return tf.device(device)


def _gemm(device, kernel, dt, acc_dt, M, N, K, ta, tb, mode, group, threads=None, seed=0):
    a, b, c = gemm_inputs(dt, acc_dt, M, N, K, seed)
    threads = threads if threads is not None else (M // 8) * (N // 8) * 32
    with on(device):
        (d,) = getattr(lib(), kernel)(a.T.copy() if ta else a, b.T.copy() if tb else b, c,
                                      np.array([M, N, K, ta, tb, mode], np.uint32),
                                      threads=threads, group_size=group, output_shapes=[(M, N)])
    return (d.numpy(), *gemm_reference(a, b, c, mode))


def check_gemm_float_layouts(device):
    """float: every transpose pair and mode, several SIMD groups per threadgroup, K not a multiple of the tiles."""
    cases = [(24, 16, 40, 0, 0, 0, 128), (16, 24, 16, 1, 0, 1, 64), (32, 8, 24, 0, 1, 2, 96),
             (8, 32, 8, 1, 1, 1, 32)]
    for i, (M, N, K, ta, tb, mode, group) in enumerate(cases):
        got, ref, scale = _gemm(device, "gemm_f32", np.float32, np.float32, M, N, K, ta, tb, mode, group, seed=i)
        assert_product(got, ref, scale, np.float32)


def check_gemm_half(device):
    """half x half into half and into float (mixed operand types), with a transpose and an accumulator."""
    for i, (kernel, acc) in enumerate((("gemm_f16", np.float16), ("gemm_f16_f32", np.float32))):
        for mode, (ta, tb) in ((1, (0, 1)), (0, (1, 0))):
            got, ref, scale = _gemm(device, kernel, np.float16, acc, 16, 24, 32, ta, tb, mode, 64, seed=10 + i)
            assert got.dtype == acc
            assert_product(got, ref, scale, acc)


def check_partial_threadgroups_and_simd_groups(device):
    """5 tiles on 96-thread groups, 160 threads: the grid's last group is clipped to 2 of its 3 SIMD groups; 5 tiles
    on 128-thread groups, 192 threads: the last group is clipped to 2 SIMD groups, one of which has no tile and
    returns; then 5 tiles on 4.5 SIMD groups' threads: the fifth SIMD group has 16 lanes, which hold
    rows 0-3 of each matrix; rows 4-7 are NaN in its product (inactive lanes), so its stored rows 0-3 are NaN and
    rows 4-7 are not written."""
    M, N, K = 40, 8, 16
    for group, threads in ((96, 5 * 32), (128, 6 * 32)):
        got, ref, scale = _gemm(device, "gemm_f32", np.float32, np.float32, M, N, K, 0, 0, 0, group, threads=threads)
        assert_product(got, ref, scale, np.float32)
    with on(device):
        rng = np.random.default_rng(5)
        a = rng.uniform(-1, 1, (M, K)).astype(np.float32)
        b = rng.uniform(-1, 1, (K, N)).astype(np.float32)
        (d,) = lib().gemm_f32(a, b, np.zeros((M, N), np.float32), np.array([M, N, K, 0, 0, 0], np.uint32),
                              threads=4 * 32 + 16, group_size=64,
                              output_shapes=[(M, N)])
    d = d.numpy()
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(d[:32], ref[:32], rtol=1e-5, atol=1e-5 * K)
    assert np.isnan(d[32:36]).all(), d[32:36]
    # rows 36..39 were never written: the output starts uninitialised, so only that they are not the product is known
    assert not np.allclose(d[36:40], ref[36:40], rtol=1e-5, atol=1e-5)


def check_threadgroup_memory(device):
    """Loads from and stores to threadgroup memory (A with 12 elements per row), 4 SIMD groups per threadgroup."""
    rng = np.random.default_rng(7)
    a = rng.uniform(-1, 1, (64, 8)).astype(np.float32)
    b = rng.uniform(-1, 1, (8, 64)).astype(np.float32)
    with on(device):
        (d,) = lib().gemm_threadgroup(a, b, threads=8 * 32, group_size=128, output_shapes=[(64, 64)])
    assert_threadgroup_products(d.numpy(), a, b)


def check_elements_fill_diagonal_and_transposed_origin(device):
    with on(device):
        (out,) = lib().elements(ELEMENTS_INPUT, threads=8 * 32, group_size=256, output_shapes=[(8, 512)])
    assert_elements(out.numpy())


def check_simd_functions_beside_matrices(device):
    """Shuffles, prefix sums, ballot, broadcast and sum in a file with SIMD-group matrices: whole, partial and
    clipped SIMD groups (kernels.LANES_LAUNCHES)."""
    for threads, group in LANES_LAUNCHES:
        with on(device):
            (out,) = lib().lanes(threads=threads, group_size=group, output_shapes=[(threads, 10)])
        assert_lanes(out.numpy(), threads, group)


CHECKS = {name[len("check_"):]: fn for name, fn in dict(globals()).items() if name.startswith("check_")}


def main(argv):
    device = argv[1]
    for name in argv[2:] or list(CHECKS):
        CHECKS[name](device)
        print(f"ok {name}", flush=True)
    if device.endswith("GPU:0"):
        counts = t.emulated_gpu.dispatch_counts()
        assert counts.get("gemm_f32", 0) > 0 and counts.get("elements", 0) > 0, counts
    print("ok all")


if __name__ == "__main__":
    main(sys.argv)
