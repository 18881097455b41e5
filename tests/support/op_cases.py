"""One representative call per public op (forward, and backward where the op has a gradient), used by the
concurrency, fork and memory tests. A case is (inputs, fn): fixed seeded numpy inputs, and a function of the
input tensors returning a list of tensors, usable eagerly and inside tf.function. Repeated calls must agree
exactly."""

import numpy as np
import tensorflow as tf

import tf_metal_ops


def _zero_out():
    x = np.arange(1, 4097, dtype=np.float32).reshape(64, 64)
    return [x], lambda x: [tf_metal_ops.zero_out(x)]


def _rays(r=256, s=32, seed=0):
    rng = np.random.default_rng(seed)
    sigma = rng.gamma(1.0, 2.0, (r, s)).astype(np.float32)
    rgb = rng.random((r, s, 3), dtype=np.float32)
    t = np.sort(rng.uniform(2.0, 6.0, (r, s + 1)), axis=1).astype(np.float32)
    bg = rng.random(3, dtype=np.float32)
    return sigma, rgb, t, bg


def _volume_render():
    def fn(sigma, rgb, t, bg):
        with tf.GradientTape() as tape:
            tape.watch([sigma, rgb, bg])
            out = tf_metal_ops.volume_render(sigma, rgb, t, bg, termination_threshold=1e-3)
            loss = tf.reduce_sum(out.color**2) + tf.reduce_sum(out.depth) + tf.reduce_sum(out.weights**2)
        return [*out, *tape.gradient(loss, [sigma, rgb, bg])]

    return list(_rays()), fn


def _distortion_loss():
    sigma, _, t, _ = _rays(seed=1)
    w = (sigma / sigma.sum(axis=1, keepdims=True)).astype(np.float32)

    def fn(w, t):
        with tf.GradientTape() as tape:
            tape.watch([w, t])
            loss = tf_metal_ops.distortion_loss(w, t)
        return [loss, *tape.gradient(loss, [w, t])]

    return [w, t], fn


def _render_packed():
    """volume_render_packed and distortion_loss_packed with their gradients (ragged rays, some empty)."""
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 40, 200)
    rs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    n = int(rs[-1])
    edges = (2.0 + np.cumsum(rng.uniform(0.01, 0.1, 2 * n))).astype(np.float32)  # gaps between samples
    sigma = rng.gamma(1.0, 2.0, n).astype(np.float32)
    rgb = rng.random((n, 3), dtype=np.float32)
    bg = rng.random(3, dtype=np.float32)

    def fn(sigma, rgb, ts, te, rs, bg):
        with tf.GradientTape() as tape:
            tape.watch([sigma, rgb, ts, te, bg])
            out = tf_metal_ops.volume_render_packed(sigma, rgb, ts, te, rs, bg, termination_threshold=1e-3)
            dl = tf_metal_ops.distortion_loss_packed(out.weights, ts, te, rs)
            loss = tf.reduce_sum(out.color**2) + tf.reduce_sum(out.depth) + tf.reduce_sum(dl)
        return [*out, dl, *tape.gradient(loss, [sigma, rgb, ts, te, bg])]

    return [sigma, rgb, edges[0::2], edges[1::2], rs, bg], fn


HASH_GRID = dict(n_levels=8, n_features_per_level=2, log2_hashmap_size=12, base_resolution=4, per_level_scale=1.7)


def _hash_grid(dtype):
    def case():
        rng = np.random.default_rng(2)
        cfg = tf_metal_ops.HashGridConfig(n_input_dims=3, **HASH_GRID)
        x = rng.random((2048, 3), dtype=np.float32)
        params = rng.uniform(-1, 1, cfg.params_shape).astype(dtype)

        def fn(x, params):
            with tf.GradientTape() as tape:
                tape.watch([x, params])
                y = tf_metal_ops.hash_grid_encode(x, params, **HASH_GRID)
                loss = tf.reduce_sum(tf.cast(y, tf.float32) ** 2)
            return [y, *tape.gradient(loss, [x, params])]

        return [x, params], fn

    return case


CASES = {"zero_out": _zero_out, "hash_grid_f32": _hash_grid(np.float32), "hash_grid_f16": _hash_grid(np.float16), "volume_render": _volume_render, "distortion_loss": _distortion_loss,
         "render_packed": _render_packed}


def run_eager(name):
    inputs, fn = CASES[name]()
    return [t.numpy() for t in fn(*[tf.constant(a) for a in inputs])]
