"""Checks of the Metal backend (csrc/metal) over the Apple doubles (dev/apple_doubles), one per Mac behaviour the
backend must survive that the doubles can show, run in a subprocess by tests/test_metal_backend.py:

    cd tests
    TF_METAL_OPS_EMULATED_GPU=$(python ../dev/apple_doubles/build.py) python -m support.metal_backend_checks CHECK

Each check sets up what a Mac could present (a stream that keeps an encoder open, a GPU fault, buffers no malloc
zone claims, pipelines with their own threadgroup memory) through the doubles' TFMO_MOCK_* switches, which the
caller passes in the environment. Exit status 0 and a last line "ok CHECK ..." on success.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
assert os.environ.get("TF_METAL_OPS_EMULATED_GPU", "") not in ("", "0", "1", "direct"), \
    "run with TF_METAL_OPS_EMULATED_GPU set to the directory dev/apple_doubles/build.py prints"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_metal_ops as t  # noqa: E402
from tf_metal_ops import emulated_gpu  # noqa: E402

from support.gpu_check_runner import collect, main  # noqa: E402

GPU, CPU = "/GPU:0", "/CPU:0"


def render_inputs(seed: int, rays: int = 64, samples: int = 24):
    rng = np.random.default_rng(seed)
    density = rng.uniform(0, 3, (rays, samples)).astype(np.float32)
    color = rng.uniform(0, 1, (rays, samples, 3)).astype(np.float32)
    edges = np.sort(rng.uniform(0.1, 4, (rays, samples + 1)), axis=1).astype(np.float32)
    return density, color, edges


def render_both(seed: int):
    """volume_render with its gradient on the GPU and on the CPU, from eager NumPy inputs (copied to the device)."""
    out = {}
    for device in (GPU, CPU):
        with tf.device(device):
            d, c, edges = (tf.constant(a) for a in render_inputs(seed))
            with tf.GradientTape() as tape:
                tape.watch([d, c])
                rgb = t.volume_render(d, c, edges).color
                loss = tf.reduce_sum(rgb * rgb)
            out[device] = [rgb.numpy(), *(g.numpy() for g in tape.gradient(loss, [d, c]))]
    return out[GPU], out[CPU]


def check_open_encoder_on_the_stream():
    """Before each GPU op the streams are left with an encoder of their own open on the current command
    buffer (tfmo_mock_tf_metal_leave_encoder_open: what a stream that coalesces its own kernels leaves between
    ops); the backend commits the stream before it encodes, so it never opens a second encoder on that buffer (the
    double would end the process: "A command encoder is already encoding to this command buffer")."""
    device_lib = emulated_gpu._handle("device")
    hook = device_lib.tfmo_mock_tf_metal_leave_encoder_open
    before, ran = emulated_gpu.device_stats()["open_encoders_left"], emulated_gpu.dispatch_counts()
    for seed in range(3):
        d, c, edges = render_inputs(seed)
        with tf.device(GPU):
            dg, cg, eg = tf.identity(d), tf.identity(c), tf.identity(edges)  # inputs on the device first
            emulated_gpu.synchronize()
            hook()
            with tf.GradientTape() as tape:
                tape.watch([dg, cg])
                rgb = t.volume_render(dg, cg, eg).color
                hook()
                loss = tf.reduce_sum(rgb * rgb)
            grads = tape.gradient(loss, [dg, cg])
            got = [rgb.numpy(), *(g.numpy() for g in grads)]
        with tf.device(CPU):
            dc, cc, ec = (tf.constant(a) for a in (d, c, edges))
            with tf.GradientTape() as tape:
                tape.watch([dc, cc])
                rgb_c = t.volume_render(dc, cc, ec).color
                loss_c = tf.reduce_sum(rgb_c * rgb_c)
            want = [rgb_c.numpy(), *(g.numpy() for g in tape.gradient(loss_c, [dc, cc]))]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    left = emulated_gpu.device_stats()["open_encoders_left"] - before
    after = emulated_gpu.dispatch_counts()
    assert left > 0, "no stream had an encoder left open: the check tested nothing"
    assert all(after.get(k, 0) - ran.get(k, 0) == 3 for k in ("volume_render_forward", "volume_render_backward")), after
    return f"{left} encoders left open before the ops; 3 renders with gradients equal to the CPU's"


def check_gpu_error_reported_on_next_call():
    """A GPU fault of an asynchronous call (an out-of-bounds write in a bounds-checked inline kernel) is
    recorded by the completion handler, fails the next GPU call with the fault's message, and shows in
    backend_info(); the call after that runs normally."""
    assert os.environ.get("TF_METAL_OPS_BOUNDS_CHECK") == "1" and os.environ.get("TF_METAL_OPS_SYNC") != "1"
    write = t.metal_kernel("oob_async", ["x"], ["y"], "uint i = thread_position_in_grid.x; y[i + 1] = x[i];")
    good = t.metal_kernel("in_bounds", ["x"], ["y"], "uint i = thread_position_in_grid.x; y[i] = 2 * x[i];")
    launch = dict(grid=(100, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(100,)], output_dtypes=[tf.float32])
    with tf.device(GPU):
        x = tf.ones([100])
        write(inputs=[x], **launch)  # returns at once: the fault happens on the GPU, after the op
        emulated_gpu.synchronize()
        try:
            good(inputs=[x], **launch)[0].numpy()
        except tf.errors.InternalError as e:
            assert "an earlier GPU call failed" in e.message and "out-of-bounds access to 'y'" in e.message, e.message
        else:
            raise AssertionError("the GPU fault of the earlier call was not reported")
        info = t.backend_info()
        metal = info["emulated_gpu"]["metal"]
        assert info["gpu_backend"] == "metal", info["gpu_backend"]
        assert metal["gpu_errors"] == 1 and "out-of-bounds access to 'y'" in metal["last_gpu_error"], metal
        np.testing.assert_array_equal(good(inputs=[x], **launch)[0].numpy(), np.full(100, 2.0))
    return f"reported on the next call and in backend_info: {metal['last_gpu_error'][:80]}..."


def check_gpu_error_at_the_op_in_sync_mode():
    """TF_METAL_OPS_SYNC=1: the op waits for its command buffer, so a GPU fault fails the op itself, and the next
    call runs normally (nothing is left pending)."""
    assert os.environ.get("TF_METAL_OPS_BOUNDS_CHECK") == "1" and os.environ.get("TF_METAL_OPS_SYNC") == "1"
    write = t.metal_kernel("oob_sync", ["x"], ["y"], "uint i = thread_position_in_grid.x; y[i + 1] = x[i];")
    good = t.metal_kernel("in_bounds", ["x"], ["y"], "uint i = thread_position_in_grid.x; y[i] = 2 * x[i];")
    launch = dict(grid=(100, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(100,)], output_dtypes=[tf.float32])
    with tf.device(GPU):
        x = tf.ones([100])
        try:
            write(inputs=[x], **launch)[0].numpy()
        except tf.errors.InternalError as e:
            msg = e.message
            assert "out-of-bounds access to 'y'" in msg and "an earlier GPU call" not in msg, msg
        else:
            raise AssertionError("the GPU fault did not fail the op under TF_METAL_OPS_SYNC=1")
        np.testing.assert_array_equal(good(inputs=[x], **launch)[0].numpy(), np.full(100, 2.0))
    return f"failed at the op: {msg[-100:]}"


def check_foreign_buffers_explain_themselves():
    """Tensors whose MTLBuffers no malloc zone claims (TFMO_MOCK_TF_METAL_FOREIGN_BUFFERS=1) fail the
    object check with a message naming what it saw and the way out; TF_METAL_OPS_SKIP_OBJECT_CHECK=1 (the
    subprocess below) then runs the op."""
    assert os.environ.get("TFMO_MOCK_TF_METAL_FOREIGN_BUFFERS") == "1"
    d, c, edges = render_inputs(0)
    with tf.device(GPU):
        try:
            t.volume_render(d, c, edges).color.numpy()
        except tf.errors.OpError as e:
            msg = e.message
            assert "malloc_zone_from_ptr = " in msg and "not the start of a heap block" in msg, msg
            assert "not an MTLBuffer" in msg and "TF_METAL_OPS_SKIP_OBJECT_CHECK=1" in msg, msg
        else:
            if os.environ.get("TF_METAL_OPS_SKIP_OBJECT_CHECK") != "1":
                raise AssertionError("a buffer outside every malloc zone passed the object check")
            gpu, cpu = render_both(0)
            np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-5, atol=1e-6)
            return "TF_METAL_OPS_SKIP_OBJECT_CHECK=1 runs the op on the same buffers"
    return f"rejected with: {msg[:160]}..."


def check_static_threadgroup_memory_counts():
    """With pipelines that declare 31 KiB of threadgroup memory of their own
    (TFMO_MOCK_METAL_STATIC_TG_BYTES=31744), ray_march's 2 KiB scan block exceeds the 32 KiB limit: the backend
    rejects the pass with an op error that says so, before the encoder would break Metal's rule."""
    assert os.environ.get("TFMO_MOCK_METAL_STATIC_TG_BYTES") == "31744"
    rng = np.random.default_rng(0)
    o = rng.uniform(-0.2, 0.2, (70, 3)).astype(np.float32)
    d = rng.normal(size=(70, 3)).astype(np.float32)
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    grid = t.OccupancyGrid(resolution=16)
    with tf.device(GPU):
        try:
            t.ray_march(tf.constant(o), tf.constant(d), grid, near=0.05, far=2.0, step_size=0.05)
        except tf.errors.OpError as e:
            msg = e.message
            assert "declared in the kernel" in msg and "exceed the device's 32768" in msg, msg
        else:
            raise AssertionError("threadgroup memory beyond 32 KiB was encoded")
    return f"rejected: {msg.splitlines()[0][-120:]}"


