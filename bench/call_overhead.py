"""Per-call overhead of a custom op: eager ZeroOut and an inline Metal kernel (metal_kernel, `y = x`) on a
4-element tensor vs tf.identity on the same tensor.

All go through TF's eager dispatch; the difference is what the C API kernel interface and the package's Python
wrappers add. Median of --repeats batches of --calls calls each, all measured in this run, interleaved. Target: each
package call at most 1.5x tf.identity, whatever the kernel's source length ("large": a header of 400 helper functions,
about 25 KB). The "all attrs" rows run the same calls as TfmoMetalKernel with every attribute, the generated source
among them (what a graph holds), whose cost grows with the source; an eager call instead runs TfmoMetalKernelCall,
whose attributes are registered once per process (docs/metal_kernels.md).

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


# The same copy after a header of 400 helper functions: a kernel with a library of helpers in front of it.
HELPERS = "\n".join(f"inline float helper_{i}(float v) {{ return v * {i}.0f + 1.0f; }}" for i in range(400))
COPY_LARGE = tf_metal_ops.metal_kernel("bench_copy_large", ["x"], ["y"],
                                       "uint i = thread_position_in_grid.x; y[i] = x[i];", header=HELPERS)


def source_bytes(kernel):
    """The length of the Metal source that metal_kernel generates for `kernel` (TfmoMetalKernel's `source` attr)."""
    return len(kernel.instance(["float32"], [1], ["float32"], [1]).source.msl.encode())


def per_call_us(fn, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def inline_call(kernel, x):
    return lambda: kernel(inputs=[x], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
                          output_dtypes=[tf.float32])


def full_op_call(kernel, x):
    """The same call as TfmoMetalKernel with its nine attrs (the source among them), which TF's eager kernel cache
    fingerprints on every call; an eager call registers them once and runs TfmoMetalKernelCall instead."""
    from tf_metal_ops.inline_kernels import api

    inline_call(kernel, x)()
    (inst, prepared_launch), = kernel._calls.values()
    full = api._Instance(inst.source, inst.attrs)  # no tin: not a registered call
    return lambda: api._run(full, [x], prepared_launch)


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
        "metal_kernel (inline)": inline_call(COPY, x),
        "metal_kernel (all attrs)": full_op_call(COPY, x),
        "metal_kernel (large source)": inline_call(COPY_LARGE, x),
        "metal_kernel (large, all attrs)": full_op_call(COPY_LARGE, x),
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
          f"4-element float32; generated sources of {source_bytes(COPY)} and {source_bytes(COPY_LARGE)} bytes (large)")
    for k, v in med.items():
        print(f"{k:32s} {v:7.2f} us/call   {v / base:5.2f}x tf.identity")
    ratio = med["zero_out (package wrapper)"] / base
    inline = med["metal_kernel (inline)"] / base
    large = med["metal_kernel (large source)"] / base
    for what, r in (("zero_out", ratio), ("metal_kernel", inline), ("metal_kernel, large source", large)):
        print(f"target {what} <= 1.5x tf.identity: {r:.2f}x ({'met' if r <= 1.5 else 'NOT met'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"median_us": med, "ratio_wrapper_vs_identity": ratio, "ratio_inline_vs_identity": inline,
                   "ratio_inline_large_source_vs_identity": large}, f,
                      indent=1)


if __name__ == "__main__":
    main()
