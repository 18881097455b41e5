"""Checks of the GPU code path on the Metal-emulating device, run in a subprocess by tests/test_emulated_gpu.py:

    cd tests && TF_METAL_OPS_EMULATED_GPU=1 PYTHONPATH=../examples python -m support.emulated_gpu_checks CHECK [SEED]

Each check compares the ops on /GPU:0 (the package's GPU host code + the unchanged Metal kernels, emulated) with
the same ops on /CPU:0, and asserts that the GPU kernels really ran (the direct backend's dispatch counters and
the result's device). Exit status 0 and a last line "ok CHECK ..." on success; an AssertionError otherwise.

Tolerances: forward passes and d/dpositions compute the same float32 expressions in the same order as the CPU
kernels (rtol 1e-5, atol 1e-6; float16 outputs within 1e-3 relative); d/dparams sums with float atomics in an
order that differs from the CPU's point order (rtol 1e-4, atol 1e-5; float16 tables 2e-3).
"""

from __future__ import annotations

import os
import threading

os.environ.setdefault("TF_METAL_OPS_EMULATED_GPU", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_metal_ops as t  # noqa: E402
from tf_metal_ops import emulated_gpu  # noqa: E402

from tf_metal_ops.hash_grid import HashGridConfig, hash_grid_encode_params_grad  # noqa: E402

from support.gpu_check_runner import collect, main  # noqa: E402
from support.hash_grid_cases import GRID_TYPES, INTERPOLATIONS, random_positions  # noqa: E402

GPU, CPU = "/GPU:0", "/CPU:0"


def assert_no_device_errors():
    """No stream of the emulated GPU is in error; under the Metal backend, no command buffer failed."""
    if emulated_gpu.loaded_backend() == "metal":
        info = emulated_gpu.metal_info()
        assert info["gpu_errors"] == 0, info
    else:
        stats = emulated_gpu.device_stats()
        assert all(s["error"] is None for s in stats["streams"]), stats


class Dispatches:
    """Counts the emulated GPU's kernel dispatches made inside the block."""

    def __enter__(self):
        self.before = emulated_gpu.dispatch_counts()
        return self

    def __exit__(self, *exc):
        after = emulated_gpu.dispatch_counts()
        self.delta = {k: v - self.before.get(k, 0) for k, v in after.items() if v - self.before.get(k, 0)}

    def require(self, *kernels):
        for k in kernels:
            assert self.delta.get(k, 0) > 0, f"kernel {k} did not run on the emulated GPU (ran: {self.delta})"


def close(a, b, rtol, atol, what):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    assert a.shape == b.shape, f"{what}: shapes {a.shape} vs {b.shape}"
    bad = ~np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    assert not bad.any(), f"{what}: {bad.sum()} of {a.size} differ, max |diff| {np.nanmax(np.abs(a - b)):.3g}"


def on_gpu(x):
    assert x.device.endswith("GPU:0"), f"result on {x.device}, not on the emulated GPU"


# ---- hash grid -------------------------------------------------------------------------------------------------
def hash_grid_run(device, cfg, x, p, dy, max_level):
    with tf.device(device):
        xv, pv, dyv = tf.constant(x), tf.constant(p), tf.constant(dy)
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([xv, pv])
            y = t.hash_grid_encode(xv, pv, max_level=max_level, **cfg.op_kwargs())
        gp, gx = tape.gradient(y, [pv, xv], output_gradients=dyv)
    return y, gp, gx


def random_hash_grid_case(rng, d, grid_type, interpolation, dtype):
    while True:
        try:
            cfg = HashGridConfig(
                d, n_levels=int(rng.integers(1, 7)), n_features_per_level=int(rng.choice([1, 2, 4, 8])),
                log2_hashmap_size=int(rng.integers(3, 12)), base_resolution=int(rng.integers(1, 12)),
                per_level_scale=float(rng.uniform(1.0, 2.0)), grid_type=grid_type, interpolation=interpolation)
        except ValueError:
            continue
        if cfg.total_entries <= 150_000:
            break
    n = int(rng.choice([1, 63, 65, 300]))
    x = random_positions(rng, n, d)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(dtype)
    dy = rng.standard_normal((n, cfg.n_output_dims)).astype(dtype)
    kind = rng.integers(0, 3)  # max_level as int, float, tensor
    if kind == 0:
        max_level = int(rng.integers(0, cfg.n_levels + 1))
    elif kind == 1:
        max_level = float(rng.uniform(0, 1.2))
    else:
        max_level = tf.constant(float(rng.uniform(0, 1.2)), tf.float32)
    return cfg, x, p, dy, max_level


def check_hash_grid(seed):
    rng = np.random.default_rng(seed)
    cases = 0
    for d in (1, 2, 3, 4):
        for grid_type in GRID_TYPES:
            for interpolation in INTERPOLATIONS:
                for dtype in (np.float32, np.float16):
                    cfg, x, p, dy, max_level = random_hash_grid_case(rng, d, grid_type, interpolation, dtype)
                    what = f"D={d} {grid_type} {interpolation} {np.dtype(dtype).name} levels={cfg.n_levels} " \
                           f"F={cfg.n_features_per_level} N={x.shape[0]} max_level={max_level!r}"
                    suffix = "float16" if dtype == np.float16 else "float32"
                    with Dispatches() as ran:
                        yg, gpg, gxg = hash_grid_run(GPU, cfg, x, p, dy, max_level)
                    d3f2 = "_d3f2" if (d, cfg.n_features_per_level, interpolation) == (3, 2, "linear") else ""
                    ran.require(f"hash_grid_encode{d3f2}_{suffix}", "hash_grid_fill_zero",
                                f"hash_grid_grad_positions{d3f2}_{suffix}")
                    if dtype == np.float16:
                        ran.require("hash_grid_float_to_half")
                    for v in (yg, gpg, gxg):
                        on_gpu(v)
                    yc, gpc, gxc = hash_grid_run(CPU, cfg, x, p, dy, max_level)
                    f16 = dtype == np.float16
                    close(yg, yc, 1e-3 if f16 else 1e-5, 1e-3 if f16 else 1e-6, "forward " + what)
                    close(gpg, gpc, 2e-3 if f16 else 1e-4, 2e-3 if f16 else 1e-5, "d/dparams " + what)
                    close(gxg, gxc, 1e-4 if f16 else 1e-5, 1e-4 if f16 else 1e-5, "d/dpositions " + what)
                    cases += 1
    # Hashed levels really occur (the finest level of a fine grid with a small table).
    cfg = HashGridConfig(3, n_levels=4, log2_hashmap_size=6, base_resolution=8, per_level_scale=2.0)
    assert any(cfg.layout().hashed), cfg.layout()
    x = random_positions(rng, 500, 3)
    for dtype in (np.float32, np.float16):
        p = rng.uniform(-1, 1, cfg.params_shape).astype(dtype)
        dy = rng.standard_normal((500, cfg.n_output_dims)).astype(dtype)
        g = hash_grid_run(GPU, cfg, x, p, dy, 4)
        c = hash_grid_run(CPU, cfg, x, p, dy, 4)
        for a, b, what in zip(g, c, ("forward", "d/dparams", "d/dpositions")):
            close(a, b, 2e-3, 2e-3, f"hashed {what} {np.dtype(dtype).name}")
        cases += 1
    return f"{cases} configurations"


def check_hash_grid_edges(seed):
    """Empty batches, NaN/inf positions (documented: clamped, NaN -> 0, zero gradient), errors on the GPU."""
    cfg = HashGridConfig(3, n_levels=4, log2_hashmap_size=8, base_resolution=4, per_level_scale=1.5)
    rng = np.random.default_rng(seed)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    for n in (0,):
        x = np.zeros((n, 3), np.float32)
        y, gp, gx = hash_grid_run(GPU, cfg, x, p, np.zeros((n, cfg.n_output_dims), np.float32), 4)
        assert y.shape == (0, cfg.n_output_dims) and gx.shape == (0, 3)
        assert not np.asarray(gp).any(), "empty batch: the table gradient must be all zeros"
    x = np.array([[np.nan, 0.5, 0.5], [np.inf, -np.inf, 0.2], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]], np.float32)
    dy = rng.standard_normal((4, cfg.n_output_dims)).astype(np.float32)
    yg, _, gxg = hash_grid_run(GPU, cfg, x, p, dy, 4)
    clamped = np.array([[0.0, 0.5, 0.5], [1.0, 0.0, 0.2], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]], np.float32)
    yc = hash_grid_run(CPU, cfg, clamped, p, dy, 4)[0]
    close(yg, yc, 1e-6, 1e-6, "NaN/inf positions are clamped like [0,1] positions")
    gxg = np.asarray(gxg)
    assert np.all(np.isfinite(gxg)) and gxg[0, 0] == 0 and gxg[1, 0] == 0 and gxg[1, 1] == 0, gxg
    with tf.device(GPU):
        try:
            from tf_metal_ops._library import ops  # the raw op: the kernel validates, not the wrapper

            ops().hash_grid_encode(tf.constant(x), tf.constant(p[:-8]), tf.constant(4), **cfg.op_kwargs())
        except tf.errors.InvalidArgumentError as e:
            assert "rows" in str(e), e
        else:
            raise AssertionError("a table of the wrong size must fail on the GPU too")
    return "empty, NaN/inf, wrong table size"


