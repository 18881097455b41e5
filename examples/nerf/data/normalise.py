"""Scene normalisation of a real capture: the world→scene similarity that puts the scene where the models expect it.

The scene frame has its origin at the capture's centre, **+z up** (the example's convention, as in the built-in
scene) and its unit set by the cameras:

* up: the mean of the cameras' up vectors (their +y axis in the OpenGL camera convention), rotated onto +z;
* centre: the point nearest to all optical axes (least squares) when the cameras look at a common region (it lies
  in front of most of them); otherwise the median of the sparse points where there are any, else the mean camera
  position;
* scale: the cameras and the median sparse point lie within distance 1 of the centre.

``world_to_scene`` is a 4×4 similarity ``x_scene = s R (x_world - c)``; :func:`apply` maps camera-to-world poses
with it (rotation columns stay orthonormal, distances scale by ``s``).
"""

from __future__ import annotations

import numpy as np


def _rotation_onto_z(up: np.ndarray) -> np.ndarray:
    """The rotation taking unit ``up`` to +z by the shortest arc."""
    z = np.array([0.0, 0.0, 1.0])
    v, c = np.cross(up, z), float(np.dot(up, z))
    if c < -1 + 1e-12:  # up = -z: half a turn about x
        return np.diag([1.0, -1.0, -1.0])
    vx = np.array([[0, -v[2], v[1]], [v[2], 0, -v[0]], [-v[1], v[0], 0]])
    return np.eye(3) + vx + vx @ vx / (1 + c)


def focus_point(c2w: np.ndarray):
    """The least-squares point nearest to all optical axes, or None when the axes are (near) parallel."""
    centres, forward = c2w[:, :3, 3], -c2w[:, :3, 2]
    A, b = np.zeros((3, 3)), np.zeros(3)
    for c, d in zip(centres, forward):
        P = np.eye(3) - np.outer(d, d)
        A += P
        b += P @ c
    if np.linalg.cond(A) > 1e6:
        return None
    p = np.linalg.solve(A, b)
    in_front = np.einsum("ni,ni->n", p - centres, forward) > 0
    return p if in_front.mean() >= 0.75 else None


def world_to_scene(c2w: np.ndarray, points: np.ndarray | None = None) -> np.ndarray:
    """The normalising similarity for cameras ``c2w`` [N,4,4] (OpenGL convention) and optional points [P,3]."""
    c2w = np.asarray(c2w, np.float64)
    up = c2w[:, :3, 1].mean(axis=0)
    up = up / np.linalg.norm(up) if np.linalg.norm(up) > 1e-9 else np.array([0.0, 0.0, 1.0])
    R = _rotation_onto_z(up)
    has_points = points is not None and len(points) > 0
    centre = focus_point(c2w) if len(c2w) > 1 else None
    if centre is None:
        centre = np.median(points, axis=0) if has_points else c2w[:, :3, 3].mean(axis=0)
    radius = float(np.max(np.linalg.norm(c2w[:, :3, 3] - centre, axis=-1)))
    if has_points:
        radius = max(radius, float(np.median(np.linalg.norm(points - centre, axis=-1))))
    s = 1.0 / radius if radius > 1e-12 else 1.0
    T = np.eye(4)
    T[:3, :3] = s * R
    T[:3, 3] = -s * R @ centre
    return T


def apply(T: np.ndarray, c2w: np.ndarray) -> np.ndarray:
    """Camera-to-world poses ``[..., 4, 4]`` of the data's world → the scene frame of similarity ``T``."""
    T = np.asarray(T, np.float64)
    s = np.cbrt(np.linalg.det(T[:3, :3]))
    out = np.array(c2w, np.float64, copy=True)
    out[..., :3, :3] = (T[:3, :3] / s) @ out[..., :3, :3]
    out[..., :3, 3] = out[..., :3, 3] @ T[:3, :3].T + T[:3, 3]
    return out


def transform_points(T: np.ndarray, points: np.ndarray) -> np.ndarray:
    return np.asarray(points, np.float64) @ T[:3, :3].T + T[:3, 3]
