"""csrc/metal over the Apple doubles (the emulated GPU's metal backend, dev/apple_doubles): what a Mac may present
that the backend must survive, one case per behaviour the doubles can show. Every op
and gradient check also runs under this backend (tests/test_emulated_gpu.py via conftest.gpu_backend); these cases
add the doubles' switches:
  - an MPSCommandBuffer-style stream that commits-and-continues (RayMarch's read-back waits for its own
    completion handler; also with TF_METAL_OPS_SYNC=1 and the float16 scratch accumulator; GPU faults on both
    paths);
  - a stream whose -commit defers submission until -commitAndWait or a synchronization (every op check in one
    process, and the sync path);
  - MTLCompileOptions honoured (IEEE semantics of runtime-compiled sources, MSL 2.4 on a GPU without Metal 3),
    TF_METAL_OPS_FORCE_SOURCE read once;
  - streams that keep an encoder of their own open between ops;
  - a GPU fault on the asynchronous path, buffers no malloc zone claims, pipelines with
    threadgroup memory of their own and pipelines smaller than 1024 threads;
  - scratch buffers freed on the op's thread, none left; metallibs that do not load (the embedded
    sources compiled at first use) and a GPU without Metal 3 (MSL 2.4).
The doubles end the process on a broken Metal rule, so a regression fails here with the double's message.
"""

import os

import pytest

from support.gpu_check_runner import run_check
from support.native import gpu_backend_env

MPS = {"TFMO_MOCK_TF_METAL_STREAM": "mps"}
DEFERRED = {"TFMO_MOCK_TF_METAL_STREAM": "deferred"}
# A handler on the wrong buffer of an MPS-style stream would wait for a buffer nobody commits: fail in seconds.
SHORT_WAIT = {"TF_METAL_OPS_GPU_TIMEOUT": "30"}
# The op checks of tests/test_emulated_gpu.py, in one process, as the deferring stream's row of the backend matrix.
DEFERRED_ROW = "zero_out,hash_grid,hash_grid_second_order,volume_render,distortion_loss,render_packed,ray_march"

# (script, check, environment). The op checks on the plain stream run in tests/test_emulated_gpu.py; here each op
# check varies what the backend sees: the stream kind, the sync path, where the pipelines come from, the MSL version.
CASES = [
    ("emulated_gpu_checks", "ray_march,threads", MPS),
    # The read-back on the sync path, every pipeline from the embedded sources compiled at first use, at MSL 2.4.
    ("emulated_gpu_checks", "ray_march", {**MPS, "TF_METAL_OPS_SYNC": "1", "TFMO_MOCK_METAL_METALLIB_UNLOADABLE": "1",
                                          "TFMO_MOCK_METAL_NO_METAL3": "1"}),
    # The float16 scratch accumulator on the sync path; pipelines from the embedded sources at MSL 3.0.
    ("emulated_gpu_checks", "hash_grid", {**MPS, "TF_METAL_OPS_SYNC": "1", "TFMO_MOCK_METAL_METALLIB_UNLOADABLE": "1"}),
    # The MSL 2.4 metallib (a GPU without Metal 3).
    ("emulated_gpu_checks", "volume_render", {"TFMO_MOCK_METAL_NO_METAL3": "1"}),
    ("metal_backend_checks", "open_encoder_on_the_stream", {}),
    ("metal_backend_checks", "open_encoder_on_the_stream", MPS),
    ("metal_backend_checks", "gpu_error_reported_on_next_call", {"TF_METAL_OPS_BOUNDS_CHECK": "1"}),
    ("metal_backend_checks", "gpu_error_at_the_op_in_sync_mode",
     {"TF_METAL_OPS_BOUNDS_CHECK": "1", "TF_METAL_OPS_SYNC": "1"}),
    ("metal_backend_checks", "gpu_error_reported_on_next_call", {**MPS, "TF_METAL_OPS_BOUNDS_CHECK": "1"}),
    ("metal_backend_checks", "gpu_error_at_the_op_in_sync_mode",
     {**MPS, **SHORT_WAIT, "TF_METAL_OPS_BOUNDS_CHECK": "1", "TF_METAL_OPS_SYNC": "1"}),
    # A stream whose -commit defers submission: ray_march's read-back (ExecuteAndRead, between asynchronous passes)
    # and the TF_METAL_OPS_SYNC=1 wait must not wait on a buffer the stream has not submitted (SHORT_WAIT: a stall
    # fails in seconds, not after 300 s).
    ("emulated_gpu_checks", DEFERRED_ROW, {**DEFERRED, **SHORT_WAIT}),
    ("emulated_gpu_checks", "volume_render", {**DEFERRED, **SHORT_WAIT, "TF_METAL_OPS_SYNC": "1"}),
    # Runtime-compiled sources keep IEEE semantics (fast math off); the device's MSL version is honoured;
    # TF_METAL_OPS_FORCE_SOURCE is read once.
    ("metal_backend_checks", "ieee_semantics_in_runtime_compiled_sources", {}),
    ("metal_backend_checks", "msl_version_of_the_device", {"TFMO_MOCK_METAL_NO_METAL3": "1"}),
    ("metal_backend_checks", "force_source_read_once", {}),
    ("metal_backend_checks", "foreign_buffers_explain_themselves", {"TFMO_MOCK_TF_METAL_FOREIGN_BUFFERS": "1"}),
    ("metal_backend_checks", "foreign_buffers_explain_themselves",
     {"TFMO_MOCK_TF_METAL_FOREIGN_BUFFERS": "1", "TF_METAL_OPS_SKIP_OBJECT_CHECK": "1"}),
    ("metal_backend_checks", "static_threadgroup_memory_counts", {"TFMO_MOCK_METAL_STATIC_TG_BYTES": "31744"}),
    ("metal_backend_checks", "small_pipelines", {"TFMO_MOCK_METAL_MAX_THREADS": "64"}),
    ("metal_backend_checks", "scratch_freed", {}),
    ("metal_backend_checks", "scratch_freed", {"TF_METAL_OPS_SYNC": "1"}),
]


@pytest.fixture(scope="module")
def metal_backend(clang16):
    """Builds the metal backend once (cached); returns the environment that selects it."""
    os.environ.setdefault("TF_METAL_OPS_CLANGXX", clang16)
    return gpu_backend_env("metal")


@pytest.mark.parametrize("script,check,env", CASES,
                         ids=[f"{c}-{'-'.join(f'{k}={v}' for k, v in e.items())}" for _, c, e in CASES])
def test_metal_backend_on_apple_doubles(metal_backend, script, check, env):
    run_check(script, check, 0 if script == "emulated_gpu_checks" else None, {**metal_backend, **env})
