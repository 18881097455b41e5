"""Rendering a saved NeRF from a camera (examples/nerf/models.py ``render_image``) and along a trajectory
(examples/nerf/render.py): any COLMAP camera with its distortion, the pose's frame, the pixels without a ray, the
deprecated (H, W, focal or intrinsics) form, and render.py's PNGs, MP4 and argument errors.

A stand-in model whose colour is its ray's direction and whose depth is a linear function of its origin shows
exactly which rays ``render_image`` renders."""

import doctest
import os

import imageio.v2 as iio2
import imageio.v3 as iio
import numpy as np
import pytest
import tensorflow as tf

from nerf import models, render
from nerf.data import normalise
from nerf.data.cameras import Camera, camera_directions
from support import scripts

pytestmark = pytest.mark.nerf  # the NeRF example's tests: `pytest tests -m nerf` (README)

OPENCV = Camera(32, 24, "OPENCV", (25.0, 26.0, 16.5, 12.5, -0.1, 0.02, 0.003, -0.002))  # k1 = -0.1
FOLDED = Camera(32, 24, "SIMPLE_RADIAL", (10.0, 16.0, 12.0, -0.9))  # folds over near the corners: no ray there
DEPTH_OF_ORIGIN = np.array([1.0, 2.0, 3.0])  # the stand-in's depth: this · ray origin


class RayEcho:
    """A model whose colour is ``(d + 1) / 2`` of its unit ray direction ``d``, depth ``DEPTH_OF_ORIGIN · o`` of its
    origin ``o`` and opacity 1: its renders hold the rays it was given."""

    def __init__(self, world_to_scene=None):
        if world_to_scene is not None:
            self.world_to_scene = world_to_scene

    def __call__(self, o, d, training=False):
        return dict(color=(d + 1.0) / 2.0, depth=tf.linalg.matvec(o, tf.constant(DEPTH_OF_ORIGIN, tf.float32)),
                    opacity=tf.ones_like(o[:, 0]))


def similarity():
    """A world → scene similarity: rotated about x and z, scaled by 0.4, moved."""
    a, b = np.radians(35.0), np.radians(-20.0)
    Rz = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])
    Rx = np.array([[1, 0, 0], [0, np.cos(b), -np.sin(b)], [0, np.sin(b), np.cos(b)]])
    T = np.eye(4)
    T[:3, :3], T[:3, 3] = 0.4 * Rz @ Rx, [0.3, -1.2, 0.5]
    return T


def pose():
    """A camera-to-world pose off every axis."""
    from nerf.data.rays import look_at

    return look_at([2.0, -3.0, 1.5], target=[0.2, 0.1, -0.3])


def colmap_rays(camera: Camera, c2w):
    """Unit directions ``[H, W, 3]`` through the pixel centres by pycolmap's ``Camera.cam_from_img`` (undistorted
    normalised coordinates, OpenCV axes), posed at ``c2w`` in the OpenGL convention."""
    u, v = np.meshgrid(np.arange(camera.width) + 0.5, np.arange(camera.height) + 0.5, indexing="xy")
    xy = np.asarray(camera.colmap.cam_from_img(np.stack([u.ravel(), v.ravel()], -1)), np.float64).reshape(-1, 2)
    local = np.concatenate([xy, np.ones((len(xy), 1))], -1) * np.array([1.0, -1.0, -1.0])  # OpenCV → OpenGL
    d = local @ np.asarray(c2w, np.float64)[:3, :3].T
    return (d / np.linalg.norm(d, axis=-1, keepdims=True)).reshape(camera.height, camera.width, 3)


def test_a_distorted_camera_renders_the_rays_pycolmap_unprojects():
    c2w = pose()
    rgb, depth, opacity = models.render_image(RayEcho(), OPENCV, c2w, frame="scene")
    assert rgb.shape == (24, 32, 3) and depth.shape == opacity.shape == (24, 32)
    np.testing.assert_allclose(2 * rgb - 1, colmap_rays(OPENCV, c2w), atol=1e-5)
    np.testing.assert_allclose(depth, DEPTH_OF_ORIGIN @ c2w[:3, 3], rtol=1e-6)
    # negative control: the pinhole part of the camera has other rays
    pinhole = Camera.pinhole(32, 24, *OPENCV.params[:4])
    assert np.max(np.abs(colmap_rays(pinhole, c2w) - colmap_rays(OPENCV, c2w))) > 1e-2


def test_data_frame_is_the_scene_frame_through_world_to_scene():
    T = similarity()
    model = RayEcho(T)
    c2w_data = pose()
    a = models.render_image(model, OPENCV, c2w_data)  # frame="data" by default
    b = models.render_image(model, OPENCV, normalise.apply(T, c2w_data), frame="scene")
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, atol=1e-5)
    np.testing.assert_allclose(a[1], DEPTH_OF_ORIGIN @ normalise.transform_points(T, c2w_data[:3, 3]), rtol=1e-5)
    unmapped = models.render_image(model, OPENCV, c2w_data, frame="scene")
    assert np.max(np.abs(unmapped[0] - a[0])) > 1e-2
    # a model without world_to_scene: the data frame is its frame
    plain = RayEcho()
    np.testing.assert_array_equal(models.render_image(plain, OPENCV, c2w_data)[0],
                                  models.render_image(plain, OPENCV, c2w_data, frame="scene")[0])


