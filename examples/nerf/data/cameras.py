"""Camera models of real captures: every COLMAP camera model (pinhole, radial, OpenCV, fisheye, FOV, division,
EUCM, equirectangular ...) as one :class:`Camera`, unprojected by ``pycolmap.Camera``.

Conventions (COLMAP's and OpenCV's, which nerfstudio shares):

* continuous pixel coordinates ``(u, v)`` = (column, row), the centre of the top-left pixel at ``(0.5, 0.5)``
  (the same pixel grid as :mod:`nerf.data.rays`);
* a pixel's ray is pycolmap's unit bearing ``Camera.cam_ray_from_img(u, v)`` in the OpenCV camera frame (+x right,
  +y down, looking down +z), turned into the example's OpenGL camera frame (looking down −z, +y up);
* a pixel has no ray (its direction is NaN, and it leaves training and evaluation) where pycolmap finds no inverse
  of the distortion, or where the bearing does not project back onto the pixel (within :data:`ROUND_TRIP_PX`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

ROUND_TRIP_PX = 1e-2  # a bearing must project back within this many pixels of its pixel
# models whose bearings may point backwards (field of view beyond 180°)
OMNIDIRECTIONAL = ("OPENCV_FISHEYE", "FOV", "SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE", "THIN_PRISM_FISHEYE",
                   "RAD_TAN_THIN_PRISM_FISHEYE", "SIMPLE_FISHEYE", "FISHEYE", "EUCM", "EQUIRECTANGULAR")


class CameraModelError(ValueError):
    """A camera model pycolmap does not know, or parameters that do not fit it."""


def _pycolmap():
    import pycolmap

    return pycolmap


def model_names() -> tuple:
    """The names of COLMAP's camera models (pycolmap's), in model-id order."""
    ids = _pycolmap().CameraModelId
    return tuple(m.name for m in sorted((getattr(ids, n) for n in dir(ids) if n.isupper() and n != "INVALID"),
                                        key=lambda m: m.value))


def model_name(model_id: int) -> str | None:
    """COLMAP's name of camera model id ``model_id`` (None when pycolmap knows no such model)."""
    ids = _pycolmap().CameraModelId
    for n in dir(ids):
        if n.isupper() and n != "INVALID" and getattr(ids, n).value == model_id:
            return n
    return None


@functools.lru_cache(maxsize=None)
def param_names(model: str) -> tuple:
    """The parameter names of COLMAP camera model ``model``, in COLMAP's order."""
    pc = _pycolmap()
    if model not in model_names():
        raise CameraModelError(f"unknown camera model {model!r} (COLMAP's models: {', '.join(model_names())})")
    cam = pc.Camera.create_from_model_id(0, getattr(pc.CameraModelId, model), 100.0, 64, 48)
    return tuple(s.strip() for s in cam.params_info.split(","))


