"""Occupancy grid and ray marching that skips empty space (Instant-NGP / nerfacc style).

``OccupancyGrid`` keeps a decayed-max density estimate per cell of a G^3 grid over a box and a bitfield of the
occupied cells; ``ray_march`` (the compiled ``RayMarch`` op, CPU and Metal kernels) marches rays through the box and
returns packed samples only in occupied cells; ``ray_march_tf`` is the same march in plain TensorFlow (the oracle and
the speed baseline).

Packed samples: R rays, N samples. Sample k covers [t_starts[k], t_ends[k]] of ray ray_indices[k];
``row_splits`` [R+1] int32 (``tf.RaggedTensor.from_row_splits(values, row_splits)`` works). Within a ray samples are
sorted and non-overlapping; gaps are skipped empty space.

March (conventions in csrc/shared/ray_march_math.h): the ray o + t d covers
[max(near, t_box_enter), min(far, t_box_exit)]; steps dt(t) = clamp(t * cone_angle, step_size, max_step) with
max_step = max(step_size, sqrt(3) * largest cell size); the first sample starts at t_enter + u dt with u in [0, 1)
from a counter-based hash of (seed, ray index) (identical on every backend); a candidate [t, min(t + dt, t_exit)] is
kept when its midpoint lies in an occupied cell, otherwise t jumps to where the ray leaves the largest empty
block around that cell in the occupancy mip (levels of 2^m-cell blocks, each the OR of 2x2x2 blocks of the level
below, built by the kernels from the bitfield on every call): the same occupied cells as skipping cell by cell, in
a few steps instead of one per empty cell. At most ``max_samples`` samples per ray. Bad input: the CPU kernel raises InvalidArgumentError for non-finite origins or
directions and NaN near/far (near > far is fine: no samples); the Metal kernels give such a ray no samples.
"""

from __future__ import annotations

import collections
import numbers

import numpy as np
import tensorflow as tf

from tf_metal_ops._library import ops

RayMarchResult = collections.namedtuple("RayMarchResult",
                                        ["t_starts", "t_ends", "row_splits", "ray_indices", "positions"])

MAX_RESOLUTION = 1024  # the kernels index cells with 32-bit integers
_MAX_SKIPS_PER_CELL = 8  # kRmMaxSkipsPerCell, kRmMaxSkipsExtra in ray_march_math.h
_MAX_SKIPS_EXTRA = 64


def _check_aabb(fn, aabb):
    box = np.asarray(aabb, dtype=np.float64)
    if box.shape != (2, 3) or not np.all(np.isfinite(box)) or not np.all(box[0] < box[1]):
        raise ValueError(f"{fn}: aabb must be ((xmin, ymin, zmin), (xmax, ymax, zmax)), finite, min < max; got {aabb!r}")
    return box.astype(np.float32)


