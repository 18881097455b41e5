"""NeRF example models and training script (examples/nerf/models.py, train.py) on tiny configurations."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from nerf import models
from nerf.data import synthetic
from nerf.data.cameras import Camera

import tf_metal_ops
from support.paths import EXAMPLES

pytestmark = pytest.mark.nerf  # the NeRF example's tests: `pytest tests -m nerf` (README)


def rays(n, seed=0):
    rng = np.random.default_rng(seed)
    o = rng.normal(size=(n, 3))
    o = 4 * o / np.linalg.norm(o, axis=1, keepdims=True)
    d = -o / 4 + 0.05 * rng.normal(size=(n, 3))
    return tf.constant(o, tf.float32), tf.constant(d / np.linalg.norm(d, axis=1, keepdims=True), tf.float32)


def test_stratified_samples_and_edges():
    near, far = tf.constant([2.0, 3.0]), tf.constant([6.0, 3.5])
    t, e = models.stratified_t(near, far, 8, perturb=False)
    np.testing.assert_allclose(e.numpy()[0], np.linspace(2, 6, 9), atol=1e-5)  # bin boundaries
    np.testing.assert_allclose(t.numpy()[0], np.linspace(2.25, 5.75, 8), atol=1e-5)  # bin centres
    t, e = models.stratified_t(near, far, 8, perturb=True)
    t, e = t.numpy(), e.numpy()
    assert np.all(np.diff(e, axis=1) >= 0) and np.all(e[:, :1] <= t) and np.all(t <= e[:, -1:])
    assert np.all((e[:, :-1] <= t) & (t <= e[:, 1:]))
    np.testing.assert_allclose(e[:, [0, -1]], [[2, 6], [3, 3.5]])


def test_plain_tf_compositing_matches_the_package_op():
    rng = np.random.default_rng(1)
    sigma = tf.constant(rng.uniform(0, 3, (64, 16)), tf.float32)
    rgb = tf.constant(rng.uniform(0, 1, (64, 16, 3)), tf.float32)
    t, e = models.stratified_t(tf.fill([64], 2.0), tf.fill([64], 6.0), 16, perturb=True)
    bg = tf.constant([1.0, 0.5, 0.0])
    mine = models.composite_tf(sigma, rgb, e, t, bg)
    ref = tf_metal_ops.volume_render(sigma, rgb, e, background=bg)
    for a, b in zip((mine[0], mine[2], mine[3]), (ref.color, ref.opacity, ref.weights)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=2e-5)


def test_sh_encoding_is_orthonormal():
    d = tf.random.normal([200000, 3], seed=3)
    d = d / tf.norm(d, axis=-1, keepdims=True)
    y = models.sh_encoding_deg4(d).numpy()
    gram = 4 * np.pi * (y.T @ y) / len(y)  # Monte Carlo integral over the sphere
    np.testing.assert_allclose(gram, np.eye(16), atol=0.05)


@pytest.mark.parametrize("kind, cfg", [("mlp", dict(n_samples=8)),
                                       ("hash", dict(n_samples=8, implementation="op", log2_hashmap_size=12)),
                                       ("hash", dict(n_samples=8, implementation="pure_tf", log2_hashmap_size=12))])
def test_models_shapes_and_save_reload(tmp_path, kind, cfg):
    m = models.build_model(kind, **cfg)
    o, d = rays(37)
    out = m(o, d, training=False)
    assert out["color"].shape == (37, 3) and out["depth"].shape == (37,) and out["weights"].shape == (37, 8)
    assert out["edges"].shape == (37, 9)
    assert np.all(np.isfinite(out["color"].numpy()))
    models.save_model(m, str(tmp_path / "m"))
    m2 = models.load_model(str(tmp_path / "m"))
    np.testing.assert_array_equal(m2(o, d)["color"].numpy(), out["color"].numpy())
    c2w = synthetic.camera_poses(synthetic.SceneParams(n_train=1, n_val=0, n_test=1))["test"][0]
    cam = Camera.pinhole(5, 6, 7.0, 7.0, 2.5, 3.0)  # 5 wide, 6 high
    img, depth, acc = models.render_image(m2, cam, c2w, frame="scene", chunk=8)
    assert img.shape == (6, 5, 3) and depth.shape == acc.shape == (6, 5)


def test_hash_model_mlp_option_and_models_saved_without_it(tmp_path):
    """mlp="fused" (FusedMLP layers) and "keras" (Dense stacks) hold the same shapes; a model.json written before the
    option existed (no "mlp" key) loads with Dense layers; a width the fused MLP lacks is refused."""
    cfg = dict(n_samples=8, implementation="op", log2_hashmap_size=12)
    fused, dense = models.build_model("hash", **cfg), models.build_model("hash", mlp="keras", **cfg)
    assert [type(l).__name__ for l in fused.density_mlp + fused.color_mlp] == ["FusedMLP", "FusedMLP"]
    assert [type(l).__name__ for l in dense.density_mlp + dense.color_mlp] == ["Dense"] * 5
    # the same number of MLP parameters: padded [64, 32] + [16, 64] and [64, 32] + [64, 64] + [16, 64] matrices, the
    # output padding rows aside (they are zero and get no gradient)
    n_params = lambda m: sum(int(np.prod(w.shape)) for w in m.trainable_weights)  # noqa: E731
    assert n_params(fused) - n_params(dense) == (16 - 3) * 64
    models.save_model(dense, str(tmp_path / "m"))
    meta_path = tmp_path / "m" / "model.json"
    meta = json.loads(meta_path.read_text())
    assert meta["config"].pop("mlp") == "keras"
    meta_path.write_text(json.dumps(meta))
    o, d = rays(16)
    np.testing.assert_array_equal(models.load_model(str(tmp_path / "m"))(o, d)["color"].numpy(),
                                  dense(o, d)["color"].numpy())
    with pytest.raises(ValueError, match="hidden in 16, 32, 64, 128"):
        models.build_model("hash", hidden=48, **cfg)


def test_hash_op_and_pure_tf_models_agree():
    """Same weights, deterministic samples: the package ops and the pure-TF variant give the same rendering."""
    a = models.build_model("hash", n_samples=16, implementation="op", log2_hashmap_size=12)
    b = models.build_model("hash", n_samples=16, implementation="pure_tf", log2_hashmap_size=12)
    rng = np.random.default_rng(0)
    weights = [rng.normal(scale=0.3, size=w.shape).astype(np.float32) for w in a.get_weights()]
    a.set_weights(weights)
    b.set_weights(weights)
    o, d = rays(256)
    np.testing.assert_allclose(a(o, d)["color"].numpy(), b(o, d)["color"].numpy(), atol=1e-4)


# the occupancy sampler (the hash model's default) on the tiny scene: 8192 samples per step (~300 rays), a 32^3
# grid updated every 4 steps after 8 warm-up steps
OCCUPANCY_TINY = ["--sample-budget", "8192", "--grid-res", "32", "--grid-every", "4", "--grid-warmup", "8",
                  "--step-size", "0.04"]


def run_train(tmp_path, *extra, env_extra=None):
    """train.run in this process, with the scene cache in tmp_path."""
    from nerf import train  # examples/nerf/train.py

    os.environ["TF_METAL_OPS_CACHE"] = str(tmp_path / "cache")
    try:
        return train.run(["--scene-res", "24", "--batch-rays", "256", "--samples", "16", "--eval-views", "1",
                          "--final-views", "2", "--no-progress", "--out", str(tmp_path / "out"),
                          *OCCUPANCY_TINY, *extra])
    finally:
        del os.environ["TF_METAL_OPS_CACHE"]


@pytest.mark.parametrize("model", ["hash", "hash-uniform", "mlp"])
def test_train_end_to_end_outputs(tmp_path, model):
    extra = {"hash": ["--distortion", "0.001"],  # occupancy sampler: distortion_loss_packed
             "hash-uniform": ["--distortion", "0.001", "--sampler", "uniform"],
             "mlp": ["--jit", "off"]}[model]  # XLA compile time: not tested here
    m = run_train(tmp_path, "--model", model.split("-")[0], "--steps", "24", "--log2-table", "14", *extra)
    out = tmp_path / "out"
    with open(out / "metrics.json") as f:
        saved = json.load(f)
    evals = saved["evals"]
    assert len(evals) >= 3
    for e in evals:
        assert {"step", "train_seconds", "wall_seconds", "train_loss", "test_psnr", "samples_per_ray",
                "rays_per_step", "occupied_fraction"} <= set(e)
    assert len(saved["samples_per_ray"]) == len(saved["rays_per_step"]) == len(saved["train_losses"]) == 24
    if model != "hash":  # the uniform sampler: fixed batches
        assert set(saved["rays_per_step"]) == {256} and set(saved["samples_per_ray"]) == {16.0}
        assert all(e["occupied_fraction"] is None for e in evals)
    assert [e["step"] for e in evals] == sorted(e["step"] for e in evals)
    assert saved["final"]["reload_max_abs_diff"] < 1e-6
    losses = saved["train_losses"]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]), "the loss does not go down"
    renders = sorted(os.listdir(out / "renders"))
    assert "novel_view.png" in renders and "test_000.png" in renders and "test_001.png" in renders
    import imageio.v3 as iio

    sbs = iio.imread(out / "renders" / "test_000.png")
    assert sbs.shape == (24, 2 * 24 + 2, 3)  # ground truth | gap | prediction
    assert os.path.getsize(out / "psnr.png") > 1000
    assert (out / "model" / "model.json").exists()
    assert m["final"]["test_psnr"] == evals[-1]["test_psnr"]


@pytest.mark.parametrize("sampler", ["occupancy", "uniform"])
def test_hash_model_learns_the_scene(tmp_path, sampler):
    """A few hundred fast steps on a 24x24 built-in scene: well beyond the ~10 dB of a blank guess."""
    m = run_train(tmp_path, "--model", "hash", "--steps", "150", "--log2-table", "14", "--batch-rays", "512",
                  "--sample-budget", "8192", "--sampler", sampler)
    assert m["final"]["test_psnr"] > 17.0, m["evals"]


def test_learning_rate_decays_over_the_budget(tmp_path):
    m = run_train(tmp_path, "--model", "hash", "--steps", "10", "--log2-table", "12", "--lr", "0.02",
                  "--lr-decay", "0.05")
    lrs = [e["lr"] for e in m["evals"][:-1]]  # one evaluation per step; the final one repeats the last step
    assert len(lrs) >= 5 and all(a > b for a, b in zip(lrs, lrs[1:])), lrs
    # the last step ran at progress 9/10 of the budget
    np.testing.assert_allclose(m["evals"][-1]["lr"], 0.02 * 0.05 ** 0.9, rtol=1e-5)
    np.testing.assert_allclose(m["evals"][-1]["lr_table"], 3e-2 * 0.05 ** 0.9, rtol=1e-5)  # the table's own rate
    with pytest.raises(SystemExit):
        run_train(tmp_path, "--steps", "2", "--lr-decay", "0")


def test_pure_tf_hash_variant_trains_under_xla_with_distortion(tmp_path, capsys):
    m = run_train(tmp_path, "--model", "hash", "--impl", "pure_tf", "--distortion", "0.01", "--steps", "8",
                  "--log2-table", "12")
    assert "XLA train step: True" in capsys.readouterr().out
    assert np.all(np.isfinite(m["train_losses"])) and m["final"]["reload_max_abs_diff"] < 1e-6


def test_bad_data_path_is_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        run_train(tmp_path, "--data", str(tmp_path / "missing_dir"), "--steps", "2")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error: " in err and "missing_dir: no such file or directory" in err and "Traceback" not in err


def test_mirrored_strategy_matches_single_device(tmp_path):
    """Two logical CPU devices (a subprocess: they must be set before TF starts) vs one device (this process):
    same seed, same batches, no jitter → the same loss trajectory. (With Adam this checks that the replicas'
    gradients are combined and applied in sync; Adam is insensitive to a constant gradient scale.)"""
    common = ["--steps", "6", "--scene-res", "16", "--batch-rays", "256", "--samples", "16", "--log2-table", "12",
              "--no-jitter", "--eval-views", "1", "--final-views", "1", "--no-progress", "--sampler", "uniform"]
    env = dict(os.environ, TF_METAL_OPS_CACHE=str(tmp_path / "cache"), TF_CPP_MIN_LOG_LEVEL="3")
    cmd = [sys.executable, os.path.join(EXAMPLES, "nerf", "train.py"), "--strategy", "mirrored", *common,
           "--out", str(tmp_path / "mirrored")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    from nerf import train

    os.environ["TF_METAL_OPS_CACHE"] = str(tmp_path / "cache")
    try:
        single = train.run([*common, "--out", str(tmp_path / "default")])["train_losses"]
    finally:
        del os.environ["TF_METAL_OPS_CACHE"]
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr[-3000:]
    assert "replicas: 2" in stdout, stdout
    with open(tmp_path / "mirrored" / "metrics.json") as f:
        mirrored = json.load(f)["train_losses"]
    assert len(mirrored) == len(single) == 6
    np.testing.assert_allclose(mirrored, single, rtol=2e-3)


def test_fused_adam_matches_keras_adam():
    """nerf.fused_adam.apply (ResourceApplyAdam on the optimiser's own slots) takes the steps Keras Adam's
    apply_gradients takes, with the NeRF trainer's table settings, over several steps and learning rates."""
    from nerf import fused_adam

    rng = np.random.default_rng(7)
    init = [rng.normal(size=s).astype(np.float32) for s in ((300, 2), (17,))]
    grads = [[tf.constant(rng.normal(size=a.shape).astype(np.float32)) for a in init] for _ in range(5)]
    final = {}
    for kind in ("keras", "fused"):
        vs = [keras.Variable(a) for a in init]
        opt = keras.optimizers.Adam(1e-2, beta_2=0.99, epsilon=1e-15)
        opt.build(vs)
        for step, g in enumerate(grads):
            opt.learning_rate = 1e-2 * 0.9 ** step
            if kind == "keras":
                opt.apply_gradients(zip(g, vs))
            else:
                fused_adam.apply(opt, g, vs)
        assert int(opt.iterations.numpy()) == 5
        final[kind] = [v.numpy() for v in vs]
    for a, b, x0 in zip(final["keras"], final["fused"], init):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)
        assert np.abs(a - x0).max() > 1e-2  # they moved
    with pytest.raises(ValueError, match="plain Adam"):
        fused_adam.apply(keras.optimizers.Adam(amsgrad=True), [], [])
