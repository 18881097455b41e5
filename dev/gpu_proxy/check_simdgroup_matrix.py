#!/usr/bin/env python3
"""The GPU proxy's SIMD-group matrices (dev/gpu_proxy/include/gpu_proxy/simdgroup_matrix.h) run on an NVIDIA GPU,
against NumPy float64. The kernels and their expected outputs are tests/support/simdgroup_matrix_kernels.py, which
the CPU and emulated-GPU checks run too, compiled to PTX by dev/gpu_proxy/build.py and launched with CuPy by the
build's launch contract (dev/gpu_proxy/include/gpu_proxy/entry.h).

    python3 dev/gpu_proxy/check_simdgroup_matrix.py build --out gpu_proxy_ptx/sgm   # clang-16; no GPU, no TensorFlow
    python3 dev/gpu_proxy/check_simdgroup_matrix.py run --ptx gpu_proxy_ptx/sgm     # on the GPU machine: numpy, cupy

`run` prints one line per check, "ok NAME" or "FAIL NAME: why", and exits with status 1 when one fails.
What it covers: every transpose pair and accumulator mode of float products (FMAs); half products into half and
into float (the tensor cores: mma.sync with float accumulation); several SIMD groups per threadgroup and a clipped
last threadgroup; loads and stores through threadgroup memory with 12 elements per row; thread_elements() in
Apple's lane layout (MLX's: csrc/msl_emu/README.md), fills, the diagonal constructor, transposed stores at an
origin. Not covered: a SIMD group with inactive lanes (their elements are undefined on the proxy, as in MSL).
Tolerances: those of the checks (that module's docstring).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from support import simdgroup_matrix_kernels as kernels  # noqa: E402  (NumPy only)


def build(out: Path) -> None:
    sys.path.insert(0, str(ROOT / "dev"))
    from gpu_proxy import build as gpu_proxy

    out.mkdir(parents=True, exist_ok=True)
    metal = out / "simdgroup_matrix.metal"
    metal.write_text(kernels.SOURCE)
    gpu_proxy.build(out, [metal], msl_versions=("3.0",), baselines=False)


class Gpu:
    def __init__(self, ptx: Path):
        import cupy as cp

        self.cp = cp
        self.module = cp.RawModule(path=str(ptx / "simdgroup_matrix.ptx"))

    def launch(self, kernel, buffers, threads, group):
        """dispatchThreads(threads, group) of kernel with its buffers in [[buffer(n)]] order; returns them on the
        host."""
        dev = [self.cp.asarray(np.ascontiguousarray(b)) for b in buffers]
        blocks = ((threads + group - 1) // group,)
        args = tuple(dev) + (np.uint32(threads), np.uint32(1), np.uint32(1))
        self.module.get_function(kernel)(blocks, (group,), args)
        self.cp.cuda.runtime.deviceSynchronize()
        return [self.cp.asnumpy(d) for d in dev]


def gemm(gpu, kernel, dt, acc, M, N, K, ta, tb, mode, group, threads=None, seed=0):
    a, b, c = kernels.gemm_inputs(dt, acc, M, N, K, seed)
    p = np.array([M, N, K, ta, tb, mode], np.uint32)
    threads = threads if threads is not None else (M // 8) * (N // 8) * 32
    d = gpu.launch(kernel, [a.T.copy() if ta else a, b.T.copy() if tb else b, c, p, np.full((M, N), np.nan, acc)],
                   threads, group)[4]
    kernels.assert_product(d, *kernels.gemm_reference(a, b, c, mode), acc)


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
    kernels.assert_threadgroup_products(d, a, b)


def check_elements_fill_diagonal_and_transposed_origin(gpu):
    out = gpu.launch("elements", [kernels.ELEMENTS_INPUT, np.zeros((8, 512), np.float32)], 8 * 32, 256)[1]
    kernels.assert_elements(out)


def check_simd_functions_beside_matrices(gpu):
    for threads, group in kernels.LANES_LAUNCHES:
        out = gpu.launch("lanes", [np.zeros((threads, 10), np.uint32)], threads, group)[0]
        kernels.assert_lanes(out, threads, group)


def run(ptx: Path) -> int:
    gpu = Gpu(ptx)
    failed = 0
    for name, fn in [(n[len("check_"):], f) for n, f in globals().items() if n.startswith("check_")]:
        try:
            fn(gpu)
            print(f"ok {name}")
        except AssertionError as e:
            failed += 1
            print(f"FAIL {name}: " + " ".join(str(e).split())[:600])
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
