"""Pure-TensorFlow ``volume_render_packed`` and ``distortion_loss_packed``."""

from __future__ import annotations

import tensorflow as tf

from tf_metal_ops.render.ops import VolumeRenderResult

# Plain TensorFlow (segment ops; the speed baseline, float32 or float64). O(N); per-ray exclusive sums are a global
# cumsum minus its value at the ray's first sample, accumulated in float64 so that float32 keeps its accuracy on
# long batches. No input validation (garbage row_splits give garbage or a TF error).


def _segments(row_splits, n):
    """Ray index of every sample [N], the number of rays R, and each sample's ray start [N]."""
    row_splits = tf.cast(tf.convert_to_tensor(row_splits), tf.int32)
    r = tf.shape(row_splits)[0] - 1
    # seg[k] = #{r >= 1: row_splits[r] <= k}: ray ends scattered onto samples, then a cumsum (O(N + R); XLA compiles
    # it, unlike searchsorted, which XLA lowers to an [N, R] comparison)
    ends = tf.math.unsorted_segment_sum(tf.ones_like(row_splits[1:]), row_splits[1:], n + 1)[:n]
    return row_splits, tf.cumsum(ends), r


def _segment_exclusive_cumsum(x, row_splits, seg):
    x64 = tf.cast(x, tf.float64)
    c = tf.concat([tf.zeros([1], tf.float64), tf.cumsum(x64)], 0)  # c[k] = sum_{j<k} x_j, [N+1]
    return tf.cast(c[:-1] - tf.gather(tf.gather(c, row_splits[:-1]), seg), x.dtype)


def volume_render_packed_tf(densities, colors, t_starts, t_ends, row_splits, background=None, *,
                            termination_threshold=0.0):
    """``volume_render_packed`` in plain TF ops; autodiff gives the gradients.

    Example (the op's inputs and results; float64 inputs compute in float64):
      >>> import numpy as np, tf_metal_ops
      >>> samples = ([1.0, 2.0, 0.5], [[0.2, 0.4, 0.6]] * 3, [0.0, 0.5, 0.2], [0.5, 1.0, 0.7])  # sigma, rgb, t0, t1
      >>> out = tf_metal_ops.volume_render_packed_tf(*samples, row_splits=[0, 2, 3])
      >>> op = tf_metal_ops.volume_render_packed(*samples, row_splits=[0, 2, 3])
      >>> bool(np.allclose(out.weights.numpy(), op.weights.numpy(), atol=1e-6))
      True
      >>> sigma64 = np.asarray(samples[0], np.float64)
      >>> tf_metal_ops.volume_render_packed_tf(sigma64, *samples[1:], row_splits=[0, 2, 3]).opacity.dtype
      tf.float64
    """
    densities = tf.convert_to_tensor(densities)
    dt = densities.dtype
    colors = tf.convert_to_tensor(colors, dtype=dt)
    t_starts = tf.convert_to_tensor(t_starts, dtype=dt)
    t_ends = tf.convert_to_tensor(t_ends, dtype=dt)
    row_splits, seg, r = _segments(row_splits, tf.shape(densities)[0])
    tau = densities * (t_ends - t_starts)
    alpha = -tf.math.expm1(-tau)
    trans = tf.exp(-_segment_exclusive_cumsum(tau, row_splits, seg))
    if termination_threshold > 0:
        keep = tf.cast(trans >= termination_threshold, dt)  # T is non-increasing along a ray
        tau = tau * keep
        alpha = alpha * keep
    weights = trans * alpha
    total = tf.math.unsorted_segment_sum(tau, seg, r)
    t_final = tf.exp(-total)
    color = tf.math.unsorted_segment_sum(weights[:, None] * colors, seg, r)
    if background is not None:
        background = tf.convert_to_tensor(background, dtype=dt)
        color += t_final[:, None] * (background[None, :] if background.shape.rank == 1 else background)
    depth = tf.math.unsorted_segment_sum(weights * 0.5 * (t_starts + t_ends), seg, r)
    opacity = -tf.math.expm1(-total)
    return VolumeRenderResult(color, depth, opacity, weights)


def distortion_loss_packed_tf(weights, t_starts, t_ends, row_splits):
    """``distortion_loss_packed`` in plain TF ops (per-ray exclusive cumsums, no pair tensor).

    Example:
      >>> import numpy as np, tf_metal_ops
      >>> row_splits = [0, 2, 3]  # ray 0 has samples 0 and 1, ray 1 has sample 2
      >>> t_starts, t_ends = [0.0, 0.5, 0.2], [0.5, 1.0, 0.7]
      >>> print(np.round(tf_metal_ops.distortion_loss_packed_tf([0.3935, 0.3834, 0.2212], t_starts, t_ends, row_splits).numpy(), 4))
      [0.2012 0.0082]
    """
    weights = tf.convert_to_tensor(weights)
    dt = weights.dtype
    t_starts = tf.convert_to_tensor(t_starts, dtype=dt)
    t_ends = tf.convert_to_tensor(t_ends, dtype=dt)
    row_splits, seg, r = _segments(row_splits, tf.shape(weights)[0])
    m = 0.5 * (t_starts + t_ends)
    w_before = _segment_exclusive_cumsum(weights, row_splits, seg)
    wm_before = _segment_exclusive_cumsum(weights * m, row_splits, seg)
    per_sample = 2.0 * weights * (m * w_before - wm_before) + weights * weights * (t_ends - t_starts) / 3.0
    return tf.math.unsorted_segment_sum(per_sample, seg, r)
