"""metal_kernels/hash_grid.metal executed on the CPU through the MSL emulation (csrc/msl_emu, ASan+UBSan) against
the CPU op, over randomized configurations: forward, d/dparams (float atomics: MSL 3.0 atomic_float and the
pre-3.0 CAS loop) and d/dpositions, float32 and float16 tables.

Tolerances: forward and d/dpositions compute the same float32 expressions in the same order as the CPU kernels,
so they agree to float rounding (atol 1e-6 / rtol 1e-5; float16 outputs within one float16 ulp); d/dparams sums
in atomic order (which differs from the CPU's point order), rtol 1e-5 + atol 1e-5 (float16: one ulp + 1e-3).
What this cannot show (csrc/msl_emu/README.md, "Limits"): GPU rounding and fast math, races that do not bite in
the emulated order (the scatter uses atomics by construction: see hg_atomic_add), address-space mistakes.
"""


import numpy as np
import pytest
import tensorflow as tf

from tf_metal_ops._library import ops
from tf_metal_ops.hash_grid import HashGridConfig
from support.hash_grid_cases import random_config, seeded

GRID_CODE = {"hash": 0, "dense": 1, "tiled": 2}
INTERP_CODE = {"nearest": 0, "linear": 1, "smoothstep": 2}
DRIVER = "tests/msl_emu/hash_grid_driver.cc"


@pytest.fixture(scope="module", params=["msl300", "msl240"])
def driver(request, msl_emu):
    """The driver built for MSL 3.0 (atomic_float) and for MSL 2.4 (CAS loop on atomic_uint)."""
    defines = [] if request.param == "msl300" else ["MSL_EMU_VERSION=240"]
    return msl_emu.build(DRIVER, defines=defines)


def random_case(rng, dtype):
    cfg = random_config(rng, max_levels=6, max_log2=11, max_resolution=11, max_scale=2.0, max_entries=200_000)
    d = cfg.n_input_dims
    n = int(rng.choice([0, 1, 63, 64, 65, int(rng.integers(2, 400))]))
    x = rng.uniform(-0.05, 1.05, (n, d)).astype(np.float32)
    if n >= 3:
        x[0, 0], x[1, -1], x[2, 0] = np.nan, np.inf, -np.inf
    p = rng.uniform(-1, 1, cfg.params_shape).astype(dtype)
    dy = rng.standard_normal((n, cfg.n_output_dims)).astype(dtype)
    n_active = int(rng.integers(0, cfg.n_levels + 1)) if rng.uniform() < 0.3 else cfg.n_levels
    return cfg, x, p, dy, n_active


def run_emulated(msl_emu, driver, kernel, cfg, x, p, dy, n_active, tg=64, env=None, n_aggregate=0, d3f2=False,
                 level_group=None, feature_major=False):
    dtype = p.dtype
    inputs = {"positions": x, "params": p}
    if kernel != "encode":
        inputs["dy"] = dy
    out_dtype = np.float32 if kernel == "grad_positions" else dtype
    scalars = dict(
        kernel=kernel, dtype=dtype.name, dims=cfg.n_input_dims, n_levels=cfg.n_levels,
        n_features=cfg.n_features_per_level, log2_hashmap_size=cfg.log2_hashmap_size,
        base_resolution=cfg.base_resolution, per_level_scale=repr(float(np.float32(cfg.per_level_scale))),
        grid_type=GRID_CODE[cfg.grid_type], interpolation=INTERP_CODE[cfg.interpolation], n_active=n_active, tg=tg,
    )
    if level_group is not None:  # encode: levels per SIMD group (default: the host's choice)
        scalars["level_group"] = level_group
    scalars["d3f2"] = int(d3f2)
    scalars["feature_major"] = int(feature_major)
    if kernel == "grad_params":
        scalars["n_aggregate"] = n_aggregate
    res = msl_emu.run(driver, inputs=inputs, outputs={"out": out_dtype}, scalars=scalars, env=env)
    return res.outputs["out"]


def cpu(cfg, x, p, dy, n_active):
    kw = cfg.op_kwargs()
    m = np.int32(n_active)
    y = ops().hash_grid_encode(x, p, m, **kw).numpy()
    gp = ops().hash_grid_encode_grad_params(dy, x, p, m, **kw).numpy()
    gx = ops().hash_grid_encode_grad_positions(dy, x, p, m, **kw).numpy()
    return y, gp, gx


def close(got, want, rtol, atol):
    got = got.astype(np.float64).reshape(-1)
    want = want.astype(np.float64).reshape(-1)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("trial", range(8))
