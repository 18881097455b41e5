"""NumPy float64 references of VolumeRender and DistortionLoss, written from the definitions (explicit loops, the
pair sum of the distortion loss), independent of the kernels' recurrences."""

import numpy as np


def np_volume_render(d, c, t, bg=None, thr=0.0):
    d, c, t = (np.asarray(x, np.float64) for x in (d, c, t))
    R, S = d.shape
    C = c.shape[2]
    color = np.zeros((R, C))
    depth = np.zeros(R)
    opacity = np.zeros(R)
    weights = np.zeros((R, S))
    for r in range(R):
        cum = 0.0
        for i in range(S):
            T = np.exp(-cum)
            if T < thr:
                break
            tau = d[r, i] * (t[r, i + 1] - t[r, i])
            weights[r, i] = T * -np.expm1(-tau)
            cum += tau
        T_final = np.exp(-cum)
        color[r] = weights[r] @ c[r]
        if bg is not None:
            bg64 = np.asarray(bg, np.float64)
            color[r] += T_final * (bg64 if bg64.ndim == 1 else bg64[r])
        depth[r] = np.sum(weights[r] * 0.5 * (t[r, 1:] + t[r, :-1]))
        opacity[r] = -np.expm1(-cum)
    return color, depth, opacity, weights


def np_distortion_naive(w, t):
    w, t = np.asarray(w, np.float64), np.asarray(t, np.float64)
    m = 0.5 * (t[:, 1:] + t[:, :-1])
    delta = t[:, 1:] - t[:, :-1]
    pair = np.einsum("ri,rj,rij->r", w, w, np.abs(m[:, :, None] - m[:, None, :]))
    return pair + np.sum(w * w * delta, axis=1) / 3.0
