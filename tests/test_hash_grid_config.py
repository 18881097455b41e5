"""HashGridConfig: level scales/resolutions/sizes/offsets against hand-computed values, the finest-resolution
conversion, the table-layout helper and validation errors."""

import math

import numpy as np
import pytest

from tf_metal_ops.hash_grid import (
    HashGridConfig,
    HashGridTableLayout,
    hash_grid_table_layout,
    per_level_scale_from_finest_resolution,
)


def test_default_3d():
    # scale_l = 16 * 2^l - 1 -> resolution 16 * 2^l; res^3 = 4096, 32768, 262144 fit in 2^19, 128^3 does not.
    cfg = HashGridConfig(3)
    assert cfg.n_levels == 16 and cfg.n_features_per_level == 2
    assert cfg.scales[:4] == (15.0, 31.0, 63.0, 127.0)
    assert cfg.resolutions[:4] == (16, 32, 64, 128)
    assert cfg.resolutions[-1] == 16 * 2**15
    assert cfg.level_sizes == (4096, 32768, 262144) + (2**19,) * 13
    assert cfg.hashed_levels == (False,) * 3 + (True,) * 13
    assert cfg.offsets[:5] == (0, 4096, 36864, 299008, 299008 + 2**19)
    assert len(cfg.offsets) == 17
    assert cfg.total_entries == 299008 + 13 * 2**19 == 7114752
    assert cfg.n_params == 2 * 7114752
    assert cfg.n_output_dims == 32
    assert cfg.params_shape == (7114752, 2)


def test_non_integer_scale():
    # b = 1.5: scale = 16 * 1.5^l - 1 = 15, 23, 35, 53, 80, 120.5 -> resolution 16, 24, 36, 54, 81, 122.
    # tcnn's float32 steps: log2f(1.5) * 5 = 2.9248126 (rounded), whose exp2f * 16 - 1 is 120.49998 (2 ulps low)
    cfg = HashGridConfig(3, per_level_scale=1.5)
    assert cfg.scales[:5] == (15.0, 23.0, 35.0, 53.0, 80.0)
    assert cfg.scales[5] == float.fromhex("0x1.e1fffcp+6") and abs(cfg.scales[5] - 120.5) < 2e-5
    assert cfg.resolutions[:6] == (16, 24, 36, 54, 81, 122)
    # 81^3 = 531441 > 2^19 = 524288: hashed from level 4 on
    assert cfg.level_sizes[:5] == (4096, 13824, 46656, 157464, 2**19)
    assert cfg.hashed_levels[:5] == (False, False, False, False, True)
    assert cfg.total_entries == 4096 + 13824 + 46656 + 157464 + 12 * 2**19


def test_round_up_to_multiple_of_8():
    # D=3, N_min=5: resolution 5, 125 entries -> 128; D=2, N_min=3: 9 -> 16; D=1, N_min=5: 5 -> 8
    assert HashGridConfig(3, n_levels=1, base_resolution=5).level_sizes == (128,)
    assert HashGridConfig(2, n_levels=2, base_resolution=3, per_level_scale=1.0).level_sizes == (16, 16)
    assert HashGridConfig(1, n_levels=1, base_resolution=5, grid_type="dense").level_sizes == (8,)
    assert HashGridConfig(2, n_levels=2, base_resolution=3, per_level_scale=1.0).offsets == (0, 16, 32)


def test_small_hash_table():
    # D=2, N_min=4, b=2, T=64: res 4 (16 entries), 8 (64 = T: still dense), 16 (256 > 64: hashed)
    cfg = HashGridConfig(2, n_levels=3, base_resolution=4, log2_hashmap_size=6)
    assert cfg.resolutions == (4, 8, 16)
    assert cfg.level_sizes == (16, 64, 64)
    assert cfg.hashed_levels == (False, False, True)
    assert cfg.offsets == (0, 16, 80, 144)
    assert cfg.dense_strides(0) == (1, 4) and cfg.dense_strides(1) == (1, 8)


def test_tiled():
    # N_min^D = 9 caps every level (not rounded to 8, as tcnn); res 3, 6, 12
    cfg = HashGridConfig(2, n_levels=3, base_resolution=3, grid_type="tiled")
    assert cfg.resolutions == (3, 6, 12)
    assert cfg.level_sizes == (9, 9, 9)
    assert cfg.offsets == (0, 9, 18, 27)
    assert cfg.hashed_levels == (False, False, False)
    # tcnn's current grid_index: row-major over all D dims (res <= MAX_BASE[2]), wrapped mod 9. (The older loop
    # stopped at the first stride > size: (1, 0) on level 2; tests/test_hash_grid_tcnn_index.py shows the difference.)
    assert [cfg.dense_strides(l) for l in range(3)] == [(1, 3), (1, 6), (1, 12)]
    assert [cfg.index_stride(l) for l in range(3)] == [9, 36, 144]


