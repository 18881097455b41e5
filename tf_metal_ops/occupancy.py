"""Occupancy grid (Instant-NGP / nerfacc style): ``OccupancyGrid`` keeps a decayed-max density estimate per cell of
a G^3 grid over a box and a bitfield of the occupied cells, which ``ray_march`` (``tf_metal_ops.ray_march``: the
compiled ``RayMarch`` op, its pure-TF version and the NumPy reference) marches rays through, skipping empty space.
The march's names are importable from here too (``ray_march``, ``ray_march_tf``, ``RayMarchResult``, ...)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_metal_ops._args import _check_int, _check_real
# The march (tf_metal_ops.ray_march), also importable from here.
from tf_metal_ops.ray_march.ops import MAX_CASCADES, MAX_RESOLUTION, RayMarchResult  # noqa: F401
from tf_metal_ops.ray_march.ops import pack_bits, ray_march, unpack_bits  # noqa: F401
from tf_metal_ops.ray_march.pure_tf import (  # noqa: F401
    cascade_boxes_tf,
    cascade_of_tf,
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
    """A G^3 occupancy grid over an axis-aligned box: density estimate per cell plus a bitfield of occupied cells;
    with ``cascades=K`` > 1, K such grids, cascade c over the box scaled by 2^c about its centre (Instant-NGP's
    ``aabb_scale`` = 2^(K-1), nerfacc's ``OccGridEstimator(levels=K)``), for unbounded scenes.

    Cells are indexed x + G*(y + G*z) (x fastest); cell (i, j, k) of cascade c covers lo_c + [i, i+1] * size_c / G
    per axis, lo_c = aabb_min - size (2^c - 1) / 2, size_c = size 2^c. Variables (on the CPU): ``density`` float32
    [G^3] ([K, G^3] with cascades) (decayed max of sampled densities, Instant-NGP style: new = max(old * decay,
    sampled), unsampled cells just decay), ``bits`` uint8 [ceil(G^3/8)] ([K, ceil(G^3/8)]) (bit (idx & 7) of byte
    idx >> 3), ``step`` int64 (number of updates so far, unless ``update(step=...)`` sets it). A point belongs to the
    finest cascade containing it; ``ray_march`` marches through the cascades (``tf_metal_ops.ray_march``).

    Example:
      >>> import tensorflow as tf, tf_metal_ops
      >>> grid = tf_metal_ops.OccupancyGrid(resolution=8, warmup_steps=0)
      >>> grid.num_cells, float(grid.occupied_fraction())
      (512, 1.0)
      >>> _ = grid.update(lambda x: 100.0 * tf.cast(tf.norm(x, axis=-1) < 0.5, tf.float32))  # a ball of radius 0.5
      >>> round(float(grid.occupied_fraction()), 4)
      0.0332
      >>> wide = tf_metal_ops.OccupancyGrid(resolution=8, cascades=3, warmup_steps=0)  # boxes of size 2, 4, 8
      >>> _ = wide.update(lambda x: 100.0 * tf.cast(tf.norm(x, axis=-1) > 3.0, tf.float32))  # far surroundings
      >>> wide.bits.shape, wide.occupied_fraction(per_cascade=True).numpy().round(3)  # mostly the outer cascade
      (TensorShape([3, 64]), array([0.   , 0.006, 0.322], dtype=float32))
    """

    def __init__(self, aabb=((-1.0, -1.0, -1.0), (1.0, 1.0, 1.0)), resolution=128, decay=0.95, threshold=0.01,
                 warmup_steps=256, cascades=1, name=None):
        super().__init__(name=name)
        fn = "OccupancyGrid"
        self._aabb = _check_aabb(fn, aabb)
        self._resolution = _check_int(fn, "resolution", resolution, 1, MAX_RESOLUTION)
        self._cascades = _check_int(fn, "cascades", cascades, 1, MAX_CASCADES)
        with np.errstate(over="ignore"):  # float32, as the kernels compute the cascade boxes
            outer = self.cascade_aabb(self._cascades - 1)
            size = (self._aabb[1] - self._aabb[0]) * np.float32(2 ** (self._cascades - 1))
        if not (np.all(np.isfinite(outer)) and np.all(np.isfinite(size))):
            raise ValueError(f"{fn}: the outermost cascade's box (aabb scaled by 2^{self._cascades - 1}) is not "
                             f"finite in float32")
        self._decay = _check_real(fn, "decay", decay, 0.0, strict=False)
        if self._decay > 1.0:
            raise ValueError(f"{fn}: decay must be in [0, 1], got {decay!r}")
        self._threshold = _check_real(fn, "threshold", threshold, 0.0, strict=False)
        self._warmup_steps = _check_int(fn, "warmup_steps", warmup_steps, 0)
        n = self.num_cells
        with tf.device("/CPU:0"):
            self.density = tf.Variable(tf.zeros(self._shape(), tf.float32), trainable=False, name="density")
            self.bits = tf.Variable(self._pack(tf.ones([n], tf.bool)), trainable=False, name="bits")
            self.step = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="step")
            # cells some camera sees (mark_unseen); the others never count as occupied
            self.visible = tf.Variable(tf.ones(self._shape(), tf.bool), trainable=False, name="visible")
            self._rng = tf.random.Generator.from_seed(0x0CC0)

    @property
    def aabb(self):
        """float32 [2, 3] numpy array: (min, max) corners of the box."""
        return self._aabb.copy()

    @property
    def resolution(self):
        return self._resolution

    @property
    def cascades(self):
        """K, the number of cascades (1: the box alone)."""
        return self._cascades

    @property
    def num_cells(self):
        """Cells of all cascades, K * G^3."""
        return self._cascades * self._resolution ** 3

    def cascade_aabb(self, cascade):
        """float32 [2, 3] numpy array: the box of cascade ``cascade`` (0 .. K-1), as the march computes it."""
        c = _check_int("OccupancyGrid.cascade_aabb", "cascade", cascade, 0, self._cascades - 1)
        size = self._aabb[1] - self._aabb[0]
        grow = size * np.float32((2.0**c - 1.0) * 0.5)
        return np.stack([self._aabb[0] - grow, self._aabb[1] + grow]).astype(np.float32)

    def _shape(self):
        g3 = self._resolution ** 3
        return [g3] if self._cascades == 1 else [self._cascades, g3]

    def _pack(self, occupied_flat):
        """bool [K * G^3] -> the bits variable's layout: per cascade pack_bits, [ceil(G^3/8)] or [K, ceil(G^3/8)]."""
        if self._cascades == 1:
            return pack_bits(occupied_flat)
        per = tf.reshape(occupied_flat, [self._cascades, -1])
        return tf.stack([pack_bits(per[c]) for c in range(self._cascades)])

    def mark_unseen(self, c2w, intrinsics, width, height, margin=0.0):
        """Marks the cells no camera sees as never occupied (Instant-NGP's untrained cells), from now on.

        A cell is seen when one of its corners projects into a camera's image (widened by ``margin`` times its
        size on every side) in front of the camera, or when it lies within two cell diagonals of a camera centre
        (a cell that fills the whole view). Cameras: camera-to-world ``c2w`` [N, 4, 4] (or [N, 3, 4]) looking down
        their -z axis, +y up (the NeRF / OpenGL convention), pinhole ``intrinsics`` [N, 4] (fx, fy, cx, cy) in pixels
        of a ``width`` x ``height`` image (a distorted camera: its pinhole part and a margin). Sets and returns
        ``visible`` as a NumPy bool array of the density's shape.

        Example:
          >>> import numpy as np, tf_metal_ops
          >>> grid = tf_metal_ops.OccupancyGrid(resolution=32, warmup_steps=0, cascades=2)
          >>> c2w = np.eye(4); c2w[2, 3] = 0.5  # at z = 0.5 looking down -z, a 90-degree field of view
          >>> seen = grid.mark_unseen(c2w[None], [[4.0, 4.0, 4.0, 4.0]], 8, 8)
          >>> bool(0.0 < seen.mean() < 1.0), bool(seen[0, 0]), bool(seen[1, -1])  # the far corner is behind it
          (True, True, False)
        """
        fn = "OccupancyGrid.mark_unseen"
        c2w = np.asarray(c2w, np.float64)
        K = np.asarray(intrinsics, np.float64)
        if c2w.ndim != 3 or c2w.shape[1:] not in ((4, 4), (3, 4)) or K.shape != (len(c2w), 4):
            raise ValueError(f"{fn}: c2w must be [N, 4, 4] and intrinsics [N, 4], got {list(c2w.shape)} and "
                             f"{list(K.shape)}")
        if not (np.all(np.isfinite(c2w)) and np.all(np.isfinite(K)) and np.all(K[:, :2] > 0)):
            raise ValueError(f"{fn}: cameras must be finite with positive focal lengths")
        w, h = _check_int(fn, "width", width, 1), _check_int(fn, "height", height, 1)
        m = _check_real(fn, "margin", margin, 0.0, strict=False)
        g = self._resolution
        seen = []
        reach = 4  # cells: two cell diagonals (2 sqrt(3) < 4) around a camera centre
        for c in range(self._cascades):
            lo, hi = (np.float64(v) for v in self.cascade_aabb(c))
            ax = [np.linspace(lo[i], hi[i], g + 1, dtype=np.float32) for i in range(3)]
            z, y, x = np.meshgrid(ax[2], ax[1], ax[0], indexing="ij")
            corners = np.stack([x.ravel(), y.ravel(), z.ravel()], -1)  # x fastest, as the cells
            hit = np.zeros(len(corners), bool)
            cell = (hi - lo) / g
            cells = np.zeros((g, g, g), bool)  # [z, y, x]
            for p, (fx, fy, cx, cy) in zip(c2w, K):
                R, t = p[:3, :3].astype(np.float32), p[:3, 3]
                q = (corners - t.astype(np.float32)) @ R  # camera frame: x right, y up, looking down -z
                depth = -q[:, 2]
                front = depth > 1e-6
                inv = np.float32(1.0) / np.where(front, depth, np.float32(1.0))
                u = np.float32(cx) + np.float32(fx) * q[:, 0] * inv
                v = np.float32(cy) - np.float32(fy) * q[:, 1] * inv
                hit |= front & (u >= -m * w) & (u <= w * (1 + m)) & (v >= -m * h) & (v <= h * (1 + m))
                i = np.floor((t - lo) / cell).astype(np.int64)
                a, b = np.clip(i - reach, 0, g), np.clip(i + reach + 1, 0, g)
                cells[a[2]:b[2], a[1]:b[1], a[0]:b[0]] = True
            hit = hit.reshape(g + 1, g + 1, g + 1)
            for dz in (0, 1):
                for dy in (0, 1):
                    for dx in (0, 1):
                        cells |= hit[dz:dz + g, dy:dy + g, dx:dx + g]
            seen.append(cells.ravel())
        seen = np.stack(seen) if self._cascades > 1 else seen[0]
        with tf.device("/CPU:0"):
            self.visible.assign(seen)
            occupied = tf.logical_and(tf.reshape(self.occupied(), [-1]), tf.reshape(seen, [-1]))
            self.bits.assign(self._pack(occupied))
        return seen

    def _cell_points(self, idx, u):
        """Jittered points (u in [0, 1)^3) of cells idx in [0, K * G^3) (cascade idx // G^3)."""
        g = self._resolution
        local = idx % (g**3) if self._cascades > 1 else idx
        ijk = tf.stack([local % g, (local // g) % g, local // (g * g)], axis=1)
        if self._cascades == 1:
            lo = tf.constant(self._aabb[0])
            size = tf.constant(self._aabb[1] - self._aabb[0])
            return lo + (tf.cast(ijk, tf.float32) + u) * (size / float(g))
        c_lo, _, c_cs, _, _ = cascade_boxes_tf(self._aabb, g, self._cascades, 1.0)
        c = idx // (g**3)
        return tf.gather(c_lo, c) + (tf.cast(ijk, tf.float32) + u) * tf.gather(c_cs, c)

    def occupied(self):
        """bool [G^3] ([K, G^3] with cascades): the unpacked bitfield."""
        if self._cascades == 1:
            return unpack_bits(self.bits, self._resolution ** 3)
        return tf.stack([unpack_bits(self.bits[c], self._resolution ** 3) for c in range(self._cascades)])

    def occupied_fraction(self, per_cascade=False):
        """Scalar float32: the fraction of occupied cells (of all cascades); per_cascade=True: float32 [K], each
        cascade's."""
        occ = tf.reshape(tf.cast(self.occupied(), tf.float32), [self._cascades, -1])
        return tf.reduce_mean(occ, axis=1) if per_cascade else tf.reduce_mean(occ)

    def is_occupied(self, points):
        """bool [M] for points [M, 3]: the bit of the point's cell in the finest cascade containing it (False outside
        the outermost box)."""
        points = tf.convert_to_tensor(points, dtype_hint=tf.float32)
        points = tf.cast(points, tf.float32)
        g = self._resolution
        if self._cascades == 1:
            lo, hi = tf.constant(self._aabb[0]), tf.constant(self._aabb[1])
            inside = tf.reduce_all((points >= lo) & (points <= hi), axis=-1)
            c = tf.cast(tf.floor((points - lo) * (float(g) / (hi - lo))), tf.int32)
            c = tf.clip_by_value(c, 0, g - 1)
            idx = c[:, 0] + g * (c[:, 1] + g * c[:, 2])
            byte = tf.gather(self.bits, idx // 8)
        else:
            c_lo, c_hi, _, c_inv_cs, _ = cascade_boxes_tf(self._aabb, g, self._cascades, 1.0)
            k = cascade_of_tf(points, c_lo, c_hi)
            inside = tf.reduce_all((points >= c_lo[-1]) & (points <= c_hi[-1]), axis=-1)
            c = tf.cast(tf.floor((points - tf.gather(c_lo, k)) * tf.gather(c_inv_cs, k)), tf.int32)
            c = tf.clip_by_value(c, 0, g - 1)
            idx = c[:, 0] + g * (c[:, 1] + g * c[:, 2])
            byte = tf.gather_nd(self.bits, tf.stack([k, idx // 8], axis=1))
        bit = tf.bitwise.bitwise_and(tf.bitwise.right_shift(tf.cast(byte, tf.int32), idx % 8), 1) > 0
        return inside & bit

    def update(self, density_fn, *, step=None, n_cells=None, seed=None):
        """One grid update (works eagerly and inside ``tf.function``).

        Picks cells (all of them while step < warmup_steps; afterwards ``n_cells`` uniformly random cells plus
        ``n_cells`` drawn from the currently occupied ones; default n_cells = K G^3 / 4; cells of every cascade,
        each sampled at a point of its own box), evaluates
        ``density_fn(points [M, 3] float32) -> [M] or [M, 1]`` at a uniformly jittered point of each, sets
        density = max(density * decay, sampled) (negative samples count as 0; unsampled cells only decay), then
        bits = visible and density > min(mean(density), threshold), the mean over the visible cells of the cell's own
        cascade (a distant cascade's statistics are its own), or bits = visible during warm-up (:meth:`mark_unseen`
        sets ``visible``; all cells by default).
        Sets ``step`` to step + 1.

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
                occ = tf.cast(tf.where(tf.reshape(self.occupied(), [-1]))[:, 0], tf.int32)
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
            density = tf.maximum(tf.reshape(self.density, [-1]) * self._decay, fresh)
            self.density.assign(tf.reshape(density, self._shape()))
            vis = tf.reshape(self.visible, [self._cascades, -1])
            per = tf.reshape(density, [self._cascades, -1]) * tf.cast(vis, tf.float32)
            mean = tf.reduce_sum(per, 1) / tf.maximum(tf.reduce_sum(tf.cast(vis, tf.float32), 1), 1.0)
            thr = tf.reshape(tf.minimum(mean, self._threshold)[:, None] + tf.zeros_like(per), [-1])
            occupied = tf.logical_and(tf.logical_or(warm, density > thr), tf.reshape(vis, [-1]))
            self.bits.assign(self._pack(occupied))
            self.step.assign(step_t + 1)
            return tf.reduce_mean(tf.cast(occupied, tf.float32))
