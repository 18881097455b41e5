"""Shared inputs and NumPy float64 references of the packed rendering ops (tests/test_render_packed.py and the
emulated GPU checks). The references are written from the definitions (explicit loops, a pair sum for the
distortion loss), independent of the kernels' recurrences."""

import numpy as np


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
    if bg == "shared":
        b_ = rng.uniform(size=C).astype(np.float32)
    elif bg == "per_ray":
        b_ = rng.uniform(size=(R, C)).astype(np.float32)
    else:
        b_ = None
    return d, c, ts, te, rs, b_


def random_counts(rng, R, lo=0, hi=12):
    return rng.integers(lo, hi + 1, R)


def np_volume_render_packed(d, c, ts, te, rs, bg=None, thr=0.0):
    d, c, ts, te = (np.asarray(x, np.float64) for x in (d, c, ts, te))
    R, C = len(rs) - 1, c.shape[1]
    color, depth, opacity = np.zeros((R, C)), np.zeros(R), np.zeros(R)
    weights = np.zeros(len(d))
    for r in range(R):
        a, b = int(rs[r]), int(rs[r + 1])
        cum = 0.0
        for k in range(a, b):
            T = np.exp(-cum)
            if T < thr:
                break
            tau = d[k] * (te[k] - ts[k])
            weights[k] = T * -np.expm1(-tau)
            cum += tau
        color[r] = weights[a:b] @ c[a:b]
        if bg is not None:
            bg64 = np.asarray(bg, np.float64)
            color[r] += np.exp(-cum) * (bg64 if bg64.ndim == 1 else bg64[r])
        depth[r] = np.sum(weights[a:b] * 0.5 * (ts[a:b] + te[a:b]))
        opacity[r] = -np.expm1(-cum)
    return color, depth, opacity, weights


def np_distortion_packed(w, ts, te, rs):
    w, ts, te = (np.asarray(x, np.float64) for x in (w, ts, te))
    out = np.zeros(len(rs) - 1)
    for r in range(len(rs) - 1):
        a, b = int(rs[r]), int(rs[r + 1])
        m = 0.5 * (ts[a:b] + te[a:b])
        wr = w[a:b]
        out[r] = np.sum(wr[:, None] * wr[None, :] * np.abs(m[:, None] - m[None, :])) + np.sum(
            wr * wr * (te[a:b] - ts[a:b])) / 3.0
    return out
