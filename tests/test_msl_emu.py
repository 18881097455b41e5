"""Self-tests of the MSL emulation (csrc/msl_emu): barriers are a real rendezvous, atomics are atomic,
vector types have MSL's layout, and UB the emulation promises to catch is caught. Kernels and driver:
tests/msl_emu/emu_selftest.metal, emu_selftest_driver.cc. Needs clang++-16 (see conftest.py)."""

import re

import numpy as np
import pytest

from support import msl_emu_build

DRIVER = "tests/msl_emu/emu_selftest_driver.cc"


@pytest.fixture(scope="module")
def emu300(msl_emu):
    return msl_emu.build(DRIVER)


@pytest.fixture(scope="module")
def emu240(msl_emu):
    return msl_emu.build(DRIVER, defines=["MSL_EMU_VERSION=240"])


def block_sums(x, tg):
    pad = (-len(x)) % tg
    return np.pad(x.astype(np.float64), (0, pad)).reshape(-1, tg).sum(axis=1)


def run_block_sum(msl_emu, exe, x, tg, use_barrier, env):
    res = msl_emu.run(exe, inputs={"x": x}, outputs={"sums": np.float32},
                      scalars={"case": "block_sum", "tg": tg, "use_barrier": use_barrier}, env=env)
    return res.outputs["sums"]


ORDERS = [{"MSL_EMU_ORDER": "forward"}, {"MSL_EMU_ORDER": "reverse"},
          {"MSL_EMU_ORDER": "shuffle", "MSL_EMU_SEED": "11"}, {"MSL_EMU_ORDER": "shuffle", "MSL_EMU_WORKERS": "2"}]


