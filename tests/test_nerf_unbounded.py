"""NeRF example, unbounded scenes (examples/nerf/models.py HashNeRF(unbounded=True), train.py --scene): contracted
hash-grid coordinates against the NumPy float64 contraction, the cascaded grid's per-cascade thickness, the
appearance embedding, the flags and their defaults, and the full path on the small unbounded test capture
(nerf.data.unbounded_scene) written as a COLMAP binary model and as nerfstudio's transforms.json: load → train a few
steps → render_image from a capture camera in the data's own frame → export.py."""

import os

import numpy as np
import pytest
import tensorflow as tf

from nerf import models
from nerf.data.cameras import Camera

pytestmark = pytest.mark.nerf  # the NeRF example's tests: `pytest tests -m nerf` (README)

SMALL = dict(n_levels=4, log2_hashmap_size=12, finest_resolution=64, sampler="occupancy", grid_resolution=16,
             grid_warmup_steps=0, near=0.05)
TRAIN_SMALL = ["--steps", "6", "--log2-table", "12", "--levels", "4", "--finest-res", "64", "--grid-res", "16",
               "--grid-every", "2", "--grid-warmup", "2", "--sample-budget", "8192", "--eval-views", "1",
               "--final-views", "1", "--no-progress", "--holdout-every", "4"]


@pytest.fixture(scope="module")
def capture_dirs(tmp_path_factory):
    """The 16-view test capture as a COLMAP binary model and as nerfstudio's transforms.json (their own writers)."""
    from nerf.data import capture_writers as writers
    from nerf.data import unbounded_scene as scene

    cap = scene.render()
    root = tmp_path_factory.mktemp("unbounded")
    out = {"colmap-bin": str(root / "colmap"), "nerfstudio": str(root / "nerfstudio")}
    writers.write_colmap(out["colmap-bin"], cap, binary=True)
    writers.write_transforms(out["nerfstudio"], cap)
    return cap, out


def test_contracted_coordinates_match_numpy():
    """The packed samples' hash-grid coordinates are contract_to_unit of their midpoints o + d (t0 + t1) / 2 (NumPy
    float64 reference, L-inf norm, the box [-1, 1]^3), also for samples far outside the box; bounded models keep the
    march's box coordinates."""
    from tf_metal_ops.contraction import reference

    model = models.build_model("hash", unbounded=True, cascades=4, cone_angle=1 / 64, **SMALL)
    rng = np.random.default_rng(0)
    o = rng.uniform(-0.5, 0.5, (64, 3)).astype(np.float32)
    d = rng.normal(size=(64, 3)).astype(np.float32)
    d /= np.linalg.norm(d, axis=-1, keepdims=True)
    m = model.march(tf.constant(o), tf.constant(d))
    x = model._sample_coords(tf.constant(o), tf.constant(d), m).numpy()
    ri, t0, t1 = m.ray_indices.numpy(), m.t_starts.numpy().astype(np.float64), m.t_ends.numpy().astype(np.float64)
    mid = o[ri].astype(np.float64) + d[ri].astype(np.float64) * (0.5 * (t0 + t1))[:, None]
    assert np.max(np.abs(mid)) > 4.0  # the march reaches the outer cascades (box 8^3)
    want = reference.contract_to_unit(mid, ((-1, -1, -1), (1, 1, 1)), norm="inf")
    np.testing.assert_allclose(x, want, atol=1e-5)  # float32 midpoints; the contraction's slope is at most 1/4
    # cone stepping: far samples are longer than the base step
    assert np.max(t1 - t0) > 4 * model.cfg["step_size"]
    bounded = models.build_model("hash", **SMALL)
    mb = bounded.march(tf.constant(o), tf.constant(d))
    np.testing.assert_array_equal(bounded._sample_coords(tf.constant(o), tf.constant(d), mb).numpy(),
                                  mb.positions.numpy())


