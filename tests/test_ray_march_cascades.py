"""Cascaded occupancy grids (unbounded scenes): RayMarch with cascades (CPU kernel) against the NumPy float64
reference and the pure-TF march, the cascade rules (finest cascade decides, skips stop at a finer cascade, cone
steps clamped by the cascade's cells), OccupancyGrid(cascades=K), bad input. The GPU path: the check
ray_march_cascades of tests/support/emulated_gpu_checks.py (tests/test_emulated_gpu.py, both backends)."""

import numpy as np
import pytest
import tensorflow as tf

import tf_metal_ops as tfmo
from tf_metal_ops._library import ops
from tf_metal_ops.ray_march import reference as ref

from support.ray_march_cases import assert_plain_tf_matches_op

AABB = np.array([[-1.1, -0.9, -1.3], [0.9, 1.2, 0.7]], np.float32)  # not a cube, faces not on round numbers


class Grid:
    """Anything with .bits, .aabb, .resolution (and .cascades) works as the grid."""

    def __init__(self, bits, G, K, aabb=AABB):
        self.bits = tf.constant(bits, tf.uint8)
        self.aabb = aabb
        self.resolution = G
        self.cascades = K


def cascade_bits(G, K, p, seed):
    """[K, ceil(G^3/8)]: random occupancy with probability p[c] in cascade c."""
    return np.stack([ref.random_bits(G, p[c], seed=seed + c) for c in range(K)])


def scene_rays(R, seed, K, aabb=AABB):
    """Rays of an unbounded capture: cameras inside the outermost box looking in every direction (most rays leave
    through the coarse cascades), cameras just outside the box looking at it, and rays from far outside."""
    rng = np.random.default_rng(seed)
    lo, hi = np.asarray(aabb, np.float64)
    centre, half = (lo + hi) / 2, (hi - lo) / 2
    scale = 2.0 ** (K - 1)
    o, d = np.zeros((R, 3)), np.zeros((R, 3))
    for r in range(R):
        v = rng.normal(size=3)
        v /= np.linalg.norm(v)
        kind = r % 3
        if kind == 0:
            o[r] = centre + rng.uniform(-1.5, 1.5, 3) * half
            d[r] = v
        elif kind == 1:
            o[r] = centre + v * 1.8 * half.max()
            t = centre + rng.uniform(-0.5, 0.5, 3) * half
            d[r] = (t - o[r]) / np.linalg.norm(t - o[r])
        else:
            o[r] = centre + v * 1.2 * scale * half.max()
            t = centre + rng.uniform(-1.0, 1.0, 3) * half * scale * 0.5
            d[r] = (t - o[r]) / np.linalg.norm(t - o[r])
    return o.astype(np.float32), d.astype(np.float32)


def compare_to_reference(res, o, d, near, far, bits, G, K, **kw):
    counts, t0s, t1s, margins = ref.march(o, d, near, far, bits, AABB, G, cascades=K, **kw)
    rs = res.row_splits.numpy()
    t0, t1 = res.t_starts.numpy(), res.t_ends.numpy()
    clear = margins >= ref.MARGIN_EPS
    assert clear.mean() > 0.85, f"too many ambiguous rays: {np.sum(~clear)} of {len(clear)}"
    np.testing.assert_array_equal(np.diff(rs)[clear], counts[clear])
    # t grows to ~2^K box sizes here: float32 drift grows with it
    atol = ref.T_ATOL * 2 ** (K - 1)
    for r in np.nonzero(clear)[0]:
        np.testing.assert_allclose(t0[rs[r]:rs[r + 1]], t0s[r], rtol=0, atol=atol)
        np.testing.assert_allclose(t1[rs[r]:rs[r + 1]], t1s[r], rtol=0, atol=atol)
    return int(counts[clear].sum())


