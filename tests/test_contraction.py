"""Scene contraction (tf_metal_ops.contraction) against the NumPy float64 reference: values, the geometry it
promises, gradients (tf.test.compute_gradient and the analytic Jacobian), tf.function / XLA, bad input."""

import numpy as np
import pytest
import tensorflow as tf

import tf_metal_ops as tfmo
from tf_metal_ops.contraction import reference as ref


def points(n, seed=0):
    """Points at distances from 1e-3 to 1e5 in random directions, plus points on and next to ||x|| = 1 in both
    norms, the origin and axis points."""
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(n, 3))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    r = 10.0 ** rng.uniform(-3, 5, n)
    special = [np.zeros(3), [1.0, 0, 0], [0, -1.0, 0], [0.6, 0.8, 0], [1.0, 0.5, -0.3], [1.0 + 1e-6, 0, 0],
               [1.0 - 1e-6, 0, 0], [0, 0, 3.0], [-7.0, 2.0, 1.0]]
    return np.concatenate([v * r[:, None], np.array(special)], axis=0)


@pytest.mark.parametrize("norm", ["l2", "inf"])
def test_matches_numpy_reference(norm):
    x = points(2000)
    y64 = tfmo.contract(tf.constant(x, tf.float64), norm=norm).numpy()
    np.testing.assert_allclose(y64, ref.contract(x, norm), rtol=1e-14, atol=1e-15)
    x32 = x.astype(np.float32)
    y32 = tfmo.contract(x32, norm=norm)
    assert y32.dtype == tf.float32
    # float32: a few ulps of values of magnitude < 2
    np.testing.assert_allclose(y32.numpy(), ref.contract(x32.astype(np.float64), norm), rtol=0, atol=1e-6)
    box = ((-1.5, 0.0, 2.0), (2.5, 1.0, 3.0))
    u = tfmo.contract_to_unit(tf.constant(x, tf.float64), box, norm=norm).numpy()
    np.testing.assert_allclose(u, ref.contract_to_unit(x, box, norm), rtol=0, atol=1e-15)


@pytest.mark.parametrize("norm", ["l2", "inf"])
def test_geometry(norm):
    x = points(3000, seed=1)
    nrm = (lambda v: np.linalg.norm(v, axis=-1)) if norm == "l2" else (lambda v: np.abs(v).max(axis=-1))
    y = tfmo.contract(tf.constant(x, tf.float64), norm=norm).numpy()
    inside = nrm(x) <= 1.0
    np.testing.assert_array_equal(y[inside], x[inside])  # the unit region is untouched
    assert np.all(nrm(y) < 2.0)
    np.testing.assert_allclose(nrm(y[~inside]), 2.0 - 1.0 / nrm(x[~inside]), rtol=1e-14)
    # the direction is kept
    cos = np.sum(y * x, axis=1) / np.maximum(np.linalg.norm(y, axis=1) * np.linalg.norm(x, axis=1), 1e-300)
    np.testing.assert_allclose(cos[nrm(x) > 0], 1.0, rtol=1e-12)
    # continuity at the unit sphere / cube
    d = np.array([[0.3, -0.2, 0.9]])
    d /= nrm(d)[:, None]
    for eps in (1e-9, 1e-6):
        a, b = (tfmo.contract(tf.constant(d * (1.0 + s * eps), tf.float64), norm=norm).numpy() for s in (-1, 1))
        assert np.max(np.abs(a - b)) < 3 * eps
    # contract_to_unit: the box maps onto [1/4, 3/4]^3 (inf) and everything into (0, 1)
    box = np.array([[-3.0, -1.0, 0.0], [1.0, 2.0, 0.5]])
    corners = np.array([[box[i, 0], box[j, 1], box[k, 2]] for i in (0, 1) for j in (0, 1) for k in (0, 1)])
    u = tfmo.contract_to_unit(tf.constant(corners, tf.float64), box, norm="inf").numpy()
    np.testing.assert_allclose(u, (corners - box[0]) / (box[1] - box[0]) * 0.5 + 0.25, atol=1e-15)
    far = tfmo.contract_to_unit(tf.constant(x * 1e3, tf.float64), box, norm=norm).numpy()
    assert np.all((far > 0.0) & (far < 1.0))
    u32 = tfmo.contract_to_unit((x * 1e3).astype(np.float32), box, norm=norm).numpy()
    assert np.all((u32 >= 0.0) & (u32 <= 1.0))


