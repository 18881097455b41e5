"""The compiled HashGridEncode op (CPU kernels) against the NumPy float64 reference, plus gradients, determinism,
clamp policy, max_level, level offsets, errors and graph/SavedModel use.

Tolerances (params uniform in [-1, 1], dy standard normal; the reference emulates the kernels' float32
``pos = fma(scale, x, 0.5)`` exactly (one rounding, ``reference.fma32``), so both pick the same cells and frac):
  forward, float32 params: atol 2e-6 (float32 accumulation of <= 16 weighted corner values);
  float16 params: the same float16 table in float64, rtol 2^-10 + atol 1e-6 (one rounding of a float32 result);
  d/dparams: float32 rtol 1e-5 + atol 2e-5; float16 rtol 2^-9 + atol 1e-3 (rows accumulate many points);
  d/dpositions: rtol 1e-4 + atol 1e-5 * max|reference| (terms scale with the level scale and cancel).
"""


import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_metal_ops
from tf_metal_ops._library import ops
from tf_metal_ops.hash_grid import HashGridConfig, reference

from support.hash_grid_cases import GRID_TYPES, INTERPOLATIONS, random_config, random_positions, seeded


def raw_kwargs(cfg):
    return cfg.op_kwargs()


def encode(x, p, cfg, max_level=None):
    return tf_metal_ops.hash_grid_encode(x, p, max_level=max_level, **cfg.op_kwargs())


def grads(x, p, dy, cfg, max_level=None):
    x = tf.constant(x)
    p = tf.constant(p)
    with tf.GradientTape() as tape:
        tape.watch([x, p])
        y = encode(x, p, cfg, max_level)
    gx, gp = tape.gradient(y, [x, p], output_gradients=tf.constant(dy))
    return y.numpy(), gx.numpy(), gp.numpy()


# ---- agreement with the float64 reference -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
@pytest.mark.parametrize("grid_type", GRID_TYPES)
@pytest.mark.parametrize("d", [1, 2, 3, 4])
def test_matches_reference(d, grid_type, interpolation, dtype):
    for trial in range(3):
        rng = seeded(d, grid_type, interpolation, dtype, trial)
        cfg = random_config(rng, d, grid_type, interpolation)
        n = int(rng.integers(1, 300))
        x = random_positions(rng, n, d)
        p = rng.uniform(-1, 1, cfg.params_shape).astype(dtype)
        dy = rng.standard_normal((n, cfg.n_output_dims)).astype(dtype)
        max_level = [None, int(rng.integers(0, cfg.n_levels + 1)), float(rng.uniform(0, 1))][trial]
        y, gx, gp = grads(x, p, dy, cfg, max_level)
        assert y.dtype == np.dtype(dtype) and y.shape == (n, cfg.n_output_dims)
        assert gp.dtype == np.dtype(dtype) and gx.dtype == np.float32
        ref_y = reference.encode(x, p, cfg, max_level=max_level)
        ref_gp = reference.grad_params(x, p, dy, cfg, max_level=max_level)
        ref_gx = reference.grad_positions(x, p, dy, cfg, max_level=max_level)
        if dtype == "float32":
            np.testing.assert_allclose(y, ref_y, rtol=0, atol=2e-6)
            np.testing.assert_allclose(gp, ref_gp, rtol=1e-5, atol=2e-5)
        else:
            np.testing.assert_allclose(y.astype(np.float64), ref_y, rtol=2**-10, atol=1e-6)
            np.testing.assert_allclose(gp.astype(np.float64), ref_gp, rtol=2**-9, atol=1e-3)
        np.testing.assert_allclose(gx, ref_gx, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(ref_gx).max()))
        if interpolation == "nearest":
            assert not np.any(gx)


def test_default_config_matches_reference():
    """The default (Instant-NGP) config, where levels switch from dense to hashed."""
    cfg = HashGridConfig(3)
    rng = seeded("default")
    x = rng.uniform(0, 1, (2000, 3)).astype(np.float32)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    dy = rng.standard_normal((2000, 32)).astype(np.float32)
    assert any(cfg.hashed_levels) and not all(cfg.hashed_levels)
    y, gx, gp = grads(x, p, dy, cfg)
    np.testing.assert_allclose(y, reference.encode(x, p, cfg), atol=2e-6)
    ref_gx = reference.grad_positions(x, p, dy, cfg)
    np.testing.assert_allclose(gx, ref_gx, rtol=1e-4, atol=1e-5 * np.abs(ref_gx).max())
    # Compare the scattered gradient only where the reference is non-zero (the table is mostly untouched).
    ref_gp = reference.grad_params(x, p, dy, cfg)
    np.testing.assert_allclose(gp, ref_gp, rtol=1e-5, atol=2e-5)
    assert np.count_nonzero(gp) > 1000


