"""Exactly today's tiny-cuda-nn: its current ``grid_index`` (MAX_BASE table, the full row-major
index over all D dims, index 0 beyond MAX_BASE) and ``pos = fmaf(scale, x, 0.5f)`` (one rounding), on the CPU op,
the NumPy reference and pure TF (eager and XLA).

The cases are constructed so that the old rules give different numbers: a tiled level whose ``resolution^D``
exceeds the level size (the old loop summed only the leading dims whose stride fit in the level), a tiled level
whose resolution exceeds MAX_BASE[D] (tcnn: every corner reads row 0), and positions where ``x*scale`` rounded and
then ``+ 0.5`` rounded lands on the next cell while the fused result does not.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_metal_ops
from tf_metal_ops.hash_grid import HashGridConfig, pure_tf, reference
from tf_metal_ops.hash_grid.config import MAX_BASE

from support.hash_grid_cases import INTERPOLATIONS, seeded


def op_encode(x, p, cfg):
    return tf_metal_ops.hash_grid_encode(x, p, **cfg.op_kwargs()).numpy()


def pure_tf_encode(x, p, cfg, jit=False):
    f = tf.function(lambda a, b: pure_tf.encode(a, b, cfg), jit_compile=True) if jit else (
        lambda a, b: pure_tf.encode(a, b, cfg))
    return f(tf.constant(x), tf.constant(p)).numpy()


def old_loop_index(corner, cfg, level):
    """The package's previous (older tcnn) non-hashed index: sum over the leading dims while stride <= size."""
    size, res = cfg.params_in_level(level), cfg.resolution(level)
    idx, stride = np.zeros(len(corner), np.int64), 1
    for i in range(cfg.n_input_dims):
        if stride > size:
            break
        idx += corner[:, i] * stride
        stride *= res
    return idx % size


def new_rule_index(corner, cfg, level):
    """tcnn's current grid_index for a non-hashed level, written out independently of reference.py."""
    d, size, res = cfg.n_input_dims, cfg.params_in_level(level), cfg.resolution(level)
    if res > MAX_BASE[d]:
        return np.zeros(len(corner), np.int64)
    idx = np.zeros(len(corner), np.int64)
    for i in range(d):
        idx = (idx + corner[:, i] * res**i) & 0xFFFFFFFF
    return idx % size


def test_max_base_table():
    """MAX_BASE[D] is the largest base whose D-th power fits in uint32 (tcnn's MAX_BASES)."""
    for d in range(1, len(MAX_BASE)):
        assert MAX_BASE[d] ** d <= 0xFFFFFFFF < (MAX_BASE[d] + 1) ** d
    # and the row-major sum cannot wrap in uint32 even with corner coordinates equal to the resolution
    for d in range(1, 5):
        r = MAX_BASE[d] if d > 1 else 2**24 + 1
        assert sum(r * r**i for i in range(d)) < 2**32


# ---- tiled levels finer than the tile: old loop vs tcnn's current rule ----------------------------------------
TILED_2D = dict(n_levels=3, n_features_per_level=1, base_resolution=3, per_level_scale=2.0, grid_type="tiled")


def test_tiled_layout_and_strides():
    cfg = HashGridConfig(2, **TILED_2D)
    assert cfg.resolutions == (3, 6, 12) and cfg.level_sizes == (9, 9, 9)
    assert cfg.hashed_levels == (False, False, False)
    # level 2: 12^2 = 144 > 9 rows, and the old loop stopped after dim 0 (stride 12 > 9); tcnn uses both dims
    assert [cfg.dense_strides(l) for l in range(3)] == [(1, 3), (1, 6), (1, 12)]
    assert cfg.index_stride(2) == 144
    g = np.array([(i, j) for i in range(13) for j in range(13)], np.int64)
    old, new = old_loop_index(g, cfg, 2), new_rule_index(g, cfg, 2)
    assert np.array_equal(new, (g[:, 0] + 12 * g[:, 1]) % 9) and np.array_equal(old, g[:, 0] % 9)
    assert np.mean(old != new) > 0.5
    # the reference implements the new rule
    np.testing.assert_array_equal(reference._index(cfg, 2, g), new)


def _cell_points(cfg, level, cells):
    """Points in the middle of the given cells (grid coordinates) of a level: x = cell / scale, pos = cell + 0.5."""
    return (np.asarray(cells, np.float64) / cfg.scale(level)).astype(np.float32)


