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
from tf_metal_ops.hash_grid.layer import HashGridEncoding

__all__ = [
    "HashGridConfig",
    "HashGridEncoding",
    "HashGridTableLayout",
    "hash_grid_encode",
    "hash_grid_table_layout",
    "per_level_scale_from_finest_resolution",
    "pure_tf",
    "reference",
]


def __getattr__(name):
    # ops.py (the compiled op's wrapper) is imported on first use, so this package imports without it.
    if name == "hash_grid_encode":
        from tf_metal_ops.hash_grid.ops import hash_grid_encode

        return hash_grid_encode
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