# ---- level table: the kernel's offsets and sizes are config.py's ---------------------------------------------
@pytest.mark.parametrize("grid_type", GRID_TYPES)
@pytest.mark.parametrize("d", [1, 2, 3, 4])
def test_level_offsets_match_config(d, grid_type):
    """A table that is 1 on exactly level l's rows [offsets[l], offsets[l+1]) and 0 elsewhere encodes to 1 in
    level l's columns and 0 elsewhere (weights sum to 1): the kernel reads each level inside config's range."""
    rng = seeded("offsets", d, grid_type)
    cfg = random_config(rng, d, grid_type, "linear")
    x = rng.uniform(0, 1, (257, d)).astype(np.float32)
    f = cfg.n_features_per_level
    for level in range(cfg.n_levels):
        p = np.zeros(cfg.params_shape, np.float32)
        p[cfg.offsets[level] : cfg.offsets[level + 1]] = 1.0
        y = encode(x, p, cfg).numpy()
        expected = np.zeros_like(y)
        expected[:, level * f : (level + 1) * f] = 1.0
        np.testing.assert_allclose(y, expected, atol=1e-6, err_msg=f"level {level} of {cfg}")


def test_params_rows_error_states_expected_count():
    """The kernel's own row count (seen through its error message) equals config.total_entries."""
    for trial in range(12):
        rng = seeded("rows", trial)
        d = int(rng.integers(1, 5))
        cfg = random_config(rng, d, str(rng.choice(GRID_TYPES)), "linear")
        x = np.zeros((3, d), np.float32)
        p = np.zeros((cfg.total_entries + 1, cfg.n_features_per_level), np.float32)
        with pytest.raises(tf.errors.InvalidArgumentError, match=rf"params has {cfg.total_entries + 1} rows, but the config needs {cfg.total_entries}\b"):
            ops().hash_grid_encode(x, p, cfg.n_levels, **raw_kwargs(cfg))


# ---- gradients with tf.test.compute_gradient ------------------------------------------------------------------
def _interior_points(rng, cfg, n):
    """Points whose frac is >= 0.02 away from a cell boundary at every level (finite differences stay smooth)."""
    out = []
    while len(out) < n:
        x = rng.uniform(0.02, 0.98, cfg.n_input_dims).astype(np.float32)
        ok = True
        for s in cfg.scales:
            pos = x * np.float32(s) + np.float32(0.5)
            frac = pos - np.floor(pos)
            ok &= bool(np.all((frac > 0.02) & (frac < 0.98)))
        if ok:
            out.append(x)
    return np.stack(out)


@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
@pytest.mark.parametrize("grid_type", GRID_TYPES)
def test_compute_gradient(grid_type, interpolation):
    d = 2
    cfg = HashGridConfig(
        d, n_levels=3, n_features_per_level=2, log2_hashmap_size=4, base_resolution=3, per_level_scale=1.6,
        grid_type=grid_type, interpolation=interpolation,
    )
    if grid_type == "hash":
        assert any(cfg.hashed_levels)
    rng = seeded("cg", grid_type, interpolation)
    x = _interior_points(rng, cfg, 5)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)

    def f_x(xx):
        return encode(xx, p, cfg)

    def f_p(pp):
        return encode(x, pp, cfg)

    (ta,), (tn,) = tf.test.compute_gradient(f_x, [tf.constant(x)], delta=1e-3)
    np.testing.assert_allclose(ta, tn, rtol=2e-2, atol=2e-2)
    if interpolation == "nearest":
        assert not np.any(ta)
    else:
        assert np.abs(ta).max() > 0.1
    (ta,), (tn,) = tf.test.compute_gradient(f_p, [tf.constant(p)], delta=1e-2)
    np.testing.assert_allclose(ta, tn, rtol=1e-3, atol=1e-3)
    assert np.count_nonzero(ta) > 0


# ---- determinism of the CPU parameter gradient ----------------------------------------------------------------
@pytest.mark.parametrize("n_levels", [1, 8])
def test_param_grad_deterministic_across_runs_and_threads(n_levels):
    """Bitwise identical d/dparams over repeated runs and thread counts 1, 2, 3 (a tiny hash table so that many
    points collide on every row; n_levels=1 exercises the split-level path)."""
    cfg = HashGridConfig(3, n_levels=n_levels, n_features_per_level=2, log2_hashmap_size=6, base_resolution=8,
                         per_level_scale=1.5)
    rng = seeded("det", n_levels)
    n = 30000
    x = rng.uniform(0, 1, (n, 3)).astype(np.float32)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    dy = rng.standard_normal((n, cfg.n_output_dims)).astype(np.float32)
    results = []
    for threads in (1, 2, 3, 2, 1):
        with tf_metal_ops.num_threads(threads):
            results.append(ops().hash_grid_encode_grad_params(dy, x, p, n_levels, **raw_kwargs(cfg)).numpy())
    for r in results[1:]:
        np.testing.assert_array_equal(r.view(np.uint32), results[0].view(np.uint32))
    np.testing.assert_allclose(results[0], reference.grad_params(x, p, dy, cfg), rtol=1e-4, atol=1e-3)
    # Float32 sums of thousands of terms: an order-dependent implementation would differ in the last bits.
    assert np.abs(results[0]).max() > 10


