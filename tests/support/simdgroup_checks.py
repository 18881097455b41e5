"""MSL SIMD-group functions in an inline kernel, against a NumPy model of Apple's semantics: one kernel (one compile)
applies every function to float, half and int data, on a launch whose threadgroups have partial SIMD groups (70
threads: 32 + 32 + 6; the grid's last group has 10) and whose threads with gid % 7 == 3 and gid 32 (a lane 0) return before the calls.

The model (csrc/msl_emu/README.md, "SIMD-group functions"): a SIMD group is 32 consecutive threads of a threadgroup
(thread_index_in_threadgroup order), a quad 4 consecutive lanes; a function acts over the active lanes (not
returned); reading an inactive lane, or a lane past a partial group's end, gives the poison value (NaN, -1 for
int); shuffle_up/down keep the caller's value where the source lane is outside the group (no wrap).
Tolerances: float32 rtol 1e-5 (sums and products of up to 32 terms), float16 rtol 1e-2 (rounded per step), int exact.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import tf_metal_ops as t

GRID, GROUP, SLOTS = 150, 70, 35
DATA_FUNCTIONS = [  # by slot: MSL expressions over v, p (the product operand), w = (v, p) and lane, for every type
    "simd_sum(v)", "simd_product(p)", "simd_min(v)", "simd_max(v)", "simd_prefix_inclusive_sum(v)",
    "simd_prefix_exclusive_sum(v)", "simd_prefix_inclusive_product(p)", "simd_prefix_exclusive_product(p)",
    "simd_broadcast(v, 5)", "simd_broadcast_first(v)", "simd_shuffle(v, (lane * 7 + 1) % 32)",
    "simd_shuffle_up(v, 3)", "simd_shuffle_down(v, 2)", "simd_shuffle_xor(v, 1)", "simd_shuffle_rotate_up(v, 5)",
    "simd_shuffle_rotate_down(v, 6)", "quad_sum(v)", "quad_prefix_exclusive_sum(v)", "quad_shuffle(v, (lane + 1) % 4)",
    "quad_broadcast(v, 2)", "quad_shuffle_down(v, 1)", "quad_max(v)", "quad_broadcast_first(v)",
    "simd_sum(w).y", "simd_shuffle_xor(w, 3).x",
]
INT_FUNCTIONS = [
    "simd_and(v)", "simd_or(v)", "simd_xor(v)", "int(uint(ulong(simd_ballot(v > 0))))", "int(simd_all(v > -900))",
    "int(simd_any(v > 900))", "int(simd_is_first())", "int(uint(ulong(simd_active_threads_mask())))",
    "int(ushort(quad_ballot(v > 0)))",
    "int(threads_per_simdgroup * 1000000 + simdgroups_per_threadgroup * 10000 + simdgroup_index_in_threadgroup * 1000"
    " + thread_index_in_simdgroup * 10 + thread_index_in_quadgroup + quadgroup_index_in_threadgroup * 0)",
]
assert len(DATA_FUNCTIONS) + len(INT_FUNCTIONS) == SLOTS

HEADER = """
template <typename T>
void apply_all(device T* y, uint o, T v, T p, uint lane) {
    vec<T, 2> w = vec<T, 2>(v);
    w.y = p;
""" + "".join(f"    y[o + {i}] = {f};\n" for i, f in enumerate(DATA_FUNCTIONS)) + "}\n"
SOURCE = f"""
    uint gid = thread_position_in_grid.x;
    if (gid % 7 == 3 || gid == 32) return;  // inactive from here on (gid 32: lane 0 of a SIMD group)
    uint lane = thread_index_in_simdgroup, o = gid * {SLOTS};
    apply_all<float>(yf, o, xf[gid], pf[gid], lane);  // explicit T: checked builds pass checked pointers
    apply_all<half>(yh, o, xh[gid], ph[gid], lane);
    int v = xi[gid];
    apply_all<int>(yi, o, v, pi[gid], lane);
    simdgroup_barrier(mem_flags::mem_none);
""" + "".join(f"    yi[o + {len(DATA_FUNCTIONS) + i}] = {f};\n" for i, f in enumerate(INT_FUNCTIONS))


def kernel():
    return t.metal_kernel("simdgroup_functions", ["xf", "pf", "xh", "ph", "xi", "pi"], ["yf", "yh", "yi"], SOURCE,
                          header=HEADER)


def inputs(seed=5):
    rng = np.random.default_rng(seed)
    xf = rng.uniform(-2, 2, GRID).astype(np.float32)
    pf = rng.uniform(0.8, 1.25, GRID).astype(np.float32)
    xi = rng.integers(-1000, 1000, GRID).astype(np.int32)
    pi = rng.choice(np.array([1, 1, 1, -1, 2], np.int32), GRID)
    return [xf, pf, xf.astype(np.float16), pf.astype(np.float16), xi, pi]


# ---- the NumPy model ----------------------------------------------------------------------------------------------
def _returns(gid):
    return (gid % 7 == 3) | (gid == 32)


def _groups():
    """Per SIMD group: the gids of its lanes (index = lane), None past the end of a partial group."""
    out = []
    for g0 in range(0, GRID, GROUP):
        n = min(GROUP, GRID - g0)
        for s in range(0, n, 32):
            out.append([g0 + s + i if s + i < n else None for i in range(32)])
    return out


def _segment(values, active, fn, G, poison, acc_dtype):
    """fn over one SIMD group (G = 32) or each of its quads (G = 4): (lane -> result) for active lanes."""
    res = {}
    for b in range(0, 32, G):
        lanes = [i for i in range(b, b + G) if active[i]]
        for i in lanes:
            res[i] = fn(i - b, [(j - b, values[j]) for j in lanes], lambda k: values[b + k]
                        if 0 <= k < G and active[b + k] else poison, values[i], acc_dtype)
    return res


def _ops(poison):
    def red(f):
        return lambda me, act, get, own, dt: f(np.array([v for _, v in act], dt))

    def prefix(f, identity, inclusive):
        def fn(me, act, get, own, dt):
            vals = np.array([v for j, v in act if (j <= me if inclusive else j < me)], dt)
            return f(vals) if len(vals) else dt(identity)
        return fn

    def move(src, keep_outside=False, G=32):
        def fn(me, act, get, own, dt):
            k = src(me, act)
            if keep_outside and not 0 <= k < G:
                return own
            return get(k)
        return fn

    first = lambda act: act[0][0]  # noqa: E731
    return [
        red(np.sum), red(np.prod), red(np.min), red(np.max), prefix(np.sum, 0, True), prefix(np.sum, 0, False),
        prefix(np.prod, 1, True), prefix(np.prod, 1, False), move(lambda me, act: 5), move(lambda me, act: first(act)),
        move(lambda me, act: (me * 7 + 1) % 32), move(lambda me, act: me - 3, True), move(lambda me, act: me + 2, True),
        move(lambda me, act: me ^ 1), move(lambda me, act: (me - 5) % 32), move(lambda me, act: (me + 6) % 32),
        ("quad", red(np.sum)), ("quad", prefix(np.sum, 0, False)), ("quad", move(lambda me, act: (me + 1) % 4, G=4)),
        ("quad", move(lambda me, act: 2, G=4)), ("quad", move(lambda me, act: me + 1, True, G=4)),
        ("quad", red(np.max)), ("quad", move(lambda me, act: first(act), G=4)),
    ]


def expected(x, p, poison, acc_dtype, out_dtype):
    """[GRID, SLOTS] model results for the data functions (the other slots stay at init_value 0 here)."""
    y = np.zeros((GRID, SLOTS), np.float64)
    ops = _ops(poison)
    for lanes in _groups():
        active = [g is not None and not _returns(g) for g in lanes]
        xv = [acc_dtype(x[g]) if g is not None else poison for g in lanes]
        pv = [acc_dtype(p[g]) if g is not None else poison for g in lanes]
        for slot, op in enumerate(ops + [None, None]):
            if slot == 23:  # simd_sum(w).y: the sum of p
                op, vals = ops[0], pv
            elif slot == 24:  # simd_shuffle_xor(w, 3).x
                op, vals = (lambda me, act, get, own, dt: get(me ^ 3)), xv
            else:
                vals = pv if slot in (1, 6, 7) else xv
            G = 4 if isinstance(op, tuple) else 32
            fn = op[1] if isinstance(op, tuple) else op
            for lane, r in _segment(vals, active, fn, G, poison, acc_dtype).items():
                y[lanes[lane], slot] = r
    return y.astype(out_dtype)


def _s32(v):
    return (v + 2**31) % 2**32 - 2**31


def expected_int_extras(x):
    """Slots 25.. of yi."""
    y = np.zeros((GRID, SLOTS), np.int64)
    for lanes in _groups():
        g0 = next(g for g in lanes if g is not None) // GROUP * GROUP
        n = min(GROUP, GRID - g0)
        active = [g is not None and not _returns(g) for g in lanes]
        act = [i for i in range(32) if active[i]]
        vals = [int(x[lanes[i]]) for i in act]
        ballot = sum(1 << i for i in act if x[lanes[i]] > 0)
        for i in act:
            g = lanes[i]
            q = [j for j in range(i // 4 * 4, i // 4 * 4 + 4) if active[j]]
            idx = g - g0
            y[g, 25:] = [
                np.bitwise_and.reduce(vals), np.bitwise_or.reduce(vals), np.bitwise_xor.reduce(vals),
                _s32(ballot), all(v > -900 for v in vals), any(v > 900 for v in vals), i == act[0],
                _s32(sum(1 << j for j in act)), sum(1 << (j % 4) for j in q if x[lanes[j]] > 0),
                32 * 1000000 + (n + 31) // 32 * 10000 + idx // 32 * 1000 + idx % 32 * 10 + idx % 4,
            ]
    return y


def check_simdgroup_functions(device):
    k = kernel()
    xs = inputs()
    with tf.device(device):
        yf, yh, yi = k(inputs=[tf.constant(a) for a in xs], grid=(GRID, 1, 1), threadgroup=(GROUP, 1, 1),
                       output_shapes=[(GRID, SLOTS)] * 3, output_dtypes=[tf.float32, tf.float16, tf.int32],
                       init_value=0)
    xf, pf, xh, ph, xi, pi = xs
    nd = len(DATA_FUNCTIONS)
    np.testing.assert_allclose(yf.numpy()[:, :nd], expected(xf, pf, np.nan, np.float64, np.float32)[:, :nd],
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(yh.numpy()[:, :nd].astype(np.float64),
                               expected(xh, ph, np.nan, np.float64, np.float64)[:, :nd], rtol=1e-2, atol=2e-2)
    want_i = expected(xi, pi, -1, np.int64, np.int64)
    want_i[:, nd:] = expected_int_extras(xi)[:, nd:]
    np.testing.assert_array_equal(yi.numpy(), want_i.astype(np.int32))
    returned = _returns(np.arange(GRID))
    assert (yi.numpy()[returned] == 0).all() and (yf.numpy()[returned] == 0).all()
    return yf, yh, yi
