#!/usr/bin/env python
"""Train a NeRF on the built-in scene (or real data) with tf-metal-ops.

    python examples/nerf/train.py --quick                       # hash-grid model, ~3 minutes on 2 CPU cores
    python examples/nerf/train.py --model mlp --minutes 10      # the keras.io-style baseline
    python examples/nerf/train.py --data lego/ --downscale 8    # a NeRF-synthetic folder (or a tiny_nerf .npz)

Writes ``OUT/metrics.json`` (per evaluation: step, epoch, training and wall-clock seconds, train loss and PSNR, test
PSNR), ``OUT/renders/*.png`` (ground truth | prediction), ``OUT/psnr.png`` (test PSNR vs training time) and
``OUT/model/`` (config + weights; reloaded at the end to render a novel view, ``renders/novel_view.png``).

Budgets (``--minutes``) count training time only (evaluations are excluded), so models with different evaluation
costs get the same training time. An epoch is one pass over all training rays.

The hash model samples rays with an occupancy grid by default (``--sampler occupancy``: ``tf_metal_ops.ray_march``
through the occupied cells, ``volume_render_packed``); each step then takes as many rays as fill ``--sample-budget``
samples, adapted from the samples per ray the previous step measured (Instant-NGP's scheme). ``--sampler uniform``
is the fixed ``--samples`` per ray × ``--batch-rays`` rays of the MLP model.

``--strategy multiworker`` trains under ``tf.distribute.MultiWorkerMirroredStrategy`` with the cluster read from
``TF_CONFIG`` (``launch_local.py`` starts N such workers on this machine); ``--checkpoint-every`` saves
``OUT/checkpoints`` periodically and a re-run with the same ``--out`` resumes from the latest checkpoint.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # examples/ → `import nerf`

import numpy as np  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", default="builtin", help="'builtin', a tiny-NeRF .npz file or a Blender-layout folder")
    p.add_argument("--model", choices=("hash", "mlp"), default="hash")
    p.add_argument("--impl", choices=("op", "pure_tf"), default="op",
                   help="hash model: tf_metal_ops kernels, or pure TF (hash grid + compositing) in an XLA train step")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--minutes", type=float, help="training-time budget")
    budget.add_argument("--epochs", type=float, help="passes over all training rays")
    budget.add_argument("--steps", type=int, help="number of training steps")
    p.add_argument("--quick", action="store_true", help="2.5 minutes of training, small evaluations (~3 min total)")
    p.add_argument("--out", default=None, help="output folder (default runs/<model>-<time>)")
    p.add_argument("--strategy", choices=("default", "mirrored", "multiworker"), default="default",
                   help="multiworker: MultiWorkerMirroredStrategy over the cluster in TF_CONFIG (see launch_local.py)")
    p.add_argument("--replicas", type=int, default=2, help="logical CPU devices for --strategy mirrored without GPUs")
    p.add_argument("--checkpoint-every", default=None, metavar="N|Ns",
                   help="checkpoint to OUT/checkpoints every N steps (e.g. 200) or N seconds of training (e.g. 60s); "
                        "a re-run with the same --out resumes from the latest one (default: 60s with --strategy "
                        "multiworker, none otherwise; 0 disables)")
    p.add_argument("--keep-checkpoints", type=int, default=2, help="checkpoints kept in OUT/checkpoints")
    p.add_argument("--save-worker-weights", action="store_true",
                   help="every worker (chief included) writes its final weights to OUT/workers/rank-<r>.npz "
                        "(to check that the replicas stayed in sync)")
    # model
    p.add_argument("--sampler", choices=("uniform", "occupancy"), default=None,
                   help="uniform: --samples stratified samples per ray; occupancy: march through an occupancy grid "
                        "(hash model only; default for --model hash --impl op, under every strategy)")
    p.add_argument("--samples", type=int, default=None,
                   help="uniform sampler: samples per ray (default: mlp 32, hash 64)")
    p.add_argument("--batch-rays", type=int, default=4096, help="uniform sampler: rays per step")
    p.add_argument("--sample-budget", type=int, default=2 ** 15,
                   help="occupancy sampler: samples per step (rays per step adapt to the measured samples per ray; "
                        "2^15 trained fastest on 2 CPU cores, see the README; 2^18 equals the uniform sampler's "
                        "4096 x 64)")
    p.add_argument("--grid-res", type=int, default=64,
                   help="occupancy sampler: grid cells per axis (64: on 2 CPU cores 128 costs more per step than its "
                        "~7 %% fewer samples save, see the README)")
    p.add_argument("--grid-every", type=int, default=16, help="occupancy sampler: steps between grid updates")
    p.add_argument("--grid-sync", choices=("replicate", "broadcast"), default="replicate",
                   help="occupancy sampler with several workers: every worker updates its grid from the same "
                        "weights with the same seeds (replicate: bitwise equal, no communication), or the chief "
                        "updates it and all-gathers it to the others (broadcast); see docs/distributed.md")
    p.add_argument("--grid-warmup", type=int, default=64,
                   help="occupancy sampler: steps during which every cell counts as occupied (and all cells are "
                        "re-evaluated at each update)")
    p.add_argument("--step-size", type=float, default=None,
                   help="occupancy sampler: marching step (default: the box diagonal / "
                        "nerf.models.STEPS_PER_DIAGONAL)")
    p.add_argument("--max-samples", type=int, default=1024, help="occupancy sampler: samples per ray at most")
    p.add_argument("--early-stop", type=float, default=0.0,
                   help="occupancy sampler: drop the samples behind the point where a ray's transmittance is below "
                        "this (a density-only pass without gradient first; 0: off)")
    p.add_argument("--levels", type=int, default=16)
    p.add_argument("--features", type=int, default=2, help="features per level")
    p.add_argument("--log2-table", type=int, default=17, help="log2 of the hash table size per level")
    p.add_argument("--base-res", type=int, default=16)
    p.add_argument("--finest-res", type=int, default=512)
    p.add_argument("--bound", type=float, default=None, help="hash model: scene box [-b,b]^3 (builtin 1, else 1.5)")
    p.add_argument("--lr", type=float, default=None, help="MLP learning rate (default: mlp 5e-4, hash 1e-2)")
    p.add_argument("--lr-table", type=float, default=3e-2, help="hash model: hash-table learning rate")
    p.add_argument("--lr-decay", type=float, default=None,
                   help="learning rates decay exponentially to this fraction of their start value over the budget "
                        "(training time for --minutes, steps otherwise); default: hash 0.1, mlp 1 (constant)")
    p.add_argument("--distortion", type=float, default=0.0, help="hash model: weight of the distortion loss")
    p.add_argument("--xla-inner", action="store_true",
                   help="hash model with ops: XLA-compile the parts around the custom ops as inner functions")
    p.add_argument("--jit", choices=("auto", "on", "off"), default="auto",
                   help="XLA for the train step (auto: whole step unless it contains custom ops)")
    # data
    p.add_argument("--background", default="white", help="white, black or r,g,b in [0,1]")
    p.add_argument("--downscale", type=int, default=1, help="area-downscale real data by this integer factor")
    p.add_argument("--seed", type=int, default=0, help="weights, ray order and sample jitter")
    p.add_argument("--scene-seed", type=int, default=0, help="built-in scene: training cameras")
    p.add_argument("--scene-res", type=int, default=100, help="built-in scene: image size (square)")
    p.add_argument("--scene-ss", type=int, default=None,
                   help="built-in scene: rays per pixel and axis of the ground truth (default: the scene's, 4)")
    p.add_argument("--no-jitter", action="store_true",
                   help="no stratified jitter (deterministic samples; for tests and strategy comparisons)")
    # evaluation
    p.add_argument("--eval-every", type=float, default=None, help="seconds of training between evaluations")
    p.add_argument("--eval-views", type=int, default=4, help="test views used by the periodic evaluations")
    p.add_argument("--final-views", type=int, default=None, help="test views of the final evaluation (default all)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar (logs one line per evaluation)")
    args = p.parse_args(argv)
    if args.quick:
        if args.minutes is None and args.epochs is None and args.steps is None:
            args.minutes = 2.5
        args.eval_views = min(args.eval_views, 2)
        args.final_views = args.final_views or 8
    if args.minutes is None and args.epochs is None and args.steps is None:
        args.minutes = 10.0
    if args.samples is None:
        args.samples = 32 if args.model == "mlp" else 64
    if args.sampler is None:
        args.sampler = "occupancy" if args.model == "hash" and args.impl == "op" and not args.xla_inner else "uniform"
    if args.sampler == "occupancy":
        if args.model != "hash":
            p.error("--sampler occupancy needs --model hash")
        if args.xla_inner:
            p.error("--xla-inner applies to the uniform sampler only")
        if args.epochs is not None:
            p.error("--epochs needs the uniform sampler (fixed batches); with --sampler occupancy use --minutes or "
                    "--steps")
        if args.sample_budget < 1024:
            p.error(f"--sample-budget must be at least 1024, got {args.sample_budget}")
        if args.grid_every < 1 or args.grid_res < 1 or args.max_samples < 1:
            p.error("--grid-every, --grid-res and --max-samples must be positive")
    if args.lr is None:
        args.lr = 5e-4 if args.model == "mlp" else 1e-2
    if args.lr_decay is None:
        args.lr_decay = 1.0 if args.model == "mlp" else 0.1
    if not 0.0 < args.lr_decay <= 1.0:
        p.error(f"--lr-decay must be in (0, 1], got {args.lr_decay}")
    if args.checkpoint_every is None and args.strategy == "multiworker":
        args.checkpoint_every = "60s"
    args.ckpt_steps = args.ckpt_seconds = None
    if args.checkpoint_every not in (None, "0", "0s"):
        spec = str(args.checkpoint_every).strip()
        try:
            if spec.endswith("s"):
                args.ckpt_seconds = float(spec[:-1])
                assert args.ckpt_seconds > 0
            else:
                args.ckpt_steps = int(spec)
                assert args.ckpt_steps > 0
        except (ValueError, AssertionError):
            p.error(f"--checkpoint-every must be a number of steps (200) or seconds (60s), got {spec!r}")
    if args.out is None:
        args.out = os.path.join("runs", f"{args.model}{'-' + args.impl if args.model == 'hash' else ''}-"
                                f"{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        args.background_rgb = {"white": (1.0, 1.0, 1.0), "black": (0.0, 0.0, 0.0)}.get(args.background) or tuple(
            float(v) for v in args.background.split(","))
        assert len(args.background_rgb) == 3
    except (ValueError, AssertionError):
        p.error(f"--background must be white, black or r,g,b, got {args.background!r}")
    return args


def psnr(mse):
    return -10.0 * math.log10(max(float(mse), 1e-10))


def side_by_side(gt, pred):
    gap = np.ones((gt.shape[0], 2, 3), np.float32)
    return (np.clip(np.concatenate([gt, gap, pred], axis=1), 0, 1) * 255).round().astype(np.uint8)


def write_json_atomic(path, obj):
    """Write-to-temp + rename: a reader (or a run killed mid-write) never sees a half-written file."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# Arguments a resumed run must share with the run that wrote the checkpoint (weights shapes, data order, samples).
