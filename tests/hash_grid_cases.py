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
