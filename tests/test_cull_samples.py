"""cull_samples_packed (tf_metal_ops.render_packed.cull): the kept samples against a NumPy float64 reference written
from the definition (explicit loop over each ray's samples), the compacted indices and row splits, the render of the
kept samples against the full render (weights within the culled samples' share), empty rays, N = 0, graph mode
with unknown sizes, and every bad argument (ValueError)."""

import numpy as np
import pytest
import tensorflow as tf

import tf_metal_ops as tfmo

from support.render_packed_cases import make_packed, random_counts


def optical_depths(d, ts, te, rs):
    """(k, cum, tau) for every sample k in ray order, in float64: cum the optical depth of the samples of its ray
    before it, tau its own."""
    d, ts, te = (np.asarray(x, np.float64) for x in (d, ts, te))
    for r in range(len(rs) - 1):
        cum = 0.0
        for k in range(int(rs[r]), int(rs[r + 1])):
            tau = d[k] * (te[k] - ts[k])
            yield k, cum, tau
            cum += tau


def np_cull(d, ts, te, rs, eps, thr):
    """Keep mask [N]: transmittance before the sample (all earlier samples of its ray) >= eps and alpha >= thr."""
    keep = np.zeros(len(d), bool)
    for k, cum, tau in optical_depths(d, ts, te, rs):
        keep[k] = np.exp(-cum) >= eps and -np.expm1(-tau) >= thr
    return keep


def near_boundary(d, ts, te, rs, eps, thr, tol=1e-5):
    """Samples whose transmittance or alpha lies within ``tol`` (relative) of its threshold: float32 inputs may round
    either way there."""
    out = np.zeros(len(d), bool)
    for k, cum, tau in optical_depths(d, ts, te, rs):
        if eps > 0:
            out[k] |= abs(cum + np.log(eps)) <= tol * max(1.0, cum)
        if thr > 0:
            out[k] |= abs(-np.expm1(-tau) - thr) <= tol
    return out


@pytest.mark.parametrize("eps,thr", [(1e-4, 0.0), (0.0, 0.3), (1e-2, 0.2), (0.0, 0.0), (0.5, 0.05)])
def test_matches_numpy_float64(eps, thr):
    rng = np.random.default_rng(int(eps * 1e4) + int(thr * 100))
    counts = random_counts(rng, 60, 0, 30)
    counts[[0, 7, 59]] = 0
    d, _, ts, te, rs, _ = make_packed(counts, 1, seed=3, dens_scale=8.0)
    d[rng.random(len(d)) < 0.3] = 0.0  # empty space: alpha 0
    want = np_cull(d, ts, te, rs, eps, thr)
    out = tfmo.cull_samples_packed(d, ts, te, rs, early_stop_eps=eps, alpha_threshold=thr)
    got = out.keep.numpy()
    ok = near_boundary(d, ts, te, rs, eps, thr)
    np.testing.assert_array_equal(got[~ok], want[~ok])
    assert 0 < want.sum() < len(d) or (eps == 0 and thr == 0 and want.all())
    np.testing.assert_array_equal(out.indices.numpy(), np.nonzero(got)[0])
    per_ray = np.add.reduceat(np.r_[got, False].astype(int), rs[:-1])[:len(counts)] * (counts > 0)
    np.testing.assert_array_equal(out.row_splits.numpy(), np.r_[0, np.cumsum(per_ray)])
    assert out.indices.dtype == tf.int32 and out.row_splits.dtype == tf.int32 and out.keep.dtype == tf.bool


def test_kept_samples_render_like_all_of_them():
    """The kept samples' render (float64 reference) differs from the full one by at most the culled share: per ray,
    |opacity difference| <= n_culled_alpha * thr + eps."""
    from tf_metal_ops.render_packed.reference import np_volume_render_packed

    rng = np.random.default_rng(5)
    counts = random_counts(rng, 40, 1, 40)
    d, c, ts, te, rs, _ = make_packed(counts, 3, seed=5, dens_scale=20.0)
    d[rng.random(len(d)) < 0.5] *= 1e-3
    eps, thr = 1e-3, 1e-2
    out = tfmo.cull_samples_packed(d, ts, te, rs, early_stop_eps=eps, alpha_threshold=thr)
    i = out.indices.numpy()
    full = np_volume_render_packed(d, c, ts, te, rs)
    kept = np_volume_render_packed(d[i], c[i], ts[i], te[i], out.row_splits.numpy())
    n_low = np.add.reduceat(np.r_[(-np.expm1(-d * (te - ts)) < thr), False].astype(int), rs[:-1])[:len(counts)]
    assert np.all(np.abs(full[2] - kept[2]) <= n_low * thr + eps + 1e-9)
    assert len(i) < 0.8 * len(d)


def test_empty_and_no_samples_and_graph_mode():
    out = tfmo.cull_samples_packed(np.zeros(0, np.float32), np.zeros(0, np.float32), np.zeros(0, np.float32),
                                   [0, 0, 0])
    assert out.indices.shape == (0,) and out.row_splits.numpy().tolist() == [0, 0, 0]
    spec = tf.TensorSpec([None], tf.float32)
    fn = tf.function(lambda d, a, b, rs: tfmo.cull_samples_packed(d, a, b, rs, alpha_threshold=0.1).row_splits,
                     input_signature=[spec, spec, spec, tf.TensorSpec([None], tf.int32)])
    assert fn([5.0, 0.01, 1.0], [0.0, 0.5, 0.0], [0.5, 1.0, 0.5], [0, 2, 2, 3]).numpy().tolist() == [0, 1, 1, 2]
    assert fn.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("kw,pattern", [
    (dict(early_stop_eps=1.0), "early_stop_eps must be a number in \\[0, 1\\)"),
    (dict(early_stop_eps=-1e-4), "early_stop_eps"),
    (dict(alpha_threshold=float("nan")), "alpha_threshold"),
    (dict(alpha_threshold=True), "alpha_threshold"),
    (dict(densities=tf.ones([3], tf.float64)), "densities must be float32"),
    (dict(densities=np.ones((3, 1), np.float32)), "densities must have rank 1"),
    (dict(t_ends=np.ones(2, np.float32)), "t_ends.shape\\[0\\]"),
    (dict(row_splits=[0.0, 3.0]), "row_splits must be int32"),
    (dict(row_splits=np.zeros(0, np.int32)), "row_splits needs at least one entry"),
])
def test_bad_arguments_raise_value_error(kw, pattern):
    args = dict(densities=np.ones(3, np.float32), t_starts=np.zeros(3, np.float32), t_ends=np.ones(3, np.float32),
                row_splits=[0, 3])
    args.update(kw)
    with pytest.raises(ValueError, match=pattern):
        tfmo.cull_samples_packed(**args)
