"""What a ``train.py`` run reports: PSNR, the evaluations on test views, ``OUT/metrics.json``, the renders, the
progress bar or log lines, and the PSNR plot.

Conventions: ``metrics.json`` is rewritten whole (to a temporary name, then renamed) at each evaluation and
checkpoint, so a reader, or a resumed run, never sees half a file; its per-step series have one entry per step
done, and a resumed run keeps the first ``step`` entries of the file it resumes.
"""

from __future__ import annotations

import json
import math
import os
import time

import imageio.v3 as iio
import numpy as np
from tqdm import tqdm

from nerf.config import TrainConfig
from nerf.models import render_rays


def psnr(mse):
    return -10.0 * math.log10(max(float(mse), 1e-10))


def _db(value):
    return "n/a (--final-views 0)" if value is None else f"{value:.2f} dB"


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


def render_test_views(model, ds, n_views):
    """The first ``n_views`` test views (None: all) rendered by ``model`` -> (mean PSNR over each view's valid
    pixels: with a ray and not masked out, see ``Dataset.valid_pixels``, renders)."""
    test = ds.test
    n = len(test) if n_views is None else min(n_views, len(test))
    preds, psnrs = [], []
    for k in range(n):
        rgb, _, _ = render_rays(model, *ds.rays("test", k))
        preds.append(rgb)
        err = (rgb - test.image(k)) ** 2
        valid = ds.valid_pixels("test", k)
        psnrs.append(psnr(np.mean(err if valid is None else err[valid])))
    return float(np.mean(psnrs)), preds


class History:
    """The per-step series of a run: loss, samples per ray (trained), rays, samples per ray marched (before
    --early-stop) and, for the steps this process timed, seconds."""

    def __init__(self):
        self.losses, self.spr, self.rps, self.mpr = [], [], [], []
        self.step_times = []  # seconds of each timed step of this process (the first, compiling step excluded)

    def record(self, loss, tr):
        """Step done by ``tr`` (a ``nerf.trainer.Trainer``) with loss ``loss``."""
        self.losses.append(loss)
        self.spr.append(tr.last_samples / max(tr.last_rays, 1))
        self.rps.append(tr.last_rays)
        self.mpr.append(tr.last_marched / max(tr.last_rays, 1))

    def resume(self, old, step):
        """The first ``step`` entries of the series of ``old`` (a ``metrics.json`` document)."""
        self.losses = [float(v) for v in old.get("train_losses", [])][:step]
        self.spr = [float(v) for v in old.get("samples_per_ray", [])][:step]
        self.rps = [int(v) for v in old.get("rays_per_step", [])][:step]
        self.mpr = [float(v) for v in old.get("marched_per_ray", [])][:step]

    def recent_loss(self):
        """The mean loss of the last 50 steps (what the log and the evaluations call the train loss)."""
        return float(np.mean(self.losses[-50:]))

    def series(self):
        return dict(train_losses=[float(v) for v in self.losses],
                    samples_per_ray=[round(float(v), 3) for v in self.spr],
                    rays_per_step=[int(v) for v in self.rps],
                    marched_per_ray=[round(float(v), 3) for v in self.mpr],
                    step_seconds=[round(float(v), 5) for v in self.step_times])


class Progress:
    """The tqdm bar over the steps (a step cap) or the training seconds (a time budget), and the run's log lines:
    above the bar, or printed with --no-progress (no bar)."""

    def __init__(self, cfg: TrainConfig, max_steps, budget_s, step, train_s):
        self.quiet, self.max_steps, self.budget_s = cfg.no_progress, max_steps, budget_s
        self.bar = tqdm(total=max_steps if max_steps else round(budget_s), unit="step" if max_steps else "s",
                        disable=cfg.no_progress, dynamic_ncols=True, bar_format=None if max_steps else
                        "{l_bar}{bar}| {n:.0f}/{total:.0f}s [{elapsed}<{remaining}{postfix}]",
                        initial=step if max_steps else round(train_s))

    def write(self, msg):
        print(msg, flush=True) if self.quiet else self.bar.write(msg)

    def update(self, step, train_s, history: History, tr):
        """After step ``step`` of ``tr``: every 10th step with a time budget, every step with a step cap."""
        if step % 10 == 0 or self.max_steps:
            tl = history.recent_loss()
            self.bar.set_postfix(loss=f"{tl:.4f}", psnr=f"{psnr(tl):.2f}", epoch=f"{tr.epochs_done(step):.2f}",
                                 spr=f"{np.mean(history.spr[-10:]):.1f}", rays=history.rps[-1], refresh=False)
            if self.max_steps:
                self.bar.update(step - self.bar.n)
            else:
                self.bar.update(min(train_s, self.budget_s) - self.bar.n)

    def close(self):
        self.bar.close()