def check_positions(res, o, d, K):
    """positions: unit coordinates of the outermost cascade's box, from the op's own t (float64)."""
    lo, hi = np.asarray(AABB, np.float64)
    grow = (hi - lo) * (2.0 ** (K - 1) - 1) / 2
    lo, hi = lo - grow, hi + grow
    ri = res.ray_indices.numpy()
    tm = 0.5 * (res.t_starts.numpy().astype(np.float64) + res.t_ends.numpy())
    want = np.clip((o.astype(np.float64)[ri] + tm[:, None] * d.astype(np.float64)[ri] - lo) / (hi - lo), 0, 1)
    np.testing.assert_allclose(res.positions.numpy(), want, rtol=0, atol=2e-6 * 2 ** (K - 1))


CASES = [
    dict(step_size=0.0371, cone_angle=0.0, max_samples=1000, jitter=True, seed=3),
    dict(step_size=0.0123, cone_angle=0.02, max_samples=1000, jitter=True, seed=11),  # steps grow with t
    dict(step_size=0.0123, cone_angle=0.21, max_samples=1000, jitter=False, seed=0),  # clamped by the cells
    dict(step_size=0.0371, cone_angle=0.0, max_samples=7, jitter=True, seed=5),  # the per-ray cap binds
]


@pytest.mark.parametrize("case", CASES, ids=["plain", "cone", "wide-cone", "cap"])
@pytest.mark.parametrize("G,K,p", [(16, 3, (0.3, 0.1, 0.05)), (7, 2, (0.5, 0.2)), (12, 4, (0.05, 0.2, 0.1, 0.3))])
def test_matches_numpy_reference(case, G, K, p):
    R = 240
    o, d = scene_rays(R, seed=G + K, K=K)
    bits = cascade_bits(G, K, p, seed=G)
    res = tfmo.ray_march(o, d, Grid(bits, G, K), **case)
    rs = res.row_splits.numpy()
    assert rs.shape == (R + 1,) and rs[0] == 0 and rs[-1] == res.t_starts.shape[0]
    t0, t1, ri = res.t_starts.numpy(), res.t_ends.numpy(), res.ray_indices.numpy()
    np.testing.assert_array_equal(ri, np.repeat(np.arange(R), np.diff(rs)))
    same = ri[1:] == ri[:-1]
    assert np.all(t0 < t1) and np.all(t1[:-1][same] <= t0[1:][same])
    n = compare_to_reference(res, o, d, 0.0, np.inf, bits, G, K, step=case["step_size"], cone=case["cone_angle"],
                             max_samples=case["max_samples"], jitter=case["jitter"], seed=case["seed"])
    assert n > 200
    check_positions(res, o, d, K)
    # samples in every cascade
    grid = tfmo.OccupancyGrid(aabb=AABB, resolution=G, cascades=K)
    mid = o[ri] + (0.5 * (t0 + t1))[:, None] * d[ri]
    boxes = [grid.cascade_aabb(c) for c in range(K)]
    casc = np.full(len(mid), K - 1)
    for c in reversed(range(K - 1)):
        casc = np.where(np.all((mid >= boxes[c][0]) & (mid <= boxes[c][1]), axis=1), c, casc)
    assert set(np.unique(casc)) == set(range(K))


@pytest.mark.parametrize("G,K", [(16, 3), (9, 2)])
def test_plain_tf_version_matches_op(G, K):
    o, d = scene_rays(200, seed=8, K=K)
    grid = Grid(cascade_bits(G, K, (0.3, 0.15, 0.1), seed=4), G, K)
    assert_plain_tf_matches_op(o, d, grid, CASES)


def test_every_midpoint_is_in_an_occupied_cell_of_its_finest_cascade():
    G, K = 16, 3
    grid = tfmo.OccupancyGrid(aabb=AABB, resolution=G, cascades=K, warmup_steps=0)
    grid.bits.assign(cascade_bits(G, K, (0.2, 0.1, 0.05), seed=1))
    o, d = scene_rays(400, seed=2, K=K)
    res = tfmo.ray_march(o, d, grid, step_size=0.02, cone_angle=0.01, seed=3)
    assert res.t_starts.shape[0] > 2000
    ri = res.ray_indices.numpy()
    mid = o[ri] + (0.5 * (res.t_starts.numpy() + res.t_ends.numpy()))[:, None] * d[ri]
    assert np.all(grid.is_occupied(mid).numpy())


