"""The NeRF example's camera convention and built-in synthetic scene (examples/nerf/data)."""

import json
import math
import os

import numpy as np
import pytest

from nerf.data import get_rays, load_dataset, look_at, project
from nerf.data import synthetic
from nerf.data.rays import focal_from_fov, spherical_pose

pytestmark = pytest.mark.nerf  # the NeRF example's tests: `pytest tests -m nerf` (README)

SMALL = dict(H=24, W=32, n_train=6, n_val=2, n_test=3, ss=1)


def test_focal_matches_tiny_nerf():
    assert focal_from_fov(100, synthetic.CAMERA_ANGLE_X) == pytest.approx(138.8889, abs=1e-3)


def test_project_known_point_lands_on_expected_pixel():
    H, W, focal = 60, 80, 70.0
    c2w = look_at((0.0, -4.0, 0.0))  # on the -y axis looking at the origin, world +z up
    # camera axes: looking down -z = +y world, image x = world +x, image up = world +z
    np.testing.assert_allclose(c2w[:3, 2], [0, -1, 0], atol=1e-12)
    np.testing.assert_allclose(c2w[:3, 0], [1, 0, 0], atol=1e-12)
    np.testing.assert_allclose(c2w[:3, 1], [0, 0, 1], atol=1e-12)
    # a point 0.5 right and 0.25 up, 4 in front: u = W/2 + f*0.5/4, v = H/2 - f*0.25/4
    p = np.array([0.5, 0.0, 0.25])
    uv, depth = project(p, H, W, focal, c2w)
    assert depth == pytest.approx(4.0)
    np.testing.assert_allclose(uv, [W / 2 + focal * 0.5 / 4, H / 2 - focal * 0.25 / 4])
    col, row = int(np.floor(uv[0])), int(np.floor(uv[1]))
    assert (row, col) == (25, 48)
    # the ray through that pixel's centre passes within half a pixel's footprint of the point
    o, d = get_rays(H, W, focal, c2w)
    assert o.shape == d.shape == (H, W, 3)
    np.testing.assert_allclose(np.linalg.norm(d, axis=-1), 1.0, atol=1e-6)
    v = p - o[row, col]
    dist = np.linalg.norm(v - (v @ d[row, col]) * d[row, col])
    assert dist < 0.5 * 4.0 / focal * math.sqrt(2)
    # and a point placed exactly on a pixel-centre ray projects back to that pixel centre
    q = o[7, 11] + 3.3 * d[7, 11]
    np.testing.assert_allclose(project(q, H, W, focal, c2w)[0], [11.5, 7.5], atol=1e-4)


def test_get_rays_batch_and_general_pose():
    poses = np.stack([spherical_pose(4.0, a, e) for a, e in [(0.3, 0.2), (2.0, 1.0)]])
    o, d = get_rays(10, 12, 20.0, poses)
    assert o.shape == (2, 10, 12, 3)
    pts = o + 2.5 * d
    for k in range(2):
        uv, depth = project(pts[k], 10, 12, 20.0, poses[k])
        jj, ii = np.meshgrid(np.arange(10) + 0.5, np.arange(12) + 0.5, indexing="ij")
        np.testing.assert_allclose(uv[..., 0], ii, atol=1e-3)
        np.testing.assert_allclose(uv[..., 1], jj, atol=1e-3)
        assert np.all(depth > 0)


def test_rendered_images_follow_the_camera_convention(tmp_path):
    """Project each primitive's centre with the pose: the rendered pixel there shows that primitive."""
    ds = load_dataset("builtin", cache=str(tmp_path), background=(0, 0, 0), H=64, W=64, n_train=4, n_val=1,
                      n_test=1, ss=1)
    top = synthetic.SCENE[-1]  # the small orange sphere floating above everything: never occluded from above
    for img, alpha, c2w in zip(ds.train.images, ds.train.alphas, ds.train.poses):
        uv, depth = project(top.c, ds.H, ds.W, ds.focal, c2w)
        col, row = int(uv[0]), int(uv[1])
        assert alpha[row, col] == 1.0
        expected = synthetic.trace(*(a.reshape(-1, 3) for a in get_rays(ds.H, ds.W, ds.focal, c2w)))
        np.testing.assert_allclose(img[row, col], expected.reshape(ds.H, ds.W, 4)[row, col, :3], atol=1 / 255)
        r, g, b = img[row, col]
        assert r > 0.2 and r > g and r > b, "the orange/pink sphere should be reddish where its centre projects"
        # the image corner is empty background (the scene fits well inside the field of view)
        assert alpha[0, 0] == 0 and np.all(img[0, 0] == 0)


