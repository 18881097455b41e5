"""NeRF rendering ops: fused volume rendering (alpha compositing along rays) and the mip-NeRF 360 distortion loss.

Both run as one custom kernel per direction (forward and gradient) instead of chains of small TF ops; the
gradient kernels are O(S) per ray. ``volume_render_tf`` and ``distortion_loss_tf`` are the same math in plain
TensorFlow (the test oracle and the speed baseline; they also accept float64).

Conventions (both ops). A batch has R rays of S samples; sample i of a ray covers [t_i, t_{i+1}] of the interval
edges ``t`` [R, S+1], with delta_i = t_{i+1} - t_i and midpoint m_i = (t_i + t_{i+1}) / 2. ``t`` must be
non-decreasing along each ray and densities must be >= 0: the CPU kernels raise InvalidArgumentError otherwise; the
Metal kernels (which cannot fail an op from the GPU) return NaN for every output of an offending ray.
All tensors are float32 (NumPy arrays and Python lists are converted; a TF tensor of another dtype is a ValueError).
"""

from __future__ import annotations

import collections
import numbers

import tensorflow as tf

from tf_metal_ops._library import ops

VolumeRenderResult = collections.namedtuple("VolumeRenderResult", ["color", "depth", "opacity", "weights"])


def _float32(x, fn, name):
    x = tf.convert_to_tensor(x, dtype_hint=tf.float32)
    if x.dtype != tf.float32:
        raise ValueError(f"{fn}: {name} must be float32, got {x.dtype.name} (cast it with tf.cast)")
    return x


def _check_rank(x, rank, fn, name, layout):
    if x.shape.rank is not None and x.shape.rank != rank:
        raise ValueError(f"{fn}: {name} must have rank {rank} {layout}, got shape {x.shape}")


def _check_dim(fn, what, got, want):
    if got is not None and want is not None and got != want:
        raise ValueError(f"{fn}: {what} is {got}, expected {want}")


def _check_threshold(fn, thr):
    if isinstance(thr, bool) or not isinstance(thr, numbers.Real) or not (0.0 <= float(thr) <= 1.0):
        raise ValueError(f"{fn}: termination_threshold must be a number in [0, 1], got {thr!r}")
    return float(thr)


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
        if background.shape.rank == 1:
            _check_dim(fn, "background.shape[0] (channels)", background.shape[0], c)
        elif background.shape.rank == 2:
            _check_dim(fn, "background.shape[0] (rays)", background.shape[0], r)
            _check_dim(fn, "background.shape[1] (channels)", background.shape[1], c)
        elif background.shape.rank is not None:
            raise ValueError(f"{fn}: background must have shape [C] or [rays, C], got {background.shape}")


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


# ------------------------------------------------------------------------------------------------------------
# Pure-TensorFlow implementations: the oracle and the speed baseline (float32 or float64).


def volume_render_tf(densities, colors, t, background=None, *, termination_threshold=0.0):
    """``volume_render`` in plain TF ops (exclusive cumsum + exp for transmittance); autodiff gives gradients."""
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
    """``distortion_loss`` in plain TF ops, O(S) per ray with exclusive cumsums (no [R, S, S] tensor)."""
    weights = tf.convert_to_tensor(weights)
    t = tf.convert_to_tensor(t, dtype=weights.dtype)
    m = 0.5 * (t[:, 1:] + t[:, :-1])
    delta = t[:, 1:] - t[:, :-1]
    w_before = tf.math.cumsum(weights, axis=1, exclusive=True)
    wm_before = tf.math.cumsum(weights * m, axis=1, exclusive=True)
    pairs = 2.0 * tf.reduce_sum(weights * (m * w_before - wm_before), axis=1)
    return pairs + tf.reduce_sum(weights * weights * delta, axis=1) / 3.0
