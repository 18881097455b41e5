"""RayMarch (CPU kernel) against the NumPy float64 reference, packing invariants, determinism, tf.function, errors."""

import numpy as np
import pytest
import tensorflow as tf

import tf_metal_ops as tfmo
from tf_metal_ops._library import ops
from tf_metal_ops.ray_march import reference as ref

from support.ray_march_cases import assert_plain_tf_matches_op

AABB = np.array([[-1.1, -0.9, -1.3], [0.9, 1.2, 0.7]], np.float32)  # not a cube, faces not on round numbers


class Grid:
    """Anything with .bits, .aabb, .resolution works as the grid."""

    def __init__(self, bits, G, aabb=AABB):
        self.bits = tf.constant(bits, tf.uint8)
        self.aabb = aabb
        self.resolution = G


def check_packing(res, R):
    rs = res.row_splits.numpy()
    t0, t1, ri = res.t_starts.numpy(), res.t_ends.numpy(), res.ray_indices.numpy()
    assert res.row_splits.dtype == tf.int32 and res.ray_indices.dtype == tf.int32
    assert rs.shape == (R + 1,) and rs[0] == 0 and np.all(np.diff(rs) >= 0) and rs[-1] == len(t0) == len(t1)
    np.testing.assert_array_equal(ri, np.repeat(np.arange(R), np.diff(rs)))
    assert np.all(t0 < t1)
    same_ray = ri[1:] == ri[:-1]
    assert np.all(t1[:-1][same_ray] <= t0[1:][same_ray])  # sorted, non-overlapping


POS_ATOL = 2e-6  # float32 rounding of o + tm d, - lo, * inv_ext for |o|, |t d| of a few box sizes


def check_positions(res, o, d, aabb=AABB):
    """positions = clamp((o + d (t_start + t_end) / 2 - lo) / (hi - lo), 0, 1) in float64 from the op's own t."""
    pos = res.positions.numpy()
    n = res.t_starts.shape[0]
    assert res.positions.dtype == tf.float32 and pos.shape == (n, 3)
    assert np.all((pos >= 0.0) & (pos <= 1.0))
    ri = res.ray_indices.numpy()
    tm = 0.5 * (res.t_starts.numpy().astype(np.float64) + res.t_ends.numpy())
    lo, hi = np.asarray(aabb, np.float64)
    want = np.clip((np.asarray(o, np.float64)[ri] + tm[:, None] * np.asarray(d, np.float64)[ri] - lo) / (hi - lo),
                   0.0, 1.0)
    np.testing.assert_allclose(pos, want, rtol=0, atol=POS_ATOL)
    return n


def compare_to_reference(res, o, d, near, far, bits, G, aabb, **kw):
    """Exact sample counts and t within T_ATOL on every ray whose decisions are not within rounding of a
    threshold (see tf_metal_ops.ray_march.reference); returns the number of rays compared."""
    counts, t0s, t1s, margins = ref.march(o, d, near, far, bits, aabb, G, **kw)
    rs = res.row_splits.numpy()
    t0, t1 = res.t_starts.numpy(), res.t_ends.numpy()
    clear = margins >= ref.MARGIN_EPS
    assert clear.mean() > 0.85, f"too many ambiguous rays: {np.sum(~clear)} of {len(clear)}"
    np.testing.assert_array_equal(np.diff(rs)[clear], counts[clear])
    for r in np.nonzero(clear)[0]:
        np.testing.assert_allclose(t0[rs[r]:rs[r + 1]], t0s[r], rtol=0, atol=ref.T_ATOL)
        np.testing.assert_allclose(t1[rs[r]:rs[r + 1]], t1s[r], rtol=0, atol=ref.T_ATOL)
    return int(clear.sum()), int(counts[clear].sum())


CASES = [
    dict(step_size=0.0371, cone_angle=0.0, max_samples=1000, jitter=True, seed=3),
    dict(step_size=0.0371, cone_angle=0.0, max_samples=1000, jitter=False, seed=0),
    dict(step_size=0.0123, cone_angle=0.04, max_samples=1000, jitter=True, seed=11),  # cone: growing steps
    dict(step_size=0.0371, cone_angle=0.0, max_samples=5, jitter=True, seed=5),  # the per-ray cap binds
]


