"""Smoke test of an installed tf-metal-ops wheel in another TensorFlow (CI runs it under tensorflow-cpu 2.16).

It proves the one-binary-many-TF-versions claim: the library built against the newest TF loads here and its
ops compute the right values, gradients and graph-mode shapes. Exits non-zero on any failure.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_metal_ops  # noqa: E402

checks = []


def check(name, fn):
    try:
        fn()
        checks.append((name, None))
    except Exception as e:  # report every failure, then fail
        checks.append((name, f"{type(e).__name__}: {e}"))


def zero_out_values():
    y = tf_metal_ops.zero_out([[1, 2], [3, 4]]).numpy()
    assert y.tolist() == [[1, 0], [0, 0]], y
    module = tf.load_op_library(tf_metal_ops.library_path())
    assert module.zero_out(tf.constant([5.0, 6.0], tf.float16)).numpy().tolist() == [5.0, 0.0]


def zero_out_gradient():
    x = tf.constant([2.0, 3.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(tf_metal_ops.zero_out(x) * 4.0)
    assert tape.gradient(y, x).numpy().tolist() == [4.0, 0.0]


def zero_out_graph_mode():
    f = tf.function(tf_metal_ops.zero_out).get_concrete_function(tf.TensorSpec([None, 3], tf.int64))
    assert f.outputs[0].shape.as_list() == [None, 3]
    assert f(tf.constant([[7, 8, 9]], tf.int64)).numpy().tolist() == [[7, 0, 0]]


def hash_grid():
    from tf_metal_ops.hash_grid import reference

    rng = np.random.default_rng(0)
    cfg = dict(n_levels=4, n_features_per_level=2, log2_hashmap_size=8, base_resolution=4, per_level_scale=1.5)
    layout = tf_metal_ops.HashGridConfig(n_input_dims=3, **cfg)
    x = rng.random((64, 3), dtype=np.float32)
    params = rng.uniform(-1, 1, (layout.total_entries, 2)).astype(np.float32)
    xt, pt = tf.constant(x), tf.Variable(params)
    with tf.GradientTape() as tape:
        y = tf_metal_ops.hash_grid_encode(xt, pt, **cfg)
        loss = tf.reduce_sum(y * y)
    g = tape.gradient(loss, pt)
    ref = reference.encode(x, params.astype(np.float64), layout)
    np.testing.assert_allclose(y.numpy(), ref, atol=1e-5)
    g_ref = reference.grad_params(x, params.astype(np.float64), 2 * ref, layout)
    np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(), g_ref, atol=1e-4)


def render_ops():
    sigma = tf.constant([[0.0, 1.0, 2.0]])
    rgb = tf.ones([1, 3, 3])
    t = tf.constant([[2.0, 3.0, 4.0, 5.0]])
    out = tf_metal_ops.volume_render(sigma, rgb, t)
    expected_opacity = 1.0 - np.exp(-3.0)
    np.testing.assert_allclose(out.opacity.numpy(), [expected_opacity], rtol=1e-5)
    w = tf.constant([[0.2, 0.5, 0.3]])
    with tf.GradientTape() as tape:
        tape.watch(w)
        loss = tf_metal_ops.distortion_loss(w, t)
    np.testing.assert_allclose(loss.numpy(), tf_metal_ops.distortion_loss_tf(w, t).numpy(), rtol=1e-5)
    assert np.isfinite(tape.gradient(loss, w).numpy()).all()


for name, fn in [
    ("zero_out values", zero_out_values),
    ("zero_out gradient", zero_out_gradient),
    ("zero_out graph mode", zero_out_graph_mode),
    ("hash_grid_encode", hash_grid),
    ("volume_render", render_ops),
]:
    check(name, fn)

failed = [(n, e) for n, e in checks if e]
for n, e in checks:
    print(f"{'FAIL' if e else 'ok  '} {n}" + (f": {e}" if e else ""))
print(f"TensorFlow {tf.__version__}, library {tf_metal_ops.library_path()}")
print(f"{len(checks) - len(failed)} passed, {len(failed)} failed")
sys.exit(1 if failed else 0)
