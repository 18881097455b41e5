"""The NeRF training step of ``train.py``: the model and optimisers a :class:`~nerf.config.TrainConfig` asks for, the
rays of each step (fixed batches, or the occupancy sampler's ray budget), the step and gradient functions under a
``tf.distribute`` strategy, the learning-rate schedule and the occupancy-grid updates.

Conventions:

* Steps are numbered from 0. The rays of step ``s`` are a pure function of the seed and the training state, the
  same on every worker and after a resume: epoch ``e`` is a permutation of the training pixels seeded by
  ``(seed, e)`` (evaluated per batch, never stored), cut into batches in order (a remainder that does not fill a
  batch is dropped). A batch's rays are made from its pixels on the host (:mod:`nerf.data.pixel_rays`); pixels
  without a ray or masked out leave the batch, whose size may then be smaller.
* A global batch of ``n`` rays is split into equal slices, replica ``r`` takes the ``r``-th. Each replica's loss is
  a sum over its rays divided by ``n``, so the all-reduced (summed) gradient is the single-process gradient of the
  global batch, whatever the replicas' sample counts.
* The state a checkpoint holds (:meth:`Trainer.state`) is the model, the optimisers, the step, the chief's training
  seconds (the learning-rate schedule and time budget), the data seed and, occupancy sampler, the grid, the
  position in the ray stream and the current ray count.
"""

from __future__ import annotations

import hashlib
import math
import time

import keras
import numpy as np
import tensorflow as tf

from nerf import fused_adam, models
from nerf.collectives import gather_evaluations, gather_rows_and_sum, make_broadcast
from nerf.config import CONE_PIXELS, MAX_CONE_ANGLE, MIN_CONE_ANGLE, TrainConfig

# Occupancy sampler: rays per step stay in [MIN_RAYS, sample_budget // 2], multiples of RAY_GRANULARITY.
MIN_RAYS, RAY_GRANULARITY = 64, 16
# A batch reaches the step as one float32 row per ray, made on the host: origin, unit direction, colour, for the hash
# model the view-direction encoding (16 values), then the training view (exact up to 2^24). Everything a ray's
# samples depend on is computed outside the step function, so the step's result does not depend on which trace runs
# it (a trace for the first batch's static shape rounds some element-wise arithmetic differently from the general
# trace, and a resumed run starts with such a trace at another step).
RAY_COLUMNS, SH_COLUMNS = 10, 16


def make_strategy(cfg: TrainConfig):
    """The strategy of --strategy default or mirrored (multiworker: created by ``train.py`` before any TF op)."""
    return tf.distribute.MirroredStrategy() if cfg.strategy == "mirrored" else tf.distribute.get_strategy()


def model_config(cfg: TrainConfig, dataset) -> dict:
    """Keyword arguments of ``nerf.models.build_model(cfg.model, ...)`` (the occupancy grid aside)."""
    common = dict(n_samples=cfg.samples, near=dataset.near, far=dataset.far, jitter=not cfg.no_jitter,
                  background=[float(b) for b in dataset.background])
    if cfg.model == "mlp":
        return common
    unbounded = cfg.scene == "unbounded"
    # unbounded: the cameras lie within distance 1 of the centre (nerf.data.normalise), the unit region is [-1, 1]^3
    bound = cfg.bound if cfg.bound is not None else (1.0 if dataset.name == "builtin" or unbounded else 1.5)
    kw = dict(common, n_levels=cfg.levels, n_features_per_level=cfg.features, log2_hashmap_size=cfg.log2_table,
              base_resolution=cfg.base_res, finest_resolution=cfg.finest_res, bound=bound,
              implementation=cfg.impl, xla_inner=cfg.xla_inner, sampler=cfg.sampler, mlp=cfg.mlp)
    if cfg.mlp == "fused" and tf.config.list_logical_devices("GPU"):
        # on a GPU the hash grid encodes feature-major (tiny-cuda-nn's layout, its fastest encode) and the density
        # MLP reads that in place; on the CPU the point-major encode is the faster (docs/fused_mlp.md)
        kw["feature_major"] = True
    if cfg.sampler == "occupancy":
        kw.update(grid_resolution=cfg.grid_res, grid_warmup_steps=cfg.grid_warmup, step_size=cfg.step_size,
                  max_samples=cfg.max_samples, early_stop=cfg.early_stop,
                  alpha_threshold=cfg.alpha_threshold)
        cascades = cfg.cascades if cfg.cascades is not None else default_cascades(dataset.far, bound)
        cone = cfg.cone_angle if cfg.cone_angle is not None else default_cone_angle(dataset.focal)
        if unbounded or cascades != 1 or cone or cfg.appearance_dim:
            kw.update(unbounded=unbounded, cascades=cascades, cone_angle=cone,
                      appearance_dim=cfg.appearance_dim, n_appearance=len(dataset.train))
    return kw


