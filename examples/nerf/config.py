"""The command line of ``train.py``: argparse -> :class:`TrainConfig`, a frozen dataclass with every derived default
filled in and every combination checked (``parse_args``).

No TensorFlow import here: a bad flag answers before TensorFlow loads.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time

DESCRIPTION = "Train a NeRF on the built-in scene (or real data) with tf-metal-ops."


def check_at_least(p: argparse.ArgumentParser, flag: str, value: int, minimum: int, unit: str = "") -> None:
    """argparse's error (usage, exit code 2) unless ``value >= minimum``: "--flag must be at least N[ unit], got V"."""
    if value < minimum:
        p.error(f"{flag} must be at least {minimum}{' ' + unit if unit else ''}, got {value}")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Every flag of ``train.py`` (dashes -> underscores, in the parser's order), then the values derived from them.
    ``None`` where a flag is unset and has no derived default (e.g. the budgets that were not chosen)."""

    data: str
    model: str
    impl: str
    mlp: str
    minutes: float | None
    epochs: float | None
    steps: int | None
    quick: bool
    out: str
    strategy: str
    replicas: int
    checkpoint_every: str | None
    keep_checkpoints: int
    save_worker_weights: bool
    sampler: str
    samples: int
    batch_rays: int
    sample_budget: int
    grid_res: int
    grid_every: int
    grid_sync: str
    table_grad: str
    grid_warmup: int
    step_size: float | None
    max_samples: int
    early_stop: float | None
    alpha_threshold: float | None
    cull: str
    march_budget: int | None
    scene: str
    cascades: int | None
    cone_angle: float | None
    appearance_dim: int | None
    levels: int
    features: int
    log2_table: int
    base_res: int
    finest_res: int
    bound: float | None
    lr: float
    lr_table: float
    lr_decay: float
    distortion: float | None
    xla_inner: bool
    jit: str
    background: str
    downscale: int
    split: str | None
    holdout_every: int | None
    seed: int
    scene_seed: int
    scene_res: int
    scene_ss: int | None
    no_jitter: bool
    eval_every: float | None
    eval_views: int
    final_views: int | None
    no_progress: bool
    # derived: --checkpoint-every as a step count or as seconds (at most one is set), --background as RGB
    ckpt_steps: int | None
    ckpt_seconds: float | None
    background_rgb: tuple

    def as_dict(self) -> dict:
        """The fields in order (``metrics.json`` ``config``)."""
        return dataclasses.asdict(self)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", default="builtin",
                   help="'builtin', a tiny-NeRF .npz file, or a folder: NeRF-synthetic (transforms_train.json), "
                        "nerfstudio / instant-ngp (transforms.json) or COLMAP (sparse/0 + images/); detected")
    p.add_argument("--model", choices=("hash", "mlp"), default="hash")
    p.add_argument("--impl", choices=("op", "pure_tf"), default="op",
                   help="hash model: tf_metal_ops kernels, or pure TF (hash grid + compositing) in an XLA train step")
    p.add_argument("--mlp", choices=("fused", "keras"), default="fused",
                   help="hash model: the density and colour MLPs as tf_metal_ops.FusedMLP layers, or as Keras Dense "
                        "stacks of the same shapes")
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
    p.add_argument("--grid-sync", choices=("shard", "replicate", "broadcast"), default="shard", help=(
        "occupancy sampler with several workers: every worker picks the same cells with the same seeds and "
        "evaluates the density at its share of them, one all-gather gives every worker all of them (shard: "
        "bitwise equal grids); or every worker evaluates all cells (replicate: no communication); or the chief "
        "updates its grid and all-gathers it to the others (broadcast); see docs/distributed.md"))
    p.add_argument("--table-grad", choices=("auto", "allreduce", "gather"), default="auto", help=(
        "hash model with several replicas: all-reduce the dense table gradient, or all-gather every replica's "
        "sample positions and per-sample feature gradients and compute the table gradient on each (the same "
        "gradient, fewer bytes when a step has fewer samples than the table has entries); auto picks the smaller "
        "(gather for the occupancy sampler's default budget); see docs/distributed.md"))
    p.add_argument("--grid-warmup", type=int, default=64,
                   help="occupancy sampler: steps during which every cell counts as occupied (and all cells are "
                        "re-evaluated at each update)")
    p.add_argument("--step-size", type=float, default=None,
                   help="occupancy sampler: marching step (default: the box diagonal / "
                        "nerf.models.STEPS_PER_DIAGONAL)")
    p.add_argument("--max-samples", type=int, default=1024, help="occupancy sampler: samples per ray at most")
    p.add_argument("--early-stop", type=float, default=None,
                   help="occupancy sampler: drop the samples behind the point where a ray's transmittance is below "
                        "this (a density-only pass without gradient first; 0: off; default: 1e-3 with --cull on, "
                        "else 0)")
    p.add_argument("--alpha-threshold", type=float, default=None,
                   help="occupancy sampler: drop the samples whose opacity (1 - exp(-density * step)) is below this "
                        "(the same density-only pass; 0: off; default: 1e-2 with --cull on, else 0)")
    p.add_argument("--cull", choices=("auto", "on", "off"), default="auto",
                   help="occupancy sampler: cull the marched samples before the training pass "
                        "(tf_metal_ops.cull_samples_packed with --early-stop and --alpha-threshold); the sample "
                        "budget then counts the kept samples and --march-budget bounds the marched ones (auto: on "
                        "for unbounded scenes, see the README)")
    p.add_argument("--march-budget", type=int, default=None,
                   help="occupancy sampler with culling: marched samples per step at most (the rays per step are "
                        "also bounded by it over the measured marched samples per ray; default 4 x --sample-budget)")
    p.add_argument("--scene", choices=("auto", "bounded", "unbounded"), default="auto", help=(
        "hash model, occupancy sampler: unbounded = positions contracted (mip-NeRF 360) before the hash grid, "
        "a cascaded occupancy grid, cone stepping, no background colour, distortion loss; auto: unbounded for a "
        "real capture (COLMAP / transforms.json folder) with the occupancy sampler, bounded otherwise"))
    p.add_argument("--cascades", type=int, default=None,
                   help="occupancy grid cascades, each twice the extent of the previous (default: unbounded, enough "
                        "that the outermost box holds the data's far distance, at least 5; bounded 1)")
    p.add_argument("--cone-angle", type=float, default=None,
                   help="occupancy sampler: step = clamp(t * cone_angle, --step-size, cell diagonal) (default: "
                        "unbounded 2/focal, two pixels' angular size, clamped to [1/256, 1/50]; bounded 0: constant "
                        "steps)")
    p.add_argument("--appearance-dim", type=int, default=None,
                   help="occupancy sampler: per-training-image appearance vector of this size in the colour MLP "
                        "(test views use the mean vector; default 0: none, see the README)")
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
    p.add_argument("--distortion", type=float, default=None,
                   help="hash model: weight of the distortion loss (default: unbounded 1e-3, on the contracted "
                        "spacing, the floater regulariser; bounded 0)")
    p.add_argument("--xla-inner", action="store_true",
                   help="hash model with ops: XLA-compile the parts around the custom ops as inner functions")
    p.add_argument("--jit", choices=("auto", "on", "off"), default="auto",
                   help="XLA for the train step (auto: whole step unless it contains custom ops)")
    # data
    p.add_argument("--background", default="white", help="white, black or r,g,b in [0,1]")
    p.add_argument("--downscale", type=int, default=1,
                   help="real data at 1/N resolution (a capture's images_N/ folder when present, else area-averaged)")
    held = p.add_mutually_exclusive_group()
    held.add_argument("--split", default=None, metavar="FILE",
                      help='COLMAP / transforms.json: held-out views from a JSON file {"train": [image names], '
                           '"test": [image names]}')
    held.add_argument("--holdout-every", type=int, default=None, metavar="N",
                      help="COLMAP / transforms.json: every N-th image (name order, from the first) is held out "
                           "(default 8, the LLFF / mip-NeRF 360 convention)")
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
    p.add_argument("--final-views", type=int, default=None,
                   help="test views of the final evaluation (default all; 0: none, and the novel-view check renders "
                        "a thumbnail)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar (logs one line per evaluation)")
    return p


def parse_args(argv=None) -> TrainConfig:
    """``argv`` (default ``sys.argv[1:]``) -> the run's config; exits with argparse's usage error (code 2) on a bad
    flag or combination."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.cull == "off" and ((args.early_stop or 0.0) > 0 or (args.alpha_threshold or 0.0) > 0):
        p.error("--early-stop / --alpha-threshold above 0 cull samples: they contradict --cull off")
    _fill_defaults(args)
    _check(p, args)
    ckpt_steps, ckpt_seconds = _checkpoint_spec(p, args.checkpoint_every)
    return TrainConfig(**vars(args), ckpt_steps=ckpt_steps, ckpt_seconds=ckpt_seconds,
                       background_rgb=_background_rgb(p, args.background))


def _fill_defaults(args):
    """The defaults that depend on other flags (``args`` is argparse's namespace, changed in place)."""
    if args.quick:
        if args.minutes is None and args.epochs is None and args.steps is None:
            args.minutes = 2.5
        args.eval_views = min(args.eval_views, 2)
        args.final_views = 8 if args.final_views is None else args.final_views
    if args.minutes is None and args.epochs is None and args.steps is None:
        args.minutes = 10.0
    if args.samples is None:
        args.samples = 32 if args.model == "mlp" else 64
    if args.sampler is None:
        args.sampler = "occupancy" if args.model == "hash" and args.impl == "op" and not args.xla_inner else "uniform"
    if args.lr is None:
        args.lr = 5e-4 if args.model == "mlp" else 1e-2
    if args.lr_decay is None:
        args.lr_decay = 1.0 if args.model == "mlp" else 0.1
    _fill_scene_defaults(args)
    if args.checkpoint_every is None and args.strategy == "multiworker":
        args.checkpoint_every = "60s"
    if args.out is None:
        args.out = os.path.join("runs", f"{args.model}{'-' + args.impl if args.model == 'hash' else ''}-"
                                f"{time.strftime('%Y%m%d-%H%M%S')}")


# Defaults of an unbounded scene (see the README's "Unbounded scenes" for how they were chosen)
MIN_CONE_ANGLE = 1.0 / 256  # Instant-NGP's cone angle of unbounded scenes: the finest default
MAX_CONE_ANGLE = 1.0 / 50  # the coarsest default (64x48 images: 2/focal = 1/25 lost 0.6 dB to 1/50)
CONE_PIXELS = 2.0  # default cone angle CONE_PIXELS / focal: a step spans this many pixels' footprint
UNBOUNDED_DISTORTION = 1e-3
DEFAULT_APPEARANCE_DIM = 0
# --cull on: 10x nerfacc's early_stop_eps (the same test PSNR, bench/nerf_sampler.md) and the alpha_thre of its
# Instant-NGP examples of unbounded scenes
CULL_EARLY_STOP, CULL_ALPHA_THRESHOLD = 1e-3, 1e-2
MARCH_BUDGET_FACTOR = 4  # default --march-budget: marched samples per step, times --sample-budget


def _fill_scene_defaults(args):
    """--scene auto → bounded or unbounded (a real capture: COLMAP or transforms.json, read by
    ``nerf.data.loaders.detect_format`` without loading anything; a path that does not load stays bounded here and
    fails in the loader), then the defaults that depend on it."""
    if args.scene == "auto":
        kind = None
        if args.data != "builtin":
            from nerf.data.dataset import DatasetError
            from nerf.data.loaders import detect_format

            try:
                kind = detect_format(args.data)
            except DatasetError:
                kind = None
        capture = kind in ("colmap", "transforms")
        args.scene = "unbounded" if capture and args.model == "hash" and args.sampler == "occupancy" else "bounded"
    unbounded = args.scene == "unbounded"
    if args.cone_angle is None and not unbounded:
        args.cone_angle = 0.0  # unbounded: from the data's focal length (nerf.trainer.model_config)
    if args.distortion is None:
        args.distortion = UNBOUNDED_DISTORTION if unbounded else 0.0
    if args.appearance_dim is None:
        args.appearance_dim = DEFAULT_APPEARANCE_DIM
    if args.cascades is None and not unbounded:
        args.cascades = 1  # unbounded: from the data's far distance (nerf.trainer.model_config)
    on = args.cull == "on" or (args.cull == "auto" and unbounded)
    if args.early_stop is None:
        args.early_stop = CULL_EARLY_STOP if on else 0.0
    if args.alpha_threshold is None:
        args.alpha_threshold = CULL_ALPHA_THRESHOLD if on else 0.0
    args.cull = "on" if on or args.early_stop > 0 or args.alpha_threshold > 0 else "off"  # what the run does
    if args.march_budget is None and args.sampler == "occupancy":
        args.march_budget = MARCH_BUDGET_FACTOR * args.sample_budget


def _check(p, args):
    if args.scene == "unbounded" and (args.model != "hash" or args.sampler != "occupancy"):
        p.error("--scene unbounded needs --model hash with the occupancy sampler (--sampler occupancy)")
    if args.appearance_dim < 0:
        p.error(f"--appearance-dim must be >= 0, got {args.appearance_dim}")
    if args.appearance_dim > 0 and args.sampler != "occupancy":
        p.error("--appearance-dim needs the occupancy sampler")
    if args.cascades is not None and not 1 <= args.cascades <= 8:
        p.error(f"--cascades must be in 1..8 (the outermost box 2^7 times the first), got {args.cascades}")
    if args.cascades not in (None, 1) and args.sampler != "occupancy":
        p.error("--cascades needs the occupancy sampler")
    if args.cone_angle is not None and not (math.isfinite(args.cone_angle) and args.cone_angle >= 0):
        p.error(f"--cone-angle must be >= 0, got {args.cone_angle}")
    if args.cone_angle and args.sampler != "occupancy":
        p.error("--cone-angle needs the occupancy sampler")
    if not (math.isfinite(args.distortion) and args.distortion >= 0):
        p.error(f"--distortion must be >= 0, got {args.distortion}")
    if args.cull == "on" and args.sampler != "occupancy":
        p.error("--cull on needs the occupancy sampler")
    for flag, v in (("--early-stop", args.early_stop), ("--alpha-threshold", args.alpha_threshold)):
        if not (math.isfinite(v) and 0.0 <= v < 1.0):
            p.error(f"{flag} must be in [0, 1), got {v}")
        if v > 0 and args.sampler != "occupancy":
            p.error(f"{flag} needs the occupancy sampler")
    if args.march_budget is not None:
        if args.sampler != "occupancy":
            p.error("--march-budget needs the occupancy sampler")
        check_at_least(p, "--march-budget", args.march_budget, args.sample_budget, "(--sample-budget)")
    if args.sampler == "occupancy":
        if args.model != "hash":
            p.error("--sampler occupancy needs --model hash")
        if args.xla_inner:
            p.error("--xla-inner applies to the uniform sampler only")
        if args.epochs is not None:
            p.error("--epochs needs the uniform sampler (fixed batches); with --sampler occupancy use --minutes or "
                    "--steps")
        check_at_least(p, "--sample-budget", args.sample_budget, 1024)
        if args.grid_every < 1 or args.grid_res < 1 or args.max_samples < 1:
            p.error("--grid-every, --grid-res and --max-samples must be positive")
    if args.data == "builtin" and (args.split is not None or args.holdout_every is not None):
        p.error("--split and --holdout-every choose the held-out views of a real capture (COLMAP or transforms.json "
                "folder); the built-in scene has its own")
    if not 0.0 < args.lr_decay <= 1.0:
        p.error(f"--lr-decay must be in (0, 1], got {args.lr_decay}")


def _checkpoint_spec(p, spec):
    """--checkpoint-every -> (steps, seconds): "200" is (200, None), "60s" is (None, 60.0); unset or 0: (None, None)."""
    if spec in (None, "0", "0s"):
        return None, None
    spec = str(spec).strip()
    try:
        value = float(spec[:-1]) if spec.endswith("s") else int(spec)
        assert value > 0
    except (ValueError, AssertionError):
        p.error(f"--checkpoint-every must be a number of steps (200) or seconds (60s), got {spec!r}")
    return (None, value) if spec.endswith("s") else (value, None)


def _background_rgb(p, background):
    try:
        rgb = {"white": (1.0, 1.0, 1.0), "black": (0.0, 0.0, 0.0)}.get(background) or tuple(
            float(v) for v in background.split(","))
        assert len(rgb) == 3
    except (ValueError, AssertionError):
        p.error(f"--background must be white, black or r,g,b, got {background!r}")
    return rgb
