"""Checkpoints of a :class:`~nerf.trainer.Trainer`'s state in ``OUT/checkpoints``, the resume from the latest one, the
per-worker weight files of --save-worker-weights and the final model in ``OUT/model``.

Conventions:

* ``OUT/checkpoints/ckpt-<step>`` (TensorFlow's ``CheckpointManager``: written under temporary names, then renamed,
  so a killed save leaves no half checkpoint) and ``OUT/checkpoints/run_config.json``, the :data:`RESUME_KEYS`
  of the run that wrote the first checkpoint. A run with the same ``--out`` resumes from the latest checkpoint and
  refuses to when those settings differ.
* Only the chief reads and keeps checkpoints; the other workers take the chief's state by broadcast. They save too
  (MultiWorkerMirroredStrategy may need every worker in a save), into ``OUT/checkpoints/worker-temp-<rank>``,
  deleted after each save.
"""

from __future__ import annotations

import json
import math
import os
import shutil

import imageio.v3 as iio
import numpy as np
import tensorflow as tf

from nerf import models
from nerf.collectives import make_broadcast
from nerf.data.cameras import Camera
from nerf.data.rays import spherical_pose
from nerf.metrics import write_json_atomic
from nerf.trainer import Trainer

# Settings a resumed run must share with the run that wrote the checkpoint (weights shapes, data order, samples).
RESUME_KEYS = ("data", "model", "impl", "samples", "batch_rays", "levels", "features", "log2_table", "base_res",
               "finest_res", "bound", "seed", "scene_seed", "scene_res", "scene_ss", "background", "downscale",
               "split", "holdout_every",
               "no_jitter", "minutes", "epochs", "steps", "lr", "lr_table", "lr_decay", "distortion", "sampler",
               "sample_budget", "grid_res", "grid_every", "grid_warmup", "step_size", "max_samples", "early_stop",
               "alpha_threshold", "march_budget", "scene", "cascades", "cone_angle", "appearance_dim", "mlp")
# The value of a setting that an older run_config.json lacks, as the version that wrote it ran (Keras layers before
# --mlp existed). A setting with no entry here that the file lacks is not compared (named in a note).
LEGACY_SETTINGS = {"mlp": "keras"}