def test_pixels_without_a_ray_render_as_zero():
    valid = np.all(np.isfinite(camera_directions(FOLDED)), -1)
    assert 0 < valid.mean() < 1
    rgb, depth, opacity = models.render_image(RayEcho(), FOLDED, pose(), frame="scene")
    assert np.all(rgb[~valid] == 0) and np.all(depth[~valid] == 0) and np.all(opacity[~valid] == 0)
    assert np.all(opacity[valid] == 1) and np.all(np.isfinite(rgb))
    np.testing.assert_allclose((2 * rgb - 1)[valid], colmap_rays(FOLDED, pose())[valid], atol=1e-5)


def test_deprecated_form_warns_and_matches_the_camera_form():
    T = similarity()
    model = RayEcho(T)
    c2w = pose()
    with pytest.warns(DeprecationWarning, match=r'render_image\(model, Camera\.pinhole\(5, 6, 7\.0, 7\.0, 2\.5, 3\.0\), '
                                                r'c2w, frame="scene"\)'):
        old = models.render_image(model, 6, 5, 7.0, c2w, chunk=8)
    new = models.render_image(model, Camera.pinhole(5, 6, 7.0, 7.0, 2.5, 3.0), c2w, frame="scene")
    for x, y in zip(old, new):
        np.testing.assert_array_equal(x, y)
    with pytest.warns(DeprecationWarning, match=r'Camera\.pinhole\(5, 6, 7\.0, 8\.0, 2\.0, 3\.5\), c2w, '
                                                r'frame="data"\)'):
        old = models.render_image(model, 6, 5, (7.0, 8.0, 2.0, 3.5), c2w)
    new = models.render_image(model, Camera.pinhole(5, 6, 7.0, 8.0, 2.0, 3.5), c2w, frame="data")
    for x, y in zip(old, new):
        np.testing.assert_array_equal(x, y)


def test_bad_arguments_are_value_errors():
    model, c2w = RayEcho(), pose()
    with pytest.raises(ValueError, match=r"frame must be 'data' .* or 'scene' .*got 'world'"):
        models.render_image(model, OPENCV, c2w, frame="world")
    with pytest.raises(ValueError, match=r"camera must be a nerf\.data\.cameras\.Camera"):
        models.render_image(model, (25.0, 25.0, 16.0, 12.0), c2w)
    with pytest.raises(ValueError, match=r"c2w must be a finite 4x4"):
        models.render_image(model, OPENCV, np.eye(3))
    with pytest.raises(ValueError, match=r"c2w must be a finite 4x4"):
        models.render_image(model, OPENCV, np.full((4, 4), np.nan))
    with pytest.raises(ValueError, match=r"OPENCV takes 8 parameters"):
        models.render_image(model, Camera(32, 24, "OPENCV", (25.0, 25.0, 16.0, 12.0)), c2w)
    with pytest.raises(ValueError, match=r"camera must be a nerf\.data\.cameras\.Camera .* focal length"):
        models.render_image(model, 6, 5, np.eye(3), c2w)


