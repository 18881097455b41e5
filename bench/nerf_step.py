"""Breakdown of one NeRF training step (examples/nerf, hash model with the ops) at an equal sample budget, for the
uniform sampler (4096 rays x 64 samples = 2^18) and the occupancy sampler (as many rays as give 2^18 samples).

Every piece is timed alone in its own tf.function on inputs computed beforehand (forward + backward where training
differentiates it), then the whole train step of examples/nerf/trainer.py (Trainer._step_fn) on the same batch size:
  sampling   uniform: stratified t, positions; occupancy: ray_march (with the sample positions) + the gather of
             the view-direction SH per sample (both take the SH of the batch's rays from the trainer's table)
  encoding   hash-grid encoding forward + backward (gradient w.r.t. the table) on the N sample positions
  mlps       density + colour MLPs forward + backward (weights and the encoding's output)
  rendering  volume_render / volume_render_packed forward + backward
  optimiser  the two Adam updates (MLPs, table) with given gradients
  grid       occupancy sampler: one grid update / 16 (its share of a step, updated every 16 steps)
  step       the whole training step (pieces overlap and fuse, so the sum differs); the two samplers' steps are
             timed in alternating blocks of consecutive steps, on batches of equal sample counts (the occupancy
             batch: the ray count whose samples come closest to the budget, with the step's own jitter seed)
Medians of --repeats runs after warm-up, in one process (ratios between the samplers are what to read; the machine
may be shared: the load average is printed).

The occupancy numbers need a converged grid: --run DIR takes the weights and grid of a train.py output folder
(DIR/model, trained with the occupancy sampler), e.g. after `python examples/nerf/train.py --quick --out DIR`.

    python bench/nerf_step.py --run runs/quick [--repeats 7] [--json OUT]
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "nerf"))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from bench_util import cpu_model, median_ms  # noqa: E402
from nerf import fused_adam, models  # noqa: E402


def make_trainer(train, run_dir, sampler, budget, extra=()):
    from nerf.data import load_dataset

    with open(os.path.join(run_dir, "metrics.json")) as f:
        cfg = json.load(f)["config"]
    argv = ["--sampler", sampler, "--sample-budget", str(budget), "--steps", "1", "--out", os.path.join(run_dir, "bench"),
            "--grid-res", str(cfg["grid_res"]), "--log2-table", str(cfg["log2_table"]), *extra]
    if cfg.get("step_size") is not None:
        argv += ["--step-size", str(cfg["step_size"])]
    args = train.parse_args(argv)
    ds = load_dataset("builtin", background=args.background_rgb, seed=cfg["scene_seed"], H=cfg["scene_res"],
                      W=cfg["scene_res"])
    tr = train.Trainer(args, ds)
    from nerf import models

    trained = models.load_model(os.path.join(run_dir, "model"))
    tr.model.set_weights(trained.get_weights())
    if tr.model.grid is not None:
        for a, b in ((tr.model.grid.density, trained.grid.density), (tr.model.grid.bits, trained.grid.bits),
                     (tr.model.grid.step, trained.grid.step)):
            a.assign(b)
    return tr, ds


def step_seed(tr, step_no=1):
    """The sample-jitter seed of the train step ``step_no`` (replica 0), as nerf.trainer.Trainer's step computes it."""
    return tf.constant([tr.args.seed, step_no * 4096], tf.int64)


