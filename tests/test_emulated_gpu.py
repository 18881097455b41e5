"""The GPU code path on the Metal-emulating TensorFlow device (tf_metal_ops/emulated_gpu): every op and gradient on
/GPU:0 against its CPU kernel, the Keras layer, a SavedModel, NeRF training steps, 8 threads at once, thread orders
of the emulated GPU, the TF_METAL_OPS_SYNC path, and the device's guarantees (host reads of device memory fault;
clear errors when it cannot be enabled). Each op check runs in a fresh process under both backends of the emulated
GPU (conftest.gpu_backend): direct (TF_METAL_OPS_EMULATED_GPU=1) and metal (csrc/metal over the Apple doubles). The
rows that vary what only the direct backend's kernel launcher varies (thread orders, worker counts) and the NeRF steps
(the same ops again, in a training loop) run under the direct backend. The checks and their tolerances are in
tests/support/emulated_gpu_checks.py.

Needs clang++-16 like the other native checks: skips without it, fails under TFMO_REQUIRE_MAC_CHECKS=1 (CI).
"""

import os
import subprocess
import sys

import pytest

from support.gpu_check_runner import QUIET, run_check
from support.native import gpu_backend_env

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def emulated_gpu(clang16):
    """Builds the emulated GPU and GPU kernels once (cached); returns the library paths."""
    from tf_metal_ops import emulated_gpu

    os.environ.setdefault("TF_METAL_OPS_CLANGXX", clang16)
    return emulated_gpu.build()


def run(args, env=None, timeout=900, cwd=None):
    full = {**os.environ, **QUIET, "TF_METAL_OPS_EMULATED_GPU": "1", **(env or {})}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=full, timeout=timeout,
                          cwd=cwd or HERE)


# Under both backends: every op check (the host code, the backend's encoding and its stream).
# (checks, seed, environment); every check once with seed 0 and the default environment. The checks of one entry
# run in order in one process (run_check: a failure names its check), which spares a TensorFlow start per check.
CASES = [(checks, 0, {}) for checks in (
    "zero_out,hash_grid,hash_grid_edges,hash_grid_second_order,hash_grid_feature_major",
    "volume_render,distortion_loss,render_packed,render_packed_nan_policy",
    "ray_march,ray_march_cascades,fused_mlp,fused_mlp_many_blocks", "layer_and_savedmodel,threads")] + [
    ("volume_render", 1, {"TF_METAL_OPS_SYNC": "1"}),
]
# Under the direct backend: the kernel launcher's thread orders and worker counts (msl_emu runs the metal backend's
# kernels in its own order), and NeRF training steps.
DIRECT_CASES = [
    ("hash_grid", 1, {"MSL_EMU_ORDER": "reverse", "TF_METAL_OPS_EMULATED_GPU_WORKERS": "2"}),
    ("hash_grid", 2, {"MSL_EMU_ORDER": "shuffle", "MSL_EMU_SEED": "7", "TF_METAL_OPS_EMULATED_GPU_WORKERS": "2"}),
    ("hash_grid_second_order", 1, {"MSL_EMU_ORDER": "shuffle", "MSL_EMU_SEED": "3",
                                   "TF_METAL_OPS_EMULATED_GPU_WORKERS": "2"}),
    ("render_packed", 1, {"MSL_EMU_ORDER": "reverse", "TF_METAL_OPS_EMULATED_GPU_WORKERS": "2"}),
    ("ray_march", 1, {"TF_METAL_OPS_SYNC": "1", "MSL_EMU_ORDER": "shuffle", "MSL_EMU_SEED": "5",
                      "TF_METAL_OPS_EMULATED_GPU_WORKERS": "2"}),
    ("ray_march_cascades", 1, {"MSL_EMU_ORDER": "reverse", "TF_METAL_OPS_EMULATED_GPU_WORKERS": "2"}),
    ("nerf_steps", 0, {}),
]


def _ids(cases):
    return [f"{c}-{s}-{'-'.join(e) or 'default'}" for c, s, e in cases]


def assert_one_digest(check, settings):
    """Runs emulated_gpu_checks' `check` under each (backend, environment) of `settings`: the digest of every result,
    its last output word, must be the same under all of them."""
    digests = {}
    for backend, env in settings:
        r = run_check("emulated_gpu_checks", check, 0, {**gpu_backend_env(backend), **env})
        digests[f"{backend} {env}"] = r.stdout.splitlines()[-1].rsplit(" ", 1)[-1]
    assert len(set(digests.values())) == 1, digests


def test_deterministic_table_gradient_is_bitwise_reproducible(clang16):
    """The deterministic table gradients (first and second order) give the same bits under both backends, thread
    orders (forward, reverse, shuffled) and worker counts: the check's digest covers every result."""
    os.environ.setdefault("TF_METAL_OPS_CLANGXX", clang16)
    settings = [("direct", {}),
                ("direct", {"MSL_EMU_ORDER": "reverse", "TF_METAL_OPS_EMULATED_GPU_WORKERS": "2"}),
                ("direct", {"MSL_EMU_ORDER": "shuffle", "MSL_EMU_SEED": "11", "TF_METAL_OPS_EMULATED_GPU_WORKERS": "1"}),
                ("metal", {})]
    assert_one_digest("hash_grid_deterministic", settings)