MIN_UNBOUNDED_CASCADES = 5


def default_cone_angle(focal: float) -> float:
    """Cone angle of an unbounded scene: two pixels' angular size, 2 / focal (a step no finer than two pixels'
    footprint at its distance), clamped to [1/256, 1/50]: never finer than Instant-NGP's 1/256 (large images, where
    1/256 spans several pixels), never coarser than 1/50 (tiny images, where two pixels are a wide angle)."""
    return float(min(max(MIN_CONE_ANGLE, CONE_PIXELS / focal), MAX_CONE_ANGLE))


def default_cascades(far: float, bound: float) -> int:
    """Cascades of an unbounded scene: the outermost box (half-size bound 2^(K-1)) reaches the data's far distance
    (from the cameras, which lie within the first box), at least MIN_UNBOUNDED_CASCADES (half-size 16: the sparse
    points rarely include the distant surroundings), at most 8."""
    need = math.ceil(math.log2(max(far / bound, 1.0))) + 1
    return int(min(max(need, MIN_UNBOUNDED_CASCADES), 8))


def wanted_rays(rays: int, samples: float, marched: float, sample_budget: int, march_budget=None) -> float:
    """The occupancy sampler's next ray count, before rounding and clamping (``Trainer.clamp_rays``): Instant-NGP's
    ``rays * sample_budget / samples`` for the step's ``rays`` that trained ``samples`` samples, and, when the samples
    are culled (``march_budget`` not None), at most ``rays * march_budget / marched``: the density-only pass
    evaluates every marched sample.

    >>> wanted_rays(100, 20_000, 20_000, 32_768), wanted_rays(100, 2_000, 40_000, 32_768, march_budget=262_144)
    (163.84, 655.36)
    """
    want = rays * sample_budget / max(samples, 1.0)
    if march_budget is not None:
        want = min(want, rays * march_budget / max(marched, 1.0))
    return want


def distortion_loss(out, op: bool, spacing=None):
    """The distortion loss per ray of the model output ``out`` (packed samples or fixed ones); ``op``: the custom op,
    else its pure-TF version. ``spacing``: a function of the ray distances applied to the packed samples' interval
    ends first (the unbounded model's ``HashNeRF.spacing``)."""
    import tf_metal_ops  # here, not at the top: the MLP model trains without loading the package's op library

    if "row_splits" in out:
        fn = tf_metal_ops.distortion_loss_packed if op else tf_metal_ops.distortion_loss_packed_tf
        t0, t1 = out["t_starts"], out["t_ends"]
        if spacing is not None:
            t0, t1 = spaced_intervals(spacing, t0, t1)
        return fn(out["weights"], t0, t1, out["row_splits"])
    return (tf_metal_ops.distortion_loss if op else tf_metal_ops.distortion_loss_tf)(out["weights"], out["edges"])


def spaced_intervals(spacing, t0, t1):
    """``spacing`` of packed intervals ``[t0, t1]`` ([N] each), keeping them sorted and non-overlapping: an interval
    that starts where the previous one ends takes that end's value (a float32 function evaluated at two places of a
    tensor may round the same input differently, e.g. in vectorised and scalar loops)."""
    s0, s1 = spacing(t0), spacing(t1)
    prev_t1 = tf.concat([tf.constant([-1.0], t1.dtype), t1[:-1]], 0)
    prev_s1 = tf.concat([tf.zeros([1], s1.dtype), s1[:-1]], 0)
    s0 = tf.where(tf.equal(t0, prev_t1), prev_s1, s0)
    return s0, tf.maximum(s1, s0)