def test_skips_in_a_coarse_cascade_stop_at_the_finer_box():
    # Cascade 1 entirely empty (its cells over the inner box too), cascade 0 full: every ray from outside that
    # crosses box 0 must still get the samples of box 0, not skip over it with the empty blocks of cascade 1.
    G = 16
    bits = np.stack([ref.pack(np.ones(G**3, bool)), ref.pack(np.zeros(G**3, bool))])
    aabb = np.array([[-1, -1, -1], [1, 1, 1]], np.float32)
    rng = np.random.default_rng(0)
    target = rng.uniform(-0.8, 0.8, (64, 3))
    v = rng.normal(size=(64, 3))
    o = (1.9 * v / np.abs(v).max(axis=1, keepdims=True)).astype(np.float32)  # on the face of box 1 (size 4)
    d = ((target - o) / np.linalg.norm(target - o, axis=1, keepdims=True)).astype(np.float32)
    step = 0.01
    res = tfmo.ray_march(o, d, Grid(bits, G, 2, aabb), step_size=step, jitter=False, max_samples=10000)
    rs = res.row_splits.numpy()
    for r in range(64):
        t0, t1 = res.t_starts.numpy()[rs[r]:rs[r + 1]], res.t_ends.numpy()[rs[r]:rs[r + 1]]
        with np.errstate(divide="ignore"):
            ta, tb = (aabb[0] - o[r]) / d[r], (aabb[1] - o[r]) / d[r]
        t_in, t_out = np.max(np.minimum(ta, tb)), np.min(np.maximum(ta, tb))
        assert t_in < t_out
        # the samples cover box 0 from entry to exit without gaps (up to one step at either end)
        assert abs(t0[0] - t_in) <= step and abs(t1[-1] - t_out) <= step, (r, t0[0], t_in, t1[-1], t_out)
        np.testing.assert_array_equal(t0[1:], t1[:-1])


def test_cone_steps_grow_with_distance_and_stop_at_the_cascade_cell():
    # Cascade c spans t in (2^(c-1), 2^c] along this ray and caps steps at its cell diagonal 2 sqrt(3) 2^c / G
    # (0.054 2^c here): t * cone reaches it at t = 0.54 2^c, inside the cascade, for every cascade.
    G, K = 64, 4
    aabb = np.array([[-1, -1, -1], [1, 1, 1]], np.float32)
    bits = np.stack([ref.pack(np.ones(G**3, bool))] * K)
    o = np.zeros((1, 3), np.float32)
    d = np.array([[1.0, 0.0, 0.0]], np.float32)
    step, cone = 0.01, 0.1
    res = tfmo.ray_march(o, d, Grid(bits, G, K, aabb), step_size=step, cone_angle=cone, jitter=False,
                         max_samples=100000)
    t0, t1 = res.t_starts.numpy().astype(np.float64), res.t_ends.numpy().astype(np.float64)
    assert abs(t1[-1] - 2.0 ** (K - 1)) < 1e-5  # the march ends at the outermost box (half size 8)
    dt = t1 - t0
    # the step's cascade: that of the point at t_start + step_size / 2 (box c has half size 2^c)
    th = t0 + step / 2
    casc = np.minimum(np.ceil(np.log2(np.maximum(th, 1.0))), K - 1).astype(int)
    cell_diag = np.sqrt(3.0) * 2.0 * 2.0**casc / G
    want = np.minimum(np.maximum(t0 * cone, step), cell_diag)
    last = len(dt) - 1  # the last step is cut at the box
    np.testing.assert_allclose(dt[:last], want[:last], rtol=2e-5, atol=2e-6)
    assert dt[:last].min() == pytest.approx(step, rel=1e-4) and dt[:last].max() > 10 * step
    assert np.all(np.diff(dt[:last]) >= -1e-6)  # steps never shrink along the ray
    for c in range(K):  # every cascade's cap is reached
        sel = casc[:last] == c
        assert np.any(np.isclose(dt[:last][sel], cell_diag[:last][sel], rtol=1e-5)), c