def test_spacing_of_the_distortion_loss():
    """HashNeRF.spacing: t up to the bound, then 2 - bound / t (bound 1: the contraction of the distance); the
    identity for a bounded model."""
    t = np.array([0.0, 0.5, 1.0, 2.0, 4.0, 100.0], np.float32)
    model = models.build_model("hash", unbounded=True, cascades=2, **SMALL)
    np.testing.assert_allclose(model.spacing(tf.constant(t)).numpy(), [0, 0.5, 1, 1.5, 1.75, 1.99], atol=1e-6)
    np.testing.assert_array_equal(models.build_model("hash", **SMALL).spacing(tf.constant(t)).numpy(), t)
    # packed intervals (contiguous runs, gaps, several rays) stay sorted and non-overlapping after the spacing
    from nerf.trainer import spaced_intervals

    rng = np.random.default_rng(1)
    edges = np.cumsum(rng.uniform(0.01, 0.5, 4001)).astype(np.float32)
    t0, t1 = edges[:-1].copy(), edges[1:].copy()
    gaps = rng.random(4000) < 0.1
    t0[gaps] += np.float32(0.005)  # a skipped stretch before these samples
    s0, s1 = (v.numpy() for v in spaced_intervals(model.spacing, tf.constant(t0), tf.constant(t1)))
    assert np.all(s1 >= s0) and np.all(s0[1:] >= s1[:-1])
    want = lambda x: np.where(x <= 1, x, 2 - 1 / np.maximum(x.astype(np.float64), 1))  # noqa: E731
    np.testing.assert_allclose(s0, want(t0), atol=1e-6)
    np.testing.assert_allclose(s1, want(t1), atol=1e-6)


