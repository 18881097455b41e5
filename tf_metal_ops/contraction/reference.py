"""NumPy float64 reference of the scene contraction (written from the definition in ``tf_metal_ops.contraction``),
with its Jacobian for the gradient tests."""

import numpy as np


def _norm(x, norm):
    return np.linalg.norm(x, axis=-1, keepdims=True) if norm == "l2" else np.max(np.abs(x), axis=-1, keepdims=True)


def contract(x, norm="l2"):
    """x if ||x|| <= 1 else (2 - 1/||x||) x / ||x||, per point of x [..., 3] (float64)."""
    x = np.asarray(x, np.float64)
    n = _norm(x, norm)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (2.0 - 1.0 / n) * x / n
    return np.where(n > 1.0, out, x)


def contract_to_unit(x, aabb, norm="l2"):
    """(contract((x - centre) / half_extent) + 2) / 4 (float64)."""
    lo, hi = np.asarray(aabb, np.float64)
    return (contract((np.asarray(x, np.float64) - (lo + hi) / 2) / ((hi - lo) / 2), norm) + 2.0) / 4.0


def contract_jacobian(x, norm="l2"):
    """d contract / dx for each point of x [P, 3] -> [P, 3, 3] (row i: output i). Outside the unit region,
    y = s(n) x with s(n) = 2/n - 1/n^2, so J = s I + x (s'(n) grad n)^T, s'(n) = -2/n^2 + 2/n^3, grad n = x / n
    (L2) or sign(x_a) e_a with a = argmax |x_i| (L-inf; points with a tie are not differentiable there)."""
    x = np.asarray(x, np.float64).reshape(-1, 3)
    out = np.zeros((len(x), 3, 3))
    for p, v in enumerate(x):
        n = float(_norm(v, norm)[0])
        if n <= 1.0:
            out[p] = np.eye(3)
            continue
        if norm == "l2":
            grad_n = v / n
        else:
            a = int(np.argmax(np.abs(v)))
            grad_n = np.zeros(3)
            grad_n[a] = np.sign(v[a])
        s, ds = 2.0 / n - 1.0 / n**2, -2.0 / n**2 + 2.0 / n**3
        out[p] = s * np.eye(3) + np.outer(v, ds * grad_n)
    return out