def test_fused_mlp_is_bitwise_reproducible(clang16):
    """The fused MLP's outputs and gradients (fixed-order sums) give the same bits under both backends, thread orders
    and worker counts: the check's digest covers every result."""
    os.environ.setdefault("TF_METAL_OPS_CLANGXX", clang16)
    settings = [("direct", {"MSL_EMU_ORDER": "shuffle", "MSL_EMU_SEED": "5", "TF_METAL_OPS_EMULATED_GPU_WORKERS": "2"}),
                ("metal", {})]
    assert_one_digest("fused_mlp", settings)


def test_table_gradient_without_float_atomics_is_fixed_point(clang16):
    """Where the kernels have no atomic_float (the direct backend at MSL 2.4; the Metal backend on a device without
    Metal 3), the table gradients run as fixed-point sums by default, with the same bits under both backends."""
    os.environ.setdefault("TF_METAL_OPS_CLANGXX", clang16)
    outs = {}
    for backend, env in (("direct", {"TF_METAL_OPS_EMULATED_GPU_MSL": "2.4", "MSL_EMU_ORDER": "reverse"}),
                         ("metal", {"TFMO_MOCK_METAL_NO_METAL3": "1"})):
        r = run_check("emulated_gpu_checks", "hash_grid_without_float_atomics", 0, {**gpu_backend_env(backend), **env})
        outs[backend] = r.stdout.splitlines()[-1]
    assert all("4 configurations" in o for o in outs.values()), outs
    assert len({o.rsplit(" ", 1)[-1] for o in outs.values()}) == 1, outs


@pytest.mark.parametrize("check,seed,env", CASES, ids=_ids(CASES))
def test_gpu_path_on_emulated_gpu(gpu_backend, check, seed, env):
    """Under both backends (conftest.gpu_backend): direct, and csrc/metal over the Apple doubles."""
    run_check("emulated_gpu_checks", check, seed, {**gpu_backend[1], **env})


@pytest.mark.parametrize("check,seed,env", DIRECT_CASES, ids=_ids(DIRECT_CASES))
def test_gpu_path_thread_orders_on_the_direct_backend(clang16, check, seed, env):
    os.environ.setdefault("TF_METAL_OPS_CLANGXX", clang16)
    run_check("emulated_gpu_checks", check, seed, {**gpu_backend_env("direct"), **env})


def test_host_code_reading_device_memory_faults_loudly(emulated_gpu, clang16, tmp_path):
    import tensorflow as tf

    lib = tmp_path / "libhost_reads_device.so"
    repo = os.path.dirname(HERE)
    cmd = [clang16, "-std=c++17", "-shared", "-fPIC", "-O1", f"-I{tf.sysconfig.get_include()}",
           f"-I{os.path.join(repo, 'csrc')}", os.path.join(HERE, "emulated_gpu_fixture", "host_reads_device.cc"),
           os.path.join(repo, "csrc", "common", "tfc.cc"), f"-L{tf.sysconfig.get_lib()}",
           "-l:libtensorflow_framework.so.2", "-o", str(lib)]
    subprocess.run(cmd, check=True, capture_output=True)
    code = f"""
import numpy as np, tensorflow as tf, tf_metal_ops
m = tf.load_op_library({str(lib)!r})
with tf.device("/CPU:0"):
    print("cpu placement has no kernel:", end=" ")
with tf.device("/GPU:0"):
    x = tf.constant(np.arange(64, dtype=np.float32))
    y = m.tfmo_test_host_reads_device(x)
    print("survived", y.numpy()[:2])
"""
    r = run(["-c", code], timeout=300)
    assert r.returncode == -11, f"expected death by SIGSEGV, got exit {r.returncode}:\n{r.stdout}\n{r.stderr[-3000:]}"
    assert "host code dereferenced device memory" in r.stderr, r.stderr[-3000:]
    assert "survived" not in r.stdout


def test_enable_after_tensorflow_initialised_its_devices_is_a_clear_error(emulated_gpu):
    code = """
import os, tensorflow as tf
tf.constant(1.0) + 1.0  # devices initialised
import tf_metal_ops
"""
    r = run(["-c", code], timeout=300)
    assert r.returncode != 0
    assert "EmulatedGPUError" in r.stderr and "before the first TensorFlow op" in r.stderr, r.stderr[-3000:]


def test_missing_compiler_is_a_clear_error(tmp_path):
    env = {"TF_METAL_OPS_CLANGXX": str(tmp_path / "no-such-clang"), "TF_METAL_OPS_CACHE": str(tmp_path / "cache")}
    r = run(["-c", "import tf_metal_ops"], env=env, timeout=300)
    assert r.returncode != 0
    assert "needs clang++ >= 16" in r.stderr and "apt-get install clang-16" in r.stderr, r.stderr[-3000:]


def test_sources_ship_with_the_installed_package():
    """The switch works from an installed wheel: what it compiles is package data, not the source checkout."""
    import tf_metal_ops
    from tf_metal_ops import emulated_gpu

    pkg = os.path.dirname(os.path.abspath(tf_metal_ops.__file__))
    root = str(emulated_gpu.source_root())
    if os.path.isdir(os.path.join(pkg, "_sources")):
        assert root == os.path.join(pkg, "_sources")
    else:  # an editable install reads the checkout it was installed from
        assert os.path.isfile(os.path.join(root, "setup.py")), root
    for rel in ("csrc/emulated_gpu/se_plugin.cc", "csrc/gpu/hash_grid_gpu.cc", "metal_kernels/hash_grid.metal",
                "csrc/msl_emu/include/metal_stdlib"):
        assert os.path.isfile(os.path.join(root, rel)), rel