def second_order_case_config(d, grid_type, interpolation, n_features):
    """Hashed fine levels (hash), levels finer than the tile (tiled), dense levels (as test_hash_grid_second_order)."""
    if grid_type == "hash":
        cfg = HashGridConfig(d, n_levels=4, n_features_per_level=n_features, log2_hashmap_size={2: 7, 3: 8, 4: 9}[d],
                             base_resolution=4, per_level_scale=1.8, interpolation=interpolation)
        assert any(cfg.layout().hashed), cfg.layout()
        return cfg
    if grid_type == "tiled":
        return HashGridConfig(d, n_levels=3, n_features_per_level=n_features, base_resolution=3,
                              per_level_scale=1.7, grid_type="tiled", interpolation=interpolation)
    return HashGridConfig(d, n_levels=3, n_features_per_level=n_features, base_resolution=3, per_level_scale=1.5,
                          grid_type="dense", interpolation=interpolation)


def second_order_run(device, cfg, ddx, dy, x, p, max_level, deterministic=False):
    from tf_metal_ops._library import ops
    from tf_metal_ops.hash_grid.ops import _max_level_tensor

    with tf.device(device):
        args = [tf.constant(v) for v in (ddx, dy, x, p)]
        return ops().hash_grid_encode_grad_positions_grad(*args, _max_level_tensor(max_level, cfg.n_levels),
                                                          deterministic=deterministic, **cfg.op_kwargs())


def check_hash_grid_second_order(seed):
    """HashGridEncodeGradPositionsGrad (second derivatives) on /GPU:0 against the CPU kernel: D = 2..4, every grid
    type (hashed levels included), interpolation and table dtype; the gradient through nested tapes on the GPU;
    an empty batch."""
    rng = np.random.default_rng(seed)
    cases = 0
    for d in (2, 3, 4):
        for grid_type in GRID_TYPES:
            for interpolation in INTERPOLATIONS:
                for dtype in (np.float32, np.float16):
                    cfg = second_order_case_config(d, grid_type, interpolation, int(rng.choice([1, 2, 4, 8])))
                    n = int(rng.choice([1, 63, 65, 300]))
                    x = random_positions(rng, n, d)
                    p = rng.uniform(-1, 1, cfg.params_shape).astype(dtype)
                    dy = rng.standard_normal((n, cfg.n_output_dims)).astype(dtype)
                    ddx = rng.standard_normal((n, d)).astype(np.float32)
                    max_level = [None, int(rng.integers(0, cfg.n_levels + 1)), float(rng.uniform(0, 1.2))][cases % 3]
                    suffix = "float16" if dtype == np.float16 else "float32"
                    what = f"D={d} {grid_type} {interpolation} {suffix} F={cfg.n_features_per_level} N={n} " \
                           f"max_level={max_level!r}"
                    with Dispatches() as ran:
                        g = second_order_run(GPU, cfg, ddx, dy, x, p, max_level)
                    d3f2 = "_d3f2" if (d, cfg.n_features_per_level, interpolation) == (3, 2, "linear") else ""
                    ran.require(f"hash_grid_grad2_points{d3f2}_{suffix}", "hash_grid_fill_zero")
                    active = max_level is None or (isinstance(max_level, int) and max_level > 0) or \
                        (isinstance(max_level, float) and max_level * cfg.n_levels + 1e-3 > 0)
                    if interpolation != "nearest" and active:
                        ran.require(f"hash_grid_grad2_params{d3f2}_{suffix}")
                    if dtype == np.float16:
                        ran.require("hash_grid_float_to_half")
                    for v in g:
                        on_gpu(v)
                    c = second_order_run(CPU, cfg, ddx, dy, x, p, max_level)
                    f16 = dtype == np.float16
                    for name, a, b, rtol in (("d/d(dy)", g[0], c[0], 1e-5), ("d/dparams", g[1], c[1], 1e-4),
                                             ("d/dpositions", g[2], c[2], 1e-5)):
                        b64 = np.asarray(b, np.float64)
                        scale = max(1.0, float(np.abs(b64).max()))
                        close(a, b, 2e-3 if f16 else rtol, (2e-3 if f16 else rtol) * scale, f"{name} {what}")
                    if interpolation == "nearest":
                        assert not any(np.asarray(v).any() for v in g), f"nearest must give zeros: {what}"
                    cases += 1
    # Through nested tapes on the GPU (the registered gradient of HashGridEncodeGradPositions places its op there).
    cfg = second_order_case_config(3, "hash", "smoothstep", 2)
    x = rng.uniform(0, 1, (200, 3)).astype(np.float32)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    res = {}
    for device in (GPU, CPU):
        with tf.device(device):
            xv, pv = tf.constant(x), tf.constant(p)
            with Dispatches() as ran:
                with tf.GradientTape() as outer:
                    outer.watch(pv)
                    with tf.GradientTape() as inner:
                        inner.watch(xv)
                        y = t.hash_grid_encode(xv, pv, **cfg.op_kwargs())
                    gx = inner.gradient(y, xv)
                    eik = tf.reduce_sum(tf.square(tf.norm(gx, axis=-1) - 1.0))
                res[device] = outer.gradient(eik, pv)
            if device == GPU:
                ran.require("hash_grid_grad2_points_float32", "hash_grid_grad2_params_float32")
    close(res[GPU], res[CPU], 1e-4, 1e-4 * max(1.0, float(np.abs(res[CPU]).max())), "nested tapes d/dparams")
    # Empty batch: only the zeroed table gradient.
    g = second_order_run(GPU, cfg, np.zeros((0, 3), np.float32), np.zeros((0, cfg.n_output_dims), np.float32),
                         np.zeros((0, 3), np.float32), p, None)
    assert g[0].shape == (0, cfg.n_output_dims) and g[2].shape == (0, 3) and not np.asarray(g[1]).any()
    return f"{cases} configurations, nested tapes, empty batch"


