"""The feature-major layout of the hash-grid ops (``feature_major=True``: the encoding and every tensor shaped like
it are ``[n_levels * F, N]``, tiny-cuda-nn's layout) on the CPU kernels: against the NumPy float64 reference, bitwise
the transpose of the point-major results (forward, both gradients, the second order), numerical gradients, errors,
static shapes, the Keras layer and the pure-TF implementation. The GPU kernels' feature-major path:
tests/support/emulated_gpu_checks.py (check_hash_grid_feature_major) and tests/test_msl_emu_hash_grid.py.

Tolerances: forward against the reference as tests/test_hash_grid_op.py (float32 atol 2e-6; float16 rtol 2^-10 +
atol 1e-6); the point-major comparisons are exact (the CPU kernels compute the same float32 sums in the same order
whatever the layout); numerical gradients as test_hash_grid_op.test_compute_gradient.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_metal_ops
from tf_metal_ops._library import ops
from tf_metal_ops.hash_grid import HashGridConfig, HashGridEncoding, hash_grid_encode_params_grad, pure_tf, reference

from support.hash_grid_cases import random_config, random_positions, seeded


def _tape_results(x, p, dy, cfg, max_level, feature_major):
    """(encoding, d/dparams, d/dpositions, and the second-order d/dparams of an eikonal-like loss) through tapes."""
    x, p = tf.constant(x), tf.constant(p)
    with tf.GradientTape(persistent=True) as outer:
        outer.watch([x, p])
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([x, p])
            y = tf_metal_ops.hash_grid_encode(x, p, max_level=max_level, feature_major=feature_major,
                                              **cfg.op_kwargs())
        gp, gx = tape.gradient(y, [p, x], output_gradients=tf.constant(dy))
        loss = tf.reduce_sum(tf.square(gx))
    g2p = outer.gradient(loss, p)
    return [np.asarray(v) for v in (y, gp, gx, g2p)]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("trial", range(6))
def test_matches_reference_and_transposes_point_major(dtype, trial):
    rng = seeded("feature_major", dtype, trial)
    cfg = random_config(rng, max_levels=6, max_log2=12, max_entries=300_000)
    n = int(rng.choice([1, 7, 300]))
    x = random_positions(rng, n, cfg.n_input_dims)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(dtype)
    dy = rng.standard_normal((n, cfg.n_output_dims)).astype(dtype)
    max_level = [None, int(rng.integers(0, cfg.n_levels + 1)), float(rng.uniform(0, 1.2))][trial % 3]
    want = reference.encode(x, p.astype(np.float64), cfg, max_level=max_level)
    y_t, gp_t, gx_t, g2_t = _tape_results(x, p, np.ascontiguousarray(dy.T), cfg, max_level, True)
    assert y_t.shape == (cfg.n_output_dims, n) and y_t.dtype == np.dtype(dtype)
    if dtype == "float32":
        np.testing.assert_allclose(y_t, want.T, rtol=0, atol=2e-6)
    else:
        np.testing.assert_allclose(y_t.astype(np.float64), want.T, rtol=2**-10, atol=1e-6)
    y, gp, gx, g2 = _tape_results(x, p, dy, cfg, max_level, False)
    assert np.array_equal(y_t, y.T)
    assert np.array_equal(gp_t, gp) and np.array_equal(gx_t, gx, equal_nan=True)
    assert np.array_equal(g2_t, g2)
    if n > 1 and cfg.n_levels > 0 and max_level is None:
        assert np.any(y_t) and np.any(gp_t)


def test_second_order_op_writes_grad_grad_in_the_layout():
    cfg = HashGridConfig(3, n_levels=4, n_features_per_level=2, log2_hashmap_size=8, base_resolution=4,
                         per_level_scale=1.5, interpolation="smoothstep")
    rng = seeded("fm second order")
    n = 90
    x = rng.uniform(0, 1, (n, 3)).astype(np.float32)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    dy = rng.standard_normal((n, cfg.n_output_dims)).astype(np.float32)
    ddx = rng.standard_normal((n, 3)).astype(np.float32)
    a = ops().hash_grid_encode_grad_positions_grad(ddx, dy, x, p, np.int32(3), **cfg.op_kwargs())
    b = ops().hash_grid_encode_grad_positions_grad(ddx, np.ascontiguousarray(dy.T), x, p, np.int32(3),
                                                   feature_major=True, **cfg.op_kwargs())
    assert b[0].shape == (cfg.n_output_dims, n)
    assert np.array_equal(b[0].numpy(), a[0].numpy().T) and np.any(b[0].numpy()[:6])
    assert not np.any(b[0].numpy()[6:])  # inactive level 3
    assert np.array_equal(b[1].numpy(), a[1].numpy()) and np.array_equal(b[2].numpy(), a[2].numpy())


@pytest.mark.parametrize("interpolation", ["linear", "smoothstep"])
def test_compute_gradient(interpolation):
    cfg = HashGridConfig(2, n_levels=3, n_features_per_level=2, log2_hashmap_size=4, base_resolution=3,
                         per_level_scale=1.6, interpolation=interpolation)
    rng = seeded("fm cg", interpolation)
    x = rng.uniform(0.05, 0.95, (5, 2)).astype(np.float32)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)

    def f_x(xx):
        return tf_metal_ops.hash_grid_encode(xx, p, feature_major=True, **cfg.op_kwargs())

    def f_p(pp):
        return tf_metal_ops.hash_grid_encode(x, pp, feature_major=True, **cfg.op_kwargs())

    (ta,), (tn,) = tf.test.compute_gradient(f_x, [tf.constant(x)], delta=1e-3)
    np.testing.assert_allclose(ta, tn, rtol=2e-2, atol=2e-2)
    assert np.abs(ta).max() > 0.1
    (ta,), (tn,) = tf.test.compute_gradient(f_p, [tf.constant(p)], delta=1e-2)
    np.testing.assert_allclose(ta, tn, rtol=1e-3, atol=1e-3)
    assert np.count_nonzero(ta) > 0


def test_empty_batch():
    cfg = HashGridConfig(3, n_levels=3, log2_hashmap_size=6)
    p = np.ones(cfg.params_shape, np.float32)
    x = tf.zeros([0, 3])
    with tf.GradientTape() as tape:
        pv = tf.constant(p)
        tape.watch(pv)
        y = tf_metal_ops.hash_grid_encode(x, pv, feature_major=True, **cfg.op_kwargs())
    assert y.shape == (cfg.n_output_dims, 0)
    g = tape.gradient(y, pv, output_gradients=tf.zeros([cfg.n_output_dims, 0]))
    assert g.shape == cfg.params_shape and not np.any(g.numpy())


def test_bad_inputs():
    cfg = HashGridConfig(3, n_levels=2, n_features_per_level=2, log2_hashmap_size=6)
    x = np.zeros((4, 3), np.float32)
    p = np.zeros(cfg.params_shape, np.float32)
    # The kernel checks grad against the layout (eager: no shape function runs).
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"grad must have shape \[4, 4\] \(\[L\*F, N\]"):
        ops().hash_grid_encode_grad_params(np.zeros((4, 4), np.float32)[:, :3], x, p, np.int32(2),
                                           feature_major=True, **cfg.op_kwargs())
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"grad must have shape \[4, 7\] \(\[L\*F, N\]"):
        ops().hash_grid_encode_grad_positions(np.zeros((7, 4), np.float32), np.zeros((7, 3), np.float32), p,
                                              np.int32(2), feature_major=True, **cfg.op_kwargs())
    with pytest.raises(ValueError, match="feature_major must be True or False"):
        tf_metal_ops.hash_grid_encode(x, p, feature_major=1, **cfg.op_kwargs())
    with pytest.raises(ValueError, match=r"output_grad must have shape \[4, N\] \(feature_major\)"):
        hash_grid_encode_params_grad(x, p, np.zeros((4, 4), np.float32)[:3], feature_major=True,
                                                  **cfg.op_kwargs())
    with pytest.raises(ValueError, match="feature_major must be True or False"):
        HashGridEncoding(n_levels=2, feature_major="yes")


def test_static_shapes_in_graphs():
    cfg = HashGridConfig(3, n_levels=5, n_features_per_level=4, log2_hashmap_size=10)

    @tf.function(input_signature=[tf.TensorSpec([7, 3], tf.float32), tf.TensorSpec(cfg.params_shape, tf.float32)])
    def f(x, p):
        with tf.GradientTape() as tape:
            tape.watch(p)
            y = tf_metal_ops.hash_grid_encode(x, p, feature_major=True, **cfg.op_kwargs())
            loss = tf.reduce_sum(y * tf.range(7, dtype=tf.float32))  # broadcasts along the points: [L*F, N]
        assert y.shape.as_list() == [20, 7]
        g = tape.gradient(loss, p)
        assert g.shape.as_list() == list(cfg.params_shape)
        return y, g

    y, g = f(tf.random.stateless_uniform([7, 3], seed=[1, 2]), tf.ones(cfg.params_shape))
    assert y.shape == (20, 7) and np.any(g.numpy())


def test_params_grad_equals_tape_gradient():
    cfg = HashGridConfig(3, n_levels=4, log2_hashmap_size=7, base_resolution=4)
    rng = seeded("fm params grad")
    x = rng.uniform(0, 1, (50, 3)).astype(np.float32)
    p = tf.constant(rng.uniform(-1, 1, cfg.params_shape).astype(np.float32))
    dy = tf.constant(rng.standard_normal((cfg.n_output_dims, 50)).astype(np.float32))
    with tf.GradientTape() as tape:
        tape.watch(p)
        y = tf_metal_ops.hash_grid_encode(x, p, feature_major=True, **cfg.op_kwargs())
    want = tape.gradient(y, p, output_gradients=dy)
    got = hash_grid_encode_params_grad(x, p, dy, feature_major=True, **cfg.op_kwargs())
    assert np.array_equal(got.numpy(), want.numpy()) and np.any(got.numpy())


def test_layer_and_pure_tf():
    rng = seeded("fm layer")
    x = rng.uniform(0, 1, (2, 6, 3)).astype(np.float32)
    outs = {}
    table = None
    for implementation in ("op", "pure_tf"):
        enc = HashGridEncoding(n_levels=3, log2_hashmap_size=8, implementation=implementation, feature_major=True)
        ref = HashGridEncoding(n_levels=3, log2_hashmap_size=8, implementation=implementation)
        enc(x)
        ref(x)
        table = enc.table.numpy() if table is None else table  # both implementations encode with one table
        enc.table.assign(table)
        ref.table.assign(table)
        y = enc(x)  # [..., D] -> [L*F, ...]
        assert y.shape == (6, 2, 6) and enc.compute_output_shape((2, 6, 3)) == (6, 2, 6)
        np.testing.assert_allclose(y.numpy(), np.moveaxis(ref(x).numpy(), -1, 0), rtol=0, atol=1e-7)
        dy = tf.constant(rng.standard_normal((6, 12)).astype(np.float32))
        g = enc.table_gradient(x.reshape(-1, 3), dy)
        np.testing.assert_allclose(g.numpy(), ref.table_gradient(x.reshape(-1, 3), tf.transpose(dy)).numpy(),
                                   rtol=1e-6, atol=1e-7)
        clone = HashGridEncoding.from_config(enc.get_config())
        assert clone.feature_major and clone.compute_output_shape((5, 3)) == (6, 5)
        outs[implementation] = y.numpy()
    np.testing.assert_allclose(outs["op"], outs["pure_tf"], rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="feature_major"):
        pure_tf.hash_grid_encode(x[0], tf.zeros([10, 2]), feature_major=None)
