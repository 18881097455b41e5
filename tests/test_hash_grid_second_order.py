"""Second derivatives of the hash-grid encoding: the gradient of HashGridEncodeGradPositions w.r.t. its inputs
(dy, params, positions), computed by HashGridEncodeGradPositionsGrad (tiny-cuda-nn's
kernel_grid_backward_input_backward_{dLdoutput,grid,input}).

Checked against the NumPy float64 reference (reference.grad_positions_grad), against central finite differences of
the first-order op, against pure-TF autodiff through nested GradientTapes (eager and tf.function), for bitwise
determinism across runs and thread counts, and for input validation.

Tolerances (params uniform in [-1, 1], dy and ddx standard normal; the reference emulates the kernels' float32
cell selection exactly):
  float32: d/d(dy) rtol 1e-5 + atol 1e-5 * max|ref|; d/dparams rtol 1e-5 + atol 1e-5 * max|ref|;
           d/dpositions rtol 1e-4 + atol 1e-5 * max|ref| (terms scale with scale^2 and cancel);
  float16 tables (inputs exactly representable, float32 math, results rounded once to float16):
           d/d(dy) and d/dparams rtol 2^-9 + atol 1e-3 * max|ref|, d/dpositions as float32.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_metal_ops
from tf_metal_ops._library import ops
from tf_metal_ops.hash_grid import HashGridConfig, pure_tf, reference

from support.hash_grid_cases import GRID_TYPES, INTERPOLATIONS, random_positions, seeded


def second_order_config(d, grid_type, interpolation, n_features=2):
    """Small configs that exercise the interesting level kinds: hash grids with hashed fine levels, tiled grids
    with levels finer than the N_min^D tile (their row-major index wraps), dense grids."""
    if grid_type == "hash":
        cfg = HashGridConfig(d, n_levels=4, n_features_per_level=n_features, log2_hashmap_size={2: 7, 3: 8, 4: 9}[d],
                             base_resolution=4, per_level_scale=1.8, grid_type="hash", interpolation=interpolation)
        assert any(cfg.layout().hashed) and not all(cfg.layout().hashed), cfg.layout()
    elif grid_type == "tiled":
        cfg = HashGridConfig(d, n_levels=3, n_features_per_level=n_features, base_resolution=3, per_level_scale=1.7,
                             grid_type="tiled", interpolation=interpolation)
        assert cfg.resolution(cfg.n_levels - 1) ** d > cfg.params_in_level(cfg.n_levels - 1)  # wraps into the tile
    else:
        cfg = HashGridConfig(d, n_levels=3, n_features_per_level=n_features, base_resolution=3, per_level_scale=1.5,
                             grid_type="dense", interpolation=interpolation)
    return cfg


def second_order(ddx, dy, x, p, cfg, max_level=None):
    level = tf_metal_ops.hash_grid.ops._max_level_tensor(max_level, cfg.n_levels)
    out = ops().hash_grid_encode_grad_positions_grad(ddx, dy, x, p, level, **cfg.op_kwargs())
    return [o.numpy() for o in out]


def first_order(dy, x, p, cfg, max_level=None):
    level = tf_metal_ops.hash_grid.ops._max_level_tensor(max_level, cfg.n_levels)
    return ops().hash_grid_encode_grad_positions(dy, x, p, level, **cfg.op_kwargs()).numpy()


def close(actual, expected, rtol, atol_rel, what):
    expected = np.asarray(expected, np.float64)
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol,
                               atol=atol_rel * max(1.0, np.abs(expected).max()), err_msg=what)


# ---- against the float64 reference ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
@pytest.mark.parametrize("grid_type", GRID_TYPES)
@pytest.mark.parametrize("d", [2, 3, 4])
def test_matches_reference(d, grid_type, interpolation, dtype):
    for trial, max_level in enumerate([None, 2, 0.5]):
        rng = seeded("d2", d, grid_type, interpolation, dtype, trial)
        cfg = second_order_config(d, grid_type, interpolation, n_features=[2, 1, 4][trial])
        n = [300, 65, 1][trial]
        x = random_positions(rng, n, d)  # includes NaN, +-inf, exact 0 and 1, outside [0, 1]
        p = rng.uniform(-1, 1, cfg.params_shape).astype(dtype)
        dy = rng.standard_normal((n, cfg.n_output_dims)).astype(dtype)
        ddx = rng.standard_normal((n, d)).astype(np.float32)
        d_dy, d_p, d_x = second_order(ddx, dy, x, p, cfg, max_level)
        assert d_dy.dtype == np.dtype(dtype) and d_dy.shape == dy.shape
        assert d_p.dtype == np.dtype(dtype) and d_p.shape == p.shape
        assert d_x.dtype == np.float32 and d_x.shape == x.shape
        r_dy, r_p, r_x = reference.grad_positions_grad(x, p, dy, ddx, cfg, max_level=max_level)
        what = f"D={d} {grid_type} {interpolation} {dtype} max_level={max_level}"
        if dtype == "float32":
            close(d_dy, r_dy, 1e-5, 1e-5, "d/d(dy) " + what)
            close(d_p, r_p, 1e-5, 1e-5, "d/dparams " + what)
        else:
            close(d_dy, r_dy, 2**-9, 1e-3, "d/d(dy) " + what)
            close(d_p, r_p, 2**-9, 1e-3, "d/dparams " + what)
        close(d_x, r_x, 1e-4, 1e-5, "d/dpositions " + what)
        if interpolation == "nearest":
            assert not d_dy.any() and not d_p.any() and not d_x.any()
        elif trial == 0:  # the outputs are not trivially zero
            assert np.abs(r_dy).max() > 0.1 and np.abs(r_p).max() > 0.1 and np.abs(r_x).max() > 0.1, what
        # inactive levels: no d/d(dy) columns
        k = reference.n_active_levels(cfg.n_levels, max_level)
        assert not d_dy[:, k * cfg.n_features_per_level:].any()


def test_reference_second_derivative_conventions():
    """The reference itself: linear has no pure second derivative along an axis (d^2/dx_k^2 = 0 inside a cell),
    smoothstep has one; the Hessian of the interpolation weights is symmetric."""
    rng = seeded("d2-conv")
    x = rng.uniform(0.1, 0.9, (50, 3)).astype(np.float32)
    for interpolation in ("linear", "smoothstep"):
        cfg = second_order_config(3, "dense", interpolation)
        diag = 0.0
        for _, _, _, h in reference.level_corners_second_order(x, cfg, 2):
            np.testing.assert_array_equal(h, np.swapaxes(h, 1, 2))
            diag = max(diag, np.abs(np.diagonal(h, axis1=1, axis2=2)).max())
        assert (diag == 0) == (interpolation == "linear"), (interpolation, diag)


# ---- against finite differences of the first-order op --------------------------------------------------------
def _interior_points(rng, cfg, n, d, eps):
    """Points whose every coordinate stays in one cell of every level for x +- eps (central differences of a
    piecewise-smooth function are only meaningful inside a cell)."""
    x = rng.uniform(0.02, 0.98, (4 * n, d)).astype(np.float32)
    ok = np.ones(len(x), bool)
    for level in range(cfg.n_levels):
        pos = x.astype(np.float64) * cfg.scale(level) + 0.5
        frac = pos - np.floor(pos)
        margin = 3 * eps * cfg.scale(level)
        ok &= np.all((frac > margin) & (frac < 1 - margin), axis=1)
    x = x[ok][:n]
    assert len(x) == n, "not enough interior points"
    return x


@pytest.mark.parametrize("interpolation", ["linear", "smoothstep", "nearest"])
@pytest.mark.parametrize("grid_type", GRID_TYPES)
@pytest.mark.parametrize("d", [2, 3, 4])
def test_matches_finite_differences_of_the_first_order_op(d, grid_type, interpolation):
    cfg = second_order_config(d, grid_type, interpolation)
    rng = seeded("d2-fd", d, grid_type, interpolation)
    eps = 1e-2 / cfg.scale(cfg.n_levels - 1)  # 1% of the finest cell
    n = 40
    x = _interior_points(rng, cfg, n, d, eps)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    dy = rng.standard_normal((n, cfg.n_output_dims)).astype(np.float32)
    ddx = rng.standard_normal((n, d)).astype(np.float32)
    d_dy, d_p, d_x = second_order(ddx, dy, x, p, cfg)

    def phi_rows(dy_, x_, p_):  # per point: <ddx, grad_positions>, in float64
        return np.sum(ddx.astype(np.float64) * first_order(dy_, x_, p_, cfg), axis=1)

    # dy and params enter linearly: a directional central difference with a unit step is exact up to rounding.
    u = rng.standard_normal(dy.shape).astype(np.float32)
    fd = (phi_rows(dy + u, x, p) - phi_rows(dy - u, x, p)) / 2
    close(np.sum(d_dy * u, axis=1), fd, 1e-4, 1e-5, "d/d(dy) vs finite differences")
    q = rng.standard_normal(p.shape).astype(np.float32)
    fd = (phi_rows(dy, x, p + q).sum() - phi_rows(dy, x, p - q).sum()) / 2
    close(np.sum(d_p.astype(np.float64) * q), fd, 1e-4, 1e-5, "d/dparams vs finite differences")
    # positions: one coordinate at a time (each point's Phi depends only on its own x)
    for j in range(d):
        e = np.zeros((1, d), np.float32)
        e[0, j] = eps
        xp, xm = (x + e).astype(np.float32), (x - e).astype(np.float32)
        step = (xp[:, j].astype(np.float64) - xm[:, j].astype(np.float64))  # the float32 step actually taken
        fd = (phi_rows(dy, xp, p) - phi_rows(dy, xm, p)) / step
        close(d_x[:, j], fd, 2e-3, 2e-3, f"d/dx{j} vs finite differences D={d} {grid_type} {interpolation}")
    if interpolation == "nearest":
        assert not d_x.any() and not d_dy.any() and not d_p.any()
    else:
        assert np.abs(d_x).max() > 1.0


# ---- nested GradientTape: eikonal-style losses ------------------------------------------------------------------
@pytest.mark.parametrize("interpolation", ["smoothstep", "linear"])
@pytest.mark.parametrize("mode", ["eager", "tf.function"])
def test_nested_gradient_tape_matches_pure_tf_autodiff(mode, interpolation):
    """An eikonal loss |d sdf/dx| - 1 through a small MLP: the gradients w.r.t. the tables and the MLP weights
    equal TensorFlow's own autodiff of the pure-TF encoding (second derivatives of gathers and arithmetic)."""
    cfg = HashGridConfig(3, n_levels=4, log2_hashmap_size=8, base_resolution=4, per_level_scale=1.8,
                         interpolation=interpolation)
    rng = seeded("d2-tape", mode, interpolation)
    x = tf.constant(rng.uniform(0.02, 0.98, (200, 3)).astype(np.float32))
    table = tf.Variable(rng.uniform(-1, 1, cfg.params_shape).astype(np.float32))
    w1 = tf.Variable(rng.standard_normal((cfg.n_output_dims, 16)).astype(np.float32) * 0.3)
    w2 = tf.Variable(rng.standard_normal((16, 1)).astype(np.float32) * 0.3)

    def op_encode(x_, t_):
        return tf_metal_ops.hash_grid_encode(x_, t_, **cfg.op_kwargs())

    def tf_encode(x_, t_):
        return pure_tf.hash_grid_encode(x_, t_, **cfg.op_kwargs())

    fn_op = lambda a, b, c, e: _eikonal_grads(op_encode, a, b, c, e)  # noqa: E731
    fn_tf = lambda a, b, c, e: _eikonal_grads(tf_encode, a, b, c, e)  # noqa: E731
    if mode == "tf.function":
        fn_op, fn_tf = tf.function(fn_op), tf.function(fn_tf)
    got = [tf.convert_to_tensor(v).numpy() for v in fn_op(x, table, w1, w2)]
    want = [tf.convert_to_tensor(v).numpy() for v in fn_tf(x, table, w1, w2)]  # pure TF: IndexedSlices
    for name, a, b in zip(("tables", "w1", "w2"), got, want):
        close(a, b, 1e-3, 1e-4, f"{name} {mode} {interpolation}")
        assert np.abs(b).max() > 0, name