def _check_int(fn, name, v, lo, hi=None):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo or (hi is not None and v > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{fn}: {name} must be an integer {rng}, got {v!r}")
    return int(v)


def _check_real(fn, name, v, lo, *, strict):
    ok = not isinstance(v, bool) and isinstance(v, numbers.Real) and np.isfinite(float(v))
    ok = ok and (float(v) > lo if strict else float(v) >= lo)
    if not ok:
        raise ValueError(f"{fn}: {name} must be a finite number {'>' if strict else '>='} {lo}, got {v!r}")
    return float(v)


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


class OccupancyGrid(tf.Module):
    """A G^3 occupancy grid over an axis-aligned box: density estimate per cell plus a bitfield of occupied cells.

    Cells are indexed x + G*(y + G*z) (x fastest); cell (i, j, k) covers aabb_min + [i, i+1] * size / G per axis.
    Variables (on the CPU): ``density`` float32 [G^3] (decayed max of sampled densities, Instant-NGP style:
    new = max(old * decay, sampled), unsampled cells just decay), ``bits`` uint8 [ceil(G^3/8)] (bit (idx & 7) of
    byte idx >> 3), ``step`` int64 (number of updates so far, unless ``update(step=...)`` sets it).
    """

    def __init__(self, aabb=((-1.0, -1.0, -1.0), (1.0, 1.0, 1.0)), resolution=128, decay=0.95, threshold=0.01,
                 warmup_steps=256, name=None):
        super().__init__(name=name)
        fn = "OccupancyGrid"
        self._aabb = _check_aabb(fn, aabb)
        self._resolution = _check_int(fn, "resolution", resolution, 1, MAX_RESOLUTION)
        self._decay = _check_real(fn, "decay", decay, 0.0, strict=False)
        if self._decay > 1.0:
            raise ValueError(f"{fn}: decay must be in [0, 1], got {decay!r}")
        self._threshold = _check_real(fn, "threshold", threshold, 0.0, strict=False)
        self._warmup_steps = _check_int(fn, "warmup_steps", warmup_steps, 0)
        n = self._resolution ** 3
        with tf.device("/CPU:0"):
            self.density = tf.Variable(tf.zeros([n], tf.float32), trainable=False, name="density")
            self.bits = tf.Variable(pack_bits(tf.ones([n], tf.bool)), trainable=False, name="bits")
            self.step = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="step")
            self._rng = tf.random.Generator.from_seed(0x0CC0)

    @property
    def aabb(self):
        """float32 [2, 3] numpy array: (min, max) corners of the box."""
        return self._aabb.copy()

    @property
    def resolution(self):
        return self._resolution

    @property
    def num_cells(self):
        return self._resolution ** 3

    def _cell_points(self, idx, u):
        g = self._resolution
        ijk = tf.stack([idx % g, (idx // g) % g, idx // (g * g)], axis=1)
        lo = tf.constant(self._aabb[0])
        size = tf.constant(self._aabb[1] - self._aabb[0])
        return lo + (tf.cast(ijk, tf.float32) + u) * (size / float(g))

    def occupied(self):
        """bool [G^3]: the unpacked bitfield."""
        return unpack_bits(self.bits, self.num_cells)

    def occupied_fraction(self):
        """Scalar float32: the fraction of occupied cells."""
        return tf.reduce_mean(tf.cast(self.occupied(), tf.float32))

    def is_occupied(self, points):
        """bool [M] for points [M, 3] (False outside the box)."""
        points = tf.convert_to_tensor(points, dtype_hint=tf.float32)
        points = tf.cast(points, tf.float32)
        g = self._resolution
        lo, hi = tf.constant(self._aabb[0]), tf.constant(self._aabb[1])
        inside = tf.reduce_all((points >= lo) & (points <= hi), axis=-1)
        c = tf.cast(tf.floor((points - lo) * (float(g) / (hi - lo))), tf.int32)
        c = tf.clip_by_value(c, 0, g - 1)
        idx = c[:, 0] + g * (c[:, 1] + g * c[:, 2])
        byte = tf.cast(tf.gather(self.bits, idx // 8), tf.int32)
        bit = tf.bitwise.bitwise_and(tf.bitwise.right_shift(byte, idx % 8), 1) > 0
        return inside & bit

    def update(self, density_fn, *, step=None, n_cells=None, seed=None):
        """One grid update (works eagerly and inside ``tf.function``).

        Picks cells (all of them while step < warmup_steps; afterwards ``n_cells`` uniformly random cells plus
        ``n_cells`` drawn from the currently occupied ones; default n_cells = G^3 / 4), evaluates
        ``density_fn(points [M, 3] float32) -> [M] or [M, 1]`` at a uniformly jittered point of each, sets
        density = max(density * decay, sampled) (negative samples count as 0; unsampled cells only decay), then
        bits = density > min(mean(density), threshold), or all ones during warm-up. Sets ``step`` to step + 1.

        Args:
          density_fn: callable on float32 [M, 3] points (M varies).
          step: the update's step (int or int tensor); default the ``step`` variable.
          n_cells: cells per category after warm-up (Python int >= 1).
          seed: int or int tensor for the random choices (stateless: same seed and step, same cells); default: the
            grid's own random generator.
        Returns the new occupied fraction (scalar float32).
        """
        fn = "OccupancyGrid.update"
        n = self.num_cells
        n_cells = max(1, n // 4) if n_cells is None else _check_int(fn, "n_cells", n_cells, 1)
        with tf.device("/CPU:0"):
            step_t = self.step.read_value() if step is None else tf.cast(step, tf.int64)
            if seed is None:
                base = self._rng.make_seeds(1)[:, 0]
            else:
                base = tf.stack([tf.cast(seed, tf.int64), step_t])
            keys = tf.random.experimental.stateless_split(base, num=4)
            warm = step_t < self._warmup_steps

            def all_cells():
                return tf.range(n, dtype=tf.int32)

            def some_cells():
                uniform = tf.random.stateless_uniform([n_cells], keys[0], minval=0, maxval=n, dtype=tf.int32)
                occ = tf.cast(tf.where(self.occupied())[:, 0], tf.int32)
                count = tf.size(occ)
                pick = tf.random.stateless_uniform([n_cells], keys[1], minval=0, maxval=tf.maximum(count, 1),
                                                   dtype=tf.int32)
                spare = tf.random.stateless_uniform([n_cells], keys[2], minval=0, maxval=n, dtype=tf.int32)
                from_occ = tf.where(count > 0, tf.gather(occ, tf.minimum(pick, tf.maximum(count - 1, 0))), spare)
                return tf.concat([uniform, from_occ], axis=0)

            idx = tf.cond(warm, all_cells, some_cells)
            u = tf.random.stateless_uniform([tf.size(idx), 3], keys[3], dtype=tf.float32)
            points = self._cell_points(idx, u)
        sampled = tf.reshape(tf.cast(density_fn(points), tf.float32), [-1])
        with tf.device("/CPU:0"):
            tf.debugging.assert_equal(tf.size(sampled), tf.size(idx),
                                      message=f"{fn}: density_fn must return one value per point")
            # per cell the largest sample (>= 0); cells without one get 0 (the segment max of nothing is -FLT_MAX)
            fresh = tf.maximum(tf.math.unsorted_segment_max(tf.maximum(sampled, 0.0), idx, n), 0.0)
            density = tf.maximum(self.density * self._decay, fresh)
            self.density.assign(density)
            thr = tf.minimum(tf.reduce_mean(density), self._threshold)
            occupied = tf.logical_or(warm, density > thr)
            self.bits.assign(pack_bits(occupied))
            self.step.assign(step_t + 1)
            return tf.reduce_mean(tf.cast(occupied, tf.float32))


def _grid_parts(fn, grid):
    for attr in ("bits", "aabb", "resolution"):
        if not hasattr(grid, attr):
            raise ValueError(f"{fn}: grid must be an OccupancyGrid (or have .bits, .aabb, .resolution); no .{attr}")
    g = _check_int(fn, "grid.resolution", int(grid.resolution), 1, MAX_RESOLUTION)
    bits = tf.convert_to_tensor(grid.bits)
    if bits.dtype != tf.uint8:
        raise ValueError(f"{fn}: grid.bits must be uint8, got {bits.dtype.name}")
    aabb = tf.convert_to_tensor(grid.aabb, dtype_hint=tf.float32)
    if aabb.dtype != tf.float32:
        aabb = tf.cast(aabb, tf.float32)
    return bits, aabb, g


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
      grid: an ``OccupancyGrid`` (or anything with ``.bits`` uint8, ``.aabb`` [2, 3], ``.resolution``).
      near, far: None (0 and +inf), scalars, or [R]. The march covers [max(near, t_enter), min(far, t_exit)].
      step_size: > 0; cone_angle >= 0 (dt = clamp(t * cone_angle, step_size, max_step)).
      max_samples: per-ray cap (>= 1). jitter: offset the first sample by u * dt, u from hash(seed, ray).
      seed: int or int tensor (a tensor input of the op: changing it does not retrace a tf.function).

    Returns ``RayMarchResult(t_starts [N], t_ends [N], row_splits [R+1] int32, ray_indices [N] int32,
    positions [N, 3])``: ``positions`` are the samples' midpoints ``o + d (t_start + t_end) / 2`` in the grid box's
    unit coordinates ``(x - lo) / (hi - lo)``, clamped to [0, 1] (what an encoding over the box, e.g. the hash grid,
    takes; world coordinates are ``lo + positions * (hi - lo)``). No gradient (the outputs are sample positions).
    """
    fn = "ray_march"
    step_size, cone_angle, max_samples, jitter = _check_march_args(fn, step_size, cone_angle, max_samples, jitter)
    bits, aabb, g = _grid_parts(fn, grid)
    rays_o, rays_d, near, far = _rays_and_range(fn, rays_o, rays_d, near, far)
    out = ops().ray_march(rays_o, rays_d, near, far, bits, aabb, _seed_tensor(seed), resolution=g,
                          step_size=step_size, cone_angle=cone_angle, max_samples=max_samples, jitter=jitter,
                          name=name)
    return RayMarchResult(*out)


tf.no_gradient("RayMarch")


# ------------------------------------------------------------------------------------------------------------
# Plain TensorFlow: the oracle and the speed baseline.


def _hash_u32(x):
    """lowbias32 on int64 tensors holding uint32 values (ray_march_math.h rm_hash)."""
    m = tf.constant(0xFFFFFFFF, tf.int64)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16))
    x = tf.bitwise.bitwise_and(x * 0x7FEB352D, m)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 15))
    x = tf.bitwise.bitwise_and(x * 0x846CA68B, m)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16))


def ray_jitter_tf(seed, num_rays):
    """The jitter u in [0, 1) of rays 0..num_rays-1 for ``seed`` (float32 [num_rays]), as the op computes it."""
    m = tf.constant(0xFFFFFFFF, tf.int64)
    seed = tf.cast(seed, tf.int64)
    lo = tf.bitwise.bitwise_and(seed, m)
    hi = tf.bitwise.bitwise_and(tf.bitwise.right_shift(seed, 32), m)
    k = _hash_u32(tf.bitwise.bitwise_xor(lo, _hash_u32(tf.bitwise.bitwise_and(hi + 0x9E3779B9, m))))
    h = _hash_u32(tf.bitwise.bitwise_xor(tf.range(tf.cast(num_rays, tf.int64), dtype=tf.int64), k))
    return tf.cast(tf.bitwise.right_shift(h, 8), tf.float32) * (1.0 / 16777216.0)


def occupancy_mip_tf(bits, resolution):
    """Levels 1 .. L of the occupancy mip of a packed bitfield (the kernels' convention, ray_march_math.h): a list
    of bool tensors, level m flat [G_m^3] (index X + G_m*(Y + G_m*Z)), G_m = ceil(G / 2^m), L the largest m with
    2^m < G; each level the OR of the 2x2x2 blocks of the one below."""
    g = int(resolution)
    b = tf.cast(tf.convert_to_tensor(bits), tf.int32)
    occ = tf.bitwise.bitwise_and(tf.bitwise.right_shift(b[:, None], tf.range(8)), 1) > 0
    level = tf.reshape(tf.reshape(occ, [-1])[:g**3], [g, g, g])  # [z, y, x]
    levels, n, m = [], g, 1
    while 2**m < g:
        half = -(-n // 2)
        pad = 2 * half - n
        level = tf.pad(level, [[0, pad]] * 3)
        level = tf.reduce_any(tf.reshape(level, [half, 2, half, 2, half, 2]), axis=[1, 3, 5])
        levels.append(tf.reshape(level, [-1]))
        n, m = half, m + 1
    return levels


def ray_march_dense_tf(rays_o, rays_d, near, far, bits, aabb, resolution, *, step_size, cone_angle=0.0,
                       max_samples=1024, jitter=True, seed=0):
    """The march in plain TF with static shapes (XLA-compilable): (counts [R] int32, t_starts [R, max_samples],
    t_ends [R, max_samples]); slots at and after counts[r] are unspecified. near/far are [R] float32."""
    g = int(resolution)
    o = tf.convert_to_tensor(rays_o, tf.float32)
    d = tf.convert_to_tensor(rays_d, tf.float32)
    aabb = tf.convert_to_tensor(aabb, tf.float32)
    lo, hi = aabb[0], aabb[1]
    size = hi - lo
    cs = size / float(g)
    inv_cs = float(g) / size
    step = tf.constant(step_size, tf.float32)
    cone = tf.constant(cone_angle, tf.float32)
    max_step = tf.maximum(step, tf.constant(1.7320508, tf.float32) * tf.reduce_max(cs))
    max_skips = _MAX_SKIPS_PER_CELL * g + _MAX_SKIPS_EXTRA
    bytes_ = tf.cast(tf.convert_to_tensor(bits), tf.int32)
    mip = occupancy_mip_tf(bits, g)
    r = tf.shape(o)[0]

    def dt_of(t):
        return tf.minimum(tf.maximum(t * cone, step), max_step)

    nonzero = tf.not_equal(d, 0.0)
    inv_d = tf.where(nonzero, 1.0 / tf.where(nonzero, d, 1.0), 0.0)
    ta, tb = (lo - o) * inv_d, (hi - o) * inv_d
    t_lo = tf.convert_to_tensor(near, tf.float32)
    t_hi = tf.convert_to_tensor(far, tf.float32)
    inside = tf.ones([r], tf.bool)
    for i in range(3):  # axis by axis, as the kernels (max/min of non-NaN values are exact and order-free anyway)
        t_lo = tf.where(nonzero[:, i], tf.maximum(t_lo, tf.minimum(ta[:, i], tb[:, i])), t_lo)
        t_hi = tf.where(nonzero[:, i], tf.minimum(t_hi, tf.maximum(ta[:, i], tb[:, i])), t_hi)
        inside &= nonzero[:, i] | ((o[:, i] >= lo[i]) & (o[:, i] <= hi[i]))
    finite = tf.reduce_all(tf.math.is_finite(o) & tf.math.is_finite(d), axis=1)
    valid = inside & finite & ~tf.math.is_nan(t_lo) & ~tf.math.is_nan(t_hi) & (t_lo < t_hi)
    u = ray_jitter_tf(seed, r) if jitter else tf.zeros([r], tf.float32)
    t = t_lo + u * dt_of(t_lo)
    o_safe = tf.where(valid[:, None], o, 0.0)
    d_safe = tf.where(valid[:, None], d, 0.0)
    face_step = tf.cast(d > 0.0, tf.int32)

    n = tf.zeros([r], tf.int32)
    skips = tf.zeros([r], tf.int32)
    buf0 = tf.zeros([r, max_samples + 1], tf.float32)  # column max_samples: the sink of non-emitting rays
    buf1 = tf.zeros([r, max_samples + 1], tf.float32)
    rows = tf.range(r)

    def active_of(t, n, skips):
        return valid & (t < t_hi) & (skips < max_skips) & (n < max_samples)

    def cond(t, n, skips, buf0, buf1):
        return tf.reduce_any(active_of(t, n, skips))

    def body(t, n, skips, buf0, buf1):
        active = active_of(t, n, skips)
        t1 = tf.minimum(t + dt_of(t), t_hi)
        active &= t1 > t
        tm = 0.5 * (t + t1)
        p = o_safe + tm[:, None] * d_safe
        c = tf.clip_by_value(tf.floor((p - lo) * inv_cs), 0.0, float(g - 1))
        ci = tf.cast(c, tf.int32)
        cell = ci[:, 0] + g * (ci[:, 1] + g * ci[:, 2])
        byte = tf.gather(bytes_, tf.where(active, cell // 8, 0))
        occ = tf.bitwise.bitwise_and(tf.bitwise.right_shift(byte, cell % 8), 1) > 0
        emit = active & occ
        skip = active & ~occ
        slot = tf.where(emit, n, max_samples)
        idx = tf.stack([rows, slot], axis=1)
        buf0 = tf.tensor_scatter_nd_update(buf0, idx, t)
        buf1 = tf.tensor_scatter_nd_update(buf1, idx, t1)
        level = tf.zeros([r], tf.int32)  # the largest level whose block around the cell is empty
        empty = ~occ
        for m, occ_m in enumerate(mip, start=1):
            gm = -(-g // 2**m)
            cm = tf.bitwise.right_shift(ci, m)
            empty &= ~tf.gather(occ_m, tf.where(skip, cm[:, 0] + gm * (cm[:, 1] + gm * cm[:, 2]), 0))
            level += tf.cast(empty, tf.int32)
        lv = level[:, None]
        k = tf.minimum(tf.bitwise.left_shift(tf.bitwise.right_shift(ci, lv) + face_step, lv), g)
        face = lo + tf.cast(k, tf.float32) * cs
        t_face = tf.where(nonzero, (face - o_safe) * inv_d, t_hi[:, None])
        t_next = tf.minimum(t_hi, tf.reduce_min(t_face, axis=1))
        t_skip = tf.where(t_next > t, t_next, t1)
        # Rays that stop (inactive) keep their state; a ray whose t1 <= t is made inactive by pushing t to t_hi.
        stuck = active_of(t, n, skips) & ~(t1 > t)
        t = tf.where(emit, t1, tf.where(skip, t_skip, tf.where(stuck, t_hi, t)))
        n += tf.cast(emit, tf.int32)
        skips += tf.cast(skip, tf.int32)
        return t, n, skips, buf0, buf1

    _, n, _, buf0, buf1 = tf.while_loop(cond, body, (t, n, skips, buf0, buf1),
                                        maximum_iterations=max_samples + max_skips)
    return n, buf0[:, :max_samples], buf1[:, :max_samples]


def sample_positions_tf(rays_o, rays_d, aabb, t_starts, t_ends, ray_indices):
    """The ``positions`` of packed samples, as the kernels compute them (ray_march_math.h rm_unit_coord)."""
    aabb = tf.convert_to_tensor(aabb, tf.float32)
    lo, inv_ext = aabb[0], 1.0 / (aabb[1] - aabb[0])
    tm = 0.5 * (t_starts + t_ends)
    x = tf.gather(rays_o, ray_indices) + tm[:, None] * tf.gather(rays_d, ray_indices)
    return tf.clip_by_value((x - lo) * inv_ext, 0.0, 1.0)


def pack_dense_samples(counts, t_starts, t_ends, rays_o, rays_d, aabb):
    """[R] counts and [R, S] slot arrays of rays ``rays_o``, ``rays_d`` in box ``aabb`` -> RayMarchResult (packed in
    ray order)."""
    counts = tf.convert_to_tensor(counts, tf.int32)
    mask = tf.range(tf.shape(t_starts)[1])[None, :] < counts[:, None]
    row_splits = tf.concat([tf.zeros([1], tf.int32), tf.cumsum(counts)], axis=0)
    ray_indices = tf.repeat(tf.range(tf.size(counts), dtype=tf.int32), counts)
    t0, t1 = tf.boolean_mask(t_starts, mask), tf.boolean_mask(t_ends, mask)
    return RayMarchResult(t0, t1, row_splits, ray_indices,
                          sample_positions_tf(rays_o, rays_d, aabb, t0, t1, ray_indices))


def ray_march_tf(rays_o, rays_d, grid, *, near=None, far=None, step_size, cone_angle=0.0, max_samples=1024,
                 jitter=True, seed=0):
    """``ray_march`` in plain TF (a tf.while_loop over all rays at once; memory R * max_samples). Same float32
    arithmetic as the kernels, so it normally gives the same samples; invalid rays get no samples (no error)."""
    fn = "ray_march_tf"
    step_size, cone_angle, max_samples, jitter = _check_march_args(fn, step_size, cone_angle, max_samples, jitter)
    bits, aabb, g = _grid_parts(fn, grid)
    rays_o, rays_d, near, far = _rays_and_range(fn, rays_o, rays_d, near, far)
    counts, t0, t1 = ray_march_dense_tf(rays_o, rays_d, near, far, bits, aabb, g, step_size=step_size,
                                        cone_angle=cone_angle, max_samples=max_samples, jitter=jitter,
                                        seed=_seed_tensor(seed))
    return pack_dense_samples(counts, t0, t1, rays_o, rays_d, aabb)
