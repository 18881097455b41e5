"""The deterministic hash-grid table gradient (attr ``deterministic``: fixed-point sums with integer atomics) against
the float-atomic one, on the emulated GPU: global atomics per backward (per level for the deterministic one) and
emulation seconds. GPU times of the same kernels: bench/gpu_proxy.md (an NVIDIA GPU).

    python bench/hash_grid_deterministic.py                 # writes bench/hash_grid_deterministic.md
    python bench/hash_grid_deterministic.py --log2-points 14 --md ''   # smoke run, nothing written

Config and point sets: bench/hash_grid_atomics.py (HashNeRF's defaults, 2^18 points, uniform and ray-ordered).
Modes, each in its own process on the direct backend (TF_METAL_OPS_EMULATED_GPU=1): float atomics at MSL 3.0
(atomic_float), float atomics at MSL 2.4 (the CAS loop), deterministic (integer atomics: the same kernels at either
MSL version). Passes: grad_params (d/dparams) and grad2_params (the second-order pass). "atomics" = read-modify-write
operations + compare-exchange attempts on device memory, from tf_metal_ops.emulated_gpu.count_atomics; the
deterministic scatter does one fetch_add on the low word per term, one on the high word when the carry-adjusted high
part is not zero, and a fetch_or per non-finite term. Seconds: median of --repeats runs of the whole backward
(emulation time on this CPU, not a GPU figure).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from bench_util import cpu_model
from hash_grid_atomics import git_commit, hash_config, point_sets

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = (("float atomics, MSL 3.0", "3.0", False), ("float atomics, MSL 2.4 (CAS loop)", "2.4", False),
         ("deterministic", "3.0", True))


def worker(args):
    import numpy as np
    import tensorflow as tf

    import tf_metal_ops as t
    from tf_metal_ops import emulated_gpu

    emulated_gpu.enable(verbose=False)
    cfg = hash_config()
    kw = {**cfg.op_kwargs(), "deterministic": args.deterministic}
    F = cfg.n_features_per_level
    count = cfg.params_shape[0] * F
    # words: [2 * count] sums (two uint words per value), then [count] flags; split at the level offsets.
    split = {"words": [8 * off * F for off in list(cfg.offsets)[:cfg.n_levels]] + [8 * count]}
    out = {}
    for name, x in point_sets(args.log2_points).items():
        rng = np.random.default_rng(1)
        with tf.device("/GPU:0"):
            xt = tf.constant(x)
            p = tf.Variable(rng.uniform(-1e-2, 1e-2, cfg.params_shape).astype(np.float32))
            dyt = tf.constant(rng.standard_normal((len(x), cfg.n_output_dims)).astype(np.float32))
            wt = tf.constant(rng.standard_normal(x.shape).astype(np.float32))

            def first():
                with tf.GradientTape() as tape:
                    y = t.hash_grid_encode(xt, p, **kw)
                return tape, y, dyt

            def second():
                with tf.GradientTape() as outer:
                    with tf.GradientTape() as inner:
                        inner.watch(xt)
                        y = t.hash_grid_encode(xt, p, **kw)
                    gx = inner.gradient(y, xt, output_gradients=dyt)
                    loss = tf.reduce_sum(gx * wt)
                return outer, loss, None

            res = {}
            for pass_name, make in (("grad_params", first), ("grad2_params", second)):
                tape, y, target = make()
                emulated_gpu.synchronize()
                with emulated_gpu.count_atomics(split=split) as counting:
                    tape.gradient(y, p, output_gradients=target).numpy()
                kernels, levels = {}, [0] * (cfg.n_levels + 1)
                for r in counting.launches:
                    k = kernels.setdefault(r["kernel"], 0)
                    kernels[r["kernel"]] = k + sum(b["total"]["rmw"] + b["total"]["cas"] for b in r["buffers"])
                    for b in r["buffers"]:
                        if b["param"] == "words":
                            for i, part in enumerate(b["parts"][:cfg.n_levels + 1]):
                                levels[i] += part["rmw"] + part["cas"]
                seconds = []
                for _ in range(args.repeats):
                    tape, y, target = make()
                    emulated_gpu.synchronize()
                    t0 = time.perf_counter()
                    tape.gradient(y, p, output_gradients=target).numpy()
                    seconds.append(time.perf_counter() - t0)
                res[pass_name] = {"kernels": kernels, "levels": levels if args.deterministic else None,
                                  "seconds": sorted(seconds)[len(seconds) // 2]}
        out[name] = res
    with open(args.worker, "w") as f:
        json.dump(out, f)


def run_mode(msl, deterministic, args):
    with tempfile.TemporaryDirectory() as td:
        path = os.path.join(td, "out.json")
        env = dict(os.environ, TF_METAL_OPS_EMULATED_GPU="1", TF_METAL_OPS_EMULATED_GPU_MSL=msl, TF_CPP_MIN_LOG_LEVEL="3")
        if args.workers:
            env["TF_METAL_OPS_EMULATED_GPU_WORKERS"] = str(args.workers)
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", path, "--log2-points", str(args.log2_points),
               "--repeats", str(args.repeats)] + (["--deterministic"] if deterministic else [])
        subprocess.run(cmd, check=True, env=env, cwd=tempfile.gettempdir())
        with open(path) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log2-points", type=int, default=18)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=0, help="emulated GPU worker threads (0: all CPUs)")
    ap.add_argument("--md", default=os.path.join(HERE, "hash_grid_deterministic.md"))
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--deterministic", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    results = {label: run_mode(msl, det, args) for label, msl, det in MODES}
    cfg = hash_config()
    lines = ["# Hash-grid table gradient: deterministic (fixed point) against float atomics (emulated GPU)", "",
             f"{time.strftime('%Y-%m-%d')}, {cpu_model()} ({os.cpu_count()} CPUs), emulated GPU, "
             f"{args.workers or 'all'} worker threads; kernels of commit {git_commit()}. Command:", "", "```bash",
             "python bench/hash_grid_deterministic.py", "```", "",
             f"HashNeRF default config, float32 table; {1 << args.log2_points:,} points. The script's docstring defines "
             "the columns. Seconds are emulation time on this CPU (median of "
             f"{args.repeats}), not GPU time: bench/gpu_proxy.md has an NVIDIA GPU's.", ""]
    for pass_name in ("grad_params", "grad2_params"):
        lines += [f"## {pass_name}", "", "| points | mode | global atomics (per kernel) | seconds |", "|---|---|---|---|"]
        for points in ("uniform", "rays"):
            for label, _, _ in MODES:
                r = results[label][points][pass_name]
                ks = ", ".join(f"{k}: {v:,}" for k, v in r["kernels"].items() if v)
                lines.append(f"| {points} | {label} | {ks} | {r['seconds']:.2f} |")
        lines += ["", f"Deterministic atomics per level ({pass_name}; the last column: flag words, non-finite terms):",
                  "", "| points | " + " | ".join(str(i) for i in range(cfg.n_levels)) + " | flags |",
                  "|---|" + "---|" * (cfg.n_levels + 1)]
        for points in ("uniform", "rays"):
            lv = results["deterministic"][points][pass_name]["levels"]
            lines.append(f"| {points} | " + " | ".join(f"{v:,}" for v in lv) + " |")
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
