"""The process environment, read in one place: the ``TF_METAL_OPS_*`` switches, which Metal plugin is installed,
and where the package's sources and build cache are.

The package's layers, each importing only earlier ones (tests/test_import_graph.py checks there is no cycle):
  1. ``_env`` (this module), then the helpers built on the standard library and ``_env`` alone: ``_builder``,
     ``metal_sources``, ``msl_emu``, the ``msl_check`` package (which uses ``_builder``);
  2. ``_library``: finds and loads the op library;
  3. the op modules (``zero_out``, ``render``, ``hash_grid``, ...), ``emulated_gpu``, ``inline_kernels``,
     ``extension``;
  4. ``diagnostics`` (``backend_info``; ``tf_metal_ops.backend`` is its deprecated name), the package's ``__init__``,
     ``doctor``.

``import tf_metal_ops`` imports neither the emulated GPU nor the Metal-language check nor msl_emu: they load when a
feature asks for them (TF_METAL_OPS_EMULATED_GPU, the first inline kernel, the op kit).

A leaf module: standard library only. ``msl_emu`` and the ``msl_check`` package also run without the package's
``__init__`` (the development tools load them without TensorFlow), so they read their own switches
(``TF_METAL_OPS_CLANGXX``, ``TFMO_SOURCE_ROOT``) themselves.
"""

from __future__ import annotations

import importlib.metadata
import os
import warnings
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent

# ---- switches ----------------------------------------------------------------------------------------------------
LIBRARY = "TF_METAL_OPS_LIBRARY"  # the op library to load instead of the installed one
EMULATED_GPU = "TF_METAL_OPS_EMULATED_GPU"  # =1 or direct: the emulated GPU, direct backend; =DIR: a backend built there
EMULATED_GPU_COVERAGE = "TF_METAL_OPS_EMULATED_GPU_COVERAGE"  # =1: GPU host code built with source-based coverage
EMULATED_GPU_MEMORY_MB = "TF_METAL_OPS_EMULATED_GPU_MEMORY_MB"  # the emulated GPU's memory (read by the device)
EMULATED_GPU_WORKERS = "TF_METAL_OPS_EMULATED_GPU_WORKERS"  # threads that run kernel threads (read by kernel_launch.cc)
EMULATED_GPU_MSL = "TF_METAL_OPS_EMULATED_GPU_MSL"  # =2.4: the direct backend compiles the .metal files at MSL 2.4
NO_GPU_KERNELS = "TF_METAL_OPS_NO_GPU_KERNELS"  # =1: the op library registers no GPU kernels (read by tfc.cc)
CLANGXX = "TF_METAL_OPS_CLANGXX"  # the clang++ >= 16 to use (read by _builder.find_clangxx)
CACHE = "TF_METAL_OPS_CACHE"  # root of the build cache
UNSAFE_KERNEL_LOADING = "TF_METAL_OPS_UNSAFE_KERNEL_LOADING"  # =1: every inline-kernel source from a graph may run


# Old names of the emulated GPU's variables, still read (with a DeprecationWarning) when the new one is unset.
DEPRECATED = {
    "TF_METAL_OPS_EMU_COVERAGE": EMULATED_GPU_COVERAGE,
    "TF_METAL_OPS_EMU_MEMORY_MB": EMULATED_GPU_MEMORY_MB,
    "TF_METAL_OPS_EMU_WORKERS": EMULATED_GPU_WORKERS,
}


def adopt_deprecated_names() -> None:
    """For each old variable name set while its new name is not: warns once and sets the new name (the native code,
    which reads the new names first, sees it too)."""
    for old, new in DEPRECATED.items():
        if old in os.environ and new not in os.environ:
            warnings.warn(f"{old} is deprecated: use {new}", DeprecationWarning, stacklevel=3)
            os.environ[new] = os.environ[old]


def unsafe_kernel_loading() -> bool:
    """TF_METAL_OPS_UNSAFE_KERNEL_LOADING=1: inline kernels from graphs this process did not create may run."""
    return os.environ.get(UNSAFE_KERNEL_LOADING, "") == "1"


def library_override() -> str | None:
    return os.environ.get(LIBRARY) or None


def emulated_gpu_request() -> str | None:
    """What TF_METAL_OPS_EMULATED_GPU asks for: "direct" (=1 or =direct), "metal" (=metal), a backend directory
    (any other non-empty value), else None (unset, empty or 0)."""
    value = os.environ.get(EMULATED_GPU, "").strip()
    if value in ("", "0"):
        return None
    return {"1": "direct", "direct": "direct", "metal": "metal"}.get(value, value)


def emulated_gpu_coverage() -> bool:
    return os.environ.get(EMULATED_GPU_COVERAGE, "") == "1"


def emulated_gpu_msl() -> str:
    """The MSL version the direct backend compiles the kernels at: TF_METAL_OPS_EMULATED_GPU_MSL ("2.4" or "3.0"),
    default "3.0". ValueError for another value."""
    value = os.environ.get(EMULATED_GPU_MSL, "").strip() or "3.0"
    if value not in ("2.4", "3.0"):
        raise ValueError(f"{EMULATED_GPU_MSL}={value!r}: expected 2.4 or 3.0")
    return value


def clangxx() -> str | None:
    return os.environ.get(CLANGXX) or None


def no_gpu_kernels() -> bool:
    return os.environ.get(NO_GPU_KERNELS) == "1"


def disable_gpu_kernels() -> None:
    """Sets TF_METAL_OPS_NO_GPU_KERNELS=1 for the op library loaded after this call."""
    os.environ[NO_GPU_KERNELS] = "1"


# ---- installed distributions ---------------------------------------------------------------------------------
def distribution_version(dist: str) -> str | None:
    """The installed version of the distribution `dist`, or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


# The TF >= 2.20 community Metal plugin. Its stream (TF_GetStream) is a C++ struct, not an Objective-C object with
# tensorflow-metal's stream protocol, and kernels see `contents` addresses, not id<MTLBuffer>: messaging that stream
# crashes the process. It is detected by its installed distribution (no pointer is ever messaged) and the ops then
# stay on their CPU kernels.
COMMUNITY_METAL_PLUGINS = ("tensorflow-metal-plugin", "metal-pluggable-device")


def community_metal_plugin():
    """(distribution, version) of an installed community Metal plugin (TF >= 2.20), or None."""
    for dist in COMMUNITY_METAL_PLUGINS:
        v = distribution_version(dist)
        if v is not None:
            return dist, v
    return None


# ---- where things are ---------------------------------------------------------------------------------------
def cache_root() -> Path:
    """``$TF_METAL_OPS_CACHE``, else ``$XDG_CACHE_HOME/tf-metal-ops``, else ``~/.cache/tf-metal-ops``."""
    base = os.environ.get(CACHE) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "tf-metal-ops")
    return Path(base)


def source_roots() -> tuple[Path, Path]:
    """Where csrc/ and metal_kernels/ may be, in search order: the wheel's package data (tf_metal_ops/_sources), then
    the source checkout the package was installed from in editable mode."""
    return PACKAGE_DIR / "_sources", PACKAGE_DIR.parent


def source_root() -> Path | None:
    """The first of source_roots() that holds the emulated GPU's and msl_emu's sources, or None."""
    for root in source_roots():
        if (root / "csrc" / "emulated_gpu" / "direct_backend.cc").is_file() and (root / "csrc" / "msl_emu").is_dir():
            return root
    return None
