"""Inputs shared by the hash-grid tests (op, pure TF, emulated Metal)."""

import zlib

import numpy as np

from tf_metal_ops.hash_grid.config import GRID_TYPES, INTERPOLATIONS  # noqa: F401 (re-exported for the tests)


def seeded(*key):
    """A generator seeded by the key's text, stable across processes (unlike hash())."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def random_positions(rng, n, d):
    """Mostly inside [0, 1], some outside, NaN/inf, exact 0 and 1 (the clamp policy is part of the contract)."""
    x = rng.uniform(-0.05, 1.05, (n, d)).astype(np.float32)
    if n >= 8:
        x[0, 0] = np.nan
        x[1, -1] = np.inf
        x[2, 0] = -np.inf
        x[3] = 0.0
        x[4] = 1.0
        x[5, 0] = 0.5
    return x


def random_config(rng, d=None, grid_type=None, interpolation=None, *, max_levels=8, max_log2=14, max_resolution=19,
                  max_scale=2.2, max_entries=2_000_000):
    """A valid HashGridConfig drawn at random (levels, features, table size, resolution, scale); d, grid type and
    interpolation drawn too unless given. Configurations HashGridConfig rejects or larger than `max_entries` table
    rows in all are drawn again."""
    from tf_metal_ops.hash_grid import HashGridConfig

    while True:
        dd = d or int(rng.integers(1, 5))
        kwargs = dict(
            n_levels=int(rng.integers(1, max_levels + 1)),
            n_features_per_level=int(rng.choice([1, 2, 4, 8])),
            log2_hashmap_size=int(rng.integers(3, max_log2 + 1)),
            base_resolution=int(rng.integers(1, max_resolution + 1)),
            per_level_scale=float(rng.uniform(1.0, max_scale)),
        )
        kwargs["grid_type"] = str(grid_type or rng.choice(GRID_TYPES))
        kwargs["interpolation"] = str(interpolation or rng.choice(INTERPOLATIONS))
        try:
            cfg = HashGridConfig(dd, **kwargs)
        except ValueError:
            continue
        if cfg.total_entries <= max_entries:
            return cfg