@pytest.mark.parametrize("implementation", ["op", "reference", "pure_tf", "pure_tf_xla"])
def test_tiled_index_differs_from_old_loop(implementation):
    """Nearest interpolation on a table whose rows hold distinct values: each backend returns the row of tcnn's
    current rule, which is not the old loop's row for these cells."""
    cfg = HashGridConfig(2, **dict(TILED_2D, interpolation="nearest"))
    level = 2
    cells = np.array([(i, j) for i in range(12) for j in range(12)], np.int64)
    old, new = old_loop_index(cells, cfg, level), new_rule_index(cells, cfg, level)
    cells = cells[old != new]
    assert len(cells) > 50
    x = _cell_points(cfg, level, cells)
    grid = np.floor(x.astype(np.float64) * cfg.scale(level) + 0.5).astype(np.int64)
    np.testing.assert_array_equal(grid, cells)  # the points sit in those cells
    p = (np.arange(cfg.total_entries, dtype=np.float32) + 100.0)[:, None]
    run = {"op": op_encode, "reference": lambda a, b, c: reference.encode(a, b, c),
           "pure_tf": pure_tf_encode, "pure_tf_xla": lambda a, b, c: pure_tf_encode(a, b, c, jit=True)}
    y = run[implementation](x, p, cfg)[:, level]
    base = cfg.offsets[level]
    np.testing.assert_array_equal(y, p[base + new_rule_index(cells, cfg, level), 0])
    assert np.all(y != p[base + old_loop_index(cells, cfg, level), 0])


@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_tiled_3d_4d_random_tables_match_reference_not_old_loop(interpolation, dtype):
    """Random tables and points on tiled 3-D and 4-D configs with levels finer than the tile: op, reference and
    pure TF agree, and the old loop's result differs visibly."""
    for d, nmin in ((3, 4), (4, 3)):
        cfg = HashGridConfig(d, n_levels=4, n_features_per_level=2, base_resolution=nmin, per_level_scale=2.5,
                             grid_type="tiled", interpolation=interpolation)
        changed = [l for l in range(cfg.n_levels)
                   if cfg.resolution(l) ** (d - 1) > cfg.params_in_level(l)]  # old loop dropped a dim
        assert changed
        rng = seeded("tiled-rand", d, interpolation, dtype)
        x = rng.uniform(0, 1, (400, d)).astype(np.float32)
        p = rng.uniform(-1, 1, cfg.params_shape).astype(dtype)
        ref = reference.encode(x, p, cfg)
        tol = dict(rtol=0, atol=2e-6) if dtype == "float32" else dict(rtol=2**-10, atol=1e-6)
        np.testing.assert_allclose(op_encode(x, p, cfg).astype(np.float64), ref, **tol)
        np.testing.assert_allclose(pure_tf_encode(x, p, cfg).astype(np.float64), ref, **tol)
        # the old loop's value of one changed level (nearest: the corner 'grid'; else the full interpolation)
        level = changed[-1]
        old = _old_level_output(x, p.astype(np.float64), cfg, level)
        f = cfg.n_features_per_level
        assert np.abs(old - ref[:, level * f:(level + 1) * f]).max() > 0.1


def _old_level_output(x, table, cfg, level):
    """One level's output with the old loop's index (and the same fma position)."""
    saved = reference._index
    try:
        reference._index = lambda c, lv, corner: old_loop_index(corner, c, lv)
        f = cfg.n_features_per_level
        out = np.zeros((len(x), f))
        for rows, weight, _ in reference.level_corners(x, cfg, level):
            out += weight[:, None] * table[rows]
        return out
    finally:
        reference._index = saved


# ---- resolution > MAX_BASE[D] on tiled levels: tcnn reads row 0 for every corner -----------------------------
@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
def test_tiled_level_beyond_max_base_reads_row_zero(interpolation):
    cfg = HashGridConfig(3, n_levels=11, n_features_per_level=2, base_resolution=2, per_level_scale=2.0,
                         grid_type="tiled", interpolation=interpolation)
    assert cfg.resolution(10) == 2048 > MAX_BASE[3] >= cfg.resolution(9)
    assert cfg.dense_strides(10) == (0, 0, 0) and cfg.index_stride(10) == 0xFFFFFFFF
    assert cfg.level_sizes[10] == 8 and not any(cfg.hashed_levels)
    rng = seeded("maxbase", interpolation)
    x = rng.uniform(0, 1, (300, 3)).astype(np.float32)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    row0 = p[cfg.offsets[10]]
    ref = reference.encode(x, p, cfg)
    np.testing.assert_allclose(ref[:, 20:22], np.broadcast_to(row0, (300, 2)), rtol=0, atol=1e-12)
    for y in (op_encode(x, p, cfg), pure_tf_encode(x, p, cfg)):
        np.testing.assert_allclose(y, ref, rtol=0, atol=2e-6)
        np.testing.assert_allclose(y[:, 20:22], np.broadcast_to(row0, (300, 2)), rtol=0, atol=1e-6)
    # the gradient w.r.t. params of that level lands on row 0 only (weights sum to 1 per point)
    dy = np.zeros((300, cfg.n_output_dims), np.float32)
    dy[:, 20:22] = 1.0
    xt, pt = tf.constant(x), tf.constant(p)
    with tf.GradientTape() as tape:
        tape.watch(pt)
        y = tf_metal_ops.hash_grid_encode(xt, pt, **cfg.op_kwargs())
    gp = tape.gradient(y, pt, output_gradients=tf.constant(dy)).numpy()
    lvl = gp[cfg.offsets[10]:cfg.offsets[11]]
    np.testing.assert_allclose(lvl[0], [300.0, 300.0], rtol=1e-5)
    assert not np.any(lvl[1:])


