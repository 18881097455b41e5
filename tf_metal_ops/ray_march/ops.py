"""The ``ray_march`` op wrapper (op definition: csrc/ops/ray_march_op.cc; conventions: ``tf_metal_ops.ray_march``)
and the occupancy bitfield it reads (``pack_bits``, ``unpack_bits``)."""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

from tf_metal_ops._args import _check_int, _check_real
from tf_metal_ops._library import ops

RayMarchResult = collections.namedtuple("RayMarchResult",
                                        ["t_starts", "t_ends", "row_splits", "ray_indices", "positions"])

MAX_RESOLUTION = 1024  # the kernels index cells with 32-bit integers
MAX_CASCADES = 8  # kRmMaxCascades in ray_march_math.h: cascade K - 1 spans 2^7 = 128 times the box (aabb_scale 128)
_MAX_SKIPS_PER_CELL = 8  # kRmMaxSkipsPerCell, kRmMaxSkipsExtra in ray_march_math.h
_MAX_SKIPS_EXTRA = 64


def pack_bits(occupied):
    """bool [n] -> uint8 [ceil(n / 8)]: bit (i & 7) of byte i >> 3, LSB first; padding bits are 0."""
    occupied = tf.reshape(tf.cast(occupied, tf.int32), [-1])
    n = tf.size(occupied)
    padded = tf.pad(occupied, [[0, (8 - n % 8) % 8]])
    weights = tf.constant([1, 2, 4, 8, 16, 32, 64, 128], tf.int32)
    return tf.cast(tf.reduce_sum(tf.reshape(padded, [-1, 8]) * weights, axis=1), tf.uint8)


def unpack_bits(bits, n):
    """uint8 [ceil(n / 8)] -> bool [n] (inverse of ``pack_bits``)."""
    bytes_ = tf.cast(tf.convert_to_tensor(bits), tf.int32)
    shifts = tf.range(8, dtype=tf.int32)
    flags = tf.bitwise.bitwise_and(tf.bitwise.right_shift(bytes_[:, None], shifts[None, :]), 1)
    return tf.reshape(flags, [-1])[:n] > 0


def _grid_parts(fn, grid):
    """(bits, aabb, resolution, cascades) of a grid; bits checked against [cascades, ceil(G^3 / 8)] (or
    [ceil(G^3 / 8)] for one cascade) where its shape is known."""
    for attr in ("bits", "aabb", "resolution"):
        if not hasattr(grid, attr):
            raise ValueError(f"{fn}: grid must be an OccupancyGrid (or have .bits, .aabb, .resolution); no .{attr}")
    g = _check_int(fn, "grid.resolution", int(grid.resolution), 1, MAX_RESOLUTION)
    k = _check_int(fn, "grid.cascades", getattr(grid, "cascades", 1), 1, MAX_CASCADES)
    bits = tf.convert_to_tensor(grid.bits)
    if bits.dtype != tf.uint8:
        raise ValueError(f"{fn}: grid.bits must be uint8, got {bits.dtype.name}")
    nbytes = (g**3 + 7) // 8
    shape = bits.shape.as_list() if bits.shape.rank is not None else None
    if shape is not None and not (shape in ([k, nbytes], [k, None], [None, nbytes], [None, None]) or
                                  (k == 1 and shape in ([nbytes], [None]))):
        raise ValueError(f"{fn}: grid.bits must have shape [cascades, ceil(resolution^3 / 8)] = [{k}, {nbytes}]"
                         f"{f' (or [{nbytes}])' if k == 1 else ''} for {k} cascade(s) of resolution {g}, "
                         f"got {bits.shape}")
    aabb = tf.convert_to_tensor(grid.aabb, dtype_hint=tf.float32)
    if aabb.dtype != tf.float32:
        aabb = tf.cast(aabb, tf.float32)
    return bits, aabb, g, k


def _rays_and_range(fn, rays_o, rays_d, near, far):
    def f32(x, name):
        x = tf.convert_to_tensor(x, dtype_hint=tf.float32)
        if x.dtype != tf.float32:
            raise ValueError(f"{fn}: {name} must be float32, got {x.dtype.name} (cast it with tf.cast)")
        return x

    rays_o, rays_d = f32(rays_o, "rays_o"), f32(rays_d, "rays_d")
    for x, name in ((rays_o, "rays_o"), (rays_d, "rays_d")):
        if x.shape.rank is not None and (x.shape.rank != 2 or x.shape[1] not in (None, 3)):
            raise ValueError(f"{fn}: {name} must have shape [rays, 3], got {x.shape}")
    r = tf.shape(rays_o)[0]

    def per_ray(x, default, name):
        x = f32(default if x is None else x, name)
        if x.shape.rank == 0:
            return tf.fill([r], x)
        if x.shape.rank is not None and x.shape.rank != 1:
            raise ValueError(f"{fn}: {name} must be a scalar or have shape [rays], got {x.shape}")
        return x

    return rays_o, rays_d, per_ray(near, 0.0, "near"), per_ray(far, np.inf, "far")


