"""Benchmark of ray_march through cascaded occupancy grids (unbounded scenes) on the CPU.

An analytic unbounded scene: a ball of radius 0.5 at the centre of the unit box [-1, 1]^3, a ground plane at y = -1
out to the horizon and a wall of "distant surroundings" (a spherical shell of radius 12 to 13). Cameras stand on a
ring of radius 2 (inside cascade 1) looking at random points within the box and its surroundings, as in a
360-degree capture. For K = 1 .. --max-cascades cascades the grid (G^3 per cascade) is filled from the scene's
density (one OccupancyGrid.update in warm-up, which samples every cell of every cascade, and one after it) and R
rays are marched with a cone angle (steps grow with the distance, capped at one cell of the cascade). Printed per
K: the covered extent, occupied fraction per cascade, samples per ray, the median (min) time of the op on all rays
and of the op and ray_march_tf (both in a tf.function) on the first --tf-rays rays, where the two must agree on the
samples (checked first; ray_march_tf is orders of magnitude slower). Other processes may share the machine:
medians, not means.

    python bench/ray_march_cascades.py [--rays 65536] [--tf-rays 2048] [--resolution 64] [--max-cascades 5]
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_metal_ops as tfmo  # noqa: E402
from bench_util import cpu_model, median_ms, rays_toward  # noqa: E402


def scene_density(x):
    r = tf.norm(x, axis=-1)
    ball = r < 0.5
    ground = tf.abs(x[:, 1] + 1.0) < 0.05
    far = (r > 12.0) & (r < 13.0)
    return 50.0 * tf.cast(ball | ground | far, tf.float32)


def make_rays(R, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.uniform(0, 2 * np.pi, R)
    o = np.stack([2.0 * np.cos(a), rng.uniform(-0.5, 0.5, R), 2.0 * np.sin(a)], axis=1)
    target = rng.uniform(-3.0, 3.0, (R, 3))
    return rays_toward(o, target)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rays", type=int, default=1 << 16)
    p.add_argument("--tf-rays", type=int, default=1 << 11)
    p.add_argument("--resolution", type=int, default=64)
    p.add_argument("--max-cascades", type=int, default=5)
    p.add_argument("--step-size", type=float, default=2 * np.sqrt(3) / 512)
    p.add_argument("--cone-angle", type=float, default=1 / 256)
    p.add_argument("--max-samples", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    G = args.resolution
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores); TensorFlow {tf.__version__}, tf_metal_ops {tfmo.__version__}, "
          f"op threads {tfmo.get_num_threads()}")
    print(f"{args.rays} rays ({args.tf_rays} for ray_march_tf), grid {G}^3 per cascade, step {args.step_size:.4f}, "
          f"cone {args.cone_angle:.4f}, "
          f"max_samples {args.max_samples}; median (min) of {args.repeats} runs in ms", flush=True)
    o, d = make_rays(args.rays)
    kw = dict(step_size=args.step_size, cone_angle=args.cone_angle, max_samples=args.max_samples, jitter=True)
    for K in range(1, args.max_cascades + 1):
        grid = tfmo.OccupancyGrid(resolution=G, cascades=K, warmup_steps=1)
        grid.update(scene_density, seed=0)  # warm-up: every cell of every cascade sampled once (bits all ones)
        grid.update(scene_density, seed=1)  # after warm-up: bits from the decayed densities (+ a random subset)
        frac = grid.occupied_fraction(per_cascade=True).numpy()

        @tf.function
        def op(o, d, seed, grid=grid):
            return tfmo.ray_march(o, d, grid, seed=seed, **kw)

        @tf.function
        def plain(o, d, seed, grid=grid):
            return tfmo.ray_march_tf(o, d, grid, seed=seed, **kw)

        seed = tf.constant(7, tf.int64)
        os_, ds = o[:args.tf_rays], d[:args.tf_rays]
        a, b = op(os_, ds, seed), plain(os_, ds, seed)
        np.testing.assert_array_equal(a.row_splits.numpy(), b.row_splits.numpy())
        np.testing.assert_allclose(a.t_starts.numpy(), b.t_starts.numpy(), atol=1e-4)
        n = int(op(o, d, seed).row_splits[-1])
        t_op = median_ms(lambda: op(o, d, seed), args.repeats)
        t_small = median_ms(lambda: op(os_, ds, seed), args.repeats)
        t_tf = median_ms(lambda: plain(os_, ds, seed), max(1, args.repeats // 2))
        print(f"K={K} extent {2 * 2 ** (K - 1):4d}  occupied/cascade {np.round(100 * frac, 1)} %  "
              f"{n / args.rays:6.1f} samples/ray  op {t_op[0]:8.1f} ({t_op[1]:7.1f})  on {args.tf_rays} rays: op "
              f"{t_small[0]:6.1f}  tf {t_tf[0]:8.1f}  tf/op {t_tf[0] / t_small[0]:6.1f}x", flush=True)


if __name__ == "__main__":
    main()
