"""The rendering ops ``volume_render`` and ``distortion_loss`` and their gradients (conventions:
``tf_metal_ops.render``; op definitions: csrc/ops/render_op.cc)."""

from __future__ import annotations

import collections

import tensorflow as tf

from tf_metal_ops._args import _check_background, _check_dim, _check_rank, _check_threshold, _float32
from tf_metal_ops._library import ops

VolumeRenderResult = collections.namedtuple("VolumeRenderResult", ["color", "depth", "opacity", "weights"])


def _check_volume_render_args(fn, densities, colors, t, background):
    _check_rank(densities, 2, fn, "densities", "[rays, samples]")
    _check_rank(colors, 3, fn, "colors", "[rays, samples, channels]")
    _check_rank(t, 2, fn, "t", "[rays, samples + 1]")
    r, s = (densities.shape.as_list() if densities.shape.rank == 2 else [None, None])
    if colors.shape.rank == 3:
        _check_dim(fn, "colors.shape[0] (rays)", colors.shape[0], r)
        _check_dim(fn, "colors.shape[1] (samples)", colors.shape[1], s)
        if colors.shape[2] is not None and colors.shape[2] < 1:
            raise ValueError(f"{fn}: colors needs at least one channel, got shape {colors.shape}")
    if t.shape.rank == 2:
        _check_dim(fn, "t.shape[0] (rays)", t.shape[0], r)
        _check_dim(fn, "t.shape[1] (samples + 1 interval edges)", t.shape[1], None if s is None else s + 1)
    c = colors.shape[2] if colors.shape.rank == 3 else None
    if background is not None:
        _check_background(fn, background, r, c)


def volume_render(densities, colors, t, background=None, *, termination_threshold=0.0, name=None):
    """Alpha-composites samples along rays (NeRF quadrature) in one fused kernel.

    Args:
      densities: [R, S] float32, >= 0 (after the density activation).
      colors: [R, S, C] float32, any C >= 1.
      t: [R, S+1] float32 interval edges, non-decreasing along each ray.
      background: None (composite over black), [C] shared by all rays, or [R, C] per ray.
      termination_threshold: in [0, 1]. A ray stops before the first sample whose transmittance T is below it
        (later samples get weight 0 and no gradient; the remaining T still shows the background). 0 disables it.

    Returns:
      VolumeRenderResult(color [R, C], depth [R], opacity [R], weights [R, S]) with
      alpha_i = 1 - exp(-density_i * delta_i), T_i = exp(-sum_{j<i} density_j delta_j), w_i = T_i alpha_i,
      color = sum_i w_i c_i + T_final * background, depth = sum_i w_i m_i (not normalised by opacity),
      opacity = 1 - T_final.

    Differentiable w.r.t. densities, colors, t and background (one O(S)-per-ray gradient kernel).

    Example:
      >>> import numpy as np, tensorflow as tf, tf_metal_ops
      >>> densities = tf.constant([[1.0, 2.0, 0.5]])  # 1 ray, 3 samples
      >>> colors = tf.ones([1, 3, 3]) * [0.2, 0.4, 0.6]
      >>> t = tf.constant([[0.0, 0.5, 1.0, 1.5]])
      >>> out = tf_metal_ops.volume_render(densities, colors, t, background=[1.0, 1.0, 1.0])
      >>> print(np.round(out.weights.numpy(), 4), np.round(out.opacity.numpy(), 4))
      [[0.3935 0.3834 0.0494]] [0.8262]
      >>> print(np.round(out.color.numpy(), 4))
      [[0.339  0.5043 0.6695]]
    """
    fn = "volume_render"
    thr = _check_threshold(fn, termination_threshold)
    densities = _float32(densities, fn, "densities")
    colors = _float32(colors, fn, "colors")
    t = _float32(t, fn, "t")
    if background is not None:
        background = _float32(background, fn, "background")
    _check_volume_render_args(fn, densities, colors, t, background)
    if background is None:
        background = tf.zeros([0], tf.float32)  # the op's "no background" convention
    out = ops().volume_render(densities, colors, t, background, termination_threshold=thr, name=name)
    return VolumeRenderResult(*out)


@tf.RegisterGradient("VolumeRender")
def _volume_render_grad(op, g_color, g_depth, g_opacity, g_weights):
    grads = [g if g is not None else tf.zeros_like(out) for g, out in zip(
        (g_color, g_depth, g_opacity, g_weights), op.outputs)]
    g_dens, g_cols, g_t, g_bg = ops().volume_render_grad(
        *op.inputs, *grads, termination_threshold=op.get_attr("termination_threshold"))
    background = op.inputs[3]
    if background.shape.rank == 2:
        g_background = g_bg
    else:  # [C]: sum over rays; [0] (none): slicing the [C] sum to length 0 gives the empty gradient
        g_background = tf.reduce_sum(g_bg, axis=0)[: tf.shape(background)[0]]
    return [g_dens, g_cols, g_t, g_background]


def distortion_loss(weights, t, name=None):
    """Per-ray mip-NeRF 360 distortion loss, [R]: sum_{i,j} w_i w_j |m_i - m_j| + (1/3) sum_i w_i^2 delta_i.

    Args:
      weights: [R, S] float32 (e.g. ``volume_render(...).weights``).
      t: [R, S+1] float32 interval edges, non-decreasing along each ray (m_i are the interval midpoints).

    O(S) per ray forward and backward (prefix sums, no O(S^2) pair sum). Differentiable w.r.t. weights and t.
    Reduce it yourself, e.g. ``tf.reduce_mean(distortion_loss(w, t))``.

    Example:
      >>> import numpy as np, tf_metal_ops
      >>> weights = [[0.3935, 0.3834, 0.0494]]
      >>> t = [[0.0, 0.5, 1.0, 1.5]]
      >>> print(np.round(tf_metal_ops.distortion_loss(weights, t).numpy(), 4))
      [0.2594]
    """
    fn = "distortion_loss"
    weights = _float32(weights, fn, "weights")
    t = _float32(t, fn, "t")
    _check_rank(weights, 2, fn, "weights", "[rays, samples]")
    _check_rank(t, 2, fn, "t", "[rays, samples + 1]")
    if weights.shape.rank == 2 and t.shape.rank == 2:
        _check_dim(fn, "t.shape[0] (rays)", t.shape[0], weights.shape[0])
        s = weights.shape[1]
        _check_dim(fn, "t.shape[1] (samples + 1 interval edges)", t.shape[1], None if s is None else s + 1)
    return ops().distortion_loss(weights, t, name=name)


@tf.RegisterGradient("DistortionLoss")
def _distortion_loss_grad(op, g_loss):
    g_w, g_t = ops().distortion_loss_grad(op.inputs[0], op.inputs[1], g_loss)
    return [g_w, g_t]
