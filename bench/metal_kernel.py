"""Inline Metal kernels (tf_metal_ops.metal_kernel) on the CPU: call overhead, compile time, and speed against
TensorFlow's and the package's own CPU kernels, every baseline measured in this run.

    python bench/metal_kernel.py [--calls 3000] [--repeats 15] [--size 4194304] [--compile-runs 5]
                                 [--simd-size 65536] [--parts overhead,compile,cpu,simd] [--json OUT]

  - call overhead: eager calls on a 4-element float32 tensor (and the same calls inside a tf.function), medians of
    --repeats interleaved batches of --calls calls, against tf.identity and the package's zero_out;
  - compile time, each in a fresh process with its own cache: the first call of a kernel whose source is new
    ("cold": clang compiles it; the first run of all also builds the shared launcher object), and the first call in a
    second process that finds it in the disk cache ("cached");
  - CPU speed on --size floats: `exp` written inline vs tf.exp, and an inline ZeroOut vs the package's zero_out;
  - SIMD-group calls on the CPU (fibers: msl_emu/fiber_switch.h): --simd-size threads (groups of 256) each call
    simd_sum SIMD_CALLS times in a loop, against the same loop with the call replaced by plain arithmetic (the
    fiber-free path); the difference per thread and call is the cost of one rendezvous (two fiber switches plus
    the scheduler's share of resolving the SIMD group). --parts picks the parts to run.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_metal_ops as t  # noqa: E402
from bench_util import cpu_model, median_ms  # noqa: E402

EXP = t.metal_kernel("bench_exp", ["x"], ["y"], """
    uint i = thread_position_in_grid.x;
    y[i] = metal::exp(x[i]);
""")
SIMD_CALLS = 16
SIMD_LOOP = t.metal_kernel("bench_simd_loop", ["x"], ["y"], f"""
    uint i = thread_position_in_grid.x;
    float v = x[i];
    for (uint k = 0; k < {SIMD_CALLS}; ++k) v = simd_sum(v) * 0.03125f + 1.0f;
    y[i] = v;
""")
PLAIN_LOOP = t.metal_kernel("bench_plain_loop", ["x"], ["y"], f"""
    uint i = thread_position_in_grid.x;
    float v = x[i];
    for (uint k = 0; k < {SIMD_CALLS}; ++k) v = (v * 32.0f) * 0.03125f + 1.0f;
    y[i] = v;
""")
ZERO_OUT = t.metal_kernel("bench_zero_out", ["x"], ["y"], """
    uint i = thread_position_in_grid.x;
    y[i] = i == 0 ? x[0] : 0.0f;