def test_emulated_kernels_equal_cpu_op(msl_emu, driver, dtype, trial):
    rng = seeded("emu", dtype, trial)
    cfg, x, p, dy, n_active = random_case(rng, np.dtype(dtype))
    y, gp, gx = cpu(cfg, x, p, dy, n_active)
    half = dtype == "float16"
    got_y = run_emulated(msl_emu, driver, "encode", cfg, x, p, dy, n_active)
    close(got_y, y, rtol=2**-10 if half else 1e-5, atol=1e-6)
    # Every thread map writes every output element the same (the driver poisons the output first).
    g = (1, 2, 4, 8, 16, 32)[trial % 6]
    assert np.array_equal(run_emulated(msl_emu, driver, "encode", cfg, x, p, dy, n_active, level_group=g), got_y)
    # Plain atomics on every level, and SIMD-group run sums on every level (HgArgs.n_aggregate).
    for n_aggregate in (0, cfg.n_levels):
        got_gp = run_emulated(msl_emu, driver, "grad_params", cfg, x, p, dy, n_active, n_aggregate=n_aggregate)
        close(got_gp, gp, rtol=2**-9 if half else 1e-5, atol=1e-3 if half else 1e-5)
    got_gx = run_emulated(msl_emu, driver, "grad_positions", cfg, x, p, dy, n_active)
    scale = max(1.0, float(np.abs(gx).max())) if gx.size else 1.0
    close(got_gx, gx, rtol=1e-3 if half else 1e-5, atol=1e-5 * scale)
    if len(x) and n_active:  # not vacuous: the level work happened
        assert np.any(got_y) and np.any(got_gp)


@pytest.mark.parametrize("order", [{"MSL_EMU_ORDER": "reverse"},
                                   {"MSL_EMU_ORDER": "shuffle", "MSL_EMU_SEED": "7", "MSL_EMU_WORKERS": "2"}])
def test_scatter_under_other_thread_orders(msl_emu, driver, order):
    """Many points colliding on a tiny table, threads in reverse/shuffled order and on two OS threads: the atomic
    scatter still sums every contribution."""
    cfg = HashGridConfig(3, n_levels=3, n_features_per_level=2, log2_hashmap_size=4, base_resolution=6,
                         per_level_scale=1.5)
    rng = seeded("orders", tuple(order.items()))
    x = rng.uniform(0, 1, (3000, 3)).astype(np.float32)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    dy = rng.standard_normal((3000, cfg.n_output_dims)).astype(np.float32)
    _, gp, _ = cpu(cfg, x, p, dy, cfg.n_levels)
    got = run_emulated(msl_emu, driver, "grad_params", cfg, x, p, dy, cfg.n_levels, tg=32, env=order)
    close(got, gp, rtol=1e-4, atol=1e-3)
    assert np.abs(gp).max() > 5  # heavy collisions: lost updates would show


@pytest.mark.parametrize("tg", [32, 100])
def test_scatter_run_sums_along_rays(msl_emu, driver, tg):
    """Points in ray order (runs of equal rows in adjacent lanes, as a NeRF batch has), threadgroups that end in a
    partial SIMD group (tg=100: 32+32+32+4) and a last partial threadgroup: the run sums give the CPU op's gradient,
    and differ from it only by summation order."""
    cfg = HashGridConfig(3, n_levels=4, n_features_per_level=2, log2_hashmap_size=12, base_resolution=4,
                         per_level_scale=2.0)
    rng = seeded("rays", tg)
    o = rng.uniform(0.3, 0.7, (37, 1, 3))
    d = rng.normal(size=(37, 1, 3))
    d /= np.linalg.norm(d, axis=2, keepdims=True)
    x = np.clip(o + np.linspace(0, 0.3, 29)[None, :, None] * d, 0, 1).reshape(-1, 3).astype(np.float32)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    dy = rng.standard_normal((len(x), cfg.n_output_dims)).astype(np.float32)
    _, gp, _ = cpu(cfg, x, p, dy, cfg.n_levels)
    for d3f2 in (False, True):  # the general kernel and the D=3, F=2, linear one
        got = run_emulated(msl_emu, driver, "grad_params", cfg, x, p, dy, cfg.n_levels, tg=tg,
                           n_aggregate=cfg.n_levels, d3f2=d3f2)
        close(got, gp, rtol=1e-5, atol=1e-5)
    assert np.abs(gp).max() > 5  # long runs on the coarse levels: a lost or doubled run sum would show


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_d3f2_kernels_equal_the_cpu_op(msl_emu, driver, dtype):
    """The encode, position-gradient and scatter kernels compiled for D=3, F=2, linear: every grid type, partial SIMD
    groups, inactive levels; the per-point ones bitwise equal to the general kernels'."""
    for grid_type, n, n_active in (("hash", 1000, 6), ("dense", 77, 3), ("tiled", 33, 6)):
        cfg = HashGridConfig(3, n_levels=6, n_features_per_level=2, log2_hashmap_size=10, base_resolution=4,
                             per_level_scale=1.6, grid_type=grid_type, interpolation="linear")
        rng = seeded("d3f2", dtype, grid_type)
        x = rng.uniform(-0.05, 1.05, (n, 3)).astype(np.float32)
        p = rng.uniform(-1, 1, cfg.params_shape).astype(dtype)
        dy = rng.standard_normal((n, cfg.n_output_dims)).astype(dtype)
        y, gp, _ = cpu(cfg, x, p, dy, n_active)
        half = dtype == "float16"
        got_y = run_emulated(msl_emu, driver, "encode", cfg, x, p, dy, n_active, d3f2=True)
        close(got_y, y, rtol=2**-10 if half else 1e-5, atol=1e-6)
        assert np.array_equal(got_y, run_emulated(msl_emu, driver, "encode", cfg, x, p, dy, n_active))
        assert np.any(got_y)
        _, _, gx = cpu(cfg, x, p, dy, n_active)
        got_gx = run_emulated(msl_emu, driver, "grad_positions", cfg, x, p, dy, n_active, d3f2=True)
        close(got_gx, gx, rtol=1e-3 if half else 1e-5, atol=1e-5 * max(1.0, float(np.abs(gx).max())))
        assert np.array_equal(got_gx, run_emulated(msl_emu, driver, "grad_positions", cfg, x, p, dy, n_active))
        for n_aggregate in (0, cfg.n_levels):
            got = run_emulated(msl_emu, driver, "grad_params", cfg, x, p, dy, n_active, n_aggregate=n_aggregate,
                               d3f2=True)
            close(got, gp, rtol=2**-9 if half else 1e-5, atol=1e-3 if half else 1e-5)


