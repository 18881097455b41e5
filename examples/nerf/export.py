#!/usr/bin/env python
"""Geometry out of a trained NeRF: a coloured mesh and the occupancy grid's occupied cells, as binary PLY files.

    python examples/nerf/export.py RUN/model --out DIR [--resolution 256] [--threshold 10] [--chunk 262144]
                                   [--color-depth D] [--grid-mask] [--frame world|scene] [--bound B]

* ``DIR/mesh.ply``: marching cubes (scikit-image) on the model's density sampled at the corners of
  ``--resolution``^3 cells over its bounded region (the hash model's box ``[-bound, bound]^3``; ``--bound`` for the
  MLP model, which has none, and beyond the unit region for an unbounded hash model, whose contracted field is
  defined everywhere; a bounded hash model's field ends at its box, so a larger ``--bound`` is refused), the surface where the density crosses ``--threshold``. Vertices ``x y z``, outward
  normals ``nx ny nz`` and colours ``red green blue`` (uint8): what a ray meeting the surface head-on (along the
  opposite of the vertex normal) renders, volume-rendered with the model's density and colour fields over
  ``--color-depth`` either side of the vertex (16 samples; default bound / 20: 0.05 for the built-in scene;
  0: the colour field at the vertex itself); faces ``vertex_indices``.
* ``DIR/points.ply``: the centres of the occupancy grid's occupied cells (``x y z``; hash model with the
  occupancy sampler only), the space the renderer marches through.

**Frame**: both files are in **the data's own world frame**: the model's (scene) frame mapped back through the
inverse of the ``world_to_scene`` similarity saved in ``model.json`` (a capture: COLMAP's frame and units; the
built-in scene: its world, the identity). ``--frame scene`` writes the model's frame instead.

The density threshold is in the model's density units (per unit length of the scene frame). The default 10 gives
a sample of the training step (box diagonal / 256: 0.0135 for the built-in scene) an opacity of 1 - exp(-0.135)
= 13 %; the occupancy grid's own threshold is ~3 (see the README's measurements for the choice).

A bad argument (no model in the directory, ``--resolution`` < 2, ...) is one line on stderr and exit code 2, before
TensorFlow loads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # examples/ → `import nerf`

import numpy as np  # noqa: E402

from nerf import mesh as meshlib  # noqa: E402  (no TensorFlow)
from nerf.config import check_at_least  # noqa: E402  (no TensorFlow)

DEFAULT_RESOLUTION = 256
DEFAULT_THRESHOLD = 10.0
DEFAULT_CHUNK = 2 ** 18
COLOR_DEPTH_PER_BOUND = 1 / 20  # the default --color-depth, a fraction of the region's half size
KINDS = ("hash", "mlp")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Export a trained NeRF's geometry: DIR/mesh.ply (marching cubes, vertex "
                                            "colours) and DIR/points.ply (the occupancy grid's occupied cells).")
    p.add_argument("model", help="a saved model directory (train.py's OUT/model: model.json, model.weights.h5)")
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument("--resolution", type=int, default=DEFAULT_RESOLUTION,
                   help=f"marching-cubes cells per axis of the bounded region (default {DEFAULT_RESOLUTION})")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                   help=f"density iso-level of the surface (default {DEFAULT_THRESHOLD:g}, in the model's units)")
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK,
                   help=f"points per model evaluation (default {DEFAULT_CHUNK}; lower it to save memory)")
    p.add_argument("--bound", type=float, default=None,
                   help="half size of the box to mesh, [-bound, bound]^3 in the model's frame (default: the hash "
                        "model's bound; 1.0 for the MLP model); at most the box of a bounded hash model, any size "
                        "for an unbounded (contracted) one")
    p.add_argument("--color-depth", type=float, default=None,
                   help="vertex colours: volume-render a ray through the vertex from this far outside to this far "
                        "inside (model frame units; default bound / 20; 0: the colour field at the vertex)")
    p.add_argument("--grid-mask", action="store_true",
                   help="count density in the occupancy grid's empty cells as 0 (the renderer never samples there)")
    p.add_argument("--frame", choices=("world", "scene"), default="world",
                   help="world: the data's own frame (default); scene: the frame the model was trained in")
    return p


def read_model_meta(directory: str) -> dict:
    """``directory/model.json`` after checking that the directory holds a saved model → the JSON document. Raises
    ValueError naming what is missing or wrong."""
    if not os.path.isdir(directory):
        raise ValueError(f"{directory}: no such directory")
    path = os.path.join(directory, "model.json")
    if not os.path.isfile(path):
        raise ValueError(f"{directory}: no model.json (not a saved model; train.py writes one to OUT/model)")
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("kind") not in KINDS or not isinstance(meta.get("config"), dict):
        raise ValueError(f"{path}: not a saved NeRF model (needs \"kind\" in {KINDS} and a \"config\")")
    if not os.path.isfile(os.path.join(directory, "model.weights.h5")):
        raise ValueError(f"{directory}: no model.weights.h5")
    T = np.asarray(meta.get("world_to_scene", np.eye(4)), np.float64)
    if T.shape != (4, 4) or not np.all(np.isfinite(T)) or not np.linalg.det(T[:3, :3]) > 0:
        raise ValueError(f"{path}: world_to_scene must be a finite 4x4 similarity, got {meta.get('world_to_scene')}")
    cfg = meta["config"]
    if meta["kind"] == "hash" and cfg.get("sampler") == "occupancy" and not os.path.isfile(
            os.path.join(directory, "occupancy_grid.npz")):
        raise ValueError(f"{directory}: no occupancy_grid.npz (the model uses the occupancy sampler)")
    return meta


def check_args(p: argparse.ArgumentParser, args) -> dict:
    """Every argument checked before anything heavy runs; argparse's error (usage, exit code 2) otherwise. Returns
    the model's metadata."""
    check_at_least(p, "--resolution", args.resolution, 2, "cells per axis")
    if not (np.isfinite(args.threshold) and args.threshold > 0):
        p.error(f"--threshold must be a positive density, got {args.threshold}")
    check_at_least(p, "--chunk", args.chunk, 1)
    if args.color_depth is not None and not (np.isfinite(args.color_depth) and args.color_depth >= 0):
        p.error(f"--color-depth must be >= 0, got {args.color_depth}")
    if args.bound is not None and not (np.isfinite(args.bound) and args.bound > 0):
        p.error(f"--bound must be positive, got {args.bound}")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        p.error(f"--out {args.out}: exists and is not a directory")
    try:
        meta = read_model_meta(args.model)
    except ValueError as e:
        p.error(str(e))
    b = meta["config"].get("bound")
    unbounded = bool(meta["config"].get("unbounded"))  # contracted: the field is defined in all of space
    if meta["kind"] == "hash" and not unbounded and args.bound is not None and b is not None and args.bound > b:
        p.error(f"--bound {args.bound:g} is larger than the model's box [-{b:g}, {b:g}]^3: the model is bounded, its "
                "field is defined inside that box only (an unbounded model, trained with the contraction, takes any "
                "--bound)")
    if args.grid_mask and meta["config"].get("sampler") != "occupancy":
        p.error("--grid-mask needs a model with an occupancy grid (the hash model's occupancy sampler)")
    return meta


