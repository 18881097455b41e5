"""Shared test setup.

Tests run against the *installed* package (``pip install .``): the op library is built at install time, so
importing tf_metal_ops from a source checkout finds no library. Run them as ``pytest tests`` (the pytest script
does not put the working directory on sys.path, so the installed package is imported).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

from support.native import GPU_BACKENDS, gpu_backend_env, skip_or_fail  # noqa: E402
from support.paths import REPO_ROOT  # noqa: E402


def pytest_configure(config):
    import tf_metal_ops

    try:
        tf_metal_ops.library_path()
    except tf_metal_ops.OpLibraryError as e:
        raise pytest.UsageError(
            f"{e}\n(imported tf_metal_ops from {os.path.dirname(tf_metal_ops.__file__)}; run `pip install .` "
            "and start pytest with the `pytest` command, not `python -m pytest`, from the repo root)"
        )


# --- native toolchain (Mac compile check, MSL emulation, sanitizer builds) --------------------------------
# Without clang-16 these checks skip and say how to enable them, or fail under TFMO_REQUIRE_MAC_CHECKS=1
# (support/native.py).
@pytest.fixture(scope="session")
def clang16():
    """Path of clang++-16 (the compiler of the Mac checks, the MSL emulation and the sanitizer builds)."""
    import shutil

    path = shutil.which("clang++-16")
    if path is None:
        skip_or_fail("clang++-16 not found: `apt-get install clang-16` to run the native checks")
    return path


# --- MSL emulation (csrc/msl_emu; helpers in tests/support/msl_emu_build.py) --------------------------------
@pytest.fixture(scope="session")
def msl_emu(clang16):
    """msl_emu_build.Toolchain bound to clang++-16: .build(driver, defines=...) -> exe, .run(exe, inputs=...)."""
    from support import msl_emu_build

    return msl_emu_build.Toolchain(clang16)


# --- Mac host compile check (dev/check_mac_host.py; tests/test_mac_host_check.py) -----------------------
@pytest.fixture(scope="session")
def mac_host_check():
    """The dev/check_mac_host.py module, its toolchain found (clang++-16, the macOS SDK unpacked into the user
    cache, TensorFlow's C API headers); skips (or fails under TFMO_REQUIRE_MAC_CHECKS=1) when one is missing."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "check_mac_host", os.path.join(REPO_ROOT, "dev", "check_mac_host.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.toolchain()
    except module.ToolchainMissing as e:
        skip_or_fail(f"Mac host compile check unavailable: {e}")
    return module


# --- the two GPU backends of the emulated GPU (tf_metal_ops/emulated_gpu; support/native.py GPU_BACKENDS) -----
@pytest.fixture(scope="session", params=list(GPU_BACKENDS))
def gpu_backend(request, clang16):
    """Each GPU test that takes this fixture runs under both backends: builds the backend once (cached) and
    returns (name, the environment that selects it)."""
    os.environ.setdefault("TF_METAL_OPS_CLANGXX", clang16)
    return request.param, gpu_backend_env(request.param)
