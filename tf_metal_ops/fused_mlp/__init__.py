"""Fully fused MLP (tiny-cuda-nn's FullyFusedMLP): the op and its gradient, the parameter layout, a Keras layer, and
two independent implementations (``reference``: NumPy float64; ``pure_tf``: plain TF ops). Conventions:
``tf_metal_ops.fused_mlp.layout`` and docs/fused_mlp.md."""

from tf_metal_ops.fused_mlp import reference
from tf_metal_ops.fused_mlp.layer import FusedMLP  # registers the Keras serializable
from tf_metal_ops.fused_mlp.layout import ACTIVATIONS, FusedMlpLayout, fused_mlp_layout
from tf_metal_ops.fused_mlp.ops import fused_mlp  # registers the gradient
from tf_metal_ops.fused_mlp.pure_tf import fused_mlp_tf

__all__ = ["ACTIVATIONS", "FusedMLP", "FusedMlpLayout", "fused_mlp", "fused_mlp_layout", "fused_mlp_tf", "reference"]
