"""Benchmark of the packed (ragged) rendering ops against the same math in plain TensorFlow.

About N = 2^18 samples on R rays with a ragged distribution (samples per ray uniform in 4..64, like an occupancy-grid
march), C channels (default 3). For VolumeRenderPacked and DistortionLossPacked, forward and forward+backward:
  op        the package's fused kernels (one op per direction), called from a tf.function,
  tf        volume_render_packed_tf / distortion_loss_packed_tf (segment ops: searchsorted ray ids, a float64
            cumsum for per-ray exclusive sums, unsorted_segment_sum) as a plain tf.function,
  tf+xla    the same with tf.function(jit_compile=True), or "does not compile" with XLA's reason,
all in one process; prints the CPU model, the median (min) of --repeats runs after warm-up, and baseline / op.

--nerf instead measures the shape of the NeRF training step (examples/nerf at 2^18 samples): --nerf-rays rays
(35,000) with --nerf-samples samples (265,000) in total, 1..30 per ray, most rays short (a truncated geometric
distribution), C = 3, against the dense volume_render on 4096 x 64 rays x samples (about the same sample count) in
the same process: medians of forward and forward+backward per sample, and packed / dense per sample.

    python bench/render_packed.py [--samples 262144] [--min-per-ray 4] [--max-per-ray 64] [--channels 3]
                                  [--repeats 9] [--json OUT]
    python bench/render_packed.py --nerf [--nerf-rays 35000] [--nerf-samples 265000] [--repeats 15]
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_metal_ops as tfmo  # noqa: E402
from bench_util import cpu_model, median_ms  # noqa: E402








def uniform_counts(rng, n_target, lo, hi):
    """Rays with lo..hi samples each (uniform) until about n_target samples."""
    counts = rng.integers(lo, hi + 1, n_target // max(1, (lo + hi) // 2) + 1)
    return counts[: np.searchsorted(np.cumsum(counts), n_target) + 1]


def nerf_counts(rng, R, N, lo=1, hi=30):
    """R rays with exactly N samples, lo..hi each, P(k) ~ q^k (most rays short, like an occupancy-grid march)."""
    k = np.arange(lo, hi + 1)
    qa, qb = 1e-6, 1.0
    for _ in range(60):  # bisection: the mean of the truncated geometric distribution grows with q
        q = 0.5 * (qa + qb)
        p = q ** (k - lo)
        qa, qb = (q, qb) if (p * k).sum() / p.sum() < N / R else (qa, q)
    counts = rng.choice(k, R, p=p / p.sum())
    while counts.sum() != N:  # move single samples until the total is exact, within lo..hi
        i = rng.integers(0, R, 1024)
        step = 1 if counts.sum() < N else -1
        i = i[(counts[i] + step >= lo) & (counts[i] + step <= hi)][: abs(int(counts.sum()) - N)]
        np.add.at(counts, i, step)
    return counts


def make_inputs(counts, hi, C, rng):
    """Rays with the given sample counts; contiguous or gapped intervals."""
    N, R = int(counts.sum()), len(counts)
    rs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    ray = np.repeat(np.arange(R), counts)
    length = rng.uniform(0.005, 0.05, N)
    gap = rng.uniform(0.0, 0.2, N) * (rng.uniform(size=N) < 0.2)  # skipped empty space
    edges = np.cumsum(np.stack([gap, length], 1).reshape(-1))  # start_k = edges[2k], end_k = edges[2k+1]
    base = np.concatenate([[0.0], edges])[2 * rs[:-1]][ray]  # the edge before each ray's first sample
    # monotone roundings only (x - base, + 2, float32), so t_start[k+1] >= t_end[k] survives them
    t_start = 2.0 + (edges[0::2] - base)
    t_end = 2.0 + (edges[1::2] - base)
    d = rng.gamma(1.0, 3.0, N)
    c = rng.uniform(0.0, 1.0, (N, C))
    bg = rng.uniform(size=C)
    w = rng.uniform(0.0, 1.0 / hi, N)
    f32 = lambda x: tf.constant(np.asarray(x, np.float32))  # noqa: E731
    return (f32(d), f32(c), f32(t_start), f32(t_end), tf.constant(rs), f32(bg)), (f32(w), f32(t_start), f32(t_end),
                                                                                 tf.constant(rs)), R, N


def vr_functions(render):
    def fwd(d, c, ts, te, rs, bg):
        out = render(d, c, ts, te, rs, bg)
        return tf.reduce_sum(out.color) + tf.reduce_sum(out.depth) + tf.reduce_sum(out.weights)

    def fwd_bwd(d, c, ts, te, rs, bg):
        with tf.GradientTape() as tape:
            tape.watch([d, c, ts, te, bg])
            out = render(d, c, ts, te, rs, bg)
            loss = tf.reduce_sum(out.color) + 0.1 * tf.reduce_sum(out.depth) + tf.reduce_sum(out.weights)
        grads = tape.gradient(loss, [d, c, ts, te, bg])
        return [loss] + [tf.reduce_sum(g) for g in grads]

    return fwd, fwd_bwd


def dl_functions(loss_fn):
    def fwd(w, ts, te, rs):
        return tf.reduce_sum(loss_fn(w, ts, te, rs))

    def fwd_bwd(w, ts, te, rs):
        with tf.GradientTape() as tape:
            tape.watch([w, ts, te])
            loss = tf.reduce_sum(loss_fn(w, ts, te, rs))
        grads = tape.gradient(loss, [w, ts, te])
        return [loss] + [tf.reduce_sum(g) for g in grads]

    return fwd, fwd_bwd


def dense_inputs(R, S, C, seed=0):
    rng = np.random.default_rng(seed)
    t = 2.0 + np.cumsum(rng.uniform(0.005, 0.05, (R, S + 1)), axis=1)
    f32 = lambda x: tf.constant(np.asarray(x, np.float32))  # noqa: E731
    return (f32(rng.gamma(1.0, 3.0, (R, S))), f32(rng.uniform(0.0, 1.0, (R, S, C))), f32(t),
            f32(rng.uniform(size=C)))


def dense_vr_functions():
    def fwd(d, c, t, bg):
        out = tfmo.volume_render(d, c, t, bg)
        return tf.reduce_sum(out.color) + tf.reduce_sum(out.depth) + tf.reduce_sum(out.weights)

    def fwd_bwd(d, c, t, bg):
        with tf.GradientTape() as tape:
            tape.watch([d, c, t, bg])
            out = tfmo.volume_render(d, c, t, bg)
            loss = tf.reduce_sum(out.color) + 0.1 * tf.reduce_sum(out.depth) + tf.reduce_sum(out.weights)
        grads = tape.gradient(loss, [d, c, t, bg])
        return [loss] + [tf.reduce_sum(g) for g in grads]

    return fwd, fwd_bwd


def run_nerf(args):
    """The NeRF-step shape: packed vs dense volume rendering per sample (see the module docstring)."""
    rng = np.random.default_rng(1)
    counts = nerf_counts(rng, args.nerf_rays, args.nerf_samples)
    vr_in, dl_in, R, N = make_inputs(counts, 30, 3, rng)
    dense_R, dense_S = 4096, 64
    dense_in = dense_inputs(dense_R, dense_S, 3)
    print(f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs)")
    print(f"TensorFlow {tf.__version__}, tf_metal_ops {tfmo.__version__}, op threads {tfmo.get_num_threads()}, "
          f"volume-render CPU build {tfmo.diagnostics.volume_render_cpu_paths()['selected']}")
    print(f"packed: N={N} samples on R={R} rays (1..30 per ray, mean {N / R:.2f}, median {np.median(counts):.0f}), "
          f"C=3; dense: {dense_R} x {dense_S} = {dense_R * dense_S} samples; median (min) of {args.repeats} runs")
    rows = []
    for mode_idx, mode in enumerate(("fwd", "fwd+bwd")):
        packed = tf.function(vr_functions(tfmo.volume_render_packed)[mode_idx])
        dense = tf.function(dense_vr_functions()[mode_idx])
        dl = tf.function(dl_functions(tfmo.distortion_loss_packed)[mode_idx])
        t = {"packed": median_ms(lambda: packed(*vr_in), args.repeats),
             "dense": median_ms(lambda: dense(*dense_in), args.repeats),
             "distortion_packed": median_ms(lambda: dl(*dl_in), args.repeats)}
        per = {"packed": t["packed"][0] * 1e6 / N, "dense": t["dense"][0] * 1e6 / (dense_R * dense_S),
               "distortion_packed": t["distortion_packed"][0] * 1e6 / N}
        rows.append({"mode": mode, "median_ms": {k: v[0] for k, v in t.items()}, "ns_per_sample": per})
        print(f"{mode:8s} volume_render_packed {t['packed'][0]:7.2f} ({t['packed'][1]:6.2f}) ms "
              f"{per['packed']:6.2f} ns/sample | volume_render {t['dense'][0]:7.2f} ({t['dense'][1]:6.2f}) ms "
              f"{per['dense']:6.2f} ns/sample | packed/dense per sample {per['packed'] / per['dense']:5.2f}x | "
              f"distortion_loss_packed {t['distortion_packed'][0]:6.2f} ms", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {"samples": N, "rays": R, "dense": [dense_R, dense_S], "repeats": args.repeats,
                                  "cpu": cpu_model()}, "nerf_rows": rows}, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=1 << 18)
    p.add_argument("--min-per-ray", type=int, default=4)
    p.add_argument("--max-per-ray", type=int, default=64)
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--json", help="also write the medians (ms) to this file (bench/run_all.py collects them)")
    p.add_argument("--nerf", action="store_true", help="the NeRF-step shape against volume_render (see above)")
    p.add_argument("--nerf-rays", type=int, default=35000)
    p.add_argument("--nerf-samples", type=int, default=265000)
    args = p.parse_args()
    if args.nerf:
        return run_nerf(args)
    rng = np.random.default_rng(0)
    counts = uniform_counts(rng, args.samples, args.min_per_ray, args.max_per_ray)
    vr_in, dl_in, R, N = make_inputs(counts, args.max_per_ray, args.channels, rng)
    print(f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs)")
    print(f"TensorFlow {tf.__version__}, tf_metal_ops {tfmo.__version__}, op threads {tfmo.get_num_threads()}, "
          f"N={N} samples on R={R} rays ({args.min_per_ray}..{args.max_per_ray} per ray), C={args.channels}, "
          f"median (min) of {args.repeats} runs in ms")
    cases = {
        "volume_render_packed": (vr_functions, tfmo.volume_render_packed, tfmo.volume_render_packed_tf, vr_in),
        "distortion_loss_packed": (dl_functions, tfmo.distortion_loss_packed, tfmo.distortion_loss_packed_tf, dl_in),
    }
    rows = []
    for name, (make, op, ref, inputs) in cases.items():
        for mode_idx, mode in enumerate(("fwd", "fwd+bwd")):
            impls = {"op": tf.function(make(op)[mode_idx]), "tf": tf.function(make(ref)[mode_idx]),
                     "tf+xla": tf.function(make(ref)[mode_idx], jit_compile=True)}
            results, failed = {}, {}
            for k, f in impls.items():
                try:
                    results[k] = [float(v) for v in tf.nest.flatten(f(*inputs))]
                except (tf.errors.OpError, ValueError, TypeError) as e:  # XLA cannot compile it
                    failed[k] = str(e).strip().splitlines()[0][:160]
            for k in results:  # the implementations agree (a benchmark of wrong results is worthless)
                np.testing.assert_allclose(results["op"], results[k], rtol=2e-3, atol=1e-2,
                                           err_msg=f"{name} {mode}: op vs {k}")
            times = {k: median_ms(lambda f=impls[k]: f(*inputs), args.repeats) for k in results}
            med = {k: v[0] for k, v in times.items()}
            rows.append({"op": name, "mode": mode, "median_ms": med, "not_compiled": failed})
            line = f"{name:23s} {mode:8s} " + "  ".join(f"{k} {v[0]:8.2f} ({v[1]:7.2f})" for k, v in times.items())
            line += "".join(f"   {k}/op {med[k] / med['op']:5.2f}x" for k in med if k != "op")
            line += "".join(f"   {k}: does not compile ({msg})" for k, msg in failed.items())
            print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {"samples": N, "rays": R, "min_per_ray": args.min_per_ray,
                                  "max_per_ray": args.max_per_ray, "channels": args.channels,
                                  "repeats": args.repeats, "cpu": cpu_model()}, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