def _eikonal_grads(encode_fn, x, table, w1, w2):
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            inner.watch(x)
            h = encode_fn(x, table)
            sdf = tf.matmul(tf.nn.softplus(tf.matmul(h, w1)), w2)
        g = inner.gradient(sdf, x)
        loss = tf.reduce_mean(tf.square(tf.norm(g, axis=-1) - 1.0)) + tf.reduce_mean(tf.square(sdf))
    return outer.gradient(loss, [table, w1, w2])


@pytest.mark.parametrize("mode", ["eager", "tf.function"])
def test_second_derivative_wrt_positions_via_nested_tapes(mode):
    """d/dx of a function of d(features)/dx (the op's third output) through nested tapes, eager and in a graph,
    against the reference Hessian-vector product."""
    cfg = HashGridConfig(2, n_levels=3, log2_hashmap_size=6, base_resolution=4, per_level_scale=2.0,
                         interpolation="smoothstep")
    rng = seeded("d2-hvp", mode)
    xn = rng.uniform(0.05, 0.95, (30, 2)).astype(np.float32)
    pn = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    dyn = rng.standard_normal((30, cfg.n_output_dims)).astype(np.float32)
    ddxn = rng.standard_normal((30, 2)).astype(np.float32)

    def f(x, p, dy, ddx):
        with tf.GradientTape() as outer:
            outer.watch([x, p, dy])
            with tf.GradientTape() as inner:
                inner.watch(x)
                y = tf_metal_ops.hash_grid_encode(x, p, **cfg.op_kwargs())
            g = inner.gradient(y, x, output_gradients=dy)
            phi = tf.reduce_sum(g * ddx)
        return outer.gradient(phi, [dy, p, x])

    if mode == "tf.function":
        f = tf.function(f)
    got = [v.numpy() for v in f(tf.constant(xn), tf.constant(pn), tf.constant(dyn), tf.constant(ddxn))]
    want = reference.grad_positions_grad(xn, pn, dyn, ddxn, cfg)
    for name, a, b in zip(("dy", "params", "positions"), got, want):
        close(a, b, 1e-4, 1e-5, f"{name} {mode}")


