"""Fused-MLP training on the CPU with the hidden activations kept or computed again: the forward and the gradient
kernels (the raw ops FusedMlp and FusedMlpGrad), one fed the kept activations, the other hidden [0, N, width] (the
gradient computes each block's activations again in cache), in one run.

    python bench/fused_mlp_activations.py [--rows 262144] [--rounds 9] [--products float32,bfloat16]

The CPU kernel keeps the activations at width 128 and computes them again below (csrc/cpu/fused_mlp_cpu.cc,
KeepActivations); this measures both ways at every width, so this process sets
TF_METAL_OPS_FUSED_MLP_KEEP_ACTIVATIONS=always (a forward with training=True then keeps them) and feeds the gradient
either what the forward kept or nothing. Networks: relu hidden layers, no biases, no output activation, 32 inputs
(16 at width 16). Timing: interleaved rounds after two warm-up calls (bench_util.interleaved_ms); the ratio is the
median with the activations kept over the median with them computed again (above 1: computing them again is faster).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TF_METAL_OPS_FUSED_MLP_KEEP_ACTIVATIONS"] = "always"  # read once, by the first forward

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_metal_ops  # noqa: E402
from bench_util import cpu_model, interleaved_ms  # noqa: E402
from tf_metal_ops._library import ops  # noqa: E402

# name: (n_input, width, n_hidden_layers, n_output)
NETS = {"density": (32, 64, 1, 16), "colour": (32, 64, 2, 3), "w16x2": (16, 16, 2, 4), "w32x2": (32, 32, 2, 16),
        "w128x4": (32, 128, 4, 16)}


def variants(name, rows, products, seed):
    """{"kept": fn, "again": fn}: forward (training) + gradient of one network."""
    n_input, width, layers, n_output = NETS[name]
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.standard_normal((rows, n_input)).astype(np.float32))
    dy = tf.constant(rng.standard_normal((rows, n_output)).astype(np.float32))
    params = tf.constant(tf_metal_ops.fused_mlp_layout(n_input, n_output, width=width,
                                                       n_hidden_layers=layers).init_params(seed=seed))
    attrs = dict(n_hidden_layers=layers, width=width, n_output=n_output, activation="relu", output_activation="none",
                 use_bias=False, products=products, feature_major=False)

    @tf.function
    def kept():
        y, hidden = ops().fused_mlp(x, params, training=True, **attrs)
        return ops().fused_mlp_grad(dy, x, params, y, hidden, **attrs)

    @tf.function
    def again():
        y, none = ops().fused_mlp(x, params, training=False, **attrs)
        return ops().fused_mlp_grad(dy, x, params, y, none, **attrs)

    return {"kept": kept, "again": again}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1 << 18)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--products", default="float32,bfloat16")
    ap.add_argument("--nets", default=",".join(NETS), help="comma-separated: " + ", ".join(NETS))
    args = ap.parse_args(argv)
    nets, products = args.nets.split(","), args.products.split(",")
    for name in nets:
        if name not in NETS:
            ap.error(f"unknown network {name!r} (one of {', '.join(NETS)})")
    print(f"CPU: {cpu_model()} ({os.cpu_count()} CPUs visible; op threads: {tf_metal_ops.get_num_threads()})")
    print(f"TensorFlow {tf.__version__}; {args.rows} rows; forward (training) + gradient, median (min) of "
          f"{args.rounds} interleaved rounds, ms")
    fns = {}
    for seed, name in enumerate(nets):
        for p in products:
            for how, fn in variants(name, args.rows, p, seed).items():
                fns[(name, p, how)] = fn
    times = interleaved_ms(fns, args.rounds)
    from tf_metal_ops import diagnostics

    print(f"fused_mlp build: {diagnostics.cpu_paths('fused_mlp')['selected']}")
    print(f"{'network':8s} {'products':9s} {'kept':>16s} {'computed again':>16s}   kept / again")
    for name in nets:
        for p in products:
            (k, k_lo), (a, a_lo) = times[(name, p, "kept")], times[(name, p, "again")]
            print(f"{name:8s} {p:9s} {k:8.1f} ({k_lo:5.1f}) {a:8.1f} ({a_lo:5.1f})   {k / a:6.2f}")
    print("networks: " + "; ".join(f"{n}: {i} -> {' -> '.join([str(w)] * layers)} -> {o}"
                                   for n, (i, w, layers, o) in NETS.items() if n in nets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