@pytest.mark.parametrize("case", CASES, ids=["plain", "nojitter", "cone", "cap"])
@pytest.mark.parametrize("G,p", [(16, 0.3), (7, 0.6)])
def test_matches_numpy_reference(case, G, p):
    R = 240
    o, d = ref.make_rays(R, seed=G, aabb=AABB)
    bits = ref.random_bits(G, p, seed=G + 1)
    res = tfmo.ray_march(o, d, Grid(bits, G), **case)
    check_packing(res, R)
    n_rays, n_samples = compare_to_reference(res, o, d, 0.0, np.inf, bits, G, AABB,
                                             step=case["step_size"], cone=case["cone_angle"],
                                             max_samples=case["max_samples"], jitter=case["jitter"],
                                             seed=case["seed"])
    assert n_samples > 200  # the comparison covered real work
    check_positions(res, o, d)
    counts = np.diff(res.row_splits.numpy())
    assert counts.max() <= case["max_samples"]
    kinds = np.arange(R) % 4  # make_rays: outside, inside, miss, axis-parallel
    assert np.all(counts[kinds == 2] == 0)
    for kind in (0, 1, 3):  # rays aimed at the box, starting inside it, axis-parallel: most find samples
        assert np.mean(counts[kinds == kind] > 0) > 0.5
    if case["max_samples"] == 5:
        assert np.sum(counts == 5) > R // 4


SPARSE = {  # grids where the occupancy mip skips big empty blocks (odd G: blocks cut at the far faces)
    "shell32": (32, lambda: ref.sphere_shell_bits(32, 0.35, 0.5, AABB)),
    "random13": (13, lambda: ref.random_bits(13, 0.03, seed=3)),
    "corner21": (21, lambda: ref.pack(np.pad(np.ones((6, 7, 8), bool), [(14, 1), (2, 12), (0, 13)]))),
}


@pytest.mark.parametrize("case", [CASES[0], CASES[2], dict(step_size=0.1371, cone_angle=0.0, max_samples=1000,
                                                           jitter=True, seed=4)], ids=["plain", "cone", "long-steps"])
@pytest.mark.parametrize("name", sorted(SPARSE))
def test_matches_numpy_reference_on_sparse_grids(case, name):
    G, make = SPARSE[name]
    bits = make()
    R = 400
    o, d = ref.make_rays(R, seed=G + 2, aabb=AABB, kinds=("outside", "inside", "axis"))
    res = tfmo.ray_march(o, d, Grid(bits, G), **case)
    check_packing(res, R)
    kw = dict(step=case["step_size"], cone=case["cone_angle"], max_samples=case["max_samples"],
              jitter=case["jitter"], seed=case["seed"])
    n_rays, n_samples = compare_to_reference(res, o, d, 0.0, np.inf, bits, G, AABB, **kw)
    assert n_samples > 100  # the comparison covered real work
    check_positions(res, o, d)
    # The mip changes where a ray lands after an empty block only now and then (a block face is usually also a face
    # the cell-by-cell skip lands on); make sure such rays exist, so the comparison above covered the mip rule.
    _, m_t0, _, margins = ref.march(o, d, 0.0, np.inf, bits, AABB, G, **kw)
    _, c_t0, _, _ = ref.march(o, d, 0.0, np.inf, bits, AABB, G, use_mip=False, **kw)
    differs = [len(a) != len(b) or np.abs(a - b).max(initial=0) > 1e-4 for a, b in zip(m_t0, c_t0)]
    assert np.sum(np.array(differs) & (margins >= ref.MARGIN_EPS)) >= 2


def test_occupancy_mip_tf_matches_numpy():
    for G, make in SPARSE.values():
        bits = make()
        want = ref.mip_levels(ref.unpack(bits, G), G)
        got = tfmo.occupancy.occupancy_mip_tf(bits, G)
        assert len(got) == len(want) == int(np.ceil(np.log2(G))) - 1
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.numpy(), w.reshape(-1))
    assert tfmo.occupancy.occupancy_mip_tf(ref.pack(np.ones(8, bool)), 2) == []


