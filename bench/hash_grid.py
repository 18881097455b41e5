"""Hash-grid encoding speed on the CPU: the op vs pure TF (plain tf.function and XLA) vs a bare gather loop.

    python bench/hash_grid.py [--points 262144] [--repeats 7] [--dtypes float32,float16] [--threads 1,2] [--json OUT]

Config: D=3, L=16, F=2, log2 T=19, N_min=16, b=1.5, 2^18 points uniform in [0,1]^3. Every number is the
median of --repeats runs in this process after one warm-up run:
  op fwd / fwd+bwd   tf_metal_ops.hash_grid_encode in a tf.function; fwd+bwd = forward + d(loss)/d(params) with
                     loss = sum(w * encoded^2)/2 with fixed random w, so the gradient op waits for the forward, as in training
                     (positions are constants: no position gradient);
  pure-TF            tf_metal_ops.hash_grid.pure_tf in tf.function, plain and jit_compile=True (XLA), same loss;
  table gradient     like with like: every fwd+bwd variant returns a dense table gradient. The op's is dense; pure-TF's
                     tape gives tf.IndexedSlices (one row per gathered corner) for a float32 table but a dense tensor
                     for a float16 one (its float32 cast densifies), so pure-TF's result is densified with
                     tf.convert_to_tensor inside the timed function (a no-op when already dense). The header and the
                     JSON say which kind each variant's tape returned before densifying;
  gather loop        bench/gather_loop.cc (built here with g++ -O3 -march=native): only the forward's table
                     reads with tcnn indexing (same tiling and prefetching as the op), no interpolation, no output;
                     float16 converted with F16C where the CPU has it (as the op's AVX2 build);
and the op at 1 and 2 threads (tf_metal_ops.num_threads; TF's own pools keep their size; pure TF always runs
with TF's default threads). The op with feature_major=True ([L*F, N] output, the same loss on the transposed
weights) at the largest thread count, against the default layout in the same run (no target: for information).
Targets, per dtype, printed as PASS/FAIL at the largest thread count and, for information, at 1 thread:
  fwd+bwd: the faster pure-TF variant (plain or XLA) / op >= 3x;   fwd: op / gather loop (same threads) <= 1.6x.
Also the scaling from the second thread. The machine may be shared: rerun when the spread (min..max) is wide.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_metal_ops  # noqa: E402
from tf_metal_ops.hash_grid import HashGridConfig, pure_tf  # noqa: E402
from bench_util import cpu_model  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET_FWD_BWD_VS_PURE_TF = 3.0  # min: faster pure-TF fwd+bwd / op fwd+bwd
TARGET_FWD_VS_GATHER = 1.6  # max: op fwd / gather loop fwd
ROOT = os.path.dirname(HERE)
CONFIG = dict(n_levels=16, n_features_per_level=2, log2_hashmap_size=19, base_resolution=16, per_level_scale=1.5)


def timed(fn, repeats):
    fn()  # warm-up (tracing, compilation, scratch buffers)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)  # wait for the result
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), max(times)


def fmt(stat):
    med, lo, hi = stat
    return f"{med * 1e3:8.1f} ms  (min {lo * 1e3:.1f}, max {hi * 1e3:.1f})"




def build_gather_loop():
    exe = os.path.join(tempfile.mkdtemp(prefix="tfmo-bench-"), "gather_loop")
    cmd = ["g++", "-std=c++17", "-O3", "-march=native", "-pthread", "-I" + os.path.join(ROOT, "csrc"),
           "-I" + os.path.join(ROOT, "csrc", "shared"), os.path.join(HERE, "gather_loop.cc"), "-o", exe]
    subprocess.run(cmd, check=True)
    return exe


def gather_loop(exe, points, threads, repeats, fp16):
    out = subprocess.run([exe, str(points), str(threads), str(repeats + 1), "1" if fp16 else "0"],
                         check=True, capture_output=True, text=True).stdout.split("\n")
    ms = [float(line.split()[0]) / 1e3 for line in out if line.strip()][1:]  # drop the warm-up run
    return statistics.median(ms), min(ms), max(ms)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=1 << 18)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--skip-pure-tf", action="store_true")
    ap.add_argument("--json", help="also write the medians (ms) and ratios here (bench/run_all.py collects them)")
    args = ap.parse_args(argv)
    report = {"config": dict(CONFIG, points=args.points, repeats=args.repeats), "median_ms": {}, "summary": [],
              "table_gradient": "dense in every variant (pure-TF's densified with tf.convert_to_tensor)",
              "raw_table_gradient": {}, "cpu": cpu_model(), "targets": []}
    thread_counts = [int(t) for t in args.threads.split(",")]
    cfg = HashGridConfig(3, **CONFIG)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.uniform(0, 1, (args.points, 3)).astype(np.float32))
    weights = rng.standard_normal((args.points, cfg.n_output_dims)).astype(np.float32)
    print(f"hash grid: D=3 {CONFIG} N={args.points}, table {cfg.params_shape}; TF {tf.__version__}; "
          f"CPU {report['cpu']}, {os.cpu_count()} CPUs, default threads {tf_metal_ops.get_num_threads()}; "
          f"medians of {args.repeats}")
    try:
        exe = build_gather_loop()
    except (OSError, subprocess.CalledProcessError) as e:
        exe = None
        print(f"gather loop: not built ({e})")

    for dtype_name in args.dtypes.split(","):
        dtype = tf.as_dtype(dtype_name)
        params = tf.Variable(tf.cast(rng.uniform(-1e-4, 1e-4, cfg.params_shape), dtype))
        w = tf.constant(weights, dtype)
        w_t = tf.constant(np.ascontiguousarray(weights.T), dtype)
        kw = cfg.op_kwargs()

        raw_kinds = {}  # variant -> type of the tape's table gradient (recorded while tracing)

        def make(encode, jit=False, label="op", feature_major=False):
            opts = dict(kw, feature_major=True) if feature_major else kw
            wl = w_t if feature_major else w

            @tf.function(jit_compile=jit)
            def fwd():
                return encode(x, params, **opts)

            @tf.function(jit_compile=jit)
            def fwd_bwd():
                with tf.GradientTape() as tape:
                    y = encode(x, params, **opts)
                    loss = 0.5 * tf.reduce_sum(tf.cast(wl * y * y, tf.float32))  # dy = w*y needs y first
                g = tape.gradient(loss, params)
                raw_kinds[label] = "IndexedSlices" if isinstance(g, tf.IndexedSlices) else "dense"
                return tf.convert_to_tensor(g)  # dense table gradient in every variant (like with like)

            return fwd, fwd_bwd

        print(f"\n[{dtype_name} table]")
        results = {}
        op_fwd, op_fb = make(tf_metal_ops.hash_grid_encode)
        for t in thread_counts:
            with tf_metal_ops.num_threads(t):
                results[("op fwd", t)] = timed(op_fwd, args.repeats)
                results[("op fwd+bwd", t)] = timed(op_fb, args.repeats)
            print(f"  op fwd         {t} thr: {fmt(results[('op fwd', t)])}")
            print(f"  op fwd+bwd     {t} thr: {fmt(results[('op fwd+bwd', t)])}")
        fm_fwd, fm_fb = make(tf_metal_ops.hash_grid_encode, label="op feature-major", feature_major=True)
        t = max(thread_counts)
        with tf_metal_ops.num_threads(t):
            results[("op fwd feature-major", t)] = timed(fm_fwd, args.repeats)
            results[("op fwd+bwd feature-major", t)] = timed(fm_fb, args.repeats)
        for mode in ("fwd", "fwd+bwd"):
            k = f"op {mode} feature-major"
            print(f"  {k:<25} {t} thr: {fmt(results[(k, t)])}  "
                  f"({results[(k, t)][0] / results[(f'op {mode}', t)][0]:.2f}x the default layout)")
        if exe:
            for t in thread_counts:
                results[("gather", t)] = gather_loop(exe, args.points, t, args.repeats, dtype == tf.float16)
                print(f"  gather loop    {t} thr: {fmt(results[('gather', t)])}")
        if not args.skip_pure_tf:
            for name, jit in (("pure-TF", False), ("pure-TF XLA", True)):
                f, fb = make(pure_tf.hash_grid_encode, jit, name)
                results[(name + " fwd", 0)] = timed(f, args.repeats)
                results[(name + " fwd+bwd", 0)] = timed(fb, args.repeats)
                print(f"  {name + ' fwd':<22}: {fmt(results[(name + ' fwd', 0)])}")
                print(f"  {name + ' fwd+bwd':<22}: {fmt(results[(name + ' fwd+bwd', 0)])}")

        report["raw_table_gradient"][dtype_name] = dict(raw_kinds)
        print("  table gradient: dense in every fwd+bwd variant; the tape gave "
              + ", ".join(f"{k}: {v}" for k, v in raw_kinds.items())
              + (" (densified with tf.convert_to_tensor, timed)" if "IndexedSlices" in raw_kinds.values() else ""))
        tmax = max(thread_counts)
        med = {k: v[0] for k, v in results.items()}
        report["median_ms"][dtype_name] = {f"{k} ({t} thr)" if t else k: v * 1e3 for (k, t), v in med.items()}
        if not args.skip_pure_tf:
            for mode in ("fwd", "fwd+bwd"):
                op = med[(f"op {mode}", tmax)]
                report["summary"].append({"dtype": dtype_name, "mode": mode,
                                          "speedup_vs_graph": med[(f"pure-TF {mode}", 0)] / op,
                                          "speedup_vs_xla": med[(f"pure-TF XLA {mode}", 0)] / op})
        print("  targets (PASS/FAIL at the largest thread count; 1 thread for information):")
        for t in sorted(set(thread_counts), reverse=True):
            if not args.skip_pure_tf:
                best_name = min(("pure-TF", "pure-TF XLA"), key=lambda k: med[(k + " fwd+bwd", 0)])
                r = med[(best_name + " fwd+bwd", 0)] / med[("op fwd+bwd", t)]
                ok = r >= TARGET_FWD_BWD_VS_PURE_TF
                report["targets"].append({"dtype": dtype_name, "threads": t, "target": "fwd+bwd vs pure-TF",
                                          "baseline": best_name, "ratio": r, "pass": ok})
                print(f"    {t} thr  fwd+bwd: {best_name} (faster pure-TF) / op = {r:.3f}x   "
                      f"(target >= {TARGET_FWD_BWD_VS_PURE_TF:g}x: {'PASS' if ok else 'FAIL'})")
            if exe:
                r = med[("op fwd", t)] / med[("gather", t)]
                ok = r <= TARGET_FWD_VS_GATHER
                report["targets"].append({"dtype": dtype_name, "threads": t, "target": "fwd vs gather loop",
                                          "baseline": "gather loop", "ratio": r, "pass": ok})
                print(f"    {t} thr  fwd: op / gather loop = {r:.3f}x   "
                      f"(target <= {TARGET_FWD_VS_GATHER:g}x: {'PASS' if ok else 'FAIL'})")
        if 1 in thread_counts and tmax > 1:
            print(f"  scaling (1 thread / {tmax} threads):")
            for k in ("op fwd", "op fwd+bwd"):
                print(f"    {k}: 1 thread / {tmax} threads = {med[(k, 1)] / med[(k, tmax)]:.2f}x   (target >= 1.8x)")
            if exe:
                print(f"    gather loop: 1 thread / {tmax} threads = {med[('gather', 1)] / med[('gather', tmax)]:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