def test_hash_levels_unchanged_by_the_rule():
    """For grid type hash the decision size < stride equals resolution^D > size (the hashed flags and indices of
    hash grids are what they were), including resolutions beyond MAX_BASE (always hashed)."""
    for d in range(1, 5):
        cfg = HashGridConfig(d, n_levels=12, base_resolution=4, per_level_scale=2.0, log2_hashmap_size=12)
        for l in range(cfg.n_levels):
            res, size = cfg.resolution(l), cfg.params_in_level(l)
            assert cfg.is_hashed(l) == (res**d > size)
        assert cfg.hashed_levels[-1]
    cfg = HashGridConfig(4, n_levels=8, base_resolution=4, per_level_scale=2.0, log2_hashmap_size=12)
    assert cfg.resolution(7) > MAX_BASE[4] and cfg.index_stride(7) == 0xFFFFFFFF and cfg.is_hashed(7)


# ---- pos = fmaf(scale, x, 0.5): one rounding --------------------------------------------------------------------
def _fma_boundary_points():
    """(config, level, x) where fma(scale, x, 0.5) < 1 <= round(round(x*scale) + 0.5): the separately rounded
    position lands in the next cell. Found by walking float32 x around (k - 0.5)/scale."""
    cfg = HashGridConfig(1, n_levels=16, n_features_per_level=1, base_resolution=16, per_level_scale=1.5,
                         log2_hashmap_size=19, grid_type="dense", interpolation="nearest")
    found = []
    for level in range(cfg.n_levels):
        s = np.float32(cfg.scale(level))
        for k in range(1, 64):
            x0 = np.float32((k - 0.5) / float(s))
            xs = [x0]
            a = b = x0
            for _ in range(64):
                a, b = np.nextafter(a, np.float32(0)), np.nextafter(b, np.float32(1))
                xs += [a, b]
            xs = np.array(xs, np.float32)
            fused = reference.fma32(s, xs, np.float32(0.5))
            separate = (xs * s).astype(np.float32) + np.float32(0.5)
            for xv in xs[np.floor(fused) != np.floor(separate)]:
                found.append((level, xv))
    return cfg, found


def test_fma32_is_one_rounding():
    """reference.fma32 against exact rational arithmetic, including near-tie cases."""
    from fractions import Fraction

    rng = seeded("fma32")
    a = np.concatenate([rng.uniform(0, 2**24, 3000), 2.0 ** rng.integers(0, 24, 1000) - 1]).astype(np.float32)
    b = np.concatenate([rng.uniform(0, 1, 2000), 2.0 ** -rng.uniform(5, 40, 2000)]).astype(np.float32)
    k = rng.integers(0, 2**18, 1000)
    b[:1000] = ((k + 0.5) * 2.0**-24 / np.maximum(a[:1000], 1)).astype(np.float32)  # near float32 midpoints
    got = reference.fma32(a, b, np.float32(0.5))
    for ai, bi, gi in zip(a, b, got):
        exact = Fraction(float(ai)) * Fraction(float(bi)) + Fraction(1, 2)
        cands = [np.nextafter(gi, np.float32(-1)), gi, np.nextafter(gi, np.float32(2))]
        best = min(cands, key=lambda c: (abs(Fraction(float(c)) - exact), int(np.float32(c).view(np.uint32)) & 1))
        assert gi == best, (ai, bi)


