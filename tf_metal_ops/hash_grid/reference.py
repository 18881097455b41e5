"""NumPy float64 reference of the hash-grid encoding and its gradients: the test oracle.

Written for clarity: a Python loop over levels and corners, vectorised over points. Conventions are those of
``tf_metal_ops.hash_grid.config`` (module docstring). Everything is float64 except the one step the kernels do in
float32 and that decides which cell a point falls in: ``pos = fma(scale, x, 0.5)``. Its rounding is emulated
(``pos_rounding``): ``"fma"`` (default, the convention: tcnn's ``fmaf`` and every backend of this package) rounds
``x * scale + 0.5`` once to float32 (``fma32``: exact); ``"separate"`` rounds the product and the sum separately
(plain float32 code without a fused multiply-add). The two differ in
about one value of ``pos`` in 10^6 (by one ulp), which moves fine-level weights by ~1e-7 relative and only changes
a cell for ``pos`` exactly at a cell boundary.

Functions take ``(positions, params, config=None, *, max_level=None, pos_rounding=..., **options)``; ``config`` is a
``HashGridConfig`` or built from ``options`` (the ``hash_grid_encode`` keyword arguments) and the positions' last dim.
``max_level`` selects the active levels, as the op does: None = all; an int k = the first k levels (l < k, clipped
to 0..L); a float m = tcnn's fraction, levels l < m*L + 1e-3 (float32 arithmetic). Inactive levels output 0, get
no parameter gradient and add nothing to the position gradient.
"""

from __future__ import annotations

import numpy as np

from tf_metal_ops.hash_grid.config import HASH_PRIMES, HashGridConfig

__all__ = [
    "encode",
    "fma32",
    "grad_params",
    "grad_positions",
    "grad_positions_grad",
    "level_corners",
    "level_corners_second_order",
    "make_config",
    "n_active_levels",
]


def make_config(positions, config=None, **options) -> HashGridConfig:
    if config is not None:
        if options:
            raise TypeError(f"pass either config or options, not both (got {sorted(options)})")
        return config
    return HashGridConfig(int(np.shape(positions)[-1]), **options)


def _clamped(positions):
    """Out-of-range policy: NaN -> 0, then clamp to [0, 1]. Returns (x float32, in_range mask for the gradient)."""
    x = np.asarray(positions, dtype=np.float32)
    in_range = (x >= 0) & (x <= 1)  # False for NaN and +-inf
    x = np.clip(np.where(np.isnan(x), np.float32(0), x), 0, 1).astype(np.float32)
    return x, in_range


def fma32(a, b, c):
    """``fmaf(a, b, c)`` for float32 arrays: ``a * b + c`` rounded ONCE to float32 (IEEE round to nearest even).

    The product of two float32 is exact in float64; the float64 sum is rounded to odd (TwoSum gives its exact
    error; an inexact even result moves one ulp towards the exact value), and rounding a round-to-odd float64 to
    float32 is the correctly rounded result (53 >= 24 + 2 bits; Boldo & Melquiond). A plain float64 sum rounded to
    float32 would be a double rounding, wrong in rare ties.
    """
    a = np.asarray(a, np.float32).astype(np.float64)
    b = np.asarray(b, np.float32).astype(np.float64)
    c = np.asarray(c, np.float32).astype(np.float64)
    p = a * b  # exact
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + c
        bb = s - p
        err = (p - (s - bb)) + (c - bb)  # exact: p + c = s + err (finite s)
    odd = (s.view(np.int64) & 1) == 1
    fix = np.isfinite(s) & (err != 0) & ~odd
    s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def _pos(x32, scale, pos_rounding):
    s = np.float32(scale)
    if pos_rounding == "fma":  # one rounding (tcnn's fmaf)
        return fma32(s, x32, np.float32(0.5))
    if pos_rounding == "separate":
        return (x32 * s).astype(np.float32) + np.float32(0.5)
    raise ValueError(f"pos_rounding must be 'fma' or 'separate', got {pos_rounding!r}")


def _index(cfg: HashGridConfig, level: int, corner):
    """Row in the level's table (before adding offsets[level]) of integer corners [N, D] (int64): tcnn's
    ``grid_index``, uint32 arithmetic emulated with masks."""
    size = cfg.params_in_level(level)
    if cfg.is_hashed(level):
        h = np.zeros(corner.shape[0], dtype=np.int64)
        for i in range(cfg.n_input_dims):
            h ^= (corner[:, i] * HASH_PRIMES[i]) & 0xFFFFFFFF  # corner < 2^31, prime < 2^32: no int64 overflow
        return h % size
    idx = np.zeros(corner.shape[0], dtype=np.int64)
    for i, stride in enumerate(cfg.dense_strides(level)):  # row-major over all D dims (or all strides 0)
        idx = (idx + corner[:, i] * stride) & 0xFFFFFFFF  # corner <= 2^24 + 1, stride < 2^32: fits int64
    return idx % size


