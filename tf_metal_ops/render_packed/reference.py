"""NumPy float64 references of the packed rendering ops, written from the definitions (explicit loops, a pair sum
for the distortion loss), independent of the kernels' recurrences."""

import numpy as np


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
