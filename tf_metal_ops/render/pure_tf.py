"""Pure-TensorFlow ``volume_render`` and ``distortion_loss``: the oracle and the speed baseline (float32 or float64)."""

from __future__ import annotations

import tensorflow as tf

from tf_metal_ops.render.ops import VolumeRenderResult


def volume_render_tf(densities, colors, t, background=None, *, termination_threshold=0.0):
    """``volume_render`` in plain TF ops (exclusive cumsum + exp for transmittance); autodiff gives gradients.

    Example:
      >>> import numpy as np, tensorflow as tf, tf_metal_ops
      >>> densities = tf.constant([[1.0, 2.0, 0.5]])  # 1 ray, 3 samples
      >>> colors = tf.ones([1, 3, 3]) * [0.2, 0.4, 0.6]
      >>> t = tf.constant([[0.0, 0.5, 1.0, 1.5]])
      >>> out = tf_metal_ops.volume_render_tf(densities, colors, t)  # the same function as volume_render
      >>> print(np.round(out.weights.numpy(), 4), np.round(out.color.numpy(), 4))
      [[0.3935 0.3834 0.0494]] [[0.1652 0.3305 0.4957]]
    """
    densities = tf.convert_to_tensor(densities)
    colors = tf.convert_to_tensor(colors, dtype=densities.dtype)
    t = tf.convert_to_tensor(t, dtype=densities.dtype)
    delta = t[:, 1:] - t[:, :-1]
    tau = densities * delta
    alpha = -tf.math.expm1(-tau)
    cum = tf.math.cumsum(tau, axis=1, exclusive=True)
    trans = tf.exp(-cum)
    if termination_threshold > 0:
        # T is non-increasing along a ray, so "T_i >= threshold" is exactly "before the stop".
        keep = tf.cast(trans >= termination_threshold, tau.dtype)
        tau = tau * keep
        alpha = alpha * keep
    total = tf.reduce_sum(tau, axis=1)
    weights = trans * alpha
    t_final = tf.exp(-total)
    color = tf.reduce_sum(weights[:, :, None] * colors, axis=1)
    if background is not None:
        background = tf.convert_to_tensor(background, dtype=densities.dtype)
        color += t_final[:, None] * (background[None, :] if background.shape.rank == 1 else background)
    depth = tf.reduce_sum(weights * 0.5 * (t[:, 1:] + t[:, :-1]), axis=1)
    opacity = -tf.math.expm1(-total)
    return VolumeRenderResult(color, depth, opacity, weights)


def distortion_loss_tf(weights, t):
    """``distortion_loss`` in plain TF ops, O(S) per ray with exclusive cumsums (no [R, S, S] tensor).

    Example:
      >>> import numpy as np, tf_metal_ops
      >>> print(np.round(tf_metal_ops.distortion_loss_tf([[0.3935, 0.3834, 0.0494]], [[0.0, 0.5, 1.0, 1.5]]).numpy(), 4))
      [0.2594]
    """
    weights = tf.convert_to_tensor(weights)
    t = tf.convert_to_tensor(t, dtype=weights.dtype)
    m = 0.5 * (t[:, 1:] + t[:, :-1])
    delta = t[:, 1:] - t[:, :-1]
    w_before = tf.math.cumsum(weights, axis=1, exclusive=True)
    wm_before = tf.math.cumsum(weights * m, axis=1, exclusive=True)
    pairs = 2.0 * tf.reduce_sum(weights * (m * w_before - wm_before), axis=1)
    return pairs + tf.reduce_sum(weights * weights * delta, axis=1) / 3.0