def check_small_pipelines():
    """Pipelines whose maximum is 64 threads per group (TFMO_MOCK_METAL_MAX_THREADS=64: register-heavy kernels on a
    real GPU report less than 1024): grids of threads are split into groups that fit, and the explicit 256-thread
    groups of ray_march's scan are rejected with an op error instead of breaking the encoder's rule."""
    assert os.environ.get("TFMO_MOCK_METAL_MAX_THREADS") == "64"
    gpu, cpu = render_both(1)
    for g, c in zip(gpu, cpu):
        np.testing.assert_allclose(g, c, rtol=1e-5, atol=1e-6)
    rng = np.random.default_rng(0)
    o = rng.uniform(-0.2, 0.2, (70, 3)).astype(np.float32)
    d = rng.normal(size=(70, 3)).astype(np.float32)
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    with tf.device(GPU):
        try:
            t.ray_march(tf.constant(o), tf.constant(d), t.OccupancyGrid(resolution=16), near=0.05, far=2.0,
                        step_size=0.05)
        except tf.errors.OpError as e:
            assert "exceed this pipeline's maximum of 64" in e.message, e.message
        else:
            raise AssertionError("a 256-thread group was encoded for a 64-thread pipeline")
        # An inline kernel's explicit threadgroup is never shrunk: it is an error.
        k = t.metal_kernel("wide_group", ["x"], ["y"], "uint i = thread_position_in_grid.x; y[i] = x[i];")
        try:
            k(inputs=[tf.ones([256])], grid=(256, 1, 1), threadgroup=(128, 1, 1), output_shapes=[(256,)],
              output_dtypes=[tf.float32])[0].numpy()
        except tf.errors.OpError as e:
            assert "a threadgroup of 128 threads exceeds this pipeline's maximum of 64" in e.message, e.message
        else:
            raise AssertionError("a 128-thread inline group was encoded for a 64-thread pipeline")
    return "volume_render in 64-thread groups equals the CPU; ray_march's scan and a 128-thread inline group rejected"


