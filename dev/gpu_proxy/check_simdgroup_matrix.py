#!/usr/bin/env python3
"""The GPU proxy's SIMD-group matrices (dev/gpu_proxy/include/gpu_proxy/simdgroup_matrix.h) run on an NVIDIA GPU,
against NumPy float64. The kernels are those of tests/support/simdgroup_matrix_checks.py, the source the CPU and
emulated-GPU checks run, compiled to PTX by dev/gpu_proxy/build.py and launched with CuPy by the build's launch
contract (dev/gpu_proxy/include/gpu_proxy/entry.h).

    python3 dev/gpu_proxy/check_simdgroup_matrix.py build --out gpu_proxy_ptx/sgm   # clang-16; no GPU, no TensorFlow
    python3 dev/gpu_proxy/check_simdgroup_matrix.py run --ptx gpu_proxy_ptx/sgm     # on the GPU machine: numpy, cupy

`run` prints one line per check, "ok NAME" or "FAIL NAME: why", and exits with status 1 when one fails.
What it covers: every transpose pair and accumulator mode of float products (FMAs); half products into half and
into float (the tensor cores: mma.sync with float accumulation); several SIMD groups per threadgroup and a clipped
last threadgroup; loads and stores through threadgroup memory with 12 elements per row; thread_elements() in
Apple's lane layout (MLX's: csrc/msl_emu/README.md), fills, the diagonal constructor, transposed stores at an
origin. Not covered: a SIMD group with inactive lanes (their elements are undefined on the proxy, as in MSL).
Tolerances are the checks': float results rtol 1e-5 with atol 1e-5 * max sum |a||b|; half results rtol 2e-3 with
atol 2e-3 * max sum |a||b|; copies, fills and layouts exact.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ROOT / "tests" / "support" / "simdgroup_matrix_checks.py"


def checks_source() -> str:
    """SOURCE of the checks module, read without importing it (it imports TensorFlow)."""
    for node in ast.parse(CHECKS.read_text()).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["SOURCE"]:
            return ast.literal_eval(node.value)
    raise SystemExit(f"{CHECKS}: no SOURCE")


def build(out: Path) -> None:
    sys.path.insert(0, str(ROOT / "dev"))
    from gpu_proxy import build as gpu_proxy

    out.mkdir(parents=True, exist_ok=True)
    metal = out / "simdgroup_matrix.metal"
    metal.write_text(checks_source())
    gpu_proxy.build(out, [metal], msl_versions=("3.0",), baselines=False)


def lane_coords():
    """(row, col) of lane l's first element, l = 0..31."""
    lanes = np.arange(32)
    return (lanes >> 4 & 1) * 4 + (lanes >> 2 & 1) * 2 + (lanes >> 1 & 1), (lanes >> 3 & 1) * 4 + (lanes & 1) * 2


