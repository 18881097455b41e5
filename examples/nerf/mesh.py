"""Surfaces from density fields: a density sampled on a regular grid, marching cubes (scikit-image), vertex colours
from a colour field, and binary PLY files (plyfile). No TensorFlow here: the fields are plain callables on NumPy
arrays, so a trained NeRF (``export.py``) and an analytic density (the tests) take the same path.

Conventions: a box ``lo``/``hi`` split into ``resolution`` cells per axis is sampled at the ``resolution + 1``
cell corners per axis (so the samples include the box faces); marching cubes puts the surface where the density
crosses ``threshold`` (linear interpolation along cell edges); "inside" is density > ``threshold``. Vertex normals
point out of the dense region (scikit-image's ``gradient_direction="descent"``); a vertex's colour is the colour
field seen along the opposite of its normal, i.e. by a ray that meets the surface head-on (at the vertex, or that
ray's volume-rendered colour: :func:`color_vertices`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np


@dataclasses.dataclass
class Mesh:
    """A triangle mesh: ``vertices`` float64 [V, 3], ``faces`` int32 [F, 3] (counter-clockwise seen from outside),
    unit ``normals`` float64 [V, 3] (outward), ``colors`` float64 [V, 3] in [0, 1] (None before colouring)."""

    vertices: np.ndarray
    faces: np.ndarray
    normals: np.ndarray
    colors: np.ndarray | None = None

    def transformed(self, T) -> "Mesh":
        """The mesh under the 4×4 similarity ``T`` (``x' = T x``: rotation, uniform scale, translation): vertices
        mapped, normals rotated. A reflection would flip the faces' orientation, so it is refused."""
        T = np.asarray(T, np.float64)
        if T.shape != (4, 4):
            raise ValueError(f"T must be 4x4, got shape {T.shape}")
        A = T[:3, :3]
        det = np.linalg.det(A)
        if not det > 0:
            raise ValueError(f"T must be a 4x4 similarity with a positive determinant, got {T.tolist()}")
        R = A / np.cbrt(det)
        if not np.allclose(R @ R.T, np.eye(3), atol=1e-6):
            raise ValueError("T must be a similarity (rotation times a uniform scale, plus a translation)")
        return Mesh(self.vertices @ A.T + T[:3, 3], self.faces, self.normals @ R.T, self.colors)


def grid_points(lo, hi, resolution: int, start: int, stop: int) -> np.ndarray:
    """The sample points with flat indices ``[start, stop)`` of the ``(resolution + 1)^3`` corner grid over the box
    ``lo``/``hi`` (C order, index = (i * (resolution + 1) + j) * (resolution + 1) + k for x, y, z indices i, j, k)
    → float32 ``[stop - start, 3]``."""
    n = resolution + 1
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    ijk = np.stack(np.unravel_index(np.arange(start, stop), (n, n, n)), axis=-1)
    return (lo + ijk * ((hi - lo) / resolution)).astype(np.float32)


def sample_density(density_fn, lo, hi, resolution: int, chunk: int = 2 ** 18) -> np.ndarray:
    """``density_fn`` (float32 points ``[M, 3]`` → densities ``[M]``) at the ``(resolution + 1)^3`` cell corners of
    the box ``lo``/``hi``, evaluated ``chunk`` points at a time → float32 ``[resolution + 1] * 3`` indexed [x, y, z].

    Example:
      >>> import numpy as np
      >>> from nerf import mesh
      >>> d = mesh.sample_density(lambda p: 1.0 - np.linalg.norm(p, axis=1), (-1, -1, -1), (1, 1, 1), 4, chunk=7)
      >>> d.shape, float(d[2, 2, 2]), float(d[0, 2, 2])
      ((5, 5, 5), 1.0, 0.0)
    """
    _check_grid(lo, hi, resolution, chunk)
    total = (resolution + 1) ** 3
    out = np.empty(total, np.float32)
    for start in range(0, total, chunk):
        stop = min(start + chunk, total)
        values = np.asarray(density_fn(grid_points(lo, hi, resolution, start, stop)), np.float32).reshape(-1)
        if values.shape[0] != stop - start:
            raise ValueError(f"density_fn returned {values.shape[0]} values for {stop - start} points")
        out[start:stop] = values
    return out.reshape((resolution + 1,) * 3)


def _check_grid(lo, hi, resolution, chunk):
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    if lo.shape != (3,) or hi.shape != (3,) or not np.all(np.isfinite(lo) & np.isfinite(hi)) or not np.all(lo < hi):
        raise ValueError(f"the box must be two finite corners lo < hi of 3 values each, got {lo} and {hi}")
    if int(resolution) != resolution or resolution < 2:
        raise ValueError(f"resolution must be an integer >= 2 (cells per axis), got {resolution!r}")
    if int(chunk) != chunk or chunk < 1:
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")


class NoSurfaceError(ValueError):
    """The density never crosses the threshold inside the box (everything empty, or everything full)."""


def marching_cubes(density: np.ndarray, lo, hi, threshold: float) -> Mesh:
    """The ``threshold`` iso-surface of a density sampled at the cell corners of the box ``lo``/``hi`` (see
    :func:`sample_density`) → :class:`Mesh` in the box's coordinates, without colours. Raises
    :class:`NoSurfaceError` when the density does not cross ``threshold``.

    Example:
      >>> import numpy as np
      >>> from nerf import mesh
      >>> d = mesh.sample_density(lambda p: 1.0 - np.linalg.norm(p, axis=1), (-1, -1, -1), (1, 1, 1), 32)
      >>> m = mesh.marching_cubes(d, (-1, -1, -1), (1, 1, 1), threshold=0.5)   # the sphere of radius 0.5
      >>> bool(np.allclose(np.linalg.norm(m.vertices, axis=1), 0.5, atol=0.01))
      True
      >>> bool(np.all(np.sum(m.normals * m.vertices, axis=1) > 0))   # normals point out of the dense region
      True
      >>> a, b, c = (m.vertices[m.faces[:, k]] for k in range(3))
      >>> bool(np.all(np.sum(np.cross(b - a, c - a) * a, axis=1) > 0))   # counter-clockwise seen from outside
      True
    """
    from skimage import measure

    density = np.asarray(density, np.float32)
    if density.ndim != 3 or min(density.shape) < 2:
        raise ValueError(f"density must be a 3-D grid of at least 2 samples per axis, got shape {density.shape}")
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    finite = density[np.isfinite(density)]
    if finite.size == 0 or not (finite.min() < threshold < finite.max()):
        rng = f"[{finite.min():.4g}, {finite.max():.4g}]" if finite.size else "no finite values"
        raise NoSurfaceError(f"the density never crosses the threshold {threshold:g} (its range: {rng})")
    spacing = (hi - lo) / (np.asarray(density.shape) - 1)
    # NaN would break the interpolation: count it as empty space
    verts, faces, normals, _ = measure.marching_cubes(np.nan_to_num(density, nan=0.0), level=float(threshold),
                                                      spacing=tuple(spacing), gradient_direction="descent")
    n = np.asarray(normals, np.float64)
    length = np.linalg.norm(n, axis=1, keepdims=True)
    n = np.where(length > 1e-12, n / np.maximum(length, 1e-12), 0.0)
    # scikit-image's triangles wind clockwise seen from the side its normals point to: reversed here, so that they
    # are counter-clockwise seen from outside (the front faces of PLY viewers)
    return Mesh(np.asarray(verts, np.float64) + lo, np.ascontiguousarray(np.asarray(faces, np.int32)[:, ::-1]), n)


FALLBACK_VIEW = np.array([0.0, 0.0, -1.0])  # the view direction where a vertex has no normal: looking down (−z)


def view_directions(normals: np.ndarray) -> np.ndarray:
    """The view direction of each vertex's colour: the opposite of its unit normal (a ray meeting the surface
    head-on), ``FALLBACK_VIEW`` where the normal is zero."""
    d = -np.asarray(normals, np.float64)
    zero = np.linalg.norm(d, axis=1) < 0.5
    d[zero] = FALLBACK_VIEW
    return d


def color_vertices(mesh: Mesh, color_fn, chunk: int = 2 ** 18, density_fn=None, depth: float = 0.0,
                   samples: int = 16) -> Mesh:
    """``mesh`` with ``colors`` from ``color_fn(points [M, 3], view directions [M, 3]) → [M, 3]`` (float32 inputs,
    at most ``chunk`` points a call; view directions from :func:`view_directions`), clipped to [0, 1]:

    * ``depth`` = 0 (or no ``density_fn``): the colour at the vertex;
    * ``depth`` > 0: the colour a ray meeting the surface head-on renders: ``samples`` points evenly spaced from
      ``depth`` outside the vertex to ``depth`` inside it along the view direction, composited with
      ``density_fn`` (alpha = 1 - exp(-density * spacing), front to back) and divided by their total weight (the
      vertex's own colour where that weight is below 1e-6). A NeRF's colour field is trained where the rendering
      weights are, a little behind the density's iso-surface, so this is closer to its renders than the colour at
      the vertex.

    Example:
      >>> import numpy as np
      >>> from nerf import mesh
      >>> m = mesh.Mesh(np.zeros((1, 3)), np.zeros((0, 3), np.int32), np.array([[0.0, 0.0, 1.0]]))
      >>> inside_green = lambda p, d: np.where(p[:, 2:] < 0, [[0.0, 1.0, 0.0]], [[1.0, 0.0, 0.0]])
      >>> mesh.color_vertices(m, inside_green).colors.tolist()   # at the vertex (z = 0): red
      [[1.0, 0.0, 0.0]]
      >>> slab = lambda p: 1000.0 * (p[:, 2] < 0)
      >>> mesh.color_vertices(m, inside_green, density_fn=slab, depth=0.1).colors.round(3).tolist()
      [[0.0, 1.0, 0.0]]
    """
    dirs = view_directions(mesh.normals)
    verts = mesh.vertices
    render = density_fn is not None and depth > 0
    if render and samples < 2:
        raise ValueError(f"samples must be at least 2, got {samples}")
    offsets = np.linspace(-depth, depth, samples) if render else np.zeros(1)  # distance along the view direction
    per_call = max(1, chunk // len(offsets))
    parts = []
    for a in range(0, len(verts), per_call):
        v, d = verts[a:a + per_call], dirs[a:a + per_call]
        pts = (v[:, None, :] + offsets[None, :, None] * d[:, None, :]).reshape(-1, 3).astype(np.float32)
        dd = np.repeat(d, len(offsets), axis=0).astype(np.float32)
        c = np.asarray(color_fn(pts, dd), np.float64)
        if c.shape != (len(pts), 3):
            raise ValueError(f"color_fn returned shape {c.shape} for {len(pts)} points")
        c = c.reshape(len(v), len(offsets), 3)
        if not render:
            parts.append(c[:, 0])
            continue
        sigma = np.maximum(np.asarray(density_fn(pts), np.float64).reshape(len(v), len(offsets)), 0.0)
        alpha = 1.0 - np.exp(-sigma * (offsets[1] - offsets[0]))
        trans = np.cumprod(np.concatenate([np.ones((len(v), 1)), 1.0 - alpha[:, :-1]], axis=1), axis=1)
        w = alpha * trans
        total = w.sum(axis=1)
        at_vertex = c[:, len(offsets) // 2] if len(offsets) % 2 else 0.5 * (c[:, len(offsets) // 2 - 1] +
                                                                              c[:, len(offsets) // 2])
        rendered = np.einsum("vk,vkc->vc", w, c) / np.maximum(total, 1e-12)[:, None]
        parts.append(np.where(total[:, None] >= 1e-6, rendered, at_vertex))
    colors = np.concatenate(parts) if parts else np.zeros((0, 3))
    return dataclasses.replace(mesh, colors=np.clip(colors, 0.0, 1.0))


def extract_mesh(density_fn, lo, hi, resolution: int, threshold: float, color_fn=None,
                 chunk: int = 2 ** 18, color_depth: float = 0.0, color_samples: int = 16) -> Mesh:
    """:func:`sample_density` → :func:`marching_cubes` → :func:`color_vertices` (when ``color_fn`` is given; with
    ``density_fn``, ``depth=color_depth`` and ``samples=color_samples``).

    Example:
      >>> import numpy as np
      >>> from nerf import mesh
      >>> ball = lambda p: 10.0 * (np.linalg.norm(p, axis=1) < 0.6)
      >>> m = mesh.extract_mesh(ball, (-1, -1, -1), (1, 1, 1), 16, 5.0, color_fn=lambda p, d: 0.5 - 0.5 * d)
      >>> len(m.vertices) > 0, bool(np.all((m.colors >= 0) & (m.colors <= 1)))
      (True, True)
    """
    m = marching_cubes(sample_density(density_fn, lo, hi, resolution, chunk), lo, hi, threshold)
    if color_fn is None:
        return m
    return color_vertices(m, color_fn, chunk, density_fn, color_depth, color_samples)


def to_uint8(colors: np.ndarray) -> np.ndarray:
    """Colours in [0, 1] → uint8 (rounded)."""
    return np.round(np.clip(colors, 0.0, 1.0) * 255.0).astype(np.uint8)


def write_mesh_ply(path: str, mesh: Mesh) -> None:
    """Binary little-endian PLY: vertices ``x y z nx ny nz`` (float32) ``red green blue`` (uint8; white without
    colours) and faces ``vertex_indices`` (int32 lists of 3).

    Example:
      >>> import os, tempfile, numpy as np, plyfile
      >>> from nerf import mesh
      >>> m = mesh.Mesh(np.eye(3), np.array([[0, 1, 2]]), np.tile([[0.0, 0.0, 1.0]], (3, 1)), np.eye(3))
      >>> path = os.path.join(tempfile.mkdtemp(), "tri.ply")
      >>> mesh.write_mesh_ply(path, m)
      >>> ply = plyfile.PlyData.read(path)
      >>> ply["vertex"]["red"].tolist(), ply["face"]["vertex_indices"][0].tolist()
      ([255, 0, 0], [0, 1, 2])
    """
    from plyfile import PlyData, PlyElement

    v = np.empty(len(mesh.vertices), dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("nx", "<f4"), ("ny", "<f4"),
                                            ("nz", "<f4"), ("red", "u1"), ("green", "u1"), ("blue", "u1")])
    for k, name in enumerate("xyz"):
        v[name] = mesh.vertices[:, k]
        v["n" + name] = mesh.normals[:, k]
    rgb = to_uint8(mesh.colors) if mesh.colors is not None else np.full((len(v), 3), 255, np.uint8)
    for k, name in enumerate(("red", "green", "blue")):
        v[name] = rgb[:, k]
    f = np.empty(len(mesh.faces), dtype=[("vertex_indices", "<i4", (3,))])
    f["vertex_indices"] = mesh.faces
    PlyData([PlyElement.describe(v, "vertex"), PlyElement.describe(f, "face")], text=False,
            byte_order="<").write(path)


def write_points_ply(path: str, points: np.ndarray) -> None:
    """Binary little-endian PLY of points ``[N, 3]``: one vertex element ``x y z`` (float32), no faces."""
    from plyfile import PlyData, PlyElement

    points = np.asarray(points, np.float64).reshape(-1, 3)
    v = np.empty(len(points), dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4")])
    for k, name in enumerate("xyz"):
        v[name] = points[:, k]
    PlyData([PlyElement.describe(v, "vertex")], text=False, byte_order="<").write(path)


class PlyContents(NamedTuple):
    """What :func:`read_ply` returns: ``vertices`` float64 [V, 3]; ``faces`` int64 [F, 3], ``normals`` float64
    [V, 3] and ``colors`` uint8 [V, 3], each None when the file has none."""

    vertices: np.ndarray
    faces: np.ndarray | None
    normals: np.ndarray | None
    colors: np.ndarray | None


def read_ply(path: str) -> PlyContents:
    """A PLY written by :func:`write_mesh_ply` or :func:`write_points_ply` (read with plyfile) →
    :class:`PlyContents`."""
    from plyfile import PlyData

    ply = PlyData.read(path)
    v = ply["vertex"]
    names = {p.name for p in v.properties}

    def columns(keys, dtype):
        return np.stack([np.asarray(v[k], dtype) for k in keys], axis=-1) if set(keys) <= names else None

    faces = None
    if "face" in [e.name for e in ply.elements]:
        fi = ply["face"]["vertex_indices"]
        faces = np.stack([np.asarray(f, np.int64) for f in fi]) if len(fi) else np.zeros((0, 3), np.int64)
    return PlyContents(columns("xyz", np.float64), faces, columns(("nx", "ny", "nz"), np.float64),
                       columns(("red", "green", "blue"), np.uint8))