def test_tf_function_with_cascades():
    # graph mode: the shape function takes the [K, bytes] bitfield; one trace for every ray count and seed
    G, K = 16, 3
    grid = tfmo.OccupancyGrid(aabb=AABB, resolution=G, cascades=K, warmup_steps=0)
    grid.bits.assign(cascade_bits(G, K, (0.3, 0.2, 0.1), seed=2))

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None, 3], tf.float32),
                                  tf.TensorSpec([], tf.int64)])
    def march(o, d, seed):
        return tfmo.ray_march(o, d, grid, step_size=0.02, cone_angle=0.01, seed=seed)

    for R, seed in ((50, 1), (7, 2), (0, 3)):
        o, d = scene_rays(R, seed=R, K=K)
        got, want = march(o, d, tf.constant(seed, tf.int64)), tfmo.ray_march(o, d, grid, step_size=0.02,
                                                                              cone_angle=0.01, seed=seed)
        for x, y in zip(got, want):
            np.testing.assert_array_equal(x.numpy(), y.numpy())
    assert march.experimental_get_tracing_count() == 1
    tf_version = tf.function(lambda o, d: tfmo.ray_march_tf(o, d, grid, step_size=0.02))
    o, d = scene_rays(20, seed=1, K=K)
    np.testing.assert_array_equal(tf_version(o, d).row_splits.numpy(),
                                  tfmo.ray_march(o, d, grid, step_size=0.02).row_splits.numpy())
    with pytest.raises(ValueError, match="rank"):  # the shape function: bits of rank 3
        tf.function(lambda b: ops().ray_march(o, d, tf.zeros(20), tf.ones(20), b, AABB, tf.constant(0, tf.int64),
                                              resolution=G, step_size=0.1, cascades=K)).get_concrete_function(
            tf.TensorSpec([K, 512, 1], tf.uint8))


def test_one_cascade_forms_agree():
    # cascades=1 with bits [1, bytes] is the single grid with bits [bytes], bit for bit
    G = 16
    bits = ref.random_bits(G, 0.3, seed=2)
    o, d = ref.make_rays(300, seed=3, aabb=AABB)
    kw = dict(step_size=0.0211, cone_angle=0.01, seed=4)
    a = tfmo.ray_march(o, d, Grid(bits, G, 1), **kw)
    b = tfmo.ray_march(o, d, Grid(bits[None], G, 1), **kw)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.numpy(), y.numpy())


def test_near_far_and_thread_counts():
    G, K = 16, 3
    grid = Grid(cascade_bits(G, K, (0.3, 0.2, 0.1), seed=7), G, K)
    o, d = scene_rays(3000, seed=5, K=K)
    rng = np.random.default_rng(1)
    near = rng.uniform(0.0, 1.0, 3000).astype(np.float32)
    far = (near + rng.uniform(-0.5, 6.0, 3000)).astype(np.float32)
    outs = []
    for n in (1, 2, 3):
        with tfmo.num_threads(n):
            outs.append(tfmo.ray_march(o, d, grid, near=near, far=far, step_size=0.011, cone_angle=0.01, seed=2))
    assert outs[0].t_starts.shape[0] > 10000
    for other in outs[1:]:
        for x, y in zip(outs[0], other):
            np.testing.assert_array_equal(x.numpy(), y.numpy())
    res = outs[0]
    rs = res.row_splits.numpy()
    assert np.all(np.diff(rs)[far <= near] == 0)
    ri = res.ray_indices.numpy()
    assert np.all(res.t_starts.numpy() >= near[ri]) and np.all(res.t_ends.numpy() <= far[ri])
    # 300 rays: the CPU kernel looks cells up through the bitfields and mips (K G^3 > 32 R); 3000 rays: through its
    # per-cell level table. Both agree bit for bit, and with the reference.
    few = tfmo.ray_march(o[:300], d[:300], grid, near=near[:300], far=far[:300], step_size=0.011, cone_angle=0.01,
                         seed=2)
    n = int(few.row_splits[-1])
    np.testing.assert_array_equal(res.row_splits.numpy()[:301], few.row_splits.numpy())
    for a, b in ((res.t_starts, few.t_starts), (res.t_ends, few.t_ends), (res.positions, few.positions)):
        np.testing.assert_array_equal(a.numpy()[:n], b.numpy())
    compare_to_reference(few, o[:300], d[:300], near[:300], far[:300], grid.bits.numpy(), G, K, step=0.011,
                         cone=0.01, seed=2)


