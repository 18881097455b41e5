"""Hash-grid kernels without SIMD-group calls on msl_emu's fiber-free fast path: seconds per call on the emulated GPU
(/GPU:0, TF_METAL_OPS_EMULATED_GPU=1, direct backend: the package's GPU host code and metal_kernels/hash_grid.metal
run on the CPU through csrc/msl_emu), with the CPU kernels (/CPU:0) of the same ops timed in the same process as a
control for the load of a shared machine.

    python bench/msl_emu_fiber_path.py [--repeats 9] [--points 65536] [--json OUT]

Whether a kernel runs as fibers is decided per kernel by tf_metal_ops/msl_emu.py (csrc/msl_emu/README.md,
"Fiber-free fast path"): hash_grid.metal's table-gradient scatters call SIMD-group functions, its encoding and
position gradient do not. Run this on two installs (`pip install .` of each commit) to compare them; the report
lists the kernels each case dispatched. Cases (D=3, L=16, F=2, log2 T=19, N_min=16, b=1.5, linear; --points points):
  encode f32        hash_grid_encode, float32 table (kernel hash_grid_encode_float32);
  encode f16        the same with a float16 table (hash_grid_encode_float16);
  grad positions    d/dpositions of the encoding, the table not watched (hash_grid_grad_positions_float32).
Each call runs in a tf.function; the timer stops after tf_metal_ops.emulated_gpu.synchronize() and .numpy() of
every output. Median (min..max) of --repeats calls after one warm-up call. The emulated GPU's speed says nothing
about a Mac's GPU: it is the cost of running the emulation (tests, examples) on this CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from bench_util import cpu_model

CONFIG = dict(n_levels=16, n_features_per_level=2, log2_hashmap_size=19, base_resolution=16, per_level_scale=1.5)


def worker(points: int, repeats: int) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    import tf_metal_ops as t
    from tf_metal_ops import emulated_gpu
    from tf_metal_ops.hash_grid import HashGridConfig

    if not emulated_gpu.enabled():
        raise SystemExit("the emulated GPU is not enabled (TF_METAL_OPS_EMULATED_GPU=1 must be set before TF starts)")
    cfg = HashGridConfig(3, **CONFIG)
    kw = cfg.op_kwargs()
    rng = np.random.default_rng(0)
    host = {"x": rng.random((points, 3), dtype=np.float32),
            "p": rng.uniform(-1e-4, 1e-4, cfg.params_shape).astype(np.float32),
            "dy": rng.standard_normal((points, cfg.n_output_dims)).astype(np.float32)}

    def cases(d):
        with tf.device(d):
            v = {k: tf.constant(a) for k, a in host.items()}
            v["p16"] = tf.cast(v["p"], tf.float16)

        @tf.function
        def encode32():
            return t.hash_grid_encode(v["x"], v["p"], **kw)

        @tf.function
        def encode16():
            return t.hash_grid_encode(v["x"], v["p16"], **kw)

        @tf.function
        def grad_positions():
            with tf.GradientTape() as tape:
                tape.watch(v["x"])
                y = t.hash_grid_encode(v["x"], v["p"], **kw)
            return tape.gradient(y, v["x"], output_gradients=v["dy"])

        return {"encode f32": encode32, "encode f16": encode16, "grad positions": grad_positions}

    def timed(d, fn):
        def once():
            with tf.device(d):
                out = fn()
            emulated_gpu.synchronize()
            for x in tf.nest.flatten(out):
                x.numpy()
            return out

        out = once()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            once()
            times.append(time.perf_counter() - t0)
        return out, {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}

    gpu, cpu = cases("/GPU:0"), cases("/CPU:0")
    rows = []
    for name, fn in gpu.items():
        before = emulated_gpu.dispatch_counts()
        g_out, g = timed("/GPU:0", fn)
        after = emulated_gpu.dispatch_counts()
        kernels = sorted(k for k in after if after[k] - before.get(k, 0) > 0)
        c_out, c = timed("/CPU:0", cpu[name])
        for a, b in zip(tf.nest.flatten(g_out), tf.nest.flatten(c_out)):  # same op, same answer
            np.testing.assert_allclose(np.asarray(a.numpy(), np.float32), np.asarray(b.numpy(), np.float32),
                                       rtol=2e-3, atol=2e-3, err_msg=name)
        rows.append({"case": name, "kernels": kernels, "emulated_gpu": g, "cpu": c})
        print(f"  {name}: emulated {g['median_s']:.4f} s, CPU {c['median_s']:.4f} s ({', '.join(kernels)})",
              file=sys.stderr, flush=True)
    return {"rows": rows, "tensorflow": tf.__version__,
            "emu_workers": os.environ.get("TF_METAL_OPS_EMULATED_GPU_WORKERS") or os.environ.get("MSL_EMU_WORKERS")
            or "default (all CPUs)"}


def table(report: dict) -> str:
    lines = ["| case | kernels dispatched | emulated /GPU:0 s/call, median (min..max) | CPU /CPU:0 s/call (control) |",
             "|---|---|---|---|"]
    for r in report["rows"]:
        g, c = r["emulated_gpu"], r["cpu"]
        lines.append(f"| {r['case']} | {', '.join(r['kernels'])} | {g['median_s']:.4f} ({g['min_s']:.4f}..{g['max_s']:.4f}) "
                     f"| {c['median_s']:.4f} ({c['min_s']:.4f}..{c['max_s']:.4f}) |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--points", type=int, default=1 << 16)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run the measurements, write JSON here
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.points < 1:
        ap.error("--repeats and --points must be >= 1")
    if args.worker:
        with open(args.worker, "w") as f:
            json.dump(worker(args.points, args.repeats), f)
        return 0
    report = {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(), "repeats": args.repeats,
              "points": args.points, "config": CONFIG, "loadavg_before": os.getloadavg()}
    print(f"hash grid on the emulated GPU: {report['cpu']} ({report['cores']} cores), {args.points} points, "
          f"medians of {args.repeats} calls; load average {report['loadavg_before'][0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="tfmo-bench-fiber-") as tmp:
        out = os.path.join(tmp, "worker.json")
        env = dict(os.environ, TF_METAL_OPS_EMULATED_GPU="1")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", out, "--repeats", str(args.repeats),
               "--points", str(args.points)]
        res = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True)
        if res.returncode != 0:
            sys.stderr.write(res.stdout + res.stderr[-6000:])
            raise SystemExit(f"the emulated-GPU worker failed (exit {res.returncode})")
        with open(out) as f:
            report.update(json.load(f))
    report["loadavg_after"] = os.getloadavg()
    print(f"TensorFlow {report['tensorflow']}, emulated GPU workers: {report['emu_workers']}; load average after "
          f"{report['loadavg_after'][0]:.2f}\n")
    print(table(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