RESUME_KEYS = ("data", "model", "impl", "samples", "batch_rays", "levels", "features", "log2_table", "base_res",
               "finest_res", "bound", "seed", "scene_seed", "scene_res", "scene_ss", "background", "downscale",
               "no_jitter", "minutes", "epochs", "steps", "lr", "lr_table", "lr_decay", "distortion", "sampler",
               "sample_budget", "grid_res", "grid_every", "grid_warmup", "step_size", "max_samples", "early_stop")

# Occupancy sampler: rays per step stay in [MIN_RAYS, sample_budget // 2], multiples of RAY_GRANULARITY.
MIN_RAYS, RAY_GRANULARITY = 64, 16


class Trainer:
    def __init__(self, args, dataset, strategy=None, cluster=None):
        import keras
        import tensorflow as tf

        from nerf import models
        from nerf.data.rays import get_rays

        self.args, self.ds, self.tf = args, dataset, tf
        self.cluster = cluster  # nerf.distributed.Cluster with --strategy multiworker
        self.is_chief = cluster is None or cluster.is_chief
        if strategy is not None:
            self.strategy = strategy
        elif args.strategy == "mirrored":
            self.strategy = tf.distribute.MirroredStrategy()
        else:
            self.strategy = tf.distribute.get_strategy()
        n_rep = self.strategy.num_replicas_in_sync
        if args.batch_rays % n_rep:
            raise SystemExit(f"error: --batch-rays {args.batch_rays} is not a multiple of the {n_rep} replicas")

        o, d = get_rays(dataset.H, dataset.W, dataset.focal, dataset.train.poses)
        self.rays_o = tf.constant(o.reshape(-1, 3))
        self.rays_d = tf.constant(d.reshape(-1, 3))
        self.rgb = tf.constant(dataset.train.images.reshape(-1, 3).astype(np.float32))
        self.n_rays = int(self.rgb.shape[0])
        # One row per training ray for the step's batch (one gather instead of one per tensor): origin, direction,
        # colour and, for the hash model, the view-direction encoding (computed once: the directions never change).
        cols = [self.rays_o, self.rays_d, self.rgb]
        if args.model == "hash":
            cols.append(models.sh_encoding_deg4(self.rays_d))
        self.ray_table = tf.concat(cols, axis=1)

        common = dict(n_samples=args.samples, near=dataset.near, far=dataset.far, jitter=not args.no_jitter,
                      background=[float(b) for b in dataset.background])
        if args.model == "mlp":
            cfg = common
        else:
            bound = args.bound if args.bound is not None else (1.0 if dataset.name == "builtin" else 1.5)
            cfg = dict(common, n_levels=args.levels, n_features_per_level=args.features,
                       log2_hashmap_size=args.log2_table, base_resolution=args.base_res,
                       finest_resolution=args.finest_res, bound=bound, implementation=args.impl,
                       xla_inner=args.xla_inner, sampler=args.sampler)
            if args.sampler == "occupancy":
                cfg.update(grid_resolution=args.grid_res, grid_warmup_steps=args.grid_warmup,
                           step_size=args.step_size, max_samples=args.max_samples, early_stop=args.early_stop)
        extra = {}
        if args.sampler == "occupancy":  # outside the strategy scope: one plain copy per worker (see update_grid)
            extra["grid"] = models.make_occupancy_grid(cfg["bound"], args.grid_res, args.grid_warmup)
        with self.strategy.scope():
            keras.utils.set_random_seed(args.seed)
            self.model = models.build_model(args.model, **cfg, **extra)
            table = {id(v) for v in self.model.table_variables()}
            self.table_vars = [v for v in self.model.trainable_variables if id(v) in table]
            self.mlp_vars = [v for v in self.model.trainable_variables if id(v) not in table]
            b2 = 0.999 if args.model == "mlp" else 0.99
            eps = 1e-7 if args.model == "mlp" else 1e-15
            self.opt = keras.optimizers.Adam(args.lr, beta_2=b2, epsilon=eps)
            self.opt.build(self.mlp_vars)
            self.opt_table = None
            if self.table_vars:
                self.opt_table = keras.optimizers.Adam(args.lr_table, beta_2=0.99, epsilon=1e-15)
                self.opt_table.build(self.table_vars)
        self.n_params = int(sum(np.prod(v.shape) for v in self.model.trainable_variables))
        # gradients all-reduced per step: one float32 value per trainable parameter (dense, the table included)
        self.allreduce_bytes = int(sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize
                                       for v in self.model.trainable_variables))
        # training state beside the model and optimisers: steps done, chief's training seconds (the lr schedule
        # and time budget), the permutation seed; the data position is a function of (seed, step)
        self.state_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.state_train_s = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="train_seconds")
        self.state_seed = tf.Variable(args.seed, dtype=tf.int64, trainable=False, name="data_seed")
        parts = dict(model=self.model, optimizer=self.opt, step=self.state_step, train_seconds=self.state_train_s,
                     data_seed=self.state_seed)
        if self.opt_table is not None:
            parts["optimizer_table"] = self.opt_table
        self.occupancy = args.sampler == "occupancy"
        if self.occupancy:
            # variable batches: the position in the ray stream (epoch * n_rays + offset) and the current ray count
            # are state (a pure function of the measured samples per ray, not of the step number)
            diag = 2.0 * math.sqrt(3.0) * self.model.cfg["bound"]
            r0 = args.sample_budget * 2.0 * self.model.cfg["step_size"] / diag  # all cells occupied: ~diag/2 per ray
            self.state_rays_pos = tf.Variable(0, dtype=tf.int64, trainable=False, name="rays_position")
            self.state_rays = tf.Variable(self.clamp_rays(r0), dtype=tf.int64, trainable=False, name="rays_per_step")
            parts.update(occupancy_grid=self.model.grid, rays_position=self.state_rays_pos,
                         rays_per_step=self.state_rays)
        self.grid_log = []  # occupancy sampler: per grid update, its step, seconds and (optionally) a digest
        self.last_rays, self.last_samples = args.batch_rays, args.batch_rays * args.samples
        self.last_marched = self.last_samples
        self.ckpt = tf.train.Checkpoint(**parts)
        self._perm_epoch, self._perm = None, None
        self.lr_start = [(self.opt, args.lr)] + ([(self.opt_table, args.lr_table)] if self.opt_table else [])
        uses_custom_ops = args.model == "hash" and args.impl == "op"
        if self.occupancy and args.jit == "on":
            raise SystemExit("error: --jit on: the occupancy sampler's ragged batches do not compile with XLA")
        self.jit = args.jit == "on" or (args.jit == "auto" and not uses_custom_ops and not self.occupancy)
        self._make_step()

    def _make_step(self):
        tf, args, model = self.tf, self.args, self.model
        strategy = self.strategy
        n_rep = strategy.num_replicas_in_sync
        dist_w = float(args.distortion)

        def replica_grads(o, d, y, view_sh, seed, n_global):
            """The replica's share of the global loss and its gradient: sums over its rays divided by the global
            ray count ``n_global``, so the shares (whatever their ray and sample counts) add up to the loss of the
            whole global batch and the all-reduced (summed) gradient is the single-process gradient of that
            batch."""
            with tf.GradientTape() as tape:
                extra = {} if view_sh is None else dict(view_sh=view_sh)
                out = model(o, d, training=True, jitter_seed=seed, **extra)
                mse = tf.reduce_sum(tf.square(out["color"] - y)) / (3.0 * n_global)  # mean over global rays, RGB
                loss = mse
                if dist_w > 0:
                    loss = loss + dist_w * tf.reduce_sum(distortion(out)) / n_global
            grads = tape.gradient(loss, self.mlp_vars + self.table_vars)
            return mse, out, grads

        def replica_step(o, d, y, view_sh, seed, n_global):
            mse, out, grads = replica_grads(o, d, y, view_sh, seed, n_global)
            self.opt.apply_gradients(zip(grads[:len(self.mlp_vars)], self.mlp_vars))
            if self.table_vars:
                self.opt_table.apply_gradients(zip(grads[len(self.mlp_vars):], self.table_vars))
            n = tf.shape(out["weights"])[0] if "row_splits" in out else tf.size(out["weights"])
            return mse, tf.cast(tf.stack([n, out.get("n_marched", n)]), tf.float32)

        def distortion(out):
            import tf_metal_ops

            op = args.impl == "op"
            if "row_splits" in out:
                fn = tf_metal_ops.distortion_loss_packed if op else tf_metal_ops.distortion_loss_packed_tf
                return fn(out["weights"], out["t_starts"], out["t_ends"], out["row_splits"])
            return (tf_metal_ops.distortion_loss if op else tf_metal_ops.distortion_loss_tf)(out["weights"], out["edges"])

        def step(idx, step_no, ctrl, n_global):
            """One synchronous step on the replicas' shares of the global batch (``n_global`` rays in all).
            Returns [mean loss, *ctrl of replica 0, samples and marched samples of all replicas] on every worker:
            ``ctrl`` carries the chief's clock so all workers take the same learning rate, stop and checkpoint
            decisions."""

            def per_replica(i, ctrl):
                rid = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.int64)
                seed = tf.stack([tf.constant(args.seed, tf.int64), step_no * 4096 + rid])  # sample jitter
                mse, n = replica_step(*self.batch(i), seed, n_global)
                first = tf.cast(tf.equal(rid, 0), tf.float32)
                return tf.concat([tf.reshape(mse, [1]), ctrl * first, n], 0)

            per = strategy.run(per_replica, args=(idx, ctrl))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per, axis=None)

        if n_rep == 1:
            # one trace for every batch size (the occupancy sampler's ray count changes from step to step)
            sig = [tf.TensorSpec([None], tf.int64), tf.TensorSpec([], tf.int64), tf.TensorSpec([1], tf.float32),
                   tf.TensorSpec([], tf.float32)]
            self._step_fn = tf.function(step, input_signature=sig, jit_compile=self.jit)
        else:
            # per-replica batches of a varying size: after the first sizes, one trace with unknown sizes
            self._step_fn = tf.function(step, reduce_retracing=True)
        self._grid_fn = None
        if self.occupancy:
            @tf.function(input_signature=[tf.TensorSpec([], tf.int64)])
            def update_grid(step_no):
                return model.update_grid(step=step_no, seed=tf.constant(args.seed, tf.int64) * 1000003 + step_no)

            self._grid_fn = update_grid
        self._grid_broadcast_fn = None
        if self.occupancy and self.cluster is not None and self.cluster.n_workers > 1 and args.grid_sync == "broadcast":
            grid = model.grid
            self._grid_broadcast_fn = self._make_broadcast([grid.density, grid.bits, grid.step])

        @tf.function(reduce_retracing=True)
        def global_gradients(idx, step_no, n_global):
            def per_replica(i):
                rid = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.int64)
                seed = tf.stack([tf.constant(args.seed, tf.int64), step_no * 4096 + rid])
                return replica_grads(*self.batch(i), seed, n_global)[2]

            per = strategy.run(per_replica, args=(idx,))
            return [strategy.reduce(tf.distribute.ReduceOp.SUM, g, axis=None) for g in per]

        self._grad_fn = global_gradients

    def batch(self, idx):
        """Rays ``idx`` of the training set -> origins, directions, colours, view-direction SH (None for the MLP
        model)."""
        rows = self.tf.gather(self.ray_table, idx)
        return rows[:, 0:3], rows[:, 3:6], rows[:, 6:9], (rows[:, 9:] if self.ray_table.shape[1] > 9 else None)

    def clamp_rays(self, r):
        """Rays per step for ``r`` wanted: a multiple of RAY_GRANULARITY and of the replica count (equal shards), in
        [MIN_RAYS, sample_budget / 2] and at most the training set."""
        b, g = self.args.sample_budget, math.lcm(RAY_GRANULARITY, self.strategy.num_replicas_in_sync)
        lo = -(-MIN_RAYS // g) * g
        hi = max(lo, b // 2 // g * g)
        return int(min(max(round(r / g) * g, lo), hi, self.n_rays // g * g))

    def trace_count(self):
        """Traces of the train-step function so far (1 after the first step when nothing retraces)."""
        return self._step_fn.experimental_get_tracing_count()

    def epochs_done(self, step_no):
        """Passes over the training rays after ``step_no`` steps."""
        if self.occupancy:
            return int(self.state_rays_pos.numpy()) / self.n_rays
        return step_no * self.args.batch_rays / self.n_rays

    def step(self, step_no, ctrl=0.0):
        """Runs training step ``step_no`` (0-based) on its global batch; returns (loss, ctrl of the chief)."""
        tf = self.tf
        if self.occupancy:
            if step_no % self.args.grid_every == 0:
                self.update_grid(step_no)
            idx = self.next_rays()
        else:
            idx = self.batch_indices(step_no)
        n_rays = len(idx)
        out = self._step_fn(self.distribute_rays(idx), tf.constant(step_no, tf.int64), tf.constant([ctrl], tf.float32),
                            tf.constant(n_rays, tf.float32)).numpy()
        self.last_rays, self.last_samples, self.last_marched = n_rays, float(out[2]), float(out[3])
        if self.occupancy:  # Instant-NGP: scale the ray count by budget / measured samples
            self.state_rays.assign(self.clamp_rays(
                self.last_rays * self.args.sample_budget / max(self.last_samples, 1.0)))
        return float(out[0]), float(out[1])

    def distribute_rays(self, idx):
        """Global ray indices -> the step functions' argument: replica r of n takes the r-th of n equal slices."""
        tf, n_rep = self.tf, self.strategy.num_replicas_in_sync
        if n_rep == 1:
            return tf.constant(idx, tf.int64)
        per = len(idx) // n_rep
        return self.strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(idx[ctx.replica_id_in_sync_group * per:(ctx.replica_id_in_sync_group + 1) * per]))

    def gradients(self, idx, step_no):
        """The all-reduced gradient (MLP variables, then the table) of the global batch ``idx`` at step
        ``step_no``, without applying it (for checking the loss normalisation against one process)."""
        tf = self.tf
        g = self._grad_fn(self.distribute_rays(idx), tf.constant(step_no, tf.int64),
                          tf.constant(len(idx), tf.float32))
        return [x.numpy() for x in g]

    def update_grid(self, step_no):
        """The occupancy-grid update of step ``step_no``, identical on every worker: each worker computes it from
        its (identical) weights with the same seed (--grid-sync replicate), or the chief computes it and the others
        take its grid (broadcast). Records the update's seconds and, with --save-worker-weights, a digest of the
        grid it produced."""
        import hashlib

        tf = self.tf
        t = time.perf_counter()
        if self._grid_broadcast_fn is None or self.is_chief:
            self._grid_fn(tf.constant(step_no, tf.int64))
        if self._grid_broadcast_fn is not None:
            self._grid_broadcast_fn()
        grid = self.model.grid
        digest = None
        if self.args.save_worker_weights:
            h = hashlib.sha256(grid.density.numpy().tobytes())
            h.update(grid.bits.numpy().tobytes())
            h.update(grid.step.numpy().tobytes())
            digest = h.hexdigest()
        else:
            grid.step.numpy()  # the update has run (honest timing)
        self.grid_log.append(dict(step=int(step_no), seconds=time.perf_counter() - t, digest=digest))

    def next_rays(self):
        """Occupancy sampler: the next ``rays_per_step`` rays of the stream of epochs (each a permutation seeded by
        (seed, epoch), its remainder dropped when the batch does not fit)."""
        r = int(self.state_rays.numpy())
        epoch, k = divmod(int(self.state_rays_pos.numpy()), self.n_rays)
        if k + r > self.n_rays:
            epoch, k = epoch + 1, 0
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([int(self.state_seed.numpy()), epoch]).permutation(self.n_rays)
            self._perm_epoch = epoch
        self.state_rays_pos.assign(epoch * self.n_rays + k + r)
        return self._perm[k:k + r]

    def set_progress(self, fraction):
        """Learning rates for ``fraction`` ∈ [0, 1] of the budget: start · decay^fraction."""
        factor = self.args.lr_decay ** min(max(fraction, 0.0), 1.0)
        for opt, lr in self.lr_start:
            opt.learning_rate = lr * factor

    def batch_indices(self, step_no):
        """Ray indices of global batch ``step_no``: epoch e is a permutation seeded by (seed, e), cut into
        batches (the remainder dropped). A pure function of (seed, step), the same on every worker and after a
        resume; replica r of n trains on the r-th of n equal slices of it."""
        b = self.args.batch_rays
        per_epoch = self.n_rays // b
        epoch, k = divmod(int(step_no), per_epoch)
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([int(self.state_seed.numpy()), epoch]).permutation(self.n_rays)
            self._perm_epoch = epoch
        return self._perm[k * b:(k + 1) * b]

    # ---- checkpoints ----------------------------------------------------------------------------------------
    def checkpoint_dir(self):
        """Chief: OUT/checkpoints. Other workers save too (MultiWorkerMirroredStrategy may need every worker in a
        save) but into a temporary OUT/checkpoints/worker-temp-<rank>, deleted after each save."""
        d = os.path.join(self.args.out, "checkpoints")
        return d if self.is_chief else os.path.join(d, f"worker-temp-{self.cluster.rank}")

    def init_checkpoints(self):
        """Creates the manager; on the chief, checks that a resumed run has the same settings and restores the
        latest checkpoint; then (several workers) the chief's state is broadcast to everyone, so the other workers
        need no copy of the checkpoint files. Returns a description of what was restored, or None."""
        tf = self.tf
        chief_dir = os.path.join(self.args.out, "checkpoints")
        self.ckpt_manager = None
        if (self.args.ckpt_steps or self.args.ckpt_seconds) and self.is_chief:
            os.makedirs(chief_dir, exist_ok=True)
            for name in os.listdir(chief_dir):  # leftovers of a save that was killed midway (never referenced)
                if name.endswith("_temp") or name.startswith("worker-temp-") or ".tmp" in name:
                    path = os.path.join(chief_dir, name)
                    shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        if self.args.ckpt_steps or self.args.ckpt_seconds:
            self.ckpt_manager = tf.train.CheckpointManager(self.ckpt, self.checkpoint_dir(),
                                                           max_to_keep=max(1, self.args.keep_checkpoints))
        latest = None
        if self.is_chief:
            latest = tf.train.latest_checkpoint(chief_dir) if os.path.isdir(chief_dir) else None
            if latest is None and self.ckpt_manager is not None:
                write_json_atomic(os.path.join(chief_dir, "run_config.json"),
                                  {k: getattr(self.args, k) for k in RESUME_KEYS})
            cfg_path = os.path.join(chief_dir, "run_config.json")
            if latest is not None and os.path.exists(cfg_path):
                with open(cfg_path) as f:
                    saved = json.load(f)
                diff = {k: (saved.get(k), getattr(self.args, k)) for k in RESUME_KEYS
                        if json.loads(json.dumps(getattr(self.args, k))) != saved.get(k)}
                if diff:
                    raise SystemExit("error: cannot resume " + latest + ": these settings differ from the run that "
                                     "wrote it (checkpoint, now): " + ", ".join(
                                         f"{k} {a!r} vs {b!r}" for k, (a, b) in diff.items())
                                     + "; use another --out for a new run")
            if latest is not None:
                self.ckpt.restore(latest).assert_existing_objects_matched()
        if self.cluster is not None and self.cluster.n_workers > 1:
            self.broadcast_from_chief()
            if not self.is_chief and int(self.state_step.numpy()) > 0:
                latest = "the chief's checkpoint"
        return latest

    def checkpointed_variables(self):
        vs = list(self.model.variables) + list(self.opt.variables)
        if self.opt_table is not None:
            vs += list(self.opt_table.variables)
        vs += [self.state_step, self.state_train_s, self.state_seed]
        if self.occupancy:  # the grid (a tf.Module beside the Keras weights) and the ray-stream position
            grid = self.model.grid
            vs += [grid.density, grid.bits, grid.step, self.state_rays_pos, self.state_rays]
        return vs

    def _make_broadcast(self, variables):
        """A function that gives every variable in ``variables`` the chief's value on every worker: an all-gather
        that keeps replica 0's slice (exact bits; types the collectives lack, e.g. uint8, travel as int32)."""
        tf, strategy = self.tf, self.strategy
        wire = {tf.uint8: tf.int32, tf.bool: tf.int32}

        @tf.function
        def gather():
            def fn():
                ctx = tf.distribute.get_replica_context()
                out = []
                for v in variables:
                    x = tf.convert_to_tensor(v)
                    x = tf.cast(x, wire[x.dtype]) if x.dtype in wire else x
                    out.append(tf.cast(ctx.all_gather(x[None], axis=0)[0], v.dtype))
                return out

            return [strategy.experimental_local_results(x)[0] for x in strategy.run(fn)]

        def broadcast():
            for v, x in zip(variables, gather()):
                v.assign(x)

        return broadcast

    def broadcast_from_chief(self):
        """Every variable a checkpoint holds takes the chief's value."""
        self._make_broadcast(self.checkpointed_variables())()

    def save_checkpoint(self, step_no, train_s):
        self.state_step.assign(step_no)
        self.state_train_s.assign(train_s)
        if self.is_chief:
            return self.ckpt_manager.save(checkpoint_number=step_no)
        manager = self.tf.train.CheckpointManager(self.ckpt, self.checkpoint_dir(), max_to_keep=1)
        path = manager.save(checkpoint_number=step_no)
        shutil.rmtree(self.checkpoint_dir(), ignore_errors=True)
        return path

    def evaluate(self, n_views):
        from nerf.models import render_image

        test = self.ds.test
        n = len(test) if n_views is None else min(n_views, len(test))
        preds, psnrs = [], []
        for k in range(n):
            rgb, _, _ = render_image(self.model, self.ds.H, self.ds.W, self.ds.focal, test.poses[k])
            preds.append(rgb)
            psnrs.append(psnr(np.mean((rgb - test.images[k]) ** 2)))
        return float(np.mean(psnrs)), preds


def run(argv=None):
    args = parse_args(argv)
    cluster = strategy = None
    if args.strategy == "multiworker":
        from nerf.distributed import ClusterConfigError, read_tf_config

        try:  # before TensorFlow starts: a bad TF_CONFIG is one clear line, not a hang or a gRPC trace
            cluster = read_tf_config()
        except ClusterConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2)
        import tensorflow as tf

        # created first: the strategy must exist before any other TensorFlow op runs
        comm = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=comm)
        print(f"{cluster.name} (rank {cluster.rank} of {cluster.n_workers}{', chief' if cluster.is_chief else ''}) "
              f"at {cluster.my_address}: cluster up", flush=True)
        if not cluster.is_chief:
            args.no_progress = True
    if args.strategy == "mirrored":
        import tensorflow as tf

        if not tf.config.list_physical_devices("GPU") and args.replicas > 1:
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas)

    import imageio.v3 as iio
    from tqdm import tqdm

    from nerf.data import DatasetError, load_dataset
    from nerf import models

    t_start = time.perf_counter()
    try:
        if args.data == "builtin":
            scene = dict(H=args.scene_res, W=args.scene_res)
            if args.scene_ss is not None:
                scene["ss"] = args.scene_ss
            ds = load_dataset("builtin", background=args.background_rgb, seed=args.scene_seed, verbose=True, **scene)
        else:
            ds = load_dataset(args.data, background=args.background_rgb, downscale_factor=args.downscale)
    except DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    print(ds.summary(), flush=True)
    multi = cluster is not None
    is_chief = not multi or cluster.is_chief
    if is_chief:
        os.makedirs(os.path.join(args.out, "renders"), exist_ok=True)

    tr = Trainer(args, ds, strategy=strategy, cluster=cluster)
    sampling = (f"occupancy sampler ({args.grid_res}^3 grid, step {tr.model.cfg['step_size']:.4g}), "
                f"{args.sample_budget} samples/step" if tr.occupancy else
                f"{args.samples} samples/ray, {args.batch_rays} rays/step")
    print(f"model {args.model}{' (' + args.impl + ')' if args.model == 'hash' else ''}: {tr.n_params:,} parameters, "
          f"{sampling}, "
          f"XLA train step: {tr.jit and tr.strategy.num_replicas_in_sync == 1}, "
          f"replicas: {tr.strategy.num_replicas_in_sync}"
          + (f", all-reduced per step: {tr.allreduce_bytes:,} bytes" if multi else ""), flush=True)
    restored = tr.init_checkpoints()
    steps_per_epoch = tr.n_rays / args.batch_rays
    budget_s = args.minutes * 60 if args.minutes is not None else None
    max_steps = args.steps if args.steps is not None else (
        math.ceil(args.epochs * steps_per_epoch) if args.epochs is not None else None)
    eval_every = args.eval_every or (budget_s / 8 if budget_s else None)
    eval_every_steps = None if eval_every else max(1, (max_steps or 1) // 8)

    metrics = {"config": {k: v for k, v in vars(args).items()}, "dataset": ds.summary(), "n_params": tr.n_params,
               "rays_per_epoch": tr.n_rays, "evals": []}
    if multi:
        metrics["cluster"] = dict(workers=cluster.n_workers, addresses=list(cluster.addresses),
                                  allreduce_bytes_per_step=tr.allreduce_bytes)
    step, train_s, losses = 0, 0.0, []
    step_times = []  # seconds of each timed step of this process (the first, compiling step excluded)
    spr, rps, mpr = [], [], []  # per step: samples per ray (trained), rays, samples per ray marched
    metrics_path = os.path.join(args.out, "metrics.json")
    if restored:
        step, train_s = int(tr.state_step.numpy()), float(tr.state_train_s.numpy())
        print(f"resumed from {restored}: step {step}, {train_s:.1f} s of training", flush=True)
        if is_chief and os.path.exists(metrics_path):  # the history up to the checkpoint
            with open(metrics_path) as f:
                old = json.load(f)
            metrics["evals"] = [e for e in old.get("evals", []) if e["step"] <= step]
            losses = [float(v) for v in old.get("train_losses", [])][:step]
            spr = [float(v) for v in old.get("samples_per_ray", [])][:step]
            rps = [int(v) for v in old.get("rays_per_step", [])][:step]
            mpr = [float(v) for v in old.get("marched_per_ray", [])][:step]
            metrics["resumed"] = old.get("resumed", [])
        metrics.setdefault("resumed", []).append(dict(step=step, train_seconds=train_s, checkpoint=restored))
    step0 = step
    # compile before the clock starts (tracing/XLA compilation is not training time)
    tr.set_progress(train_s / budget_s if budget_s is not None else step / max_steps)
    t0 = time.perf_counter()
    loss, _ = tr.step(step, train_s)
    compile_s = time.perf_counter() - t0
    step += 1
    losses.append(loss)
    spr.append(tr.last_samples / max(tr.last_rays, 1))
    rps.append(tr.last_rays)
    mpr.append(tr.last_marched / max(tr.last_rays, 1))
    sync_s = train_s  # the chief's training clock, as every worker sees it (lr schedule, budget, checkpoints)
    last_eval_s, last_eval_step = train_s, step0
    last_ckpt_s, last_ckpt_step = train_s, step0
    wall0 = time.perf_counter()
    bar = tqdm(total=max_steps if max_steps else round(budget_s), unit="step" if max_steps else "s",
               disable=args.no_progress, dynamic_ncols=True, bar_format=None if max_steps else
               "{l_bar}{bar}| {n:.0f}/{total:.0f}s [{elapsed}<{remaining}{postfix}]",
               initial=step0 if max_steps else round(train_s))

    def do_eval(final=False):
        n_views = args.final_views if final else args.eval_views
        t = time.perf_counter()
        test_psnr, preds = tr.evaluate(n_views)
        eval_s = time.perf_counter() - t
        tl = float(np.mean(losses[-50:])) if losses else loss
        since = max(step - last_eval_step, 1)  # the steps since the previous evaluation
        rec = dict(step=step, epoch=tr.epochs_done(step), train_seconds=round(train_s, 3),
                   wall_seconds=round(time.perf_counter() - wall0, 3), train_loss=tl, train_psnr=psnr(tl),
                   test_psnr=test_psnr, eval_views=len(preds), eval_seconds=round(eval_s, 3),
                   lr=float(tr.opt.learning_rate.numpy()),
                   lr_table=float(tr.opt_table.learning_rate.numpy()) if tr.opt_table else None,
                   samples_per_ray=float(np.mean(spr[-since:])), rays_per_step=float(np.mean(rps[-since:])),
                   marched_per_ray=float(np.mean(mpr[-since:])),
                   occupied_fraction=float(tr.model.grid.occupied_fraction().numpy()) if tr.occupancy else None)
        metrics["evals"].append(rec)
        iio.imwrite(os.path.join(args.out, "renders", f"step_{step:06d}.png"), side_by_side(ds.test.images[0], preds[0]))
        if final:
            for k, pr in enumerate(preds):
                iio.imwrite(os.path.join(args.out, "renders", f"test_{k:03d}.png"), side_by_side(ds.test.images[k], pr))
        msg = (f"step {step} epoch {rec['epoch']:.2f} train {train_s:.0f}s: loss {tl:.5f} (train PSNR "
               f"{rec['train_psnr']:.2f}) test PSNR {test_psnr:.2f} dB on {len(preds)} views; "
               f"{rec['samples_per_ray']:.1f} samples/ray, {rec['rays_per_step']:.0f} rays/step"
               + (f", occupied {100 * rec['occupied_fraction']:.1f} %" if tr.occupancy else ""))
        print(msg, flush=True) if args.no_progress else bar.write(msg)
        save_series()
        write_json_atomic(metrics_path, metrics)
        return rec

    def save_series():
        metrics["train_losses"] = [float(v) for v in losses]
        metrics["samples_per_ray"] = [round(float(v), 3) for v in spr]
        metrics["rays_per_step"] = [int(v) for v in rps]
        metrics["marched_per_ray"] = [round(float(v), 3) for v in mpr]
        metrics["step_seconds"] = [round(float(v), 5) for v in step_times]

    def checkpoint():
        nonlocal last_ckpt_s, last_ckpt_step
        path = tr.save_checkpoint(step, train_s)
        last_ckpt_s, last_ckpt_step = sync_s, step
        if is_chief:
            save_series()
            write_json_atomic(metrics_path, metrics)
            msg = f"checkpoint {path} (step {step}, {train_s:.1f} s of training)"
            print(msg, flush=True) if args.no_progress else bar.write(msg)

    while True:
        if max_steps is not None and step >= max_steps:
            break
        if budget_s is not None and sync_s >= budget_s:
            break
        tr.set_progress(sync_s / budget_s if budget_s is not None else step / max_steps)
        t = time.perf_counter()
        loss, chief_s = tr.step(step, train_s)  # the step returns numbers: it has finished, honest timing
        step_times.append(time.perf_counter() - t)
        train_s += step_times[-1]
        # all workers stop/checkpoint on the chief's clock (its time before this step: one step behind)
        sync_s = chief_s if multi else train_s
        losses.append(loss)
        spr.append(tr.last_samples / max(tr.last_rays, 1))
        rps.append(tr.last_rays)
        mpr.append(tr.last_marched / max(tr.last_rays, 1))
        step += 1
        if not math.isfinite(loss):
            print(f"error: the loss became {loss} at step {step}", file=sys.stderr)
            raise SystemExit(1)
        if step % 10 == 0 or max_steps:
            tl = float(np.mean(losses[-50:]))
            bar.set_postfix(loss=f"{tl:.4f}", psnr=f"{psnr(tl):.2f}", epoch=f"{tr.epochs_done(step):.2f}",
                            spr=f"{np.mean(spr[-10:]):.1f}", rays=rps[-1], refresh=False)
            if max_steps:
                bar.update(step - bar.n)
            else:
                bar.update(min(train_s, budget_s) - bar.n)
        if is_chief and ((eval_every and train_s - last_eval_s >= eval_every) or (
                eval_every_steps and step - last_eval_step >= eval_every_steps)):
            do_eval()
            last_eval_s, last_eval_step = train_s, step
        if tr.ckpt_manager is not None and (
                (args.ckpt_steps and step - last_ckpt_step >= args.ckpt_steps) or
                (args.ckpt_seconds and sync_s - last_ckpt_s >= args.ckpt_seconds)):
            checkpoint()
    bar.close()
    if tr.ckpt_manager is not None and last_ckpt_step != step:
        checkpoint()
    if args.save_worker_weights:
        os.makedirs(os.path.join(args.out, "workers"), exist_ok=True)
        rank = cluster.rank if multi else 0
        path = os.path.join(args.out, "workers", f"rank-{rank}.npz")
        np.savez(path + ".tmp.npz", *tr.model.get_weights())
        os.replace(path + ".tmp.npz", path)
        if tr.occupancy:  # the final grid and the digest of the grid after each update of this process
            grid = tr.model.grid
            gpath = os.path.join(args.out, "workers", f"rank-{rank}-grid.npz")
            np.savez(gpath + ".tmp.npz", density=grid.density.numpy(), bits=grid.bits.numpy(),
                     step=grid.step.numpy())
            os.replace(gpath + ".tmp.npz", gpath)
            write_json_atomic(os.path.join(args.out, "workers", f"rank-{rank}-grid-updates.json"), tr.grid_log)
    if not is_chief:
        print(f"done: {cluster.name} finished {step} steps in {train_s:.0f} s of training", flush=True)
        return {"final": dict(steps=step, train_seconds=train_s), "train_losses": losses}
    final = do_eval(final=True)

    # PSNR vs training time
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(6, 6), sharex=True, gridspec_kw=dict(height_ratios=(2, 1)))
    ev = metrics["evals"]
    minutes = [e["train_seconds"] / 60 for e in ev]
    ax.plot(minutes, [e["test_psnr"] for e in ev], "o-", label="test PSNR")
    ax.plot(minutes, [e["train_psnr"] for e in ev], "--", alpha=0.6, label="train PSNR")
    ax.set(ylabel="PSNR (dB)", title=f"NeRF {args.model} ({args.sampler} sampler) on {ds.name}")
    ax.grid(alpha=0.3)
    ax.legend()
    # samples per ray (mean over the steps before each evaluation) and, occupancy sampler, the grid's occupied part
    ax2.plot(minutes, [e.get("samples_per_ray") for e in ev], "o-", color="C2", label="samples / ray")
    if any(e.get("marched_per_ray") != e.get("samples_per_ray") for e in ev):  # --early-stop: before compaction
        ax2.plot(minutes, [e.get("marched_per_ray") for e in ev], ".:", color="C2", alpha=0.6, label="marched / ray")
    ax2.set(xlabel="training time (min)", ylabel="samples / ray")
    ax2.grid(alpha=0.3)
    if tr.occupancy:
        ax3 = ax2.twinx()
        ax3.plot(minutes, [100 * e["occupied_fraction"] for e in ev], "s--", color="C3", alpha=0.7,
                 label="occupied cells (%)")
        ax3.set_ylabel("occupied cells (%)")
        ax2.legend(handles=ax2.get_lines() + ax3.get_lines(), loc="upper right")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "psnr.png"), dpi=100)
    plt.close(fig)

    # save, reload, render a novel view (a camera of none of the splits)
    from nerf.data.rays import spherical_pose

    model_dir = os.path.join(args.out, "model")
    models.save_model(tr.model, model_dir)
    reloaded = models.load_model(model_dir)
    novel = spherical_pose(float(np.linalg.norm(ds.test.poses[0][:3, 3])), 0.123, math.radians(42.0))
    rgb_a, _, _ = models.render_image(tr.model, ds.H, ds.W, ds.focal, novel)
    rgb_b, depth, _ = models.render_image(reloaded, ds.H, ds.W, ds.focal, novel)
    reload_diff = float(np.max(np.abs(rgb_a - rgb_b)))
    iio.imwrite(os.path.join(args.out, "renders", "novel_view.png"), (rgb_b * 255).round().astype(np.uint8))
    epochs = tr.epochs_done(step)
    save_series()
    timed = max(step - step0 - 1, 1)  # steps inside train_s in this process (the first one compiled)
    metrics["final"] = dict(final, steps=step, epochs=epochs, train_seconds=train_s, compile_seconds=compile_s,
                            seconds_per_epoch=train_s / max(epochs * (step - 1) / step, 1e-9),
                            seconds_per_step=(train_s - (metrics["resumed"][-1]["train_seconds"] if restored else 0.0))
                            / timed,
                            total_seconds=time.perf_counter() - t_start, reload_max_abs_diff=reload_diff)
    if tr.occupancy:
        metrics["final"]["trace_count"] = tr.trace_count()
        upd = [g["seconds"] for g in tr.grid_log[1:]]  # the first one traced
        metrics["final"]["grid_updates"] = len(tr.grid_log)
        metrics["final"]["grid_update_seconds_median"] = float(np.median(upd)) if upd else None
        metrics["final"]["samples_per_ray_last_100"] = float(np.mean(spr[-100:]))
    write_json_atomic(metrics_path, metrics)
    fm = metrics["final"]
    print(f"done: test PSNR {fm['test_psnr']:.2f} dB ({fm['eval_views']} views) after {fm['steps']} steps = "
          f"{fm['epochs']:.2f} epochs in {train_s:.0f} s of training ({fm['seconds_per_epoch']:.1f} s/epoch, "
          f"{1000 * fm['seconds_per_step']:.0f} ms/step); total {fm['total_seconds']:.0f} s; reloaded model renders "
          f"the novel view within {reload_diff:.1e}; outputs in {args.out}", flush=True)
    return metrics


if __name__ == "__main__":
    run()