class RunMetrics:
    """``OUT/metrics.json`` of a run (``doc``): config, dataset, cluster, evaluations, resumes, per-step series and
    the final record; and the renders of each evaluation in ``OUT/renders``."""

    def __init__(self, cfg: TrainConfig, ds, tr, cluster=None):
        self.cfg, self.ds, self.tr = cfg, ds, tr
        self.path = os.path.join(cfg.out, "metrics.json")
        self.history = History()
        self.doc = {"config": cfg.as_dict(), "dataset": ds.summary(), "n_params": tr.n_params,
                    "rays_per_epoch": tr.n_rays, "evals": []}
        if cluster is not None:
            self.doc["cluster"] = dict(workers=cluster.n_workers, addresses=list(cluster.addresses),
                                       allreduce_bytes_per_step=tr.allreduce_bytes,
                                       table_gradient="gather" if tr.gather_table_grad else "allreduce",
                                       allgather_bytes_per_step=tr.allgather_bytes)

    def resume(self, step, train_s, checkpoint, read_file):
        """Resumed at ``step`` from ``checkpoint``; ``read_file``: keep the evaluations and series up to there from
        the existing metrics.json (the chief)."""
        if read_file and os.path.exists(self.path):
            with open(self.path) as f:
                old = json.load(f)
            self.doc["evals"] = [e for e in old.get("evals", []) if e["step"] <= step]
            self.history.resume(old, step)
            self.doc["resumed"] = old.get("resumed", [])
        self.doc.setdefault("resumed", []).append(dict(step=step, train_seconds=train_s, checkpoint=checkpoint))

    def write(self):
        self.doc.update(self.history.series())
        write_json_atomic(self.path, self.doc)

    def progress(self, max_steps, budget_s, step, train_s):
        """The run's :class:`Progress` (it starts at ``step`` steps, ``train_s`` seconds of training)."""
        return Progress(self.cfg, max_steps, budget_s, step, train_s)

    def plot(self):
        plot_psnr(self.doc, self.cfg, self.ds.name, self.tr.occupancy, os.path.join(self.cfg.out, "psnr.png"))

    def evaluate(self, step, train_s, wall0, steps_since, final=False):
        """Evaluation after ``step`` steps (``steps_since`` of them since the previous one; ``wall0``: the
        ``time.perf_counter()`` the wall clock counts from): renders the --eval-views (final: --final-views) test
        views, appends the record, writes ``renders/step_<step>.png`` (final: also every ``renders/test_<k>.png``).
        Returns (record, log line)."""
        tr, ds, h = self.tr, self.ds, self.history
        renders = os.path.join(self.cfg.out, "renders")
        n_views = self.cfg.final_views if final else self.cfg.eval_views
        t = time.perf_counter()
        test_psnr, preds = render_test_views(tr.model, ds, n_views) if n_views != 0 else (None, [])
        eval_s = time.perf_counter() - t
        tl = h.recent_loss()
        since = max(steps_since, 1)
        rec = dict(step=step, epoch=tr.epochs_done(step), train_seconds=round(train_s, 3),
                   wall_seconds=round(time.perf_counter() - wall0, 3), train_loss=tl, train_psnr=psnr(tl),
                   test_psnr=test_psnr, eval_views=len(preds), eval_seconds=round(eval_s, 3),
                   lr=float(tr.opt.learning_rate.numpy()),
                   lr_table=float(tr.opt_table.learning_rate.numpy()) if tr.opt_table else None,
                   samples_per_ray=float(np.mean(h.spr[-since:])), rays_per_step=float(np.mean(h.rps[-since:])),
                   marched_per_ray=float(np.mean(h.mpr[-since:])),
                   occupied_fraction=float(tr.model.grid.occupied_fraction().numpy()) if tr.occupancy else None)
        if tr.occupancy and tr.model.grid.cascades > 1:
            rec["occupied_per_cascade"] = [round(float(v), 5) for v in
                                           tr.model.grid.occupied_fraction(per_cascade=True).numpy()]
        self.doc["evals"].append(rec)
        if preds:
            iio.imwrite(os.path.join(renders, f"step_{step:06d}.png"), side_by_side(ds.test.image(0), preds[0]))
        if final:
            for k, pr in enumerate(preds):
                iio.imwrite(os.path.join(renders, f"test_{k:03d}.png"), side_by_side(ds.test.image(k), pr))
        msg = (f"step {step} epoch {rec['epoch']:.2f} train {train_s:.0f}s: loss {tl:.5f} (train PSNR "
               f"{rec['train_psnr']:.2f}) test PSNR {_db(test_psnr)} on {len(preds)} views; "
               f"{rec['samples_per_ray']:.1f} samples/ray, {rec['rays_per_step']:.0f} rays/step"
               + (f", occupied {100 * rec['occupied_fraction']:.1f} %" if tr.occupancy else ""))
        return rec, msg

    def finish(self, final, step, step0, train_s, compile_s, total_s, reload_diff):
        """The ``final`` record: the last evaluation ``final`` and the run's totals (``step0``: the step this
        process started at)."""
        tr, h = self.tr, self.history
        epochs = tr.epochs_done(step)
        timed = max(step - step0 - 1, 1)  # steps inside train_s in this process (the first one compiled)
        resumed_s = self.doc["resumed"][-1]["train_seconds"] if "resumed" in self.doc else 0.0
        self.doc.update(h.series())
        self.doc["final"] = dict(final, steps=step, epochs=epochs, train_seconds=train_s, compile_seconds=compile_s,
                                 seconds_per_epoch=train_s / max(epochs * (step - 1) / step, 1e-9),
                                 seconds_per_step=(train_s - resumed_s) / timed,
                                 total_seconds=total_s, reload_max_abs_diff=reload_diff)
        if tr.occupancy:
            upd = [g["seconds"] for g in tr.grid_log[1:]]  # the first one traced
            self.doc["final"].update(trace_count=tr.trace_count(), grid_updates=len(tr.grid_log),
                                     grid_update_seconds_median=float(np.median(upd)) if upd else None,
                                     samples_per_ray_last_100=float(np.mean(h.spr[-100:])))
        write_json_atomic(self.path, self.doc)
        fm = self.doc["final"]
        return (f"done: test PSNR {_db(fm['test_psnr'])} ({fm['eval_views']} views) after {fm['steps']} steps = "
                f"{fm['epochs']:.2f} epochs in {train_s:.0f} s of training ({fm['seconds_per_epoch']:.1f} s/epoch, "
                f"{1000 * fm['seconds_per_step']:.0f} ms/step); total {fm['total_seconds']:.0f} s; reloaded model "
                f"renders the novel view within {reload_diff:.1e}; outputs in {self.cfg.out}")


