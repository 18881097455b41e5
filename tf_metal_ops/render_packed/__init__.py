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

The package: ``ops`` (the op wrappers and their gradients), ``pure_tf`` (segment ops in plain TensorFlow),
``cull`` (``cull_samples_packed``: the samples a render needs, from their densities, before the expensive pass) and
``reference`` (NumPy float64, written from the definitions).
"""

from tf_metal_ops.render_packed import pure_tf, reference
from tf_metal_ops.render_packed.cull import CulledSamples, cull_samples_packed
from tf_metal_ops.render_packed.ops import distortion_loss_packed, volume_render_packed  # registers the gradients
from tf_metal_ops.render_packed.pure_tf import distortion_loss_packed_tf, volume_render_packed_tf

__all__ = ["CulledSamples", "cull_samples_packed", "distortion_loss_packed", "distortion_loss_packed_tf", "pure_tf",
           "reference", "volume_render_packed", "volume_render_packed_tf"]