def check_hash_grid_deterministic(seed):
    """The deterministic table gradients (attr deterministic=True: fixed-point sums, metal_kernels/hash_grid.metal
    HgFixedSink) on /GPU:0: the _det kernels ran, the results match the CPU kernel within the float-atomic
    tolerances, two runs are bitwise equal, and non-finite incoming gradients give what float sums give. The last
    line's summary ends with a digest of every result's bytes: tests/test_emulated_gpu.py compares it across thread
    orders, worker counts and both GPU backends (bitwise reproducible)."""
    import hashlib

    rng = np.random.default_rng(seed)
    digest = hashlib.sha256()
    cases = 0
    configs = [  # (D, grid type, interpolation, F): the _d3f2 kernels, hashed levels, every grid type and dtype
        (3, "hash", "linear", 2), (3, "hash", "smoothstep", 2), (2, "dense", "linear", 4), (4, "tiled", "linear", 1),
        (1, "hash", "nearest", 8), (2, "hash", "smoothstep", 2)]
    for d, grid_type, interpolation, f in configs:
        for dtype in (np.float32, np.float16):
            suffix = "float16" if dtype == np.float16 else "float32"
            cfg = second_order_case_config(max(d, 2), grid_type, interpolation, f) if d > 1 else HashGridConfig(
                1, n_levels=5, n_features_per_level=f, log2_hashmap_size=4, base_resolution=3, per_level_scale=2.0,
                interpolation=interpolation)
            n = int(rng.choice([65, 300]))
            x = random_positions(rng, n, cfg.n_input_dims)
            p = rng.uniform(-1, 1, cfg.params_shape).astype(dtype)
            dy = (rng.standard_normal((n, cfg.n_output_dims)) * 10.0 ** rng.uniform(-3, 3)).astype(dtype)
            ddx = rng.standard_normal((n, cfg.n_input_dims)).astype(np.float32)
            what = f"D={cfg.n_input_dims} {grid_type} {interpolation} F={f} {suffix} N={n}"
            opts = {**cfg.op_kwargs(), "deterministic": True}
            d3f2 = "_d3f2" if (cfg.n_input_dims, f, interpolation) == (3, 2, "linear") else ""
            runs = []
            for _ in range(2):
                with Dispatches() as ran:
                    with tf.device(GPU):
                        g1 = hash_grid_encode_params_grad(x, tf.constant(p), tf.constant(dy), **opts)
                    g2 = second_order_run(GPU, cfg, ddx, dy, x, p, None, deterministic=True)
                ran.require(f"hash_grid_grad_params_det{d3f2}_{suffix}", f"hash_grid_abs_max_{suffix}",
                            "hash_grid_fixed_exponents", f"hash_grid_fixed_to_{suffix}")
                if interpolation != "nearest":
                    ran.require(f"hash_grid_grad2_params_det{d3f2}_{suffix}", "hash_grid_abs_max_float32")
                on_gpu(g1)
                runs.append([np.asarray(g1), np.asarray(g2[1])])
            for a, b in zip(*runs):
                assert a.tobytes() == b.tobytes(), f"two runs differ: {what}"
            with tf.device(CPU):
                c1 = hash_grid_encode_params_grad(x, tf.constant(p), tf.constant(dy), **cfg.op_kwargs())
            c2 = second_order_run(CPU, cfg, ddx, dy, x, p, None)
            f16 = dtype == np.float16
            for name, a, b in (("d/dparams", runs[0][0], c1), ("second-order d/dparams", runs[0][1], c2[1])):
                scale = max(1.0, float(np.abs(np.asarray(b, np.float64)).max()))
                close(a, b, 2e-3 if f16 else 1e-4, (2e-3 if f16 else 1e-5) * scale, f"deterministic {name} {what}")
            for a in runs[0]:
                digest.update(a.tobytes())
            cases += 1
    # Non-finite incoming gradients: the entries they reach become what float addition gives (inf, -inf, NaN).
    cfg = HashGridConfig(3, n_levels=2, log2_hashmap_size=6, base_resolution=2, per_level_scale=2.0)
    x = random_positions(rng, 40, 3)
    dy = rng.standard_normal((40, cfg.n_output_dims)).astype(np.float32)
    dy[3, 0], dy[7, 1], dy[11, 0], dy[11, 2] = np.inf, np.nan, -np.inf, np.inf
    p = np.zeros(cfg.params_shape, np.float32)
    with tf.device(GPU):
        g = np.asarray(hash_grid_encode_params_grad(x, p, dy, deterministic=True, **cfg.op_kwargs()))
    with tf.device(CPU):
        c = np.asarray(hash_grid_encode_params_grad(x, p, dy, **cfg.op_kwargs()))
    assert np.isinf(c).any() and np.isnan(c).any(), "the case must reach both"
    assert np.array_equal(np.isnan(g), np.isnan(c)) and np.array_equal(np.isposinf(g), np.isposinf(c)) and \
        np.array_equal(np.isneginf(g), np.isneginf(c)), "non-finite entries differ from the CPU's"
    close(g, c, 1e-4, 1e-5, "deterministic d/dparams with non-finite dy (finite entries)")
    digest.update(g.tobytes())
    return f"{cases} configurations, non-finite dy; digest {digest.hexdigest()[:16]}"


def check_hash_grid_feature_major(seed):
    """feature_major=True ([L*F, N] encodings and gradients) on /GPU:0: the encode (the host's G = 1) bitwise the
    transpose of the point-major GPU encode and equal to the CPU kernel's, first- and second-order gradients of a
    transposed dy (float atomics and the deterministic fixed-point sums) against the CPU kernel, the _d3f2 kernels
    and the general ones, both table dtypes, inactive levels."""
    from tf_metal_ops._library import ops

    rng = np.random.default_rng(seed)
    cases = 0
    for d, f, interpolation in ((3, 2, "linear"), (2, 4, "smoothstep"), (3, 1, "linear")):
        for dtype in (np.float32, np.float16):
            cfg = HashGridConfig(d, n_levels=5, n_features_per_level=f, log2_hashmap_size=8, base_resolution=4,
                                 per_level_scale=1.7, interpolation=interpolation)
            n, max_level = int(rng.choice([65, 300])), 4
            x = random_positions(rng, n, d)
            p = rng.uniform(-1, 1, cfg.params_shape).astype(dtype)
            dy_t = rng.standard_normal((cfg.n_output_dims, n)).astype(dtype)
            ddx = rng.standard_normal((n, d)).astype(np.float32)
            suffix = "float16" if dtype == np.float16 else "float32"
            d3f2 = "_d3f2" if (d, f, interpolation) == (3, 2, "linear") else ""
            what = f"D={d} F={f} {interpolation} {suffix} N={n}"
            res = {}
            for device in (GPU, CPU):
                with tf.device(device):
                    xv, pv, dyv = tf.constant(x), tf.constant(p), tf.constant(dy_t)
                    with Dispatches() as ran:
                        with tf.GradientTape(persistent=True) as tape:
                            tape.watch([xv, pv])
                            y = t.hash_grid_encode(xv, pv, max_level=max_level, feature_major=True,
                                                   **cfg.op_kwargs())
                        gp, gx = tape.gradient(y, [pv, xv], output_gradients=dyv)
                        so = ops().hash_grid_encode_grad_positions_grad(
                            tf.constant(ddx), dyv, xv, pv, tf.constant(max_level), feature_major=True,
                            **cfg.op_kwargs())
                        det = hash_grid_encode_params_grad(xv, pv, dyv, max_level=max_level, feature_major=True,
                                                           deterministic=True, **cfg.op_kwargs())
                        y_pm = t.hash_grid_encode(xv, pv, max_level=max_level, **cfg.op_kwargs())
                    if device == GPU:
                        ran.require(f"hash_grid_encode_fm{d3f2}_{suffix}", f"hash_grid_grad_params{d3f2}_{suffix}",
                                    f"hash_grid_grad_positions{d3f2}_{suffix}", f"hash_grid_grad2_points{d3f2}_{suffix}",
                                    f"hash_grid_grad_params_det{d3f2}_{suffix}")
                        for v in (y, gp, gx, *so, det):
                            on_gpu(v)
                    res[device] = [np.asarray(v) for v in (y, gp, gx, *so, det)] + [np.asarray(y_pm)]
            g, c = res[GPU], res[CPU]
            assert g[0].shape == (cfg.n_output_dims, n), g[0].shape
            assert np.array_equal(g[0], g[-1].T), f"feature-major encode is not the point-major one transposed: {what}"
            assert not g[0][max_level * f:].any() and g[0][:max_level * f].any(), what
            f16 = dtype == np.float16
            for name, a, b, rtol in (("forward", g[0], c[0], 1e-5), ("d/dparams", g[1], c[1], 1e-4),
                                     ("d/dpositions", g[2], c[2], 1e-5), ("second order d/d(dy)", g[3], c[3], 1e-5),
                                     ("second order d/dparams", g[4], c[4], 1e-4),
                                     ("second order d/dpositions", g[5], c[5], 1e-5),
                                     ("deterministic d/dparams", g[6], c[6], 1e-4)):
                scale = max(1.0, float(np.abs(np.asarray(b, np.float64)).max()))
                close(a, b, 2e-3 if f16 else rtol, (2e-3 if f16 else rtol) * scale, f"feature-major {name} {what}")
            cases += 1
    return f"{cases} configurations"


def check_hash_grid_without_float_atomics(seed):
    """On a GPU without atomic_float (the Metal backend on a device without Metal 3, TFMO_MOCK_METAL_NO_METAL3=1; the
    direct backend at MSL 2.4) both table gradients are fixed-point sums by default (csrc/gpu/hash_grid_gpu.cc
    FixedPoint): the _det kernels ran and no float scatter did; the result matches the CPU kernel within the
    float-atomic tolerances and equals deterministic=True's bit for bit."""
    assert os.environ.get("TFMO_MOCK_METAL_NO_METAL3") == "1" or \
        os.environ.get("TF_METAL_OPS_EMULATED_GPU_MSL") == "2.4", "run on a device without atomic_float"
    import hashlib

    rng = np.random.default_rng(seed)
    digest = hashlib.sha256()
    cases = 0
    for d, grid_type, interpolation, f in ((3, "hash", "linear", 2), (2, "dense", "smoothstep", 4)):
        for dtype in (np.float32, np.float16):
            suffix = "float16" if dtype == np.float16 else "float32"
            cfg = second_order_case_config(d, grid_type, interpolation, f)
            n = 300
            x = random_positions(rng, n, d)
            p = rng.uniform(-1, 1, cfg.params_shape).astype(dtype)
            dy = rng.standard_normal((n, cfg.n_output_dims)).astype(dtype)
            ddx = rng.standard_normal((n, d)).astype(np.float32)
            what = f"D={d} {grid_type} {interpolation} F={f} {suffix}"
            d3f2 = "_d3f2" if (d, f, interpolation) == (3, 2, "linear") else ""
            with Dispatches() as ran:
                with tf.device(GPU):
                    g1 = hash_grid_encode_params_grad(x, tf.constant(p), tf.constant(dy), **cfg.op_kwargs())
                g2 = second_order_run(GPU, cfg, ddx, dy, x, p, None)
            ran.require(f"hash_grid_grad_params_det{d3f2}_{suffix}", f"hash_grid_grad2_params_det{d3f2}_{suffix}",
                        f"hash_grid_fixed_to_{suffix}")
            floats = [k for k in ran.delta if k.startswith(("hash_grid_grad_params", "hash_grid_grad2_params"))
                      and "_det" not in k] + [k for k in ("hash_grid_fill_zero", "hash_grid_float_to_half")
                                              if k in ran.delta]
            assert not floats, f"float-atomic table-gradient passes ran: {floats} ({what})"
            on_gpu(g1)
            with tf.device(GPU):
                d1 = hash_grid_encode_params_grad(x, tf.constant(p), tf.constant(dy), deterministic=True,
                                                  **cfg.op_kwargs())
            d2 = second_order_run(GPU, cfg, ddx, dy, x, p, None, deterministic=True)
            assert np.asarray(g1).tobytes() == np.asarray(d1).tobytes(), f"d/dparams != deterministic=True: {what}"
            assert np.asarray(g2[1]).tobytes() == np.asarray(d2[1]).tobytes(), f"second order: {what}"
            with tf.device(CPU):
                c1 = hash_grid_encode_params_grad(x, tf.constant(p), tf.constant(dy), **cfg.op_kwargs())
            c2 = second_order_run(CPU, cfg, ddx, dy, x, p, None)
            f16 = dtype == np.float16
            for name, a, b in (("d/dparams", g1, c1), ("second-order d/dparams", g2[1], c2[1])):
                scale = max(1.0, float(np.abs(np.asarray(b, np.float64)).max()))
                close(a, b, 2e-3 if f16 else 1e-4, (2e-3 if f16 else 1e-5) * scale, f"{name} {what}")
            digest.update(np.asarray(g1).tobytes() + np.asarray(g2[1]).tobytes())
            cases += 1
    return f"{cases} configurations: fixed-point table gradients by default; digest {digest.hexdigest()[:16]}"