def plot_psnr(doc, cfg: TrainConfig, ds_name, occupancy, path):
    """``OUT/psnr.png``: test and train PSNR vs training time, below it the samples (and marched samples) per ray
    and, occupancy sampler, the grid's occupied cells."""
    import matplotlib  # here: the Agg backend is chosen when a run plots, not when this module is imported

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(6, 6), sharex=True, gridspec_kw=dict(height_ratios=(2, 1)))
    ev = doc["evals"]
    minutes = [e["train_seconds"] / 60 for e in ev]
    ax.plot(minutes, [math.nan if e["test_psnr"] is None else e["test_psnr"] for e in ev], "o-", label="test PSNR")
    ax.plot(minutes, [e["train_psnr"] for e in ev], "--", alpha=0.6, label="train PSNR")
    ax.set(ylabel="PSNR (dB)", title=f"NeRF {cfg.model} ({cfg.sampler} sampler) on {ds_name}")
    ax.grid(alpha=0.3)
    ax.legend()
    # samples per ray: the mean over the steps before each evaluation
    ax2.plot(minutes, [e.get("samples_per_ray") for e in ev], "o-", color="C2", label="samples / ray")
    if any(e.get("marched_per_ray") != e.get("samples_per_ray") for e in ev):  # --early-stop: before compaction
        ax2.plot(minutes, [e.get("marched_per_ray") for e in ev], ".:", color="C2", alpha=0.6, label="marched / ray")
    ax2.set(xlabel="training time (min)", ylabel="samples / ray")
    ax2.grid(alpha=0.3)
    if occupancy:
        ax3 = ax2.twinx()
        ax3.plot(minutes, [100 * e["occupied_fraction"] for e in ev], "s--", color="C3", alpha=0.7,
                 label="occupied cells (%)")
        ax3.set_ylabel("occupied cells (%)")
        ax2.legend(handles=ax2.get_lines() + ax3.get_lines(), loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
