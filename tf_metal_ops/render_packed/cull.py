"""``cull_samples_packed``: which packed samples a render needs, from their densities alone (nerfacc's
``render_visibility_from_alpha``, Instant-NGP's compaction before the expensive pass).

Plain TensorFlow over the packed layout of ``tf_metal_ops.render_packed`` (any device, no kernel of its own): a
segment cumsum for the transmittance, a mask, and the compacted indices and row splits.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import tensorflow as tf

from tf_metal_ops._args import _check_rank, _float32
from tf_metal_ops.render_packed.ops import _check_intervals, _row_splits
from tf_metal_ops.render_packed.pure_tf import _segments


class CulledSamples(NamedTuple):
    """``cull_samples_packed``'s result: ``keep`` bool [N] (the samples kept), ``indices`` int32 [M] (their
    positions in the input, increasing: ``tf.gather(x, indices)`` compacts any per-sample tensor) and
    ``row_splits`` int32 [R+1] (the kept samples' rays, the packed convention)."""

    keep: tf.Tensor
    indices: tf.Tensor
    row_splits: tf.Tensor


def _check_fraction(fn, name, v):
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (0.0 <= float(v) < 1.0):
        raise ValueError(f"{fn}: {name} must be a number in [0, 1), got {v!r}")
    return float(v)


def cull_samples_packed(densities, t_starts, t_ends, row_splits, *, early_stop_eps=1e-4, alpha_threshold=0.0,
                        name=None):
    """The packed samples that contribute to the render: sample k of a ray is kept when the transmittance in front
    of it, ``T_k = exp(-sum_{j<k} sigma_j delta_j)`` over the ray's samples before it (culled ones included), is at
    least ``early_stop_eps``, and its opacity ``alpha_k = 1 - exp(-sigma_k delta_k)`` is at least
    ``alpha_threshold`` (``delta_k = t_ends[k] - t_starts[k]``; nerfacc's ``early_stop_eps`` and ``alpha_thre``).

    Typical use: evaluate the density alone, without gradient, at every marched sample; cull; run the full field
    with gradients on the kept samples only and composite them with ``volume_render_packed`` (their weights differ
    from the uncut render's by at most the culled samples' share: a few ``alpha_threshold`` per ray, plus
    ``early_stop_eps`` of light behind the cut).

    Args:
      densities: [N] float32, >= 0 (a NaN sample is culled when either threshold is on).
      t_starts, t_ends: [N] float32 sample intervals, the layout of ``volume_render_packed``.
      row_splits: [R+1] int32 (or int64); ray r owns samples row_splits[r] .. row_splits[r+1] - 1.
      early_stop_eps: in [0, 1); 0 keeps every sample's transmittance.
      alpha_threshold: in [0, 1); 0 keeps every opacity.

    Returns:
      CulledSamples(keep [N] bool, indices [M] int32, row_splits [R+1] int32). No gradient.

    Example:
      >>> import tf_metal_ops
      >>> row_splits = [0, 3, 5]  # ray 0 hits a wall at its second sample; ray 1 has a faint first sample
      >>> sigma, t0, t1 = [1.0, 50.0, 1.0, 0.001, 2.0], [0.0, 0.5, 1.0, 0.0, 0.5], [0.5, 1.0, 1.5, 0.5, 1.0]
      >>> out = tf_metal_ops.cull_samples_packed(sigma, t0, t1, row_splits, early_stop_eps=1e-4,
      ...                                        alpha_threshold=0.01)
      >>> out.indices.numpy().tolist(), out.row_splits.numpy().tolist()
      ([0, 1, 4], [0, 2, 3])
    """
    fn = "cull_samples_packed"
    eps = _check_fraction(fn, "early_stop_eps", early_stop_eps)
    thr = _check_fraction(fn, "alpha_threshold", alpha_threshold)
    densities = _float32(densities, fn, "densities")
    t_starts = _float32(t_starts, fn, "t_starts")
    t_ends = _float32(t_ends, fn, "t_ends")
    row_splits = _row_splits(row_splits, fn)
    _check_rank(densities, 1, fn, "densities", "[samples]")
    _check_intervals(fn, t_starts, t_ends, densities.shape[0] if densities.shape.rank == 1 else None)
    with tf.name_scope(name or fn):
        densities, t_starts, t_ends = (tf.stop_gradient(x) for x in (densities, t_starts, t_ends))
        n = tf.shape(densities)[0]
        row_splits, seg, r = _segments(row_splits, n)
        tau = tf.cast(densities, tf.float64) * tf.cast(t_ends - t_starts, tf.float64)
        keep = tf.ones([n], tf.bool)
        if eps > 0.0:
            # exclusive per-ray sums: a global float64 cumsum minus its value at the ray's first sample
            c = tf.concat([tf.zeros([1], tf.float64), tf.cumsum(tau)], 0)
            before = c[:-1] - tf.gather(tf.gather(c, row_splits[:-1]), seg)
            keep = before <= -math.log(eps)
        if thr > 0.0:
            keep = tf.logical_and(keep, -tf.math.expm1(-tau) >= thr)
        if eps > 0.0 or thr > 0.0:
            keep = tf.logical_and(keep, tf.logical_not(tf.math.is_nan(tau)))
        indices = tf.cast(tf.where(keep)[:, 0], tf.int32)
        counts = tf.math.unsorted_segment_sum(tf.cast(keep, tf.int32), seg, r)
        new_splits = tf.concat([tf.zeros([1], tf.int32), tf.cumsum(counts)], 0)
        return CulledSamples(keep, indices, new_splits)