def test_cascade_thickness_scales_with_the_cascade():
    """The grid update's stored thickness of a constant density is density * (box diagonal / 1024) * 2^c in
    cascade c (Instant-NGP's per-cascade minimal step)."""
    model = models.build_model("hash", unbounded=True, cascades=3, **SMALL)
    model.density = lambda p: tf.fill(tf.shape(p)[:1], 2.0)  # a constant field
    model.update_grid(step=tf.constant(0, tf.int64), seed=tf.constant(1, tf.int64))  # warm-up 0: n cells each
    dens = model.grid.density.numpy()
    dt = 2 * np.sqrt(3) / 1024
    G = model.grid.resolution
    idx = np.arange(G ** 3)
    ijk = np.stack([idx % G, (idx // G) % G, idx // (G * G)], -1)
    for c in range(3):
        lo, hi = model.grid.cascade_aabb(c)
        centre = lo + (ijk + 0.5) * (hi - lo) / G
        # the cells of cascade c outside the finer cascades' box (those the march uses); inside it, a point's
        # finest cascade is a finer one
        own = np.ones(len(idx), bool) if c == 0 else np.any(np.abs(centre) > 2.0 ** (c - 1), axis=-1)
        seen = (dens[c] > 0) & own
        assert seen.sum() > 20
        np.testing.assert_allclose(dens[c][seen], 2.0 * dt * 2 ** c, rtol=1e-6)


def test_appearance_embedding():
    """Per-image vectors change the colour; without ids every ray gets the mean vector (the same render as ids of
    an image whose vector is the mean); the density does not depend on them."""
    model = models.build_model("hash", appearance_dim=3, n_appearance=2, unbounded=True, cascades=2, **SMALL)
    model.appearance.assign([[1.0, -2.0, 0.5], [-1.0, 2.0, -0.5]])  # mean 0
    o = tf.constant([[0.0, 0.0, 0.8]] * 4)
    d = tf.constant([[0.0, 0.6, -0.8]] * 4)
    a = model(o, d, appearance_ids=tf.constant([0] * 4))
    b = model(o, d, appearance_ids=tf.constant([1] * 4))
    mean = model(o, d)
    assert np.max(np.abs(a["color"].numpy() - b["color"].numpy())) > 1e-3
    model.appearance.assign([[0.0] * 3, [0.0] * 3])
    zero = model(o, d, appearance_ids=tf.constant([0] * 4))
    np.testing.assert_allclose(mean["color"].numpy(), zero["color"].numpy(), atol=1e-6)
    np.testing.assert_allclose(a["opacity"].numpy(), b["opacity"].numpy(), atol=1e-6)


@pytest.mark.parametrize("kw, message", [
    (dict(appearance_dim=-1, n_appearance=4), "appearance_dim must be >= 0"),
    (dict(appearance_dim=4, n_appearance=0), "n_appearance >= 1"),
    (dict(unbounded=True, sampler="uniform"), "need sampler='occupancy'"),
    (dict(cone_angle=-0.1), "cone_angle must be >= 0"),
    (dict(unbounded=True, contraction_norm="l1"), "contraction_norm must be one of"),
])
def test_model_rejects_bad_arguments(kw, message):
    args = {**SMALL, **kw}
    with pytest.raises(ValueError, match=message):
        models.HashNeRF(**args)


@pytest.mark.parametrize("extra, message", [
    (["--appearance-dim", "-2"], "--appearance-dim must be >= 0"),
    (["--scene", "unbounded", "--sampler", "uniform"], "--scene unbounded needs --model hash"),
    (["--scene", "unbounded", "--model", "mlp"], "--scene unbounded needs --model hash"),
    (["--cascades", "9"], "--cascades must be in 1..8"),
    (["--cone-angle", "-1"], "--cone-angle must be >= 0"),
    (["--distortion", "-0.5"], "--distortion must be >= 0"),
    (["--appearance-dim", "8", "--sampler", "uniform"], "--appearance-dim needs the occupancy sampler"),
    (["--alpha-threshold", "1.5"], "--alpha-threshold must be in [0, 1)"),
    (["--cull", "off", "--early-stop", "1e-4"], "contradict --cull off"),
    (["--march-budget", "1000"], "--march-budget must be at least 32768"),
    (["--cull", "on", "--sampler", "uniform"], "--cull on needs the occupancy sampler"),
])
def test_rejected_flags(extra, message, capsys):
    from nerf import train

    with pytest.raises(SystemExit) as e:
        train.parse_args(extra)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_scene_defaults(capture_dirs):
    """--scene auto: unbounded for a capture with the occupancy sampler (cone angle, distortion loss on), bounded
    for the built-in scene and for the uniform sampler (the flags of the bounded paths keep their old values)."""
    from nerf import config, train, trainer

    _, dirs = capture_dirs
    for kind in dirs:
        c = train.parse_args(["--data", dirs[kind]])
        # cascades and cone angle come from the data (nerf.trainer.model_config)
        assert (c.scene, c.cone_angle, c.distortion, c.cascades) == (
            "unbounded", None, config.UNBOUNDED_DISTORTION, None)
    assert trainer.default_cone_angle(200.0) == 0.01 and trainer.default_cone_angle(1000.0) == 1 / 256
    assert trainer.default_cone_angle(50.0) == 1 / 50
    b = train.parse_args([])
    assert (b.scene, b.cone_angle, b.distortion, b.cascades, b.appearance_dim) == ("bounded", 0.0, 0.0, 1, 0)
    u = train.parse_args(["--data", dirs["colmap-bin"], "--sampler", "uniform"])
    assert (u.scene, u.distortion) == ("bounded", 0.0)
    assert train.parse_args(["--scene", "unbounded", "--distortion", "0"]).distortion == 0.0
    # culling: on for unbounded scenes (nerfacc's thresholds), off for bounded ones; the march budget 4x the samples
    c = train.parse_args(["--data", dirs["colmap-bin"]])
    assert (c.cull, c.early_stop, c.alpha_threshold, c.march_budget) == ("on", 1e-3, 1e-2, 4 * 2 ** 15)
    assert (b.cull, b.early_stop, b.alpha_threshold) == ("off", 0.0, 0.0)
    off = train.parse_args(["--data", dirs["colmap-bin"], "--cull", "off"])
    assert (off.early_stop, off.alpha_threshold) == (0.0, 0.0)
    assert train.parse_args(["--early-stop", "1e-3"]).alpha_threshold == 0.0  # the bounded flag as before


@pytest.mark.parametrize("kind", ["colmap-bin", "nerfstudio"])
def test_unbounded_full_path(capture_dirs, kind, tmp_path):
    """train.py --data on the capture (unbounded by default, appearance vectors), a few steps; the saved model
    renders a capture camera given in the data's own frame (its intrinsics and COLMAP-frame pose) as the rays of
    the same camera in the scene frame; export.py writes a mesh of the unit region and the occupied cells of all
    cascades in the data's frame."""
    from nerf import export, train, trainer
    from nerf.data import capture_writers as writers
    from nerf.data import load_dataset, normalise
    from nerf.data.rays import pinhole_rays

    cap, dirs = capture_dirs
    out = str(tmp_path / "run")
    doc = train.run(["--data", dirs[kind], *TRAIN_SMALL, "--appearance-dim", "4", "--out", out])
    assert np.isfinite(doc["final"]["test_psnr"]) and doc["final"]["reload_max_abs_diff"] < 1e-6
    ds = load_dataset(dirs[kind], holdout_every=4)
    # cascades from the data's far distance: the sparse points' (COLMAP) reach 9.3 scene units → 5; without
    # points (this transforms.json) far is unknown (1000) → the most, 8
    K = {"colmap-bin": 5, "nerfstudio": 8}[kind]
    assert trainer.default_cascades(ds.far, 1.0) == K
    assert len(doc["evals"][-1]["occupied_per_cascade"]) == K
    model = models.load_model(os.path.join(out, "model"))
    c = model.cfg
    assert (c["unbounded"], c["cascades"], c["appearance_dim"], c["n_appearance"], c["background"]) == (
        True, K, 4, 12, [0.0, 0.0, 0.0])
    assert c["cone_angle"] == 1 / 50  # 64x48 images, focal ~50 px: 2/focal clamped to 1/50
    np.testing.assert_allclose(model.world_to_scene, ds.world_to_scene, atol=1e-12)
    # capture view 1 (PINHOLE camera) as a user has it: intrinsics and camera-to-world in the data (COLMAP) frame
    cam = cap.camera(int(cap.camera_index[1]))
    intr = (cam.fx, cam.fy, cam.cx, cam.cy)
    c2w_data = writers.data_c2w(cap)[1]
    rgb, depth, _ = models.render_image(model, Camera.pinhole(64, 48, *intr), c2w_data, frame="data")
    want, _, _ = models.render_rays(model, *pinhole_rays(48, 64, intr, normalise.apply(ds.world_to_scene, c2w_data)))
    assert np.isfinite(depth).all()
    np.testing.assert_allclose(rgb, want, atol=1e-5)
    # geometry out: a density level the briefly trained field crosses inside the unit region
    density, _ = export.model_fields(model)
    grid = np.stack(np.meshgrid(*[np.linspace(-0.9, 0.9, 12)] * 3), -1).reshape(-1, 3).astype(np.float32)
    level = float(np.median(density(grid)))
    s = export.main([os.path.join(out, "model"), "--out", str(tmp_path / "geo"), "--resolution", "12",
                     "--threshold", f"{level:.6g}"])
    assert s["vertices"] > 0 and s["points"] == len(export.occupied_cell_centres(model.grid))
    from nerf import mesh

    pts = mesh.read_ply(str(tmp_path / "geo" / "points.ply"))[0]
    # the points are in the data's frame: mapped back into the scene frame they lie within the outermost cascade
    scene_pts = normalise.transform_points(ds.world_to_scene, pts)
    assert np.max(np.abs(scene_pts)) <= 2.0 ** (K - 1) + 1e-3 and len(pts) == s["points"]


@pytest.mark.parametrize("kw", [dict(SMALL, unbounded=True, cascades=3, cone_angle=1 / 64, early_stop=1e-3,
                                     alpha_threshold=1e-2),
                                dict(n_levels=4, log2_hashmap_size=12, finest_resolution=64, n_samples=8)],
                         ids=["occupancy-unbounded-culled", "uniform"])
def test_feature_major_model_gives_the_same_bits(kw):
    """feature_major=True (the layout train.py picks where a GPU runs the model): the hash grid's [L*F, M] encoding
    read in place by the density MLP gives, from the same initial weights, bitwise the same render, density and
    gradients as the point-major model, and the features transposed."""
    rng = np.random.default_rng(1)
    o = rng.uniform(-0.3, 0.3, (32, 3)).astype(np.float32) + np.float32([0, 0, 2.5])
    d = rng.normal(size=(32, 3)).astype(np.float32) * 0.2 + np.float32([0, 0, -1])
    d /= np.linalg.norm(d, axis=-1, keepdims=True)
    got = {}
    for fm in (False, True):
        tf.keras.utils.set_random_seed(5)
        model = models.build_model("hash", feature_major=fm, **kw)
        with tf.GradientTape() as tape:
            out = model(tf.constant(o), tf.constant(d), training=True, jitter_seed=tf.constant([1, 2]))
            loss = tf.reduce_sum(out["color"] ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        got[fm] = (out["color"].numpy(), out["features"].numpy(),
                   model.density(tf.constant(o)).numpy(), [np.asarray(tf.convert_to_tensor(g)) for g in grads])
        assert model.cfg.get("feature_major", False) is fm
    (c0, f0, s0, g0), (c1, f1, s1, g1) = got[False], got[True]
    assert f0.shape[0] > 0
    np.testing.assert_array_equal(c1, c0)
    np.testing.assert_array_equal(f1, f0.T)
    np.testing.assert_array_equal(s1, s0)
    for a, b in zip(g1, g0):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="feature_major needs mlp='fused'"):
        models.build_model("hash", feature_major=True, mlp="keras", **kw)
