"""tf-metal-ops: TensorFlow custom ops with Metal (Mac GPU) and multithreaded CPU kernels.

The op library is compiled at install time (``pip install .``) against TensorFlow's C API, so one binary
loads in every TensorFlow >= 2.16. ``library_path()`` gives its path for ``tf.load_op_library``.
"""

from tf_metal_ops import _env, diagnostics
from tf_metal_ops._library import OpLibraryError, library_path
from tf_metal_ops._library import ops as _ops
from tf_metal_ops._version import __version__
from tf_metal_ops.contraction import contract, contract_to_unit
from tf_metal_ops.diagnostics import backend_info
from tf_metal_ops.fused_mlp import FusedMLP, fused_mlp, fused_mlp_layout, fused_mlp_tf
from tf_metal_ops.hash_grid import HashGridConfig, HashGridEncoding
from tf_metal_ops.hash_grid.config import hash_grid_table_layout
from tf_metal_ops.hash_grid.ops import hash_grid_encode
from tf_metal_ops.inline_kernels import KernelCompileError, MetalKernel, ShaderLibrary, compile_shader, metal_kernel
from tf_metal_ops.inline_kernels import build as _inline_build
from tf_metal_ops.inline_kernels.trust import enable_unsafe_kernel_loading, trust_kernel
from tf_metal_ops.occupancy import OccupancyGrid, RayMarchResult, ray_march, ray_march_tf
from tf_metal_ops.render import (
    VolumeRenderResult,
    distortion_loss,
    distortion_loss_tf,
    volume_render,
    volume_render_tf,
)
from tf_metal_ops.render_packed import (
    CulledSamples,
    cull_samples_packed,
    distortion_loss_packed,
    distortion_loss_packed_tf,
    volume_render_packed,
    volume_render_packed_tf,
)
from tf_metal_ops.threads import get_num_threads, num_threads, set_num_threads
from tf_metal_ops.zero_out import zero_out

__all__ = [
    "FusedMLP",
    "HashGridConfig",
    "HashGridEncoding",
    "KernelCompileError",
    "MetalKernel",
    "OccupancyGrid",
    "OpLibraryError",
    "RayMarchResult",
    "CulledSamples",
    "ShaderLibrary",
    "VolumeRenderResult",
    "__version__",
    "backend_info",
    "compile_shader",
    "contract",
    "contract_to_unit",
    "cull_samples_packed",
    "distortion_loss",
    "distortion_loss_packed",
    "distortion_loss_packed_tf",
    "distortion_loss_tf",
    "enable_unsafe_kernel_loading",
    "fused_mlp",
    "fused_mlp_layout",
    "fused_mlp_tf",
    "get_num_threads",
    "hash_grid_encode",
    "hash_grid_table_layout",
    "library_path",
    "metal_kernel",
    "num_threads",
    "ray_march",
    "ray_march_tf",
    "set_num_threads",
    "trust_kernel",
    "volume_render",
    "volume_render_packed",
    "volume_render_packed_tf",
    "volume_render_tf",
    "zero_out",
]

# Load the op library now when it is installed, so `import tf_metal_ops` is all a process needs before
# tf.saved_model.load of a graph containing the ops (their gradients are registered by the imports above).
# Without the library the package still imports (the Keras layer then falls back to pure TF).
try:
    _ops()
except OpLibraryError:
    pass

# TF_METAL_OPS_EMULATED_GPU=1: the emulated GPU (development and tests; tf_metal_ops/emulated_gpu), imported only then.
_env.adopt_deprecated_names()
if _env.emulated_gpu_request() is not None:
    from tf_metal_ops import emulated_gpu

    emulated_gpu.enable()

# Inline kernels (metal_kernel) compile on first use through a callback the op libraries call; registering it now
# lets a graph or SavedModel holding such a kernel run in a new process after `import tf_metal_ops` alone.
try:
    _inline_build.ensure_registered()
except OpLibraryError:
    pass

# Submodules of features a process may not use load on first access (`tf_metal_ops.emulated_gpu.enabled()`).
_LAZY_SUBMODULES = ("doctor", "emulated_gpu", "extension", "metal_sources", "msl_check", "msl_emu")


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    if name == "backend":
        # The former name of the diagnostics module ("backend" names the GPU backends, metal and direct): the same
        # module object, with a DeprecationWarning (tf_metal_ops/backend.py does the same for `import ...backend`).
        import warnings

        warnings.warn("tf_metal_ops.backend is deprecated: use tf_metal_ops.diagnostics (the same module)",
                      DeprecationWarning, stacklevel=2)
        return diagnostics
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