def _check_march_args(fn, step_size, cone_angle, max_samples, jitter):
    step_size = _check_real(fn, "step_size", step_size, 0.0, strict=True)
    cone_angle = _check_real(fn, "cone_angle", cone_angle, 0.0, strict=False)
    max_samples = _check_int(fn, "max_samples", max_samples, 1, 2**31 - 1)
    if not isinstance(jitter, (bool, np.bool_)):
        raise ValueError(f"{fn}: jitter must be a bool, got {jitter!r}")
    return step_size, cone_angle, max_samples, bool(jitter)


def _seed_tensor(seed):
    seed = tf.convert_to_tensor(seed)
    if not seed.dtype.is_integer:
        raise ValueError(f"ray_march: seed must be an integer, got {seed.dtype.name}")
    return tf.cast(seed, tf.int64)


def ray_march(rays_o, rays_d, grid, *, near=None, far=None, step_size, cone_angle=0.0, max_samples=1024,
              jitter=True, seed=0, name=None):
    """Marches rays through the occupied cells of ``grid`` (the ``RayMarch`` op) -> ``RayMarchResult``.

    Args:
      rays_o, rays_d: [R, 3] float32 origins and directions (t is in units of |d|; unit directions usual).
      grid: an ``OccupancyGrid`` (or anything with ``.bits`` uint8, ``.aabb`` [2, 3], ``.resolution`` and optionally
        ``.cascades``, default 1). With K cascades, cascade c covers the aabb scaled by 2^c about its centre, bits
        has shape [K, ceil(G^3 / 8)], and each sample's cell is that of the finest cascade containing its midpoint.
      near, far: None (0 and +inf), scalars, or [R] (e.g. per-ray bounds from the data). The march covers
        [max(near, t_enter), min(far, t_exit)] of the outermost cascade's box.
      step_size: > 0; cone_angle >= 0 (dt = clamp(t * cone_angle, step_size, max_step), max_step one cell diagonal
        of the cascade at t: steps grow with the distance, up to the cell size of the cascade they are in).
      max_samples: per-ray cap (>= 1). jitter: offset the first sample by u * dt, u from hash(seed, ray).
      seed: int or int tensor (a tensor input of the op: changing it does not retrace a tf.function).

    Returns ``RayMarchResult(t_starts [N], t_ends [N], row_splits [R+1] int32, ray_indices [N] int32,
    positions [N, 3])``: ``positions`` are the samples' midpoints ``o + d (t_start + t_end) / 2`` in the unit
    coordinates ``(x - lo) / (hi - lo)`` of the outermost cascade's box (the grid box with one cascade), clamped to
    [0, 1] (what an encoding over the box, e.g. the hash grid, takes; world coordinates are
    ``lo + positions * (hi - lo)``; for an unbounded scene, ``contract_to_unit`` of the world coordinates is the
    usual input instead). No gradient (the outputs are sample positions).

    Example:
      >>> import tf_metal_ops
      >>> grid = tf_metal_ops.OccupancyGrid(resolution=8)  # box [-1, 1]^3, every cell occupied until updated
      >>> rays_o = [[-2.0, 0.0, 0.0], [0.0, -2.0, 0.0]]
      >>> rays_d = [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]  # the second ray misses the box
      >>> res = tf_metal_ops.ray_march(rays_o, rays_d, grid, step_size=0.25, jitter=False)
      >>> res.row_splits.numpy(), res.t_starts.numpy()[:3], res.positions.shape
      (array([0, 8, 8], dtype=int32), array([1.  , 1.25, 1.5 ], dtype=float32), TensorShape([8, 3]))
    """
    fn = "ray_march"
    step_size, cone_angle, max_samples, jitter = _check_march_args(fn, step_size, cone_angle, max_samples, jitter)
    bits, aabb, g, k = _grid_parts(fn, grid)
    rays_o, rays_d, near, far = _rays_and_range(fn, rays_o, rays_d, near, far)
    out = ops().ray_march(rays_o, rays_d, near, far, bits, aabb, _seed_tensor(seed), resolution=g,
                          step_size=step_size, cone_angle=cone_angle, max_samples=max_samples, jitter=jitter,
                          cascades=k, name=name)
    return RayMarchResult(*out)


tf.no_gradient("RayMarch")