# ---- rendering ----------------------------------------------------------------------------------------------------
def render_case(rng, r, s, c):
    sigma = rng.gamma(1.0, 2.0, (r, s)).astype(np.float32)
    rgb = rng.random((r, s, c), dtype=np.float32)
    tt = np.sort(rng.uniform(2.0, 6.0, (r, s + 1)), axis=1).astype(np.float32)
    return sigma, rgb, tt


def volume_render_run(device, sigma, rgb, tt, bg, threshold):
    with tf.device(device):
        args = [tf.constant(v) for v in (sigma, rgb, tt)]
        bgv = None if bg is None else tf.constant(bg)
        watched = args + ([bgv] if bgv is not None else [])
        with tf.GradientTape() as tape:
            tape.watch(watched)
            out = t.volume_render(*args, bgv, termination_threshold=threshold)
            loss = (tf.reduce_sum(out.color ** 2) + tf.reduce_sum(out.depth) + tf.reduce_sum(out.opacity * 0.5)
                    + tf.reduce_sum(out.weights ** 2))
        grads = tape.gradient(loss, watched)
    return [*out, *grads]


def check_volume_render(seed):
    rng = np.random.default_rng(seed)
    cases = 0
    for r, s, c in ((1, 1, 1), (37, 16, 3), (300, 64, 4)):
        sigma, rgb, tt = render_case(rng, r, s, c)
        backgrounds = {"none": None, "shared": rng.random(c, dtype=np.float32),
                       "per-ray": rng.random((r, c), dtype=np.float32)}
        for name, bg in backgrounds.items():
            for threshold in (0.0, 1e-2):
                with Dispatches() as ran:
                    g = volume_render_run(GPU, sigma, rgb, tt, bg, threshold)
                ran.require("volume_render_forward", "volume_render_backward")
                for i, v in enumerate(g[:7]):  # outputs, d/d(densities, colours, t); a shared background's
                    # gradient is summed over rays by a standard TF op, which the CPU wheel has only on the CPU
                    assert v.device.endswith("GPU:0"), f"volume_render output/grad {i} R={r} S={s} bg={name} on {v.device}"
                cpu = volume_render_run(CPU, sigma, rgb, tt, bg, threshold)
                for i, (a, b) in enumerate(zip(g, cpu)):
                    close(a, b, 1e-5, 1e-5, f"volume_render output/grad {i} R={r} S={s} C={c} bg={name} thr={threshold}")
                cases += 1
    # Empty work: no rays, no samples.
    for r, s in ((0, 8), (5, 0)):
        sigma, rgb, tt = render_case(rng, r, s, 3)
        g = volume_render_run(GPU, sigma, rgb, tt, np.ones(3, np.float32), 0.0)
        cpu = volume_render_run(CPU, sigma, rgb, tt, np.ones(3, np.float32), 0.0)
        for a, b in zip(g, cpu):
            close(a, b, 0, 0, f"volume_render R={r} S={s}")
    # Invalid rays: the GPU cannot fail the op, so the documented policy is NaN outputs for that ray (the CPU raises).
    sigma, rgb, tt = render_case(rng, 4, 8, 3)
    sigma[1, 3] = -1.0
    tt[2, [4, 5]] = tt[2, [5, 4]]
    g = volume_render_run(GPU, sigma, rgb, tt, None, 0.0)
    color = np.asarray(g[0])
    assert np.isnan(color[1]).all() and np.isnan(color[2]).all(), color
    assert np.isfinite(color[[0, 3]]).all(), color
    try:
        volume_render_run(CPU, sigma, rgb, tt, None, 0.0)
    except tf.errors.InvalidArgumentError:
        pass
    else:
        raise AssertionError("the CPU kernel must reject negative densities / unsorted t")
    return f"{cases} configurations, empty work, invalid rays"


def check_distortion_loss(seed):
    rng = np.random.default_rng(seed)
    for r, s in ((1, 1), (64, 33), (0, 4), (3, 0)):
        sigma, _, tt = render_case(rng, r, s, 1)
        w = (sigma / np.maximum(sigma.sum(axis=1, keepdims=True), 1e-6)).astype(np.float32)
        res = {}
        for device in (GPU, CPU):
            with tf.device(device):
                wv, tv = tf.constant(w), tf.constant(tt)
                with tf.GradientTape() as tape:
                    tape.watch([wv, tv])
                    loss = t.distortion_loss(wv, tv)
                res[device] = [loss, *tape.gradient(loss, [wv, tv])]
        if r and s:
            for v in res[GPU]:
                on_gpu(v)
        for i, (a, b) in enumerate(zip(res[GPU], res[CPU])):
            close(a, b, 1e-5, 1e-6, f"distortion_loss output/grad {i} R={r} S={s}")
    return "4 shapes"


# ---- packed rendering ---------------------------------------------------------------------------------------------
def packed_run(device, inputs, threshold, up_seed=0):
    """volume_render_packed + distortion_loss_packed and every gradient on `device` (outputs first)."""
    d, c, ts, te, rs, bg = inputs
    with tf.device(device):
        args = [tf.constant(v) for v in (d, c, ts, te)]
        rsv = tf.constant(rs)
        bgv = None if bg is None else tf.constant(bg)
        watched = args + ([bgv] if bgv is not None else [])
        with tf.GradientTape() as tape:
            tape.watch(watched)
            out = t.volume_render_packed(*args, rsv, bgv, termination_threshold=threshold)
            dl = t.distortion_loss_packed(out.weights, args[2], args[3], rsv)
            loss = (tf.reduce_sum(out.color ** 2) + tf.reduce_sum(out.depth) + tf.reduce_sum(out.opacity * 0.5)
                    + tf.reduce_sum(out.weights ** 2) + tf.reduce_sum(dl * 0.7))
        grads = tape.gradient(loss, watched)
    return [*out, dl, *grads]


PACKED_KERNELS = ("render_packed_check_init", "render_packed_check_splits", "volume_render_packed_forward",
                  "volume_render_packed_backward", "distortion_loss_packed_forward", "distortion_loss_packed_backward")