def test_near_far_per_ray_and_scalar():
    G = 12
    o, d = ref.make_rays(120, seed=4, aabb=AABB, kinds=("outside", "inside"))
    bits = ref.random_bits(G, 0.5, seed=2)
    rng = np.random.default_rng(0)
    near = rng.uniform(0.0, 1.5, 120).astype(np.float32)
    far = (near + rng.uniform(-0.3, 2.5, 120)).astype(np.float32)  # some far < near: no samples
    kw = dict(step_size=0.0291, cone_angle=0.0, max_samples=64, jitter=True, seed=9)
    res = tfmo.ray_march(o, d, Grid(bits, G), near=near, far=far, **kw)
    check_packing(res, 120)
    compare_to_reference(res, o, d, near, far, bits, G, AABB, step=0.0291, cone=0.0, max_samples=64, jitter=True,
                         seed=9)
    assert np.all(np.diff(res.row_splits.numpy())[far < near] == 0)
    rs = res.row_splits.numpy()
    for r in range(120):
        seg = slice(rs[r], rs[r + 1])
        assert np.all(res.t_starts.numpy()[seg] >= near[r]) and np.all(res.t_ends.numpy()[seg] <= far[r])
    # scalars broadcast
    a = tfmo.ray_march(o, d, Grid(bits, G), near=0.5, far=2.0, **kw)
    b = tfmo.ray_march(o, d, Grid(bits, G), near=np.full(120, 0.5, np.float32), far=np.full(120, 2.0, np.float32), **kw)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.numpy(), y.numpy())


def test_all_occupied_gives_uniform_samples():
    G = 8
    R = 50
    o, d = ref.make_rays(R, seed=1, aabb=AABB, kinds=("outside", "inside", "axis"))
    bits = ref.pack(np.ones(G**3, bool))
    step = 0.05
    res = tfmo.ray_march(o, d, Grid(bits, G), step_size=step, max_samples=10000, jitter=False)
    rs = res.row_splits.numpy()
    counts, t0s, t1s, _ = ref.march(o, d, 0.0, np.inf, bits, AABB, G, step, 0.0, 10000, False, 0)
    for r in range(R):
        t0, t1 = res.t_starts.numpy()[rs[r]:rs[r + 1]], res.t_ends.numpy()[rs[r]:rs[r + 1]]
        assert len(t0) > 0
        # no gaps: each sample starts where the previous ended, all but the last have length step_size
        np.testing.assert_array_equal(t0[1:], t1[:-1])
        np.testing.assert_allclose(t1[:-1] - t0[:-1], step, rtol=0, atol=2e-6)
        assert t1[-1] - t0[-1] <= step + 2e-6
        t_enter, t_exit = t0s[r][0], t1s[r][-1]  # float64 box entry/exit (or 0 for rays starting inside)
        assert abs(t0[0] - t_enter) < 1e-5 and abs(t1[-1] - t_exit) < 1e-5
        k = int(np.ceil((t_exit - t_enter) / step - 1e-4))
        # float32 accumulation may leave a sliver of t_exit for one more (tiny) sample
        assert len(t0) == k or (len(t0) == k + 1 and t1[-1] - t0[-1] < 1e-4)


def test_empty_grid_gives_no_samples_and_zero_rays_work():
    G = 10
    o, d = ref.make_rays(64, seed=2, aabb=AABB)
    res = tfmo.ray_march(o, d, Grid(ref.pack(np.zeros(G**3, bool)), G), step_size=0.01)
    assert res.t_starts.shape == (0,) and res.ray_indices.shape == (0,) and res.positions.shape == (0, 3)
    np.testing.assert_array_equal(res.row_splits.numpy(), np.zeros(65, np.int32))
    empty = tfmo.ray_march(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32),
                           Grid(ref.random_bits(G, 0.5), G), step_size=0.01)
    np.testing.assert_array_equal(empty.row_splits.numpy(), [0])
    assert empty.t_starts.shape == (0,) and empty.positions.shape == (0, 3)


