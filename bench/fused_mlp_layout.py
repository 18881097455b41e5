"""The hash grid feeding the fused MLP on the CPU, in its two layouts, in one run: ``hash_grid_encode`` into
``[N, L*F]`` then ``fused_mlp``, against ``hash_grid_encode(feature_major=True)`` into ``[L*F, N]`` then
``fused_mlp(feature_major=True)``, which reads it in place.

    python bench/fused_mlp_layout.py [--rows 32768,262144] [--rounds 11]

The NeRF example's density field: 3-D points, 16 levels x 2 features, 2^17 table entries per level, resolutions 16 to
512, then the density network (32 -> 64 -> 16, relu, biases). Per layout, a tf.function that runs the encode and
the MLP forward and, under a tape, the gradients w.r.t. the table and the MLP parameters of sum(y^2). Timing:
``bench_util.interleaved_ms`` (warm-up calls, then rounds that call both layouts in turn); medians and minima in
ms, and feature-major / point-major (below 1: feature-major is the faster).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import tf_metal_ops  # noqa: E402
from bench_util import cpu_model, interleaved_ms  # noqa: E402
from tf_metal_ops.hash_grid import HashGridConfig  # noqa: E402

GRID = HashGridConfig(n_input_dims=3, n_levels=16, n_features_per_level=2, log2_hashmap_size=17, base_resolution=16,
                      per_level_scale=(512 / 16) ** (1 / 15))
MLP = dict(n_hidden_layers=1, width=64, n_output=16, use_bias=True)


def step_fn(n, feature_major):
    """A tf.function: (y, table gradient, parameter gradient) of the density field at n fixed random points."""
    pos = tf.random.stateless_uniform([n, 3], seed=[1, 2])
    table = tf.Variable(tf.random.stateless_uniform(GRID.params_shape, seed=[3, 4], minval=-1e-2, maxval=1e-2))
    layout = tf_metal_ops.fused_mlp_layout(32, 16, width=64, n_hidden_layers=1, use_bias=True)
    params = tf.Variable(layout.init_params(seed=1))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            enc = tf_metal_ops.hash_grid_encode(pos, table, feature_major=feature_major, **GRID.op_kwargs())
            y = tf_metal_ops.fused_mlp(enc, params, feature_major=feature_major, **MLP)
            loss = tf.reduce_sum(y * y)
        return [y, *tape.gradient(loss, [table, params])]

    return step


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="32768,262144", help="comma-separated point counts")
    p.add_argument("--rounds", type=int, default=11)
    args = p.parse_args()
    print(f"CPU: {cpu_model()}; TensorFlow {tf.__version__}; {args.rounds} rounds, ms (median / min)")
    print("| points | point-major | feature-major | feature-major / point-major |")
    print("|---:|---:|---:|---:|")
    for n in (int(v) for v in args.rows.split(",")):
        t = interleaved_ms({fm: step_fn(n, fm) for fm in (False, True)}, args.rounds)
        (pm, pmin), (fm, fmin) = t[False], t[True]
        print(f"| {n:,} | {pm:.2f} / {pmin:.2f} | {fm:.2f} / {fmin:.2f} | {fm / pm:.3f} |", flush=True)


if __name__ == "__main__":
    main()
