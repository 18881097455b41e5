"""Camera models of the NeRF example's capture loaders (examples/nerf/data/cameras.py): every COLMAP camera model's
pixel directions against pycolmap's projection, the OpenCV model against its formula in NumPy float64, and the
pixels without a ray masked instead of refused."""

import numpy as np
import pycolmap
import pytest

from nerf.data.cameras import (Camera, CameraModelError, camera_directions, colmap_camera, model_names,
                               param_names, valid_fraction)
from nerf.data.unbounded_scene import CAMERAS

pytestmark = pytest.mark.nerf  # the NeRF example's tests: `pytest tests -m nerf` (README)

W, H = 64, 48
# parameters of every COLMAP model for a 64×48 image (pixels: focal lengths, principal point; the rest unitless)
PARAMS = {
    "SIMPLE_PINHOLE": (50.0, 32.0, 24.0),
    "PINHOLE": (52.0, 49.0, 31.5, 24.5),
    "SIMPLE_RADIAL": (48.0, 32.5, 23.5, -0.08),
    "RADIAL": (51.0, 31.0, 24.0, -0.12, 0.03),
    "OPENCV": (50.0, 52.0, 32.5, 24.5, -0.1, 0.02, 0.003, -0.002),
    "OPENCV_FISHEYE": (34.0, 34.0, 32.0, 24.0, 0.05, -0.01, 0.002, -0.001),
    "FULL_OPENCV": (50.0, 51.0, 32.0, 24.0, -0.1, 0.02, 0.001, -0.001, 0.005, 0.01, 0.0, 0.0),
    "FOV": (40.0, 40.0, 32.0, 24.0, 0.8),
    "SIMPLE_RADIAL_FISHEYE": (34.0, 32.0, 24.0, 0.03),
    "RADIAL_FISHEYE": (34.0, 32.0, 24.0, 0.03, -0.005),
    "THIN_PRISM_FISHEYE": (34.0, 35.0, 32.0, 24.0, 0.03, -0.005, 0.001, 0.001, 0.0, 0.0, 0.0005, 0.0005),
    "RAD_TAN_THIN_PRISM_FISHEYE": (34.0, 35.0, 32.0, 24.0, 0.03, -0.005, 0.0, 0.0, 0.0, 0.0, 0.001, 0.001, 0.0,
                                   0.0, 0.0005, 0.0005),
    "SIMPLE_DIVISION": (50.0, 32.0, 24.0, -0.05),
    "DIVISION": (50.0, 51.0, 32.0, 24.0, -0.05),
    "SIMPLE_FISHEYE": (34.0, 32.0, 24.0),
    "FISHEYE": (34.0, 35.0, 32.0, 24.0),
    "EUCM": (40.0, 40.0, 32.0, 24.0, 0.5, 1.0),
    "EQUIRECTANGULAR": (64.0, 48.0),
}


def test_every_model_of_pycolmap_is_covered():
    assert set(PARAMS) == set(model_names())
    for name, params in PARAMS.items():
        assert len(params) == len(param_names(name)), name


@pytest.mark.parametrize("model", sorted(PARAMS))
def test_pixel_directions_project_back_through_pycolmap(model):
    """Each COLMAP model: every pixel centre's direction is a unit vector that pycolmap's forward projection of the
    model puts back on the pixel centre (1e-6 px)."""
    cam = colmap_camera(model, W, H, PARAMS[model])
    d = camera_directions(cam).reshape(-1, 3)
    assert np.all(np.isfinite(d)), f"{model}: {np.mean(~np.isfinite(d[:, 0])):.2%} pixels without a ray"
    np.testing.assert_allclose(np.linalg.norm(d, axis=-1), 1.0, atol=1e-12)
    u, v = np.meshgrid(np.arange(W) + 0.5, np.arange(H) + 0.5, indexing="xy")
    ref = pycolmap.Camera(model=model, width=W, height=H, params=list(PARAMS[model]))
    cv = d * np.array([1.0, -1.0, -1.0])  # OpenGL → OpenCV camera axes
    back = ref.img_from_cam(cv)
    np.testing.assert_allclose(back, np.stack([u.ravel(), v.ravel()], -1), atol=1e-6)