def check_render_packed(seed):
    """Packed ops and gradients on /GPU:0 against the CPU kernels. Both run the functions of
    csrc/shared/render_math.h, the CPU kernel's volume rendering on arrays with its own vectorised exp (as
    volume_render's): rtol 1e-5, atol 1e-5 * max(1, max |value|) (the t gradients are differences of terms)."""
    from support.render_packed_cases import make_packed, random_counts

    rng = np.random.default_rng(seed)
    cases = 0
    for r, hi, c in ((1, 1, 1), (37, 16, 3), (300, 64, 5)):
        counts = random_counts(rng, r, 0, hi)
        for name in ("none", "shared", "per_ray"):
            inputs = make_packed(counts, c, seed=seed + cases, bg=name)
            for threshold in (0.0, 1e-2):
                with Dispatches() as ran:
                    g = packed_run(GPU, inputs, threshold)
                ran.require(*PACKED_KERNELS)
                for i, v in enumerate(g[:7]):  # outputs, d/d(densities, colours); the t gradients add two ops'
                    # contributions with a standard TF op (AddN), which runs on the CPU
                    assert v.device.endswith("GPU:0"), f"render_packed output/grad {i} R={r} bg={name} on {v.device}"
                cpu = packed_run(CPU, inputs, threshold)
                for i, (a, b) in enumerate(zip(g, cpu)):
                    scale = max(1.0, float(np.nanmax(np.abs(np.asarray(b))))) if np.size(b) else 1.0
                    close(a, b, 1e-5, 1e-5 * scale, f"render_packed output/grad {i} R={r} C={c} bg={name} "
                          f"thr={threshold}")
                cases += 1
    # The GPU kernels run a SIMD group of 32 lanes per ray, in chunks of 32 samples: rays that stop (T < threshold) at
    # the chunk edges (last lane, first lane of the next chunk) and in a later chunk, and rays of 32, 33 and 64
    # samples (one opaque sample each; otherwise nearly transparent).
    d, c, ts, te, rs, bg = make_packed([70, 70, 70, 70, 32, 33, 64], 5, seed=seed, dens_scale=0.01, bg="shared")
    for r, opaque in enumerate((30, 31, 63, 0, 31, 20, 40)):
        d[rs[r] + opaque] = 50.0
    inputs = (d, c, ts, te, rs, bg)
    for threshold in (0.0, 0.1):
        g, cpu = packed_run(GPU, inputs, threshold), packed_run(CPU, inputs, threshold)
        for i, (a, b) in enumerate(zip(g, cpu)):
            scale = max(1.0, float(np.nanmax(np.abs(np.asarray(b)))))
            close(a, b, 1e-5, 1e-5 * scale, f"render_packed output/grad {i}, stops at chunk edges, thr={threshold}")
    stops = [int(np.argmin(np.asarray(cpu[3])[rs[r]:rs[r + 1]] != 0)) for r in range(4)]
    assert stops == [31, 32, 64, 1], stops  # threshold 0.1: the sample after the opaque one is the first not composited
    # Empty work: no rays; rays without samples.
    for counts in ([], [0, 0, 0]):
        inputs = make_packed(counts, 3, seed=1, bg="per_ray")
        g = packed_run(GPU, inputs, 0.0)
        cpu = packed_run(CPU, inputs, 0.0)
        for a, b in zip(g, cpu):
            close(a, b, 0, 0, f"render_packed counts={counts}")
    return f"{cases} configurations, stops at chunk edges, empty work"


def check_render_packed_nan_policy(seed):
    """Invalid packed input on the GPU: NaN outputs (documented in metal_kernels/render_packed.metal), never a crash
    or an out-of-bounds access (the emulated GPU faults on those); the CPU kernels raise instead."""
    from support.render_packed_cases import make_packed

    good = make_packed([3, 5, 0, 4, 2], 3, seed=seed, bg="shared")
    d, c, ts, te, rs, bg = good
    N = len(d)
    bad_splits = {
        "not_from_0": [2, 3, 8, 8, 12, 14],
        "decreasing": [0, 5, 3, 8, 12, 14],
        "last_not_n": [0, 3, 8, 8, 12, 13],
        "garbage": [0, 1 << 30, -7, 2147483647, -2147483648, 14],
    }
    for name, splits in bad_splits.items():
        inputs = (d, c, ts, te, np.array(splits, np.int32), bg)
        with Dispatches() as ran:
            g = packed_run(GPU, inputs, 0.0)
        ran.require(*PACKED_KERNELS)
        for i, v in enumerate(g):
            assert np.isnan(np.asarray(v)).all(), f"bad row_splits {name}: output/grad {i} not all NaN: {v}"
        try:
            packed_run(CPU, inputs, 0.0)
        except tf.errors.InvalidArgumentError:
            pass
        else:
            raise AssertionError(f"the CPU kernel must reject row_splits {name}")
    # Invalid samples: ray 1 overlaps, ray 3 has a negative density; the other rays are untouched.
    ts_bad, d_bad = ts.copy(), d.copy()
    ts_bad[4] = te[3] - 0.01  # overlaps its predecessor (ray 1)
    d_bad[9] = -1.0  # ray 3
    g = packed_run(GPU, (d_bad, c, ts_bad, te, rs, bg), 0.0)
    want = packed_run(CPU, good, 0.0)
    color, weights = np.asarray(g[0]), np.asarray(g[3])
    assert np.isnan(color[[1, 3]]).all() and np.isnan(weights[3:8]).all() and np.isnan(weights[8:12]).all()
    assert np.isnan(np.asarray(g[6])[3:8]).all() and np.isnan(np.asarray(g[7])[8:12]).all()  # gradients too
    ok = [0, 2, 4]
    close(color[ok], np.asarray(want[0])[ok], 1e-5, 1e-6, "valid rays beside invalid ones")  # as check_render_packed
    close(weights[:3], np.asarray(want[3])[:3], 1e-5, 1e-6, "weights of valid rays")
    # Samples but no rays: rejected on the host (no ray thread could report it).
    with tf.device(GPU):
        try:
            t.volume_render_packed(d, c, ts, te, np.zeros(1, np.int32))
        except tf.errors.InvalidArgumentError as e:
            assert "0 rays" in str(e), e
        else:
            raise AssertionError("row_splits [0] with samples must be an error on the GPU")
    assert_no_device_errors()
    return f"{len(bad_splits)} bad row_splits, invalid samples, samples without rays (N={N})"


def check_zero_out(seed):
    rng = np.random.default_rng(seed)
    for dtype in (np.int32, np.int64, np.float32, np.float16):
        for shape in ((), (1,), (3, 0), (5000,), (7, 9, 11)):
            x = (rng.standard_normal(shape) * 100).astype(dtype)
            with tf.device(GPU):
                xv = tf.constant(x)
                with Dispatches() as ran:
                    y = t.zero_out(xv)
                g = None
                if dtype in (np.float32, np.float16):
                    with tf.GradientTape() as tape:
                        tape.watch(xv)
                        z = t.zero_out(xv)
                    g = tape.gradient(z, xv)
            want = np.zeros_like(x).reshape(-1)
            if x.size:
                want[0] = x.reshape(-1)[0]
            assert np.array_equal(np.asarray(y).reshape(-1), want), (dtype, shape)
            # TF keeps int32 (and small int64) tensors in host memory and runs their ops on the CPU.
            if dtype in (np.float32, np.float16) and x.size > 1:  # (eager keeps a scalar's op on the CPU)
                on_gpu(y)
                ran.require(f"zero_out_{ {np.int64: 'int64', np.float32: 'float32', np.float16: 'float16'}[dtype] }")
            if g is not None and x.size:
                gw = np.zeros(x.size, dtype)
                gw[0] = 1
                assert np.array_equal(np.asarray(g).reshape(-1), gw), (dtype, shape)
    want = "direct" if os.environ["TF_METAL_OPS_EMULATED_GPU"] in ("1", "direct") else "metal"  # else: a metal build
    assert t.backend_info()["gpu_backend"] == want, t.backend_info()["gpu_backend"]
    return "4 dtypes x 5 shapes"


# ---- fused MLP ---------------------------------------------------------------------------------------------------
# (width, hidden layers, n_input, n_output, activation, output activation, bias, N): every width and activation,
# n_input / n_output not multiples of 16, N not a multiple of any block (16..64 rows) and smaller than one.
FUSED_MLP_CASES = [
    (16, 1, 5, 3, "relu", "none", False, 37),
    (16, 3, 16, 16, "leaky_relu", "sigmoid", True, 1),
    (32, 2, 20, 7, "softplus", "relu", True, 70),
    (64, 1, 32, 16, "relu", "none", False, 75),
    (64, 2, 33, 3, "sigmoid", "exponential", True, 41),
    (128, 1, 100, 1, "exponential", "softplus", False, 19),
    (128, 2, 3, 17, "none", "leaky_relu", True, 35),
]


def fused_mlp_case(rng, case, dtype):
    width, layers, n_in, n_out, act, out_act, bias, n = case
    lay = t.fused_mlp_layout(n_in, n_out, width=width, n_hidden_layers=layers, use_bias=bias)
    kw = dict(n_hidden_layers=layers, width=width, n_output=n_out, activation=act, output_activation=out_act,
              use_bias=bias)
    scale = 0.5 if act == "exponential" else 1.0  # keeps exp() of the hidden layers in range
    x = rng.uniform(-1, 1, (n, n_in)).astype(dtype)
    p = (rng.standard_normal(lay.n_params) * scale / np.sqrt(width)).astype(dtype)
    dy = rng.standard_normal((n, n_out)).astype(dtype)
    return kw, x, p, dy


