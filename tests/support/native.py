"""Native toolchain policy and the two backends of the emulated GPU (fixtures in tests/conftest.py).

Without a toolchain the native checks (Mac compile check, MSL emulation, sanitizer builds, GPU backends) skip and
say how to enable them; CI sets TFMO_REQUIRE_MAC_CHECKS=1 so a missing toolchain fails the run instead of passing it
silently.

GPU backends: "direct": TF_METAL_OPS_EMULATED_GPU=1, the emulated GPU's own backend. "metal": the unchanged
csrc/metal/*.mm over the Apple doubles, built by dev/apple_doubles/build.py (which needs the GNUstep Objective-C
runtime named by TF_METAL_OPS_OBJC_RUNTIME) and selected by TF_METAL_OPS_EMULATED_GPU=<its directory>.
"""

import functools
import importlib.util
import os

import pytest

from support.paths import REPO_ROOT

REQUIRE_NATIVE_CHECKS = os.environ.get("TFMO_REQUIRE_MAC_CHECKS") == "1"
GPU_BACKENDS = ("direct", "metal")


def skip_or_fail(reason: str):
    """Skips the test with `reason`, or fails it when CI requires the native checks."""
    if REQUIRE_NATIVE_CHECKS:
        pytest.fail(f"{reason} (required: TFMO_REQUIRE_MAC_CHECKS=1)", pytrace=False)
    pytest.skip(reason)


@functools.lru_cache(maxsize=None)
def apple_doubles():
    """dev/apple_doubles/build.py, loaded from the checkout (a development tool: never part of the package)."""
    spec = importlib.util.spec_from_file_location("tfmo_dev_apple_doubles",
                                                  os.path.join(REPO_ROOT, "dev", "apple_doubles", "build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def _metal_backend_dir() -> str:
    runtime = os.environ.get("TF_METAL_OPS_OBJC_RUNTIME")
    if not runtime or not os.path.exists(runtime):
        skip_or_fail("the metal backend over the Apple doubles needs TF_METAL_OPS_OBJC_RUNTIME (the libobjc2 "
                     "directory or .tgz; in this project ../shared/objc-runtime/*.tgz)")
    return str(apple_doubles().build())


def gpu_backend_env(backend: str) -> dict:
    """The environment that selects `backend` in a subprocess, building it first (cached; skips or fails when it
    cannot be built here)."""
    if backend == "direct":
        from tf_metal_ops import emulated_gpu

        emulated_gpu.build(gpu_backend="direct")
        return {"TF_METAL_OPS_EMULATED_GPU": "1"}
    return {"TF_METAL_OPS_EMULATED_GPU": _metal_backend_dir()}
