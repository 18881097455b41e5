"""Fused-MLP speed on the CPU: tf_metal_ops.fused_mlp (float32 and bfloat16 products) against Keras Dense stacks of
the same networks, with and without XLA, in one run.

    python bench/fused_mlp.py [--rows 262144] [--rounds 7] [--threads N] [--nets density,colour] [--dtype float32]

Networks (Instant-NGP's NeRF MLPs; relu hidden layers, no biases, the Dense stacks use_bias=False):
  density  32 inputs -> 64 (1 hidden layer) -> 16 outputs, no output activation;
  colour   32 inputs -> 64 -> 64 (2 hidden layers) -> 3 outputs, sigmoid.
Variants: the op with products="float32" and "bfloat16" (the "fused_mlp build" line says which build ran: AMX tiles
(TDPBF16PS) on CPUs with AMX-BF16, VDPBF16PS on CPUs with AVX512-BF16, the same arithmetic emulated in float32 code
elsewhere), the Keras stack in a tf.function,
and the same with jit_compile=True (XLA); x, the parameters and the Keras layers in --dtype (float16: the op reads
float16 and sums in float32). Every variant runs in a tf.function:
  fwd       the forward alone (the op with training=False);
  fwd+bwd   forward and the gradients w.r.t. the input and every weight of loss = sum(y * w) with fixed random w.
Timing: after two warm-up calls of every variant, --rounds rounds each call every variant once, in turn
(interleaved, so that load from elsewhere on the machine spreads over all of them); the numbers are the median
(and min) per variant. The ratios are the faster Keras variant's median over the op's. The op uses the package's
thread pool (--threads, default: its own default); Keras uses TensorFlow's pools.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_metal_ops  # noqa: E402
from bench_util import cpu_model, interleaved_ms  # noqa: E402

# name: (n_input, width, n_hidden_layers, n_output, output activation)
NETS = {"density": (32, 64, 1, 16, "none"), "colour": (32, 64, 2, 3, "sigmoid")}


def cpu_flags():
    """The CPU's /proc/cpuinfo flags of interest (AVX-512 and bfloat16 support)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line.split(":", 1)[1].split() for line in f if line.startswith("flags"))
    except (OSError, StopIteration):
        return "unknown"
    wanted = [f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "fma")]
    return " ".join(wanted) or "none of avx2/fma/avx512*/amx*"


def variants(name, rows, seed, dtype):
    """{variant: (fwd fn, fwd+bwd fn)} of one network."""
    n_input, width, layers, n_output, out_act = NETS[name]
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.standard_normal((rows, n_input)).astype(dtype))
    w_out = tf.constant(rng.standard_normal((rows, n_output)).astype(dtype))
    opts = dict(n_hidden_layers=layers, width=width, n_output=n_output, activation="relu",
                output_activation=out_act)
    layout = tf_metal_ops.fused_mlp_layout(n_input, n_output, width=width, n_hidden_layers=layers)
    params = tf.Variable(layout.init_params(seed=seed, dtype=dtype))
    out = {}

    def op_pair(**extra):
        @tf.function
        def fwd():
            return tf_metal_ops.fused_mlp(x, params, training=False, **opts, **extra)

        @tf.function
        def fwd_bwd():
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(tf_metal_ops.fused_mlp(x, params, **opts, **extra) * w_out)
            return tape.gradient(loss, [x, params])

        return fwd, fwd_bwd

    out["op float32"] = op_pair()
    if "products" in inspect.signature(tf_metal_ops.fused_mlp).parameters:
        out["op bfloat16"] = op_pair(products="bfloat16")
    dense = keras.Sequential([keras.Input((n_input,), dtype=dtype)] +
                             [keras.layers.Dense(width, activation="relu", use_bias=False, dtype=dtype)
                              for _ in range(layers)] +
                             [keras.layers.Dense(n_output, activation=None if out_act == "none" else out_act,
                                                 use_bias=False, dtype=dtype)])
    for label, jit in (("Keras", False), ("Keras XLA", True)):
        @tf.function(jit_compile=jit)
        def fwd():
            return dense(x)

        @tf.function(jit_compile=jit)
        def fwd_bwd():
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(dense(x) * w_out)
            return tape.gradient(loss, [x] + dense.trainable_variables)

        out[label] = (fwd, fwd_bwd)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1 << 18)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="the op's thread count (0: the package default)")
    ap.add_argument("--nets", default="density,colour", help="comma-separated: " + ", ".join(NETS))
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    args = ap.parse_args(argv)
    if args.threads:
        tf_metal_ops.set_num_threads(args.threads)
    nets = args.nets.split(",")
    for name in nets:
        if name not in NETS:
            ap.error(f"unknown network {name!r} (one of {', '.join(NETS)})")

    print(f"CPU: {cpu_model()} ({os.cpu_count()} CPUs visible; op threads: {tf_metal_ops.get_num_threads()})")
    print(f"CPU flags: {cpu_flags()}")
    print(f"TensorFlow {tf.__version__}, keras {keras.__version__}, tf_metal_ops from "
          f"{os.path.dirname(tf_metal_ops.__file__)}; {args.rows} rows, {args.dtype}; median (min) of {args.rounds} "
          f"interleaved rounds, ms")
    fns, shapes = {}, {}
    for seed, name in enumerate(nets):
        n_input, width, layers, n_output, out_act = NETS[name]
        shapes[name] = f"{n_input} -> {' -> '.join([str(width)] * layers)} -> {n_output} ({out_act})"
        for label, (fwd, fwd_bwd) in variants(name, args.rows, seed, args.dtype).items():
            fns[(name, "fwd", label)] = fwd
            fns[(name, "fwd+bwd", label)] = fwd_bwd
    times = interleaved_ms(fns, args.rounds)
    try:
        from tf_metal_ops import diagnostics

        paths = diagnostics.cpu_paths("fused_mlp")
        print(f"fused_mlp build: {paths['selected']} (supported: {', '.join(paths['supported'])})")
    except Exception as e:  # an older library without the diagnostics
        print(f"fused_mlp build: unknown ({e})")
    labels = [label for label in ("op float32", "op bfloat16", "Keras", "Keras XLA")
              if any(k[2] == label for k in fns)]
    print(f"{'network':8s} {'pass':8s} " + " ".join(f"{label:>18s}" for label in labels) +
          "   Keras best / op: float32" + ("  bfloat16" if "op bfloat16" in labels else ""))
    for name in nets:
        for what in ("fwd", "fwd+bwd"):
            cells, med = [], {}
            for label in labels:
                m, lo = times[(name, what, label)]
                med[label] = m
                cells.append(f"{m:8.1f} ({lo:7.1f})")
            best = min(med["Keras"], med["Keras XLA"])
            ratios = f"{best / med['op float32']:6.2f}x"
            if "op bfloat16" in med:
                ratios += f"   {best / med['op bfloat16']:6.2f}x"
            print(f"{name:8s} {what:8s} " + " ".join(f"{c:>18s}" for c in cells) + f"   {ratios}")
    print("networks: " + "; ".join(f"{n}: {s}" for n, s in shapes.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
