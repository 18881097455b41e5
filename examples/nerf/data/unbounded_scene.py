"""A small unbounded scene rendered by the built-in ray tracer (:func:`nerf.data.synthetic.trace`), seen by
cameras of COLMAP's pinhole and distorted models: the test capture of the COLMAP and ``transforms.json`` loaders.

Scene (generator world, +z up): an infinite checkered ground plane z = 0 (to the horizon), distant surroundings (an
emissive dome of radius ``DOME_RADIUS`` with banded "hills" and a sky gradient, casting no shadows) and an object
cluster around the origin (spheres and boxes of the built-in scene's textures).

Cameras orbit the cluster, looking at it from a little above; camera ``k`` of :data:`CAMERAS` takes the views
``i`` with ``i % len(CAMERAS) == k``. A pixel's colour is the mean over ``ss × ss`` sub-pixel rays, and each ray
goes through the *undistorted* position of its sub-pixel as pycolmap's ``Camera.cam_from_img`` computes it (an
implementation independent of the loaders' use of ``cam_ray_from_img``), so the images are what those cameras see.

The capture is stored in a *data world* frame that is not the generator's: ``x_data = G x_gen`` with the
similarity :data:`GEN_TO_DATA` (rotated, scaled and moved, as a structure-from-motion frame is), so the loaders'
normalisation has something to undo. Sparse points are surface points of the cluster and the ground seen by the
cameras (as structure from motion would triangulate them), with their colours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nerf.data.cameras import Camera, colmap_camera, param_names
from nerf.data.rays import look_at
from nerf.data.synthetic import Box, Sphere, trace

DOME_RADIUS = 40.0

# (COLMAP model, parameters in COLMAP's order) at the full 64×48 resolution
CAMERAS = (
    ("SIMPLE_PINHOLE", (50.0, 32.0, 24.0)),
    ("PINHOLE", (52.0, 49.0, 31.5, 24.5)),
    ("SIMPLE_RADIAL", (48.0, 32.5, 23.5, -0.08)),
    ("RADIAL", (51.0, 31.0, 24.0, -0.12, 0.03)),
    ("OPENCV", (50.0, 52.0, 32.5, 24.5, -0.1, 0.02, 0.003, -0.002)),
    ("OPENCV_FISHEYE", (34.0, 34.0, 32.0, 24.0, 0.05, -0.01, 0.002, -0.001)),
)
# the cameras of a default capture (the fisheye is asked for by index)
DEFAULT_CAMERAS = (0, 1, 2, 3, 4)


# COLMAP parameters in pixels (focal lengths, principal point) at the head of each model's list; the rest (distortion)
# are in normalised image coordinates and do not change with the image size
PIXEL_PARAMS = {"SIMPLE_PINHOLE": 3, "PINHOLE": 4, "SIMPLE_RADIAL": 3, "RADIAL": 3, "OPENCV": 4, "OPENCV_FISHEYE": 4}
BASE_SIZE = (64, 48)


def camera_params(k: int, scale: int = 1, size: tuple | None = None):
    """(model, width, height, parameters) of camera ``k`` of :data:`CAMERAS` for images ``scale`` times 64×48, or
    of ``size`` (width, height: the pixel parameters scale by width / 64 and height / 48, a model with one focal
    length by the width's factor)."""
    model, params = CAMERAS[k]
    n = PIXEL_PARAMS[model]
    W, H = (BASE_SIZE[0] * scale, BASE_SIZE[1] * scale) if size is None else (int(size[0]), int(size[1]))
    sx, sy = W / BASE_SIZE[0], H / BASE_SIZE[1]
    names = param_names(model)
    pixel = tuple(p * (sy if name in ("fy", "cy") else sx) for name, p in zip(names[:n], params[:n]))
    return (model, W, H, pixel + tuple(params[n:]))


def _similarity(angle_axis, scale, translation) -> np.ndarray:
    axis = np.asarray(angle_axis, np.float64)
    theta = float(np.linalg.norm(axis))
    k = axis / theta
    K = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    R = np.eye(3) + math.sin(theta) * K + (1 - math.cos(theta)) * K @ K
    G = np.eye(4)
    G[:3, :3], G[:3, 3] = scale * R, translation
    return G


GEN_TO_DATA = _similarity((0.9, -1.7, 0.6), 2.5, (3.0, -1.0, 7.0))


class Ground:
    """The plane z = 0, infinite, checkered (0.5 units) with a tint that varies slowly across it and stains."""

    def intersect(self, o, d):
        with np.errstate(divide="ignore", invalid="ignore"):
            t = -o[:, 2] / d[:, 2]
        return np.where(np.isfinite(t) & (t > 1e-4), t, np.inf)

    def normal(self, p):
        return np.broadcast_to(np.array([0.0, 0.0, 1.0]), p.shape)

    def albedo(self, p):
        x, y = p[:, 0], p[:, 1]
        c = (np.floor(x / 0.5) + np.floor(y / 0.5)) % 2
        tint = 0.5 + 0.5 * np.sin(0.3 * p[:, :1] + np.array([0.0, 1.0, 2.0]))
        # stains: sines of incommensurate, warped frequencies, so that no two checker corners look alike (a periodic
        # texture alone gives structure from motion matches one square off along the epipolar lines)
        stain = (np.sin(7.3 * x + 2.1 * np.sin(3.7 * y)) * np.sin(5.9 * y + 1.7 * np.sin(4.3 * x))
                 + np.sin(11.1 * x - 9.7 * y + 0.5 * np.sin(2.3 * x * y))) / 2
        return (0.35 + 0.4 * c[:, None]) * (0.6 + 0.4 * tint) * (0.75 + 0.25 * stain[:, None])


class Dome:
    """The surroundings: a sphere of radius ``DOME_RADIUS`` seen from inside, emissive, no shadows; hills in
    bands of azimuth below a sky gradient."""

    emissive = True
    casts_shadow = False

    def intersect(self, o, d):
        b = np.einsum("ni,ni->n", o, d)
        disc = b * b - (np.einsum("ni,ni->n", o, o) - DOME_RADIUS ** 2)
        return np.where(disc >= 0, -b + np.sqrt(np.maximum(disc, 0)), np.inf)

    def normal(self, p):
        return -p / DOME_RADIUS

    def albedo(self, p):
        q = p / DOME_RADIUS
        az = np.arctan2(q[:, 1], q[:, 0])
        hill = 0.12 + 0.08 * np.sin(5 * az) + 0.04 * np.sin(13 * az + 1.0)
        sky = np.stack([0.45 + 0.3 * q[:, 2], 0.6 + 0.3 * q[:, 2], np.full_like(az, 0.95)], -1)
        land = np.stack([0.25 + 0.1 * np.sin(7 * az), 0.45 + 0.1 * np.cos(3 * az), np.full_like(az, 0.2)], -1)
        return np.where((q[:, 2] < hill)[:, None], land, np.clip(sky, 0, 1))


SCENE = [
    Ground(),
    Dome(),
    Sphere((0.0, 0.0, 0.45), 0.45, "stripes"),
    Sphere((0.75, 0.45, 0.25), 0.25, "latlong"),
    Box((-0.6, 0.5, 0.3), (0.25, 0.2, 0.3), math.radians(25), "checker3d"),
    Box((0.3, -0.7, 0.45), (0.1, 0.1, 0.45), math.radians(-15), "hstripes"),
    Sphere((-0.5, -0.45, 0.15), 0.15, "gradient"),
]


@dataclass
class Capture:
    """A rendered capture: ``images`` uint8 [N,H,W,3], file-name stems ``names``, per view the index into
    :data:`CAMERAS` (``camera_index``), camera-to-world ``c2w`` [N,4,4] in the **generator** world (OpenGL convention), and sparse
    ``points`` [P,3] (generator world) with ``colors`` uint8 [P,3]. ``GEN_TO_DATA`` maps it to the data world."""

    images: np.ndarray
    names: list
    camera_index: np.ndarray
    c2w: np.ndarray
    points: np.ndarray
    colors: np.ndarray
    scale: int = 1  # the images are scale × 64×48
    size: tuple | None = None  # or of this (width, height)

    def camera(self, k: int) -> Camera:
        return colmap_camera(*camera_params(k, self.scale, self.size))


def camera_poses(n: int) -> np.ndarray:
    """``n`` cameras on a ring of radius 3.2 at heights 0.9..1.5, looking at the cluster (generator world)."""
    poses = []
    for i in range(n):
        a = 2 * math.pi * i / n
        pos = (3.2 * math.cos(a), 3.2 * math.sin(a), 1.2 + 0.3 * math.sin(3 * a))
        poses.append(look_at(pos, target=(0.15 * math.sin(a), 0.1, 0.35)))
    return np.stack(poses)


def pixel_rays(model: str, params, c2w: np.ndarray, ss: int = 1, width: int = 64, height: int = 48):
    """Rays through the ``ss × ss`` sub-pixel centres of a ``width``×``height`` COLMAP camera, undistorted by
    pycolmap → (origins, unit directions) ``[height*ss, width*ss, 3]`` in the frame of ``c2w``."""
    import pycolmap

    cam = pycolmap.Camera(model=model, width=width, height=height, params=list(params))
    u, v = np.meshgrid((np.arange(width * ss) + 0.5) / ss, (np.arange(height * ss) + 0.5) / ss, indexing="xy")
    xy = cam.cam_from_img(np.stack([u.ravel(), v.ravel()], -1).astype(np.float64))
    d = np.concatenate([xy[:, :1], -xy[:, 1:], -np.ones((len(xy), 1))], -1)  # OpenCV → OpenGL camera axes
    d = d @ np.asarray(c2w)[:3, :3].T
    d /= np.linalg.norm(d, axis=-1, keepdims=True)
    o = np.broadcast_to(np.asarray(c2w)[:3, 3], d.shape)
    return o.reshape(height * ss, width * ss, 3), d.reshape(height * ss, width * ss, 3)


def render(n_views: int = 16, ss: int = 2, n_points: int = 400, seed: int = 0, scale: int = 1,
           cameras=None) -> Capture:
    """The capture: ``n_views`` images of ``scale`` × 64×48, each the mean of ``ss × ss`` rays per pixel; view
    ``i`` is seen by camera ``cameras[i % len(cameras)]`` (indices into :data:`CAMERAS`, default
    :data:`DEFAULT_CAMERAS`)."""
    poses = camera_poses(n_views)
    rng = np.random.default_rng(seed)
    cameras = list(DEFAULT_CAMERAS) if cameras is None else list(cameras)
    images, cams, pts, cols = [], [], [], []
    for i, c2w in enumerate(poses):
        k = cameras[i % len(cameras)]
        model, W, H, params = camera_params(k, scale)
        o, d = pixel_rays(model, params, c2w, ss, W, H)
        rgb = trace(o.reshape(-1, 3), d.reshape(-1, 3), SCENE)[:, :3].reshape(H, ss, W, ss, 3).mean(axis=(1, 3))
        images.append(np.round(rgb * 255).astype(np.uint8))
        cams.append(k)
        # sparse points: the first surfaces hit by a few pixel rays (the dome is not triangulated: too far)
        o1, d1 = pixel_rays(model, params, c2w, 1, W, H)
        pick = rng.choice(H * W, n_points // n_views, replace=False)
        o1, d1 = o1.reshape(-1, 3)[pick], d1.reshape(-1, 3)[pick]
        ts = np.stack([p.intersect(o1, d1) for p in SCENE])
        which, t = np.argmin(ts, 0), np.min(ts, 0)
        keep = np.isfinite(t) & (which != 1)
        p = o1[keep] + t[keep, None] * d1[keep]
        pts.append(p)
        cols.append(np.round(trace(o1[keep], d1[keep], SCENE)[:, :3] * 255).astype(np.uint8))
    return Capture(np.stack(images), [f"frame_{i:03d}" for i in range(n_views)], np.array(cams), poses,
                   np.concatenate(pts), np.concatenate(cols), int(scale))