@pytest.mark.parametrize("norm", ["l2", "inf"])
def test_gradient(norm):
    rng = np.random.default_rng(3)
    # away from ties of the L-inf norm (two equal largest components: no derivative there)
    x = np.concatenate([rng.normal(size=(20, 3)) * s for s in (0.2, 1.0, 5.0, 100.0)])
    if norm == "inf":
        a = np.sort(np.abs(x), axis=1)
        x = x[a[:, 2] - a[:, 1] > 1e-3 * a[:, 2]]
    jac = ref.contract_jacobian(x, norm)
    for p in range(len(x)):
        theo, num = tf.test.compute_gradient(lambda v: tfmo.contract(v, norm=norm), [tf.constant(x[p:p + 1])])
        # theo[0]: [3 outputs, 3 inputs] for one point (row: output)
        np.testing.assert_allclose(theo[0], jac[p], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(theo[0], num[0], rtol=1e-5, atol=1e-7)
    # at the origin and on the boundary the gradient is finite: the identity (C1 at ||x|| = 1 for L2)
    for v in ([0.0, 0.0, 0.0], [1.0, 0.0, 0.0]):
        with tf.GradientTape() as tape:
            t = tf.constant([v], tf.float64)
            tape.watch(t)
            y = tfmo.contract(t, norm=norm)
        j = tape.batch_jacobian(y, t).numpy()[0]
        np.testing.assert_array_equal(j, np.eye(3))
    # float32 gradients are finite for huge and zero inputs
    t = tf.constant([[0.0, 0.0, 0.0], [1e15, -3e14, 2.0]], tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(t)
        s = tf.reduce_sum(tfmo.contract_to_unit(t, norm=norm))
    assert np.all(np.isfinite(tape.gradient(s, t).numpy()))


def test_tf_function_xla_and_shapes():
    x = points(91, seed=4).astype(np.float32).reshape(4, 25, 3)
    want = tfmo.contract_to_unit(x, norm="inf").numpy()
    f = tf.function(lambda v: tfmo.contract_to_unit(v, norm="inf"), jit_compile=True)
    np.testing.assert_allclose(f(x).numpy(), want, rtol=0, atol=1e-7)
    g = tf.function(lambda v: tfmo.contract(v), input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    assert g(x.reshape(-1, 3)).shape == (100, 3)
    assert tfmo.contract(np.zeros((0, 3), np.float32)).shape == (0, 3)
    assert tfmo.contract(tf.constant([1.0, 2.0, 2.0], tf.float16)).dtype == tf.float16


@pytest.mark.parametrize("call,match", [
    (lambda: tfmo.contract(np.zeros((4, 2), np.float32)), r"shape \[\.\.\., 3\]"),
    (lambda: tfmo.contract(tf.constant(1.0)), "scalar"),
    (lambda: tfmo.contract(tf.zeros((4, 3), tf.int32)), "floating-point"),
    (lambda: tfmo.contract(np.zeros((4, 3), np.float32), norm="l1"), "norm must be one of"),
    (lambda: tfmo.contract(np.zeros((4, 3), np.float32), norm=2), "norm must be one of"),
    (lambda: tfmo.contract_to_unit(np.zeros((4, 3), np.float32), ((1, 1, 1), (0, 2, 2))), "min < max"),
    (lambda: tfmo.contract_to_unit(np.zeros((4, 3), np.float32), ((0, 0), (1, 1))), "aabb must be"),
    (lambda: tfmo.contract_to_unit(np.zeros((4, 3), np.float32), ((0, 0, np.nan), (1, 1, 1))), "finite"),
    (lambda: tfmo.contract_to_unit(np.zeros((4, 3), np.float32), norm="L2"), "norm must be one of"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