def mark_unseen_cells(grid, dataset):
    """Marks the occupancy cells no training camera sees as never occupied (``OccupancyGrid.mark_unseen``): each
    view's pinhole part, widened by the margin its distortion needs (the pinhole projection of its border pixels'
    rays). Cameras whose border rays look sideways or backwards (wide fisheyes, panoramas) leave every cell seen."""
    from nerf.data.cameras import Camera

    views = dataset.train
    H, W = dataset.H, dataset.W
    cams = views.cameras if views.cameras is not None else [Camera.pinhole(W, H, dataset.focal, dataset.focal,
                                                                           W / 2, H / 2)] * len(views)
    margin = 0.0
    for cam in set(cams):
        if cam.is_pinhole:
            continue
        u = np.concatenate([np.arange(W) + 0.5, np.full(H, 0.5), np.arange(W) + 0.5, np.full(H, W - 0.5)])
        v = np.concatenate([np.full(W, 0.5), np.arange(H) + 0.5, np.full(W, H - 0.5), np.arange(H) + 0.5])
        d, ok = cam.directions(u, v)
        d = d[ok]
        if len(d) == 0 or np.any(-d[:, 2] < 0.2):  # beyond ~78° off axis: a pinhole frustum does not bound it
            return None
        pu = cam.cx + cam.fx * d[:, 0] / -d[:, 2]
        pv = cam.cy - cam.fy * d[:, 1] / -d[:, 2]
        margin = max(margin, float(np.max(np.maximum(-pu, pu - W))) / W, float(np.max(np.maximum(-pv, pv - H))) / H)
    intr = np.array([c.intrinsics for c in cams])
    return grid.mark_unseen(views.poses, intr, W, H, margin=max(margin, 0.0) + 0.02)