def test_opencv_directions_against_the_formula_in_numpy():
    """OPENCV: the direction's normalised coordinates, distorted by the model's formula in float64, land on the
    pixel centre (a check that does not go through pycolmap)."""
    fx, fy, cx, cy, k1, k2, p1, p2 = PARAMS["OPENCV"]
    d = camera_directions(colmap_camera("OPENCV", W, H, PARAMS["OPENCV"])).reshape(-1, 3)
    x, y = d[:, 0] / -d[:, 2], -d[:, 1] / -d[:, 2]
    r2 = x * x + y * y
    radial = k1 * r2 + k2 * r2 * r2
    xd = x + x * radial + 2 * p1 * x * y + p2 * (r2 + 2 * x * x)
    yd = y + y * radial + p1 * (r2 + 2 * y * y) + 2 * p2 * x * y
    u, v = np.meshgrid(np.arange(W) + 0.5, np.arange(H) + 0.5, indexing="xy")
    np.testing.assert_allclose(fx * xd + cx, u.ravel(), atol=1e-7)
    np.testing.assert_allclose(fy * yd + cy, v.ravel(), atol=1e-7)


def test_equirectangular_looks_backwards_and_a_too_wide_fisheye_is_masked():
    """A 360° panorama: the rays of the left and right edges point behind the camera (+z in the OpenGL frame). A
    fisheye whose corners lie beyond the angle pycolmap's model inverts: those pixels have no ray, and every pixel
    with one projects back onto itself."""
    d = camera_directions(colmap_camera("EQUIRECTANGULAR", 64, 32, (64.0, 32.0)))
    assert np.all(np.isfinite(d)) and d[16, 0, 2] > 0.99 and d[16, 32, 2] < -0.99
    cam = colmap_camera("OPENCV_FISHEYE", 100, 100, (16.0, 16.0, 50.0, 50.0, 0, 0, 0, 0))
    d = camera_directions(cam).reshape(-1, 3)
    ok = np.isfinite(d[:, 0])
    assert 0.05 < ok.mean() < 0.95 and ok[50 * 100 + 50]
    u, v = np.meshgrid(np.arange(100) + 0.5, np.arange(100) + 0.5, indexing="xy")
    back = cam.colmap.img_from_cam(d[ok] * np.array([1.0, -1.0, -1.0]))
    np.testing.assert_allclose(back, np.stack([u.ravel(), v.ravel()], -1)[ok], atol=1e-2)


def test_pixels_without_an_inverse_are_masked_not_refused():
    """Strong barrel distortion: the radial map folds over near the corners; those pixels have no ray (NaN) and
    the centre keeps its rays."""
    cam = colmap_camera("SIMPLE_RADIAL", W, H, (20.0, 32.0, 24.0, -0.9))
    d = camera_directions(cam)
    ok = np.all(np.isfinite(d), -1)
    assert ok[24, 32] and not ok[0, 0] and 0 < ok.mean() < 1
    assert 0 < valid_fraction(cam) < 1
    dirs, valid = cam.directions(np.array([0.5, 32.0]), np.array([0.5, 24.0]))
    assert valid.tolist() == [False, True] and np.isnan(dirs[0]).all()


def test_scaled_camera_is_the_downscaled_image_camera():
    cam = colmap_camera("OPENCV", W, H, PARAMS["OPENCV"])
    half = cam.scaled(0.5, W // 2, H // 2)
    assert half.params[:4] == tuple(p * 0.5 for p in PARAMS["OPENCV"][:4])
    assert half.params[4:] == PARAMS["OPENCV"][4:]
    # the half-size pixel (i, j) averages full pixels (2i, 2j) .. (2i+1, 2j+1): its centre is their shared corner
    d_half, _ = half.directions(np.array([3.5]), np.array([2.5]))
    d_full, _ = cam.directions(np.array([7.0]), np.array([5.0]))
    np.testing.assert_allclose(d_half, d_full, atol=1e-12)


def test_camera_model_errors():
    with pytest.raises(CameraModelError, match=r"unknown camera model 'NOT_A_MODEL'"):
        colmap_camera("NOT_A_MODEL", W, H, [50, 50, 32, 24])
    with pytest.raises(CameraModelError, match=r"RADIAL takes 5 parameters .*got 4"):
        colmap_camera("RADIAL", W, H, [50, 32, 24, 0.1])
    with pytest.raises(CameraModelError, match=r"must be positive"):
        colmap_camera("PINHOLE", W, H, [50, -1, 32, 24])
    with pytest.raises(CameraModelError, match=r"must be finite"):
        colmap_camera("PINHOLE", W, H, [50, float("nan"), 32, 24])
    assert {m for m, _ in CAMERAS} <= set(PARAMS)
    assert Camera.pinhole(W, H, 50, 50, 32, 24) == colmap_camera("PINHOLE", W, H, (50, 50, 32, 24))