@pytest.mark.parametrize("d3f2", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_feature_major_layout(msl_emu, driver, dtype, d3f2):
    """HgArgs.feature_major: out and dy [L*F, N]. The encode (the host's G = 1) writes the transpose of the
    point-major encode, bitwise, with inactive levels zero; the position gradient of the transposed dy is bitwise
    the point-major one, the table gradient equal up to the atomics' summation order."""
    cfg = HashGridConfig(3, n_levels=5, n_features_per_level=2, log2_hashmap_size=9, base_resolution=4,
                         per_level_scale=1.7)
    rng = seeded("feature_major", dtype, d3f2)
    n, n_active = 173, 4
    x = rng.uniform(-0.05, 1.05, (n, 3)).astype(np.float32)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(dtype)
    dy = rng.standard_normal((n, cfg.n_output_dims)).astype(dtype)
    dy_t = np.ascontiguousarray(dy.T)
    half = dtype == "float16"
    y = run_emulated(msl_emu, driver, "encode", cfg, x, p, dy, n_active, d3f2=d3f2).reshape(n, -1)
    y_t = run_emulated(msl_emu, driver, "encode", cfg, x, p, dy_t, n_active, d3f2=d3f2, feature_major=True)
    assert np.array_equal(y_t.reshape(cfg.n_output_dims, n), y.T)
    assert np.any(y) and not np.any(y[:, n_active * 2:])
    gx = run_emulated(msl_emu, driver, "grad_positions", cfg, x, p, dy, n_active, d3f2=d3f2)
    gx_t = run_emulated(msl_emu, driver, "grad_positions", cfg, x, p, dy_t, n_active, d3f2=d3f2, feature_major=True)
    assert np.array_equal(gx_t, gx) and np.any(gx)
    for n_aggregate in (0, cfg.n_levels):
        gp = run_emulated(msl_emu, driver, "grad_params", cfg, x, p, dy, n_active, n_aggregate=n_aggregate, d3f2=d3f2)
        gp_t = run_emulated(msl_emu, driver, "grad_params", cfg, x, p, dy_t, n_active, n_aggregate=n_aggregate,
                            d3f2=d3f2, feature_major=True)
        close(gp_t, gp, rtol=2**-9 if half else 1e-5, atol=1e-3 if half else 1e-5)
        assert np.any(gp_t)


def test_default_config_forward(msl_emu, driver):
    """The Instant-NGP default config (dense then hashed levels), a few thousand points."""
    cfg = HashGridConfig(3)
    rng = seeded("default")
    x = rng.uniform(0, 1, (2000, 3)).astype(np.float32)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    y = ops().hash_grid_encode(x, p, 16, **cfg.op_kwargs()).numpy()
    got = run_emulated(msl_emu, driver, "encode", cfg, x, p, None, 16, tg=256, d3f2=True)  # the host's kernel
    close(got, y, rtol=1e-5, atol=1e-6)