class Trainer:
    """The model, its optimisers and training state, and one synchronous training step at a time (:meth:`step`).

    ``args`` is the run's :class:`~nerf.config.TrainConfig`; ``cluster`` the ``nerf.distributed.Cluster`` of
    --strategy multiworker (None otherwise)."""

    def __init__(self, args: TrainConfig, dataset, strategy=None, cluster=None):
        self.args, self.ds = args, dataset
        self.cluster = cluster
        self.is_chief = cluster is None or cluster.is_chief
        self.strategy = strategy if strategy is not None else make_strategy(args)
        n_rep = self.strategy.num_replicas_in_sync
        if args.batch_rays % n_rep:
            raise SystemExit(f"error: --batch-rays {args.batch_rays} is not a multiple of the {n_rep} replicas")
        self.occupancy = args.sampler == "occupancy"
        self.culls = self.occupancy and (args.early_stop > 0 or args.alpha_threshold > 0)
        self._load_rays(dataset)
        self._build_model(model_config(args, dataset))
        if self.occupancy:
            mark_unseen_cells(self.model.grid, dataset)
        self._make_state()
        self.grid_log = []  # occupancy sampler: per grid update, its step, seconds and (optionally) a digest
        self.last_rays, self.last_samples = args.batch_rays, args.batch_rays * args.samples
        self.last_marched = self.last_samples
        self.lr_start = [(self.opt, args.lr)] + ([(self.opt_table, args.lr_table)] if self.opt_table else [])
        uses_custom_ops = args.model == "hash" and args.impl == "op"
        if self.occupancy and args.jit == "on":
            raise SystemExit("error: --jit on: the occupancy sampler's ragged batches do not compile with XLA")
        self.jit = args.jit == "on" or (args.jit == "auto" and not uses_custom_ops and not self.occupancy)
        self._make_step_functions()

    # ---- construction ---------------------------------------------------------------------------------------
    def _load_rays(self, dataset):
        """The training rays, made per batch from the training images' pixels (:mod:`nerf.data.pixel_rays`)."""
        from nerf.data.pixel_rays import PixelRays

        self.pixel_rays = PixelRays(dataset.train, dataset.focal)
        self.n_rays = self.pixel_rays.n
        self.ray_sh = self.args.model == "hash"
        self.ray_columns = RAY_COLUMNS + (SH_COLUMNS if self.ray_sh else 0)
        self.appearance_ids = self.args.appearance_dim > 0

    def _build_model(self, kw):
        args = self.args
        extra = {}
        if self.occupancy:  # outside the strategy scope: one plain copy per worker (see update_grid)
            extra["grid"] = models.make_occupancy_grid(kw["bound"], args.grid_res, args.grid_warmup,
                                                       kw.get("cascades", 1))
        with self.strategy.scope():
            keras.utils.set_random_seed(args.seed)
            self.model = models.build_model(args.model, **kw, **extra)
            self.model.world_to_scene = self.ds.world_to_scene  # the data's world → the frame it trains in
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
        self._choose_table_gradient()

    def _choose_table_gradient(self):
        """--table-grad: how replicas aggregate the table's gradient. ``allreduce``: the dense table gradient (one
        float32 per entry). ``gather``: every replica all-gathers all replicas' sample positions and per-sample
        feature gradients (``D + L*F`` float32 per sample) and computes the global table gradient itself (the same
        gradient, from the same inputs in the same order: identical on every replica). ``auto``: gather when a
        step's samples carry fewer values than the table (the occupancy sampler's budget by default), with several
        replicas. Sets ``allreduce_bytes`` (all-reduced per step) and ``allgather_bytes`` (all-gathered per step at
        the step's nominal sample count, all replicas together)."""
        args = self.args
        nbytes = lambda vs: int(sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize for v in vs))  # noqa: E731
        table_values = int(sum(np.prod(v.shape) for v in self.table_vars))
        samples = args.sample_budget if self.occupancy else args.batch_rays * args.samples
        per_sample = 3 + args.levels * args.features
        if args.table_grad == "auto":
            self.gather_table_grad = bool(self.table_vars) and self.strategy.num_replicas_in_sync > 1 and (
                samples * per_sample < table_values)
        else:
            if args.table_grad == "gather" and not self.table_vars:
                raise SystemExit("error: --table-grad gather needs --model hash")
            self.gather_table_grad = args.table_grad == "gather"
        if self.gather_table_grad:
            self.allreduce_bytes = nbytes(self.mlp_vars)
            self.allgather_bytes = samples * per_sample * 4
        else:
            self.allreduce_bytes, self.allgather_bytes = nbytes(self.mlp_vars + self.table_vars), 0

    def _make_state(self):
        """The training state beside the model and optimisers (see the module's conventions)."""
        self.state_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.state_train_s = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="train_seconds")
        self.state_seed = tf.Variable(self.args.seed, dtype=tf.int64, trainable=False, name="data_seed")
        if self.occupancy:
            # variable batches: the position in the ray stream (epoch * n_rays + offset) and the current ray count
            # are state (a pure function of the measured samples per ray, not of the step number)
            diag = 2.0 * math.sqrt(3.0) * self.model.cfg["bound"]
            r0 = self.args.sample_budget * 2.0 * self.model.cfg["step_size"] / diag  # all cells occupied: ~diag/2
            self.state_rays_pos = tf.Variable(0, dtype=tf.int64, trainable=False, name="rays_position")
            self.state_rays = tf.Variable(self.clamp_rays(r0), dtype=tf.int64, trainable=False, name="rays_per_step")

    def state(self) -> dict:
        """The training state by checkpoint key (``tf.train.Checkpoint(**trainer.state())``)."""
        parts = dict(model=self.model, optimizer=self.opt, step=self.state_step, train_seconds=self.state_train_s,
                     data_seed=self.state_seed)
        if self.opt_table is not None:
            parts["optimizer_table"] = self.opt_table
        if self.occupancy:
            parts.update(occupancy_grid=self.model.grid, rays_position=self.state_rays_pos,
                         rays_per_step=self.state_rays)
        return parts

    def state_variables(self) -> list:
        """Every variable of :meth:`state`, in an order every worker shares (for the broadcast from the chief)."""
        vs = list(self.model.variables) + list(self.opt.variables)
        if self.opt_table is not None:
            vs += list(self.opt_table.variables)
        vs += [self.state_step, self.state_train_s, self.state_seed]
        if self.occupancy:  # the grid (a tf.Module beside the Keras weights) and the ray-stream position
            grid = self.model.grid
            vs += [grid.density, grid.bits, grid.step, self.state_rays_pos, self.state_rays]
        return vs

    def _make_step_functions(self):
        if self.strategy.num_replicas_in_sync == 1:
            # one trace for every batch size (the occupancy sampler's ray count changes from step to step)
            sig = [tf.TensorSpec([None, self.ray_columns], tf.float32), tf.TensorSpec([], tf.int64),
                   tf.TensorSpec([1], tf.float32), tf.TensorSpec([], tf.float32)]
            self._step_fn = tf.function(self._global_step, input_signature=sig, jit_compile=self.jit)
        else:
            # per-replica batches of a varying size: after the first sizes, one trace with unknown sizes
            self._step_fn = tf.function(self._global_step, reduce_retracing=True)
        self._grad_fn = tf.function(self._global_gradients, reduce_retracing=True)
        self._grid_fn = self._grid_broadcast_fn = None
        if self.occupancy:
            update = self._grid_update
            if self.cluster is not None and self.args.grid_sync == "shard":
                update = self._grid_update_sharded
            self._grid_fn = tf.function(update, input_signature=[tf.TensorSpec([], tf.int64)])
            if self.cluster is not None and self.cluster.n_workers > 1 and self.args.grid_sync == "broadcast":
                grid = self.model.grid
                self._grid_broadcast_fn = make_broadcast(self.strategy, [grid.density, grid.bits, grid.step])

    # ---- the step (graph functions) -------------------------------------------------------------------------
    def _replica_seed(self, step_no):
        """(replica id, sample-jitter seed) of this replica at step ``step_no``."""
        rid = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.int64)
        return rid, tf.stack([tf.constant(self.args.seed, tf.int64), step_no * 4096 + rid])

    def _replica_grads(self, o, d, y, view_sh, ids, seed, n_global, summands=()):
        """The replica's share of the global loss (sums over its rays divided by the global ray count ``n_global``,
        see the module's conventions) and the global batch's gradient, aggregated across replicas: MLP variables
        all-reduced; the table's all-reduced, or (``self.gather_table_grad``) computed on every replica from the
        all-gathered sample positions and per-sample feature gradients of all replicas. ``ids``: the rays' training
        images (appearance embedding) or None. ``summands(mse, out)``
        (optional): float32 tensors summed over the replicas in the same collective. Returns (mse, model output,
        gradients, summed summands)."""
        dist_w = float(self.args.distortion)
        with tf.GradientTape() as tape:
            extra = {} if view_sh is None else dict(view_sh=view_sh)
            if ids is not None:
                extra["appearance_ids"] = ids
            out = self.model(o, d, training=True, jitter_seed=seed, **extra)
            mse = tf.reduce_sum(tf.square(out["color"] - y)) / (3.0 * n_global)  # mean over global rays, RGB
            loss = mse
            if dist_w > 0:
                spacing = self.model.spacing if getattr(self.model, "unbounded", False) else None
                loss = loss + dist_w * tf.reduce_sum(distortion_loss(out, self.args.impl == "op", spacing)) / n_global
        wrt = self.mlp_vars + ([out["features"]] if self.gather_table_grad else self.table_vars)
        grads = tape.gradient(loss, wrt)
        sums = list(summands(mse, out)) if summands else []
        n_mlp = len(self.mlp_vars)
        if self.strategy.num_replicas_in_sync > 1:
            if self.gather_table_grad:
                # one all-gather per step: [positions | feature gradients] per sample (replica order = the global
                # batch's sample order) with the MLP gradients and the summands in each replica's header
                fm = self.model.encoding.feature_major  # features [L*F, M]: gathered as rows [M, L*F]
                feat_grad = tf.transpose(grads[-1]) if fm else grads[-1]
                rows, summed = gather_rows_and_sum(tf.concat([out["positions"], feat_grad], axis=1),
                                                   grads[:n_mlp] + sums)
                d = int(out["positions"].shape[1])
                feat_grad = tf.transpose(rows[:, d:]) if fm else rows[:, d:]
                grads = summed[:n_mlp] + [self.model.encoding.table_gradient(rows[:, :d], feat_grad)]
            else:
                summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads + sums)
                grads = summed[:len(grads)]
            sums = summed[len(summed) - len(sums):] if sums else []
        elif self.gather_table_grad:
            grads = grads[:-1] + [self.model.encoding.table_gradient(out["positions"], grads[-1])]
        return mse, out, grads, sums

    def _replica_step(self, o, d, y, view_sh, ids, seed, n_global, summands):
        mse, out, grads, sums = self._replica_grads(o, d, y, view_sh, ids, seed, n_global, summands)
        fused_adam.apply(self.opt, grads[:len(self.mlp_vars)], self.mlp_vars)
        if self.table_vars:
            fused_adam.apply(self.opt_table, grads[len(self.mlp_vars):], self.table_vars)
        return sums

    def _global_step(self, idx, step_no, ctrl, n_global):
        """One synchronous step on the replicas' shares of the global batch (``n_global`` rays in all).
        Returns [mean loss, *ctrl of replica 0, samples and marched samples of all replicas] on every worker,
        summed in the step's one collective: ``ctrl`` carries the chief's clock so all workers take the same
        learning rate, stop and checkpoint decisions."""

        def per_replica(i, ctrl):
            rid, seed = self._replica_seed(step_no)
            first = tf.cast(tf.equal(rid, 0), tf.float32)

            def summands(mse, out):
                n = tf.shape(out["weights"])[0] if "row_splits" in out else tf.size(out["weights"])
                counts = tf.cast(tf.stack([n, out.get("n_marched", n)]), tf.float32)
                return [tf.concat([tf.reshape(mse, [1]), ctrl * first, counts], 0)]

            return self._replica_step(*self.batch(i), seed, n_global, summands)[0]

        per = self.strategy.run(per_replica, args=(idx, ctrl))  # summed already: every replica holds the same
        return self.strategy.experimental_local_results(per)[0]

    def _global_gradients(self, idx, step_no, n_global):
        def per_replica(i):
            return self._replica_grads(*self.batch(i), self._replica_seed(step_no)[1], n_global)[2]

        per = self.strategy.run(per_replica, args=(idx,))  # aggregated already: every replica holds the same
        return [self.strategy.experimental_local_results(g)[0] for g in per]

    def _grid_update(self, step_no, evaluate=None):
        return self.model.update_grid(step=step_no, seed=tf.constant(self.args.seed, tf.int64) * 1000003 + step_no,
                                      evaluate=evaluate)

    def _grid_update_sharded(self, step_no):
        """--grid-sync shard (multiworker: one replica per worker): every worker picks the same cells, evaluates
        the density at its share of them, and one all-gather gives every worker all of them."""
        per = self.strategy.run(lambda s: self._grid_update(s, evaluate=gather_evaluations), args=(step_no,))
        return self.strategy.experimental_local_results(per)[0]

    def batch(self, rows):
        """Ray rows of the step (:meth:`ray_rows`) -> origins, unit directions, colours, view-direction SH (None for
        the MLP model), training-image indices (int32; None without an appearance embedding)."""
        sh = rows[:, 9:9 + SH_COLUMNS] if self.ray_sh else None
        ids = tf.cast(rows[:, -1], tf.int32) if self.appearance_ids else None
        return rows[:, 0:3], rows[:, 3:6], rows[:, 6:9], sh, ids

    # ---- the step (eager) -----------------------------------------------------------------------------------
    def step(self, step_no, ctrl=0.0):
        """Runs training step ``step_no`` (0-based) on its global batch; returns (loss, ctrl of the chief)."""
        if self.occupancy:
            if step_no % self.args.grid_every == 0:
                self.update_grid(step_no)
            idx = self.next_rays()
        else:
            idx = self.batch_indices(step_no)
        rows = self.ray_rows(idx)
        n_rays = len(rows)
        out = self._step_fn(self.distribute_rays(rows), tf.constant(step_no, tf.int64),
                            tf.constant([ctrl], tf.float32), tf.constant(n_rays, tf.float32)).numpy()
        self.last_rays, self.last_samples, self.last_marched = n_rays, float(out[2]), float(out[3])
        if self.occupancy:  # Instant-NGP: scale the ray count by budget / measured (kept) samples
            self.state_rays.assign(self.clamp_rays(wanted_rays(
                self.last_rays, self.last_samples, self.last_marched, self.args.sample_budget,
                self.args.march_budget if self.culls else None)))
        return float(out[0]), float(out[1])

    def gradients(self, idx, step_no):
        """The all-reduced gradient (MLP variables, then the table) of the global batch ``idx`` at step
        ``step_no``, without applying it (for checking the loss normalisation against one process)."""
        rows = self.ray_rows(idx)
        g = self._grad_fn(self.distribute_rays(rows), tf.constant(step_no, tf.int64),
                          tf.constant(len(rows), tf.float32))
        return [x.numpy() for x in g]

    def ray_rows(self, idx):
        """Global ray (pixel) indices -> ``[M, ray_columns]`` float32 rows (see ``RAY_COLUMNS``) of those with a ray
        and not masked out, ``M`` cut to a multiple of the replica count (equal shards)."""
        o, d, rgb, view = self.pixel_rays.rays(idx)
        cols = [o, d, rgb]
        if self.ray_sh:  # eagerly, outside the step function
            cols.append(models.sh_encoding_deg4(tf.constant(d)).numpy())
        rows = np.concatenate(cols + [view[:, None].astype(np.float32)], axis=1)
        n_rep = self.strategy.num_replicas_in_sync
        return rows[:len(rows) // n_rep * n_rep]

    def distribute_rays(self, rows):
        """Ray rows -> the step functions' argument: replica r of n takes the r-th of n equal slices."""
        n_rep = self.strategy.num_replicas_in_sync
        if n_rep == 1:
            return tf.constant(rows)
        per = len(rows) // n_rep
        return self.strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(rows[ctx.replica_id_in_sync_group * per:(ctx.replica_id_in_sync_group + 1) * per]))

    def update_grid(self, step_no):
        """The occupancy-grid update of step ``step_no``, identical on every worker: each worker computes it from
        its (identical) weights with the same seed, evaluating the density at its share of the cells (--grid-sync
        shard) or at all of them (replicate), or the chief computes it and the others take its grid (broadcast).
        Records the update's seconds and, with --save-worker-weights, a digest of the grid it produced."""
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

    def set_progress(self, fraction):
        """Learning rates for ``fraction`` ∈ [0, 1] of the budget: start · decay^fraction."""
        factor = self.args.lr_decay ** min(max(fraction, 0.0), 1.0)
        for opt, lr in self.lr_start:
            opt.learning_rate = lr * factor

    # ---- rays per step ----------------------------------------------------------------------------------------
    def _epoch_rays(self, epoch, start, count):
        """Rays ``start .. start + count`` of epoch ``epoch``'s order (a permutation seeded by (data seed, epoch))."""
        from nerf.data.pixel_rays import shuffled

        return shuffled(np.arange(start, start + count), self.n_rays, [int(self.state_seed.numpy()), epoch])

    def batch_indices(self, step_no):
        """Uniform sampler: ray indices of global batch ``step_no`` (``batch_rays`` rays, see the conventions)."""
        b = self.args.batch_rays
        epoch, k = divmod(int(step_no), self.n_rays // b)
        return self._epoch_rays(epoch, k * b, b)

    def next_rays(self):
        """Occupancy sampler: the next ``rays_per_step`` rays of the stream of epochs (the position in it is
        state, see the conventions)."""
        r = int(self.state_rays.numpy())
        epoch, k = divmod(int(self.state_rays_pos.numpy()), self.n_rays)
        if k + r > self.n_rays:
            epoch, k = epoch + 1, 0
        self.state_rays_pos.assign(epoch * self.n_rays + k + r)
        return self._epoch_rays(epoch, k, r)

    def clamp_rays(self, r):
        """Rays per step for ``r`` wanted: a multiple of RAY_GRANULARITY and of the replica count (equal shards), in
        [MIN_RAYS, sample_budget / 2] and at most the training set."""
        b, g = self.args.sample_budget, math.lcm(RAY_GRANULARITY, self.strategy.num_replicas_in_sync)
        lo = -(-MIN_RAYS // g) * g
        hi = max(lo, b // 2 // g * g)
        return int(min(max(round(r / g) * g, lo), hi, self.n_rays // g * g))

    # ---- progress ---------------------------------------------------------------------------------------------
    def trace_count(self):
        """Traces of the train-step function so far (1 after the first step when nothing retraces)."""
        return self._step_fn.experimental_get_tracing_count()

    def epochs_done(self, step_no):
        """Passes over the training rays after ``step_no`` steps."""
        if self.occupancy:
            return int(self.state_rays_pos.numpy()) / self.n_rays
        return step_no * self.args.batch_rays / self.n_rays
