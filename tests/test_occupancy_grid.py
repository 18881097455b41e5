"""OccupancyGrid: bit packing, warm-up, decayed max, threshold, a known density (a sphere), tf.function."""

import numpy as np
import pytest
import tensorflow as tf

import tf_metal_ops as tfmo
from tf_metal_ops.occupancy import pack_bits, unpack_bits
from tf_metal_ops.ray_march import reference as ref

AABB = np.array([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]], np.float32)


def cell_centers(G, aabb=AABB):
    lo, hi = aabb.astype(np.float64)
    idx = np.arange(G**3)
    ijk = np.stack([idx % G, (idx // G) % G, idx // (G * G)], axis=1)
    return lo + (ijk + 0.5) * (hi - lo) / G


@pytest.mark.parametrize("n", [1, 7, 8, 9, 64, 1000])
def test_pack_matches_numpy_little_endian_bits(n):
    occ = np.random.default_rng(n).uniform(size=n) < 0.4
    packed = pack_bits(occ).numpy()
    np.testing.assert_array_equal(packed, ref.pack(occ))
    assert packed.dtype == np.uint8 and packed.shape == ((n + 7) // 8,)
    np.testing.assert_array_equal(unpack_bits(packed, n).numpy(), occ)


def test_initial_state_and_properties():
    grid = tfmo.OccupancyGrid(resolution=5)
    assert grid.resolution == 5
    np.testing.assert_array_equal(grid.aabb, AABB)
    assert grid.bits.dtype == tf.uint8 and grid.bits.shape == (16,)  # ceil(125 / 8)
    assert grid.density.shape == (125,) and grid.step.dtype == tf.int64
    assert "CPU" in grid.bits.device and "CPU" in grid.density.device
    assert float(grid.occupied_fraction()) == 1.0
    assert int(grid.bits.numpy()[-1]) == (1 << 5) - 1  # padding bits beyond cell 124 are 0


def test_is_occupied_uses_cell_layout_and_box():
    G = 4
    grid = tfmo.OccupancyGrid(aabb=((0, 0, 0), (4, 8, 12)), resolution=G)
    occ = np.zeros(G**3, bool)
    occ[1 + G * (2 + G * 3)] = True  # cell (1, 2, 3): x in [1, 2], y in [4, 6], z in [9, 12]
    grid.bits.assign(ref.pack(occ))
    pts = np.array([[1.5, 5.0, 10.0], [0.5, 5.0, 10.0], [1.5, 3.9, 10.0], [1.5, 5.0, 8.9], [1.5, 5.0, 12.5],
                    [-0.1, 5.0, 10.0]], np.float32)
    np.testing.assert_array_equal(grid.is_occupied(pts).numpy(), [True, False, False, False, False, False])
    assert float(grid.occupied_fraction()) == pytest.approx(1 / 64)


def test_warmup_samples_every_cell_and_keeps_all_occupied():
    G = 6
    grid = tfmo.OccupancyGrid(resolution=G, warmup_steps=2, decay=0.5, threshold=0.01)
    seen = []

    def density(points):
        seen.append(points.shape[0])
        # a jittered point of each cell: inside its own cell
        return tf.where(points[:, 0] > 0.0, 1.0, 0.0)

    frac = grid.update(density, seed=1)
    assert seen == [G**3] and float(frac) == 1.0 and int(grid.step) == 1
    assert float(grid.occupied_fraction()) == 1.0
    dens = grid.density.numpy()
    np.testing.assert_array_equal(dens, (cell_centers(G)[:, 0] > 0).astype(np.float32))
    grid.update(density, seed=1)
    assert float(grid.occupied_fraction()) == 1.0  # step 1 < warmup_steps
    grid.update(density, seed=1, n_cells=10)  # step 2: warm-up over, thresholded
    assert seen[-1] == 20  # n_cells uniform + n_cells from occupied cells
    occ = grid.occupied().numpy()
    np.testing.assert_array_equal(occ, cell_centers(G)[:, 0] > 0)


def test_decayed_max_and_threshold():
    G = 4
    n = G**3
    grid = tfmo.OccupancyGrid(resolution=G, warmup_steps=0, decay=0.5, threshold=0.01)
    value = tf.Variable(2.0)
    grid.update(lambda p: tf.fill([tf.shape(p)[0]], value), step=0, seed=0, n_cells=n * 4)
    # n_cells * 4 random cells: with 4n draws nearly every cell is hit; the rest decayed from 0 stays 0
    hit = grid.density.numpy() > 0
    assert hit.mean() > 0.9
    np.testing.assert_array_equal(grid.density.numpy()[hit], 2.0)
    value.assign(0.0)
    before = grid.density.numpy().copy()
    for i in range(3):
        grid.update(lambda p: tf.fill([tf.shape(p)[0]], value), seed=i, n_cells=5)
    np.testing.assert_allclose(grid.density.numpy(), before * 0.125)  # only decay: max(old * 0.5, 0)
    assert int(grid.step) == 4  # step=0 then three increments
    # threshold = min(mean, threshold): with density 0.25 on hit cells, mean < 0.25 but > 0.01 -> thr = 0.01
    np.testing.assert_array_equal(grid.occupied().numpy(), grid.density.numpy() > 0.01)
    # a mean below the threshold decides: densities {0, 1e-3 on one cell} -> mean ~1.6e-5 -> that cell occupied
    small = np.zeros(n, np.float32)
    small[7] = 1e-3
    grid.density.assign(small / 0.5)  # decays to `small` at the next update
    grid.update(lambda p: tf.zeros([tf.shape(p)[0]]), seed=9, n_cells=1)
    np.testing.assert_array_equal(np.nonzero(grid.occupied().numpy())[0], [7])


def test_sphere_density_ends_with_the_right_cells():
    G = 16
    radius = 0.6
    grid = tfmo.OccupancyGrid(resolution=G, warmup_steps=3, decay=0.95)

    def sphere(points):
        return tf.where(tf.norm(points, axis=1) < radius, 20.0, 0.0)[:, None]  # [M, 1] is accepted

    for _ in range(6):
        grid.update(sphere)
    rad = np.linalg.norm(cell_centers(G), axis=1)
    half_diag = np.sqrt(3) / G  # cell size 2 / G
    occ = grid.occupied().numpy()
    assert np.all(occ[rad < radius - half_diag])  # cells entirely inside
    assert not np.any(occ[rad > radius + half_diag])  # cells entirely outside
    frac = float(grid.occupied_fraction())
    assert 4 / 3 * np.pi * (radius - half_diag) ** 3 / 8 < frac < 4 / 3 * np.pi * (radius + half_diag) ** 3 / 8
    # marching through it: samples only near/in the sphere
    o, d = ref.make_rays(200, seed=3, kinds=("outside",))
    res = tfmo.ray_march(o, d, grid, step_size=0.02, seed=0)
    ri = res.ray_indices.numpy()
    mid = 0.5 * (res.t_starts.numpy() + res.t_ends.numpy())
    pts = o[ri] + mid[:, None] * d[ri]
    assert res.t_starts.shape[0] > 500
    assert np.all(np.linalg.norm(pts, axis=1) < radius + 2 * half_diag)


def test_update_in_tf_function_and_seeded_determinism():
    G = 8

    def density(points):
        return tf.nn.relu(0.5 - tf.norm(points - 0.2, axis=1)) * 10.0

    grids = [tfmo.OccupancyGrid(resolution=G, warmup_steps=2) for _ in range(2)]
    traces = []

    def make_step(grid):
        @tf.function
        def step(seed):
            traces.append(1)
            return grid.update(density, seed=seed, n_cells=40)

        return step

    steps = [make_step(g) for g in grids]
    for i in range(5):
        for s in steps:
            s(tf.constant(i, tf.int64))
    assert len(traces) == 2  # once per grid, not per seed/step (warm-up is a tf.cond inside)
    np.testing.assert_array_equal(grids[0].density.numpy(), grids[1].density.numpy())
    np.testing.assert_array_equal(grids[0].bits.numpy(), grids[1].bits.numpy())
    assert int(grids[0].step) == 5
    eager = tfmo.OccupancyGrid(resolution=G, warmup_steps=2)
    for i in range(5):
        eager.update(density, seed=i, n_cells=40)
    # same cells and points; density_fn's float32 rounding may differ between eager and graph by an ulp
    np.testing.assert_allclose(eager.density.numpy(), grids[0].density.numpy(), rtol=1e-5, atol=1e-6)
    other = tfmo.OccupancyGrid(resolution=G, warmup_steps=2)
    for i in range(5):
        other.update(density, seed=100 + i, n_cells=40)
    assert not np.array_equal(other.density.numpy(), eager.density.numpy())


def test_constructor_validation():
    with pytest.raises(ValueError, match="aabb"):
        tfmo.OccupancyGrid(aabb=((0, 0, 0), (1, 0, 1)))
    with pytest.raises(ValueError, match="resolution"):
        tfmo.OccupancyGrid(resolution=0)
    with pytest.raises(ValueError, match="resolution"):
        tfmo.OccupancyGrid(resolution=2.5)
    with pytest.raises(ValueError, match="decay"):
        tfmo.OccupancyGrid(decay=1.5)
    with pytest.raises(ValueError, match="threshold"):
        tfmo.OccupancyGrid(threshold=-1.0)
    with pytest.raises(ValueError, match="warmup_steps"):
        tfmo.OccupancyGrid(warmup_steps=-1)
    grid = tfmo.OccupancyGrid(resolution=4)
    with pytest.raises(ValueError, match="n_cells"):
        grid.update(lambda p: p[:, 0], n_cells=0)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        grid.update(lambda p: tf.zeros([3]))  # wrong number of values