# --------------------------------------------------------------------------------------- the model's fields


def model_box(model, bound=None):
    """The region to mesh in the model's frame: ``(lo, hi)``, the hash model's box unless ``bound`` is given."""
    b = float(bound if bound is not None else model.cfg.get("bound", 1.0))
    return np.full(3, -b), np.full(3, b)


def model_fields(model, grid_mask: bool = False):
    """The model's density and colour as NumPy callables in its own frame: ``density(points [M, 3]) → [M]`` and
    ``color(points [M, 3], view directions [M, 3]) → [M, 3]`` (float32; each a ``tf.function`` traced once).

    Hash model: ``HashNeRF.density`` (hash encoding + density MLP), and the colour MLP on the density MLP's 16
    outputs and the spherical harmonics of the view direction, as its renderer computes them. MLP model: its
    field (no view dependence). ``grid_mask``: density 0 outside the occupancy grid's occupied cells. Kept on the
    model: a second call returns the same functions.

    Example:
      >>> import numpy as np
      >>> from nerf import export, models
      >>> model = models.build_model("hash", log2_hashmap_size=12)
      >>> density, color = export.model_fields(model)
      >>> p = np.zeros((4, 3), np.float32); d = np.tile([[0, 0, -1]], (4, 1)).astype(np.float32)
      >>> density(p).shape, color(p, d).shape
      ((4,), (4, 3))
    """
    cache = model.__dict__.setdefault("_export_fields", {})  # not a Keras-tracked attribute
    if bool(grid_mask) not in cache:
        cache[bool(grid_mask)] = _make_fields(model, bool(grid_mask))
    return cache[bool(grid_mask)]


def _make_fields(model, grid_mask):
    import tensorflow as tf

    from nerf.models import HashNeRF, sh_encoding_deg4

    spec = tf.TensorSpec([None, 3], tf.float32)
    if isinstance(model, HashNeRF):
        grid = model.grid if grid_mask else None

        @tf.function(input_signature=[spec])
        def density(p):
            sigma = model.density(p)
            return sigma if grid is None else tf.where(grid.is_occupied(p), sigma, tf.zeros_like(sigma))

        @tf.function(input_signature=[spec, spec])
        def color(p, d):
            _, rgb = model._field(model.encoding(model._normalise(p)), sh_encoding_deg4(d))
            return rgb
    else:
        if grid_mask:
            raise ValueError("grid_mask needs a model with an occupancy grid")

        @tf.function(input_signature=[spec])
        def density(p):
            return model.field(p)[0]

        @tf.function(input_signature=[spec, spec])
        def color(p, d):
            return model.field(p)[1]

    return (lambda p: density(tf.constant(p, tf.float32)).numpy(),
            lambda p, d: color(tf.constant(p, tf.float32), tf.constant(d, tf.float32)).numpy())