def fused_mlp_run(device, kw, x, p, dy):
    """(y without training, y and hidden with training, dx, dparams) on `device`."""
    from tf_metal_ops._library import ops

    with tf.device(device):
        xv, pv, dyv = tf.constant(x), tf.constant(p), tf.constant(dy)
        y = t.fused_mlp(xv, pv, training=False, **kw)
        yt, hidden = ops().fused_mlp(xv, pv, training=True, **kw)
        with tf.GradientTape() as tape:
            tape.watch([xv, pv])
            yg = t.fused_mlp(xv, pv, **kw)
        dx, dp = tape.gradient(yg, [xv, pv], output_gradients=dyv)
    return y, yt, hidden, dx, dp


def close_to_reference(got, ref, f16, what):
    """float32: rtol 1e-4 and atol 1e-5 of the largest |ref| (float32 sums of up to 128 products per layer);
    float16: rtol 1e-2 and atol 4e-3 of the largest |ref| (activations rounded to half between layers, half
    products summed in float, outputs rounded to half)."""
    scale = max(float(np.abs(ref).max()) if ref.size else 0.0, 1e-3)
    close(got, ref, 1e-2 if f16 else 1e-4, (4e-3 if f16 else 1e-5) * scale, what)


def check_fused_mlp_many_blocks(seed):
    """More row blocks than the backward has threadgroups (1024): each threadgroup sums several blocks in order (the
    weights resident in threadgroup memory for float16, copied per block and layer for float32), and a forward
    threadgroup takes several blocks. y, dx and dparams against the float64 reference, dparams bitwise equal on a
    second run. The activation is smooth: over this many rows float16 rounding moves some relu inputs across 0,
    which changes a row of dx by a whole weight row against the reference."""
    from tf_metal_ops.fused_mlp import reference as ref

    rng = np.random.default_rng(seed)
    for dtype in (np.float32, np.float16):
        kw, x, p, dy = fused_mlp_case(rng, (64, 2, 32, 16, "softplus", "none", False, 33001), dtype)
        what = f"{np.dtype(dtype).name} N={x.shape[0]}"
        y, _, _, dx, dp = fused_mlp_run(GPU, kw, x, p, dy)
        y_ref, _, _ = ref.forward(x, p, **kw)
        dx_ref, dp_ref = ref.backward(dy, x, p, **kw)
        for name, got, want in (("y", y, y_ref), ("dx", dx, dx_ref), ("dparams", dp, dp_ref)):
            close_to_reference(got, want, dtype == np.float16, f"{name} {what}")
        again = fused_mlp_run(GPU, kw, x, p, dy)[4]
        assert np.asarray(dp).tobytes() == np.asarray(again).tobytes(), f"dparams differ run to run: {what}"
    return "float32 and float16, 33001 rows"


def check_fused_mlp(seed):
    """FusedMlp and FusedMlpGrad on /GPU:0 (metal_kernels/fused_mlp.metal) against the NumPy float64 reference
    (tf_metal_ops/fused_mlp/reference.py): y, the kept hidden activations, dx, dparams (its padding exactly 0);
    dparams bitwise equal on a second run; feature-major x bitwise equal to row-major x; N = 0; bad input raises InvalidArgumentError on the GPU. The last line
    ends with a digest of every GPU result (the same under every backend and thread order: fixed-order sums)."""
    import hashlib

    from tf_metal_ops._library import ops
    from tf_metal_ops.fused_mlp import reference as ref

    rng = np.random.default_rng(seed)
    digest = hashlib.sha256()
    cases = 0
    for case in FUSED_MLP_CASES:
        for dtype in (np.float32, np.float16):
            f16 = dtype == np.float16
            kw, x, p, dy = fused_mlp_case(rng, case, dtype)
            suffix = "float16" if f16 else "float32"
            what = f"{np.dtype(dtype).name} {kw} N={x.shape[0]} n_input={x.shape[1]}"
            with Dispatches() as ran:
                y, yt, hidden, dx, dp = fused_mlp_run(GPU, kw, x, p, dy)
            w = kw["width"]
            ran.require(f"fused_mlp_forward_w{w}_{suffix}", f"fused_mlp_backward_w{w}_{suffix}",
                        f"fused_mlp_reduce_{suffix}")
            for v in (y, yt, hidden, dx, dp):
                on_gpu(v)
            y_ref, pre, _ = ref.forward(x, p, **kw)
            dx_ref, dp_ref = ref.backward(dy, x, p, **kw)
            h_ref = np.stack([ref.activate(kw["activation"], z) for z in pre[:-1]])
            assert np.asarray(y).tobytes() == np.asarray(yt).tobytes(), f"y with and without training: {what}"
            close_to_reference(y, y_ref, f16, "y " + what)
            close_to_reference(hidden, h_ref, f16, "hidden " + what)
            close_to_reference(dx, dx_ref, f16, "dx " + what)
            close_to_reference(dp, dp_ref, f16, "dparams " + what)
            lay = t.fused_mlp_layout(x.shape[1], kw["n_output"], width=w, n_hidden_layers=kw["n_hidden_layers"],
                                     use_bias=kw["use_bias"])
            pad = np.zeros(lay.n_params, bool)  # W_1's padding columns, W_L's padding rows
            (o1, (r1, c1)), (ol, (rl, cl)) = lay.matrices[0], lay.matrices[-1]
            pad[o1:o1 + r1 * c1] |= (np.arange(c1) >= x.shape[1])[None, :].repeat(r1, 0).reshape(-1)
            pad[ol:ol + rl * cl] |= (np.arange(rl) >= kw["n_output"])[:, None].repeat(cl, 1).reshape(-1)
            assert not np.asarray(dp)[pad].any(), f"gradient of padding entries: {what}"
            if not f16:  # the CPU kernel: the same float32 math up to the summation order
                c = fused_mlp_run(CPU, kw, x, p, dy)
                for name, a, b in zip(("y", "y (training)", "hidden", "dx", "dparams"), (y, yt, hidden, dx, dp), c):
                    if name == "hidden" and b.shape[0] == 0:  # the CPU keeps none below width 128
                        continue
                    scale = max(float(np.abs(np.asarray(b)).max()), 1e-3)
                    close(a, b, 1e-4, 1e-5 * scale, f"GPU vs CPU {name} {what}")
            again = fused_mlp_run(GPU, kw, x, p, dy)
            for name, a, b in zip(("y", "y (training)", "hidden", "dx", "dparams"), (y, yt, hidden, dx, dp), again):
                assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), f"{name} differs run to run: {what}"
            # feature_major: x [n_input, N] read in place gives the row-major call's bits, dx transposed.
            fm = fused_mlp_run(GPU, {**kw, "feature_major": True}, np.ascontiguousarray(x.T), p, dy)
            assert fm[3].shape == x.T.shape, f"feature-major dx shape {fm[3].shape}: {what}"
            for name, a, b in zip(("y", "y (training)", "hidden", "dx^T", "dparams"),
                                  (y, yt, hidden, np.asarray(dx).T, dp), fm):
                assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), f"feature-major {name} differs: {what}"
            for v in (y, hidden, dx, dp):
                digest.update(np.asarray(v).tobytes())
            cases += 1
    # N = 0: empty outputs, dparams 0.
    kw, x, p, dy = fused_mlp_case(rng, (32, 2, 5, 3, "relu", "none", True, 0), np.float32)
    y, yt, hidden, dx, dp = fused_mlp_run(GPU, kw, x, p, dy)
    assert y.shape == (0, 3) and hidden.shape == (2, 0, 32) and dx.shape == (0, 5), (y.shape, hidden.shape, dx.shape)
    assert dp.shape == p.shape and not np.asarray(dp).any(), "N = 0: dparams must be 0"
    # Bad input: the kernels' checks on the GPU (the wrappers' static checks bypassed).
    kw, x, p, dy = fused_mlp_case(rng, (64, 1, 10, 4, "relu", "none", False, 20), np.float32)
    _, _, hidden, _, _ = fused_mlp_run(GPU, kw, x, p, dy)
    y = t.fused_mlp(x, p, training=False, **kw)
    bad = [("params must have shape", lambda: ops().fused_mlp(x, p[:-1], **kw)),
           ("x must have shape", lambda: ops().fused_mlp(np.zeros((3, 65), np.float32), p, **kw)),
           ("[n_input, N] (feature_major)", lambda: ops().fused_mlp(np.zeros((65, 3), np.float32), p, feature_major=True,
                                                                      **kw)),
           ("hidden must have shape", lambda: ops().fused_mlp_grad(dy, x, p, y, hidden[:, :-1], **kw)),
           # none kept: the CPU kernel computes them again; the GPU kernel reads them
           ("hidden must hold the kept activations", lambda: ops().fused_mlp_grad(dy, x, p, y, hidden[:0], **kw)),
           ("dy must have shape", lambda: ops().fused_mlp_grad(dy[:-1], x, p, y, hidden, **kw)),
           ("width must be", lambda: ops().fused_mlp(x, p, **{**kw, "width": 48}))]
    for match, fn in bad:
        try:
            with tf.device(GPU):
                fn()
        except tf.errors.InvalidArgumentError as e:
            assert match in str(e), (match, str(e))
        else:
            raise AssertionError(f"{match}: must fail on the GPU")
    assert_no_device_errors()
    return f"{cases} configurations, N = 0, {len(bad)} bad inputs; digest {digest.hexdigest()[:16]}"