# ---- determinism --------------------------------------------------------------------------------------------
def _bits(a):
    a = np.asarray(a)
    return a.view(f"u{a.itemsize}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("d", [2, 3, 4])
def test_bitwise_deterministic_across_runs_and_threads(d, dtype):
    """All three outputs bitwise identical over repeated runs and thread counts 1, 2, 3; a tiny table so that many
    points collide on each row (an order-dependent sum would differ in the last bits); one level (the split-level
    path of the table gradient) and several."""
    for grid_type in GRID_TYPES:
        for interpolation in ("linear", "smoothstep"):
            n_levels = 1 if grid_type == "dense" else 3
            cfg = HashGridConfig(d, n_levels=n_levels, log2_hashmap_size=5, base_resolution=3, per_level_scale=1.7,
                                 grid_type=grid_type, interpolation=interpolation)
            rng = seeded("d2-det", d, dtype, grid_type, interpolation)
            n = 3000
            x = random_positions(rng, n, d)
            p = rng.uniform(-1, 1, cfg.params_shape).astype(dtype)
            dy = rng.standard_normal((n, cfg.n_output_dims)).astype(dtype)
            ddx = rng.standard_normal((n, d)).astype(np.float32)
            runs = []
            for threads in (1, 2, 3, 2, 1):
                with tf_metal_ops.num_threads(threads):
                    runs.append(second_order(ddx, dy, x, p, cfg))
            for r in runs[1:]:
                for name, a, b in zip(("d/d(dy)", "d/dparams", "d/dpositions"), runs[0], r):
                    assert np.array_equal(_bits(a), _bits(b)), f"{name} not reproducible D={d} {dtype} {grid_type}"
            assert np.abs(runs[0][1].astype(np.float64)).max() > 5  # rows sum many points


# ---- errors, empty inputs, unregistered higher orders -----------------------------------------------------------
def test_bad_inputs_are_invalid_argument_errors():
    cfg = HashGridConfig(3, n_levels=2, log2_hashmap_size=6)
    x = np.full((4, 3), 0.5, np.float32)
    p = np.zeros(cfg.params_shape, np.float32)
    dy = np.zeros((4, cfg.n_output_dims), np.float32)
    ddx = np.zeros((4, 3), np.float32)
    raw = ops().hash_grid_encode_grad_positions_grad
    kw = cfg.op_kwargs()
    cases = [
        ((np.zeros((4, 2), np.float32), dy, x, p), "grad_grad_positions must have shape"),
        ((np.zeros((5, 3), np.float32), dy, x, p), "grad_grad_positions must have shape"),
        ((ddx, np.zeros((4, 3), np.float32), x, p), "grad must have shape"),
        ((ddx, dy, x, np.zeros((7, 2), np.float32)), "params has 7 rows"),
        ((ddx, dy, np.zeros((4, 5), np.float32), p), "positions must have 1 to 4 columns"),
    ]
    for args, message in cases:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            raw(*args, tf.constant(2), **kw)
    with pytest.raises((tf.errors.InvalidArgumentError, TypeError, ValueError)):
        raw(tf.constant(ddx, tf.float16), dy, x, p, tf.constant(2), **kw)  # the op def types it float32
    with pytest.raises(tf.errors.InvalidArgumentError, match="interpolation"):
        raw(ddx, dy, x, p, tf.constant(2), **dict(kw, interpolation="cubic"))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_empty_batch(dtype):
    cfg = HashGridConfig(3, n_levels=2, log2_hashmap_size=6)
    d_dy, d_p, d_x = second_order(np.zeros((0, 3), np.float32), np.zeros((0, cfg.n_output_dims), dtype),
                                  np.zeros((0, 3), np.float32), np.ones(cfg.params_shape, dtype), cfg)
    assert d_dy.shape == (0, cfg.n_output_dims) and d_x.shape == (0, 3)
    assert d_p.shape == cfg.params_shape and not d_p.any()


def test_third_derivative_and_param_gradient_gradient_are_explicit_errors():
    """Only the position-gradient op has a gradient: the parameter-gradient op and the second-order op itself
    raise LookupError instead of silently returning zeros."""
    cfg = HashGridConfig(2, n_levels=2, log2_hashmap_size=6)
    x = tf.constant([[0.3, 0.4]])
    p = tf.constant(np.ones(cfg.params_shape, np.float32))

    def repeated_gradient(wrt, order):
        """The order-th gradient of the encoding w.r.t. `wrt` (x or p), by `order` nested tapes."""
        with tf.GradientTape() as tape:
            tape.watch(wrt)
            y = tf_metal_ops.hash_grid_encode(x, p, config=cfg) if order == 1 else repeated_gradient(wrt, order - 1)
        return tape.gradient(y, wrt)

    with pytest.raises(LookupError, match="HashGridEncodeGradParams"):
        repeated_gradient(p, 2)
    with pytest.raises(LookupError, match="HashGridEncodeGradPositionsGrad"):
        repeated_gradient(x, 3)