@pytest.mark.parametrize("implementation", ["op", "reference", "pure_tf", "pure_tf_xla"])
def test_position_uses_one_rounding(implementation):
    """Nearest interpolation at positions where one rounding and two roundings pick different cells: every
    backend picks the fma's cell (cell 0, value 100 + row) while the separately rounded position is in cell 1."""
    cfg, found = _fma_boundary_points()
    assert len(found) >= 3, found
    x = np.zeros((len(found), 1), np.float32)
    levels = [lv for lv, _ in found]
    for i, (_, xv) in enumerate(found):
        x[i, 0] = xv
    p = (np.arange(cfg.total_entries, dtype=np.float32) + 100.0)[:, None]
    run = {"op": op_encode, "reference": lambda a, b, c: reference.encode(a, b, c),
           "pure_tf": pure_tf_encode, "pure_tf_xla": lambda a, b, c: pure_tf_encode(a, b, c, jit=True)}
    y = run[implementation](x, p, cfg)
    for i, lv in enumerate(levels):
        s = np.float32(cfg.scale(lv))
        fused = int(np.floor(reference.fma32(s, x[i, 0], np.float32(0.5))))
        separate = int(np.floor(np.float32(x[i, 0] * s) + np.float32(0.5)))
        assert separate == fused + 1
        assert y[i, lv] == p[cfg.offsets[lv] + fused, 0], (i, lv, y[i, lv])
    # and the separately rounded reference would disagree on each of them
    y_sep = reference.encode(x, p, cfg, pos_rounding="separate")
    assert all(y_sep[i, lv] != y[i, lv] for i, lv in enumerate(levels))


def test_linear_weights_use_one_rounding():
    """Linear interpolation on a fine level: the op equals the fma reference to float32 accuracy; the
    separately rounded reference differs by more (an ulp of pos at scale ~7000 moves a weight by ~5e-4)."""
    cfg = HashGridConfig(3, n_levels=16, n_features_per_level=2, base_resolution=16, per_level_scale=1.5,
                         log2_hashmap_size=19)
    rng = seeded("fma-linear")
    x = rng.uniform(0, 1, (20000, 3)).astype(np.float32)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    y = op_encode(x, p, cfg)
    fused, separate = reference.encode(x, p, cfg), reference.encode(x, p, cfg, pos_rounding="separate")
    assert np.abs(y - fused).max() <= 2e-6
    assert np.abs(separate - fused).max() > 1e-5
    np.testing.assert_allclose(pure_tf_encode(x, p, cfg), fused, rtol=0, atol=2e-6)


# ---- the level scale: tcnn's float32 steps, not a double evaluation rounded once -------------------------------
def _double_scale(cfg, level):
    """The package's previous level scale: 2^(l * log2 b) * N_min - 1 in double, rounded once to float32."""
    b = float(np.float32(cfg.per_level_scale))
    return np.float32(2.0 ** (level * np.log2(b)) * cfg.base_resolution - 1.0)


def _scale_boundary_points():
    """(config, level, x, cell of tcnn's scale, cell of the double scale) where the two scales put x in different
    cells: float32 x walked around (k - 0.5) / scale for the cells near the top of each level."""
    cfg = HashGridConfig(1, n_levels=16, n_features_per_level=1, base_resolution=16, per_level_scale=1.5,
                         log2_hashmap_size=19, grid_type="dense", interpolation="nearest")
    found = []
    for level in range(cfg.n_levels):
        s_new, s_old = np.float32(cfg.scale(level)), _double_scale(cfg, level)
        if s_new == s_old:
            continue
        for k in range(max(1, cfg.resolution(level) - 8), cfg.resolution(level)):
            x0 = np.float32((k - 0.5) / float(s_new))
            xs, a, b = [x0], x0, x0
            for _ in range(32):
                a, b = np.nextafter(a, np.float32(0)), np.nextafter(b, np.float32(1))
                xs += [a, b]
            xs = np.array(xs, np.float32)
            new = np.floor(reference.fma32(s_new, xs, np.float32(0.5))).astype(np.int64)
            old = np.floor(reference.fma32(s_old, xs, np.float32(0.5))).astype(np.int64)
            found += [(level, xv, n, o) for xv, n, o in zip(xs, new, old) if n != o]
    return cfg, found


@pytest.mark.parametrize("implementation", ["op", "reference", "pure_tf", "pure_tf_xla"])
def test_level_scale_picks_tcnn_cells(implementation):
    """Nearest interpolation at positions where tcnn's float32 scale and the double-precision scale (up to 6 ulps
    apart at b = 1.5) pick different cells: every backend returns the row of tcnn's cell."""
    cfg, found = _scale_boundary_points()
    levels = {lv for lv, _, _, _ in found}
    assert len(found) >= 20 and len(levels) >= 3, found
    x = np.array([[xv] for _, xv, _, _ in found], np.float32)
    p = (np.arange(cfg.total_entries, dtype=np.float32) + 100.0)[:, None]
    run = {"op": op_encode, "reference": lambda a, b, c: reference.encode(a, b, c),
           "pure_tf": pure_tf_encode, "pure_tf_xla": lambda a, b, c: pure_tf_encode(a, b, c, jit=True)}
    y = run[implementation](x, p, cfg)
    for i, (lv, _, new, old) in enumerate(found):
        assert y[i, lv] == p[cfg.offsets[lv] + new, 0], (i, lv, y[i, lv], new, old)
        assert y[i, lv] != p[cfg.offsets[lv] + old, 0]