def check_scratch_freed():
    """The float32 scratch accumulator of a float16 table's gradient is freed on the op's thread after
    encoding (the double ends the process if a buffer is freed from a completion handler), and nothing stays
    allocated once the results are gone."""
    from tf_metal_ops.hash_grid import HashGridConfig

    cfg = HashGridConfig(3, n_levels=4, n_features_per_level=2, log2_hashmap_size=10, base_resolution=4,
                         per_level_scale=1.5)
    rng = np.random.default_rng(0)
    x = rng.random((50, 3), dtype=np.float32)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float16)
    g = rng.standard_normal((50, cfg.n_output_dims)).astype(np.float16)
    ops = t._library.ops()
    before = emulated_gpu.dispatch_counts().get("hash_grid_float_to_half", 0)
    for _ in range(5):
        with tf.device(GPU):
            r = ops.hash_grid_encode_grad_params(g, x, p, tf.constant(4), **cfg.op_kwargs())
        with tf.device(CPU):
            want = ops.hash_grid_encode_grad_params(g, x, p, tf.constant(4), **cfg.op_kwargs())
        np.testing.assert_allclose(np.asarray(r, np.float64), np.asarray(want, np.float64), rtol=2e-3, atol=2e-3)
        del r
    emulated_gpu.synchronize()
    assert emulated_gpu.dispatch_counts()["hash_grid_float_to_half"] - before == 5
    stats = emulated_gpu.device_stats()
    assert stats["live_buffers"] == 0 and stats["live_bytes"] == 0, stats
    return f"5 float16 gradients, {stats['allocations']} allocations, none left"


