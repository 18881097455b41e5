"""Camera models of the NeRF example's capture loaders (examples/nerf/data/cameras.py): the per-pixel inversion of
the OpenCV distortion against the forward model in NumPy and against pycolmap's own unprojection."""

import numpy as np
import pycolmap
import pytest

from nerf.data.cameras import (COLMAP_MODELS, Camera, CameraModelError, camera_directions, colmap_camera, distort,
                               undistort)
from nerf.data.unbounded_scene import CAMERAS

pytestmark = pytest.mark.nerf  # the NeRF example's tests: `pytest tests -m nerf` (README)

# (k1, k2, k3, p1, p2): the test capture's models and stronger ones (a wide-angle lens, tangential skew)
DISTORTIONS = [(-0.08, 0, 0, 0, 0), (-0.12, 0.03, 0, 0, 0), (-0.1, 0.02, 0, 0.003, -0.002),
               (-0.3, 0.1, -0.01, 0.001, 0.001), (0.15, -0.05, 0.01, -0.004, 0.002)]


@pytest.mark.parametrize("dist", DISTORTIONS)
def test_undistort_inverts_the_forward_model(dist):
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-0.7, 0.7, (2, 5000))  # normalised coordinates of a ~70° field of view
    xd, yd = distort(x, y, dist)
    assert np.max(np.hypot(xd - x, yd - y)) > 1e-3  # the distortion does move the points
    ux, uy, residual = undistort(xd, yd, dist)
    np.testing.assert_allclose(ux, x, atol=1e-10)
    np.testing.assert_allclose(uy, y, atol=1e-10)
    assert residual < 1e-12
    # and the other way round: distorting the undistorted pixel grid gives the grid back
    gx, gy = np.meshgrid(np.linspace(-0.6, 0.6, 41), np.linspace(-0.45, 0.45, 31))
    ux, uy, _ = undistort(gx, gy, dist)
    dx, dy = distort(ux, uy, dist)
    np.testing.assert_allclose(dx, gx, atol=1e-10)
    np.testing.assert_allclose(dy, gy, atol=1e-10)


def test_jacobian_of_newton_matches_finite_differences():
    from nerf.data.cameras import _jacobian

    rng = np.random.default_rng(1)
    x, y = rng.uniform(-0.6, 0.6, (2, 100))
    for dist in DISTORTIONS:
        h = 1e-6
        num = [(np.array(distort(x + h, y, dist)) - np.array(distort(x - h, y, dist))) / (2 * h),
               (np.array(distort(x, y + h, dist)) - np.array(distort(x, y - h, dist))) / (2 * h)]
        a, b, c, d = _jacobian(x, y, dist)
        np.testing.assert_allclose(np.stack([a, c]), num[0], atol=1e-6)
        np.testing.assert_allclose(np.stack([b, d]), num[1], atol=1e-6)


@pytest.mark.parametrize("model, params", CAMERAS + (("OPENCV", (40.0, 41.0, 30.0, 25.0, -0.3, 0.1, 0.001, 0.001)),))
def test_pixel_directions_match_pycolmap(model, params):
    """Each COLMAP model: the directions through the pixel centres are pycolmap's unprojection of those pixels."""
    cam = colmap_camera(model, 64, 48, params)
    d = camera_directions(cam)
    ref = pycolmap.Camera(model=model, width=64, height=48, params=list(params))
    u, v = np.meshgrid(np.arange(64) + 0.5, np.arange(48) + 0.5, indexing="xy")
    xy = ref.cam_from_img(np.stack([u.ravel(), v.ravel()], -1))
    want = np.concatenate([xy[:, :1], -xy[:, 1:], -np.ones((len(xy), 1))], -1)  # OpenCV → OpenGL axes
    want /= np.linalg.norm(want, axis=-1, keepdims=True)
    np.testing.assert_allclose(d.reshape(-1, 3), want, atol=1e-7)
    # the principal point's pixel looks (almost) straight ahead; a pinhole's corners are where fx, fy put them
    if model in ("PINHOLE", "SIMPLE_PINHOLE"):
        np.testing.assert_allclose(d[0, 0, 0] / -d[0, 0, 2], (0.5 - cam.cx) / cam.fx, rtol=1e-12)
        np.testing.assert_allclose(d[0, 0, 1] / -d[0, 0, 2], -(0.5 - cam.cy) / cam.fy, rtol=1e-12)


def test_camera_model_errors():
    with pytest.raises(CameraModelError, match=r"unknown camera model 'OPENCV_FISHEYE'"):
        colmap_camera("OPENCV_FISHEYE", 64, 48, [50, 50, 32, 24, 0, 0, 0, 0])
    with pytest.raises(CameraModelError, match=r"RADIAL takes 5 parameters .*got 4"):
        colmap_camera("RADIAL", 64, 48, [50, 32, 24, 0.1])
    with pytest.raises(CameraModelError, match=r"must be positive"):
        colmap_camera("PINHOLE", 64, 48, [50, -1, 32, 24])
    # a distortion whose inverse does not exist over the image (the radial map folds over)
    with pytest.raises(CameraModelError, match=r"cannot be inverted"):
        camera_directions(Camera(64, 48, 20.0, 20.0, 32.0, 24.0, (-0.9, 0.0, 0.0, 0.0, 0.0)))
    assert set(n for n, _ in COLMAP_MODELS.values()) == {m for m, _ in CAMERAS}  # the capture uses every model