def test_skipping_puts_every_midpoint_in_an_occupied_cell_and_ragged_works():
    G = 16
    aabb = np.array([[-1, -1, -1], [1, 1, 1]], np.float32)
    grid = tfmo.OccupancyGrid(aabb=aabb, resolution=G, warmup_steps=0)
    grid.bits.assign(tf.constant(ref.sphere_shell_bits(G, 0.45, 0.7, aabb)))
    o, d = ref.make_rays(300, seed=7, aabb=aabb, kinds=("outside", "inside"))
    res = tfmo.ray_march(o, d, grid, step_size=0.0173, seed=1)
    check_packing(res, 300)
    assert res.t_starts.shape[0] > 1000
    ri = res.ray_indices.numpy()
    mid = 0.5 * (res.t_starts.numpy() + res.t_ends.numpy())
    points = o[ri] + mid[:, None] * d[ri]
    assert np.all(grid.is_occupied(points).numpy())
    ragged = tf.RaggedTensor.from_row_splits(res.t_starts, res.row_splits, validate=True)
    assert ragged.nrows() == 300
    np.testing.assert_array_equal(ragged.row_lengths().numpy(), np.diff(res.row_splits.numpy()))
    # the uniform march of the same rays through an all-occupied grid has many more samples
    full = Grid(ref.pack(np.ones(G**3, bool)), G, aabb)
    assert tfmo.ray_march(o, d, full, step_size=0.0173, seed=1).t_starts.shape[0] > 2 * res.t_starts.shape[0]


def test_jitter_is_deterministic_per_seed_and_differs_across_seeds():
    G = 8
    o, d = ref.make_rays(100, seed=3, aabb=AABB, kinds=("outside", "inside"))
    grid = Grid(ref.pack(np.ones(G**3, bool)), G)
    kw = dict(step_size=0.04, max_samples=4)
    a = tfmo.ray_march(o, d, grid, seed=123, **kw)
    b = tfmo.ray_march(o, d, grid, seed=tf.constant(123, tf.int64), **kw)
    c = tfmo.ray_march(o, d, grid, seed=124, **kw)
    big = tfmo.ray_march(o, d, grid, seed=(1 << 40) + 123, **kw)  # the high 32 bits matter too
    np.testing.assert_array_equal(a.t_starts.numpy(), b.t_starts.numpy())
    first = a.row_splits.numpy()[:-1]
    starts_a, starts_c = a.t_starts.numpy()[first], c.t_starts.numpy()[c.row_splits.numpy()[:-1]]
    assert np.mean(starts_a != starts_c) > 0.9
    assert np.mean(starts_a != big.t_starts.numpy()[big.row_splits.numpy()[:-1]]) > 0.9
    # u = (start - t_enter) / step_size follows the documented hash, and looks uniform
    none = tfmo.ray_march(o, d, grid, jitter=False, **kw)
    u = (starts_a - none.t_starts.numpy()[none.row_splits.numpy()[:-1]]) / 0.04
    want = np.array([ref.jitter_u(123, r) for r in range(100)])
    np.testing.assert_allclose(u, want, atol=1e-4)
    np.testing.assert_array_equal(tfmo.occupancy.ray_jitter_tf(123, 100).numpy(), want.astype(np.float32))
    assert 0.3 < want.mean() < 0.7 and want.min() >= 0 and want.max() < 1


def test_deterministic_across_thread_counts():
    G = 32
    o, d = ref.make_rays(3000, seed=5, aabb=AABB)
    grid = Grid(ref.random_bits(G, 0.2, seed=9), G)
    outs = []
    for n in (1, 2, 3):
        with tfmo.num_threads(n):
            outs.append(tfmo.ray_march(o, d, grid, step_size=0.011, cone_angle=0.01, seed=2))
    assert outs[0].t_starts.shape[0] > 10000
    for other in outs[1:]:
        for x, y in zip(outs[0], other):
            np.testing.assert_array_equal(x.numpy(), y.numpy())


@pytest.mark.parametrize("grid", ["random16", "shell32", "random13"])
def test_plain_tf_version_matches_op(grid):
    G, make = (16, lambda: ref.random_bits(16, 0.35, seed=4)) if grid == "random16" else SPARSE[grid]
    o, d = ref.make_rays(200, seed=8, aabb=AABB)
    grid = Grid(make(), G)
    for b in assert_plain_tf_matches_op(o, d, grid, CASES):
        check_positions(b, o, d)


