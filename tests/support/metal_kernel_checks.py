"""Checks of inline Metal kernels (tf_metal_ops.metal_kernel / compile_shader) on one device, each against a NumPy
float64 reference with a stated tolerance. tests/test_metal_kernel.py runs them on /CPU:0 in its own process and
on the emulated /GPU:0 in one subprocess:

    cd tests && TF_METAL_OPS_EMULATED_GPU=1 python -m support.metal_kernel_checks /GPU:0   # "ok <check>" per check

Tolerances: exp/log-type results rtol 2e-6 (float32; the CPU path vectorises with glibc's libmvec, whose expf is
within 4 ulp), float16 rtol 1e-3, sums of N float32 terms rtol 1e-5, integer results exact.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import tensorflow as tf

import tf_metal_ops as t
from support.simdgroup_checks import check_simdgroup_functions  # noqa: F401 (collected into CHECKS)

EXP = """
    uint elem = thread_position_in_grid.x;
    T tmp = inp[elem];
    out[elem] = metal::exp(tmp);
"""


def on(device):
    return tf.device(device)


def assert_on(y, device):
    assert y.device.endswith(device.strip("/").replace("GPU:0", "device:GPU:0").replace("CPU:0", "device:CPU:0")), \
        (y.device, device)


def check_exp_dtypes(device):
    k = t.metal_kernel("myexp", ["inp"], ["out"], EXP)
    rng = np.random.default_rng(0)
    for dt, rtol in ((tf.float32, 2e-6), (tf.float16, 1e-3)):
        x = tf.constant(rng.normal(size=1000).astype(dt.as_numpy_dtype))
        with on(device):
            (y,) = k(inputs=[x], template=[("T", dt)], grid=(1000, 1, 1), threadgroup=(256, 1, 1),
                     output_shapes=[x.shape], output_dtypes=[dt])
        assert_on(y, device)
        assert y.dtype == dt and y.shape == (1000,)
        np.testing.assert_allclose(y.numpy().astype(np.float64), np.exp(x.numpy().astype(np.float64)), rtol=rtol)


def check_template_kinds_header_and_shapes(device):
    header = """
    template <typename U> U scale(U v, int s) { return v * U(s); }
    """
    source = """
        uint i = thread_position_in_grid.x;
        if (i >= uint(x_shape[0] * x_shape[1])) return;
        uint r = i / uint(x_strides[0]);
        uint c = i % uint(x_strides[0]);
        T v = x[r * x_strides[0] + c * x_strides[1]];
        out[i] = FLIP ? -scale(v, N) + T(x_ndim) + bias : scale(v, N) + T(x_ndim) + bias;
    """
    k = t.metal_kernel("tmpl", ["x", "bias"], ["out"], source, header=header)
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    for flip in (False, True):
        with on(device):
            (y,) = k(inputs=[x, np.int32(5)], template=[("T", tf.int32), ("N", 3), ("FLIP", flip)],
                     grid=(16, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(3, 4)], output_dtypes=[tf.int32])
        ref = (-(3 * x) if flip else 3 * x) + 2 + 5
        np.testing.assert_array_equal(y.numpy(), ref)
    src = k.instance(["int32", "int32"], [2, 0], ["int32"], [2], [("T", "int32"), ("N", 3), ("FLIP", True)]).source
    assert "const constant int& bias [[buffer(" in src.msl and "x_shape" in src.msl and "x_ndim" in src.msl, src.msl
    assert src.bindings == ("in:0", "shape:0", "strides:0", "ndim:0", "in:1", "out:0"), src.bindings


def check_reduction_with_threadgroup_memory(device):
    source = """
        threadgroup float partial[256];
        uint lid = thread_position_in_threadgroup.x;
        uint gid = thread_position_in_grid.x;
        partial[lid] = gid < uint(n) ? x[gid] : 0.0f;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint s = threads_per_threadgroup.x / 2; s > 0; s /= 2) {
            if (lid < s) partial[lid] += partial[lid + s];
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        if (lid == 0) sums[threadgroup_position_in_grid.x] = partial[0];
    """
    k = t.metal_kernel("block_sum", ["x", "n"], ["sums"], source)
    n = 5000
    x = np.random.default_rng(1).normal(size=n).astype(np.float32)
    groups = (n + 255) // 256
    with on(device):
        (s,) = k(inputs=[x, np.int32(n)], grid=(groups * 256, 1, 1), threadgroup=(256, 1, 1),
                 output_shapes=[(groups,)], output_dtypes=[tf.float32])
    ref = np.pad(x.astype(np.float64), (0, groups * 256 - n)).reshape(groups, 256).sum(1)
    np.testing.assert_allclose(s.numpy(), ref, rtol=1e-5, atol=1e-5)


def check_atomic_scatter_with_init_value(device):
    source = """
        uint i = thread_position_in_grid.x;
        atomic_fetch_add_explicit(&hist[idx[i]], w[i], memory_order_relaxed);
    """
    k = t.metal_kernel("scatter_add", ["idx", "w"], ["hist"], source, atomic_outputs=True)
    rng = np.random.default_rng(2)
    idx = rng.integers(0, 10, size=4000).astype(np.int32)
    w = rng.uniform(size=4000).astype(np.float32)
    with on(device):
        (h,) = k(inputs=[idx, w], grid=(4000, 1, 1), threadgroup=(128, 1, 1), output_shapes=[(10,)],
                 output_dtypes=[tf.float32], init_value=1.5)
    ref = np.full(10, 1.5) + np.bincount(idx, weights=w.astype(np.float64), minlength=10)
    np.testing.assert_allclose(h.numpy(), ref, rtol=1e-5)


def check_zero_grid_is_a_no_op(device):
    k = t.metal_kernel("never", ["x"], ["out"], "out[thread_position_in_grid.x] = x[0];")
    with on(device):
        (y,) = k(inputs=[tf.ones([3])], grid=(0, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(5,)],
                 output_dtypes=[tf.float32], init_value=7)
    np.testing.assert_array_equal(y.numpy(), np.full(5, 7.0))


def check_dynamic_batch_in_tf_function(device):
    k = t.metal_kernel("myexp", ["inp"], ["out"], EXP)
    traces = []

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def f(x):
        traces.append(1)
        n = tf.size(x)
        (y,) = k(inputs=[x], template=[("T", tf.float32)], grid=(n, 1, 1), threadgroup=(64, 1, 1),
                 output_shapes=[tf.shape(x)], output_dtypes=[tf.float32])
        assert y.shape.as_list() == [None], y.shape
        return y

    for n in (1, 63, 64, 1000):
        x = tf.random.normal([n])
        with on(device):
            y = f(x)
        np.testing.assert_allclose(y.numpy(), np.exp(x.numpy().astype(np.float64)), rtol=2e-6)
    assert len(traces) == 1, traces


def check_gradient_pairing(device):
    fwd = t.metal_kernel("softplus", ["x"], ["y"], """
        uint i = thread_position_in_grid.x;
        y[i] = x[i] > 20.0f ? x[i] : metal::log(1.0f + metal::exp(x[i]));
    """)
    bwd = t.metal_kernel("softplus_grad", ["x", "dy"], ["dx"], """
        uint i = thread_position_in_grid.x;
        dx[i] = dy[i] / (1.0f + metal::exp(-x[i]));
    """)

    @tf.custom_gradient
    def softplus(x):
        launch = dict(grid=(tf.size(x), 1, 1), threadgroup=(64, 1, 1), output_shapes=[tf.shape(x)],
                      output_dtypes=[x.dtype])
        (y,) = fwd(inputs=[x], **launch)

        def grad(dy):
            return bwd(inputs=[x, dy], **launch)[0]

        return y, grad

    x = tf.constant(np.linspace(-4, 4, 37), tf.float32)
    with on(device):
        y = softplus(x)
        np.testing.assert_allclose(y.numpy(), np.log1p(np.exp(np.linspace(-4, 4, 37))), rtol=1e-5)
        for fn in (softplus, tf.function(softplus)):
            theo, num = tf.test.compute_gradient(fn, [x], delta=1e-2)
            np.testing.assert_allclose(theo[0], num[0], atol=2e-3)
            np.testing.assert_allclose(np.diag(theo[0]), 1 / (1 + np.exp(-np.linspace(-4, 4, 37))), rtol=1e-5)


def check_compile_shader(device):
    lib = t.compile_shader("""
        #include <metal_stdlib>
        using namespace metal;
        kernel void axpy(const device float* x [[buffer(0)]], const constant float& a [[buffer(1)]],
                         const device float* b [[buffer(2)]], device float* y [[buffer(3)]],
                         device uint* count [[buffer(4)]], uint i [[thread_position_in_grid]]) {
            y[i] = a * x[i] + b[i];
            if (i == 0) count[0] = 1u;
        }
    """)
    x = tf.range(10, dtype=tf.float32)
    with on(device):
        y, c = lib.axpy(x, 2.0, tf.ones([10]), threads=10, group_size=4, output_shapes=[(10,), (1,)])
    np.testing.assert_allclose(y.numpy(), 2 * np.arange(10) + 1)
    assert c.dtype == tf.uint32 and c.numpy()[0] == 1
    assert lib.kernel_names == ["axpy"]


def check_same_name_different_sources(device):
    a = t.metal_kernel("same", ["x"], ["y"], "y[thread_position_in_grid.x] = x[thread_position_in_grid.x] + 1;")
    b = t.metal_kernel("same", ["x"], ["y"], "y[thread_position_in_grid.x] = x[thread_position_in_grid.x] * 3;")
    x = tf.constant([1, 2, 3], tf.int32)
    launch = dict(grid=(3, 1, 1), threadgroup=(3, 1, 1), output_shapes=[(3,)], output_dtypes=[tf.int32])
    with on(device):
        ya, yb = a(inputs=[x], **launch)[0], b(inputs=[x], **launch)[0]
    np.testing.assert_array_equal(ya.numpy(), [2, 3, 4])
    np.testing.assert_array_equal(yb.numpy(), [3, 6, 9])


def check_eight_threads(device):
    k = t.metal_kernel("myexp", ["inp"], ["out"], EXP)
    errors = []

    def work(seed):
        try:
            rng = np.random.default_rng(seed)
            for _ in range(10):
                n = int(rng.integers(1, 3000))
                x = tf.constant(rng.normal(size=n).astype(np.float32))
                with on(device):
                    (y,) = k(inputs=[x], template=[("T", tf.float32)], grid=(n, 1, 1), threadgroup=(128, 1, 1),
                             output_shapes=[(n,)], output_dtypes=[tf.float32])
                np.testing.assert_allclose(y.numpy(), np.exp(x.numpy().astype(np.float64)), rtol=2e-6)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


def check_2d_grid_and_thread_attributes(device):
    source = """
        uint2 p = thread_position_in_grid.xy;
        uint w = threads_per_grid.x;
        out[p.y * w + p.x] = p.x * 1000 + p.y + threads_per_threadgroup.x * 0 + thread_index_in_simdgroup * 0;
    """
    k = t.metal_kernel("grid2d", ["x"], ["out"], source)
    with on(device):
        (y,) = k(inputs=[tf.zeros([1])], grid=(7, 5, 1), threadgroup=(4, 2, 1), output_shapes=[(5, 7)],
                 output_dtypes=[tf.uint32])
    xs, ys = np.meshgrid(np.arange(7), np.arange(5))
    np.testing.assert_array_equal(y.numpy(), xs * 1000 + ys)


CHECKS = {name[len("check_"):]: fn for name, fn in dict(globals()).items() if name.startswith("check_")}
assert "simdgroup_functions" in CHECKS


def main(argv):
    device = argv[1]
    names = argv[2:] or list(CHECKS)
    for name in names:
        CHECKS[name](device)
        print(f"ok {name}", flush=True)
    if device.endswith("GPU:0"):
        counts = t.emulated_gpu.dispatch_counts()
        assert counts.get("custom_kernel_myexp", 0) > 0 and counts.get("custom_kernel_block_sum", 0) > 0, counts
        assert "simdgroup_functions" not in names or counts.get("custom_kernel_simdgroup_functions", 0) > 0, counts
        print("dispatches:", {k: v for k, v in counts.items() if k.startswith("custom_kernel_")})
    print("ok all")


if __name__ == "__main__":
    main(sys.argv)
