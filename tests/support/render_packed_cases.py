"""Shared inputs of the rendering ops' tests (tests/test_render_packed.py, tests/test_render_ops.py and the emulated
GPU checks), and the packed ops' NumPy float64 references (tf_metal_ops.render_packed.reference)."""

import numpy as np

from tf_metal_ops.render_packed.reference import np_distortion_packed, np_volume_render_packed  # noqa: F401


def make_packed(counts, C=3, seed=0, dens_scale=3.0, bg="shared", gaps=True, min_len=0.05):
    """Packed samples for rays with the given sample counts: (densities, colors, t_starts, t_ends, row_splits, bg).

    Intervals have length >= min_len; with gaps, consecutive samples of a ray are >= 0.05 apart (so finite
    differences never make them overlap), else they touch (t_ends[k] == t_starts[k+1])."""
    rng = np.random.default_rng(seed)
    counts = np.asarray(counts, np.int64)
    R, N = len(counts), int(counts.sum())
    rs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    d = rng.uniform(0.0, dens_scale, N).astype(np.float32)
    c = rng.uniform(0.0, 1.0, (N, C)).astype(np.float32)
    ts = np.zeros(N, np.float32)
    te = np.zeros(N, np.float32)
    for r in range(R):
        a, b = rs[r], rs[r + 1]
        n = b - a
        lengths = rng.uniform(min_len, 0.3, n)
        spaces = rng.uniform(0.05, 0.4, n) * (rng.uniform(size=n) < (1.0 if gaps == "always" else 0.5)) if gaps \
            else np.zeros(n)
        start = 2.0 + rng.uniform(0.0, 1.0)
        edges = start + np.cumsum(np.stack([spaces, lengths], 1).reshape(-1))
        ts[a:b] = edges[0::2]
        te[a:b] = edges[1::2]
        te[a:b] = np.maximum(te[a:b], ts[a:b])  # float32 rounding
        if not gaps and n > 1:
            te[a:b - 1] = ts[a + 1:b]
    return d, c, ts, te, rs, random_background(rng, bg, R, C)


def random_background(rng, bg, R, C):
    """The background of R rays with C channels: "shared" [C], "per_ray" [R, C], else None (float32 in [0, 1))."""
    if bg == "shared":
        return rng.uniform(size=C).astype(np.float32)
    if bg == "per_ray":
        return rng.uniform(size=(R, C)).astype(np.float32)
    return None


def random_counts(rng, R, lo=0, hi=12):
    return rng.integers(lo, hi + 1, R)
