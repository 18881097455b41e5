#!/usr/bin/env python
"""How close a mesh is to the built-in scene's analytic geometry (``nerf.data.synthetic.SCENE``, world frame).

    python examples/nerf/mesh_accuracy.py DIR/mesh.ply

Two one-sided distances, the two halves of a Chamfer distance:

* **accuracy** (mesh → scene): each mesh vertex's exact distance to the nearest primitive surface
  (:func:`nerf.data.synthetic.surface_distance`; every primitive's whole surface counts, hidden parts too);
* **visible accuracy**: the same for the vertices the test cameras see (:func:`visible_vertices`, a z-buffer of
  the vertices): a NeRF's solids are shells whose inner walls (inside the objects, under the floor) no camera
  sees and no training ray shaped;
* **completeness** (scene → mesh): for the surface points the test cameras see (the first hits of a ray-traced
  ring of held-out views, :func:`visible_surface_points`), the distance to the nearest of dense random samples on
  the mesh's triangles (:func:`sample_triangles`; an upper bound of the distance to the mesh that exceeds it by
  at most about the samples' spacing, ``spacing`` below).

Printed (scene units; the built-in scene spans [-1, 1]^3): mean, median, 95th percentile and maximum of each, and
the Chamfer distance (the sum of the accuracy and completeness means).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # examples/ → `import nerf`

import numpy as np  # noqa: E402

from nerf.data import synthetic  # noqa: E402
from nerf.data.rays import get_rays, project  # noqa: E402


def ring_cameras(n_views: int, resolution: int):
    """The built-in scene's test-camera ring (35° elevation, radius 4, ``n_views`` cameras evenly spaced) at
    ``resolution``² pixels → ``(poses [n_views, 4, 4], focal)``."""
    params = synthetic.SceneParams(H=resolution, W=resolution, n_train=0, n_val=0, n_test=n_views)
    return synthetic.camera_poses(params)["test"], params.focal


def visible_vertices(vertices, n_views: int = 16, resolution: int = 64, tolerance: float = 0.02) -> np.ndarray:
    """bool ``[V]``: the vertices some camera of the test ring (:func:`ring_cameras`) sees, approximately: a
    vertex is seen when its depth is within ``tolerance`` of the nearest vertex depth in its pixel (a z-buffer of
    the vertices, meaningful when the vertices are denser than the pixels' footprint: ~0.045 at 64² pixels)."""
    v = np.asarray(vertices, np.float64)
    seen = np.zeros(len(v), bool)
    poses, focal = ring_cameras(n_views, resolution)
    for c2w in poses:
        uv, depth = project(v, resolution, resolution, focal, c2w)
        px = np.floor(uv).astype(np.int64)
        ok = (depth > 0) & np.all((px >= 0) & (px < resolution), axis=1)
        pix = np.where(ok, px[:, 1] * resolution + px[:, 0], 0)
        zbuf = np.full(resolution * resolution, np.inf)
        np.minimum.at(zbuf, pix[ok], depth[ok])
        seen |= ok & (depth <= zbuf[pix] + tolerance)
    return seen


def visible_surface_points(n_views: int = 16, resolution: int = 64) -> np.ndarray:
    """Surface points of the built-in scene seen from its test-camera ring (35° elevation, radius 4; ``n_views``
    cameras evenly spaced on it): the first ray hit of each pixel centre of ``resolution``² pixels with the scene's
    field of view → float64 ``[K, 3]``.

    Example:
      >>> from nerf import mesh_accuracy
      >>> from nerf.data import synthetic
      >>> p = mesh_accuracy.visible_surface_points(2, 16)
      >>> len(p) > 100, float(synthetic.surface_distance(p).max()) < 1e-9
      (True, True)
    """
    points = []
    poses, focal = ring_cameras(n_views, resolution)
    for c2w in poses:
        o, d = get_rays(resolution, resolution, focal, c2w)
        o, d = o.reshape(-1, 3).astype(np.float64), d.reshape(-1, 3).astype(np.float64)
        d /= np.linalg.norm(d, axis=1, keepdims=True)
        t, _ = synthetic.first_hit(o, d)
        hit = np.isfinite(t)
        points.append(o[hit] + t[hit, None] * d[hit])
    return np.concatenate(points)


def sample_triangles(vertices, faces, spacing: float, seed: int = 0) -> np.ndarray:
    """Random points on the triangles ``faces`` [F, 3] of ``vertices`` [V, 3], about one per ``spacing``² of area
    (at least one per triangle, area-proportional, uniform inside each) plus the vertices → float64 ``[K, 3]``."""
    v = np.asarray(vertices, np.float64)
    f = np.asarray(faces, np.int64)
    if len(f) == 0:
        return v
    a, b, c = v[f[:, 0]], v[f[:, 1]], v[f[:, 2]]
    area = 0.5 * np.linalg.norm(np.cross(b - a, c - a), axis=1)
    count = np.maximum(1, np.ceil(area / spacing ** 2)).astype(np.int64)
    tri = np.repeat(np.arange(len(f)), count)
    rng = np.random.default_rng(seed)
    u, w = rng.random(len(tri)), rng.random(len(tri))
    flip = u + w > 1  # fold the unit square's upper half onto the triangle
    u, w = np.where(flip, 1 - u, u), np.where(flip, 1 - w, w)
    pts = a[tri] + u[:, None] * (b - a)[tri] + w[:, None] * (c - a)[tri]
    return np.concatenate([v, pts])


def stats(d) -> dict:
    d = np.asarray(d, np.float64)
    return dict(mean=float(d.mean()), median=float(np.median(d)), p95=float(np.percentile(d, 95)),
                max=float(d.max()), n=int(len(d)))


def mesh_distances(vertices, faces, surface_points=None, spacing: float = 0.002) -> dict:
    """``accuracy``, ``visible_accuracy`` and ``completeness`` distances (scene units, see the module docstring) of
    a mesh in the built-in scene's world frame: ``{name: stats, "chamfer": accuracy mean + completeness mean}``,
    stats = mean, median, 95th percentile, max, count. ``surface_points``: default
    :func:`visible_surface_points`.

    Example:
      >>> import numpy as np
      >>> from nerf import mesh, mesh_accuracy
      >>> from nerf.data import synthetic
      >>> inside = lambda p: 10.0 * (synthetic.SCENE[1].signed_distance(p) < 0)   # the striped sphere alone
      >>> m = mesh.extract_mesh(inside, (-1, -1, -1), (1, 1, 1), 64, 5.0)
      >>> r = mesh_accuracy.mesh_distances(m.vertices, m.faces, spacing=0.01)
      >>> r["accuracy"]["max"] < 2 / 64, r["completeness"]["max"] > 0.5   # accurate but incomplete
      (True, True)
    """
    from scipy.spatial import cKDTree

    pts = visible_surface_points() if surface_points is None else np.asarray(surface_points, np.float64)
    acc = synthetic.surface_distance(vertices)
    comp, _ = cKDTree(sample_triangles(vertices, faces, spacing)).query(pts)
    seen = visible_vertices(vertices)
    a, c = stats(acc), stats(comp)
    return dict(accuracy=a, visible_accuracy=stats(acc[seen]) if seen.any() else None, completeness=c,
                chamfer=a["mean"] + c["mean"])


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description="Distances of a mesh (PLY, world frame) to the built-in scene's "
                                            "analytic geometry.")
    p.add_argument("mesh", help="a mesh.ply written by export.py (the built-in scene's world frame)")
    p.add_argument("--spacing", type=float, default=0.002,
                   help="spacing of the samples on the mesh for the completeness distance (default 0.002)")
    args = p.parse_args(argv)
    if not os.path.isfile(args.mesh):
        p.error(f"{args.mesh}: no such file")
    if not args.spacing > 0:
        p.error(f"--spacing must be positive, got {args.spacing}")
    from nerf.mesh import read_ply

    verts, faces, _, _ = read_ply(args.mesh)
    if faces is None or len(faces) == 0:
        p.error(f"{args.mesh}: no faces")
    r = mesh_distances(verts, faces, spacing=args.spacing)
    what = dict(accuracy="mesh vertices -> scene", visible_accuracy="vertices the test cameras see -> scene",
                completeness="scene points the test cameras see -> mesh")
    for name, text in what.items():
        s = r[name]
        if s is None:
            print(f"{name}: no vertex is seen by the test cameras")
            continue
        print(f"{name} ({text}, {s['n']:,} points): mean {s['mean']:.4f}  median {s['median']:.4f}  "
              f"95% {s['p95']:.4f}  max {s['max']:.4f}")
    print(f"chamfer (mean + mean): {r['chamfer']:.4f}")
    return r


if __name__ == "__main__":
    main()