def test_position_grad_and_forward_independent_of_threads():
    cfg = HashGridConfig(3, n_levels=6, log2_hashmap_size=10)
    rng = seeded("threads-fwd")
    x = rng.uniform(0, 1, (5000, 3)).astype(np.float32)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    dy = rng.standard_normal((5000, cfg.n_output_dims)).astype(np.float32)
    out = []
    for threads in (1, 2):
        with tf_metal_ops.num_threads(threads):
            out.append(grads(x, p, dy, cfg))
    for a, b in zip(*out):
        np.testing.assert_array_equal(a, b)


def _bits(a):
    a = np.asarray(a)
    return a.view(f"u{a.itemsize}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("d", [1, 2, 3, 4])
def test_all_outputs_bitwise_deterministic_across_runs_and_threads(d, dtype):
    """Forward, d/dparams and d/dpositions are bitwise identical over repeated runs and thread counts 1, 2, 3, for
    every grid type and interpolation, float32 and float16 tables, D = 1..4. Small tables so that many points
    collide on each row (order-dependent float sums would differ in the last bits); one config with a single
    level (the split-level path of the param gradient) and one with several; tiled levels finer than the tile."""
    for grid_type in GRID_TYPES:
        for interpolation in INTERPOLATIONS:
            rng = seeded("det-all", d, dtype, grid_type, interpolation)
            n_levels = 1 if interpolation == "linear" else 4
            cfg = HashGridConfig(d, n_levels=n_levels, n_features_per_level=2, log2_hashmap_size=5,
                                 base_resolution=3, per_level_scale=1.7, grid_type=grid_type,
                                 interpolation=interpolation)
            n = 3000
            x = random_positions(rng, n, d)
            p = rng.uniform(-1, 1, cfg.params_shape).astype(dtype)
            dy = rng.standard_normal((n, cfg.n_output_dims)).astype(dtype)
            runs = []
            for threads in (1, 2, 3, 2, 1):
                with tf_metal_ops.num_threads(threads):
                    runs.append(grads(x, p, dy, cfg))
            for r in runs[1:]:
                for name, a, b in zip(("y", "d/dpositions", "d/dparams"), runs[0], r):
                    assert a.dtype == b.dtype and np.array_equal(_bits(a), _bits(b)), (
                        f"{name} not bitwise reproducible: D={d} {dtype} {grid_type} {interpolation}")
            y, gx, gp = runs[0]
            np.testing.assert_allclose(y.astype(np.float64), reference.encode(x, p, cfg),
                                       rtol=0 if dtype == "float32" else 2**-10, atol=2e-6)
            # rows collect many points: the sums are large enough for the float32 order to matter
            assert np.abs(gp.astype(np.float64)).max() > 5


# ---- clamp policy ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("interpolation", ["linear", "smoothstep"])
def test_out_of_range_positions_are_clamped(interpolation):
    cfg = HashGridConfig(3, n_levels=4, log2_hashmap_size=8, base_resolution=4, interpolation=interpolation)
    rng = seeded("clamp", interpolation)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    x = np.array(
        [[-0.5, 0.3, 0.7], [1.5, 0.3, 0.7], [np.nan, 0.3, 0.7], [np.inf, 0.3, 0.7], [-np.inf, 0.3, 0.7],
         [0.0, 0.3, 0.7], [1.0, 0.3, 0.7], [-1e30, 2e30, np.nan]],
        np.float32,
    )
    clamped = np.array(
        [[0.0, 0.3, 0.7], [1.0, 0.3, 0.7], [0.0, 0.3, 0.7], [1.0, 0.3, 0.7], [0.0, 0.3, 0.7],
         [0.0, 0.3, 0.7], [1.0, 0.3, 0.7], [0.0, 1.0, 0.0]],
        np.float32,
    )
    dy = rng.standard_normal((len(x), cfg.n_output_dims)).astype(np.float32)
    y, gx, gp = grads(x, p, dy, cfg)
    y_c, gx_c, gp_c = grads(clamped, p, dy, cfg)
    np.testing.assert_array_equal(y, y_c)
    np.testing.assert_array_equal(gp, gp_c)
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(gx))
    outside = ~((x >= 0) & (x <= 1))
    assert np.all(gx[outside] == 0)
    np.testing.assert_array_equal(gx[~outside], gx_c[~outside])
    assert np.abs(gx[~outside]).max() > 0  # in-range coordinates keep their gradient


