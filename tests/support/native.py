"""Native toolchain policy and the two GPU backends of the emulated GPU (fixtures in tests/conftest.py).

Without a toolchain the native checks (Mac compile check, MSL emulation, sanitizer builds, GPU backends) skip and
say how to enable them; CI sets TFMO_REQUIRE_MAC_CHECKS=1 so a missing toolchain fails the run instead of passing it
silently.

GPU backends: "emulated": TF_METAL_OPS_EMULATED_GPU=1, the emulated backend on the emulated device. "metal":
TF_METAL_OPS_EMULATED_GPU=metal, the unchanged Metal backend (csrc/metal/*.mm) over the doubles of Apple's stack
(tools/apple_mock), which needs the GNUstep Objective-C runtime named by TF_METAL_OPS_OBJC_RUNTIME.
"""

import os

import pytest

REQUIRE_NATIVE_CHECKS = os.environ.get("TFMO_REQUIRE_MAC_CHECKS") == "1"
GPU_BACKENDS = {"emulated": "1", "metal": "metal"}


def skip_or_fail(reason: str):
    """Skips the test with `reason`, or fails it when CI requires the native checks."""
    if REQUIRE_NATIVE_CHECKS:
        pytest.fail(f"{reason} (required: TFMO_REQUIRE_MAC_CHECKS=1)", pytrace=False)
    pytest.skip(reason)


def gpu_backend_env(backend: str) -> dict:
    """The environment that selects `backend` in a subprocess (skips or fails when it cannot be built here)."""
    env = {"TF_METAL_OPS_EMULATED_GPU": GPU_BACKENDS[backend]}
    if backend == "metal":
        runtime = os.environ.get("TF_METAL_OPS_OBJC_RUNTIME")
        if not runtime or not os.path.exists(runtime):
            skip_or_fail("the Metal backend over Apple's doubles needs TF_METAL_OPS_OBJC_RUNTIME (the libobjc2 "
                         "directory or .tgz; in this project ../shared/objc-runtime/*.tgz)")
        env["TF_METAL_OPS_OBJC_RUNTIME"] = runtime
    return env
