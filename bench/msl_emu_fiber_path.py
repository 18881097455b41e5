"""Hash-grid kernels without SIMD-group calls on msl_emu's fiber-free fast path, in two parts:

  runtime   the encoding and position gradient of this checkout's metal_kernels/hash_grid.metal launched through
            msl_emu::dispatch_threads without TensorFlow (bench/msl_emu_fiber_path.cc, compiled with clang++ >= 16 at
            -O2 as the emulated GPU compiles kernels), alternately on fibers (what every kernel of the file got
            while the decision was made per file) and on the fast path (what they get now, per kernel), in one
            process: same inputs, workers and machine load; outputs checked bitwise equal. --workers 1 and all CPUs.
  emulated  seconds per op call on the emulated GPU (/GPU:0, TF_METAL_OPS_EMULATED_GPU=1, direct backend: the
            installed package's GPU host code and kernels), with the CPU kernels (/CPU:0) of the same ops timed in
            the same process as a control for the load of a shared machine. Compare two installs by running it
            with each (or with PYTHONPATH pointing at a copy of the other's installed tf_metal_ops first).

    python bench/msl_emu_fiber_path.py [--parts runtime,emulated] [--repeats 9] [--points 65536] [--json OUT]

Whether a kernel runs as fibers is decided per kernel by tf_metal_ops/msl_emu.py (csrc/msl_emu/README.md,
"Fiber-free fast path"): hash_grid.metal's table-gradient scatters call SIMD-group functions, its encoding and
position gradient do not. The emulated part lists the kernels each case dispatched. Cases (D=3, L=16, F=2,
log2 T=19, N_min=16, b=1.5, hash grid, linear; --points points):
  encode f32        hash_grid_encode, float32 table (kernel hash_grid_encode_float32);
  encode f16        the same with a float16 table (hash_grid_encode_float16);
  grad positions    d/dpositions of the encoding, the table not watched (hash_grid_grad_positions_float32);
  grad params       d/dparams of the encoding: the accumulator's zero fill (hash_grid_fill_zero, no SIMD-group
                    calls) and the table-gradient scatter (hash_grid_grad_params_d3f2_float32, SIMD-group run sums:
                    fibers before and after).
The runtime part runs encode f32 and grad positions (64 threads per group) and hash_grid_fill_zero over the
table gradient's accumulator (rows x F floats, 256 per group: one store per thread). Emulated: each call runs in a
tf.function; the timer stops after tf_metal_ops.emulated_gpu.synchronize() and .numpy() of every output. Median
(min..max) of --repeats calls after one warm-up call (runtime: rounds of one launch per mode). The emulated GPU's
speed says nothing about a Mac's GPU: it is the cost of running the emulation (tests, examples) on this CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_util import (cpu_model, emulated_workers, markdown_table, require_emulated_gpu, run_emulated_worker,
                        seconds_cell, time_emulated_call, write_json)

CONFIG = dict(n_levels=16, n_features_per_level=2, log2_hashmap_size=19, base_resolution=16, per_level_scale=1.5)


def worker(points: int, repeats: int) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    import tf_metal_ops as t
    from tf_metal_ops.hash_grid import HashGridConfig

    emulated_gpu = require_emulated_gpu()
    cfg = HashGridConfig(3, **CONFIG)
    rng = np.random.default_rng(0)
    host = {"x": rng.random((points, 3), dtype=np.float32),
            "p": rng.uniform(-1e-4, 1e-4, cfg.params_shape).astype(np.float32),
            "dy": rng.standard_normal((points, cfg.n_output_dims)).astype(np.float32)}

    def cases(d):
        with tf.device(d):
            v = {k: tf.constant(a) for k, a in host.items()}
            v["p16"] = tf.cast(v["p"], tf.float16)

        def encode(params):
            return tf.function(lambda: t.hash_grid_encode(v["x"], v[params], config=cfg))

        def gradient(wrt):  # d/d(wrt) of the float32-table encoding, the other input not watched
            @tf.function
            def grad():
                with tf.GradientTape() as tape:
                    tape.watch(v[wrt])
                    y = t.hash_grid_encode(v["x"], v["p"], config=cfg)
                return tape.gradient(y, v[wrt], output_gradients=v["dy"])

            return grad

        return {"encode f32": encode("p"), "encode f16": encode("p16"), "grad positions": gradient("x"),
                "grad params": gradient("p")}

    gpu, cpu = cases("/GPU:0"), cases("/CPU:0")
    rows = []
    for name, fn in gpu.items():
        before = emulated_gpu.dispatch_counts()
        g_out, g = time_emulated_call("/GPU:0", fn, repeats)
        after = emulated_gpu.dispatch_counts()
        kernels = sorted(k for k in after if after[k] - before.get(k, 0) > 0)
        c_out, c = time_emulated_call("/CPU:0", cpu[name], repeats)
        for a, b in zip(tf.nest.flatten(g_out), tf.nest.flatten(c_out)):  # same op, same answer
            np.testing.assert_allclose(np.asarray(a.numpy(), np.float32), np.asarray(b.numpy(), np.float32),
                                       rtol=2e-3, atol=2e-3, err_msg=name)
        rows.append({"case": name, "kernels": kernels, "emulated_gpu": g, "cpu": c})
        print(f"  {name}: emulated {g['median_s']:.4f} s, CPU {c['median_s']:.4f} s ({', '.join(kernels)})",
              file=sys.stderr, flush=True)
    return {"rows": rows, "tensorflow": tf.__version__,
            "emu_workers": emulated_workers("default (all CPUs)")}


REPO = Path(__file__).resolve().parents[1]


def find_clang() -> str:
    for c in (os.environ.get("TF_METAL_OPS_CLANGXX"), "clang++-16", "clang++-17", "clang++-18", "clang++"):
        if c and shutil.which(c):
            return c
    raise SystemExit("the runtime part needs clang++ >= 16 (TF_METAL_OPS_CLANGXX, or clang++-16 on PATH)")


def runtime_part(points: int, repeats: int) -> dict:
    """Medians per (kernel, mode, workers) of bench/msl_emu_fiber_path.cc, built from this checkout."""
    clang = find_clang()
    with tempfile.TemporaryDirectory(prefix="tfmo-bench-fiber-rt-") as tmp:
        exe = os.path.join(tmp, "fiber_path")
        incs = [f"-I{REPO / d}" for d in ("csrc/msl_emu/include", "csrc/msl_emu", "csrc/shared", "metal_kernels")]
        subprocess.run([clang, "-x", "c++", "-std=c++20", "-O2", "-DNDEBUG", "-Wno-unknown-attributes", *incs,
                        str(REPO / "bench" / "msl_emu_fiber_path.cc"), "-o", exe], check=True)
        rows = []
        for workers in sorted({1, os.cpu_count() or 1}):
            res = subprocess.run([exe, str(points), str(repeats), str(workers)], capture_output=True, text=True,
                                 check=True)
            times = {}
            for line in res.stdout.splitlines():
                kernel, mode, *vals = line.split()
                times[(kernel, mode)] = [float(v) for v in vals]
            for kernel in dict.fromkeys(k for k, _ in times):
                fib, fast = times[(kernel, "fibers")], times[(kernel, "fast")]
                rows.append({"kernel": kernel, "workers": workers, "fibers_s": statistics.median(fib),
                             "fast_s": statistics.median(fast), "fibers_all": fib, "fast_all": fast,
                             "ratio": statistics.median(fast) / statistics.median(fib)})
                print(f"  {kernel}, {workers} worker(s): fibers {rows[-1]['fibers_s']:.4f} s, fast path "
                      f"{rows[-1]['fast_s']:.4f} s", file=sys.stderr, flush=True)
    return {"compiler": clang, "rows": rows}


def runtime_table(part: dict) -> str:
    lines = ["| kernel | workers | on fibers (per-file decision) s, median (min..max) | fast path (per-kernel) s | "
             "fast / fibers |", "|---|---|---|---|---|"]
    for r in part["rows"]:
        fib, fast = r["fibers_all"], r["fast_all"]
        lines.append(f"| {r['kernel']} | {r['workers']} | {r['fibers_s']:.4f} ({min(fib):.4f}..{max(fib):.4f}) | "
                     f"{r['fast_s']:.4f} ({min(fast):.4f}..{max(fast):.4f}) | {r['ratio']:.2f} |")
    return "\n".join(lines)


def table(report: dict) -> str:
    return markdown_table(
        ["case", "kernels dispatched", "emulated /GPU:0 s/call, median (min..max)", "CPU /CPU:0 s/call (control)"],
        [[r["case"], ", ".join(r["kernels"]), seconds_cell(r["emulated_gpu"]), seconds_cell(r["cpu"])]
         for r in report["rows"]])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="runtime,emulated", help="comma-separated: runtime, emulated")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--points", type=int, default=1 << 16)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run the emulated part, write JSON here
    args = ap.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if args.repeats < 1 or args.points < 1:
        ap.error("--repeats and --points must be >= 1")
    if not parts or set(parts) - {"runtime", "emulated"}:
        ap.error("--parts takes runtime and/or emulated")
    if args.worker:
        with open(args.worker, "w") as f:
            json.dump(worker(args.points, args.repeats), f)
        return 0
    report = {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(), "repeats": args.repeats,
              "points": args.points, "config": CONFIG, "loadavg_before": os.getloadavg()}
    print(f"hash grid, msl_emu fast path vs fibers: {report['cpu']} ({report['cores']} cores), {args.points} points, "
          f"medians of {args.repeats}; load average {report['loadavg_before'][0]:.2f}", flush=True)
    if "runtime" in parts:
        report["runtime"] = runtime_part(args.points, args.repeats)
        print(f"\nmsl_emu runtime, no TensorFlow ({report['runtime']['compiler']} -O2; load average "
              f"{os.getloadavg()[0]:.2f}):\n")
        print(runtime_table(report["runtime"]))
    if "emulated" in parts:
        report["emulated"], res = run_emulated_worker(
            __file__, ["--repeats", str(args.repeats), "--points", str(args.points)], "tfmo-bench-fiber-")
        if report["emulated"] is None:
            sys.stderr.write(res.stdout + res.stderr[-6000:])
            raise SystemExit(f"the emulated-GPU worker failed (exit {res.returncode})")
        print(f"\nemulated GPU, TensorFlow {report['emulated']['tensorflow']}, workers: "
              f"{report['emulated']['emu_workers']}; load average {os.getloadavg()[0]:.2f}:\n")
        print(table(report["emulated"]))
    report["loadavg_after"] = os.getloadavg()
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