# ---- max_level --------------------------------------------------------------------------------------------------
def test_max_level_semantics():
    cfg = HashGridConfig(2, n_levels=4, n_features_per_level=2, log2_hashmap_size=8)
    rng = seeded("max_level")
    x = rng.uniform(0, 1, (50, 2)).astype(np.float32)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    dy = rng.standard_normal((50, 8)).astype(np.float32)
    full, gx_full, _ = grads(x, p, dy, cfg)
    # (max_level, active levels): int = level count (clipped), float = tcnn fraction l < m*L + 1e-3.
    cases = [(0, 0), (1, 1), (3, 3), (4, 4), (9, 4), (-2, 0), (0.0, 1), (0.25, 2), (0.5, 3), (0.74, 3),
             (1.0, 4), (2.5, 4), (tf.constant(2), 2), (tf.constant(0.5), 3)]
    for m, k in cases:
        y, gx, gp = grads(x, p, dy, cfg, m)
        np.testing.assert_array_equal(y[:, : 2 * k], full[:, : 2 * k], err_msg=str(m))
        assert not np.any(y[:, 2 * k :]), m
        assert not np.any(gp[cfg.offsets[k] :]), m  # finer levels get no gradient
        if k:
            assert np.any(gp[: cfg.offsets[k]])
        np.testing.assert_allclose(gx, reference.grad_positions(x, p, dy, cfg, max_level=k), rtol=1e-4, atol=1e-3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_level must not be NaN"):
        encode(x, p, cfg, float("nan"))


def test_max_level_tensor_in_tf_function():
    cfg = HashGridConfig(2, n_levels=4, log2_hashmap_size=8)
    rng = seeded("max_level_fn")
    x = tf.constant(rng.uniform(0, 1, (20, 2)).astype(np.float32))
    p = tf.constant(rng.uniform(-1, 1, cfg.params_shape).astype(np.float32))

    @tf.function
    def f(m):
        return encode(x, p, cfg, m)

    for k in range(5):
        y = f(tf.constant(k)).numpy()
        np.testing.assert_allclose(y, reference.encode(x.numpy(), p.numpy(), cfg, max_level=k), atol=2e-6)


# ---- graph mode, SavedModel ------------------------------------------------------------------------------------
def test_static_shape_and_graph_gradients():
    cfg = HashGridConfig(3, n_levels=5, n_features_per_level=4, log2_hashmap_size=10)
    p = tf.Variable(seeded("graph").uniform(-1, 1, cfg.params_shape).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def f(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = encode(x, p, cfg)
            loss = tf.reduce_sum(y * y)
        assert y.shape.as_list() == [None, 20]
        return y, tape.gradient(loss, [x, p])

    x = seeded("graph-x").uniform(0, 1, (40, 3)).astype(np.float32)
    y, (gx, gp) = f(x)
    dy = 2 * reference.encode(x, p.numpy(), cfg)
    np.testing.assert_allclose(y.numpy(), dy / 2, atol=2e-6)
    np.testing.assert_allclose(gp.numpy(), reference.grad_params(x, p.numpy(), dy, cfg), rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(gx.numpy(), reference.grad_positions(x, p.numpy(), dy, cfg), rtol=1e-4, atol=1e-3)


def test_raw_op_shape_inference():
    cfg = HashGridConfig(3, n_levels=5, n_features_per_level=4, log2_hashmap_size=10)

    @tf.function(input_signature=[tf.TensorSpec([7, 3], tf.float32), tf.TensorSpec([None, 4], tf.float32)])
    def f(x, p):
        y = ops().hash_grid_encode(x, p, 5, **raw_kwargs(cfg))
        # L and feature_major are attrs the C API shape function cannot read: [N, L*F] or [L*F, N]
        assert y.shape.as_list() == [None, None]
        gp = ops().hash_grid_encode_grad_params(tf.zeros([7, 20]), x, p, 5, **raw_kwargs(cfg))
        gx = ops().hash_grid_encode_grad_positions(tf.zeros([7, 20]), x, p, 5, **raw_kwargs(cfg))
        assert gp.shape.as_list() == [None, 4] and gx.shape.as_list() == [7, 3]
        return y

    f.get_concrete_function()
    with pytest.raises(ValueError, match="rank"):
        tf.function(lambda: ops().hash_grid_encode(tf.zeros([7]), tf.zeros([4, 2]), 1, **raw_kwargs(cfg)))()


def test_saved_model_gradients(tmp_path):
    cfg = HashGridConfig(3, n_levels=4, log2_hashmap_size=8)
    rng = seeded("saved")

    class M(tf.Module):
        def __init__(self):
            self.p = tf.Variable(rng.uniform(-1, 1, cfg.params_shape).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
        def __call__(self, x):
            return encode(x, self.p, cfg)

    tf.saved_model.save(M(), str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))
    x = tf.constant(rng.uniform(0, 1, (30, 3)).astype(np.float32))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = loaded(x)
        loss = tf.reduce_sum(y)
    gx, gp = tape.gradient(loss, [x, loaded.p])
    p = loaded.p.numpy()
    dy = np.ones((30, cfg.n_output_dims))
    np.testing.assert_allclose(y.numpy(), reference.encode(x.numpy(), p, cfg), atol=2e-6)
    np.testing.assert_allclose(gp.numpy(), reference.grad_params(x.numpy(), p, dy, cfg), rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(gx.numpy(), reference.grad_positions(x.numpy(), p, dy, cfg), rtol=1e-4, atol=1e-3)


def test_unneeded_gradient_is_skipped_eagerly(monkeypatch):
    """Only the gradient of a watched input is computed: the gradient ops are wrapped to record their calls (the
    positive control, both inputs watched, shows the wrapping sees both)."""
    cfg = HashGridConfig(2, n_levels=2, log2_hashmap_size=6)
    module = ops()
    calls = []
    for name in ("hash_grid_encode_grad_positions", "hash_grid_encode_grad_params"):
        real = getattr(module, name)

        def record(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, record)
    x = tf.constant([[0.2, 0.4]])
    p = tf.constant(np.ones(cfg.params_shape, np.float32))

    def run(watched):
        calls.clear()
        with tf.GradientTape() as tape:
            tape.watch(watched)
            y = encode(x, p, cfg)
        grads = tape.gradient(y, watched)
        assert all(g is not None for g in grads)
        return sorted(calls)

    assert run([p]) == ["hash_grid_encode_grad_params"]
    assert run([x]) == ["hash_grid_encode_grad_positions"]
    assert run([x, p]) == ["hash_grid_encode_grad_params", "hash_grid_encode_grad_positions"]  # positive control


# ---- empty batch and errors --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_empty_batch(dtype):
    cfg = HashGridConfig(3, n_levels=3, n_features_per_level=4, log2_hashmap_size=8)
    p = np.ones(cfg.params_shape, dtype)
    x = np.zeros((0, 3), np.float32)
    y, gx, gp = grads(x, p, np.zeros((0, 12), dtype), cfg)
    assert y.shape == (0, 12) and gx.shape == (0, 3) and gp.shape == cfg.params_shape
    assert not np.any(gp)


def _cfg_kwargs(**over):
    kw = dict(n_levels=2, n_features_per_level=2, log2_hashmap_size=6, base_resolution=4, per_level_scale=1.5,
              grid_type="hash", interpolation="linear")
    kw.update(over)
    return kw


@pytest.mark.parametrize(
    "over, message",
    [
        (dict(n_features_per_level=3), "n_features_per_level must be 1, 2, 4 or 8, got 3"),
        (dict(n_levels=0), "n_levels must be in 1..32, got 0"),
        (dict(n_levels=33), "n_levels must be in 1..32, got 33"),
        (dict(log2_hashmap_size=25), "log2_hashmap_size must be in 1..24, got 25"),
        (dict(log2_hashmap_size=0), "log2_hashmap_size must be in 1..24, got 0"),
        (dict(base_resolution=0), "base_resolution must be in 1..2\\^24, got 0"),
        (dict(per_level_scale=0.5), "per_level_scale must be a finite number >= 1"),
        (dict(n_levels=32, per_level_scale=2.0), "finest level's scale"),
        (dict(grid_type="octree"), 'grid_type must be "hash", "dense" or "tiled", got "octree"'),
        (dict(interpolation="cubic"), 'interpolation must be "linear", "smoothstep" or "nearest", got "cubic"'),
    ],
)
def test_bad_attrs(over, message):
    kw = _cfg_kwargs(**over)
    x = np.zeros((2, 2), np.float32)
    p = np.zeros((64, kw["n_features_per_level"]), np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):  # the kernel's own check
        ops().hash_grid_encode(x, p, 1, **kw)
    with pytest.raises(ValueError):  # the wrapper's check
        tf_metal_ops.hash_grid_encode(x, p, **kw)


def test_bad_inputs_kernel():
    kw = _cfg_kwargs()
    cfg = HashGridConfig(2, **kw)
    rows, f = cfg.params_shape
    good_x = np.zeros((4, 2), np.float32)
    good_p = np.zeros((rows, f), np.float32)
    cases = [
        (np.zeros((4,), np.float32), good_p, 1, r"positions must have rank 2 \[N, D\], got shape \[4\]"),
        (np.zeros((4, 5), np.float32), good_p, 1, r"positions must have 1 to 4 columns \(D\), got shape \[4, 5\]"),
        (np.zeros((4, 0), np.float32), good_p, 1, "positions must have 1 to 4 columns"),
        (good_x, np.zeros((rows, 4), np.float32), 1, r"params must have shape \[table_rows, n_features_per_level=2\]"),
        (good_x, np.zeros((rows * f,), np.float32), 1, "params must have shape"),
        (good_x, np.zeros((rows - 8, f), np.float32), 1, f"params has {rows - 8} rows, but the config needs {rows}"),
        (good_x, good_p, np.array([1, 2], np.int32), r"max_level must be a scalar, got shape \[2\]"),
    ]
    for x, p, m, message in cases:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            # Eager: no shape function runs, the kernel validates.
            ops().hash_grid_encode(x, p, m, **kw)
    dy_bad = np.zeros((4, 3), np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"grad must have shape \[4, 4\] \(\[N, L\*F\]\), got \[4, 3\]"):
        ops().hash_grid_encode_grad_params(dy_bad, good_x, good_p, 1, **kw)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"grad must have shape \[4, 4\]"):
        ops().hash_grid_encode_grad_positions(dy_bad, good_x, good_p, 1, **kw)
    with pytest.raises((TypeError, tf.errors.InvalidArgumentError)):
        ops().hash_grid_encode(tf.constant(good_x, tf.float64), good_p, 1, **kw)


def test_bad_inputs_wrapper():
    kw = _cfg_kwargs()
    cfg = HashGridConfig(2, **kw)
    x = np.zeros((4, 2), np.float32)
    p = np.zeros(cfg.params_shape, np.float32)
    with pytest.raises(ValueError, match="positions must be float32, got float64"):
        tf_metal_ops.hash_grid_encode(x.astype(np.float64), p, **kw)
    with pytest.raises(ValueError, match="params must be float32 or float16, got float64"):
        tf_metal_ops.hash_grid_encode(x, p.astype(np.float64), **kw)
    with pytest.raises(ValueError, match="positions must have rank 2"):
        tf_metal_ops.hash_grid_encode(x[0], p, **kw)
    with pytest.raises(ValueError, match="1 to 4 columns"):
        tf_metal_ops.hash_grid_encode(np.zeros((4, 5), np.float32), p, **kw)
    with pytest.raises(ValueError, match=rf"params must have shape \[{cfg.total_entries}, 2\]"):
        tf_metal_ops.hash_grid_encode(x, p[:-1], **kw)
    with pytest.raises(ValueError, match="max_level must be int32 or float32"):
        tf_metal_ops.hash_grid_encode(x, p, max_level=tf.constant(1, tf.int64), **kw)
    with pytest.raises(ValueError, match="bool"):
        tf_metal_ops.hash_grid_encode(x, p, max_level=True, **kw)


def test_table_too_large_fails_before_allocating():
    kw = _cfg_kwargs(grid_type="dense", n_levels=8, base_resolution=64, per_level_scale=2.0)
    x = np.zeros((2, 4), np.float32)
    p = np.zeros((8, 2), np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="needs more than 2\\^31-1 values"):
        ops().hash_grid_encode(x, p, 1, **kw)
    with pytest.raises(ValueError, match="parameters"):
        tf_metal_ops.hash_grid_encode(x, p, **kw)


def test_errors_in_graph_mode_come_from_the_kernel():
    """With an unknown D the wrapper cannot check params; the kernel does."""
    kw = _cfg_kwargs()

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def f(x):
        return tf_metal_ops.hash_grid_encode(x, tf.zeros([10, 2]), **kw)

    with pytest.raises(tf.errors.InvalidArgumentError, match="params has 10 rows, but the config needs"):
        f(tf.zeros([3, 2]))


def test_baseline_and_avx2_paths_agree_bitwise(tmp_path):
    """The CPU kernels have a baseline and an AVX2+FMA build of the same loops (chosen at run time); a subprocess
    with TF_METAL_OPS_NO_AVX2=1 must produce bit-identical forward and gradients. Each subprocess also reports,
    through tf_metal_ops.diagnostics.cpu_paths("hash_grid"), how many loop calls ran each build: the baseline side
    must have run only the baseline build, the other side only the AVX2 build (so the two sides cannot silently
    run the same path). Also the second-order op (HashGridEncodeGradPositionsGrad). Cases: every grid type and interpolation, both dtypes, tiled levels finer than the tile
    and beyond MAX_BASE (index 0), fine levels where the fused position matters."""
    import json
    import os
    import subprocess
    import sys

    script = r'''
import json, sys, numpy as np, tensorflow as tf
import tf_metal_ops
from tf_metal_ops._library import ops
from tf_metal_ops.diagnostics import cpu_paths
from tf_metal_ops.hash_grid import HashGridConfig
out = {}
cases = [(3, "float32", "hash", "linear", 1.7, 3), (2, "float16", "tiled", "smoothstep", 1.7, 3),
         (4, "float32", "dense", "nearest", 1.7, 3), (1, "float16", "hash", "linear", 1.7, 3),
         (3, "float16", "hash", "smoothstep", 2.0, 16), (2, "float32", "dense", "linear", 1.7, 3),
         (3, "float32", "tiled", "linear", 2.0, 2), (4, "float16", "tiled", "nearest", 2.5, 3),
         (1, "float32", "tiled", "smoothstep", 2.0, 4), (2, "float16", "hash", "nearest", 3.0, 16)]
for d, dtype, gt, interp, b, nmin in cases:
    n_levels = 11 if (gt == "tiled" and d == 3) else 5   # 3-D tiled: the finest level has resolution 2048 > MAX_BASE
    cfg = HashGridConfig(d, n_levels=n_levels, n_features_per_level=4, log2_hashmap_size=9, base_resolution=nmin,
                         per_level_scale=b, grid_type=gt, interpolation=interp)
    rng = np.random.default_rng(d)
    x = tf.constant(rng.uniform(-0.1, 1.1, (777, d)).astype(np.float32))
    p = tf.constant(rng.uniform(-1, 1, cfg.params_shape).astype(dtype))
    dy = tf.constant(rng.standard_normal((777, cfg.n_output_dims)).astype(dtype))
    with tf.GradientTape() as tape:
        tape.watch([x, p])
        y = tf_metal_ops.hash_grid_encode(x, p, **cfg.op_kwargs())
    gx, gp = tape.gradient(y, [x, p], output_gradients=dy)
    ddx = tf.constant(rng.standard_normal((777, d)).astype(np.float32))
    d2 = ops().hash_grid_encode_grad_positions_grad(ddx, dy, x, p, tf.constant(n_levels), **cfg.op_kwargs())
    for k, v in (("y", y), ("gx", gx), ("gp", gp), ("d2dy", d2[0]), ("d2p", d2[1]), ("d2x", d2[2])):
        out[f"{d}{dtype}{gt}{interp}{b}{k}"] = v.numpy()
np.savez(sys.argv[1], **out)
print(json.dumps(cpu_paths("hash_grid")))
'''
    results, paths = [], []
    for no_avx2 in (False, True):
        env = dict(os.environ)
        env.pop("TF_METAL_OPS_NO_AVX2", None)
        if no_avx2:
            env["TF_METAL_OPS_NO_AVX2"] = "1"
        path = str(tmp_path / f"out{int(no_avx2)}.npz")
        run = subprocess.run([sys.executable, "-c", script, path], env=env, cwd=str(tmp_path), capture_output=True,
                             text=True)
        assert run.returncode == 0, run.stderr[-4000:]
        results.append(np.load(path))
        paths.append(json.loads(run.stdout.strip().splitlines()[-1]))
    default, baseline = paths
    assert baseline["calls"]["default"] > 0 and baseline["calls"]["avx2"] == 0, paths
    assert baseline["selected"] == "default", paths
    if default["selected"] != "avx2":
        pytest.skip(f"the AVX2+FMA build is not available here (built: {default['built']}): only one path")
    assert default["calls"]["avx2"] > 0 and default["calls"]["default"] == 0, paths
    assert set(results[0].files) == set(results[1].files) and len(results[0].files) == 60
    for k in results[0].files:
        a, b = results[0][k], results[1][k]
        assert a.dtype == b.dtype and np.array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}")), k


def test_second_derivative_is_registered():
    """The position-gradient op has a gradient (tests/test_hash_grid_second_order.py checks its values): nested
    tapes give d/dparams of the position gradient (no LookupError)."""
    cfg = HashGridConfig(2, n_levels=2, log2_hashmap_size=6)
    x = tf.constant([[0.3, 0.4]])
    p = tf.constant(np.random.default_rng(0).uniform(-1, 1, cfg.params_shape).astype(np.float32))
    with tf.GradientTape() as outer:
        outer.watch(p)
        with tf.GradientTape() as inner:
            inner.watch(x)
            y = encode(x, p, cfg)
        g = inner.gradient(y, x)
    gp = outer.gradient(g, p)
    want = reference.grad_positions_grad(x.numpy(), p.numpy(), np.ones((1, cfg.n_output_dims)), np.ones((1, 2)),
                                         cfg)[1]
    np.testing.assert_allclose(gp.numpy(), want, rtol=1e-5, atol=1e-5)
    assert np.abs(want).max() > 0.1


# ---- the parameter gradient without the forward (data-parallel training) ------------------------------------
@pytest.mark.parametrize("grid_type", GRID_TYPES)
def test_params_grad_equals_tape_gradient(grid_type):
    """hash_grid_encode_params_grad (and HashGridEncoding.table_gradient, op and pure TF) give what the tape gives
    for the same output gradient: the op's bitwise, pure TF's within float32 summation order, and the NumPy float64
    reference's."""
    cfg = HashGridConfig(3, n_levels=4, n_features_per_level=2, log2_hashmap_size=8, base_resolution=4,
                         per_level_scale=1.7, grid_type=grid_type)
    rng = seeded("params_grad", grid_type)
    x = random_positions(rng, 300, 3)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    dy = rng.normal(size=(300, cfg.n_output_dims)).astype(np.float32)
    _, _, g_tape = grads(x, p, dy, cfg)
    g = tf_metal_ops.hash_grid.ops.hash_grid_encode_params_grad(x, p, dy, **cfg.op_kwargs()).numpy()
    np.testing.assert_array_equal(g, g_tape)
    np.testing.assert_allclose(g, reference.grad_params(x, p, dy, cfg), rtol=1e-5, atol=1e-5)
    for impl in ("op", "pure_tf"):
        layer = tf_metal_ops.HashGridEncoding(**cfg.op_kwargs(), implementation=impl)
        layer(x)
        layer.table.assign(p)
        np.testing.assert_allclose(layer.table_gradient(x, dy).numpy(), g, rtol=1e-5, atol=1e-5)


def test_params_grad_bad_input():
    cfg = HashGridConfig(3, n_levels=2, log2_hashmap_size=6)
    x = np.full((5, 3), 0.5, np.float32)
    p = np.zeros(cfg.params_shape, np.float32)
    fn = tf_metal_ops.hash_grid.ops.hash_grid_encode_params_grad
    with pytest.raises(ValueError, match=r"output_grad must have shape \[N, 4\]"):
        fn(x, p, np.zeros((4, 4), np.float32), **cfg.op_kwargs())
    with pytest.raises(ValueError, match="unknown options"):
        fn(x, p, np.zeros((5, 4), np.float32), resolution=3)
    with pytest.raises(ValueError, match="dtype"):
        fn(x, p, np.zeros((5, 4), np.float16), **cfg.op_kwargs())
    unknown = tf.function(lambda dy: fn(x, p, dy, **cfg.op_kwargs()), input_signature=[tf.TensorSpec(None)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="must have shape"):
        unknown(tf.zeros([6, 4]))  # shape unknown when traced: the kernel checks it


def _grad_op_attrs(**kwargs):
    """The `deterministic` attr of the gradient ops a traced tape builds (first and second order)."""
    cfg = HashGridConfig(3, n_levels=2, log2_hashmap_size=6)
    x = tf.constant(np.full((4, 3), 0.3, np.float32))
    p = tf.Variable(tf.zeros(cfg.params_shape))

    @tf.function
    def step():
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                inner.watch(x)
                y = tf_metal_ops.hash_grid_encode(x, p, **cfg.op_kwargs(), **kwargs)
            gx = inner.gradient(y, x)
            loss = tf.reduce_sum(y) + tf.reduce_sum(gx)
        return outer.gradient(loss, p)

    graph = step.get_concrete_function().graph
    return {op.type: op.get_attr("deterministic") for op in graph.get_operations()
            if op.type.startswith("HashGridEncodeGrad")}


def test_deterministic_attr_reaches_the_gradient_ops():
    assert _grad_op_attrs(deterministic=True) == {"HashGridEncodeGradParams": True,
                                                  "HashGridEncodeGradPositions": True,
                                                  "HashGridEncodeGradPositionsGrad": True}
    assert set(_grad_op_attrs(deterministic=False).values()) == {False}
    assert set(_grad_op_attrs().values()) == {False}  # TF's op determinism is off in this process
    with pytest.raises(ValueError, match="deterministic must be True, False or None"):
        tf_metal_ops.hash_grid_encode(np.zeros((1, 3), np.float32), np.zeros((8, 2), np.float32), deterministic="on")


def test_deterministic_default_follows_tf_op_determinism(tmp_path):
    code = ("import numpy as np, tensorflow as tf, tf_metal_ops\n"
            "tf.config.experimental.enable_op_determinism()\n"
            "cfg = tf_metal_ops.HashGridConfig(3, n_levels=2, log2_hashmap_size=6)\n"
            "g = tf.function(lambda x: tf_metal_ops.hash_grid_encode(x, tf.zeros(cfg.params_shape), **cfg.op_kwargs()))\n"
            "ops = g.get_concrete_function(tf.TensorSpec([None, 3])).graph.get_operations()\n"
            "print([o.get_attr('deterministic') for o in ops if o.type == 'HashGridEncode'])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})  # the installed package, not the tree's
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[True]"


# ---- config=HashGridConfig instead of the keyword options ---------------------------------------------------------
@pytest.mark.parametrize("encode", [tf_metal_ops.hash_grid_encode, tf_metal_ops.hash_grid.pure_tf.hash_grid_encode],
                         ids=["op", "pure_tf"])
def test_config_gives_the_keyword_options_result_and_conflicts_are_errors(encode):
    cfg = HashGridConfig(3, n_levels=4, log2_hashmap_size=8, per_level_scale=1.7, interpolation="smoothstep")
    x = np.random.default_rng(3).random((9, 3), dtype=np.float32)
    p = np.random.default_rng(4).uniform(-1, 1, cfg.params_shape).astype(np.float32)
    want = encode(x, p, **cfg.op_kwargs()).numpy()
    np.testing.assert_array_equal(encode(x, p, config=cfg).numpy(), want)
    with pytest.raises(ValueError, match="either config or the options"):
        encode(x, p, config=cfg, n_levels=4)
    with pytest.raises(ValueError, match="positions have 2 columns, config has n_input_dims=3"):
        encode(x[:, :2], p, config=cfg)
    with pytest.raises(ValueError, match="config must be a HashGridConfig"):
        encode(x, p, config=cfg.op_kwargs())
    with pytest.raises(ValueError, match=r"unknown options \['n_level'\]"):
        encode(x, p, n_level=4)


def test_params_grad_takes_the_config_too():
    cfg = HashGridConfig(2, n_levels=2, log2_hashmap_size=6)
    x, p, dy = [[0.25, 0.5]], np.ones(cfg.params_shape, np.float32), np.ones([1, 4], np.float32)
    got = tf_metal_ops.hash_grid.hash_grid_encode_params_grad(x, p, dy, config=cfg).numpy()
    np.testing.assert_array_equal(got, tf_metal_ops.hash_grid.hash_grid_encode_params_grad(
        x, p, dy, **cfg.op_kwargs()).numpy())