# --- barriers -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env", ORDERS, ids=lambda e: "-".join(e.values()))
@pytest.mark.parametrize("tg", [2, 32, 256])
def test_threadgroup_reduction_with_barrier(msl_emu, emu300, tg, env):
    x = np.random.default_rng(tg).standard_normal(4000).astype(np.float32)
    got = run_block_sum(msl_emu, emu300, x, tg, 1, env)
    np.testing.assert_allclose(got, block_sums(x, tg), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("env", [ORDERS[0], ORDERS[2]], ids=["forward", "shuffle"])
def test_reduction_without_barrier_is_wrong(msl_emu, emu300, env):
    """Negative control: the same kernel without its barriers races on threadgroup memory and the emulation
    shows it (so the test above would fail if threadgroup_barrier were not a rendezvous). In reverse order
    this particular race happens not to bite: see README, Limits."""
    x = np.random.default_rng(0).standard_normal(4000).astype(np.float32) + 1.0
    got = run_block_sum(msl_emu, emu300, x, 128, 0, env)
    assert np.abs(got - block_sums(x, 128)).max() > 1.0


def test_threadgroup_atomic_counts_nonuniform_groups(msl_emu, emu300):
    """dispatchThreads semantics: the last group is clipped (1000 = 10*96 + 40); threadgroup atomics + barriers."""
    for env in ({}, {"MSL_EMU_WORKERS": "2", "MSL_EMU_ORDER": "shuffle"}):
        res = msl_emu.run(emu300, outputs={"counts": np.uint32}, scalars={"case": "group_count", "n": 1000, "tg": 96},
                          env=env)
        assert res.outputs["counts"].tolist() == [96] * 10 + [40]


def test_thread_position_attributes_2d(msl_emu, emu300):
    gx, gy, tx, ty = 13, 7, 4, 3
    res = msl_emu.run(emu300, outputs={"ids": np.uint32},
                      scalars={"case": "thread_ids", "gx": gx, "gy": gy, "tx": tx, "ty": ty})
    ids = res.outputs["ids"].reshape(gy, gx, 9)
    y, x = np.mgrid[0:gy, 0:gx]
    tpt_x = np.minimum(tx, gx - (x // tx) * tx)  # clipped size of the edge groups
    tpt_y = np.minimum(ty, gy - (y // ty) * ty)
    expected = np.stack([x, y, x % tx, y % ty, x // tx, y // ty, tpt_x, tpt_y, (y % ty) * tpt_x + x % tx], axis=-1)
    np.testing.assert_array_equal(ids, expected)


def test_divergent_barrier_is_an_error(msl_emu, emu300):
    res = msl_emu.run(emu300, outputs={"out": np.float32}, scalars={"case": "divergent_barrier", "tg": 64}, check=False)
    assert res.returncode == msl_emu_build.EMU_ERROR_EXIT, res.stderr
    assert "divergent threadgroup_barrier" in res.stderr and "thread 3" in res.stderr
    assert "emu_selftest.metal" in res.stderr  # points at the barrier in the original source


def test_barriers_at_different_call_sites_are_an_error(msl_emu, emu300):
    res = msl_emu.run(emu300, outputs={"out": np.float32}, scalars={"case": "split_barrier", "tg": 8}, check=False)
    assert res.returncode == msl_emu_build.EMU_ERROR_EXIT, res.stderr
    assert "different barriers" in res.stderr


# --- SIMD-group functions (the full function x type matrix: tests/support/simdgroup_checks.py) -------------------
def simd_reduce_model(tg):
    out = np.full(tg, -1.0)
    for base in range(0, tg, 32):
        lanes = [i for i in range(base, min(tg, base + 32)) if i % 5 != 4]
        for k, i in enumerate(lanes):
            out[i] = sum(lanes) + 1000.0 * k
    return out


@pytest.mark.parametrize("env", ORDERS, ids=lambda e: "-".join(e.values()))
def test_simd_groups_rendezvous_over_active_threads(msl_emu, emu300, env):
    for tg in (70, 32, 5):  # partial last SIMD group, exactly one, a single partial one
        res = msl_emu.run(emu300, outputs={"out": np.float32}, scalars={"case": "simd_reduce", "tg": tg}, env=env)
        np.testing.assert_array_equal(res.outputs["out"], simd_reduce_model(tg))


@pytest.mark.parametrize("case, scalars, message", [
    ("simd_reduce", {"split": 16}, r"kernel simd_reduce: divergent SIMD-group function: .* thread 0 \(index in group\) "
                                   r"is in simd_sum at .*emu_selftest.metal:\d+:\d+ while thread 16 is in simd_max"),
    ("simd_vs_barrier", {}, r"kernel simd_vs_barrier: divergent SIMD-group function: .* thread 7 \(index in group\) "
                            r"waits at the threadgroup_barrier at .*emu_selftest.metal:\d+:\d+ while thread 0 of its "
                            r"SIMD group is in simd_sum"),
    ("simd_reduce", {"fast": 1}, r"kernel simd_reduce: simd_sum at .*emu_selftest.metal:\d+:\d+ reached on the "
                                 r"fiber-free fast path \(threadgroup \(0,0,0\), thread 0\)"),
], ids=["different_functions", "barrier_instead", "fast_path"])
def test_simd_misuse_is_an_error(msl_emu, emu300, case, scalars, message):
    res = msl_emu.run(emu300, outputs={"out": np.float32}, scalars={"case": case, "tg": 64, **scalars}, check=False)
    assert res.returncode == msl_emu_build.EMU_ERROR_EXIT, res.stderr
    assert re.search(message, res.stderr), res.stderr


def test_empty_dispatch_is_an_error(msl_emu, emu300):
    res = msl_emu.run(emu300, outputs={"counts": np.uint32}, scalars={"case": "group_count", "n": 0, "tg": 32},
                      check=False)
    assert res.returncode == msl_emu_build.EMU_ERROR_EXIT and "empty grid" in res.stderr


# --- atomics --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", ["1", "2"])
def test_atomics_msl3(msl_emu, emu300, workers):
    n, k = 100_003, 7
    vals = np.random.default_rng(5).uniform(-1, 1, n).astype(np.float32)
    outs = {"icount": np.int32, "usum": np.uint32, "fsum": np.float32, "imax": np.int32, "imin": np.int32,
            "isub": np.int32}
    res = msl_emu.run(emu300, inputs={"vals": vals}, outputs=outs, scalars={"case": "atomic_buckets", "k": k, "tg": 256},
                      env={"MSL_EMU_WORKERS": workers, "MSL_EMU_ORDER": "shuffle"})
    o = res.outputs
    gid = np.arange(n, dtype=np.int64)
    b = gid % k
    counts = np.bincount(b, minlength=k)
    np.testing.assert_array_equal(o["icount"], counts)
    np.testing.assert_array_equal(o["usum"], (np.bincount(b, weights=gid, minlength=k).astype(np.int64) % 2**32))
    np.testing.assert_array_equal(o["imax"], [gid[b == i].max() for i in range(k)])
    np.testing.assert_array_equal(o["imin"], [gid[b == i].min() for i in range(k)])
    np.testing.assert_array_equal(o["isub"], -2 * counts)
    np.testing.assert_allclose(o["fsum"], np.bincount(b, weights=vals, minlength=k), atol=2e-2)
    assert res.seconds < 30


@pytest.mark.parametrize("version", ["240", "300"])
def test_float_add_by_cas_loop(msl_emu, emu240, emu300, version):
    exe = emu240 if version == "240" else emu300
    n, k = 50_000, 3
    vals = np.random.default_rng(6).uniform(0, 1, n).astype(np.float32)
    res = msl_emu.run(exe, inputs={"vals": vals}, outputs={"fsum": np.float32},
                      scalars={"case": "cas_buckets", "k": k, "tg": 64}, env={"MSL_EMU_WORKERS": "2"})
    expected = np.bincount(np.arange(n) % k, weights=vals, minlength=k)
    np.testing.assert_allclose(res.outputs["fsum"], expected, rtol=1e-4)


# Lost-update detection: 50,000 threads add 1.0 to 3 addresses from 2 workers, with `work` steps of dummy arithmetic
# between each read and write (cas_buckets_variant in emu_selftest.metal); every sum is exact in float32, so
# n - sum(fsum) is exactly the number of lost updates. About 0.7 s per run.
CAS_N, CAS_K, CAS_WORK = 50_000, 3, 4096
CAS_ATTEMPTS = 3  # races are scheduling-dependent: a control that must see one gets up to 3 runs


def run_cas_variant(msl_emu, exe, mode):
    """Returns (lost updates, failed exchanges) of one run of cas_buckets_variant in `mode`."""
    res = msl_emu.run(exe, inputs={"vals": np.ones(CAS_N, np.float32)},
                      outputs={"fsum": np.float32, "failures": np.uint32},
                      scalars={"case": "cas_buckets_variant", "k": CAS_K, "tg": 64, "mode": mode, "work": CAS_WORK},
                      env={"MSL_EMU_WORKERS": "2", "MSL_EMU_ORDER": "shuffle"})
    fsum = res.outputs["fsum"].astype(np.int64)
    assert np.all(fsum <= np.bincount(np.arange(CAS_N) % CAS_K, minlength=CAS_K))  # nothing counted twice
    return int(CAS_N - fsum.sum()), int(res.outputs["failures"][0])


@pytest.mark.parametrize("mode", [1, 2], ids=["non_atomic_rmw", "cas_ignoring_failure"])
def test_lost_updates_are_detected_negative_control(msl_emu, emu240, mode):
    """NEGATIVE controls for the test below: the same add as a non-atomic read-modify-write (mode 1) or as a
    compare-and-swap that ignores its failure (mode 2) loses updates under MSL_EMU_WORKERS=2, and the lost-update
    count sees them (for mode 2 it equals the failed exchanges exactly). So a CAS loop that lost updates would fail
    test_cas_loop_never_loses_an_update."""
    runs = []
    for _ in range(CAS_ATTEMPTS):
        lost, failures = run_cas_variant(msl_emu, emu240, mode)
        runs.append((lost, failures))
        if mode == 2:
            assert lost == failures, runs
        if lost > 0:
            break
    assert runs[-1][0] > 0, f"no lost update in {CAS_ATTEMPTS} racy runs (lost, failed exchanges): {runs}"


@pytest.mark.parametrize("version", ["240", "300"])
def test_cas_loop_never_loses_an_update(msl_emu, emu240, emu300, version):
    """The real CAS loop (the MSL 2.4 float add; the 3.0 build runs the same code) under the contention that makes
    the negative controls above lose updates: exact sums every run, while its failed (retried) exchanges prove that
    concurrent adds to one address really overlapped."""
    exe = emu240 if version == "240" else emu300
    runs = []
    for _ in range(CAS_ATTEMPTS):
        lost, failures = run_cas_variant(msl_emu, exe, 0)
        runs.append((lost, failures))
        assert lost == 0, runs
        if failures > 0:
            break
    assert runs[-1][1] > 0, f"no contended exchange in {CAS_ATTEMPTS} runs: the test proved nothing: {runs}"


def test_atomic_float_only_from_msl3(msl_emu, tmp_path):
    src = tmp_path / "probe.metal"
    src.write_text("#include <metal_stdlib>\nusing namespace metal;\n"
                   "kernel void k(device atomic_float* p [[buffer(0)]]) {\n"
                   "  atomic_fetch_add_explicit(p, 1.0f, memory_order_relaxed);\n}\n")
    assert msl_emu.syntax_check(src).returncode == 0
    res = msl_emu.syntax_check(src, defines=["MSL_EMU_VERSION=240"])
    assert res.returncode != 0 and "atomic_float" in res.stderr


def test_atomic_buckets_case_absent_at_msl24(msl_emu, emu240):
    res = msl_emu.run(emu240, inputs={"vals": np.ones(4, np.float32)}, outputs={},
                      scalars={"case": "atomic_buckets", "k": 1, "tg": 4}, check=False)
    assert res.returncode == msl_emu_build.HARNESS_ERROR_EXIT and "240" in res.stderr


# --- types and math -------------------------------------------------------------------------------------
def test_vector_types_swizzles_and_math(msl_emu, emu300, emu240):
    ab = np.array([-2.3, -1.3, -0.3, 0.7, 2.7, 3.7, 4.7, 5.7], np.float32)
    a, b = ab[:4], ab[4:]
    f32 = np.float32
    exp = np.concatenate([
        a[[2, 1, 0]],
        [a[0], a[1], b[3], b[2]],
        np.cross(a[:3], b[:3]),
        [np.dot(a, b), np.linalg.norm(a[:3])],
        (a * f32(3.5)) - np.floor(a * f32(3.5)),
        np.clip(b, -0.5, 0.5),
        a + (b - a) * f32(0.25),
        np.where(a < b, b, a),
        [1 / np.sqrt(abs(a[0]) + 1), 1.0, 8, 16, 8, 8, float(np.float16(a[0])), np.floor(a[1]), np.exp(a[2] * 0.25),
         0.0, 3, max(a[0], 0), 7, 7, 0.15625, 1, 0, float(np.float16(a[1])), 2, 300],
    ]).astype(np.float32)
    got = msl_emu.run(emu300, inputs={"ab": ab}, outputs={"out": np.float32}, scalars={"case": "vector_ops"}).outputs["out"]
    np.testing.assert_allclose(got, exp, rtol=2e-6, atol=1e-6)
    got240 = msl_emu.run(emu240, inputs={"ab": ab}, outputs={"out": np.float32},
                         scalars={"case": "vector_ops"}).outputs["out"]
    assert got240[47] == 240 and np.array_equal(got240[:47], got[:47])


# --- sanitizers ---------------------------------------------------------------------------------------------
def test_out_of_bounds_write_is_caught_by_asan(msl_emu, emu300):
    x = np.arange(100, dtype=np.float32)
    res = msl_emu.run(emu300, inputs={"x": x}, outputs={"y": np.float32}, scalars={"case": "oob_write"}, check=False)
    assert res.returncode != 0
    assert "AddressSanitizer: heap-buffer-overflow" in res.stderr and "oob_write" in res.stderr


# --- build helper (no compiler needed) --------------------------------------------------------------------
@pytest.mark.parametrize("src, want", [
    ("threadgroup float tile[256];", "threadgroup float tile[256];"),
    ("void f(threadgroup float* t, uint i)", "void f(MSL_EMU_TGP float* t, uint i)"),
    ("threadgroup const float *p = tile;", "MSL_EMU_TGP const float *p = tile;"),
    ("threadgroup atomic_uint& c", "MSL_EMU_TGP atomic_uint& c"),
    ("threadgroup metal::atomic<uint> * c", "MSL_EMU_TGP metal::atomic<uint> * c"),
    ("threadgroup atomic_uint count;", "threadgroup atomic_uint count;"),
    ("threadgroup_barrier(mem_flags::mem_threadgroup);", "threadgroup_barrier(mem_flags::mem_threadgroup);"),
])
def test_threadgroup_pointer_rewrite(src, want):
    assert msl_emu_build.rewrite_threadgroup_pointers(src) == want