def level_corners(positions, cfg: HashGridConfig, level: int, pos_rounding="fma"):
    """Yields, for each interpolation corner of one level, ``(rows [N] int64 into the flat table, weight [N],
    dweight [N, D])`` where ``dweight[:, i]`` is d(weight)/d(x_i) for in-range x (float64)."""
    x, _ = _clamped(positions)
    n, d = x.shape
    scale = cfg.scale(level)
    pos = _pos(x, scale, pos_rounding)
    grid = np.floor(pos)
    frac = (pos - grid).astype(np.float64)  # exact in float32
    grid = grid.astype(np.int64)
    offset = cfg.offsets[level]
    if cfg.interpolation == "nearest":
        yield offset + _index(cfg, level, grid), np.ones(n), np.zeros((n, d))
        return
    if cfg.interpolation == "smoothstep":
        w, dw = frac * frac * (3 - 2 * frac), 6 * frac * (1 - frac)
    else:
        w, dw = frac, np.ones_like(frac)
    dw = dw * np.float64(np.float32(scale))  # d(frac)/dx = scale
    for c in range(1 << d):
        bits = np.array([(c >> i) & 1 for i in range(d)], dtype=np.int64)
        factors = np.where(bits == 1, w, 1 - w)  # [N, D]
        dfactors = np.where(bits == 1, dw, -dw)
        weight = np.prod(factors, axis=1)
        dweight = np.empty((n, d))
        for i in range(d):
            others = np.prod(np.delete(factors, i, axis=1), axis=1) if d > 1 else np.ones(n)
            dweight[:, i] = dfactors[:, i] * others
        yield offset + _index(cfg, level, grid + bits), weight, dweight


def n_active_levels(n_levels, max_level):
    """Number of active (leading) levels for a max_level of None, an int (level count) or a float (fraction)."""
    if max_level is None:
        return n_levels
    if isinstance(max_level, (bool, np.bool_)):
        raise TypeError("max_level must be an int (level count) or a float (fraction of the levels)")
    if isinstance(max_level, (int, np.integer)):
        return int(min(max(int(max_level), 0), n_levels))
    limit = np.float32(max_level) * np.float32(n_levels) + np.float32(1e-3)
    return int(sum(1 for l in range(n_levels) if np.float32(l) < limit))


def _active_levels(cfg, max_level):
    return range(n_active_levels(cfg.n_levels, max_level))


def _check(positions, params, cfg):
    positions = np.asarray(positions)
    params = np.asarray(params)
    if positions.ndim != 2 or positions.shape[1] != cfg.n_input_dims:
        raise ValueError(f"positions must be [N, {cfg.n_input_dims}], got {positions.shape}")
    if params.shape != cfg.params_shape:
        raise ValueError(f"params must be {cfg.params_shape}, got {params.shape}")
    return positions, params.astype(np.float64)


def encode(positions, params, config=None, *, max_level=None, pos_rounding="fma", **options):
    """Forward: ``[N, L*F]`` float64, level-major."""
    cfg = make_config(positions, config, **options)
    positions, table = _check(positions, params, cfg)
    f = cfg.n_features_per_level
    out = np.zeros((positions.shape[0], cfg.n_output_dims))
    for level in _active_levels(cfg, max_level):
        acc = out[:, level * f : (level + 1) * f]
        for rows, weight, _ in level_corners(positions, cfg, level, pos_rounding):
            acc += weight[:, None] * table[rows]
    return out


def grad_params(positions, params, dy, config=None, *, max_level=None, pos_rounding="fma", **options):
    """d(sum(dy * encode))/d(params): ``[total_entries, F]`` float64 (scatter-add of weight * dy)."""
    cfg = make_config(positions, config, **options)
    positions, table = _check(positions, params, cfg)
    dy = np.asarray(dy, dtype=np.float64).reshape(positions.shape[0], cfg.n_output_dims)
    f = cfg.n_features_per_level
    grad = np.zeros_like(table)
    for level in _active_levels(cfg, max_level):
        dy_l = dy[:, level * f : (level + 1) * f]
        for rows, weight, _ in level_corners(positions, cfg, level, pos_rounding):
            np.add.at(grad, rows, weight[:, None] * dy_l)
    return grad


def grad_positions(positions, params, dy, config=None, *, max_level=None, pos_rounding="fma", **options):
    """d(sum(dy * encode))/d(positions): ``[N, D]`` float64; zero for out-of-range/NaN coordinates and for
    nearest interpolation."""
    cfg = make_config(positions, config, **options)
    positions, table = _check(positions, params, cfg)
    dy = np.asarray(dy, dtype=np.float64).reshape(positions.shape[0], cfg.n_output_dims)
    f = cfg.n_features_per_level
    grad = np.zeros(positions.shape)
    for level in _active_levels(cfg, max_level):
        dy_l = dy[:, level * f : (level + 1) * f]
        for rows, _, dweight in level_corners(positions, cfg, level, pos_rounding):
            g = np.sum(table[rows] * dy_l, axis=1)  # [N]
            grad += dweight * g[:, None]
    _, in_range = _clamped(positions)
    return np.where(in_range, grad, 0.0)


