"""``ray_march`` in plain TensorFlow: the oracle and the speed baseline (the same float32 arithmetic as the
kernels)."""

from __future__ import annotations

import tensorflow as tf

from tf_metal_ops.ray_march.ops import (
    _check_march_args,
    _grid_parts,
    _MAX_SKIPS_EXTRA,
    _MAX_SKIPS_PER_CELL,
    RayMarchResult,
    _rays_and_range,
    _seed_tensor,
)


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


def cascade_boxes_tf(aabb, resolution, cascades, step_size):
    """The host's per-cascade float32 values (ray_march_math.h, cascades): (lo [K, 3], hi [K, 3], cs [K, 3],
    inv_cs [K, 3], max_step [K]); cascade c is the box scaled by 2^c about its centre."""
    aabb = tf.convert_to_tensor(aabb, tf.float32)
    lo, hi = aabb[0], aabb[1]
    size = hi - lo
    g = float(resolution)
    out = [], [], [], [], []
    for c in range(int(cascades)):
        scale = float(2**c)
        size_c = size * scale
        cs = size_c / g
        for lst, v in zip(out, (lo - size * ((scale - 1.0) * 0.5), hi + size * ((scale - 1.0) * 0.5), cs,
                                g / size_c,
                                tf.maximum(tf.constant(step_size, tf.float32),
                                           tf.constant(1.7320508, tf.float32) * tf.reduce_max(cs)))):
            lst.append(v)
    return tuple(tf.stack(v) for v in out)


def cascade_of_tf(points, c_lo, c_hi):
    """The cascade of each point [N, 3] (ray_march_math.h rm_cascade): the finest box containing it, else the
    outermost."""
    k_count = int(c_lo.shape[0])
    k = tf.fill(tf.shape(points)[:1], k_count - 1)
    for c in reversed(range(k_count - 1)):
        inside = tf.reduce_all((points >= c_lo[c]) & (points <= c_hi[c]), axis=1)
        k = tf.where(inside, c, k)
    return k


