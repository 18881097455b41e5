"""Per-call overhead of a custom op: eager ZeroOut and an inline Metal kernel (metal_kernel, `y = x`) on a
4-element tensor vs tf.identity on the same tensor.

All go through TF's eager dispatch; the difference is what the C API kernel interface and the package's Python
wrappers add. Median of --repeats batches of --calls calls each, all measured in this run, interleaved. Target: each
package call at most 1.5x tf.identity.

    python bench/call_overhead.py [--calls 5000] [--repeats 15] [--json OUT]
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import tf_metal_ops  # noqa: E402
from bench_util import cpu_model  # noqa: E402

COPY = tf_metal_ops.metal_kernel("bench_copy", ["x"], ["y"], "uint i = thread_position_in_grid.x; y[i] = x[i];")


def per_call_us(fn, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--json")
    args = p.parse_args()
    x = tf.constant([1.0, 2.0, 3.0, 4.0])
    raw = tf.load_op_library(tf_metal_ops.library_path())
    impls = {
        "tf.identity": lambda: tf.identity(x),
        "zero_out (package wrapper)": lambda: tf_metal_ops.zero_out(x),
        "zero_out (raw op)": lambda: raw.zero_out(x),
        "metal_kernel (inline)": lambda: COPY(inputs=[x], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
                                              output_dtypes=[tf.float32]),
    }
    samples = {k: [] for k in impls}
    for fn in impls.values():
        per_call_us(fn, 500)  # warm up
    for _ in range(args.repeats):  # interleaved, so load changes hit all alike
        for k, fn in impls.items():
            samples[k].append(per_call_us(fn, args.calls))
    med = {k: statistics.median(v) for k, v in samples.items()}
    base = med["tf.identity"]
    print(f"{cpu_model()}; TensorFlow {tf.__version__}; median of {args.repeats} x {args.calls} eager calls, "
          "4-element float32")
    for k, v in med.items():
        print(f"{k:28s} {v:7.2f} us/call   {v / base:5.2f}x tf.identity")
    ratio = med["zero_out (package wrapper)"] / base
    inline = med["metal_kernel (inline)"] / base
    for what, r in (("zero_out", ratio), ("metal_kernel", inline)):
        print(f"target {what} <= 1.5x tf.identity: {r:.2f}x ({'met' if r <= 1.5 else 'NOT met'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"median_us": med, "ratio_wrapper_vs_identity": ratio, "ratio_inline_vs_identity": inline}, f,
                      indent=1)


if __name__ == "__main__":
    main()