def test_deterministic_and_seeded(tmp_path):
    a = synthetic.generate(synthetic.SceneParams(**SMALL, seed=3))
    b = synthetic.generate(synthetic.SceneParams(**SMALL, seed=3))
    c = synthetic.generate(synthetic.SceneParams(**SMALL, seed=4))
    for k in ("train_rgba", "train_poses", "test_rgba", "val_poses"):
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["train_poses"], c["train_poses"])
    np.testing.assert_array_equal(a["test_poses"], c["test_poses"])  # held-out cameras are fixed


def test_split_has_no_test_camera_in_training_set():
    poses = synthetic.camera_poses(synthetic.SceneParams())
    centres = {k: v[:, :3, 3] for k, v in poses.items()}
    for held in ("val", "test"):
        d = np.linalg.norm(centres[held][:, None] - centres["train"][None], axis=-1)
        assert d.min() > 2 * 4.0 * math.sin(math.radians(4.9) / 2), f"a {held} camera is (almost) a training camera"
    assert len(poses["train"]) == 100 and len(poses["test"]) == 16
    for v in centres.values():  # hemisphere of radius 4 above the floor, all looking at the origin
        np.testing.assert_allclose(np.linalg.norm(v, axis=-1), 4.0, rtol=1e-6)
        assert np.all(v[:, 2] > 0)
    fwd = -poses["train"][:, :3, 2]
    np.testing.assert_allclose(np.einsum("ni,ni->n", fwd, -centres["train"] / 4.0), 1.0, atol=1e-9)


def test_scene_is_rich():
    """Texture detail and coverage: a view has many distinct colours and strong local contrast."""
    p = synthetic.SceneParams()
    rgba = synthetic.render_view(p, synthetic.camera_poses(p)["test"][0])
    a = rgba[..., 3]
    assert 0.15 < (a > 0.5).mean() < 0.8
    rgb = rgba[..., :3][a > 0.99]
    assert len(np.unique(np.round(rgb * 15), axis=0)) > 50
    grad = np.abs(np.diff(rgba[..., :3], axis=1)).sum(-1)[a[:, 1:] > 0.99]
    assert (grad > 0.3).mean() > 0.05  # checker/stripe edges


def test_full_generation_time_and_cache(tmp_path, capsys):
    """The default scene (124 views of 100x100, 4x4 supersampled) generates in well under a minute and is cached."""
    ds = load_dataset("builtin", cache=str(tmp_path))
    secs = ds.info["gen_seconds"]
    with capsys.disabled():
        print(f"\n[nerf] built-in scene generated in {secs:.2f} s -> {ds.info['cache']}")
    assert secs < 60
    assert not ds.info["cached"] and os.path.isfile(ds.info["cache"])
    assert ds.train.images.shape == (100, 100, 100, 3) and ds.test.images.shape == (16, 100, 100, 3)
    assert ds.train.images.dtype == np.float32 and 0 <= ds.train.images.min() and ds.train.images.max() <= 1
    assert ds.focal == pytest.approx(138.8889, abs=1e-3) and (ds.near, ds.far) == (2.0, 6.0)
    mtime = os.path.getmtime(ds.info["cache"])
    again = load_dataset("builtin", cache=str(tmp_path))
    assert again.info["cached"] and os.path.getmtime(again.info["cache"]) == mtime
    np.testing.assert_array_equal(again.test.images, ds.test.images)
    assert json.loads(str(np.load(ds.info["cache"])["params_json"]))["n_train"] == 100
    # compositing: white background where alpha = 0
    m = ds.test.alphas == 0
    assert m.any() and np.all(ds.test.images[m] == 1.0)


def test_bad_parameter_is_a_clear_error(tmp_path):
    from nerf.data import DatasetError

    with pytest.raises(DatasetError, match="n_trian"):
        load_dataset("builtin", cache=str(tmp_path), n_trian=3)
