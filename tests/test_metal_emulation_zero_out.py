"""metal_kernels/zero_out.metal, executed on the CPU through the MSL emulation (tools/msl_emu) under
ASan+UBSan, must equal the CPU op Zero_out bit for bit, for every dtype and size.

What this cannot show (tools/msl_emu/README.md, "Limits"): races that do not bite in the emulated order, GPU
rounding, address-space mistakes. Needs clang++-16 (skips without it; fails under TFMO_REQUIRE_MAC_CHECKS=1).
"""

import re

import numpy as np
import pytest

import msl_emu_build

DTYPES = {"int32": np.int32, "int64": np.int64, "float32": np.float32, "float16": np.float16}
# n = 0 (no dispatch), 1, sizes around and not multiple of the threadgroup size, and a large one.
SIZES = [0, 1, 2, 63, 64, 65, 1000, 4099]
KERNEL_NAMES = ["zero_out_int32", "zero_out_int64", "zero_out_float32", "zero_out_float16"]


@pytest.fixture(scope="module")
def driver(msl_emu):
    return msl_emu.build("tests/metal_emu/zero_out_driver.cc")


@pytest.fixture(scope="module")
def cpu_zero_out():
    import tensorflow as tf

    import tf_metal_ops

    return tf.load_op_library(tf_metal_ops.library_path()).zero_out


def random_array(n, dtype, rng):
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max, size=n, dtype=dtype, endpoint=True)
    else:
        x = (rng.standard_normal(n) * 100).astype(dtype)
    if n:
        x[0] = x[0] if x[0] != 0 else dtype(7)  # a non-zero first element, so "kept" differs from "zeroed"
    return x


def bits(a):
    a = np.ascontiguousarray(a).reshape(-1)
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def run_emulated(msl_emu, driver, x, tg=64, env=None):
    res = msl_emu.run(driver, inputs={"x": x}, outputs={"y": x.dtype}, scalars={"dtype": x.dtype.name, "tg": tg},
                      env=env)
    return res.outputs["y"]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_emulated_kernel_equals_cpu_op(msl_emu, driver, cpu_zero_out, dtype, n):
    rng = np.random.default_rng(1000 * n + np.dtype(dtype).itemsize)
    x = random_array(n, dtype, rng)
    shape = (n,) if n % 5 else (5, n // 5)  # rank does not matter to the kernel (flat order)
    expected = cpu_zero_out(x.reshape(shape)).numpy().reshape(-1)
    got = run_emulated(msl_emu, driver, x)
    assert got.shape == (n,)
    assert np.array_equal(bits(got), bits(expected)), (got[:8], expected[:8])
    if n:  # and it is really Zero_out (guards against both sides being wrong the same way)
        assert bits(got)[0] == bits(x)[0] and not bits(got)[1:].any()


@pytest.mark.parametrize("tg", [1, 32, 1024])
def test_threadgroup_sizes_and_thread_orders(msl_emu, driver, cpu_zero_out, tg):
    x = random_array(3001, np.float32, np.random.default_rng(tg))
    expected = cpu_zero_out(x).numpy()
    for env in ({"MSL_EMU_ORDER": "reverse"}, {"MSL_EMU_ORDER": "shuffle", "MSL_EMU_SEED": "5", "MSL_EMU_WORKERS": "2"}):
        assert np.array_equal(bits(run_emulated(msl_emu, driver, x, tg=tg, env=env)), bits(expected)), env


def test_large_input_runs_fast(msl_emu, driver):
    x = random_array(100_003, np.float16, np.random.default_rng(3))
    res = msl_emu.run(driver, inputs={"x": x}, outputs={"y": x.dtype}, scalars={"dtype": "float16", "tg": 256})
    y = res.outputs["y"]
    assert bits(y)[0] == bits(x)[0] and not bits(y)[1:].any()
    assert res.seconds < 20, f"1e5 emulated threads took {res.seconds:.1f} s"


def test_harness_rejects_a_dtype_mismatch(msl_emu, driver):
    """The driver must not silently reinterpret bytes when Python and C++ disagree on the dtype."""
    x = np.arange(10, dtype=np.float64)
    res = msl_emu.run(driver, inputs={"x": x}, outputs={"y": x.dtype}, scalars={"dtype": "float32"}, check=False)
    assert res.returncode == msl_emu_build.HARNESS_ERROR_EXIT
    assert "float64" in res.stderr and "float32" in res.stderr


def test_kernel_names_the_host_binds():
    """The host code looks the kernels up by these exact names (one per dtype, nothing else)."""
    src = (msl_emu_build.KERNELS_DIR / "zero_out.metal").read_text()
    assert sorted(re.findall(r"\bkernel\s+void\s+(\w+)\s*\(", src)) == sorted(KERNEL_NAMES)
    assert "#include <metal_stdlib>" in src and "using namespace metal;" in src