def test_tf_function_does_not_retrace_for_seed_or_ray_count():
    G = 8
    grid = tfmo.OccupancyGrid(aabb=AABB, resolution=G)
    traces = []

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None, 3], tf.float32),
                                  tf.TensorSpec([], tf.int64)])
    def march(o, d, seed):
        traces.append(1)
        res = tfmo.ray_march(o, d, grid, step_size=0.05, seed=seed)
        assert res.row_splits.shape.rank == 1 and res.t_starts.shape.rank == 1
        return res

    for R, seed in ((10, 1), (37, 2), (5, 3), (0, 4)):
        o, d = ref.make_rays(R, seed=R, aabb=AABB, kinds=("outside", "inside"))
        got = march(o, d, tf.constant(seed, tf.int64))
        want = tfmo.ray_march(o, d, grid, step_size=0.05, seed=seed)
        for x, y in zip(got, want):
            np.testing.assert_array_equal(x.numpy(), y.numpy())
    assert len(traces) == 1
    assert march.experimental_get_tracing_count() == 1

    @tf.function
    def static(o, d):
        return tfmo.ray_march(o, d, grid, step_size=0.05)

    o, d = ref.make_rays(6, seed=1, aabb=AABB)
    g = static.get_concrete_function(tf.TensorSpec([6, 3], tf.float32), tf.TensorSpec([6, 3], tf.float32))
    assert g.structured_outputs.row_splits.shape.as_list() == [7]  # the shape function knows R + 1
    assert g.structured_outputs.t_starts.shape.as_list() == [None]
    assert g.structured_outputs.positions.shape.as_list() == [None, 3]


def test_no_gradient():
    G = 4
    o, d = ref.make_rays(8, seed=1, aabb=AABB, kinds=("outside",))
    o = tf.constant(o)
    with tf.GradientTape() as tape:
        tape.watch(o)
        res = tfmo.ray_march(o, d, Grid(ref.pack(np.ones(G**3, bool)), G), step_size=0.1)
        y = tf.reduce_sum(res.t_starts)
    assert tape.gradient(y, o) is None


# ---------------------------------------------------------------------------------------------------------------
# Errors: the kernel (raw op, as in eager mode without the wrapper) and the wrapper


