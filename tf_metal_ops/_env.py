"""The process environment, read in one place: the ``TF_METAL_OPS_*`` switches, which Metal plugin is installed,
and where the package's sources and build cache are.

The package's layers, each importing only earlier ones (tests/test_import_graph.py checks there is no cycle):
  1. ``_env`` (this module), then the helpers built on the standard library and ``_env`` alone: ``_builder``, the
     ``msl_check`` package (which uses ``_builder``), ``emulated_gpu/glue``;
  2. ``_library``: finds and loads the op library;
  3. the op modules (``zero_out``, ``render``, ``hash_grid``, ...), ``emulated_gpu``, ``inline_kernels``,
     ``extension``;
  4. ``diagnostics`` (``backend_info``; also importable as ``tf_metal_ops.backend``), the package's ``__init__``,
     ``doctor``.

A leaf module: standard library only. ``emulated_gpu/glue.py`` is also loaded by path by tools and tests, so it reads
its own switch (``TFMO_SOURCE_ROOT``) itself. ``msl_check`` runs without the package's ``__init__`` (dev/check_msl.py
loads it without TensorFlow): it imports only ``_builder`` and this module.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent

# ---- switches ----------------------------------------------------------------------------------------------------
LIBRARY = "TF_METAL_OPS_LIBRARY"  # the op library to load instead of the installed one
EMULATED_GPU = "TF_METAL_OPS_EMULATED_GPU"  # =1: the emulated GPU; =metal: the Metal backend over Apple's doubles
OBJC_RUNTIME = "TF_METAL_OPS_OBJC_RUNTIME"  # libobjc2 (directory or .tgz) for EMULATED_GPU=metal
EMU_COVERAGE = "TF_METAL_OPS_EMU_COVERAGE"  # =1: GPU host code built with clang source-based coverage
NO_GPU_KERNELS = "TF_METAL_OPS_NO_GPU_KERNELS"  # =1: the op library registers no GPU kernels (read by tfc.cc)
CLANGXX = "TF_METAL_OPS_CLANGXX"  # the clang++ >= 16 to use (read by _builder.find_clangxx)
CACHE = "TF_METAL_OPS_CACHE"  # root of the build cache


def library_override() -> str | None:
    return os.environ.get(LIBRARY) or None


def emulated_gpu_backend() -> str | None:
    """The GPU backend TF_METAL_OPS_EMULATED_GPU asks for: "emulated" (=1), "metal" (=metal), else None."""
    return {"1": "emulated", "metal": "metal"}.get(os.environ.get(EMULATED_GPU, ""))


def objc_runtime() -> str:
    return os.environ.get(OBJC_RUNTIME, "")


def emu_coverage() -> bool:
    return os.environ.get(EMU_COVERAGE, "") == "1"


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
    """Where csrc/, metal_kernels/ and tools/ may be, in search order: the wheel's package data
    (tf_metal_ops/_sources), then the source checkout the package was installed from in editable mode."""
    return PACKAGE_DIR / "_sources", PACKAGE_DIR.parent


def source_root() -> Path | None:
    """The first of source_roots() that holds the emulated GPU's and msl_emu's sources, or None."""
    for root in source_roots():
        if (root / "csrc" / "emulated" / "emu_backend.cc").is_file() and (root / "tools" / "msl_emu").is_dir():
            return root
    return None