# ---- models, saved models, threads ---------------------------------------------------------------------------
def check_layer_and_savedmodel(seed):
    import tempfile

    rng = np.random.default_rng(seed)
    x = rng.random((256, 3), dtype=np.float32)
    target = np.sin(4 * x).sum(axis=1, keepdims=True).astype(np.float32)
    with tf.device(CPU):
        model = tf.keras.Sequential([
            tf.keras.Input((3,)),
            t.HashGridEncoding(n_levels=4, log2_hashmap_size=10, base_resolution=4),
            tf.keras.layers.Dense(1),
        ])
        before = model(x).numpy()
        # Variables stay on the CPU: the CPU wheel has no GPU kernels for variable updates (docs/emulated_gpu.md).
        model.compile(optimizer=tf.keras.optimizers.Adam(1e-2), loss="mse")
        model.optimizer.build(model.trainable_variables)
    with tf.device(GPU), Dispatches() as ran:
        hist = model.fit(x, target, epochs=5, batch_size=64, verbose=0)
    ran.require("hash_grid_encode_d3f2_float32", "hash_grid_grad_params_d3f2_float32")  # D=3, F=2, linear
    assert hist.history["loss"][-1] < hist.history["loss"][0], hist.history
    with tf.device(CPU):
        cpu_out = model(x).numpy()
    assert not np.allclose(before, cpu_out)

    class Encoder(tf.Module):
        def __init__(self, layer):
            self.layer = layer

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
        def __call__(self, x):
            return self.layer(x)

    module = Encoder(model.layers[0])
    with tempfile.TemporaryDirectory() as d, tf.device(CPU):
        tf.saved_model.save(module, d)  # exported on the CPU
        loaded = tf.saved_model.load(d)
        with tf.device(GPU), Dispatches() as ran:
            y = loaded(tf.constant(x))
        ran.require("hash_grid_encode_d3f2_float32")
        close(y, model.layers[0](x), 1e-5, 1e-6, "SavedModel reloaded on the GPU vs the layer on the CPU")
    return "fit, SavedModel"


def check_nerf_steps(seed):
    """Four training steps of the NeRF example's hash model on the GPU, the loss falling; then the same steps with
    ``feature_major`` (the hash grid's [L*F, M] encoding read in place by the density MLP), the same initial
    weights: the same losses (the table gradient's float atomics sum in any order: rtol 1e-4)."""
    from nerf import models  # examples/nerf (gpu_check_runner puts examples/ on PYTHONPATH)

    rng = np.random.default_rng(seed)
    rays_o = np.tile(np.array([[0.0, 0.0, 4.0]], np.float32), (256, 1))
    dirs = rng.standard_normal((256, 3)).astype(np.float32) * 0.2
    dirs[:, 2] = -1.0
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    target = rng.random((256, 3), dtype=np.float32)
    runs = {}
    for fm in (False, True):
        tf.keras.utils.set_random_seed(seed)
        with tf.device(CPU):
            model = models.build_model("hash", n_levels=8, log2_hashmap_size=12, finest_resolution=64, n_samples=16,
                                       hidden=32, feature_major=fm)
        opt = tf.keras.optimizers.Adam(1e-2)
        losses = []
        with tf.device(GPU), Dispatches() as ran:
            for _ in range(4):
                with tf.GradientTape() as tape:
                    out = model(tf.constant(rays_o), tf.constant(dirs), training=True)
                    loss = tf.reduce_mean((out["color"] - target) ** 2)
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables))
                losses.append(float(loss))
        ran.require("hash_grid_encode_fm_d3f2_float32" if fm else "hash_grid_encode_d3f2_float32",
                    "hash_grid_grad_params_d3f2_float32", "fused_mlp_forward_w32_float32",
                    "fused_mlp_backward_w32_float32", "volume_render_forward", "volume_render_backward")
        assert out["features"].shape[0] == (16 if fm else 256 * 16), out["features"].shape
        assert losses[-1] < losses[0], losses
        runs[fm] = losses
    np.testing.assert_allclose(runs[True], runs[False], rtol=1e-4, err_msg="feature-major NeRF steps")
    return f"losses {runs[False][0]:.4f} -> {runs[False][-1]:.4f}; feature-major the same"


def check_threads(seed):
    """8 threads calling ops on the device at once: every result identical to the single-threaded one."""
    rng = np.random.default_rng(seed)
    cfg = HashGridConfig(3, n_levels=6, log2_hashmap_size=10, base_resolution=4, per_level_scale=1.6)
    x = rng.random((2000, 3), dtype=np.float32)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    sigma, rgb, tt = render_case(rng, 200, 16, 3)

    def work():
        with tf.device(GPU):
            y = t.hash_grid_encode(tf.constant(x), tf.constant(p), **cfg.op_kwargs())
            out = t.volume_render(tf.constant(sigma), tf.constant(rgb), tf.constant(tt))
            z = t.zero_out(tf.constant(x))
        return [np.asarray(v) for v in (y, out.color, out.weights, z)]

    want = work()
    results, errors = [None] * 8, []

    def run(i):
        try:
            for _ in range(5):
                got = work()
                for a, b in zip(got, want):
                    assert np.array_equal(a, b)
            results[i] = True
        except BaseException as e:  # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not errors, errors
    assert all(results), results
    assert_no_device_errors()
    return "8 threads x 5 rounds"


# ---- ray marching ------------------------------------------------------------------------------------------------
RM_AABB = np.array([[-1.1, -0.9, -1.3], [0.9, 1.2, 0.7]], np.float32)
RM_KERNELS = ("ray_march_count", "ray_march_scan_block", "ray_march_splits", "ray_march_fill")


class RmGrid:
    def __init__(self, bits, g):
        self.bits, self.aabb, self.resolution = tf.constant(bits), RM_AABB, g


def ray_march_both(o, d, grid, **kw):
    out = {}
    for device in (GPU, CPU):
        with tf.device(device):
            out[device] = t.ray_march(tf.constant(o), tf.constant(d), grid, **kw)
    return out[GPU], out[CPU]


def same_march(a, b, what):
    for name, x, y in zip(a._fields, a, b):
        x, y = x.numpy(), y.numpy()
        assert x.shape == y.shape, f"{what}: {name} shapes {x.shape} vs {y.shape}"
        assert np.array_equal(x, y), f"{what}: {name}: {np.sum(x != y)} of {x.size} differ"


def march_configs(rng, cone_angle, last):
    """ray_march keyword sets: a coarse step with jitter, a fine one with `cone_angle` and a random seed, and `last`."""
    return [dict(step_size=0.0371, cone_angle=0.0, max_samples=1000, jitter=True, seed=3),
            dict(step_size=0.0123, cone_angle=cone_angle, max_samples=1000, jitter=True, seed=int(rng.integers(1 << 40))),
            last]


def march_on_both(o, d, grid, finest_bits, what, **kw):
    """ray_march on the GPU and the CPU, bitwise equal, the GPU's outputs on the GPU, one mip pass per level of the
    occupancy `finest_bits` (every cascade in each pass); returns the CPU's."""
    from tf_metal_ops.ray_march import reference as ref

    with Dispatches() as disp:
        a, b = ray_march_both(o, d, grid, **kw)
    disp.require(*RM_KERNELS)
    g = grid.resolution
    levels = len(ref.mip_levels(ref.unpack(finest_bits, g), g))
    assert disp.delta.get("ray_march_mip", 0) == levels, (g, disp.delta)
    for x in a:
        on_gpu(x)
    same_march(a, b, what)
    return b