def test_docstring_examples_run():
    for fn in (models.render_image, models.scene_pose):
        tests = [t for t in doctest.DocTestFinder(recurse=False).find(fn, fn.__name__, globs=vars(models))
                 if t.examples]
        assert len(tests) == 1, fn.__name__
        result = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE).run(tests[0])
        assert result.failed == 0 and result.attempted > 0, fn.__name__
    result = doctest.testmod(render, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


# ------------------------------------------------------------------------------------------------- render.py


@pytest.fixture(scope="module")
def capture_and_model(tmp_path_factory):
    """A 4-view COLMAP capture of the unbounded test scene (its 5 camera models: pinhole, radial, OpenCV, ...) and
    an untrained unbounded hash model saved with the capture's world → scene similarity."""
    from nerf.data import capture_writers as writers
    from nerf.data import load_dataset
    from nerf.data import unbounded_scene as scene

    root = tmp_path_factory.mktemp("render")
    cap = scene.render(n_views=4, ss=1, n_points=50)
    writers.write_colmap(str(root / "capture"), cap, binary=True, ext="png")
    ds = load_dataset(str(root / "capture"), holdout_every=2)
    m = models.build_model("hash", n_levels=4, log2_hashmap_size=12, finest_resolution=64, sampler="occupancy",
                           grid_resolution=16, grid_warmup_steps=0, near=0.05, unbounded=True, cascades=2)
    m.grid.update(lambda x: 100.0 * tf.cast(tf.norm(x, axis=-1) < 0.6, tf.float32), step=0, seed=1)
    models.save_model(m, str(root / "model"), world_to_scene=ds.world_to_scene)
    return str(root / "capture"), str(root / "model"), ds


def test_orbit_writes_pngs_and_an_mp4(capture_and_model, tmp_path):
    _, model_dir, _ = capture_and_model
    out = str(tmp_path / "orbit")
    doc = render.main([model_dir, "--out", out, "--orbit", "3", "--focal", "20", "--size", "33x20", "--radius", "1.5",
                       "--fps", "5"])
    assert [os.path.basename(p) for p in doc["pngs"]] == ["frame_000.png", "frame_001.png", "frame_002.png"]
    frames = [iio.imread(p) for p in doc["pngs"]]
    assert all(f.shape == (20, 33, 3) and f.dtype == np.uint8 for f in frames)
    assert not np.array_equal(frames[0], frames[1])  # the camera moved
    video = iio2.mimread(doc["mp4"])
    assert doc["mp4"] == os.path.join(out, "render.mp4") and len(video) == 3
    assert video[0].shape == (20, 34, 3)  # one black column: H.264 4:2:0 needs an even width
    # lossy, but the same pictures: each video frame is nearest to its own PNG
    err = np.array([[np.abs(v[:, :33].astype(float) - f).mean() for f in frames] for v in video])
    assert np.array_equal(err.argmin(axis=1), [0, 1, 2]) and err.diagonal().max() < 8, err


def test_test_views_render_from_their_own_cameras_in_the_data_frame(capture_and_model, tmp_path):
    """--views test: each held-out view from its camera (distortion included) and its COLMAP-frame pose, as the
    evaluation renders it from the dataset's scene-frame rays."""
    capture, model_dir, ds = capture_and_model
    doc = render.main([model_dir, "--out", str(tmp_path / "test"), "--views", "test", "--data", capture,
                       "--holdout-every", "2", "--no-mp4"])
    assert doc["mp4"] is None and len(doc["pngs"]) == len(ds.test) == 2
    assert {c.model for c in ds.test.cameras} == {"SIMPLE_PINHOLE", "SIMPLE_RADIAL"}
    model = models.load_model(model_dir)
    for k, path in enumerate(doc["pngs"]):
        want, _, _ = models.render_rays(model, *ds.rays("test", k))
        assert np.abs(iio.imread(path).astype(float) - want * 255).max() <= 0.5 + 1e-3
    # the orbit from the capture: its first test camera on the training cameras' circle
    doc = render.main([model_dir, "--out", str(tmp_path / "orbit"), "--orbit", "2", "--data", capture,
                       "--holdout-every", "2", "--no-mp4"])
    assert [iio.imread(p).shape for p in doc["pngs"]] == [(48, 64, 3)] * 2


def test_bad_arguments_are_one_line_errors_before_tensorflow(capture_and_model, tmp_path):
    capture, model_dir, _ = capture_and_model
    out = str(tmp_path / "out")
    orbit = ["--orbit", "3", "--focal", "20", "--size", "32x24", "--radius", "2"]
    cases = [([str(tmp_path / "missing"), "--out", out, *orbit], "missing: no such directory"),
             ([model_dir, "--out", out], "one of the arguments --views --orbit is required"),
             ([model_dir, "--out", out, "--orbit", "0", "--focal", "20", "--size", "32x24", "--radius", "2"],
              "--orbit must be at least 1 view"),
             ([model_dir, "--out", out, "--orbit", "3"], "--orbit needs a camera"),
             ([model_dir, "--out", out, "--orbit", "3", "--focal", "20", "--size", "32x24"],
              "--orbit without --data needs --radius"),
             ([model_dir, "--out", out, "--orbit", "3", "--focal", "20", "--size", "32by24", "--radius", "2"],
              "--size must be WIDTHxHEIGHT"),
             ([model_dir, "--out", out, "--orbit", "3", "--focal", "20", "--radius", "2"],
              "--focal and --size go together"),
             ([model_dir, "--out", out, *orbit, "--fps", "0"], "--fps must be positive"),
             ([model_dir, "--out", out, *orbit, "--elevation", "90"], "--elevation must be between -90 and 90"),
             ([model_dir, "--out", out, "--views", "test"], "give it with --data"),
             ([model_dir, "--out", out, "--views", "test", "--data", str(tmp_path / "nothing")], "nothing"),
             ([model_dir, "--out", out, "--views", "test", "--data", capture, "--focal", "20", "--size", "32x24"],
              "--views renders each view's own camera"),
             ([model_dir, "--out", os.path.join(model_dir, "model.json"), *orbit], "exists and is not a directory")]
    for argv, message in cases:
        p = scripts.run_nerf_main("render", argv)
        assert p.returncode == 2, (argv, p.stderr)
        last = p.stderr.strip().splitlines()[-1]  # argparse: the usage, then one line with the error
        assert "error: " in last and message in last and "Traceback" not in p.stderr, (argv, p.stderr)
        assert "tensorflow imported: False" in p.stdout, argv
    assert not os.path.exists(out)