""")


def launch(x):
    n = int(np.prod(x.shape))
    return dict(inputs=[x], grid=(n, 1, 1), threadgroup=(256 if n >= 256 else n, 1, 1), output_shapes=[x.shape],
                output_dtypes=[x.dtype])


def per_call_us(fn, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def call_overhead(calls, repeats):
    x = tf.constant([1.0, 2.0, 3.0, 4.0])
    args = launch(x)
    eager = {
        "tf.identity": lambda: tf.identity(x),
        "zero_out (package op)": lambda: t.zero_out(x),
        "metal_kernel": lambda: EXP(**args),
    }
    graph_fns = {k: tf.function(v) for k, v in eager.items()}
    impls = {**{f"eager {k}": v for k, v in eager.items()}, **{f"tf.function {k}": v for k, v in graph_fns.items()}}
    samples = {k: [] for k in impls}
    for fn in impls.values():
        per_call_us(fn, 300)
    for _ in range(repeats):  # interleaved: load changes hit every variant alike
        for k, fn in impls.items():
            samples[k].append(per_call_us(fn, calls))
    return {k: statistics.median(v) for k, v in samples.items()}


FIRST_CALL = """
import time, os
t0 = time.perf_counter()
import tensorflow as tf, tf_metal_ops as t
x = tf.ones([1024])
k = t.metal_kernel("first", ["x"], ["y"], "uint i = thread_position_in_grid.x; y[i] = metal::exp(x[i]); // {nonce}")
t1 = time.perf_counter()
(y,) = k(inputs=[x], grid=(1024, 1, 1), threadgroup=(256, 1, 1), output_shapes=[(1024,)], output_dtypes=[tf.float32])
y.numpy()
t2 = time.perf_counter()
(y,) = k(inputs=[x], grid=(1024, 1, 1), threadgroup=(256, 1, 1), output_shapes=[(1024,)], output_dtypes=[tf.float32])
y.numpy()
print(t2 - t1, time.perf_counter() - t2)
"""


def first_call_s(cache, nonce):
    env = dict(os.environ, TF_METAL_OPS_CACHE=cache, TF_CPP_MIN_LOG_LEVEL="3")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(FIRST_CALL.replace("{nonce}", nonce))],
                       capture_output=True, text=True, env=env, check=True, cwd=cache)
    first, second = map(float, r.stdout.split()[-2:])
    return first, second


def compile_times(runs):
    with tempfile.TemporaryDirectory() as cache:
        first_ever = first_call_s(cache, "first")[0]  # builds the shared launcher object too
        cold, cached, again = [], [], []
        for i in range(runs):
            c, a = first_call_s(cache, f"cold{i}")
            cold.append(c)
            again.append(a)
            cached.append(first_call_s(cache, f"cold{i}")[0])
    return {"first_ever_s": first_ever, "cold_s": statistics.median(cold), "cached_s": statistics.median(cached),
            "second_call_s": statistics.median(again)}


def cpu_speed(size, repeats):
    x = tf.random.normal([size])
    rows = {}
    for name, fn, base_name, base in (
            ("exp", lambda: EXP(**launch(x))[0], "tf.exp", lambda: tf.exp(x)),
            ("zero_out", lambda: ZERO_OUT(**launch(x))[0], "tf_metal_ops.zero_out", lambda: t.zero_out(x))):
        np.testing.assert_allclose(fn().numpy(), base().numpy(), rtol=4e-6)
        meds = {"inline": [], "baseline": []}
        for _ in range(3):  # alternate blocks
            meds["inline"].append(median_ms(fn, repeats)[0])
            meds["baseline"].append(median_ms(base, repeats)[0])
        inline, baseline = statistics.median(meds["inline"]), statistics.median(meds["baseline"])
        rows[name] = {"baseline": base_name, "inline_ms": inline, "baseline_ms": baseline, "ratio": inline / baseline}
    return rows


def simd_speed(size, repeats):
    """ms per call of SIMD_LOOP and PLAIN_LOOP on `size` threads, and the difference per thread and simd_sum call."""
    x = tf.random.normal([size])
    args = dict(inputs=[x], grid=(size, 1, 1), threadgroup=(256, 1, 1), output_shapes=[x.shape],
                output_dtypes=[x.dtype])
    want = x.numpy().astype(np.float64)
    for _ in range(SIMD_CALLS):  # every lane ends with its SIMD group's mean, plus 1 per round
        want = np.repeat(want.reshape(-1, 32).sum(axis=1), 32) * 0.03125 + 1.0
    np.testing.assert_allclose(SIMD_LOOP(**args)[0].numpy(), want, rtol=1e-5, atol=1e-5)
    meds = {"simd": [], "plain": []}
    for _ in range(3):  # alternate blocks
        meds["simd"].append(median_ms(lambda: SIMD_LOOP(**args)[0], repeats)[0])
        meds["plain"].append(median_ms(lambda: PLAIN_LOOP(**args)[0], repeats)[0])
    simd, plain = statistics.median(meds["simd"]), statistics.median(meds["plain"])
    return {"threads": size, "calls_per_thread": SIMD_CALLS, "simd_ms": simd, "plain_ms": plain,
            "ns_per_call": (simd - plain) * 1e6 / (size * SIMD_CALLS)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--size", type=int, default=1 << 22)
    p.add_argument("--compile-runs", type=int, default=5)
    p.add_argument("--simd-size", type=int, default=1 << 16)
    p.add_argument("--parts", default="overhead,compile,cpu,simd", help="comma-separated subset to run")
    p.add_argument("--json")
    args = p.parse_args()
    parts = set(args.parts.split(","))
    if args.simd_size % 256 or args.simd_size <= 0:
        p.error("--simd-size must be a positive multiple of 256")
    print(f"{cpu_model()}, {os.cpu_count()} CPUs, TensorFlow {tf.__version__}, {t.get_num_threads()} op threads")
    result = {"cpu": cpu_model(), "size": args.size}
    if "overhead" in parts:
        over = call_overhead(args.calls, args.repeats)
        base = {"eager": over["eager tf.identity"], "tf.function": over["tf.function tf.identity"]}
        print(f"call overhead (median of {args.repeats} x {args.calls} calls, 4-element float32):")
        for k, v in over.items():
            mode = "eager" if k.startswith("eager") else "tf.function"
            print(f"  {k:36s} {v:7.2f} us/call  {v / base[mode]:5.2f}x tf.identity ({mode})")
        ratio = over["eager metal_kernel"] / base["eager"]
        print(f"  target: an eager call <= 1.5x tf.identity: {ratio:.2f}x ({'met' if ratio <= 1.5 else 'NOT met'})")
        result.update(call_overhead_us=over, eager_ratio_vs_identity=ratio)
    if "compile" in parts:
        comp = compile_times(args.compile_runs)
        print(f"compile (first call of a new kernel, fresh process; median of {args.compile_runs}): cold "
              f"{comp['cold_s']:.2f} s, from the disk cache {comp['cached_s'] * 1e3:.0f} ms, second call "
              f"{comp['second_call_s'] * 1e3:.2f} ms; the very first kernel of an empty cache "
              f"{comp['first_ever_s']:.2f} s")
        result.update(compile=comp)
    if "cpu" in parts:
        speed = cpu_speed(args.size, args.repeats)
        for name, r in speed.items():
            print(f"CPU, {args.size} floats: inline {name} {r['inline_ms']:.2f} ms vs {r['baseline']} "
                  f"{r['baseline_ms']:.2f} ms: {r['ratio']:.2f}x")
        r = speed["exp"]["ratio"]
        print(f"  target: inline exp within 3x tf.exp: {r:.2f}x ({'met' if r <= 3 else 'NOT met'})")
        result.update(cpu_speed=speed)
    if "simd" in parts:
        sd = simd_speed(args.simd_size, args.repeats)
        print(f"CPU, {sd['threads']} threads x {sd['calls_per_thread']} simd_sum calls (fibers): "
              f"{sd['simd_ms']:.2f} ms vs the same loop without the call (fiber-free) {sd['plain_ms']:.2f} ms: "
              f"{sd['ns_per_call']:.0f} ns per thread and call")
        result.update(simd=sd)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