def check_ray_march(seed):
    """GPU == CPU bitwise (the same float32 expressions of ray_march_math.h in the same order), incl. R large enough
    for three scan levels (R > 256^2), R = 0, N = 0, cone angle, the per-ray cap, jitter seeds, NaN rays (no samples
    on the GPU) and tf.function with varying R."""
    from tf_metal_ops.ray_march import reference as ref

    rng = np.random.default_rng(seed)
    configs = march_configs(rng, 0.04, dict(step_size=0.0371, cone_angle=0.0, max_samples=5, jitter=False, seed=0))
    total = 0
    for g, p in ((16, 0.3), (7, 0.7), (1, 1.0), (13, 0.03)):
        bits = ref.random_bits(g, p, seed=g)
        o, d = ref.make_rays(500, seed=g, aabb=RM_AABB)
        for kw in configs:
            b = march_on_both(o, d, RmGrid(bits, g), bits, f"G={g} p={p} {kw}", near=0.05, **kw)
            total += int(b.row_splits[-1])
    assert total > 20000, total
    # many rays: 66000 > 256^2, so the counts need three scan levels (258 blocks -> 2 -> 1)
    g = 32
    bits = ref.sphere_shell_bits(g, 0.3, 0.5, RM_AABB)
    o, d = ref.make_rays(66000, seed=1, aabb=RM_AABB, kinds=("outside", "inside", "axis"))
    with Dispatches() as disp:
        a, b = ray_march_both(o, d, RmGrid(bits, g), step_size=0.05, max_samples=64)
    disp.require(*RM_KERNELS, "ray_march_scan_add")
    assert disp.delta["ray_march_scan_block"] == 3 and disp.delta["ray_march_scan_add"] == 2, disp.delta
    assert disp.delta["ray_march_mip"] == 4, disp.delta  # levels of 16^3, 8^3, 4^3, 2^3 blocks
    same_march(a, b, "R=66000")
    assert int(b.row_splits[-1]) > 100000
    # R = 0 and N = 0
    with Dispatches() as disp:
        a, b = ray_march_both(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32), RmGrid(bits, g),
                              step_size=0.05)
    disp.require("ray_march_zero")
    same_march(a, b, "R=0")
    on_gpu(a.row_splits)
    a, b = ray_march_both(o[:300], d[:300], RmGrid(ref.pack(np.zeros(g**3, bool)), g), step_size=0.05)
    same_march(a, b, "empty grid")
    assert a.t_starts.shape[0] == 0 and a.row_splits.shape[0] == 301
    # NaN / inf rays and NaN near: no samples on the GPU (the CPU kernel rejects them); the other rays unchanged
    o2, d2 = o[:200].copy(), d[:200].copy()
    near = np.zeros(200, np.float32)
    d2[3, 1], o2[10, 0], d2[20, 2], near[30] = np.nan, np.inf, -np.inf, np.nan
    with tf.device(GPU):
        a = t.ray_march(o2, d2, RmGrid(bits, g), near=near, step_size=0.05)
    counts = np.diff(a.row_splits.numpy())
    assert np.all(counts[[3, 10, 20, 30]] == 0), counts[[3, 10, 20, 30]]
    o2[[3, 10, 20, 30]], d2[[3, 10, 20, 30]], near[30] = [0.0, 0.0, 5.0], [0.0, 0.0, 1.0], 0.0  # a ray that misses
    with tf.device(CPU):
        b = t.ray_march(o2, d2, RmGrid(bits, g), near=near, step_size=0.05)
    same_march(a, b, "NaN rays")
    with tf.device(CPU):
        try:
            t.ray_march(o2 * np.nan, d2, RmGrid(bits, g), step_size=0.05)
        except tf.errors.InvalidArgumentError:
            pass
        else:
            raise AssertionError("the CPU kernel must reject NaN origins")
    # shape errors are InvalidArgumentError on the GPU too, and the device stays healthy
    try:
        with tf.device(GPU):
            from tf_metal_ops._library import ops

            ops().ray_march(o[:4], d[:5], near[:4], near[:4], bits, RM_AABB, tf.constant(0, tf.int64),
                            resolution=g, step_size=0.1)
    except tf.errors.InvalidArgumentError as e:
        assert "rays_d must have shape" in str(e), e
    else:
        raise AssertionError("bad shapes must fail on the GPU")
    # an OccupancyGrid (variables on the CPU, updated there) feeding the GPU op
    occ = t.OccupancyGrid(aabb=RM_AABB, resolution=g, warmup_steps=1)
    for _ in range(2):
        occ.update(lambda x: tf.where(tf.norm(x, axis=1) < 0.6, 5.0, 0.0), seed=1)
    assert 0.01 < float(occ.occupied_fraction()) < 0.5
    a, b = ray_march_both(o[:2000], d[:2000], occ, step_size=0.02, seed=4)
    on_gpu(a.t_starts)
    same_march(a, b, "OccupancyGrid")
    # tf.function with varying R and seed: one trace, same results as eager CPU
    grid = RmGrid(bits, g)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None, 3], tf.float32),
                                  tf.TensorSpec([], tf.int64)])
    def march(o, d, s):
        return t.ray_march(o, d, grid, step_size=0.05, seed=s)

    for r in (17, 3000, 1):
        with tf.device(GPU):
            a = march(o[:r], d[:r], tf.constant(r, tf.int64))
        with tf.device(CPU):
            b = t.ray_march(o[:r], d[:r], grid, step_size=0.05, seed=r)
        on_gpu(a.t_starts)
        same_march(a, b, f"tf.function R={r}")
    assert march.experimental_get_tracing_count() == 1
    return (f"{total} samples in 12 configurations, R=66000 (3 scan levels), R=0, N=0, NaN rays, OccupancyGrid, "
            "tf.function")


class RmCascadeGrid:
    def __init__(self, bits, g, k):
        self.bits, self.aabb, self.resolution, self.cascades = tf.constant(bits), RM_AABB, g, k


def check_ray_march_cascades(seed):
    """Cascaded grids (unbounded scenes): GPU == CPU bitwise for K = 2..4 cascades, odd and even G, cone angles
    (steps capped per cascade), near/far per ray, an OccupancyGrid(cascades=3) fed by its own update, in a
    tf.function, and the kernel's cascade errors on the GPU. The mip passes cover every cascade (one pass per level)."""
    from tf_metal_ops.ray_march import reference as ref

    rng = np.random.default_rng(seed)
    configs = march_configs(rng, 0.05, dict(step_size=0.0123, cone_angle=0.5, max_samples=6, jitter=False, seed=0))
    total = 0
    for g, k in ((16, 3), (7, 2), (12, 4), (1, 2)):
        bits = np.stack([ref.random_bits(g, p, seed=g + c) for c, p in enumerate((0.3, 0.1, 0.05, 0.2)[:k])])
        if g == 1:  # one cell per cascade: the inner one empty, the outer one occupied
            bits = np.array([[0], [1]], np.uint8)
        o = rng.normal(size=(700, 3)).astype(np.float32) * np.float32(2.0 ** (k - 1))
        d = rng.normal(size=(700, 3)).astype(np.float32)
        d /= np.linalg.norm(d, axis=1, keepdims=True)
        near = rng.uniform(0.0, 0.5, 700).astype(np.float32)
        far = (near + rng.uniform(0.0, 8.0, 700)).astype(np.float32)
        for kw in configs:
            b = march_on_both(o, d, RmCascadeGrid(bits, g, k), bits[0], f"G={g} K={k} {kw}", near=near, far=far, **kw)
            total += int(b.row_splits[-1])
    assert total > 20000, total
    occ = t.OccupancyGrid(aabb=RM_AABB, resolution=16, cascades=3, warmup_steps=1)
    for _ in range(2):
        occ.update(lambda x: tf.where(tf.abs(tf.norm(x, axis=1) - 2.5) < 0.5, 5.0, 0.0), seed=1)
    frac = occ.occupied_fraction(per_cascade=True).numpy()
    assert frac[0] < 0.01 and frac[1] > 0.1 and frac[2] > 0.05, frac  # the shell is outside box 0 but a corner
    a, b = ray_march_both(o[:500], d[:500], occ, step_size=0.02, cone_angle=0.01, seed=4)
    on_gpu(a.t_starts)
    same_march(a, b, "OccupancyGrid(cascades=3)")
    assert int(b.row_splits[-1]) > 1000

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None, 3], tf.float32)])
    def march(o, d):
        return t.ray_march(o, d, occ, step_size=0.02, cone_angle=0.01, seed=4)

    for r in (500, 37):
        with tf.device(GPU):
            a = march(o[:r], d[:r])
        on_gpu(a.t_starts)
        same_march(a, b if r == 500 else ray_march_both(o[:r], d[:r], occ, step_size=0.02, cone_angle=0.01,
                                                        seed=4)[1], f"tf.function R={r}")
    assert march.experimental_get_tracing_count() == 1
    from tf_metal_ops._library import ops

    for kw, bits, match in ((dict(cascades=9), np.zeros((9, 512), np.uint8), "cascades must be in"),
                            (dict(cascades=3), np.zeros((2, 512), np.uint8), "bits must have shape")):
        try:
            with tf.device(GPU):
                ops().ray_march(o[:4], d[:4], near[:4], far[:4], bits, RM_AABB, tf.constant(0, tf.int64),
                                resolution=16, step_size=0.1, **kw)
        except tf.errors.InvalidArgumentError as e:
            assert match in str(e), e
        else:
            raise AssertionError(f"{kw} must fail on the GPU")
    return f"{total} samples in 12 configurations, OccupancyGrid(cascades=3), tf.function, cascade errors"


CHECKS = collect(globals())

if __name__ == "__main__":
    main(CHECKS)