@dataclass(frozen=True)
class Camera:
    """Image size and a COLMAP camera ``model`` with its ``params`` in COLMAP's order (pixels for focal lengths and
    principal point, as COLMAP writes them).

    >>> cam = Camera.pinhole(64, 48, 50.0, 50.0, 32.0, 24.0)
    >>> d, ok = cam.directions(np.array([32.0]), np.array([24.0]))
    >>> np.round(d, 6).tolist(), ok.tolist()
    ([[0.0, -0.0, -1.0]], [True])
    """

    width: int
    height: int
    model: str = "PINHOLE"
    params: tuple = ()

    @classmethod
    def pinhole(cls, width, height, fx, fy, cx, cy) -> "Camera":
        return cls(int(width), int(height), "PINHOLE", (float(fx), float(fy), float(cx), float(cy)))

    @functools.cached_property
    def colmap(self):
        """The ``pycolmap.Camera``."""
        return _pycolmap().Camera(model=self.model, width=self.width, height=self.height, params=list(self.params))

    def _named(self, *names):
        p = dict(zip(param_names(self.model), self.params))
        return [p[n] for n in names if n in p]

    @property
    def fx(self) -> float:
        return float((self._named("fx", "f") or [self.width / 2])[0])

    @property
    def fy(self) -> float:
        return float((self._named("fy", "f") or [self.width / 2])[0])

    @property
    def cx(self) -> float:
        return float((self._named("cx") or [self.width / 2])[0])

    @property
    def cy(self) -> float:
        return float((self._named("cy") or [self.height / 2])[0])

    @property
    def intrinsics(self) -> np.ndarray:
        return np.array([self.fx, self.fy, self.cx, self.cy], np.float64)

    @property
    def is_pinhole(self) -> bool:
        return self.model in ("PINHOLE", "SIMPLE_PINHOLE")

    def scaled(self, factor: float, width: int, height: int) -> "Camera":
        """The camera of the image resampled by ``factor`` (``1/N`` for an N× smaller image) to ``width×height``:
        the parameters in pixels scale, the distortion (normalised coordinates) does not."""
        c = self.colmap
        pixel = set(c.focal_length_idxs()) | set(c.principal_point_idxs())
        if self.model == "EQUIRECTANGULAR":
            pixel = set(range(len(self.params)))
        return Camera(int(width), int(height), self.model,
                      tuple(p * factor if i in pixel else p for i, p in enumerate(self.params)))

    def directions(self, u, v) -> tuple[np.ndarray, np.ndarray]:
        """Unit ray directions ``[M, 3]`` (float64, OpenGL camera frame) through continuous pixel positions ``(u, v)``
        ``[M]``, and whether each has one (``[M]`` bool; the direction is NaN where not)."""
        pts = np.stack([np.asarray(u, np.float64).ravel(), np.asarray(v, np.float64).ravel()], -1)
        b = np.asarray(self.colmap.cam_ray_from_img(pts), np.float64).reshape(-1, 3)
        ok = np.all(np.isfinite(b), -1)
        if not self.is_pinhole and self.model != "EQUIRECTANGULAR":
            front = ok & (b[:, 2] > 1e-9)
            if front.any():
                back = np.asarray(self.colmap.img_from_cam(b[front]), np.float64).reshape(-1, 2)
                err = np.max(np.abs(back - pts[front]), -1)
                ok[np.flatnonzero(front)] = np.isfinite(err) & (err < ROUND_TRIP_PX)
            if self.model not in OMNIDIRECTIONAL:
                ok &= b[:, 2] > 1e-9
        b[~ok] = np.nan
        return b * np.array([1.0, -1.0, -1.0]), ok  # OpenCV (x right, y down, +z forward) → OpenGL


def colmap_camera(model: str, width: int, height: int, params) -> Camera:
    """A COLMAP camera (model name, size, parameters in COLMAP's order) → :class:`Camera`, checked."""
    names = param_names(model)
    try:
        params = tuple(float(p) for p in params)
    except (TypeError, ValueError):
        raise CameraModelError(f"camera parameters must be numbers, got {params!r}") from None
    if len(params) != len(names):
        raise CameraModelError(f"camera model {model} takes {len(names)} parameters ({', '.join(names)}), "
                               f"got {len(params)}")
    return checked(Camera(int(width), int(height), model, params))


def checked(cam: Camera) -> Camera:
    if not np.all(np.isfinite(cam.params)):
        raise CameraModelError(f"camera parameters must be finite, got {list(cam.params)}")
    if cam.width <= 0 or cam.height <= 0:
        raise CameraModelError(f"the image size must be positive, got {cam.width}x{cam.height}")
    c = cam.colmap
    if any(cam.params[i] <= 0 for i in c.focal_length_idxs()) or (
            cam.model == "EQUIRECTANGULAR" and min(cam.params) <= 0):
        raise CameraModelError(f"focal lengths must be positive, got {cam.model} {list(cam.params)}")
    return cam


def valid_fraction(cam: Camera, samples: int = 64) -> float:
    """The fraction of a ``samples × samples`` grid over the image with a ray (a quick look at the distortion's
    reach; the loaders refuse a camera without any)."""
    u, v = np.meshgrid((np.arange(samples) + 0.5) * cam.width / samples,
                       (np.arange(samples) + 0.5) * cam.height / samples)
    return float(cam.directions(u, v)[1].mean())


@functools.lru_cache(maxsize=16)  # evaluation renders a few cameras' full images
def camera_directions(cam: Camera) -> np.ndarray:
    """Unit ray directions ``[H, W, 3]`` (float64, read-only) through the pixel centres in the example's OpenGL
    camera frame; NaN at the pixels without a ray."""
    u, v = np.meshgrid(np.arange(cam.width) + 0.5, np.arange(cam.height) + 0.5, indexing="xy")
    d, _ = cam.directions(u, v)
    d = d.reshape(cam.height, cam.width, 3)
    d.flags.writeable = False
    return d