class Gpu:
    def __init__(self, ptx: Path):
        import cupy as cp

        self.cp = cp
        self.module = cp.RawModule(path=str(ptx / "simdgroup_matrix.ptx"))

    def launch(self, kernel, buffers, threads, group, shared=0):
        """dispatchThreads(threads, group) of kernel with its buffers in [[buffer(n)]] order; returns them on the
        host."""
        dev = [self.cp.asarray(np.ascontiguousarray(b)) for b in buffers]
        blocks = ((threads + group - 1) // group,)
        args = tuple(dev) + (np.uint32(threads), np.uint32(1), np.uint32(1))
        self.module.get_function(kernel)(blocks, (group,), args, shared_mem=shared)
        self.cp.cuda.runtime.deviceSynchronize()
        return [self.cp.asnumpy(d) for d in dev]


def gemm(gpu, kernel, dt, acc, M, N, K, ta, tb, mode, group, threads=None, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (M, K)).astype(dt)
    b = rng.uniform(-1, 1, (K, N)).astype(dt)
    c = rng.uniform(-1, 1, (M, N)).astype(acc)
    d = np.full((M, N), np.nan, acc)
    p = np.array([M, N, K, ta, tb, mode], np.uint32)
    threads = threads if threads is not None else (M // 8) * (N // 8) * 32
    got = gpu.launch(kernel, [a.T.copy() if ta else a, b.T.copy() if tb else b, c, p, d], threads, group)[4]
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = a64 @ b64 + (c.astype(np.float64) if mode == 1 else 0)
    scale = np.abs(a64) @ np.abs(b64) + (np.abs(c.astype(np.float64)) if mode == 1 else 0)
    tol = 2e-3 if acc == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol * scale.max())


def check_float_layouts(gpu):
    cases = [(24, 16, 40, 0, 0, 0, 128), (16, 24, 16, 1, 0, 1, 64), (32, 8, 24, 0, 1, 2, 96), (8, 32, 8, 1, 1, 1, 32)]
    for i, (M, N, K, ta, tb, mode, group) in enumerate(cases):
        gemm(gpu, "gemm_f32", np.float32, np.float32, M, N, K, ta, tb, mode, group, seed=i)


def check_half_products_on_tensor_cores(gpu):
    for i, (kernel, acc) in enumerate((("gemm_f16", np.float16), ("gemm_f16_f32", np.float32))):
        for mode, (ta, tb) in ((1, (0, 1)), (0, (1, 0)), (2, (0, 0))):
            gemm(gpu, kernel, np.float16, acc, 16, 24, 32, ta, tb, mode, 64, seed=10 + i)
    gemm(gpu, "gemm_f16_f32", np.float16, np.float32, 64, 64, 128, 0, 0, 1, 128, seed=20)


def check_clipped_threadgroups(gpu):
    """5 tiles on 96-thread groups (160 threads: the last group clipped to 2 of its 3 SIMD groups); on 128-thread
    groups with 192 threads (the last group's second SIMD group has no tile)."""
    for group, threads in ((96, 5 * 32), (128, 6 * 32)):
        gemm(gpu, "gemm_f32", np.float32, np.float32, 40, 8, 16, 0, 0, 0, group, threads=threads)


def check_threadgroup_memory(gpu):
    rng = np.random.default_rng(7)
    a = rng.uniform(-1, 1, (64, 8)).astype(np.float32)
    b = rng.uniform(-1, 1, (8, 64)).astype(np.float32)
    d = gpu.launch("gemm_threadgroup", [a, b, np.full((64, 64), np.nan, np.float32)], 8 * 32, 128)[2]
    ref = a.astype(np.float64) @ b.astype(np.float64)
    for i in range(8):
        s = slice(8 * i, 8 * i + 8)
        np.testing.assert_allclose(d[s, s], ref[s, s], rtol=1e-5, atol=1e-5 * 8)


def check_elements_fill_diagonal_and_transposed_origin(gpu):
    x = np.arange(64, dtype=np.float32).reshape(8, 8) * 0.5 - 7
    out = gpu.launch("elements", [x, np.zeros((8, 512), np.float32)], 8 * 32, 256)[1]
    row, col = lane_coords()
    written = np.empty((8, 8), np.float32)
    for lane in range(32):
        written[row[lane], col[lane]:col[lane] + 2] = [2 * lane, 2 * lane + 1]
    for o in out:
        layout = o[:64].reshape(32, 2)
        np.testing.assert_array_equal(layout[:, 0], x[row, col])
        np.testing.assert_array_equal(layout[:, 1], x[row, col + 1])
        np.testing.assert_array_equal(o[64:128].reshape(8, 8), written)
        np.testing.assert_array_equal(o[128:192], np.full(64, 3.5, np.float32))
        np.testing.assert_allclose(o[192:256].reshape(8, 8), 2.5 * x.astype(np.float64), rtol=1e-6)
        np.testing.assert_array_equal(o[256:356].reshape(10, 10)[2:10, 1:9], x.T)
        np.testing.assert_array_equal(o[384:448].reshape(8, 8), x.T)


def run(ptx: Path) -> int:
    gpu = Gpu(ptx)
    failed = 0
    for name, fn in [(n[len("check_"):], f) for n, f in globals().items() if n.startswith("check_")]:
        try:
            fn(gpu)
            print(f"ok {name}")
        except AssertionError as e:
            failed += 1
            print(f"FAIL {name}: {str(e).strip().splitlines()[0:6]}")
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build").add_argument("--out", type=Path, required=True)
    sub.add_parser("run").add_argument("--ptx", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "build":
        build(args.out)
        return 0
    return run(args.ptx)


if __name__ == "__main__":
    sys.exit(main())
