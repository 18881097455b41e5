"""Seconds per op call on the Metal-emulating GPU (/GPU:0, TF_METAL_OPS_EMULATED_GPU=1) vs the CPU kernels (/CPU:0).

    python bench/emulated_gpu.py [--repeats 5] [--quick] [--json OUT]

The emulated GPU runs the package's GPU host code (csrc/gpu) and the unchanged Metal kernels on the CPU, one C++
call per kernel thread (tf_metal_ops/emulated_gpu, docs/emulated_gpu.md): its speed says nothing about a Mac's GPU.
The numbers show what the emulation costs (how long the emulated tests and examples take), against the CPU
kernels of the same ops on the same machine and in the same run. Cases:
  zero_out                    1M float32;
  hash_grid_encode fwd        2^16 points, D=3, L=16, F=2, log2 T=19, N_min=16, b=1.5, float32 table;
  hash_grid_encode fwd+bwd    the forward + d/dparams (upstream gradient a constant; positions not watched);
  volume_render fwd+bwd       R=2^14 rays, S=64 samples, C=3, no background: forward + the backward op.
Each call runs in a tf.function under tf.device(...) and returns every output (the forward's too, so the function
keeps it: the backward ops need only the inputs); the timer stops after tf_metal_ops.emulated_gpu.synchronize()
(the GPU ops return before their kernels ran) and .numpy() of every output (on both devices). Median of --repeats runs after
one warm-up run (tracing, pipeline set-up), plus min and max; ratio = emulated median / CPU median.

TensorFlow must see the switch before it initialises its devices, so the measurements run in a subprocess of
their own (this script with --worker and TF_METAL_OPS_EMULATED_GPU=1); both devices are timed in that process.
Needs clang++ >= 16 (the first run builds the emulated GPU, about a minute); without it the result says
"skipped" and why. --quick shrinks the sizes (zero_out 2^18, 2^13 points, log2 T=15, R=2^12) for a smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from bench_util import (cpu_model, emulated_workers, markdown_table, require_emulated_gpu,  # noqa: E402
                        run_emulated_worker, seconds_cell, time_emulated_call, write_json)

HERE = os.path.dirname(os.path.abspath(__file__))
HASH_CONFIG = dict(n_levels=16, n_features_per_level=2, log2_hashmap_size=19, base_resolution=16, per_level_scale=1.5)
SIZES = {"zero_out": 1 << 20, "points": 1 << 16, "log2_hashmap_size": 19, "rays": 1 << 14, "samples": 64}
QUICK = {"zero_out": 1 << 18, "points": 1 << 13, "log2_hashmap_size": 15, "rays": 1 << 12, "samples": 64}




# ---- worker (TF_METAL_OPS_EMULATED_GPU=1) ------------------------------------------------------------------------
def worker(sizes: dict, repeats: int) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    import tf_metal_ops as t
    from tf_metal_ops.hash_grid import HashGridConfig

    emulated_gpu = require_emulated_gpu()
    rng = np.random.default_rng(0)
    cfg = HashGridConfig(3, **dict(HASH_CONFIG, log2_hashmap_size=sizes["log2_hashmap_size"]))
    n, r, s = sizes["points"], sizes["rays"], sizes["samples"]
    host = {
        "z": (rng.standard_normal(sizes["zero_out"]) * 100).astype(np.float32),
        "x": rng.random((n, 3), dtype=np.float32),
        "p": rng.uniform(-1e-4, 1e-4, cfg.params_shape).astype(np.float32),
        "dy": rng.standard_normal((n, cfg.n_output_dims)).astype(np.float32),
        "sigma": rng.gamma(1.0, 2.0, (r, s)).astype(np.float32),
        "rgb": rng.random((r, s, 3), dtype=np.float32),
        "t": np.sort(rng.uniform(2.0, 6.0, (r, s + 1)), axis=1).astype(np.float32),
        "gc": rng.standard_normal((r, 3)).astype(np.float32),
        "gd": rng.standard_normal(r).astype(np.float32),
        "go": rng.standard_normal(r).astype(np.float32),
        "gw": rng.standard_normal((r, s)).astype(np.float32),
    }
    kw = cfg.op_kwargs()

    def cases(d):
        """name -> (size text, tf.function); inputs resident on the device before timing."""
        with tf.device(d):
            v = {k: tf.constant(a) for k, a in host.items()}

        @tf.function
        def zero_out():
            return t.zero_out(v["z"])

        @tf.function
        def hg_fwd():
            return t.hash_grid_encode(v["x"], v["p"], **kw)

        @tf.function
        def hg_fwd_bwd():
            with tf.GradientTape() as tape:
                tape.watch(v["p"])
                y = t.hash_grid_encode(v["x"], v["p"], **kw)
            return y, tape.gradient(y, v["p"], output_gradients=v["dy"])  # y too: else the forward is pruned

        @tf.function
        def vr_fwd_bwd():
            ins = [v["sigma"], v["rgb"], v["t"]]
            with tf.GradientTape() as tape:
                tape.watch(ins)
                out = t.volume_render(*ins)
            return out, tape.gradient(list(out), ins, output_gradients=[v["gc"], v["gd"], v["go"], v["gw"]])

        hg = f"{n} points, D=3, L=16, F=2, log2 T={sizes['log2_hashmap_size']}"
        return {
            "zero_out": (f"{sizes['zero_out']} float32", zero_out, "zero_out_float32"),
            "hash_grid_encode fwd": (hg, hg_fwd, "hash_grid_encode_d3f2_float32"),
            "hash_grid_encode fwd+bwd": (hg, hg_fwd_bwd, "hash_grid_grad_params_d3f2_float32"),
            "volume_render fwd+bwd": (f"R={r}, S={s}, C=3", vr_fwd_bwd, "volume_render_backward"),
        }

    gpu_cases, cpu_cases = cases("/GPU:0"), cases("/CPU:0")
    rows = []
    for name in gpu_cases:
        size, fn, kernel = gpu_cases[name]
        before = emulated_gpu.dispatch_counts().get(kernel, 0)
        g_out, g = time_emulated_call("/GPU:0", fn, repeats)
        ran = emulated_gpu.dispatch_counts().get(kernel, 0) - before
        assert ran >= repeats + 1, f"{name}: {kernel} ran {ran} times on the emulated GPU, want {repeats + 1}"
        for x in tf.nest.flatten(g_out):
            assert x.device.endswith("GPU:0"), f"{name}: result on {x.device}"
        c_out, c = time_emulated_call("/CPU:0", cpu_cases[name][1], repeats)
        for a, b in zip(tf.nest.flatten(g_out), tf.nest.flatten(c_out)):  # same op, same answer
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-4, err_msg=name)
        rows.append({"op": name, "size": size, "emulated_gpu": g, "cpu": c, "ratio": g["median_s"] / c["median_s"]})
        print(f"  {name}: emulated {g['median_s']:.4f} s, CPU {c['median_s']:.4f} s", file=sys.stderr, flush=True)
    return {"rows": rows, "tensorflow": tf.__version__, "op_threads": t.get_num_threads(),
            "emu_workers": emulated_workers("default")}


# ---- parent --------------------------------------------------------------------------------------------------
def table(report: dict) -> str:
    return markdown_table(
        ["op", "size", "emulated /GPU:0 (s/call)", "CPU kernels /CPU:0 (s/call)", "emulated / CPU"],
        [[r["op"], r["size"], seconds_cell(r["emulated_gpu"]), seconds_cell(r["cpu"]), f"{r['ratio']:.1f}x"]
         for r in report["rows"]])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run (not the reported numbers)")
    ap.add_argument("--json", help="also write the results here (bench/run_all.py collects them)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run the measurements, write JSON here
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    sizes = QUICK if args.quick else SIZES
    if args.worker:
        result = worker(sizes, args.repeats)
        with open(args.worker, "w") as f:
            json.dump(result, f)
        return 0

    report = {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(), "repeats": args.repeats,
              "quick": args.quick, "sizes": sizes, "hash_grid_config": dict(HASH_CONFIG, **{
                  "log2_hashmap_size": sizes["log2_hashmap_size"]})}
    print(f"emulated GPU vs CPU kernels: {report['cpu']} ({report['cores']} cores), {report['platform']}; "
          f"medians of {args.repeats} runs after a warm-up, both devices in one subprocess"
          + (" [--quick sizes]" if args.quick else ""), flush=True)
    result, res = run_emulated_worker(__file__, ["--repeats", str(args.repeats)] + (["--quick"] if args.quick else []),
                                      "tfmo-bench-emu-")
    if result is not None:
        report.update(result)
    elif "EmulatedGPUError" in res.stderr:  # no clang++ >= 16, or a TF with a real GPU: say so, do not fail
        report["skipped"] = res.stderr.strip().splitlines()[-1]
    else:
        sys.stderr.write(res.stdout + res.stderr[-6000:])
        raise SystemExit(f"the emulated-GPU worker failed (exit {res.returncode})")
    if "skipped" in report:
        print(f"skipped: {report['skipped']}")
    else:
        print(f"TensorFlow {report['tensorflow']}, {report['op_threads']} op threads (CPU kernels), emulated GPU "
              f"workers: {report['emu_workers']}\n")
        print(table(report))
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