def breakdown(tr, rays, repeats):
    """ms per piece for a batch of ray indices ``rays``; returns (dict, samples)."""
    import tf_metal_ops

    model = tr.model
    o, d, _, _, _ = tr.batch(tf.constant(tr.ray_rows(np.asarray(rays, np.int64))))
    view_sh = models.sh_encoding_deg4(d)
    seed = step_seed(tr)  # every piece and the whole step see the same samples
    occ = model.cfg["sampler"] == "occupancy"
    bg = tf.constant(model.cfg["background"])

    if occ:
        @tf.function
        def sampling(o, d):
            m = model.march(o, d, True, seed)
            x = model._sample_coords(o, d, m)
            if model.cfg["early_stop"] > 0 or model.cfg.get("alpha_threshold", 0.0) > 0:
                m, x = model._prune(m, x)
            return x, tf.gather(view_sh, m.ray_indices), m
    else:
        @tf.function
        def sampling(o, d):
            t, edges, x, inside, sh = model._pre(o, d, True, seed, view_sh)
            return x, sh, (t, edges, inside)

    x, sh, extra = sampling(o, d)
    n = int(x.shape[0])
    table = model.encoding.table
    feat = model.encoding(x)
    g_feat = tf.random.normal(feat.shape, seed=1)

    @tf.function
    def encoding(x):
        with tf.GradientTape() as tape:
            f = model.encoding(x)
        return tape.gradient(f, table, output_gradients=g_feat)

    mlp_vars = tr.mlp_vars

    if occ:
        def field(feat):
            return model._field(feat, sh)
    else:
        def field(feat):
            return model._post(feat, extra[2], sh)

    sigma, rgb = field(feat)
    g_sigma, g_rgb = tf.random.normal(sigma.shape, seed=2), tf.random.normal(rgb.shape, seed=3)

    @tf.function
    def mlps(feat):
        with tf.GradientTape() as tape:
            tape.watch(feat)
            s, c = field(feat)
        return tape.gradient([s, c], mlp_vars + [feat], output_gradients=[g_sigma, g_rgb])

    if occ:
        m = extra

        def render(s, c):
            return tf_metal_ops.volume_render_packed(s, c, m.t_starts, m.t_ends, m.row_splits, background=bg).color
    else:
        def render(s, c):
            return tf_metal_ops.volume_render(s, c, extra[1], background=bg).color

    g_color = tf.random.normal([len(rays), 3], seed=4)

    @tf.function
    def rendering(s, c):
        with tf.GradientTape() as tape:
            tape.watch([s, c])
            col = render(s, c)
        return tape.gradient(col, [s, c], output_gradients=g_color)

    shadow_mlp = [tf.Variable(v) for v in mlp_vars]
    shadow_table = [tf.Variable(v) for v in tr.table_vars]
    opt, opt_t = keras.optimizers.Adam(1e-2, beta_2=0.99, epsilon=1e-15), keras.optimizers.Adam(3e-2, beta_2=0.99,
                                                                                                   epsilon=1e-15)
    opt.build(shadow_mlp)
    opt_t.build(shadow_table)
    grads_mlp = [tf.random.normal(v.shape, stddev=1e-3) for v in shadow_mlp]
    grads_t = [tf.random.normal(v.shape, stddev=1e-3) for v in shadow_table]

    @tf.function
    def optimiser():  # as the trainer's step: one fused Adam kernel per variable
        fused_adam.apply(opt, grads_mlp, shadow_mlp)
        fused_adam.apply(opt_t, grads_t, shadow_table)
        return tf.constant(0)

    ms = dict(sampling=median_ms(lambda: sampling(o, d)[0], repeats)[0],
              encoding=median_ms(lambda: encoding(x), repeats)[0],
              mlps=median_ms(lambda: mlps(feat), repeats)[0],
              rendering=median_ms(lambda: rendering(sigma, rgb), repeats)[0],
              optimiser=median_ms(optimiser, repeats)[0])
    if occ:
        step_no = tf.constant(10 ** 6, tf.int64)  # after warm-up: G^3/4 random + G^3/4 occupied cells
        ms["grid"] = median_ms(lambda: tr._grid_fn(step_no), max(3, repeats // 2))[0] / tr.args.grid_every
    idx = tf.constant(tr.ray_rows(np.asarray(rays, np.int64)))
    ctrl = tf.constant([0.0])

    n_rays = tf.constant(float(len(rays)), tf.float32)

    def whole():
        return tr._step_fn(idx, tf.constant(1, tf.int64), ctrl, n_rays)

    return ms, n, whole


def interleaved_ms(fns, repeats, block=5):
    """Median ms of each of ``fns`` (name -> fn), timed in alternating blocks (``block`` calls of A, ``block`` of B,
    ...) so that a change in the machine's load during the run weighs on all of them alike. A training loop runs
    one model's steps back to back: each block starts with an untimed call, which pays for the caches the other
    function's call left (strict ABAB alternation made both steps ~10 % slower at 2^15 samples)."""
    import time

    def run(fn):
        t0 = time.perf_counter()
        for v in tf.nest.flatten(fn()):
            v.numpy()
        return (time.perf_counter() - t0) * 1e3

    times = {k: [] for k in fns}
    for _ in range(max(3, -(-repeats // block))):
        for k, fn in fns.items():
            run(fn)
            times[k] += [run(fn) for _ in range(block)]
    return {k: float(np.median(v)) for k, v in times.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="a train.py output folder trained with the occupancy sampler")
    p.add_argument("--budget", type=int, default=2 ** 18, help="samples per step")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--early-stop", type=float, default=None, help="override the run's --early-stop")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import train
    from nerf.trainer import RAY_GRANULARITY

    load = os.getloadavg()
    print(f"# NeRF train-step breakdown; CPU: {cpu_model()}, {os.cpu_count()} logical cores, TF {tf.__version__}; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    with open(os.path.join(args.run, "metrics.json")) as f:
        early = json.load(f)["config"].get("early_stop", 0.0) if args.early_stop is None else args.early_stop
    results = {}
    rng = np.random.default_rng(0)
    tr_u, _ = make_trainer(train, args.run, "uniform", args.budget)
    rays_u = rng.permutation(tr_u.n_rays)[:args.budget // tr_u.args.samples]
    results["uniform"], n_u, whole_u = breakdown(tr_u, rays_u, args.repeats)
    results["uniform"].update(rays=len(rays_u), samples=n_u, samples_per_ray=n_u / len(rays_u))
    tr_o, _ = make_trainer(train, args.run, "occupancy", args.budget, ["--early-stop", str(early)])
    # rays for the budget: the prefix of a permutation whose samples (with the step's jitter seed) come closest to
    # it. A ray's samples depend only on the ray and its index, so one march of a long prefix gives every count.
    perm = rng.permutation(tr_o.n_rays)[:min(tr_o.n_rays, args.budget)]
    o, d = tr_o.batch(tf.constant(tr_o.ray_rows(perm)))[:2]
    m = tr_o.model.march(o, d, True, step_seed(tr_o))
    if early > 0:
        m, _ = tr_o.model._prune(m, tr_o.model._sample_coords(o, d, m))
    n_of = m.row_splits.numpy()  # samples of the first r rays: n_of[r]
    cand = np.arange(RAY_GRANULARITY, len(perm) + 1, RAY_GRANULARITY)
    r = int(cand[np.argmin(np.abs(n_of[cand] - args.budget))])
    rays_o = perm[:r]
    results["occupancy"], n_o, whole_o = breakdown(tr_o, rays_o, args.repeats)
    steps = interleaved_ms(dict(uniform=whole_u, occupancy=whole_o), args.repeats)
    for k in steps:
        results[k]["step"] = steps[k]
    results["occupancy"]["step + grid share"] = steps["occupancy"] + results["occupancy"]["grid"]
    results["occupancy"].update(rays=len(rays_o), samples=n_o, samples_per_ray=n_o / len(rays_o),
                                occupied_fraction=float(tr_o.model.grid.occupied_fraction()), early_stop=early)
    keys = ["sampling", "encoding", "mlps", "rendering", "optimiser", "grid", "step", "step + grid share"]
    print(f"| piece (ms) | uniform ({results['uniform']['rays']} rays x {results['uniform']['samples_per_ray']:.0f}) | "
          f"occupancy ({results['occupancy']['rays']} rays, {results['occupancy']['samples']} samples, "
          f"{results['occupancy']['samples_per_ray']:.1f}/ray) |")
    print("|---|---|---|")
    for k in keys:
        u, o = results["uniform"].get(k), results["occupancy"].get(k)
        print(f"| {k} | {'-' if u is None else f'{u:.1f}'} | {'-' if o is None else f'{o:.1f}'} |")
    ratio = results["occupancy"]["step + grid share"] / results["uniform"]["step"]
    print(f"occupancy step (with its grid share) / uniform step at {args.budget} samples: {ratio:.2f}; "
          f"occupied cells {100 * results['occupancy']['occupied_fraction']:.1f} %")
    load = os.getloadavg()
    print(f"# load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(cpu=cpu_model(), load=load, budget=args.budget, results=results), f, indent=1)
    return results


if __name__ == "__main__":
    main()
