"""The hash-grid encoding in plain TensorFlow ops (tf.gather + arithmetic; gradients by autodiff).

What a user without custom ops would write, vectorised over points, levels and corners: the fallback when the op
library cannot load, a test oracle beside ``reference`` and the speed baseline of the benchmark. Works eagerly, in
``tf.function`` and with ``jit_compile=True``. Conventions: ``tf_metal_ops.hash_grid.config`` module docstring.

The position ``pos = fma(scale, x, 0.5)`` is rounded once, as the op and tcnn do (TF has no fused multiply-add op):
computed exactly in float64 (the product of two float32 is exact), the sum rounded to odd and then to float32,
which is the correctly rounded fma (``_fma_pos``; the same construction as ``reference.fma32``). So the pure-TF path
picks the same cells and the same ``frac`` as the op, bit for bit, eagerly and under XLA; what differs is only
the float32 summation order of the interpolation (tests: 2e-6 absolute on outputs of a +-1 table).

Levels are processed in two groups, each one batched computation: the non-hashed (coarse) levels and the hashed
levels. Resolutions grow with the level (per_level_scale >= 1), so the hashed levels are the trailing ones.
Hashing is done in uint32 (TF's uint32 multiply wraps mod 2^32 on CPU and in XLA); a hashed level's size is
2^log2_hashmap_size, so ``mod size`` is a mask.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_metal_ops.hash_grid._args import call_config, check_flag
from tf_metal_ops.hash_grid.config import HASH_PRIMES, HashGridConfig
from tf_metal_ops.hash_grid.reference import n_active_levels

__all__ = ["encode", "hash_grid_encode"]


def _fma_pos(x, scales):
    """``fma(scale, x, 0.5)`` in float32 with one rounding: x [N, D] float32 in [0, 1], scales [m] float32 ->
    [N, m, D] float32. Gradient: d pos / d x = scale."""
    xs = x[:, None, :] * scales[:, None]  # [N, m, D] float32: only for the gradient (its value cancels)
    p = tf.cast(tf.stop_gradient(x), tf.float64)[:, None, :] * tf.cast(scales, tf.float64)[:, None]  # exact
    s = p + 0.5
    bb = s - p
    err = (p - (s - bb)) + (0.5 - bb)  # TwoSum: p + 0.5 = s + err exactly
    bits = tf.bitcast(s, tf.int64)
    fix = tf.logical_and(tf.not_equal(err, 0.0), tf.equal(tf.bitwise.bitwise_and(bits, 1), 0))
    # round to odd: an inexact even s moves one ulp towards the exact value (s > 0: +-1 on the bits)
    bits = tf.where(fix, bits + tf.where(err > 0.0, tf.constant(1, tf.int64), tf.constant(-1, tf.int64)), bits)
    pos = tf.cast(tf.bitcast(bits, tf.float64), tf.float32)  # round-to-odd then to nearest: the correct fma
    return pos + (xs - tf.stop_gradient(xs))  # value: pos + 0 (exact); gradient: scale


def _group(x, params, cfg: HashGridConfig, levels, hashed, compute_dtype):
    """Encodes the levels ``levels`` (all hashed or all not): ``[N, len(levels), F]`` in compute_dtype.

    Work is on [N, m] tensors per dimension: each dim contributes a "lower" and an "upper" index term (hash:
    g*pi and (g+1)*pi = g*pi + pi mod 2^32; strided: g*stride and g*stride + stride) and weight factor
    (1-w, w); a corner's index combines one term per dim (XOR / sum) and its weight is the product.
    """
    d = cfg.n_input_dims
    scales = tf.constant([cfg.scale(l) for l in levels], tf.float32)
    pos = _fma_pos(x, scales)  # [N, m, D] float32: fma(scale, x, 0.5), one rounding (the convention)
    grid_f = tf.floor(pos)
    frac = tf.cast(pos - grid_f, compute_dtype)  # exact; d(frac)/d(pos) = 1 (floor has no gradient)
    grid = tf.cast(grid_f, tf.int32)  # 0 <= grid <= resolution <= 2^24 + 1
    nearest = cfg.interpolation == "nearest"

    terms = []  # per dim: (lower term, upper term), [N, m] each
    if hashed:
        size = 1 << cfg.log2_hashmap_size
        assert all(cfg.params_in_level(l) == size for l in levels)  # hashed levels have the full size 2^k
        for i in range(d):
            g = tf.cast(grid[:, :, i], tf.uint32)
            lo = g if i == 0 else g * tf.constant(HASH_PRIMES[i], tf.uint32)  # uint32 multiply wraps mod 2^32
            terms.append((lo, None if nearest else lo + tf.constant(HASH_PRIMES[i], tf.uint32)))
        combine = tf.bitwise.bitwise_xor
    else:
        # tcnn's row-major index over all D dims (all strides 0 when resolution > MAX_BASE[D]: row 0). The exact
        # sum is < 2^32 (config docstring), so it equals tcnn's uint32 sum; floormod then wraps it into the level.
        strides = np.array([cfg.dense_strides(l) for l in levels], dtype=np.int64)  # [m, D]
        sizes = np.array([cfg.params_in_level(l) for l in levels], dtype=np.int64)  # [m]
        bound = int(((np.array([cfg.resolution(l) for l in levels]) + 1)[:, None] * strides).sum(axis=1).max())
        itype = tf.int32 if bound < 2**31 else tf.int64  # the exact strided sum fits itype
        g_all = tf.cast(grid, itype)
        for i in range(d):
            stride = tf.constant(strides[:, i], itype)  # [m]
            lo = g_all[:, :, i] * stride
            terms.append((lo, None if nearest else lo + stride))
        combine = tf.add

    # Corners: index = combine of one term per dim, weight = product of one factor per dim.
    idx = [terms[0][0]] if nearest else list(terms[0])
    for lo, hi in terms[1:]:
        idx = [combine(a, lo) for a in idx] + ([] if nearest else [combine(a, hi) for a in idx])
    rows = tf.stack(idx, axis=-1)  # [N, m, C]
    if hashed:
        rows = tf.cast(tf.bitwise.bitwise_and(rows, tf.constant(size - 1, tf.uint32)), tf.int32)
    else:
        rows = tf.cast(tf.math.floormod(rows, tf.constant(sizes[:, None], itype)), tf.int32)
    rows = rows + tf.constant([[cfg.offsets[l]] for l in levels], tf.int32)
    vals = tf.gather(params, rows)  # [N, m, C, F] (float16 params arrive here already cast, see encode)
    if nearest:
        return vals[:, :, 0, :]

    w = frac * frac * (3.0 - 2.0 * frac) if cfg.interpolation == "smoothstep" else frac
    weights = None
    for i in range(d):  # same corner order as idx: dim i's bit doubles the list
        wi = w[:, :, i]
        factors = (1.0 - wi, wi)
        if weights is None:
            weights = list(factors)
        else:
            weights = [a * factors[0] for a in weights] + [a * factors[1] for a in weights]
    weights = tf.stack(weights, axis=-1)  # [N, m, C]
    return tf.reduce_sum(weights[..., None] * vals, axis=2)


@tf.custom_gradient
def _to_float32_dense_grad(params):
    """float16 table -> float32, with the gradient summed densely in float32 and rounded to float16 once
    (TF's own gather gradient would accumulate the scattered terms in float16)."""

    def grad(dy):
        return tf.cast(tf.convert_to_tensor(dy), params.dtype)

    return tf.cast(params, tf.float32), grad


def encode(positions, params, config: HashGridConfig, max_level=None):
    """Encodes ``positions [N, D]`` with table ``params [total_entries, F]`` → ``[N, L*F]`` in params' dtype.

    ``max_level`` (as the op): None = all levels; an int k = the first k levels; a float m = levels l < m*L + 1e-3
    (tcnn's fraction). Inactive levels output 0 and get no gradient. A Python number skips the inactive levels'
    work; a scalar tensor (int32 or float) computes all levels and masks them.
    float16 params: computed and accumulated in float32 (forward and gradient), output and gradient rounded to
    float16 once; float64 params compute in float64.
    """
    cfg = config
    x = tf.convert_to_tensor(positions)
    if x.dtype != tf.float32:
        raise TypeError(f"hash_grid_encode: positions must be float32, got {x.dtype.name}")
    params = tf.convert_to_tensor(params)
    if params.dtype not in (tf.float16, tf.float32, tf.float64):
        raise TypeError(f"hash_grid_encode: params must be float16/float32/float64, got {params.dtype.name}")
    if x.shape.rank is not None and (x.shape.rank != 2 or x.shape[-1] not in (None, cfg.n_input_dims)):
        raise ValueError(f"hash_grid_encode: positions must be [N, {cfg.n_input_dims}], got shape {x.shape}")
    if params.shape.rank is not None and not params.shape.is_compatible_with(cfg.params_shape):
        raise ValueError(
            f"hash_grid_encode: params must be {list(cfg.params_shape)} for this config, got shape {params.shape}"
        )
    compute_dtype = tf.float64 if params.dtype == tf.float64 else tf.float32
    n_levels, f = cfg.n_levels, cfg.n_features_per_level

    # Out-of-range policy: NaN -> 0, clamp to [0, 1] (its gradient is zero outside [0, 1]).
    x = tf.clip_by_value(tf.where(tf.math.is_nan(x), tf.zeros_like(x), x), 0.0, 1.0)

    mask = None
    if max_level is None or isinstance(max_level, (int, float, np.integer, np.floating)):
        n_active = n_active_levels(n_levels, max_level)
    else:
        n_active = n_levels
        max_level = tf.convert_to_tensor(max_level)
        if max_level.shape.rank not in (None, 0):
            raise ValueError(f"hash_grid_encode: max_level must be a scalar, got shape {max_level.shape}")
        if max_level.dtype.is_integer:
            mask = tf.range(n_levels) < tf.cast(max_level, tf.int32)  # [L]
        else:
            limit = tf.cast(max_level, tf.float32) * float(n_levels) + 1e-3
            mask = tf.range(n_levels, dtype=tf.float32) < limit

    table = _to_float32_dense_grad(params) if params.dtype == tf.float16 else params
    hashed = cfg.hashed_levels
    groups = [[l for l in range(n_active) if not hashed[l]], [l for l in range(n_active) if hashed[l]]]
    parts = [_group(x, table, cfg, g, h, compute_dtype) for g, h in zip(groups, (False, True)) if g]
    n = tf.shape(x)[0]
    if n_active < n_levels:
        parts.append(tf.zeros(tf.stack([n, n_levels - n_active, f]), compute_dtype))
    out = parts[0] if len(parts) == 1 else tf.concat(parts, axis=1)  # [N, L, F]; non-hashed levels come first
    if mask is not None:
        out = tf.where(mask[None, :, None], out, tf.zeros_like(out))
    out = tf.reshape(out, tf.stack([n, n_levels * f]))
    return tf.cast(out, params.dtype) if out.dtype != params.dtype else out


def hash_grid_encode(positions, params, *, config=None, max_level=None, deterministic=None, feature_major=False,
                     name=None, **options):
    """Pure-TF drop-in for ``tf_metal_ops.hash_grid_encode`` (same arguments and semantics: ``config`` or the
    options as keywords). ``deterministic`` is checked as there; the table gradient is TensorFlow's own scatter,
    whose determinism TF's op-determinism setting governs. ``feature_major``: the output transposed,
    ``[n_levels * F, N]``.

    Example:
      >>> import tensorflow as tf
      >>> from tf_metal_ops.hash_grid import HashGridConfig, pure_tf
      >>> cfg = HashGridConfig(2, n_levels=2, n_features_per_level=2, log2_hashmap_size=6)
      >>> pure_tf.hash_grid_encode([[0.25, 0.5]], tf.ones(cfg.params_shape), config=cfg, feature_major=True).shape
      TensorShape([4, 1])
    """
    check_flag("hash_grid_encode", "deterministic", deterministic, allow_none=True)
    check_flag("hash_grid_encode", "feature_major", feature_major)
    x = tf.convert_to_tensor(positions)
    if x.shape.rank != 2 or x.shape[-1] is None:
        raise ValueError(f"hash_grid_encode: positions must be [N, D] with a static D, got shape {x.shape}")
    cfg = call_config("hash_grid_encode", x.shape[-1], config, options)
    with tf.name_scope(name or "hash_grid_encode_pure_tf"):
        out = encode(x, params, cfg, max_level=max_level)
        return tf.transpose(out) if feature_major else out
