"""Fused-MLP speed on the CPU: tf_metal_ops.fused_mlp against a Keras Dense stack of the same shape, same run.

    python bench/fused_mlp.py [--rows 65536] [--repeats 9] [--threads N] [--dtype float32]

Shape (a NeRF density MLP): 32 inputs -> 64 -> 64 -> 16 outputs, relu, no output activation, no biases (the
Dense stack: use_bias=False). Both run in a tf.function; every number is the median (and min) of --repeats runs
after two warm-up runs:
  fwd       the forward alone (the op with training=False);
  fwd+bwd   forward and the gradients w.r.t. the input and every weight of loss = sum(y * w) with fixed random w.
The op uses the package's thread pool (--threads, default: its own default); Keras uses TensorFlow's pools. The
machine may be shared: rerun when min and median are far apart.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_metal_ops  # noqa: E402
from bench_util import cpu_model, median_ms  # noqa: E402

N_INPUT, WIDTH, N_HIDDEN, N_OUTPUT = 32, 64, 2, 16


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=65536)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=0, help="the op's thread count (0: the package default)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    args = ap.parse_args(argv)
    if args.threads:
        tf_metal_ops.set_num_threads(args.threads)

    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((args.rows, N_INPUT)).astype(args.dtype))
    w_out = tf.constant(rng.standard_normal((args.rows, N_OUTPUT)).astype(args.dtype))
    opts = dict(n_hidden_layers=N_HIDDEN, width=WIDTH, n_output=N_OUTPUT, activation="relu",
                output_activation="none")
    layout = tf_metal_ops.fused_mlp_layout(N_INPUT, N_OUTPUT, width=WIDTH, n_hidden_layers=N_HIDDEN)
    params = tf.Variable(layout.init_params(seed=0, dtype=args.dtype))

    dense = keras.Sequential([keras.Input((N_INPUT,), dtype=args.dtype)] +
                             [keras.layers.Dense(WIDTH, activation="relu", use_bias=False, dtype=args.dtype)
                              for _ in range(N_HIDDEN)] +
                             [keras.layers.Dense(N_OUTPUT, use_bias=False, dtype=args.dtype)])

    @tf.function
    def op_fwd():
        return tf_metal_ops.fused_mlp(x, params, training=False, **opts)

    @tf.function
    def op_fwd_bwd():
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf_metal_ops.fused_mlp(x, params, **opts) * w_out)
        return tape.gradient(loss, [x, params])

    @tf.function
    def dense_fwd():
        return dense(x)

    @tf.function
    def dense_fwd_bwd():
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(dense(x) * w_out)
        return tape.gradient(loss, [x] + dense.trainable_variables)

    print(f"CPU: {cpu_model()} ({os.cpu_count()} CPUs visible; op threads: {tf_metal_ops.get_num_threads()})")
    print(f"TensorFlow {tf.__version__}, keras {keras.__version__}; {args.rows} rows, "
          f"{N_INPUT} -> {' -> '.join([str(WIDTH)] * N_HIDDEN)} -> {N_OUTPUT}, relu, {args.dtype}, "
          f"median (min) of {args.repeats} runs")
    rows = []
    for what, op_fn, dense_fn in (("fwd", op_fwd, dense_fwd), ("fwd+bwd", op_fwd_bwd, dense_fwd_bwd)):
        op_med, op_min = median_ms(op_fn, args.repeats)
        dn_med, dn_min = median_ms(dense_fn, args.repeats)
        rows.append((what, op_med, op_min, dn_med, dn_min))
    print(f"{'':8s} {'fused_mlp ms':>18s} {'Keras Dense ms':>18s} {'Dense / op':>10s}")
    for what, op_med, op_min, dn_med, dn_min in rows:
        print(f"{what:8s} {op_med:9.2f} ({op_min:6.2f}) {dn_med:9.2f} ({dn_min:6.2f}) {dn_med / op_med:9.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
