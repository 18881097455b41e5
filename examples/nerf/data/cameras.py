"""Camera models of real captures: COLMAP's SIMPLE_PINHOLE, PINHOLE, SIMPLE_RADIAL, RADIAL and OPENCV, and the
OpenCV model of nerfstudio's ``transforms.json``, all as one :class:`Camera` (pinhole + OpenCV distortion).

Conventions (COLMAP's and OpenCV's, which nerfstudio shares):

* continuous pixel coordinates ``(u, v)`` = (column, row), the centre of the top-left pixel at ``(0.5, 0.5)``
  (the same pixel grid as :mod:`nerf.data.rays`);
* normalised image coordinates ``x = (u - cx) / fx``, ``y = (v - cy) / fy`` in the OpenCV camera frame
  (+x right, +y down, looking down +z);
* distortion maps undistorted ``(x, y)`` to distorted ``(xd, yd)``::

      r2 = x² + y²,  radial = k1 r2 + k2 r2² + k3 r2³
      xd = x + x radial + 2 p1 x y + p2 (r2 + 2 x²)
      yd = y + y radial + p1 (r2 + 2 y²) + 2 p2 x y

  a pixel's ray goes through the *undistorted* ``(x, y)``, found per pixel by Newton's method (:func:`undistort`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

# COLMAP camera model id → (name, parameter names in COLMAP's order)
COLMAP_MODELS = {
    0: ("SIMPLE_PINHOLE", ("f", "cx", "cy")),
    1: ("PINHOLE", ("fx", "fy", "cx", "cy")),
    2: ("SIMPLE_RADIAL", ("f", "cx", "cy", "k1")),
    3: ("RADIAL", ("f", "cx", "cy", "k1", "k2")),
    4: ("OPENCV", ("fx", "fy", "cx", "cy", "k1", "k2", "p1", "p2")),
}
COLMAP_MODEL_IDS = {name: i for i, (name, _) in COLMAP_MODELS.items()}
DISTORTION_NAMES = ("k1", "k2", "k3", "p1", "p2")


class CameraModelError(ValueError):
    """A camera model this example does not read, or parameters that do not fit it."""


@dataclass(frozen=True)
class Camera:
    """Image size, pinhole intrinsics (pixels) and OpenCV distortion ``(k1, k2, k3, p1, p2)``."""

    width: int
    height: int
    fx: float
    fy: float
    cx: float
    cy: float
    distortion: tuple = (0.0, 0.0, 0.0, 0.0, 0.0)

    @property
    def intrinsics(self) -> np.ndarray:
        return np.array([self.fx, self.fy, self.cx, self.cy], np.float64)

    @property
    def is_pinhole(self) -> bool:
        return not any(self.distortion)

    def scaled(self, factor: float, width: int, height: int) -> "Camera":
        """The camera of the image resampled by ``factor`` (``1/N`` for an N× smaller image) to ``width×height``;
        distortion acts on normalised coordinates and does not change."""
        return Camera(width, height, self.fx * factor, self.fy * factor, self.cx * factor, self.cy * factor,
                      self.distortion)


def colmap_camera(model: str, width: int, height: int, params) -> Camera:
    """A COLMAP camera (model name, size, parameters in COLMAP's order) → :class:`Camera`."""
    names = dict(COLMAP_MODELS.values()).get(model)
    if names is None:
        raise CameraModelError(f"unknown camera model {model!r} (supported: "
                               f"{', '.join(n for n, _ in COLMAP_MODELS.values())})")
    params = [float(p) for p in params]
    if len(params) != len(names):
        raise CameraModelError(f"camera model {model} takes {len(names)} parameters ({', '.join(names)}), "
                               f"got {len(params)}")
    p = dict(zip(names, params))
    fx, fy = (p["f"], p["f"]) if "f" in p else (p["fx"], p["fy"])
    dist = tuple(p.get(k, 0.0) for k in DISTORTION_NAMES)
    return checked(Camera(int(width), int(height), fx, fy, p["cx"], p["cy"], dist))


def checked(cam: Camera) -> Camera:
    values = [cam.fx, cam.fy, cam.cx, cam.cy, *cam.distortion]
    if not np.all(np.isfinite(values)):
        raise CameraModelError(f"camera parameters must be finite, got {values}")
    if cam.fx <= 0 or cam.fy <= 0 or cam.width <= 0 or cam.height <= 0:
        raise CameraModelError(f"focal lengths and image size must be positive, got fx={cam.fx}, fy={cam.fy}, "
                               f"size {cam.width}x{cam.height}")
    return cam


def distort(x, y, distortion):
    """Undistorted normalised coordinates → distorted ones (the model in the module docstring)."""
    k1, k2, k3, p1, p2 = distortion
    r2 = x * x + y * y
    radial = r2 * (k1 + r2 * (k2 + r2 * k3))
    xd = x + x * radial + 2 * p1 * x * y + p2 * (r2 + 2 * x * x)
    yd = y + y * radial + p1 * (r2 + 2 * y * y) + 2 * p2 * x * y
    return xd, yd


def _jacobian(x, y, distortion):
    k1, k2, k3, p1, p2 = distortion
    r2 = x * x + y * y
    radial = r2 * (k1 + r2 * (k2 + r2 * k3))
    dradial = k1 + r2 * (2 * k2 + 3 * k3 * r2)  # d radial / d r2
    dxx = 1 + radial + 2 * x * x * dradial + 2 * p1 * y + 6 * p2 * x
    dxy = 2 * x * y * dradial + 2 * p1 * x + 2 * p2 * y
    dyx = 2 * x * y * dradial + 2 * p1 * x + 2 * p2 * y
    dyy = 1 + radial + 2 * y * y * dradial + 6 * p1 * y + 2 * p2 * x
    return dxx, dxy, dyx, dyy


def undistort(xd, yd, distortion, iterations: int = 20, tol: float = 1e-12):
    """Distorted normalised coordinates → undistorted ones: Newton's method on :func:`distort` per point, from
    ``(xd, yd)``. Returns ``(x, y, residual)`` with the largest ``|distort(x, y) - (xd, yd)|`` left."""
    xd, yd = np.asarray(xd, np.float64), np.asarray(yd, np.float64)
    x, y = xd.copy(), yd.copy()
    if not any(distortion):
        return x, y, 0.0
    for _ in range(iterations):
        fx_, fy_ = distort(x, y, distortion)
        ex, ey = fx_ - xd, fy_ - yd
        if max(np.max(np.abs(ex), initial=0.0), np.max(np.abs(ey), initial=0.0)) < tol:
            break
        a, b, c, d = _jacobian(x, y, distortion)
        det = a * d - b * c
        det = np.where(np.abs(det) < 1e-12, np.where(det < 0, -1e-12, 1e-12), det)
        x = x - (d * ex - b * ey) / det
        y = y - (-c * ex + a * ey) / det
    fx_, fy_ = distort(x, y, distortion)
    residual = float(max(np.max(np.abs(fx_ - xd), initial=0.0), np.max(np.abs(fy_ - yd), initial=0.0)))
    return x, y, residual


@functools.lru_cache(maxsize=16)  # the views of a capture share a few cameras
def camera_directions(cam: Camera) -> np.ndarray:
    """Unit ray directions ``[H, W, 3]`` (float64, read-only) through the pixel centres in the example's OpenGL
    camera frame (looking down −z, +y up; :mod:`nerf.data.rays`), through the undistorted pixel positions."""
    u, v = np.meshgrid(np.arange(cam.width) + 0.5, np.arange(cam.height) + 0.5, indexing="xy")
    x, y, residual = undistort((u - cam.cx) / cam.fx, (v - cam.cy) / cam.fy, cam.distortion)
    if residual > 1e-6:
        raise CameraModelError(f"the distortion {dict(zip(DISTORTION_NAMES, cam.distortion))} cannot be inverted "
                               f"over the {cam.width}x{cam.height} image (residual {residual:.2g} in normalised "
                               "coordinates)")
    d = np.stack([x, -y, -np.ones_like(x)], axis=-1)  # OpenCV (x right, y down, +z forward) → OpenGL
    d /= np.linalg.norm(d, axis=-1, keepdims=True)
    d.flags.writeable = False
    return d