class Checkpoints:
    """The checkpoints of ``trainer``'s state (``manager`` is None when --checkpoint-every disables them)."""

    def __init__(self, trainer: Trainer):
        self.tr, self.cfg = trainer, trainer.args
        self.enabled = bool(self.cfg.ckpt_steps or self.cfg.ckpt_seconds)
        self.chief_dir = os.path.join(self.cfg.out, "checkpoints")
        self.ckpt = tf.train.Checkpoint(**trainer.state())
        self.manager = None

    def directory(self):
        """Where this worker saves: the chief OUT/checkpoints, another worker its temporary directory."""
        if self.tr.is_chief:
            return self.chief_dir
        return os.path.join(self.chief_dir, f"worker-temp-{self.tr.cluster.rank}")

    def restore(self):
        """Creates the manager; on the chief, checks that a resumed run has the same settings and restores the
        latest checkpoint; then (several workers) the chief's state is broadcast to everyone, so the other workers
        need no copy of the checkpoint files. Returns a description of what was restored, or None."""
        if self.enabled and self.tr.is_chief:
            self._remove_leftovers()
        if self.enabled:
            self.manager = tf.train.CheckpointManager(self.ckpt, self.directory(),
                                                      max_to_keep=max(1, self.cfg.keep_checkpoints))
        latest = None
        if self.tr.is_chief:
            latest = tf.train.latest_checkpoint(self.chief_dir) if os.path.isdir(self.chief_dir) else None
            cfg_path = os.path.join(self.chief_dir, "run_config.json")
            if latest is None and self.manager is not None:
                write_json_atomic(cfg_path, {k: getattr(self.cfg, k) for k in RESUME_KEYS})
            if latest is not None and os.path.exists(cfg_path):
                self._check_same_settings(latest, cfg_path)
            if latest is not None:
                self.ckpt.restore(latest).assert_existing_objects_matched()
        cluster = self.tr.cluster
        if cluster is not None and cluster.n_workers > 1:
            make_broadcast(self.tr.strategy, self.tr.state_variables())()
            if not self.tr.is_chief and int(self.tr.state_step.numpy()) > 0:
                latest = "the chief's checkpoint"
        return latest

    def _remove_leftovers(self):
        """Files of a save that was killed midway (never referenced by the checkpoint state file)."""
        os.makedirs(self.chief_dir, exist_ok=True)
        for name in os.listdir(self.chief_dir):
            if name.endswith("_temp") or name.startswith("worker-temp-") or ".tmp" in name:
                path = os.path.join(self.chief_dir, name)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)

    def _check_same_settings(self, latest, cfg_path):
        with open(cfg_path) as f:
            saved = json.load(f)
        diff, unchecked = {}, []
        for k in RESUME_KEYS:
            now = json.loads(json.dumps(getattr(self.cfg, k)))
            if k not in saved and k not in LEGACY_SETTINGS:
                unchecked.append(k)
                continue
            was = saved[k] if k in saved else LEGACY_SETTINGS[k]
            if now != was:
                diff[k] = (was, now)
        if unchecked:
            print(f"note: {cfg_path} predates the settings {', '.join(unchecked)}: this run uses today's values")
        if diff:
            raise SystemExit("error: cannot resume " + latest + ": these settings differ from the run that "
                             "wrote it (checkpoint, now): " + ", ".join(
                                 f"{k} {a!r} vs {b!r}" for k, (a, b) in diff.items())
                             + "; use another --out for a new run")

    def save(self, step_no, train_s):
        """Saves the state after ``step_no`` steps and ``train_s`` seconds of (the chief's) training; returns the
        checkpoint's path."""
        self.tr.state_step.assign(step_no)
        self.tr.state_train_s.assign(train_s)
        if self.tr.is_chief:
            return self.manager.save(checkpoint_number=step_no)
        manager = tf.train.CheckpointManager(self.ckpt, self.directory(), max_to_keep=1)
        path = manager.save(checkpoint_number=step_no)
        shutil.rmtree(self.directory(), ignore_errors=True)
        return path

    def save_worker_weights(self, rank):
        """--save-worker-weights: OUT/workers/rank-<rank>.npz (the final weights) and, occupancy sampler,
        rank-<rank>-grid.npz (the final grid) and rank-<rank>-grid-updates.json (the digest of the grid after each
        update of this process); each written to a temporary name, then renamed."""
        tr, workers = self.tr, os.path.join(self.cfg.out, "workers")
        os.makedirs(workers, exist_ok=True)
        _savez_atomic(os.path.join(workers, f"rank-{rank}.npz"), *tr.model.get_weights())
        if tr.occupancy:
            grid = tr.model.grid
            _savez_atomic(os.path.join(workers, f"rank-{rank}-grid.npz"), density=grid.density.numpy(),
                          bits=grid.bits.numpy(), step=grid.step.numpy())
            write_json_atomic(os.path.join(workers, f"rank-{rank}-grid-updates.json"), tr.grid_log)

    def export_model(self):
        """Saves the model to OUT/model, reloads it and renders a novel view (a camera of none of the splits) with
        both; writes the reloaded model's to OUT/renders/novel_view.png and returns the largest difference."""
        model, ds, out = self.tr.model, self.tr.ds, self.cfg.out
        model_dir = os.path.join(out, "model")
        models.save_model(model, model_dir, world_to_scene=ds.world_to_scene)
        reloaded = models.load_model(model_dir)
        novel = spherical_pose(float(np.linalg.norm(ds.test.poses[0][:3, 3])), 0.123, math.radians(42.0))
        f = 1.0 if self.cfg.final_views != 0 else min(1.0, NOVEL_THUMBNAIL / max(ds.H, ds.W))
        H, W = max(1, round(ds.H * f)), max(1, round(ds.W * f))
        cam = Camera.pinhole(W, H, ds.focal * f, ds.focal * f, W / 2, H / 2)
        rgb_a, _, _ = models.render_image(model, cam, novel, frame="scene")
        rgb_b, _, _ = models.render_image(reloaded, cam, novel, frame="scene")
        iio.imwrite(os.path.join(out, "renders", "novel_view.png"), (rgb_b * 255).round().astype(np.uint8))
        return float(np.max(np.abs(rgb_a - rgb_b)))


NOVEL_THUMBNAIL = 64  # --final-views 0: the novel view's longer side (pixels)


def _savez_atomic(path, *arrays, **named):
    np.savez(path + ".tmp.npz", *arrays, **named)
    os.replace(path + ".tmp.npz", path)
