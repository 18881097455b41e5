"""The fiber switch of the MSL emulation (csrc/msl_emu/include/msl_emu/fiber_switch.h): many switches per thread
give exact results, each fiber keeps its own floating-point control state, and fiber stacks end in a guard page
whose size MSL_EMU_STACK_KB sets; with the hand-written switch and with the ucontext one (MSL_EMU_FIBER_UCONTEXT).
Driver: tests/msl_emu/fiber_switch_driver.cc. Needs clang++-16 (conftest.py)."""

import numpy as np
import pytest

DRIVER = "tests/msl_emu/fiber_switch_driver.cc"
ORDERS = [{"MSL_EMU_ORDER": "forward"}, {"MSL_EMU_ORDER": "reverse"},
          {"MSL_EMU_ORDER": "shuffle", "MSL_EMU_SEED": "5"}, {"MSL_EMU_ORDER": "shuffle", "MSL_EMU_WORKERS": "2"}]


@pytest.fixture(scope="module", params=["native", "ucontext"])
def exe(msl_emu, request):
    """The driver with the platform's switch (hand-written on x86-64 and aarch64) and with the ucontext one."""
    return msl_emu.build(DRIVER, defines=["MSL_EMU_FIBER_UCONTEXT"] if request.param == "ucontext" else [])


def switch_loop_model(n, tg, iters):
    """NumPy model of switch_loop (fiber_switch_driver.cc): per group, every round reads the neighbour's value
    (threadgroup memory between two barriers), a per-SIMD-group sum and a shuffle down by one lane."""
    u = np.zeros((n, 3), np.uint32)
    f = np.zeros((n, 4), np.float32)
    with np.errstate(over="ignore"):
        for base in range(0, n, tg):
            m = min(tg, n - base)
            assert m % 32 == 0, "the model assumes full SIMD groups"
            gid = np.arange(base, base + m, dtype=np.uint32)
            lid = np.arange(m, dtype=np.uint32)
            a = gid * np.uint32(2654435761) + np.uint32(1)
            b = gid ^ np.uint32(0x5BD1E995)
            c = lid + np.uint32(7)
            fa = (gid % 1000).astype(np.float32)
            fb = np.float32(0.25) * lid.astype(np.float32)
            da = gid.astype(np.float64) * 0.5
            db = np.ones(m)
            for _ in range(iters):
                nb = np.roll(a, -1)
                s = np.repeat((a & 0xFF).reshape(-1, 32).sum(axis=1, dtype=np.uint32), 32)
                bl = b.reshape(-1, 32)
                sh = np.concatenate([bl[:, 1:], bl[:, -1:]], axis=1).reshape(-1)  # last lane: its own value
                a = a * np.uint32(1664525) + np.uint32(1013904223) + nb
                b = (b ^ s) + sh
                c = c * np.uint32(3) + (s & 7)
                fa = fa * np.float32(0.5)
                fa = fa + (s & 0xFFF).astype(np.float32)
                fb = fb + np.float32(1)
                da = da * 0.75
                da = da + (nb & 0xFF)
                db = db + (c & 1)
            u[base:base + m] = np.stack([a, b, c], axis=1)
            f[base:base + m] = np.stack([fa, fb, da.astype(np.float32), db.astype(np.float32)], axis=1)
    return u.reshape(-1), f.reshape(-1)


@pytest.mark.parametrize("env", ORDERS, ids=lambda e: "-".join(e.values()))
@pytest.mark.parametrize("n, tg, iters", [(352, 96, 150), (1024, 1024, 20), (64, 32, 1000)])
def test_many_switches_give_the_exact_result(msl_emu, exe, n, tg, iters, env):
    """Four fiber switches per thread per round (two barriers, two SIMD-group calls), values live across all."""
    res = msl_emu.run(exe, outputs={"u": np.uint32, "f": np.float32},
                      scalars={"case": "switch_loop", "n": n, "tg": tg, "iters": iters}, env=env)
    want_u, want_f = switch_loop_model(n, tg, iters)
    np.testing.assert_array_equal(res.outputs["u"], want_u)
    np.testing.assert_array_equal(res.outputs["f"], want_f)  # same float32/float64 operations, in the same order


# float32 bits of +1/3 and -1/3 per rounding mode, in the driver's kModes order: nearest, upward, downward, toward 0.
THIRDS = [(0x3EAAAAAB, 0xBEAAAAAB), (0x3EAAAAAB, 0xBEAAAAAA), (0x3EAAAAAA, 0xBEAAAAAB), (0x3EAAAAAA, 0xBEAAAAAA)]


@pytest.mark.parametrize("env", ORDERS[:3], ids=lambda e: "-".join(e.values()))
def test_rounding_mode_is_per_fiber(msl_emu, exe, env):
    """Thread i sets rounding mode i % 4, waits at a barrier while the others set theirs, then sees its own mode
    in fegetround() and in float (SSE/NEON) and long double (x87 on x86-64) division; the launching thread keeps
    round-to-nearest."""
    n, tg = 200, 64
    one, three = np.ones(n, np.float32), np.full(n, 3.0, np.float32)
    res = msl_emu.run(exe, inputs={"one": one, "three": three}, outputs={"mode": np.int32, "q": np.uint32},
                      scalars={"case": "fp_control", "tg": tg}, env=env)
    lid = np.arange(n) % tg
    np.testing.assert_array_equal(res.outputs["mode"], np.append(lid % 4, 0))
    want = np.array([THIRDS[i % 4] * 2 for i in lid], np.uint32).reshape(-1)
    np.testing.assert_array_equal(res.outputs["q"], want)


def deep_model(depth, seed):
    return (seed + depth) % 256 + sum((seed + k + 64) % 256 for k in range(depth))


def run_deep(msl_emu, exe, depth, stack_kb=None):
    env = {"MSL_EMU_STACK_KB": str(stack_kb)} if stack_kb else {}
    return msl_emu.run(exe, outputs={"out": np.uint32}, scalars={"case": "deep_stack", "n": 64, "tg": 32,
                                                                  "depth": depth}, env=env, check=False)


@pytest.mark.parametrize("depth, stack_kb", [(60, 64), (300, None)])
def test_deep_recursion_within_the_fiber_stack(msl_emu, exe, depth, stack_kb):
    res = run_deep(msl_emu, exe, depth, stack_kb)
    assert res.returncode == 0, res.stderr
    want = [deep_model(depth, g) + deep_model(depth, g + 1) for g in range(64)]
    np.testing.assert_array_equal(res.outputs["out"], want)


@pytest.mark.parametrize("depth, stack_kb", [(300, 64), (3000, None)])
def test_stack_overflow_hits_the_guard_page(msl_emu, exe, depth, stack_kb):
    """Recursion past the fiber stack (MSL_EMU_STACK_KB, default 256 KiB) faults on the guard page below it, and
    ASan reports a stack overflow in the recursive function."""
    res = run_deep(msl_emu, exe, depth, stack_kb)
    assert res.returncode != 0
    assert "AddressSanitizer: stack-overflow" in res.stderr and "deep(" in res.stderr, res.stderr[-2000:]
