"""NeRF example, occupancy sampler (examples/nerf/models.py HashNeRF(sampler="occupancy"), train.py --sampler
occupancy): the packed model against the uniform one, training outputs, no retracing with varying batches, the
grid becoming non-trivial, rejected combinations."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from nerf import models

pytestmark = pytest.mark.nerf  # the NeRF example's tests: `pytest tests -m nerf` (README)

TINY = ["--scene-res", "24", "--eval-views", "1", "--final-views", "2", "--no-progress", "--log2-table", "12",
        "--sampler", "occupancy", "--sample-budget", "4096", "--grid-res", "32", "--grid-every", "4"]


def run_train(tmp_path, *extra):
    from nerf import train  # examples/nerf/train.py

    os.environ["TF_METAL_OPS_CACHE"] = str(tmp_path / "cache")
    try:
        return train.run([*TINY, "--out", str(tmp_path / "out"), *extra])
    finally:
        del os.environ["TF_METAL_OPS_CACHE"]


def axis_rays(n, seed=0):
    """Rays parallel to -z through the box [-1,1]^3 from z = 4: each crosses the box over t in [3, 5]."""
    rng = np.random.default_rng(seed)
    o = np.concatenate([rng.uniform(-0.9, 0.9, (n, 2)), np.full((n, 1), 4.0)], 1)
    d = np.tile([[0.0, 0.0, -1.0]], (n, 1))
    return tf.constant(o, tf.float32), tf.constant(d, tf.float32)


def test_density_equals_the_fields_density():
    """model.density (the grid update's density-only pass: one output column) equals the density the training
    forward computes from the full density MLP, at the same points."""
    model = models.build_model("hash", sampler="occupancy", grid_resolution=16, log2_hashmap_size=12)
    rng = np.random.default_rng(3)
    model.set_weights([rng.normal(scale=0.3, size=w.shape).astype(np.float32) for w in model.get_weights()])
    pts = tf.constant(rng.uniform(-1.2, 1.2, (500, 3)), tf.float32)  # some outside the box: clamped alike
    x = tf.clip_by_value((pts + 1.0) * 0.5, 0.0, 1.0)
    full, _ = model._field(model.encoding(x), tf.zeros([500, 16]))
    np.testing.assert_allclose(model.density(pts).numpy(), full.numpy(), rtol=2e-5)


def test_packed_model_equals_uniform_model_on_matching_samples():
    """Every cell occupied (warm-up), no jitter, step = chord / 32: the march's samples are the uniform sampler's 32
    bins, so the two samplers give the same colour, depth and opacity with the same weights."""
    cfg = dict(n_samples=32, log2_hashmap_size=12, jitter=False)
    uni = models.build_model("hash", **cfg)
    occ = models.build_model("hash", sampler="occupancy", grid_resolution=16, step_size=2.0 / 32, **cfg)
    rng = np.random.default_rng(0)
    weights = [rng.normal(scale=0.3, size=w.shape).astype(np.float32) for w in uni.get_weights()]
    uni.set_weights(weights)
    occ.set_weights(weights)
    o, d = axis_rays(200)
    a, b = uni(o, d), occ(o, d)
    assert a["weights"].shape == (200, 32)
    rs = b["row_splits"].numpy()
    assert rs[0] == 0 and rs[-1] == b["weights"].shape[0]
    assert np.all(np.diff(rs) >= 32) and np.all(np.diff(rs) <= 33)  # a sliver at the exit from rounding at most
    for k, tol in (("color", 2e-4), ("opacity", 2e-4), ("depth", 1e-3)):  # depth ~3.4: float32 sums of t
        np.testing.assert_allclose(b[k].numpy(), a[k].numpy(), atol=tol, err_msg=k)


def test_pure_tf_occupancy_model_matches_the_ops():
    """--impl pure_tf --sampler occupancy (ray_march_tf, pure-TF hash grid, volume_render_packed_tf) renders what the
    ops render, with a grid that has empty cells, and trains through its packed compositing."""
    cfg = dict(sampler="occupancy", grid_resolution=8, grid_warmup_steps=0, log2_hashmap_size=12, max_samples=64,
               step_size=0.05)
    a = models.build_model("hash", implementation="op", **cfg)
    b = models.build_model("hash", implementation="pure_tf", **cfg)
    rng = np.random.default_rng(0)
    weights = [rng.normal(scale=0.3, size=w.shape).astype(np.float32) for w in a.get_weights()]
    a.set_weights(weights)
    b.set_weights(weights)
    ball = lambda p: tf.where(tf.norm(p, axis=-1) < 0.6, 1e3, 0.0)  # noqa: E731
    a.grid.update(ball, step=0, n_cells=8 ** 3, seed=0)
    b.grid.bits.assign(a.grid.bits)
    o, d = axis_rays(128, seed=2)
    ya, yb = a(o, d, training=True, jitter_seed=tf.constant([1, 2], tf.int64)), b(
        o, d, training=True, jitter_seed=tf.constant([1, 2], tf.int64))
    np.testing.assert_array_equal(ya["row_splits"].numpy(), yb["row_splits"].numpy())
    assert 0 < ya["row_splits"].numpy()[-1] < 128 * 40  # empty cells skipped
    np.testing.assert_allclose(ya["color"].numpy(), yb["color"].numpy(), atol=1e-4)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(b(o, d, training=True)["color"])
    grads = tape.gradient(loss, b.trainable_variables)
    assert all(g is not None for g in grads) and np.isfinite(float(tf.linalg.global_norm(grads)))


def test_grid_update_marks_dense_cells_and_march_skips_empty_space():
    """A density that is high only in a ball: after warm-up the occupied cells are the ball's, and rays that miss it
    get no samples."""
    m = models.build_model("hash", sampler="occupancy", grid_resolution=16, grid_warmup_steps=1, log2_hashmap_size=12)
    ball = lambda p: tf.where(tf.norm(p, axis=-1) < 0.4, 1e3, 0.0)  # noqa: E731
    for step in range(4):
        m.grid.update(ball, step=step, n_cells=16 ** 3 // 4, seed=step)
    frac = float(m.grid.occupied_fraction())
    ball_frac = (4 / 3 * np.pi * 0.4 ** 3) / 8
    assert 0.5 * ball_frac < frac < 3 * ball_frac, (frac, ball_frac)
    o, d = axis_rays(64, seed=1)
    r = m.march(o, d)
    counts = np.diff(r.row_splits.numpy())
    radial = np.linalg.norm(o.numpy()[:, :2], axis=1)
    assert np.all(counts[radial > 0.6] == 0)
    assert np.all(counts[radial < 0.2] > 0)


def test_occupancy_training_run(tmp_path):
    """A short run: per-step and per-evaluation sampling metrics, the ray count adapting without retracing the step,
    the grid leaving warm-up with part of its cells empty, evaluation and the saved/reloaded model with the grid."""
    m = run_train(tmp_path, "--steps", "40", "--grid-warmup", "8", "--step-size", "0.04")
    out = tmp_path / "out"
    with open(out / "metrics.json") as f:
        saved = json.load(f)
    spr, rays = saved["samples_per_ray"], saved["rays_per_step"]
    assert len(spr) == len(rays) == 40
    assert len(set(rays)) > 3, rays  # the ray count adapts to the budget
    samples = np.array(spr) * np.array(rays)
    assert abs(np.median(samples[10:]) / 4096 - 1) < 0.35, samples  # and holds the sample budget
    assert np.mean(spr[-10:]) < 0.8 * np.mean(spr[:8]), spr  # empty space skipped once the grid is updated
    evals = saved["evals"]
    for e in evals:
        assert e["samples_per_ray"] > 0 and e["rays_per_step"] >= 64 and 0 < e["occupied_fraction"] <= 1
    assert evals[-1]["occupied_fraction"] < 0.9, evals
    assert m["final"]["trace_count"] == saved["final"]["trace_count"] == 1  # one trace for all batch sizes
    assert m["final"]["reload_max_abs_diff"] < 1e-6
    assert (out / "model" / "occupancy_grid.npz").exists() and os.path.getsize(out / "psnr.png") > 1000
    assert np.all(np.isfinite(saved["train_losses"]))


def test_train_step_does_not_retrace_for_other_ray_counts(tmp_path):
    from nerf import train
    from nerf.data import load_dataset

    os.environ["TF_METAL_OPS_CACHE"] = str(tmp_path / "cache")
    try:
        args = train.parse_args([*TINY, "--out", str(tmp_path / "out"), "--steps", "5"])
        ds = load_dataset("builtin", background=args.background_rgb, H=16, W=16)
    finally:
        del os.environ["TF_METAL_OPS_CACHE"]
    tr = train.Trainer(args, ds)
    seen = []
    for step, r in enumerate((256, 384, 1024, 512, 256)):
        tr.state_rays.assign(r)
        tr.step(step)
        seen.append(tr.last_rays)
    assert seen == [256, 384, 1024, 512, 256]
    assert tr.trace_count() == 1


@pytest.mark.parametrize("extra, message", [
    (["--model", "mlp"], "--sampler occupancy needs --model hash"),
    (["--epochs", "1"], "--epochs needs the uniform sampler"),
    (["--xla-inner"], "--xla-inner applies to the uniform sampler only"),
])
def test_rejected_combinations(extra, message, capsys):
    from nerf import train

    with pytest.raises(SystemExit) as e:
        train.parse_args(["--sampler", "occupancy", *extra])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_sampler_defaults():
    from nerf import train

    assert train.parse_args([]).sampler == "occupancy"
    assert train.parse_args(["--model", "mlp"]).sampler == "uniform"
    assert train.parse_args(["--impl", "pure_tf"]).sampler == "uniform"
    assert train.parse_args(["--strategy", "mirrored"]).sampler == "occupancy"
    assert train.parse_args(["--strategy", "multiworker"]).sampler == "occupancy"
    assert train.parse_args(["--strategy", "multiworker", "--grid-sync", "broadcast"]).grid_sync == "broadcast"
    assert train.parse_args(["--xla-inner"]).sampler == "uniform"


def test_resume_restores_grid_and_ray_stream(tmp_path):
    """A run resumed from its step-3 checkpoint repeats steps 3..5 exactly: the checkpoint holds the occupancy grid,
    the position in the ray stream and the adapted ray count (no jitter: the steps are deterministic)."""
    args = ["--steps", "6", "--checkpoint-every", "3", "--grid-warmup", "2", "--grid-every", "2", "--no-jitter",
            "--step-size", "0.04"]
    full = run_train(tmp_path, *args)
    ckpt_dir = str(tmp_path / "out" / "checkpoints")
    state = tf.train.get_checkpoint_state(ckpt_dir)
    step3 = [p for p in state.all_model_checkpoint_paths if p.endswith("-3")]
    assert len(step3) == 1, state.all_model_checkpoint_paths
    for name in os.listdir(ckpt_dir):  # as if the run had stopped after step 3
        if name.startswith("ckpt-6"):
            os.remove(os.path.join(ckpt_dir, name))
    tf.compat.v1.train.update_checkpoint_state(ckpt_dir, step3[0])
    resumed = run_train(tmp_path, *args)
    assert resumed["resumed"][-1]["step"] == 3
    with open(tmp_path / "out" / "metrics.json") as f:
        saved = json.load(f)
    assert saved["rays_per_step"][3:] == full["rays_per_step"][3:] and len(saved["rays_per_step"]) == 6
    assert len(set(full["rays_per_step"])) > 1
    np.testing.assert_allclose(resumed["train_losses"][3:], full["train_losses"][3:], rtol=1e-5)


def test_resume_checks_the_mlp_and_reads_older_run_configs(tmp_path, capsys):
    """--mlp is a resume setting; a run_config.json written before --mlp existed counts as --mlp keras (the layers of
    that version), and settings it lacks with no such rule are named in a note instead of failing the resume."""
    args = ["--steps", "2", "--checkpoint-every", "2", "--mlp", "keras"]
    run_train(tmp_path, *args)
    cfg_path = tmp_path / "out" / "checkpoints" / "run_config.json"
    cfg = json.loads(cfg_path.read_text())
    assert cfg["mlp"] == "keras"
    del cfg["mlp"], cfg["march_budget"]
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(SystemExit, match="mlp 'keras' vs 'fused'"):
        run_train(tmp_path, "--steps", "2", "--checkpoint-every", "2", "--mlp", "fused")
    resumed = run_train(tmp_path, *args)
    assert resumed["resumed"][-1]["step"] == 2
    assert "predates the settings march_budget:" in capsys.readouterr().out


def test_unseen_cells_never_occupied_and_each_cascade_has_its_threshold():
    """mark_unseen: one camera at z = 0.5 looking down -z with a 90° field of view: the cells behind it and outside
    its frustum are unseen (checked against the projection of each cell's corners in NumPy float64), and stay empty
    whatever density the update samples there; the threshold of each cascade is its own visible cells' mean."""
    import tf_metal_ops

    g = 16
    grid = tf_metal_ops.OccupancyGrid(resolution=g, cascades=2, warmup_steps=0, threshold=10.0)
    c2w = np.eye(4)
    c2w[2, 3] = 0.5
    seen = grid.mark_unseen(c2w[None], [[4.0, 4.0, 4.0, 4.0]], 8, 8)
    for c in range(2):
        lo, hi = grid.cascade_aabb(c).astype(np.float64)
        size = (hi - lo) / g
        idx = np.arange(g ** 3)
        ijk = np.stack([idx % g, idx // g % g, idx // (g * g)], 1)
        want = np.zeros(g ** 3, bool)
        for corner in np.stack(np.meshgrid([0, 1], [0, 1], [0, 1]), -1).reshape(-1, 3):
            p = lo + (ijk + corner) * size
            depth = 0.5 - p[:, 2]
            with np.errstate(divide="ignore", invalid="ignore"):
                inside = (np.abs(p[:, 0] / depth) <= 1 + 1e-6) & (np.abs(p[:, 1] / depth) <= 1 + 1e-6)
            want |= (depth > 1e-6) & inside
        near = np.all(np.abs(lo + (ijk + 0.5) * size - [0, 0, 0.5]) < (4 + 1) * size, axis=1)  # the camera's cells
        assert np.array_equal(seen[c] & ~near, want & ~near), c
        assert 0.2 < seen[c].mean() < 0.9
    # a density of 1 in the inner cascade and 100 in the outer one: a global mean would leave the inner one empty
    grid.update(lambda x: tf.where(tf.reduce_max(tf.abs(x), -1) <= 1.0, 1.0, 100.0) *
                (1.0 + 0.01 * x[:, 0]), seed=1)
    occ = grid.occupied().numpy()
    assert not np.any(occ & ~seen)
    assert 0.3 < occ[0][seen[0]].mean() < 0.7  # the inner cascade's cells above its own mean (~1)
    assert occ[1].any()


def test_culled_model_keeps_the_samples_cull_samples_packed_keeps():
    """early_stop / alpha_threshold: the model trains and renders the marched samples that cull_samples_packed keeps
    for the field's own densities at them (recomputed here), and the ray-count rule bounds the marched samples."""
    import tf_metal_ops
    from nerf import trainer

    model = models.build_model("hash", n_levels=4, log2_hashmap_size=12, finest_resolution=64, sampler="occupancy",
                               grid_resolution=16, grid_warmup_steps=0, early_stop=1e-3, alpha_threshold=0.05,
                               mlp="keras")
    model.grid.update(lambda p: 100.0 * tf.cast(tf.norm(p, axis=-1) < 0.6, tf.float32))  # a ball
    table = model.encoding.table
    table.assign(np.random.default_rng(0).normal(0.0, 3.0, table.shape).astype(np.float32))  # varied densities
    bias = model.density_mlp[1].bias
    bias.assign(tf.tensor_scatter_nd_update(bias, [[0]], [1.5]))  # around e^1.5: alpha ~0.06 per step
    o, d = axis_rays(64)
    out = model(o, d)
    m = model.march(o, d)
    sigma = model._density_at(model._sample_coords(o, d, m))
    want = tf_metal_ops.cull_samples_packed(sigma, m.t_starts, m.t_ends, m.row_splits, early_stop_eps=1e-3,
                                            alpha_threshold=0.05)
    assert int(out["n_marched"]) == len(m.t_starts) > len(want.indices) > 0
    np.testing.assert_array_equal(out["row_splits"].numpy(), want.row_splits.numpy())
    np.testing.assert_array_equal(out["t_starts"].numpy(), tf.gather(m.t_starts, want.indices).numpy())

    assert trainer.wanted_rays(256, 4096, 4096, 8192) == 512  # all kept: Instant-NGP's rule
    assert trainer.wanted_rays(256, 1024, 16384, 8192, march_budget=32768) == 512  # the march budget binds
    assert trainer.wanted_rays(256, 1024, 4096, 8192, march_budget=32768) == 2048  # the sample budget binds
    assert trainer.wanted_rays(256, 0, 4096, 8192) == 256 * 8192  # nothing kept: clamp_rays caps it
