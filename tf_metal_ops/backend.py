"""Deprecated name of ``tf_metal_ops.diagnostics``: importing it warns (DeprecationWarning) and gives that module
itself, so ``from tf_metal_ops.backend import cpu_paths`` keeps working and patches on either name see one module."""

import sys
import warnings

from tf_metal_ops import diagnostics

warnings.warn("tf_metal_ops.backend is deprecated: use tf_metal_ops.diagnostics (the same module)", DeprecationWarning,
              stacklevel=2)
sys.modules[__name__] = diagnostics
