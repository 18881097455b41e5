"""Occupancy grid (Instant-NGP / nerfacc style): ``OccupancyGrid`` keeps a decayed-max density estimate per cell of
a G^3 grid over a box and a bitfield of the occupied cells, which ``ray_march`` (``tf_metal_ops.ray_march``: the
compiled ``RayMarch`` op, its pure-TF version and the NumPy reference) marches rays through, skipping empty space.
The march's names are importable from here too (``ray_march``, ``ray_march_tf``, ``RayMarchResult``, ...)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_metal_ops._args import _check_int, _check_real
# The march (tf_metal_ops.ray_march), also importable from here.
from tf_metal_ops.ray_march.ops import (  # noqa: F401
    MAX_RESOLUTION,
    RayMarchResult,
    pack_bits,
    ray_march,
    unpack_bits,
)
from tf_metal_ops.ray_march.pure_tf import (  # noqa: F401
    occupancy_mip_tf,
    pack_dense_samples,
    ray_jitter_tf,
    ray_march_dense_tf,
    ray_march_tf,
    sample_positions_tf,
)


def _check_aabb(fn, aabb):
    box = np.asarray(aabb, dtype=np.float64)
    if box.shape != (2, 3) or not np.all(np.isfinite(box)) or not np.all(box[0] < box[1]):
        raise ValueError(f"{fn}: aabb must be ((xmin, ymin, zmin), (xmax, ymax, zmax)), finite, min < max; got {aabb!r}")
    return box.astype(np.float32)


class OccupancyGrid(tf.Module):
    """A G^3 occupancy grid over an axis-aligned box: density estimate per cell plus a bitfield of occupied cells.

    Cells are indexed x + G*(y + G*z) (x fastest); cell (i, j, k) covers aabb_min + [i, i+1] * size / G per axis.
    Variables (on the CPU): ``density`` float32 [G^3] (decayed max of sampled densities, Instant-NGP style:
    new = max(old * decay, sampled), unsampled cells just decay), ``bits`` uint8 [ceil(G^3/8)] (bit (idx & 7) of
    byte idx >> 3), ``step`` int64 (number of updates so far, unless ``update(step=...)`` sets it).

    Example:
      >>> import tensorflow as tf, tf_metal_ops
      >>> grid = tf_metal_ops.OccupancyGrid(resolution=8, warmup_steps=0)
      >>> grid.num_cells, float(grid.occupied_fraction())
      (512, 1.0)
      >>> _ = grid.update(lambda x: 100.0 * tf.cast(tf.norm(x, axis=-1) < 0.5, tf.float32))  # a ball of radius 0.5
      >>> round(float(grid.occupied_fraction()), 4)
      0.0332
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
