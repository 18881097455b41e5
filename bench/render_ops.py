"""Benchmark of the rendering ops against the same math in plain TensorFlow.

R rays x S samples x C channels (default 2^16 x 128 x 3). For VolumeRender and DistortionLoss, forward and
forward+backward, it times:
  op        the package's fused kernels (one op per direction), called from a tf.function,
  tf        volume_render_tf / distortion_loss_tf (cumsum + exp) as a plain tf.function,
  tf+xla    the same with tf.function(jit_compile=True),
all in one process, and prints the median of --repeats runs (after warm-up) and the ratios baseline / op.
Other processes may share the machine: medians, not means.

    python bench/render_ops.py [--rays 65536] [--samples 128] [--channels 3] [--repeats 9] [--json OUT]
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_metal_ops as tfmo  # noqa: E402
from bench_util import median_ms  # noqa: E402






def make_inputs(R, S, C, seed=0):
    rng = np.random.default_rng(seed)
    d = tf.constant(rng.uniform(0, 2.0, (R, S)).astype(np.float32))
    c = tf.constant(rng.uniform(0, 1, (R, S, C)).astype(np.float32))
    t = tf.constant((2.0 + np.cumsum(rng.uniform(0.0, 8.0 / S, (R, S + 1)), axis=1)).astype(np.float32))
    bg = tf.constant(rng.uniform(size=C).astype(np.float32))
    return d, c, t, bg


def vr_functions(render):
    def fwd(d, c, t, bg):
        out = render(d, c, t, bg)
        # reduce to scalars so the timing does not include copying [R, S] results to NumPy
        return tf.reduce_sum(out.color) + tf.reduce_sum(out.depth) + tf.reduce_sum(out.weights)

    def fwd_bwd(d, c, t, bg):
        with tf.GradientTape() as tape:
            tape.watch([d, c, t, bg])
            out = render(d, c, t, bg)
            loss = tf.reduce_sum(out.color) + 0.1 * tf.reduce_sum(out.depth) + tf.reduce_sum(out.weights)
        grads = tape.gradient(loss, [d, c, t, bg])
        return [loss] + [tf.reduce_sum(g) for g in grads]

    return fwd, fwd_bwd


def dl_functions(loss_fn):
    def fwd(w, t):
        return tf.reduce_sum(loss_fn(w, t))

    def fwd_bwd(w, t):
        with tf.GradientTape() as tape:
            tape.watch([w, t])
            loss = tf.reduce_sum(loss_fn(w, t))
        gw, gt = tape.gradient(loss, [w, t])
        return loss, tf.reduce_sum(gw), tf.reduce_sum(gt)

    return fwd, fwd_bwd


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rays", type=int, default=1 << 16)
    p.add_argument("--samples", type=int, default=128)
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--json", help="also write the medians (ms) to this file (bench/run_all.py collects them)")
    args = p.parse_args()
    R, S, C = args.rays, args.samples, args.channels
    print(f"TensorFlow {tf.__version__}, tf_metal_ops {tfmo.__version__}, op threads {tfmo.get_num_threads()}, "
          f"R={R} S={S} C={C}, median (min) of {args.repeats} runs in ms")
    d, c, t, bg = make_inputs(R, S, C)
    w = tf.constant(np.random.default_rng(1).uniform(0, 1.0 / S, (R, S)).astype(np.float32))

    cases = {
        "volume_render": (vr_functions, tfmo.volume_render, tfmo.volume_render_tf, (d, c, t, bg)),
        "distortion_loss": (dl_functions, tfmo.distortion_loss, tfmo.distortion_loss_tf, (w, t)),
    }
    rows = []
    for name, (make, op, ref, inputs) in cases.items():
        for mode_idx, mode in enumerate(("fwd", "fwd+bwd")):
            impls = {
                "op": tf.function(make(op)[mode_idx]),
                "tf": tf.function(make(ref)[mode_idx]),
                "tf+xla": tf.function(make(ref)[mode_idx], jit_compile=True),
            }
            # the three agree (a benchmark of wrong results is worthless)
            results = {k: [float(v) for v in tf.nest.flatten(f(*inputs))] for k, f in impls.items()}
            for k in ("tf", "tf+xla"):
                np.testing.assert_allclose(results["op"], results[k], rtol=2e-3, atol=1e-2,
                                           err_msg=f"{name} {mode}: op vs {k}")
            times = {k: median_ms(lambda f=f: f(*inputs), args.repeats) for k, f in impls.items()}
            med = {k: v[0] for k, v in times.items()}
            rows.append((name, mode, med))
            print(f"{name:16s} {mode:8s} " + "  ".join(f"{k} {v[0]:8.1f} ({v[1]:6.1f})" for k, v in times.items())
                  + f"   tf/op {med['tf'] / med['op']:5.2f}x  xla/op {med['tf+xla'] / med['op']:5.2f}x", flush=True)
    vr = [m for n, mode, m in rows if n == "volume_render" and mode == "fwd+bwd"][0]
    print(f"VolumeRender fwd+bwd targets: >= 5x plain graph: {vr['tf'] / vr['op']:.2f}x "
          f"({'met' if vr['tf'] >= 5 * vr['op'] else 'NOT met'}); faster than XLA: {vr['tf+xla'] / vr['op']:.2f}x "
          f"({'met' if vr['tf+xla'] > vr['op'] else 'NOT met'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {"rays": R, "samples": S, "channels": C, "repeats": args.repeats},
                       "rows": [{"op": n, "mode": mode, "median_ms": m} for n, mode, m in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
