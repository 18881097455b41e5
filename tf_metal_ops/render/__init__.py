"""NeRF rendering ops: fused volume rendering (alpha compositing along rays) and the mip-NeRF 360 distortion loss.

Both run as one custom kernel per direction (forward and gradient) instead of chains of small TF ops; the
gradient kernels are O(S) per ray. ``volume_render_tf`` and ``distortion_loss_tf`` are the same math in plain
TensorFlow (the test oracle and the speed baseline; they also accept float64).

Conventions (both ops). A batch has R rays of S samples; sample i of a ray covers [t_i, t_{i+1}] of the interval
edges ``t`` [R, S+1], with delta_i = t_{i+1} - t_i and midpoint m_i = (t_i + t_{i+1}) / 2. ``t`` must be
non-decreasing along each ray and densities must be >= 0: the CPU kernels raise InvalidArgumentError otherwise; the
Metal kernels (which cannot fail an op from the GPU) return NaN for every output of an offending ray.
All tensors are float32 (NumPy arrays and Python lists are converted; a TF tensor of another dtype is a ValueError).

The package: ``ops`` (the op wrappers and their gradients), ``pure_tf`` (the same math in plain TensorFlow) and
``reference`` (NumPy float64, written from the definitions).
"""

from tf_metal_ops.render import pure_tf, reference
from tf_metal_ops.render.ops import VolumeRenderResult, distortion_loss, volume_render  # registers the gradients
from tf_metal_ops.render.pure_tf import distortion_loss_tf, volume_render_tf

__all__ = ["VolumeRenderResult", "distortion_loss", "distortion_loss_tf", "pure_tf", "reference", "volume_render",
           "volume_render_tf"]