def check_ieee_semantics_in_runtime_compiled_sources():
    """A source the backend compiles at run time (an inline kernel here; the embedded sources likewise) keeps IEEE
    NaN/inf and evaluation order: the backend turns fast math off, and the doubles compile with Apple's default
    (fast math: clang's finite-math-only and reassociation) unless it does, so a kernel that tests for NaN/inf or
    relies on the order of a sum answers differently with the defect, as on a Mac."""
    body = """uint i = thread_position_in_grid.x;
    float v = x[i];
    float big = 16777216.0f;
    y[i] = isnan(v) ? -1.0f : isinf(v) ? -2.0f : (v + big) - big;"""
    k = t.metal_kernel("ieee_classify", ["x"], ["y"], body)
    x = np.array([np.nan, np.inf, -np.inf, 0.5, 3.0, -1.25, 7.0, 0.0], np.float32)
    with tf.device(GPU):
        got = k(inputs=[tf.constant(x)], grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(8,)],
                output_dtypes=[tf.float32])[0].numpy()
    big = np.float32(16777216.0)
    want = np.where(np.isnan(x), -1.0, np.where(np.isinf(x), -2.0, (x + big) - big)).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    return f"NaN/inf classified and (v + 2^24) - 2^24 rounded as IEEE: {got.tolist()}"


def check_msl_version_of_the_device():
    """On a GPU without Metal 3 (TFMO_MOCK_METAL_NO_METAL3=1) the backend compiles at MSL 2.4, and the doubles
    honour MTLCompileOptions.languageVersion: an inline kernel that needs MSL 3.0 (atomic_float) fails to compile
    (__METAL_VERSION__ is 240 there), while a kernel without it runs. Under Metal 3 the same kernel runs
    (test_metal_kernel's atomic outputs)."""
    assert os.environ.get("TFMO_MOCK_METAL_NO_METAL3") == "1"
    body = "uint i = thread_position_in_grid.x; atomic_fetch_add_explicit(&y[0], x[i], memory_order_relaxed);"
    k = t.metal_kernel("needs_msl3", ["x"], ["y"], body, atomic_outputs=True)
    with tf.device(GPU):
        try:
            k(inputs=[tf.ones([32])], grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(1,)],
              output_dtypes=[tf.float32], init_value=0.0)[0].numpy()
        except tf.errors.InvalidArgumentError as e:
            msg = e.message
            # refused by the doubles' newLibraryWithSource: its strict check (as Apple's compiler, "Compilation
            # failed"), or the C++ compile of what the check lets through ("does not compile")
            assert ("Compilation failed" in msg or "does not compile" in msg) and "atomic_float" in msg, msg
        else:
            raise AssertionError("a kernel using atomic_float (MSL 3.0) compiled at MSL 2.4")
        plain = t.metal_kernel("msl24_ok", ["x"], ["y"], "uint i = thread_position_in_grid.x; y[i] = x[i] + 1;")
        np.testing.assert_array_equal(plain(inputs=[tf.ones([32])], grid=(32, 1, 1), threadgroup=(32, 1, 1),
                                            output_shapes=[(32,)], output_dtypes=[tf.float32])[0].numpy(),
                                      np.full(32, 2.0, np.float32))
    return f"atomic_float at MSL 2.4 rejected: {msg.splitlines()[0][:120]}"


def check_force_source_read_once():
    """TF_METAL_OPS_FORCE_SOURCE is read once per process: set after the first op, it changes nothing (the
    device's metallib list is fixed when the device is first used), and kernels first used afterwards still come
    from the metallibs."""
    assert os.environ.get("TF_METAL_OPS_FORCE_SOURCE") is None
    gpu, cpu = render_both(2)
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-5, atol=1e-6)
    os.environ["TF_METAL_OPS_FORCE_SOURCE"] = "1"
    from tf_metal_ops.hash_grid import HashGridConfig

    cfg = HashGridConfig(3, n_levels=2, n_features_per_level=2, log2_hashmap_size=8, base_resolution=4,
                         per_level_scale=1.5)
    rng = np.random.default_rng(0)
    x = rng.random((20, 3), dtype=np.float32)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    out = {}
    for device in (GPU, CPU):
        with tf.device(device):
            out[device] = t.hash_grid_encode(x, p, **cfg.op_kwargs()).numpy()
    np.testing.assert_allclose(out[GPU], out[CPU], rtol=1e-5, atol=1e-6)
    origins = t.backend_info()["emulated_gpu"]["metal"]["library"]["origins"]
    assert origins and all(o.startswith("metallib ") for o in origins), origins
    return f"origins after the switch: {sorted(set(o.split('/')[-1] for o in origins))}"


CHECKS = collect(globals())

if __name__ == "__main__":
    main(CHECKS)
