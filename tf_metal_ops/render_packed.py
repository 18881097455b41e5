"""Packed (ragged) rendering ops: ``volume_render`` and ``distortion_loss`` for rays with different sample counts.

Convention. R rays, N samples in total, laid out ray after ray. Ray r owns samples k in
[row_splits[r], row_splits[r+1]) of ``row_splits`` int32 [R+1] (row_splits[0] = 0, non-decreasing,
row_splits[R] = N, as ``tf.RaggedTensor.from_row_splits``). Sample k covers [t_starts[k], t_ends[k]]; within a
ray samples are sorted and non-overlapping, t_starts[k] <= t_ends[k] <= t_starts[k+1] (gaps, e.g. skipped empty
space, are allowed). delta_k = t_ends[k] - t_starts[k], midpoint m_k = (t_starts[k] + t_ends[k]) / 2. The
quadrature, termination threshold and outputs are those of ``volume_render`` / ``distortion_loss``; on rays packed
uniformly (t_ends[k] = t_starts[k+1]) the results equal theirs up to float rounding. A ray with no samples gives
the background, depth 0 and opacity 0 (and distortion loss 0). R = 0 and N = 0 are fine.

Invalid input: row_splits not as above, t_starts[k] > t_ends[k], a sample overlapping its predecessor in the same
ray, or a negative density. The CPU kernels raise InvalidArgumentError. The Metal kernels cannot fail an op: when
row_splits is invalid every output (and gradient) of the call is NaN; otherwise a ray with invalid samples gets NaN
in all its outputs and gradients (as ``volume_render`` on Metal). NaN inputs propagate. Never an out-of-bounds
access, whatever row_splits holds.

Float tensors are float32 (NumPy/lists are converted; a TF tensor of another dtype is a ValueError); row_splits is
int32 (int64 is cast). Gradients: densities, colors, t_starts, t_ends, background (volume_render_packed) and
weights, t_starts, t_ends (distortion_loss_packed); all O(N). row_splits has none.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_metal_ops._library import ops
from tf_metal_ops.render import VolumeRenderResult, _check_dim, _check_rank, _check_threshold, _float32

__all__ = ["distortion_loss_packed", "distortion_loss_packed_tf", "volume_render_packed",
           "volume_render_packed_tf"]


def _row_splits(x, fn):
    if not tf.is_tensor(x):  # NumPy arrays and lists: integers only (no silent float -> int conversion)
        a = np.asarray(x)
        if a.size and not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"{fn}: row_splits must be int32 (or int64), got {a.dtype}")
        x = tf.convert_to_tensor(a.astype(np.int64) if a.size else a.astype(np.int32))
    if x.dtype == tf.int64:
        x = tf.cast(x, tf.int32)
    if x.dtype != tf.int32:
        raise ValueError(f"{fn}: row_splits must be int32 (or int64), got {x.dtype.name}")
    _check_rank(x, 1, fn, "row_splits", "[rays + 1]")
    if x.shape.rank == 1 and x.shape[0] == 0:
        raise ValueError(f"{fn}: row_splits needs at least one entry (R + 1 for R rays), got shape {x.shape}")
    return x


def _check_intervals(fn, t_starts, t_ends, n):
    _check_rank(t_starts, 1, fn, "t_starts", "[samples]")
    _check_rank(t_ends, 1, fn, "t_ends", "[samples]")
    if t_starts.shape.rank == 1:
        _check_dim(fn, "t_starts.shape[0] (samples)", t_starts.shape[0], n)
    if t_ends.shape.rank == 1:
        _check_dim(fn, "t_ends.shape[0] (samples)", t_ends.shape[0], n)


def _num_rays(row_splits):
    return None if row_splits.shape.rank != 1 or row_splits.shape[0] is None else row_splits.shape[0] - 1


def volume_render_packed(densities, colors, t_starts, t_ends, row_splits, background=None, *,
                         termination_threshold=0.0, name=None):
    """Alpha-composites packed (ragged) samples along rays in one fused kernel (see the module docstring).

    Args:
      densities: [N] float32, >= 0.
      colors: [N, C] float32, any C >= 1.
      t_starts, t_ends: [N] float32 sample intervals, sorted and non-overlapping within each ray.
      row_splits: [R+1] int32; ray r owns samples row_splits[r] .. row_splits[r+1] - 1.
      background: None (composite over black), [C] shared by all rays, or [R, C] per ray.
      termination_threshold: in [0, 1], as in ``volume_render``.

    Returns:
      VolumeRenderResult(color [R, C], depth [R], opacity [R], weights [N]).
    """
    fn = "volume_render_packed"
    thr = _check_threshold(fn, termination_threshold)
    densities = _float32(densities, fn, "densities")
    colors = _float32(colors, fn, "colors")
    t_starts = _float32(t_starts, fn, "t_starts")
    t_ends = _float32(t_ends, fn, "t_ends")
    row_splits = _row_splits(row_splits, fn)
    _check_rank(densities, 1, fn, "densities", "[samples]")
    _check_rank(colors, 2, fn, "colors", "[samples, channels]")
    n = densities.shape[0] if densities.shape.rank == 1 else None
    c = colors.shape[1] if colors.shape.rank == 2 else None
    if colors.shape.rank == 2:
        _check_dim(fn, "colors.shape[0] (samples)", colors.shape[0], n)
        if c is not None and c < 1:
            raise ValueError(f"{fn}: colors needs at least one channel, got shape {colors.shape}")
    _check_intervals(fn, t_starts, t_ends, n)
    r = _num_rays(row_splits)
    if background is not None:
        background = _float32(background, fn, "background")
        if background.shape.rank == 1:
            _check_dim(fn, "background.shape[0] (channels)", background.shape[0], c)
        elif background.shape.rank == 2:
            _check_dim(fn, "background.shape[0] (rays)", background.shape[0], r)
            _check_dim(fn, "background.shape[1] (channels)", background.shape[1], c)
        elif background.shape.rank is not None:
            raise ValueError(f"{fn}: background must have shape [C] or [rays, C], got {background.shape}")
    else:
        background = tf.zeros([0], tf.float32)  # the op's "no background" convention
    out = ops().volume_render_packed(densities, colors, t_starts, t_ends, row_splits, background,
                                     termination_threshold=thr, name=name)
    return VolumeRenderResult(*out)


@tf.RegisterGradient("VolumeRenderPacked")
def _volume_render_packed_grad(op, g_color, g_depth, g_opacity, g_weights):
    grads = [g if g is not None else tf.zeros_like(out) for g, out in zip(
        (g_color, g_depth, g_opacity, g_weights), op.outputs)]
    g_dens, g_cols, g_ts, g_te, g_bg = ops().volume_render_packed_grad(
        *op.inputs, *grads, termination_threshold=op.get_attr("termination_threshold"))
    background = op.inputs[5]
    if background.shape.rank == 2:
        g_background = g_bg
    else:  # [C]: sum over rays; [0] (none): the [C] sum sliced to length 0
        g_background = tf.reduce_sum(g_bg, axis=0)[: tf.shape(background)[0]]
    return [g_dens, g_cols, g_ts, g_te, None, g_background]


def distortion_loss_packed(weights, t_starts, t_ends, row_splits, name=None):
    """Per-ray mip-NeRF 360 distortion loss of packed samples, [R] (see ``distortion_loss``; gaps between samples
    count as distance between midpoints). O(N) forward and backward; differentiable w.r.t. weights and t."""
    fn = "distortion_loss_packed"
    weights = _float32(weights, fn, "weights")
    t_starts = _float32(t_starts, fn, "t_starts")
    t_ends = _float32(t_ends, fn, "t_ends")
    row_splits = _row_splits(row_splits, fn)
    _check_rank(weights, 1, fn, "weights", "[samples]")
    _check_intervals(fn, t_starts, t_ends, weights.shape[0] if weights.shape.rank == 1 else None)
    return ops().distortion_loss_packed(weights, t_starts, t_ends, row_splits, name=name)


@tf.RegisterGradient("DistortionLossPacked")
def _distortion_loss_packed_grad(op, g_loss):
    g_w, g_ts, g_te = ops().distortion_loss_packed_grad(*op.inputs, g_loss)
    return [g_w, g_ts, g_te, None]


# ------------------------------------------------------------------------------------------------------------
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
    """``volume_render_packed`` in plain TF ops; autodiff gives the gradients."""
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
    """``distortion_loss_packed`` in plain TF ops (per-ray exclusive cumsums, no pair tensor)."""
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
