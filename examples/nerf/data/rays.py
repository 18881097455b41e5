"""Camera convention, written once and used everywhere (scene generator, loaders, training, rendering).

Convention (the NeRF / Blender one):

* a pose is a camera-to-world 4×4 matrix ``c2w``; its columns 0..2 are the camera's x, y, z axes in world
  coordinates and column 3 is the camera centre;
* OpenGL camera axes: the camera looks down its **−z** axis, **+y** is up in the image, +x is right;
* pinhole intrinsics: one ``focal`` length in pixels, principal point at the image centre ``(W/2, H/2)``;
* pixel ``(row j, column i)`` covers ``[i, i+1) × [j, j+1)`` in continuous image coordinates ``(u, v)`` and its ray
  goes through the pixel **centre** ``(i + 0.5, j + 0.5)``; ``v`` grows downwards (image row order).
* ray directions are returned **normalised**, so the ray parameter ``t`` is a metric distance (near/far are
  distances from the camera centre).
"""

from __future__ import annotations

import math

import numpy as np


def focal_from_fov(width: int, camera_angle_x: float) -> float:
    """Focal length in pixels from the horizontal field of view (radians), as in the Blender ``transforms.json``."""
    return 0.5 * width / math.tan(0.5 * camera_angle_x)


def get_rays(H: int, W: int, focal: float, c2w) -> tuple[np.ndarray, np.ndarray]:
    """Rays through the pixel centres of an ``H×W`` image: origins and unit directions, each ``[H, W, 3]`` float32.

    ``c2w`` may be ``[4,4]`` or ``[3,4]``; a batch ``[N,4,4]`` gives ``[N,H,W,3]``.
    """
    c2w = np.asarray(c2w, dtype=np.float64)
    if c2w.ndim == 3:
        o, d = zip(*(get_rays(H, W, focal, m) for m in c2w))
        return np.stack(o), np.stack(d)
    i, j = np.meshgrid(np.arange(W, dtype=np.float64) + 0.5, np.arange(H, dtype=np.float64) + 0.5, indexing="xy")
    dirs_cam = np.stack([(i - 0.5 * W) / focal, -(j - 0.5 * H) / focal, -np.ones_like(i)], axis=-1)
    dirs = dirs_cam @ c2w[:3, :3].T
    dirs /= np.linalg.norm(dirs, axis=-1, keepdims=True)
    origins = np.broadcast_to(c2w[:3, 3], dirs.shape)
    return origins.astype(np.float32), dirs.astype(np.float32)


def camera_rays(camera, c2w) -> tuple[np.ndarray, np.ndarray]:
    """Rays through the pixel centres of a :class:`nerf.data.cameras.Camera` (any COLMAP model) posed at ``c2w``
    [4,4]: origins and unit directions, each ``[H, W, 3]`` float32. A pixel without a ray (see
    :meth:`nerf.data.Dataset.valid_pixels`) gets the optical axis."""
    from nerf.data.cameras import camera_directions

    c2w = np.asarray(c2w, dtype=np.float64)
    local = camera_directions(camera)
    local = np.where(np.isfinite(local), local, np.array([0.0, 0.0, -1.0]))
    dirs = local @ c2w[:3, :3].T
    dirs /= np.linalg.norm(dirs, axis=-1, keepdims=True)
    return np.broadcast_to(c2w[:3, 3], dirs.shape).astype(np.float32), dirs.astype(np.float32)


def pinhole_rays(H: int, W: int, intrinsics, c2w) -> tuple[np.ndarray, np.ndarray]:
    """Rays of a pinhole camera ``(fx, fy, cx, cy)`` (pixels, principal point anywhere) posed at ``c2w`` [4,4]."""
    from nerf.data.cameras import Camera

    fx, fy, cx, cy = (float(v) for v in intrinsics)
    return camera_rays(Camera.pinhole(W, H, fx, fy, cx, cy), c2w)


def project(points, H: int, W: int, focal: float, c2w) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`get_rays`: world points ``[..., 3]`` → continuous pixel coordinates ``[..., 2]`` as
    ``(u, v)`` = (column, row) and the depth along the camera's −z axis (positive in front of the camera).

    The pixel holding the point is ``(row, col) = (floor(v), floor(u))``.
    """
    c2w = np.asarray(c2w, dtype=np.float64)
    R, c = c2w[:3, :3], c2w[:3, 3]
    p_cam = (np.asarray(points, dtype=np.float64) - c) @ R  # R^T (p - c), row-vector form
    depth = -p_cam[..., 2]
    u = focal * p_cam[..., 0] / depth + 0.5 * W
    v = -focal * p_cam[..., 1] / depth + 0.5 * H
    return np.stack([u, v], axis=-1), depth


def look_at(position, target=(0.0, 0.0, 0.0), up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """Camera-to-world matrix of a camera at ``position`` looking at ``target`` (world +z up, as in Blender)."""
    position = np.asarray(position, dtype=np.float64)
    forward = np.asarray(target, dtype=np.float64) - position
    forward /= np.linalg.norm(forward)
    z = -forward  # the camera looks down -z
    x = np.cross(np.asarray(up, dtype=np.float64), z)
    if np.linalg.norm(x) < 1e-9:  # looking straight along `up`: any perpendicular x will do
        x = np.cross(np.array([0.0, 1.0, 0.0]), z)
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    m = np.eye(4)
    m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = x, y, z, position
    return m


def spherical_pose(radius: float, azimuth: float, elevation: float) -> np.ndarray:
    """Pose of a camera on a sphere around the origin (angles in radians, elevation above the z=0 plane)."""
    ce = math.cos(elevation)
    pos = radius * np.array([ce * math.cos(azimuth), ce * math.sin(azimuth), math.sin(elevation)])
    return look_at(pos)