def level_corners_second_order(positions, cfg: HashGridConfig, level: int, pos_rounding="fma"):
    """Like ``level_corners`` but with the derivatives of clamped coordinates already zeroed (the kernels' rule:
    ``dw = ddw = 0`` for x outside [0,1] or NaN) and second derivatives: yields ``(rows [N], weight [N],
    dweight [N, D], d2weight [N, D, D])`` with ``d2weight[:, i, j] = d^2 weight / (dx_i dx_j)`` (float64).
    Smoothstep: ``w'' = 6 - 12 frac`` (times scale^2) on the diagonal; linear: diagonal 0 (mixed partials only);
    nearest: all derivatives 0."""
    x, in_range = _clamped(positions)
    n, d = x.shape
    scale = cfg.scale(level)
    pos = _pos(x, scale, pos_rounding)
    grid = np.floor(pos)
    frac = (pos - grid).astype(np.float64)
    grid = grid.astype(np.int64)
    offset = cfg.offsets[level]
    if cfg.interpolation == "nearest":
        yield offset + _index(cfg, level, grid), np.ones(n), np.zeros((n, d)), np.zeros((n, d, d))
        return
    s = np.float64(np.float32(scale))
    if cfg.interpolation == "smoothstep":
        w, dw, ddw = frac * frac * (3 - 2 * frac), 6 * frac * (1 - frac) * s, (6 - 12 * frac) * s * s
    else:
        w, dw, ddw = frac, np.full_like(frac, s), np.zeros_like(frac)
    dw = np.where(in_range, dw, 0.0)
    ddw = np.where(in_range, ddw, 0.0)
    for c in range(1 << d):
        bits = np.array([(c >> i) & 1 for i in range(d)], dtype=np.int64)
        f = np.where(bits == 1, w, 1 - w)  # [N, D]
        df = np.where(bits == 1, dw, -dw)
        ddf = np.where(bits == 1, ddw, -ddw)
        weight = np.prod(f, axis=1)
        dweight = np.empty((n, d))
        d2weight = np.empty((n, d, d))
        for i in range(d):
            fi = f.copy()
            fi[:, i] = df[:, i]
            dweight[:, i] = np.prod(fi, axis=1)
            for j in range(d):
                fij = f.copy()
                if i == j:
                    fij[:, i] = ddf[:, i]
                else:
                    fij[:, i] = df[:, i]
                    fij[:, j] = df[:, j]
                d2weight[:, i, j] = np.prod(fij, axis=1)
        yield offset + _index(cfg, level, grid + bits), weight, dweight, d2weight


def grad_positions_grad(positions, params, dy, ddx, config=None, *, max_level=None, pos_rounding="fma", **options):
    """Second derivatives: the gradient of ``Phi = sum(ddx * grad_positions(positions, params, dy))`` w.r.t.
    ``(dy, params, positions)``, float64 ``([N, L*F], [total_entries, F], [N, D])`` (what the op
    ``HashGridEncodeGradPositionsGrad`` and tiny-cuda-nn's ``kernel_grid_backward_input_backward_*`` compute).

    With ``v_c = sum_k ddx_k dW_c/dx_k`` per corner c: d/d(dy_l) = sum_c v_c table[row_c];
    d/d(table[row_c]) += v_c dy_l; d/dx_j = sum_k ddx_k sum_c d^2W_c/(dx_k dx_j) <dy_l, table[row_c]>."""
    cfg = make_config(positions, config, **options)
    positions, table = _check(positions, params, cfg)
    n, d = positions.shape
    dy = np.asarray(dy, dtype=np.float64).reshape(n, cfg.n_output_dims)
    ddx = np.asarray(ddx, dtype=np.float64).reshape(n, d)
    f = cfg.n_features_per_level
    d_dy = np.zeros_like(dy)
    d_params = np.zeros_like(table)
    d_pos = np.zeros((n, d))
    for level in _active_levels(cfg, max_level):
        dy_l = dy[:, level * f : (level + 1) * f]
        for rows, _, dweight, d2weight in level_corners_second_order(positions, cfg, level, pos_rounding):
            v = np.sum(ddx * dweight, axis=1)  # [N]
            vals = table[rows]  # [N, F]
            d_dy[:, level * f : (level + 1) * f] += v[:, None] * vals
            np.add.at(d_params, rows, v[:, None] * dy_l)
            s = np.sum(vals * dy_l, axis=1)  # [N]
            d_pos += np.einsum("nk,nkj->nj", ddx, d2weight) * s[:, None]
    return d_dy, d_params, d_pos