def occupied_cell_centres(grid) -> np.ndarray:
    """Centres ``[M, 3]`` (float64, the grid's frame) of the occupied cells of a ``tf_metal_ops.OccupancyGrid``
    (cell index x + G * (y + G * z), the grid's convention), in index order; with cascades, cascade by cascade, the
    cells of a cascade that lie inside the next finer cascade's box left out (the march never uses them)."""
    G = grid.resolution
    occ = np.asarray(grid.occupied().numpy()).reshape(grid.cascades, -1)
    out = []
    for c in range(grid.cascades):
        idx = np.nonzero(occ[c])[0]
        ijk = np.stack([idx % G, (idx // G) % G, idx // (G * G)], axis=-1)
        lo, hi = grid.cascade_aabb(c).astype(np.float64)
        p = lo + (ijk + 0.5) * ((hi - lo) / G)
        if c > 0:
            flo, fhi = grid.cascade_aabb(c - 1).astype(np.float64)
            p = p[~np.all((p > flo) & (p < fhi), axis=-1)]
        out.append(p)
    return np.concatenate(out).reshape(-1, 3)


def export(model, out: str, resolution: int = DEFAULT_RESOLUTION, threshold: float = DEFAULT_THRESHOLD,
           chunk: int = DEFAULT_CHUNK, bound=None, grid_mask: bool = False, frame: str = "world",
           color_depth=None) -> dict:
    """Writes ``out/mesh.ply`` and (occupancy grid) ``out/points.ply`` for a loaded model (see the module docstring
    for what they hold; ``color_depth`` None: bound / 20); returns a summary: vertex, face and point counts, the
    box, the frame, seconds.

    Raises :class:`nerf.mesh.NoSurfaceError` (after writing ``points.ply``) when the density never crosses
    ``threshold``."""
    if frame not in ("world", "scene"):
        raise ValueError(f"frame must be 'world' or 'scene', got {frame!r}")
    if color_depth is not None and not color_depth >= 0:
        raise ValueError(f"color_depth must be >= 0, got {color_depth}")
    os.makedirs(out, exist_ok=True)
    T = np.asarray(getattr(model, "world_to_scene", np.eye(4)), np.float64)
    to_out = np.linalg.inv(T) if frame == "world" else np.eye(4)  # model (scene) frame → the files' frame
    summary = dict(frame=frame, resolution=int(resolution), threshold=float(threshold))
    grid = getattr(model, "grid", None)
    if grid is not None:
        pts = occupied_cell_centres(grid)
        meshlib.write_points_ply(os.path.join(out, "points.ply"), pts @ to_out[:3, :3].T + to_out[:3, 3])
        summary["points"] = len(pts)
    lo, hi = model_box(model, bound)
    depth = float(hi[0]) * COLOR_DEPTH_PER_BOUND if color_depth is None else float(color_depth)
    density, color = model_fields(model, grid_mask)
    t0 = time.perf_counter()
    m = meshlib.extract_mesh(density, lo, hi, resolution, threshold, color_fn=color, chunk=chunk, color_depth=depth)
    m = m.transformed(to_out)
    meshlib.write_mesh_ply(os.path.join(out, "mesh.ply"), m)
    summary.update(vertices=len(m.vertices), faces=len(m.faces), box=[lo.tolist(), hi.tolist()], color_depth=depth,
                   cell=float((hi[0] - lo[0]) / resolution), seconds=time.perf_counter() - t0)
    return summary


def main(argv=None) -> dict:
    p = build_parser()
    args = p.parse_args(argv)
    check_args(p, args)  # exits (code 2) on bad input, before TensorFlow loads
    from nerf.models import load_model

    model = load_model(args.model)
    try:
        s = export(model, args.out, args.resolution, args.threshold, args.chunk, args.bound, args.grid_mask,
                   args.frame, args.color_depth)
    except meshlib.NoSurfaceError as e:
        print(f"error: {e}; try another --threshold", file=sys.stderr)
        raise SystemExit(1)
    print(f"{os.path.join(args.out, 'mesh.ply')}: {s['vertices']:,} vertices, {s['faces']:,} faces "
          f"({s['resolution']}^3 cells of {s['cell']:.4g}, density {s['threshold']:g}, {s['seconds']:.1f} s)"
          + (f"; {os.path.join(args.out, 'points.ply')}: {s['points']:,} occupied cells" if "points" in s else "")
          + f"; {s['frame']} frame", flush=True)
    return s


if __name__ == "__main__":
    main()