def raw(o=None, d=None, near=None, far=None, bits=None, aabb=None, seed=0, **attrs):
    G = attrs.get("resolution", 4)
    o = np.zeros((2, 3), np.float32) - 2.0 if o is None else o
    d = np.array([[1, 1, 1], [1, 0, 0]], np.float32) if d is None else d
    R = len(o)
    near = np.zeros(R, np.float32) if near is None else near
    far = np.full(R, 10.0, np.float32) if far is None else far
    bits = np.full((G**3 + 7) // 8, 255, np.uint8) if bits is None else bits
    aabb = np.array([[-1, -1, -1], [1, 1, 1]], np.float32) if aabb is None else aabb
    kw = dict(resolution=G, step_size=0.1, cone_angle=0.0, max_samples=16, jitter=True)
    kw.update(attrs)
    return ops().ray_march(o, d, near, far, bits, aabb, tf.constant(seed, tf.int64), **kw)


def test_raw_op_valid_call():
    """The raw op's defaults: a diagonal ray through a fully occupied 4^3 grid (capped at max_samples=16) and a ray
    that misses the box. Its outputs are t_starts, t_ends, row_splits, ray_indices, positions, and match the
    NumPy reference sample for sample."""
    t0, t1, rs, ri, pos = (v.numpy() for v in raw())
    o = np.zeros((2, 3), np.float32) - 2.0
    d = np.array([[1, 1, 1], [1, 0, 0]], np.float32)
    counts, t0s, t1s, margins = ref.march(o, d, 0.0, 10.0, np.full(8, 255, np.uint8), [[-1] * 3, [1] * 3], 4,
                                          0.1, 0.0, 16, True, 0)
    assert (margins >= ref.MARGIN_EPS).all(), margins
    np.testing.assert_array_equal(counts, [16, 0])
    np.testing.assert_array_equal(rs, [0, 16, 16])
    np.testing.assert_array_equal(ri, np.zeros(16, np.int32))
    np.testing.assert_allclose(t0, t0s[0], rtol=0, atol=ref.T_ATOL)
    np.testing.assert_allclose(t1, t1s[0], rtol=0, atol=ref.T_ATOL)
    mid = (o[0] + (t0 + t1)[:, None] / 2 * d[0] + 1) / 2  # unit box coordinates of the midpoints
    np.testing.assert_allclose(pos, mid, rtol=0, atol=POS_ATOL)


@pytest.mark.parametrize("args,match", [
    (dict(o=np.zeros((2, 2), np.float32)), "rays_o must have shape"),
    (dict(d=np.zeros((3, 3), np.float32)), "rays_d must have shape"),
    (dict(near=np.zeros(3, np.float32)), "near and far"),
    (dict(far=np.zeros((2, 1), np.float32)), "near and far"),
    (dict(bits=np.zeros(7, np.uint8)), r"bits must have shape \[ceil"),
    (dict(aabb=np.zeros((3, 2), np.float32)), "aabb must have shape"),
    (dict(aabb=np.array([[-1, 1, -1], [1, -1, 1]], np.float32)), "min < max"),
    (dict(aabb=np.array([[-1, -1, -1], [1, 1, np.nan]], np.float32)), "min < max"),
    (dict(aabb=np.array([[-1, -1, -np.inf], [1, 1, 1]], np.float32)), "min < max"),
    (dict(o=np.array([[0, 0, np.nan], [0, 0, 0]], np.float32)), "ray 0 has a non-finite"),
    (dict(o=np.array([[0, 0, 0], [np.inf, 0, 0]], np.float32)), "ray 1 has a non-finite"),
    (dict(d=np.array([[1, 0, 0], [0, np.nan, 1]], np.float32)), "ray 1 has a non-finite"),
    (dict(near=np.array([0, np.nan], np.float32)), "NaN near/far"),
    (dict(far=np.array([np.nan, 1], np.float32)), "ray 0"),
    (dict(step_size=0.0), "step_size must be finite and > 0"),
    (dict(step_size=-1.0), "step_size"),
    (dict(step_size=float("nan")), "step_size"),
    (dict(cone_angle=-0.1), "cone_angle"),
    (dict(max_samples=0), "max_samples"),
    (dict(resolution=0), "resolution"),
    (dict(resolution=2000), "resolution"),
])
def test_raw_op_rejects_bad_input(args, match):
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        raw(**args)


def test_raw_op_rejects_wrong_dtypes_and_seed_shape():
    with pytest.raises((tf.errors.InvalidArgumentError, TypeError, ValueError)):
        raw(bits=tf.constant(np.full(8, 255, np.int32)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="seed must be a scalar"):
        ops().ray_march(np.zeros((1, 3), np.float32), np.ones((1, 3), np.float32), [0.0], [1.0],
                        np.full(8, 255, np.uint8), np.array([[-1] * 3, [1] * 3], np.float32),
                        tf.constant([1, 2], tf.int64), resolution=4, step_size=0.1)


def test_near_greater_than_far_and_infinite_range_are_fine():
    o = np.array([[-2, 0.1, 0.2], [-2, 0.1, 0.2]], np.float32)
    d = np.array([[1, 0, 0], [1, 0, 0]], np.float32)
    res = raw(o=o, d=d, near=np.array([3.0, -np.inf], np.float32), far=np.array([1.0, np.inf], np.float32),
              max_samples=100)
    np.testing.assert_array_equal(res[2].numpy(), [0, 0, 20])  # ray 1: the whole box, 2 / 0.1 steps
    np.testing.assert_allclose(res[0].numpy()[0], 1.0 + ref.jitter_u(0, 1) * 0.1, atol=1e-6)


@pytest.mark.parametrize("kw,match", [
    (dict(step_size=0.0), "step_size"),
    (dict(step_size=0.1, cone_angle=-1.0), "cone_angle"),
    (dict(step_size=0.1, max_samples=0), "max_samples"),
    (dict(step_size=0.1, max_samples=2.5), "max_samples"),
    (dict(step_size=0.1, jitter=1), "jitter"),
    (dict(step_size=0.1, near=np.zeros((2, 2), np.float32)), "near"),
])
def test_wrapper_rejects_bad_arguments(kw, match):
    o, d = ref.make_rays(4, seed=0)
    with pytest.raises(ValueError, match=match):
        tfmo.ray_march(o, d, tfmo.OccupancyGrid(resolution=4), **kw)


def test_wrapper_rejects_bad_rays_and_grids():
    grid = tfmo.OccupancyGrid(resolution=4)
    with pytest.raises(ValueError, match="rays_o must have shape"):
        tfmo.ray_march(np.zeros((4, 2), np.float32), np.zeros((4, 3), np.float32), grid, step_size=0.1)
    with pytest.raises(ValueError, match="float32"):
        tfmo.ray_march(tf.zeros((4, 3), tf.float64), np.zeros((4, 3), np.float32), grid, step_size=0.1)
    with pytest.raises(ValueError, match="grid must be"):
        tfmo.ray_march(np.zeros((4, 3), np.float32), np.ones((4, 3), np.float32), object(), step_size=0.1)


def _straight_rays(R):
    """R identical rays along +x through the box [-1, 1]^3 (2 units of it)."""
    o = np.tile(np.array([[-2.0, 0.1, 0.2]], np.float32), (R, 1))
    d = np.tile(np.array([[1.0, 0.0, 0.0]], np.float32), (R, 1))
    return o, d


def test_march_beyond_the_sample_buffer_budget():
    # 66,000 rays x 1024 samples = 67.6M samples > the CPU kernel's 2^26 buffered samples: the chunks that start past
    # the budget only count their samples, then march again to write them. Every ray gives the samples of a lone ray.
    R, S = 66000, 1024
    o, d = _straight_rays(R)
    grid = Grid(ref.pack(np.ones(1, bool)), 1, np.array([[-1, -1, -1], [1, 1, 1]], np.float32))
    res = tfmo.ray_march(o, d, grid, step_size=1e-3, max_samples=S, jitter=False)
    one = tfmo.ray_march(o[:1], d[:1], grid, step_size=1e-3, max_samples=S, jitter=False)
    np.testing.assert_array_equal(res.row_splits.numpy(), np.arange(R + 1) * S)
    for got, want in ((res.t_starts, one.t_starts), (res.t_ends, one.t_ends)):
        got = got.numpy().reshape(R, S)
        assert np.array_equal(got[0], want.numpy()) and np.all(got == got[0])
    assert np.array_equal(res.ray_indices.numpy()[::S], np.arange(R))


def test_more_than_int32_samples_is_an_error():
    R = 1 << 21  # x 1024 samples = 2^31 > the int32 row_splits can index
    o, d = _straight_rays(R)
    grid = Grid(ref.pack(np.ones(1, bool)), 1, np.array([[-1, -1, -1], [1, 1, 1]], np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="2147483648 samples in total exceed the int32 limit"):
        tfmo.ray_march(o, d, grid, step_size=1e-3, max_samples=1024, jitter=False)


def test_lookup_paths_agree():
    # The CPU kernel looks cells up through a per-cell level table when there are enough rays for it to pay off
    # (resolution^3 <= 32 R), else through the bitfield and the mip; both give the same samples for the same rays.
    G = 32
    o, d = ref.make_rays(2000, seed=12, aabb=AABB)
    grid = Grid(ref.sphere_shell_bits(G, 0.3, 0.55, AABB), G)
    kw = dict(step_size=0.0211, cone_angle=0.004, seed=9)
    few = tfmo.ray_march(o[:100], d[:100], grid, **kw)  # 32^3 > 32 * 100: bitfield + mip
    many = tfmo.ray_march(o, d, grid, **kw)  # per-cell levels
    n = int(few.row_splits[-1])
    assert n > 500
    np.testing.assert_array_equal(many.row_splits.numpy()[:101], few.row_splits.numpy())
    for a, b in ((many.t_starts, few.t_starts), (many.t_ends, few.t_ends), (many.ray_indices, few.ray_indices)):
        np.testing.assert_array_equal(a.numpy()[:n], b.numpy())