def test_dense():
    cfg = HashGridConfig(2, n_levels=3, base_resolution=4, grid_type="dense", log2_hashmap_size=2)
    assert cfg.level_sizes == (16, 64, 256)  # the hash size plays no role
    assert not any(cfg.hashed_levels)


def test_finest_resolution_conversion():
    b = per_level_scale_from_finest_resolution(16, 2048, 16)
    assert math.isclose(b, 2 ** (7 / 15), rel_tol=1e-12)  # exp(log(128) / 15)
    cfg = HashGridConfig.from_finest_resolution(3, 2048, n_levels=16, base_resolution=16)
    assert math.isclose(cfg.per_level_scale, b)
    assert abs(cfg.scale(15) - 2047) < 0.01
    assert per_level_scale_from_finest_resolution(16, 16, 1) == 1.0
    assert per_level_scale_from_finest_resolution(16, 512, 6) == pytest.approx(2.0)
    layout = hash_grid_table_layout(3, n_levels=6, finest_resolution=512)
    assert layout.resolutions == (16, 32, 64, 128, 256, 512)
    with pytest.raises(ValueError, match="finest_resolution"):
        per_level_scale_from_finest_resolution(16, 8, 4)


def test_layout_helper():
    layout = hash_grid_table_layout(2, n_levels=3, base_resolution=4, log2_hashmap_size=6, n_features_per_level=4)
    assert isinstance(layout, HashGridTableLayout)
    assert layout.offsets == (0, 16, 80, 144)
    assert layout.level_sizes == (16, 64, 64)
    assert layout.total_entries == 144 and layout.n_params == 576 and layout.params_shape == (144, 4)
    assert layout.n_output_dims == 12 and layout.hashed == (False, False, True)
    cfg = HashGridConfig(2, n_levels=3, base_resolution=4, log2_hashmap_size=6, n_features_per_level=4)
    assert hash_grid_table_layout(cfg) == layout == cfg.layout()


def test_normalisation_and_op_kwargs():
    cfg = HashGridConfig(np.int64(3), per_level_scale=np.float32(1.5), grid_type="Hash", interpolation="LINEAR")
    assert cfg.n_input_dims == 3 and type(cfg.n_input_dims) is int
    assert cfg.grid_type == "hash" and cfg.interpolation == "linear"
    assert cfg.op_kwargs() == dict(
        n_levels=16, n_features_per_level=2, log2_hashmap_size=19, base_resolution=16, per_level_scale=1.5,
        grid_type="hash", interpolation="linear",
    )
    with pytest.raises(dataclasses_frozen_error()):
        cfg.n_levels = 3


def dataclasses_frozen_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(n_input_dims=0), "n_input_dims"),
        (dict(n_input_dims=5), "n_input_dims"),
        (dict(n_input_dims=2.0), "n_input_dims"),
        (dict(n_levels=0), "n_levels"),
        (dict(n_levels=33), "n_levels"),
        (dict(n_features_per_level=3), "n_features_per_level"),
        (dict(n_features_per_level=16), "n_features_per_level"),
        (dict(log2_hashmap_size=0), "log2_hashmap_size"),
        (dict(log2_hashmap_size=25), "log2_hashmap_size"),
        (dict(base_resolution=0), "base_resolution"),
        (dict(per_level_scale=0.5), "per_level_scale"),
        (dict(per_level_scale=float("nan")), "per_level_scale"),
        (dict(per_level_scale="2"), "per_level_scale"),
        (dict(grid_type="octree"), "grid_type"),
        (dict(interpolation="cubic"), "interpolation"),
        (dict(n_levels=32, per_level_scale=2.0), "per_level_scale"),  # finest scale 16 * 2^31 > 2^24
        (dict(grid_type="dense"), "grid_type='hash'"),  # 16 dense 3-D levels up to 524288^3 entries
    ],
)
def test_validation(kwargs, name):
    kwargs = {"n_input_dims": 3, **kwargs}
    with pytest.raises(ValueError, match=name):
        HashGridConfig(**kwargs)


def test_limits_accepted():
    HashGridConfig(4, n_levels=32, per_level_scale=1.5)
    HashGridConfig(4, n_levels=8, log2_hashmap_size=24, n_features_per_level=8)  # 2^30 parameters
    with pytest.raises(ValueError, match="parameters"):
        HashGridConfig(4, n_levels=18, log2_hashmap_size=24, n_features_per_level=8)  # > 2^31 parameters
    HashGridConfig(1, n_levels=1, base_resolution=1, per_level_scale=1.0, log2_hashmap_size=1)
