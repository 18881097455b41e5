"""Checks shared by the ray-march tests (tests/test_ray_march.py, tests/test_ray_march_cascades.py)."""

import numpy as np

import tf_metal_ops as tfmo


def assert_plain_tf_matches_op(o, d, grid, cases, near=0.1):
    """ray_march_tf gives the op's samples for every keyword set in `cases`: the same rays and sample counts, t and
    positions within 1e-6. Returns the plain-TF results."""
    results = []
    for kw in cases:
        a = tfmo.ray_march(o, d, grid, near=near, **kw)
        b = tfmo.ray_march_tf(o, d, grid, near=near, **kw)
        np.testing.assert_array_equal(a.row_splits.numpy(), b.row_splits.numpy())
        np.testing.assert_array_equal(a.ray_indices.numpy(), b.ray_indices.numpy())
        for name in ("t_starts", "t_ends", "positions"):
            np.testing.assert_allclose(getattr(a, name).numpy(), getattr(b, name).numpy(), rtol=0, atol=1e-6,
                                       err_msg=f"{name}, {kw}")
        results.append(b)
    return results
