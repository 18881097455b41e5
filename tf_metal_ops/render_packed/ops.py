"""The packed rendering ops ``volume_render_packed`` and ``distortion_loss_packed`` and their gradients
(conventions: ``tf_metal_ops.render_packed``; op definitions: csrc/ops/render_packed_op.cc)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_metal_ops._args import _check_background, _check_dim, _check_rank, _check_threshold, _float32
from tf_metal_ops._library import ops
from tf_metal_ops.render.ops import VolumeRenderResult


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

    Example:
      >>> import numpy as np, tf_metal_ops
      >>> row_splits = [0, 2, 3]  # ray 0 has samples 0 and 1, ray 1 has sample 2
      >>> t_starts, t_ends = [0.0, 0.5, 0.2], [0.5, 1.0, 0.7]
      >>> out = tf_metal_ops.volume_render_packed([1.0, 2.0, 0.5], [[0.2, 0.4, 0.6]] * 3, t_starts, t_ends, row_splits)
      >>> print(np.round(out.weights.numpy(), 4), np.round(out.opacity.numpy(), 4))
      [0.3935 0.3834 0.2212] [0.7769 0.2212]
      >>> out.color.shape
      TensorShape([2, 3])
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
        _check_background(fn, background, r, c)
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
    count as distance between midpoints). O(N) forward and backward; differentiable w.r.t. weights and t.

    Example:
      >>> import numpy as np, tf_metal_ops
      >>> row_splits = [0, 2, 3]  # ray 0 has samples 0 and 1, ray 1 has sample 2
      >>> t_starts, t_ends = [0.0, 0.5, 0.2], [0.5, 1.0, 0.7]
      >>> weights = [0.3935, 0.3834, 0.2212]
      >>> print(np.round(tf_metal_ops.distortion_loss_packed(weights, t_starts, t_ends, row_splits).numpy(), 4))
      [0.2012 0.0082]
    """
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
