"""VolumeRender and DistortionLoss: CPU kernels against NumPy float64 references, gradients, errors, graph mode."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_metal_ops as tfmo
from tf_metal_ops._library import ops
from tf_metal_ops.render.reference import np_distortion_naive, np_volume_render

from support.render_packed_cases import random_background

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_inputs(R, S, C, seed=0, dens_scale=3.0, bg="shared"):
    rng = np.random.default_rng(seed)
    d = rng.uniform(0.0, dens_scale, (R, S)).astype(np.float32)
    c = rng.uniform(0.0, 1.0, (R, S, C)).astype(np.float32)
    # well-separated sorted edges (so finite differences never unsort them)
    t = (2.0 + np.cumsum(rng.uniform(0.05, 0.3, (R, S + 1)), axis=1)).astype(np.float32)
    return d, c, t, random_background(rng, bg, R, C)


def assert_outputs_close(got, want, rtol=2e-5, atol=2e-6):
    for name, g, w in zip(("color", "depth", "opacity", "weights"), got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=rtol, atol=atol, err_msg=name)


# ---------------------------------------------------------------------------------------------------------------
# VolumeRender forward


@pytest.mark.parametrize("C", [1, 3, 5])
@pytest.mark.parametrize("S", [1, 2, 17, 64])
@pytest.mark.parametrize("bg", ["none", "shared", "per_ray"])
def test_volume_render_matches_numpy(S, C, bg):
    d, c, t, b = make_inputs(37, S, C, seed=S * 10 + C, bg=bg)
    got = tfmo.volume_render(d, c, t, b)
    assert got.color.shape == (37, C) and got.depth.shape == (37,) and got.weights.shape == (37, S)
    assert_outputs_close(got, np_volume_render(d, c, t, b))


def test_volume_render_all_zero_densities():
    d, c, t, b = make_inputs(8, 16, 3, bg="per_ray")
    d[:] = 0.0
    out = tfmo.volume_render(d, c, t, b)
    np.testing.assert_array_equal(out.weights.numpy(), 0.0)
    np.testing.assert_array_equal(out.opacity.numpy(), 0.0)
    np.testing.assert_array_equal(out.depth.numpy(), 0.0)
    np.testing.assert_allclose(out.color.numpy(), b)


def test_volume_render_tiny_densities_keep_relative_accuracy():
    # 1 - exp(-tau) by subtraction would return 0 or be off by ~100% here.
    d, c, t, b = make_inputs(6, 8, 3, dens_scale=1e-6)
    out = tfmo.volume_render(d, c, t, b)
    ref = np_volume_render(d, c, t, b)
    np.testing.assert_allclose(out.weights.numpy(), ref[3], rtol=1e-5)
    np.testing.assert_allclose(out.opacity.numpy(), ref[2], rtol=1e-5)


@pytest.mark.parametrize("huge", [1e4, 1e30, 3e38])
def test_volume_render_huge_densities_are_finite(huge):
    d, c, t, b = make_inputs(16, 32, 3)
    d[:, 5:] = huge
    d[::3, 0] = huge
    dens, cols, tt, bg = (tf.constant(x) for x in (d, c, t, b))
    with tf.GradientTape() as tape:
        tape.watch([dens, cols, tt, bg])
        out = tfmo.volume_render(dens, cols, tt, bg)
        loss = (tf.reduce_sum(out.color) + tf.reduce_sum(out.depth) + tf.reduce_sum(out.opacity)
                + tf.reduce_sum(out.weights * 0.3))
    grads = tape.gradient(loss, [dens, cols, tt, bg])
    for x in list(out) + grads:
        assert np.all(np.isfinite(x.numpy()))
    np.testing.assert_allclose(out.opacity.numpy(), 1.0, rtol=1e-6)
    ref = np_volume_render(d, c, t, b)
    assert_outputs_close(out, ref)
    np.testing.assert_allclose(np.sum(out.weights.numpy(), axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("thr", [1e-3, 0.05, 0.5])
def test_early_termination(thr):
    d, c, t, b = make_inputs(50, 48, 3, seed=7, dens_scale=2.0)
    on = tfmo.volume_render(d, c, t, b, termination_threshold=thr)
    off = tfmo.volume_render(d, c, t, b)
    assert_outputs_close(on, np_volume_render(d, c, t, b, thr))
    assert_outputs_close(off, np_volume_render(d, c, t, b, 0.0))
    # it really stopped rays: trailing weights are exactly 0 with it and not without it
    w_on, w_off = on.weights.numpy(), off.weights.numpy()
    stopped = (w_on == 0) & (w_off > 0)
    assert stopped.any()
    # opacity still equals the sum of the weights that were composited
    np.testing.assert_allclose(on.opacity.numpy(), w_on.sum(axis=1), rtol=1e-5, atol=1e-6)


def test_threshold_one_stops_after_first_sample():
    d, c, t, b = make_inputs(5, 6, 3)
    out = tfmo.volume_render(d, c, t, b, termination_threshold=1.0)
    w = out.weights.numpy()
    assert np.all(w[:, 0] > 0) and np.all(w[:, 1:] == 0)


def test_pure_tf_reference_agrees_with_numpy():
    for thr in (0.0, 0.1):
        d, c, t, b = make_inputs(20, 24, 3, seed=3)
        ref = np_volume_render(d, c, t, b, thr)
        got = tfmo.volume_render_tf(d.astype(np.float64), c.astype(np.float64), t.astype(np.float64),
                                    b.astype(np.float64), termination_threshold=thr)
        assert_outputs_close(got, ref, rtol=1e-10, atol=1e-12)
        got32 = tfmo.volume_render_tf(d, c, t, b, termination_threshold=thr)
        assert_outputs_close(got32, ref)


def test_empty_batch():
    d, c, t, b = make_inputs(0, 8, 3, bg="per_ray")
    dens, cols, tt, bg = (tf.constant(x) for x in (d, c, t, b))
    with tf.GradientTape() as tape:
        tape.watch([dens, cols, tt, bg])
        out = tfmo.volume_render(dens, cols, tt, bg)
        loss = tf.reduce_sum(out.color) + tf.reduce_sum(out.weights)
    assert out.color.shape == (0, 3) and out.depth.shape == (0,) and out.weights.shape == (0, 8)
    grads = tape.gradient(loss, [dens, cols, tt, bg])
    assert [g.shape for g in grads] == [(0, 8), (0, 8, 3), (0, 9), (0, 3)]
    assert tfmo.distortion_loss(np.zeros((0, 4), np.float32), np.zeros((0, 5), np.float32)).shape == (0,)


def test_results_do_not_depend_on_thread_count():
    d, c, t, b = make_inputs(999, 40, 3, seed=11)
    before = tfmo.get_num_threads()
    try:
        tfmo.set_num_threads(1)
        one = [x.numpy() for x in tfmo.volume_render(d, c, t, b, termination_threshold=0.01)]
        one.append(tfmo.distortion_loss(one[3], t).numpy())
        tfmo.set_num_threads(2)
        two = [x.numpy() for x in tfmo.volume_render(d, c, t, b, termination_threshold=0.01)]
        two.append(tfmo.distortion_loss(two[3], t).numpy())
    finally:
        tfmo.set_num_threads(before)
    for x, y in zip(one, two):
        np.testing.assert_array_equal(x, y)


# ---------------------------------------------------------------------------------------------------------------
# VolumeRender gradients


def _vr_loss_and_grads(fn, d, c, t, b, thr, up, dtype):
    dens, cols, tt = (tf.constant(x, dtype) for x in (d, c, t))
    bg = None if b is None else tf.constant(b, dtype)
    watch = [dens, cols, tt] + ([] if bg is None else [bg])
    with tf.GradientTape() as tape:
        tape.watch(watch)
        out = fn(dens, cols, tt, bg, termination_threshold=thr)
        loss = sum(tf.reduce_sum(o * tf.constant(u, dtype)) for o, u in zip(out, up))
    return [g.numpy() for g in tape.gradient(loss, watch)]


@pytest.mark.parametrize("bg", ["none", "shared", "per_ray"])
@pytest.mark.parametrize("thr", [0.0, 0.02])
@pytest.mark.parametrize("S,C", [(1, 3), (5, 1), (33, 3), (16, 4)])
def test_volume_render_gradients_match_float64_autodiff(S, C, thr, bg):
    R = 23
    d, c, t, b = make_inputs(R, S, C, seed=S + C, bg=bg)
    rng = np.random.default_rng(S * C)
    up = [rng.normal(size=s) for s in ((R, C), (R,), (R,), (R, S))]
    got = _vr_loss_and_grads(tfmo.volume_render, d, c, t, b, thr, up, tf.float32)
    want = _vr_loss_and_grads(tfmo.volume_render_tf, d, c, t, b, thr, up, tf.float64)
    for name, g, w in zip(("densities", "colors", "t", "background"), got, want):
        assert g.shape == w.shape, name
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5 * max(1.0, np.abs(w).max()), err_msg=name)


@pytest.mark.parametrize("wrt", [0, 1, 2, 3])
def test_volume_render_compute_gradient(wrt):
    d, c, t, b = make_inputs(3, 5, 3, seed=1, dens_scale=1.5, bg="per_ray")
    args = [tf.constant(x) for x in (d, c, t, b)]

    def f(x):
        a = list(args)
        a[wrt] = x
        out = tfmo.volume_render(*a)
        return tf.concat([tf.reshape(out.color, [-1]), out.depth, out.opacity, tf.reshape(out.weights, [-1])], 0)

    theoretical, numerical = tf.test.compute_gradient(f, [args[wrt]], delta=1e-3)
    err = np.abs(theoretical[0] - numerical[0]).max()
    assert np.abs(theoretical[0]).max() > 0
    assert err < 5e-3, err


def test_shared_background_gradient_is_sum_over_rays():
    d, c, t, b = make_inputs(9, 7, 3, seed=4)
    bg = tf.constant(b)
    with tf.GradientTape() as tape:
        tape.watch(bg)
        out = tfmo.volume_render(d, c, t, bg)
        loss = tf.reduce_sum(out.color * np.arange(27, dtype=np.float32).reshape(9, 3))
    g = tape.gradient(loss, bg).numpy()
    T_final = 1.0 - np_volume_render(d, c, t)[2]
    np.testing.assert_allclose(g, (T_final[:, None] * np.arange(27).reshape(9, 3)).sum(0), rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# DistortionLoss


@pytest.mark.parametrize("S", [1, 2, 9, 64])
def test_distortion_loss_matches_naive_double_sum(S):
    rng = np.random.default_rng(S)
    w = rng.uniform(0, 1, (31, S)).astype(np.float32)
    t = np.sort(rng.uniform(0, 10, (31, S + 1)), axis=1).astype(np.float32)
    want = np_distortion_naive(w, t)
    np.testing.assert_allclose(tfmo.distortion_loss(w, t).numpy(), want, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(tfmo.distortion_loss_tf(w.astype(np.float64), t.astype(np.float64)).numpy(), want,
                               rtol=1e-10)


def test_distortion_loss_far_from_origin_and_repeated_edges():
    # Only differences of t enter the kernel's recurrences: a large offset costs no accuracy beyond t's rounding.
    rng = np.random.default_rng(5)
    w = rng.uniform(0, 1, (8, 20)).astype(np.float32)
    t = (1000.0 + np.sort(rng.uniform(0, 4, (8, 21)), axis=1)).astype(np.float32)
    t[:, 3] = t[:, 4]  # a zero-length interval
    np.testing.assert_allclose(tfmo.distortion_loss(w, t).numpy(), np_distortion_naive(w, t), rtol=1e-4)


@pytest.mark.parametrize("S", [1, 4, 40])
def test_distortion_loss_gradients_match_float64_autodiff(S):
    rng = np.random.default_rng(100 + S)
    w = rng.uniform(0, 1, (13, S)).astype(np.float32)
    t = (np.cumsum(rng.uniform(0.05, 0.5, (13, S + 1)), axis=1)).astype(np.float32)
    up = rng.normal(size=13)

    def grads(fn, dtype):
        ww, tt = tf.constant(w, dtype), tf.constant(t, dtype)
        with tf.GradientTape() as tape:
            tape.watch([ww, tt])
            loss = tf.reduce_sum(fn(ww, tt) * tf.constant(up, dtype))
        return [g.numpy() for g in tape.gradient(loss, [ww, tt])]

    for name, g, want in zip(("weights", "t"), grads(tfmo.distortion_loss, tf.float32),
                             grads(tfmo.distortion_loss_tf, tf.float64)):
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()), err_msg=name)


@pytest.mark.parametrize("wrt", [0, 1])
def test_distortion_loss_compute_gradient(wrt):
    rng = np.random.default_rng(9)
    args = [tf.constant(rng.uniform(0, 1, (3, 6)).astype(np.float32)),
            tf.constant(np.cumsum(rng.uniform(0.1, 0.4, (3, 7)), axis=1).astype(np.float32))]

    def f(x):
        a = list(args)
        a[wrt] = x
        return tfmo.distortion_loss(*a)

    theoretical, numerical = tf.test.compute_gradient(f, [args[wrt]], delta=1e-3)
    assert np.abs(theoretical[0]).max() > 0
    assert np.abs(theoretical[0] - numerical[0]).max() < 5e-3


# ---------------------------------------------------------------------------------------------------------------
# Errors


def test_wrapper_rejects_bad_shapes_and_dtypes():
    d, c, t, b = make_inputs(4, 6, 3)
    with pytest.raises(ValueError, match="densities must have rank 2"):
        tfmo.volume_render(d[0], c, t, b)
    with pytest.raises(ValueError, match="colors.shape\\[1\\]"):
        tfmo.volume_render(d, c[:, :5], t, b)
    with pytest.raises(ValueError, match="t.shape\\[1\\]"):
        tfmo.volume_render(d, c, t[:, :6], b)
    with pytest.raises(ValueError, match="background.shape\\[0\\]"):
        tfmo.volume_render(d, c, t, b[:2])
    with pytest.raises(ValueError, match="background must have shape"):
        tfmo.volume_render(d, c, t, np.zeros((4, 3, 1), np.float32))
    with pytest.raises(ValueError, match="must be float32, got float64"):
        tfmo.volume_render(tf.constant(d, tf.float64), c, t, b)
    with pytest.raises(ValueError, match="termination_threshold"):
        tfmo.volume_render(d, c, t, b, termination_threshold=1.5)
    with pytest.raises(ValueError, match="t.shape\\[1\\]"):
        tfmo.distortion_loss(d, t[:, :6])
    with pytest.raises(ValueError, match="weights must be float32, got float16"):
        tfmo.distortion_loss(tf.constant(d, tf.float16), t)
    # NumPy arrays and Python lists are converted to float32 (only TF tensors of another dtype are rejected)
    np.testing.assert_allclose(tfmo.distortion_loss(d.astype(np.float64), t.tolist()).numpy(),
                               tfmo.distortion_loss(d, t).numpy())


def test_kernels_validate_shapes_themselves():
    d, c, t, b = make_inputs(4, 6, 3)
    raw = ops()
    with pytest.raises(tf.errors.InvalidArgumentError, match="t \\(interval edges.*must have shape \\[4, 7\\]"):
        raw.volume_render(d, c, t[:, :6], b)
    with pytest.raises(tf.errors.InvalidArgumentError, match="colors must have shape"):
        raw.volume_render(d, c[:3], t, b)
    with pytest.raises(tf.errors.InvalidArgumentError, match="background must have shape"):
        raw.volume_render(d, c, t, np.zeros(2, np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="termination_threshold must be in"):
        raw.volume_render(d, c, t, b, termination_threshold=-0.1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="grad_weights must have shape"):
        raw.volume_render_grad(d, c, t, b, np.zeros((4, 3), np.float32), np.zeros(4, np.float32),
                               np.zeros(4, np.float32), np.zeros((4, 5), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="weights must have rank 2"):
        raw.distortion_loss(d[0], t)
    with pytest.raises(tf.errors.InvalidArgumentError, match="grad_loss must have shape \\[4\\]"):
        raw.distortion_loss_grad(d, t, np.zeros(3, np.float32))


def test_unsorted_t_and_negative_densities_are_errors():
    d, c, t, b = make_inputs(4, 6, 3)
    bad_t = t.copy()
    bad_t[2, 3], bad_t[2, 4] = t[2, 4], t[2, 3]
    with pytest.raises(tf.errors.InvalidArgumentError, match="non-decreasing.*t\\[2, 3\\]"):
        tfmo.volume_render(d, c, bad_t, b)
    with pytest.raises(tf.errors.InvalidArgumentError, match="non-decreasing.*t\\[2, 3\\]"):
        tfmo.distortion_loss(d, bad_t)
    bad_d = d.copy()
    bad_d[1, 2] = -0.5
    with pytest.raises(tf.errors.InvalidArgumentError, match="densities must be >= 0.*densities\\[1, 2\\]"):
        tfmo.volume_render(bad_d, c, t, b)


# ---------------------------------------------------------------------------------------------------------------
# Graph mode


def test_tf_function_with_unknown_batch():
    d, c, t, b = make_inputs(10, 12, 3, bg="shared")
    spec = [tf.TensorSpec([None, 12], tf.float32), tf.TensorSpec([None, 12, 3], tf.float32),
            tf.TensorSpec([None, 13], tf.float32), tf.TensorSpec([3], tf.float32)]

    @tf.function(input_signature=spec)
    def step(dens, cols, tt, bg):
        with tf.GradientTape() as tape:
            tape.watch([dens, cols, tt, bg])
            out = tfmo.volume_render(dens, cols, tt, bg, termination_threshold=0.01)
            assert out.color.shape.as_list() == [None, 3]
            assert out.weights.shape.as_list() == [None, 12]
            loss = tf.reduce_sum(out.color) + tf.reduce_mean(tfmo.distortion_loss(out.weights, tt))
        return (out, loss) + tuple(tape.gradient(loss, [dens, cols, tt, bg]))

    out, loss, *grads = step(d, c, t, b)
    assert_outputs_close(out, np_volume_render(d, c, t, b, 0.01))
    d32, c32, t32, b32 = (tf.constant(x) for x in (d, c, t, b))
    with tf.GradientTape() as tape:
        tape.watch([d32, c32, t32, b32])
        o = tfmo.volume_render(d32, c32, t32, b32, termination_threshold=0.01)
        eager_loss = tf.reduce_sum(o.color) + tf.reduce_mean(tfmo.distortion_loss(o.weights, t32))
    eager = tape.gradient(eager_loss, [d32, c32, t32, b32])
    np.testing.assert_allclose(loss.numpy(), eager_loss.numpy(), rtol=1e-6)
    for g, e in zip(grads, eager):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-6, atol=1e-7)


def test_graph_mode_shape_function_rejects_bad_rank():
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def f(x):
            return ops().distortion_loss(x, tf.zeros([3, 4]))
        f.get_concrete_function()


# ---------------------------------------------------------------------------------------------------------------
# The custom-loss example


def test_distortion_loss_example_runs():
    script = os.path.join(REPO, "examples", "distortion_loss_fit.py")
    res = subprocess.run([sys.executable, script, "--steps", "5", "--epochs", "2"], capture_output=True, text=True,
                         timeout=300, cwd="/tmp")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "distortion" in res.stdout and "nan" not in res.stdout.lower()
