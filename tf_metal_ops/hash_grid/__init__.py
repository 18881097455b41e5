"""Multiresolution hash-grid encoding (Instant-NGP): config/table layout, the op, a Keras layer, and two
independent implementations (``reference``: NumPy float64; ``pure_tf``: plain TF ops). Conventions are documented
in ``tf_metal_ops.hash_grid.config`` and docs/hash_grid.md."""

from tf_metal_ops.hash_grid import pure_tf, reference
from tf_metal_ops.hash_grid.config import (
    HashGridConfig,
    HashGridTableLayout,
    hash_grid_table_layout,
    per_level_scale_from_finest_resolution,
)
from tf_metal_ops.hash_grid.layer import HashGridEncoding  # registers the Keras serializable
from tf_metal_ops.hash_grid.ops import hash_grid_encode, hash_grid_encode_params_grad  # registers the gradient

__all__ = [
    "HashGridConfig",
    "HashGridEncoding",
    "HashGridTableLayout",
    "hash_grid_encode",
    "hash_grid_encode_params_grad",
    "hash_grid_table_layout",
    "per_level_scale_from_finest_resolution",
    "pure_tf",
    "reference",
]