def ray_march_dense_tf(rays_o, rays_d, near, far, bits, aabb, resolution, *, step_size, cone_angle=0.0,
                       max_samples=1024, jitter=True, seed=0, cascades=1):
    """The march in plain TF with static shapes (XLA-compilable): (counts [R] int32, t_starts [R, max_samples],
    t_ends [R, max_samples]); slots at and after counts[r] are unspecified. near/far are [R] float32; bits holds
    the ``cascades`` bitfields one after the other ([K, ceil(G^3 / 8)] or flat)."""
    g = int(resolution)
    n_casc = int(cascades)
    o = tf.convert_to_tensor(rays_o, tf.float32)
    d = tf.convert_to_tensor(rays_d, tf.float32)
    c_lo, c_hi, c_cs, c_inv_cs, c_max_step = cascade_boxes_tf(aabb, g, n_casc, step_size)
    lo, hi = c_lo[n_casc - 1], c_hi[n_casc - 1]  # the march's range: the outermost box
    step = tf.constant(step_size, tf.float32)
    cone = tf.constant(cone_angle, tf.float32)
    max_skips = n_casc * (_MAX_SKIPS_PER_CELL * g) + _MAX_SKIPS_EXTRA
    cascade_bytes = (g**3 + 7) // 8
    flat_bits = tf.reshape(tf.convert_to_tensor(bits), [-1])
    bytes_ = tf.cast(flat_bits, tf.int32)
    # mip level m of all cascades: bool [K * G_m^3], cascade c's cells from c * G_m^3
    mips = [occupancy_mip_tf(flat_bits[c * cascade_bytes:(c + 1) * cascade_bytes], g) for c in range(n_casc)]
    mip = [tf.concat([m[level] for m in mips], axis=0) for level in range(len(mips[0]))]
    r = tf.shape(o)[0]

    def cascade_at(points):
        return cascade_of_tf(points, c_lo, c_hi) if n_casc > 1 else tf.zeros(tf.shape(points)[:1], tf.int32)

    def dt_of(t, k):
        return tf.minimum(tf.maximum(t * cone, step), tf.gather(c_max_step, k))

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
    o_safe = tf.where(valid[:, None], o, 0.0)
    d_safe = tf.where(valid[:, None], d, 0.0)
    def step_cascade(t):  # rm_step_cascade: the cascade of o + (t + step_size / 2) d
        th = tf.where(valid, t, 0.0) + 0.5 * step
        return cascade_at(o_safe + th[:, None] * d_safe)

    t = t_lo + u * dt_of(t_lo, step_cascade(t_lo))
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

    def enter_ahead(t, box):
        """rm_enter_ahead: where each ray enters cascade box `box` [R] after t (no later than t_hi), else t_hi."""
        b_lo, b_hi = tf.gather(c_lo, box), tf.gather(c_hi, box)
        t_in, t_out, ok = t, t_hi, tf.ones([r], tf.bool)
        for i in range(3):
            a_, b_ = (b_lo[:, i] - o_safe[:, i]) * inv_d[:, i], (b_hi[:, i] - o_safe[:, i]) * inv_d[:, i]
            t_in = tf.where(nonzero[:, i], tf.maximum(tf.minimum(a_, b_), t_in), t_in)
            t_out = tf.where(nonzero[:, i], tf.minimum(tf.maximum(a_, b_), t_out), t_out)
            ok &= nonzero[:, i] | ((o_safe[:, i] >= b_lo[:, i]) & (o_safe[:, i] <= b_hi[:, i]))
        return tf.where(ok & (t_in <= t_out) & (t_in > t), t_in, t_hi)

    def body(t, n, skips, buf0, buf1):
        active = active_of(t, n, skips)
        t1 = tf.minimum(t + dt_of(t, step_cascade(tf.where(active, t, 0.0))), t_hi)
        active &= t1 > t
        tm = 0.5 * (t + t1)
        p = o_safe + tm[:, None] * d_safe
        k = cascade_at(p)
        c = tf.clip_by_value(tf.floor((p - tf.gather(c_lo, k)) * tf.gather(c_inv_cs, k)), 0.0, float(g - 1))
        ci = tf.cast(c, tf.int32)
        cell = ci[:, 0] + g * (ci[:, 1] + g * ci[:, 2])
        byte = tf.gather(bytes_, tf.where(active, k * cascade_bytes + cell // 8, 0))
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
            at = k * gm**3 + cm[:, 0] + gm * (cm[:, 1] + gm * cm[:, 2])
            empty &= ~tf.gather(occ_m, tf.where(skip, at, 0))
            level += tf.cast(empty, tf.int32)
        lv = level[:, None]
        kf = tf.minimum(tf.bitwise.left_shift(tf.bitwise.right_shift(ci, lv) + face_step, lv), g)
        face = tf.gather(c_lo, k) + tf.cast(kf, tf.float32) * tf.gather(c_cs, k)
        t_face = tf.where(nonzero, (face - o_safe) * inv_d, t_hi[:, None])
        t_next = tf.minimum(t_hi, tf.reduce_min(t_face, axis=1))
        if n_casc > 1:  # not past the entry into the next finer cascade's box
            t_next = tf.where(k > 0, tf.minimum(enter_ahead(t, tf.maximum(k - 1, 0)), t_next), t_next)
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


def sample_positions_tf(rays_o, rays_d, aabb, t_starts, t_ends, ray_indices, cascades=1):
    """The ``positions`` of packed samples, as the kernels compute them (ray_march_math.h rm_unit_coord): unit
    coordinates of the outermost cascade's box."""
    aabb = tf.convert_to_tensor(aabb, tf.float32)
    size = aabb[1] - aabb[0]
    scale = float(2 ** (int(cascades) - 1))
    lo, inv_ext = aabb[0] - size * ((scale - 1.0) * 0.5), 1.0 / (size * scale)
    tm = 0.5 * (t_starts + t_ends)
    x = tf.gather(rays_o, ray_indices) + tm[:, None] * tf.gather(rays_d, ray_indices)
    return tf.clip_by_value((x - lo) * inv_ext, 0.0, 1.0)


def pack_dense_samples(counts, t_starts, t_ends, rays_o, rays_d, aabb, cascades=1):
    """[R] counts and [R, S] slot arrays of rays ``rays_o``, ``rays_d`` in box ``aabb`` (with ``cascades``) ->
    RayMarchResult (packed in ray order)."""
    counts = tf.convert_to_tensor(counts, tf.int32)
    mask = tf.range(tf.shape(t_starts)[1])[None, :] < counts[:, None]
    row_splits = tf.concat([tf.zeros([1], tf.int32), tf.cumsum(counts)], axis=0)
    ray_indices = tf.repeat(tf.range(tf.size(counts), dtype=tf.int32), counts)
    t0, t1 = tf.boolean_mask(t_starts, mask), tf.boolean_mask(t_ends, mask)
    return RayMarchResult(t0, t1, row_splits, ray_indices,
                          sample_positions_tf(rays_o, rays_d, aabb, t0, t1, ray_indices, cascades))


def ray_march_tf(rays_o, rays_d, grid, *, near=None, far=None, step_size, cone_angle=0.0, max_samples=1024,
                 jitter=True, seed=0):
    """``ray_march`` in plain TF (a tf.while_loop over all rays at once; memory R * max_samples). Same float32
    arithmetic as the kernels, so it normally gives the same samples; invalid rays get no samples (no error).

    Example:
      >>> import tf_metal_ops
      >>> grid = tf_metal_ops.OccupancyGrid(resolution=8)  # box [-1, 1]^3, every cell occupied until updated
      >>> res = tf_metal_ops.ray_march_tf([[-2.0, 0.1, 0.2]], [[1.0, 0.0, 0.0]], grid, step_size=0.5, jitter=False)
      >>> res.t_starts.numpy(), res.t_ends.numpy()  # four steps across the box, from t = 1 to t = 3
      (array([1. , 1.5, 2. , 2.5], dtype=float32), array([1.5, 2. , 2.5, 3. ], dtype=float32))
    """
    fn = "ray_march_tf"
    step_size, cone_angle, max_samples, jitter = _check_march_args(fn, step_size, cone_angle, max_samples, jitter)
    bits, aabb, g, k = _grid_parts(fn, grid)
    rays_o, rays_d, near, far = _rays_and_range(fn, rays_o, rays_d, near, far)
    counts, t0, t1 = ray_march_dense_tf(rays_o, rays_d, near, far, bits, aabb, g, step_size=step_size,
                                        cone_angle=cone_angle, max_samples=max_samples, jitter=jitter,
                                        seed=_seed_tensor(seed), cascades=k)
    return pack_dense_samples(counts, t0, t1, rays_o, rays_d, aabb, k)