# ---------------------------------------------------------------------------------------------------------------
# OccupancyGrid(cascades=K)


def test_occupancy_grid_cascades_update_samples_each_box():
    G, K = 8, 3
    grid = tfmo.OccupancyGrid(aabb=AABB, resolution=G, cascades=K, warmup_steps=1)
    assert grid.cascades == K and grid.num_cells == K * G**3
    assert grid.density.shape == (K, G**3) and grid.bits.shape == (K, (G**3 + 7) // 8)
    seen = []

    def density(x):
        seen.append(x.numpy())
        return 10.0 * tf.cast(tf.norm(x, axis=-1) > 2.5, tf.float32)  # content only far out

    grid.update(density, seed=1)  # warm-up: every cell of every cascade, in index order
    x = seen[0]
    assert x.shape == (K * G**3, 3)
    idx = np.arange(K * G**3)
    c, local = idx // G**3, idx % G**3
    ijk = np.stack([local % G, (local // G) % G, local // (G * G)], axis=1)
    for k in range(K):
        box = grid.cascade_aabb(k)
        cs = (box[1] - box[0]) / G
        np.testing.assert_allclose(box, [AABB[0] - (AABB[1] - AABB[0]) * (2**k - 1) / 2,
                                         AABB[1] + (AABB[1] - AABB[0]) * (2**k - 1) / 2], rtol=1e-6)
        sel = c == k
        u = (x[sel] - box[0]) / cs - ijk[sel]  # the jitter inside the cell
        assert np.all((u >= -1e-4) & (u <= 1 + 1e-4))
    assert np.all(grid.occupied().numpy())  # warm-up: all ones
    grid.update(density, seed=2)
    frac = grid.occupied_fraction(per_cascade=True).numpy()
    assert frac.shape == (K,)
    assert frac[0] == 0.0 and frac[2] > 0.3  # the content is beyond radius 2.5: only the outer cascades see it
    assert float(grid.occupied_fraction()) == pytest.approx(frac.mean(), rel=1e-6)
    # the march of that grid only samples where the content is
    o, d = scene_rays(300, seed=3, K=K)
    res = tfmo.ray_march(o, d, grid, step_size=0.02)
    ri = res.ray_indices.numpy()
    mid = o[ri] + (0.5 * (res.t_starts.numpy() + res.t_ends.numpy()))[:, None] * d[ri]
    assert len(mid) > 500 and np.all(grid.is_occupied(mid).numpy())
    assert np.linalg.norm(mid, axis=1).min() > 2.5 - np.sqrt(3) * 2 * 2.0 / G  # within a cell of the content


def test_occupancy_grid_one_cascade_is_the_plain_grid():
    a = tfmo.OccupancyGrid(aabb=AABB, resolution=8, warmup_steps=0)
    b = tfmo.OccupancyGrid(aabb=AABB, resolution=8, warmup_steps=0, cascades=1)
    assert a.bits.shape == b.bits.shape == (64,) and a.density.shape == (512,)

    def f(x):
        return tf.norm(x, axis=-1)

    for step in range(3):
        a.update(f, seed=step)
        b.update(f, seed=step)
    np.testing.assert_array_equal(a.bits.numpy(), b.bits.numpy())
    np.testing.assert_array_equal(a.density.numpy(), b.density.numpy())


@pytest.mark.parametrize("kw,match", [
    (dict(cascades=0), "cascades"),
    (dict(cascades=9), "cascades"),
    (dict(cascades=2.0), "cascades"),
    (dict(cascades=True), "cascades"),
    (dict(cascades=8, aabb=((-1e37, -1, -1), (1e37, 1, 1))), "not finite"),
])
def test_occupancy_grid_rejects_bad_cascades(kw, match):
    with pytest.raises(ValueError, match=match):
        tfmo.OccupancyGrid(resolution=4, **kw)


def test_cascade_aabb_rejects_bad_index():
    grid = tfmo.OccupancyGrid(resolution=4, cascades=2)
    with pytest.raises(ValueError, match="cascade"):
        grid.cascade_aabb(2)


# ---------------------------------------------------------------------------------------------------------------
# Bad input: the kernel (raw op) and the wrapper


def raw(bits=None, cascades=1, G=4, **attrs):
    o = np.zeros((2, 3), np.float32) - 2.0
    d = np.array([[1, 1, 1], [1, 0, 0]], np.float32)
    bits = np.full((cascades, (G**3 + 7) // 8), 255, np.uint8) if bits is None else bits
    aabb = attrs.pop("aabb", np.array([[-1, -1, -1], [1, 1, 1]], np.float32))
    return ops().ray_march(o, d, np.zeros(2, np.float32), np.full(2, 10.0, np.float32), bits, aabb,
                           tf.constant(0, tf.int64), resolution=G, step_size=0.1, cascades=cascades, **attrs)


def test_raw_op_with_cascades_matches_reference():
    t0, t1, rs, ri, pos = (v.numpy() for v in raw(cascades=3, max_samples=1000))
    o = np.zeros((2, 3), np.float32) - 2.0
    d = np.array([[1, 1, 1], [1, 0, 0]], np.float32)
    counts, t0s, t1s, margins = ref.march(o, d, 0.0, 10.0, np.full((3, 8), 255, np.uint8), [[-1] * 3, [1] * 3], 4,
                                          0.1, 0.0, 1000, True, 0, cascades=3)
    np.testing.assert_array_equal(np.diff(rs), counts)
    assert counts[1] > 0  # the second ray misses box 0 and 1 but crosses box 2 (half size 4)
    np.testing.assert_allclose(t0, np.concatenate(t0s), rtol=0, atol=ref.T_ATOL * 4)


@pytest.mark.parametrize("args,match", [
    (dict(cascades=0), "cascades must be in"),
    (dict(cascades=9, bits=np.full((9, 8), 255, np.uint8)), "cascades must be in"),
    (dict(cascades=3, bits=np.full((2, 8), 255, np.uint8)), r"bits must have shape \[cascades"),
    (dict(cascades=2, bits=np.full(16, 255, np.uint8)), r"bits must have shape \[cascades"),
    (dict(cascades=2, bits=np.full((2, 7), 255, np.uint8)), r"\[2, 8\]"),
    (dict(cascades=2, bits=np.full((2, 8, 1), 255, np.uint8)), "bits must have shape"),
    (dict(cascades=8, aabb=np.array([[-1e37, -1, -1], [1e37, 1, 1]], np.float32)), "the box of cascade"),
])
def test_raw_op_rejects_bad_cascades(args, match):
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        raw(**args)


def test_wrapper_rejects_bad_cascades():
    o, d = ref.make_rays(4, seed=0)
    with pytest.raises(ValueError, match="grid.cascades"):
        tfmo.ray_march(o, d, Grid(np.zeros((9, 8), np.uint8), 4, 9), step_size=0.1)
    with pytest.raises(ValueError, match="grid.cascades"):
        tfmo.ray_march_tf(o, d, Grid(np.zeros((1, 8), np.uint8), 4, 0), step_size=0.1)
    with pytest.raises(ValueError, match=r"grid.bits must have shape \[cascades"):
        tfmo.ray_march(o, d, Grid(np.zeros((2, 8), np.uint8), 4, 3), step_size=0.1)
    with pytest.raises(ValueError, match=r"grid.bits must have shape"):
        tfmo.ray_march(o, d, Grid(np.zeros(16, np.uint8), 4, 2), step_size=0.1)
    with pytest.raises(ValueError, match=r"grid.bits must have shape"):
        tfmo.ray_march(o, d, Grid(np.zeros((2, 9), np.uint8), 4, 2), step_size=0.1)
