#!/usr/bin/env python
"""Train a NeRF on the built-in scene (or real data) with tf-metal-ops.

    python examples/nerf/train.py --quick                       # hash-grid model, ~3 minutes on 2 CPU cores
    python examples/nerf/train.py --model mlp --minutes 10      # the keras.io-style baseline
    python examples/nerf/train.py --data lego/ --downscale 8    # a NeRF-synthetic folder (or a tiny_nerf .npz)
    python examples/nerf/train.py --data garden/ --downscale 4  # a COLMAP or nerfstudio/instant-ngp capture
                                                                # (unbounded: --scene, --cascades, --cone-angle)

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

This file is the loop. Beside it: ``config.py`` (the flags -> a frozen ``TrainConfig``), ``trainer.py`` (the model,
the step, the rays of each step), ``checkpoints.py`` (checkpoints, resume, the saved model) and ``metrics.py``
(evaluations, ``metrics.json``, the progress bar, the plot).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # examples/ → `import nerf`

# No TensorFlow import at the top (see run()); train.parse_args is the config's, for the tests and benchmarks.
from nerf.config import TrainConfig, parse_args  # noqa: E402, F401
from nerf.data import DatasetError, load_dataset  # noqa: E402
from nerf.distributed import ClusterConfigError, read_tf_config  # noqa: E402


def __getattr__(name):
    """``train.Trainer`` (the tests and benchmarks build one) without importing TensorFlow with this module."""
    if name == "Trainer":
        from nerf.trainer import Trainer

        return Trainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def read_cluster(cfg: TrainConfig):
    """--strategy multiworker: the cluster in TF_CONFIG (``nerf.distributed.Cluster``), checked before TensorFlow
    starts, so that a bad TF_CONFIG is one clear line (exit code 2), not a hang or a gRPC trace. Otherwise None."""
    if cfg.strategy != "multiworker":
        return None
    try:
        return read_tf_config()
    except ClusterConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)


def start_strategy(cfg: TrainConfig, cluster):
    """Sets up TensorFlow for the strategy before any other TensorFlow op runs: creates the multi-worker strategy
    (returned; None otherwise), or splits the CPU into --replicas logical devices for --strategy mirrored without
    GPUs. Returns (config, strategy); a worker other than the chief shows no progress bar."""
    import tensorflow as tf  # here: the flags and TF_CONFIG are checked before TensorFlow loads

    strategy = None
    if cluster is not None:
        comm = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=comm)
        print(f"{cluster.name} (rank {cluster.rank} of {cluster.n_workers}{', chief' if cluster.is_chief else ''}) "
              f"at {cluster.my_address}: cluster up", flush=True)
        if not cluster.is_chief:
            cfg = dataclasses.replace(cfg, no_progress=True)
    if cfg.strategy == "mirrored" and not tf.config.list_physical_devices("GPU") and cfg.replicas > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * cfg.replicas)
    return cfg, strategy


def load_data(cfg: TrainConfig):
    """The dataset of --data; a dataset error is one line (exit code 2)."""
    try:
        if cfg.data == "builtin":
            scene = dict(H=cfg.scene_res, W=cfg.scene_res)
            if cfg.scene_ss is not None:
                scene["ss"] = cfg.scene_ss
            return load_dataset("builtin", background=cfg.background_rgb, seed=cfg.scene_seed, verbose=True, **scene)
        held = {k: v for k, v in (("split_file", cfg.split), ("holdout_every", cfg.holdout_every)) if v is not None}
        return load_dataset(cfg.data, background=cfg.background_rgb, downscale_factor=cfg.downscale, **held)
    except DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)


def describe(cfg: TrainConfig, tr, multi):
    """The line that names the model, its sampling, the XLA choice and the replicas."""
    mc = tr.model.cfg
    sampling = (f"occupancy sampler ({cfg.grid_res}^3 grid"
                + (f" x {mc['cascades']} cascades" if mc.get("cascades", 1) > 1 else "")
                + f", step {mc['step_size']:.4g}"
                + (f", cone angle {mc['cone_angle']:.4g}" if mc.get("cone_angle") else "") + "), "
                + (f"unbounded (contracted beyond [-{mc['bound']:g}, {mc['bound']:g}]^3), " if mc.get("unbounded")
                   else "")
                + (f"appearance {mc['appearance_dim']}-d, " if mc.get("appearance_dim") else "")
                + (f"distortion {cfg.distortion:g}, " if cfg.distortion else "")
                + f"{cfg.sample_budget} samples/step" if tr.occupancy else
                f"{cfg.samples} samples/ray, {cfg.batch_rays} rays/step")
    return (f"model {cfg.model}{' (' + cfg.impl + ')' if cfg.model == 'hash' else ''}: {tr.n_params:,} parameters, "
            f"{sampling}, "
            f"XLA train step: {tr.jit and tr.strategy.num_replicas_in_sync == 1}, "
            f"replicas: {tr.strategy.num_replicas_in_sync}"
            + (f", all-reduced per step: {tr.allreduce_bytes:,} bytes" if multi else "")
            + (f", table gradient from all-gathered samples: ~{tr.allgather_bytes:,} bytes per step"
               if multi and tr.gather_table_grad else ""))


@dataclasses.dataclass(frozen=True)
class Budget:
    """When a run stops (``budget_s`` seconds of training or ``max_steps`` steps, whichever is set) and evaluates
    (every ``eval_every`` seconds of training, else every ``eval_every_steps`` steps)."""

    budget_s: float | None
    max_steps: int | None
    eval_every: float | None
    eval_every_steps: int | None

    @classmethod
    def of(cls, cfg: TrainConfig, n_rays):
        budget_s = cfg.minutes * 60 if cfg.minutes is not None else None
        max_steps = cfg.steps if cfg.steps is not None else (
            math.ceil(cfg.epochs * (n_rays / cfg.batch_rays)) if cfg.epochs is not None else None)
        eval_every = cfg.eval_every or (budget_s / 8 if budget_s else None)
        return cls(budget_s, max_steps, eval_every, None if eval_every else max(1, (max_steps or 1) // 8))

    def fraction(self, seconds, step):
        """The part of the budget done after ``step`` steps and ``seconds`` of training (the learning rates)."""
        return seconds / self.budget_s if self.budget_s is not None else step / self.max_steps

    def spent(self, seconds, step):
        return ((self.max_steps is not None and step >= self.max_steps) or
                (self.budget_s is not None and seconds >= self.budget_s))


class Clock:
    """Where a run is: steps done, this process's training seconds (``train_s``) and the chief's (``sync_s``, as
    every worker sees it: one step behind), and the step and seconds of the last evaluation and checkpoint.
    Evaluations go by ``train_s``; the learning rate, the budget and checkpoints by ``sync_s``, so that every
    worker takes the same decisions."""

    def __init__(self, step=0, train_s=0.0):
        self.step, self.train_s, self.sync_s = step, train_s, train_s
        self.eval_step, self.eval_s = step, train_s  # the last evaluation: its step and train_s
        self.ckpt_step, self.ckpt_s = step, train_s  # the last checkpoint: its step and sync_s


class Loop:
    """One process's run: the steps until the budget is spent, the evaluations (chief), the checkpoints, and the
    outputs at the end. ``tr``, ``ckpts`` and ``log`` are the run's ``nerf.trainer.Trainer``,
    ``nerf.checkpoints.Checkpoints`` and ``nerf.metrics.RunMetrics``."""

    def __init__(self, cfg: TrainConfig, tr, ckpts, log, cluster):
        self.cfg, self.tr, self.ckpts, self.log, self.cluster = cfg, tr, ckpts, log, cluster
        self.multi = cluster is not None
        self.is_chief = not self.multi or cluster.is_chief
        self.budget = Budget.of(cfg, tr.n_rays)
        self.clock = Clock()
        self.step0, self.compile_s, self.wall0, self.progress = 0, None, None, None

    def resume(self, restored):
        """Continues from the restored state (``restored``: what ``Checkpoints.restore`` returned)."""
        step, train_s = int(self.tr.state_step.numpy()), float(self.tr.state_train_s.numpy())
        print(f"resumed from {restored}: step {step}, {train_s:.1f} s of training", flush=True)
        self.log.resume(step, train_s, restored, read_file=self.is_chief)  # the history up to the checkpoint
        self.clock = Clock(step, train_s)

    def first_step(self):
        """The first step, before the clock starts (tracing and XLA compilation are not training time)."""
        c, tr = self.clock, self.tr
        self.step0 = c.step
        tr.set_progress(self.budget.fraction(c.train_s, c.step))
        t0 = time.perf_counter()
        loss, _ = tr.step(c.step, c.train_s)
        self.compile_s = time.perf_counter() - t0
        self.log.history.record(loss, tr)
        c.step += 1  # the last evaluation and checkpoint stay at step0
        self.wall0 = time.perf_counter()
        self.progress = self.log.progress(self.budget.max_steps, self.budget.budget_s, self.step0, c.train_s)

    def train(self):
        """Steps until the budget is spent; evaluates and checkpoints on the way."""
        c, tr, cfg, h = self.clock, self.tr, self.cfg, self.log.history
        while not self.budget.spent(c.sync_s, c.step):
            tr.set_progress(self.budget.fraction(c.sync_s, c.step))
            t = time.perf_counter()
            loss, chief_s = tr.step(c.step, c.train_s)  # the step returns numbers: it has finished, honest timing
            h.step_times.append(time.perf_counter() - t)
            c.train_s += h.step_times[-1]
            c.sync_s = chief_s if self.multi else c.train_s  # the chief's time before this step
            h.record(loss, tr)
            c.step += 1
            if not math.isfinite(loss):
                print(f"error: the loss became {loss} at step {c.step}", file=sys.stderr)
                raise SystemExit(1)
            self.progress.update(c.step, c.train_s, h, tr)
            b = self.budget
            if self.is_chief and ((b.eval_every and c.train_s - c.eval_s >= b.eval_every) or (
                    b.eval_every_steps and c.step - c.eval_step >= b.eval_every_steps)):
                self.evaluate()
                c.eval_s, c.eval_step = c.train_s, c.step
            if self.ckpts.manager is not None and (
                    (cfg.ckpt_steps and c.step - c.ckpt_step >= cfg.ckpt_steps) or
                    (cfg.ckpt_seconds and c.sync_s - c.ckpt_s >= cfg.ckpt_seconds)):
                self.checkpoint()
        self.progress.close()

    def evaluate(self, final=False):
        c = self.clock
        rec, msg = self.log.evaluate(c.step, c.train_s, self.wall0, c.step - c.eval_step, final=final)
        self.progress.write(msg)
        self.log.write()
        return rec

    def checkpoint(self):
        c = self.clock
        path = self.ckpts.save(c.step, c.train_s)
        c.ckpt_s, c.ckpt_step = c.sync_s, c.step
        if self.is_chief:
            self.log.write()
            self.progress.write(f"checkpoint {path} (step {c.step}, {c.train_s:.1f} s of training)")

    def finish(self, t_start):
        """The last checkpoint, the worker weights and, on the chief, the final evaluation, the plot and the saved
        model. Returns the metrics (another worker: its steps and losses)."""
        c, tr = self.clock, self.tr
        if self.ckpts.manager is not None and c.ckpt_step != c.step:
            self.checkpoint()
        if self.cfg.save_worker_weights:
            self.ckpts.save_worker_weights(self.cluster.rank if self.multi else 0)
        if not self.is_chief:
            print(f"done: {self.cluster.name} finished {c.step} steps in {c.train_s:.0f} s of training", flush=True)
            return {"final": dict(steps=c.step, train_seconds=c.train_s), "train_losses": self.log.history.losses}
        final = self.evaluate(final=True)
        self.log.plot()
        reload_diff = self.ckpts.export_model()
        print(self.log.finish(final, c.step, self.step0, c.train_s, self.compile_s, time.perf_counter() - t_start,
                              reload_diff), flush=True)
        return self.log.doc


def run(argv=None):
    """Trains as ``argv`` (default: the command line) says; returns the metrics.json document (a worker other than
    the chief: its steps and losses)."""
    cfg = parse_args(argv)
    cluster = read_cluster(cfg)
    t_start = time.perf_counter()
    ds = load_data(cfg)  # bad data stops here, before TensorFlow loads
    print(ds.summary(), flush=True)
    cfg, strategy = start_strategy(cfg, cluster)
    # The example's TensorFlow side loads only now, after the flags, TF_CONFIG and the data are checked and the
    # strategy exists.
    from nerf import checkpoints, metrics, trainer

    if cluster is None or cluster.is_chief:
        os.makedirs(os.path.join(cfg.out, "renders"), exist_ok=True)
    tr = trainer.Trainer(cfg, ds, strategy=strategy, cluster=cluster)
    print(describe(cfg, tr, cluster is not None), flush=True)
    ckpts = checkpoints.Checkpoints(tr)
    restored = ckpts.restore()
    loop = Loop(cfg, tr, ckpts, metrics.RunMetrics(cfg, ds, tr, cluster), cluster)
    if restored:
        loop.resume(restored)
    loop.first_step()
    loop.train()
    return loop.finish(t_start)


if __name__ == "__main__":
    run()
