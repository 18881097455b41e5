"""Benchmark of ray_march (the RayMarch op) against the same march in plain TensorFlow.

R rays (default 2^14 and 2^16) from a sphere of radius 2.5 around the box [-1, 1]^3, aimed at random points of the
box, through a G^3 occupancy grid (default 128^3) with a sphere shell (radius 0.5 to 0.6) occupied, as a converged
NeRF grid around a surface looks. It times, all in one process:
  op        tfmo.ray_march in a tf.function (count, prefix sum, fill on the CPU kernels' threads),
  tf        tfmo.ray_march_tf in a tf.function (a tf.while_loop over all rays at once, then packing),
  tf+xla    the while loop of ray_march_tf under tf.function(jit_compile=True), packing in a plain tf.function
            (boolean_mask has no static shape, so XLA cannot compile it),
and prints the median (min) of --repeats runs after warm-up and the ratios baseline / op. The three must agree on
the samples (checked before timing). Other processes may share the machine: medians, not means.

    python bench/ray_march.py [--rays 16384 65536] [--resolution 128] [--step-size 0.0068] [--repeats 7] [--json OUT]
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_metal_ops as tfmo  # noqa: E402
from tf_metal_ops import occupancy  # noqa: E402
from bench_util import cpu_model, median_ms, rays_toward  # noqa: E402








def shell_grid(G, r_in=0.5, r_out=0.6):
    grid = tfmo.OccupancyGrid(resolution=G, warmup_steps=0)
    idx = np.arange(G**3)
    ijk = np.stack([idx % G, (idx // G) % G, idx // (G * G)], axis=1)
    rad = np.linalg.norm(-1.0 + (ijk + 0.5) * 2.0 / G, axis=1)
    grid.bits.assign(occupancy.pack_bits((rad >= r_in) & (rad <= r_out)))
    return grid


def make_rays(R, seed=0):
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(R, 3))
    o = 2.5 * v / np.linalg.norm(v, axis=1, keepdims=True)
    target = rng.uniform(-0.7, 0.7, (R, 3))
    return rays_toward(o, target)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rays", type=int, nargs="+", default=[1 << 14, 1 << 16])
    p.add_argument("--resolution", type=int, default=128)
    p.add_argument("--step-size", type=float, default=0.0068)  # ~ 2 sqrt(3) / 512: 512 steps across the diagonal
    p.add_argument("--max-samples", type=int, default=256)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", help="also write the medians (ms) to this file (bench/run_all.py collects them)")
    args = p.parse_args()
    G = args.resolution
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores); TensorFlow {tf.__version__}, tf_metal_ops {tfmo.__version__}, "
          f"op threads {tfmo.get_num_threads()}")
    print(f"grid {G}^3 with a sphere shell 0.5..0.6 occupied, step {args.step_size}, max_samples {args.max_samples}, "
          f"jitter on; median (min) of {args.repeats} runs in ms", flush=True)
    grid = shell_grid(G)
    kw = dict(step_size=args.step_size, max_samples=args.max_samples, jitter=True)

    @tf.function
    def op(o, d, seed):
        return tfmo.ray_march(o, d, grid, seed=seed, **kw)

    @tf.function
    def plain(o, d, seed):
        return tfmo.ray_march_tf(o, d, grid, seed=seed, **kw)

    @tf.function(jit_compile=True)
    def dense_xla(o, d, seed):
        r = tf.shape(o)[0]
        return occupancy.ray_march_dense_tf(o, d, tf.zeros([r]), tf.fill([r], np.inf), grid.bits, grid.aabb, G,
                                            seed=seed, **kw)

    @tf.function
    def xla(o, d, seed):
        return occupancy.pack_dense_samples(*dense_xla(o, d, seed), o, d, grid.aabb)

    rows = []
    for R in args.rays:
        o, d = make_rays(R)
        seed = tf.constant(7, tf.int64)
        impls = {"op": op, "tf": plain, "tf+xla": xla}
        results = {k: f(o, d, seed) for k, f in impls.items()}
        ref = results["op"]
        n = int(ref.row_splits[-1])
        np.testing.assert_array_equal(results["tf"].row_splits.numpy(), ref.row_splits.numpy())
        np.testing.assert_allclose(results["tf"].t_starts.numpy(), ref.t_starts.numpy(), atol=1e-5)
        xn = results["tf+xla"].row_splits.numpy()
        # XLA may contract or reorder float32 expressions: allow a few decisions to flip
        assert np.mean(xn != ref.row_splits.numpy()) < 0.01 and abs(int(xn[-1]) - n) <= max(10, n // 1000), (xn[-1], n)
        times = {k: median_ms(lambda f=f: f(o, d, seed), args.repeats) for k, f in impls.items()}
        med = {k: v[0] for k, v in times.items()}
        rows.append({"rays": R, "samples": n, "median_ms": med})
        print(f"R={R:6d} N={n:8d} ({n / R:5.1f}/ray)  " + "  ".join(f"{k} {v[0]:8.1f} ({v[1]:7.1f})" for k, v in times.items())
              + f"   tf/op {med['tf'] / med['op']:6.1f}x  xla/op {med['tf+xla'] / med['op']:6.1f}x", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {"resolution": G, "step_size": args.step_size, "max_samples": args.max_samples,
                                  "repeats": args.repeats, "cpu": cpu_model()}, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
