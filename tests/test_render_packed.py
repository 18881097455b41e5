"""VolumeRenderPacked and DistortionLossPacked (CPU kernels): NumPy float64 references, gradients (autodiff and
finite differences of the float64 plain-TF version), equality with volume_render / distortion_loss on uniformly
packed rays, empty rays, R = 0 and N = 0, every invalid input, thread-count determinism, the CPU kernel's chunks of
rays, graph mode.

Tolerances: values vs the float64 references rtol 2e-5, atol 2e-6 (float32 scans of <= 64 samples; 5e-5, 5e-6 for
the rays of up to 3000 samples in test_chunk_edges). Against volume_render on the same rays: rtol 1e-5, atol 1e-6
(the same vectorised exp, running sums in another order; distortion_loss uses the same scalar functions: bitwise
equal). Gradients vs float64: rtol 1e-4, atol
2e-5 * max|g|. Jacobians vs float64 finite differences: max abs error 2e-3.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_metal_ops as tfmo
from tf_metal_ops._library import ops

from support.render_packed_cases import (
    make_packed,
    np_distortion_packed,
    np_volume_render_packed,
    random_counts,
)

OUT_NAMES = ("color", "depth", "opacity", "weights")


def assert_outputs_close(got, want, rtol=2e-5, atol=2e-6):
    for name, g, w in zip(OUT_NAMES, got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=rtol, atol=atol, err_msg=name)


# ---------------------------------------------------------------------------------------------------------------
# Forward against NumPy


@pytest.mark.parametrize("C", [1, 3, 5])
@pytest.mark.parametrize("bg", ["none", "shared", "per_ray"])
@pytest.mark.parametrize("thr", [0.0, 0.05])
def test_volume_render_packed_matches_numpy(C, bg, thr):
    rng = np.random.default_rng(C * 7 + len(bg))
    counts = random_counts(rng, 41, 0, 40)
    counts[[0, 5, 40]] = 0  # empty rays first, inside, last
    d, c, ts, te, rs, b = make_packed(counts, C, seed=C, bg=bg)
    got = tfmo.volume_render_packed(d, c, ts, te, rs, b, termination_threshold=thr)
    assert got.color.shape == (41, C) and got.depth.shape == (41,) and got.weights.shape == (len(d),)
    assert_outputs_close(got, np_volume_render_packed(d, c, ts, te, rs, b, thr))


def test_empty_rays_give_background_and_zero_opacity():
    d, c, ts, te, rs, b = make_packed([0, 3, 0, 0, 5, 0], 3, seed=2, bg="per_ray")
    out = tfmo.volume_render_packed(d, c, ts, te, rs, b)
    empty = [0, 2, 3, 5]
    np.testing.assert_array_equal(out.opacity.numpy()[empty], 0.0)
    np.testing.assert_array_equal(out.depth.numpy()[empty], 0.0)
    np.testing.assert_array_equal(out.color.numpy()[empty], b[empty])
    np.testing.assert_array_equal(tfmo.distortion_loss_packed(out.weights, ts, te, rs).numpy()[empty], 0.0)
    bg = tf.constant(b)
    with tf.GradientTape() as tape:
        tape.watch(bg)
        col = tfmo.volume_render_packed(d, c, ts, te, rs, bg).color
    np.testing.assert_array_equal(tape.gradient(col, bg).numpy()[empty], 1.0)


@pytest.mark.parametrize("R", [0, 3])
def test_no_samples(R):
    """R = 0 (row_splits [0]) and N = 0 with R rays: outputs, gradients, distortion loss."""
    z = np.zeros(0, np.float32)
    d, ts, te = (tf.constant(z) for _ in range(3))
    c = tf.zeros([0, 3])
    rs = np.zeros(R + 1, np.int32)
    bg = tf.constant(np.arange(3 * R, dtype=np.float32).reshape(R, 3))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([d, c, ts, te, bg])
        out = tfmo.volume_render_packed(d, c, ts, te, rs, bg, termination_threshold=0.01)
        loss = tf.reduce_sum(out.color) + tf.reduce_sum(out.depth) + tf.reduce_sum(out.opacity)
        dl = tf.reduce_sum(tfmo.distortion_loss_packed(out.weights, ts, te, rs))
    assert out.color.shape == (R, 3) and out.depth.shape == (R,) and out.weights.shape == (0,)
    np.testing.assert_array_equal(out.color.numpy(), bg.numpy())
    np.testing.assert_array_equal(out.opacity.numpy(), 0.0)
    grads = tape.gradient(loss, [d, c, ts, te, bg])
    assert [g.shape for g in grads[:4]] == [(0,), (0, 3), (0,), (0,)]
    np.testing.assert_array_equal(grads[4].numpy(), np.ones((R, 3)))
    assert dl.numpy() == 0.0
    assert [g.shape for g in tape.gradient(dl, [ts, te])] == [(0,), (0,)]


@pytest.mark.parametrize("thr", [0.1, 0.5, 1.0])
def test_termination_threshold(thr):
    rng = np.random.default_rng(3)
    d, c, ts, te, rs, b = make_packed(random_counts(rng, 30, 0, 30), 3, seed=4, dens_scale=8.0)
    out = tfmo.volume_render_packed(d, c, ts, te, rs, b, termination_threshold=thr)
    ref = np_volume_render_packed(d, c, ts, te, rs, b, thr)
    assert_outputs_close(out, ref)
    assert (ref[3] == 0).sum() > (np_volume_render_packed(d, c, ts, te, rs, b)[3] == 0).sum()  # it did stop rays


def test_plain_tf_versions_match_numpy():
    rng = np.random.default_rng(5)
    counts = random_counts(rng, 25, 0, 20)
    counts[-1] = 0
    d, c, ts, te, rs, b = make_packed(counts, 3, seed=5, bg="per_ray")
    for thr in (0.0, 0.05):
        got = tfmo.volume_render_packed_tf(*(x.astype(np.float64) for x in (d, c, ts, te)), rs,
                                           b.astype(np.float64), termination_threshold=thr)
        assert_outputs_close(got, np_volume_render_packed(d, c, ts, te, rs, b, thr), rtol=1e-10, atol=1e-12)
        got32 = tfmo.volume_render_packed_tf(d, c, ts, te, rs, b, termination_threshold=thr)
        assert_outputs_close(got32, np_volume_render_packed(d, c, ts, te, rs, b, thr))
    w = rng.uniform(0, 0.3, len(d))
    np.testing.assert_allclose(tfmo.distortion_loss_packed_tf(w, ts.astype(np.float64), te.astype(np.float64), rs),
                               np_distortion_packed(w, ts, te, rs), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("gaps", [True, False])
def test_distortion_loss_packed_matches_pair_sum(gaps):
    rng = np.random.default_rng(6)
    counts = random_counts(rng, 33, 0, 30)
    counts[3] = 0
    _, _, ts, te, rs, _ = make_packed(counts, 1, seed=6, gaps=gaps)
    w = rng.uniform(0.0, 0.2, len(ts)).astype(np.float32)
    got = tfmo.distortion_loss_packed(w, ts, te, rs).numpy()
    np.testing.assert_allclose(got, np_distortion_packed(w, ts, te, rs), rtol=2e-5, atol=1e-7)


# ---------------------------------------------------------------------------------------------------------------
# Equal to the [R, S] ops on uniformly packed rays


def _uniform(R, S, C, seed):
    rng = np.random.default_rng(seed)
    d = rng.uniform(0.0, 3.0, (R, S)).astype(np.float32)
    c = rng.uniform(0.0, 1.0, (R, S, C)).astype(np.float32)
    t = (2.0 + np.cumsum(rng.uniform(0.05, 0.3, (R, S + 1)), axis=1)).astype(np.float32)
    rs = (np.arange(R + 1) * S).astype(np.int32)
    return d, c, t, rs


@pytest.mark.parametrize("bg", ["none", "shared", "per_ray"])
@pytest.mark.parametrize("thr", [0.0, 0.02])
def test_equals_volume_render_on_uniform_rays(bg, thr):
    R, S, C = 29, 24, 3
    d, c, t, rs = _uniform(R, S, C, seed=7)
    rng = np.random.default_rng(8)
    b = {"none": None, "shared": rng.uniform(size=C), "per_ray": rng.uniform(size=(R, C))}[bg]
    b = None if b is None else tf.constant(b, tf.float32)
    up = [tf.constant(rng.normal(size=s), tf.float32) for s in ((R, C), (R,), (R,), (R, S))]
    dd, cc, tt = tf.constant(d), tf.constant(c), tf.constant(t)
    watch = [dd, cc, tt] + ([] if b is None else [b])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(watch)
        ref = tfmo.volume_render(dd, cc, tt, b, termination_threshold=thr)
        ts, te = tf.reshape(tt[:, :-1], [-1]), tf.reshape(tt[:, 1:], [-1])
        got = tfmo.volume_render_packed(tf.reshape(dd, [-1]), tf.reshape(cc, [-1, C]), ts, te, rs, b,
                                        termination_threshold=thr)
        loss_ref = sum(tf.reduce_sum(o * u) for o, u in zip(ref, up))
        loss_got = sum(tf.reduce_sum(o * tf.reshape(u, o.shape)) for o, u in zip(got, up))
        dl_ref = tfmo.distortion_loss(ref.weights, tt)
        dl_got = tfmo.distortion_loss_packed(tf.reshape(ref.weights, [-1]), ts, te, rs)
    for name, g, r in zip(OUT_NAMES, got, ref):
        np.testing.assert_allclose(g.numpy().reshape(r.shape), r.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_array_equal(dl_got.numpy(), dl_ref.numpy())  # same scalar functions, same order
    g_ref = tape.gradient(loss_ref, watch)
    g_got = tape.gradient(loss_got, watch)  # through the reshapes: t gets g_ts + g_te at shared edges
    for name, g, r in zip(("densities", "colors", "t", "background"), g_got, g_ref):
        scale = max(1.0, np.abs(r.numpy()).max())
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-4, atol=1e-5 * scale, err_msg=name)
    w_ref = tf.constant(ref.weights.numpy())
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([w_ref, tt])
        a = tfmo.distortion_loss(w_ref, tt)
        p = tfmo.distortion_loss_packed(tf.reshape(w_ref, [-1]), tf.reshape(tt[:, :-1], [-1]),
                                        tf.reshape(tt[:, 1:], [-1]), rs)
    for g, r in zip(tape.gradient(p, [w_ref, tt]), tape.gradient(a, [w_ref, tt])):
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-4, atol=1e-5 * max(1.0, np.abs(r.numpy()).max()))


# ---------------------------------------------------------------------------------------------------------------
# Gradients


def _vrp_grads(fn, inputs, thr, up, dtype):
    d, c, ts, te, rs, b = inputs
    xs = [tf.constant(x, dtype) for x in (d, c, ts, te)]
    bg = None if b is None else tf.constant(b, dtype)
    watch = xs + ([] if bg is None else [bg])
    with tf.GradientTape() as tape:
        tape.watch(watch)
        out = fn(*xs, rs, bg, termination_threshold=thr)
        loss = sum(tf.reduce_sum(o * tf.constant(u, dtype)) for o, u in zip(out, up))
    return [g.numpy() for g in tape.gradient(loss, watch)]


@pytest.mark.parametrize("bg", ["none", "shared", "per_ray"])
@pytest.mark.parametrize("thr", [0.0, 0.02])
@pytest.mark.parametrize("C", [1, 3])
def test_volume_render_packed_gradients_match_float64_autodiff(bg, thr, C):
    rng = np.random.default_rng(C + int(100 * thr))
    counts = random_counts(rng, 19, 0, 33)
    counts[2] = 0
    inputs = make_packed(counts, C, seed=9, bg=bg)
    N, R = len(inputs[0]), 19
    up = [rng.normal(size=s) for s in ((R, C), (R,), (R,), (N,))]
    got = _vrp_grads(tfmo.volume_render_packed, inputs, thr, up, tf.float32)
    want = _vrp_grads(tfmo.volume_render_packed_tf, inputs, thr, up, tf.float64)
    for name, g, w in zip(("densities", "colors", "t_starts", "t_ends", "background"), got, want):
        assert g.shape == w.shape, name
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5 * max(1.0, np.abs(w).max()), err_msg=name)


def _jacobians(f32, f64, x):
    """Our kernel's Jacobian (float32) and float64 finite differences of the plain-TF version."""
    theoretical, _ = tf.test.compute_gradient(f32, [tf.constant(x, tf.float32)], delta=1e-3)
    _, numerical = tf.test.compute_gradient(f64, [tf.constant(x, tf.float64)], delta=1e-6)
    return theoretical[0], numerical[0]


@pytest.mark.parametrize("wrt", ["densities", "colors", "t_starts", "t_ends", "background"])
def test_volume_render_packed_compute_gradient(wrt):
    inputs = list(make_packed([3, 0, 4, 2], 3, seed=1, dens_scale=1.5, bg="per_ray", gaps="always"))
    i = ["densities", "colors", "t_starts", "t_ends", None, "background"].index(wrt)

    def flat(fn, dtype):
        def f(x):
            a = [tf.constant(v, dtype) if j != 4 else v for j, v in enumerate(inputs)]
            a[i] = x
            out = fn(*a[:5], a[5])
            return tf.concat([tf.reshape(out.color, [-1]), out.depth, out.opacity, out.weights], 0)
        return f

    th, num = _jacobians(flat(tfmo.volume_render_packed, tf.float32), flat(tfmo.volume_render_packed_tf, tf.float64),
                         inputs[i])
    assert np.abs(num).max() > 0
    assert np.abs(th - num).max() < 2e-3, np.abs(th - num).max()


@pytest.mark.parametrize("wrt", ["weights", "t_starts", "t_ends"])
def test_distortion_loss_packed_compute_gradient(wrt):
    rng = np.random.default_rng(2)
    _, _, ts, te, rs, _ = make_packed([4, 0, 5, 1], 1, seed=3, gaps="always")
    w = rng.uniform(0.05, 0.4, len(ts)).astype(np.float32)
    inputs = {"weights": w, "t_starts": ts, "t_ends": te}

    def fn(op, dtype):
        def f(x):
            a = {k: tf.constant(v, dtype) for k, v in inputs.items()}
            a[wrt] = x
            return op(a["weights"], a["t_starts"], a["t_ends"], rs)
        return f

    th, num = _jacobians(fn(tfmo.distortion_loss_packed, tf.float32), fn(tfmo.distortion_loss_packed_tf, tf.float64),
                         inputs[wrt])
    assert np.abs(num).max() > 0
    assert np.abs(th - num).max() < 2e-3, np.abs(th - num).max()


def test_shared_background_gradient_is_sum_over_rays():
    d, c, ts, te, rs, b = make_packed([2, 0, 5, 3], 3, seed=4)
    bg = tf.constant(b)
    with tf.GradientTape() as tape:
        tape.watch(bg)
        out = tfmo.volume_render_packed(d, c, ts, te, rs, bg)
    g = tape.gradient(out.color, bg).numpy()
    np.testing.assert_allclose(g, np.full(3, np.sum(1.0 - out.opacity.numpy())), rtol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# Determinism


def test_results_do_not_depend_on_thread_count():
    rng = np.random.default_rng(11)
    d, c, ts, te, rs, b = make_packed(random_counts(rng, 3000, 0, 40), 3, seed=11, bg="per_ray")
    up = [rng.normal(size=s).astype(np.float32) for s in ((3000, 3), (3000,), (3000,), (len(d),))]

    def run():
        xs = [tf.constant(x) for x in (d, c, ts, te, b)]
        with tf.GradientTape() as tape:
            tape.watch(xs)
            out = tfmo.volume_render_packed(*xs[:4], rs, xs[4], termination_threshold=0.01)
            dl = tfmo.distortion_loss_packed(out.weights, xs[2], xs[3], rs)
            loss = sum(tf.reduce_sum(o * u) for o, u in zip(out, up)) + tf.reduce_sum(dl)
        return [o.numpy() for o in out] + [dl.numpy()] + [g.numpy() for g in tape.gradient(loss, xs)]

    results = []
    for n in (1, 2, 3):
        with tfmo.num_threads(n):
            results.append(run())
    for other in results[1:]:
        for x, y in zip(results[0], other):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("C,thr", [(3, 0.0), (2, 1e-3)])
def test_chunk_edges(C, thr):
    """The CPU kernels run a range of rays in chunks of at most 2048 samples and 2048 rays: rays longer than a chunk,
    runs of more than 2048 empty rays, rays of 1..30 samples around them. Values and gradients against the float64
    references, and the same bits with 1 and 3 threads."""
    rng = np.random.default_rng(17 + C)
    counts = np.concatenate([random_counts(rng, 200, 0, 12), np.zeros(2500, np.int64), [3000],
                             random_counts(rng, 200, 1, 30), np.zeros(2100, np.int64), [1, 2050, 0]])
    inputs = make_packed(counts, C, seed=17, dens_scale=0.03, bg="per_ray")
    R, N = len(counts), len(inputs[0])
    assert_outputs_close(tfmo.volume_render_packed(*inputs, termination_threshold=thr),
                         np_volume_render_packed(*inputs, thr), rtol=5e-5, atol=5e-6)
    up = [rng.normal(size=s) for s in ((R, C), (R,), (R,), (N,))]
    runs = []
    for n in (1, 3):
        with tfmo.num_threads(n):
            runs.append(_vrp_grads(tfmo.volume_render_packed, inputs, thr, up, tf.float32))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    want = _vrp_grads(tfmo.volume_render_packed_tf, inputs, thr, up, tf.float64)
    for name, g, w in zip(("densities", "colors", "t_starts", "t_ends", "background"), runs[0], want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=5e-5 * max(1.0, np.abs(w).max()), err_msg=name)


def test_lowest_bad_sample_is_named_whatever_the_thread_count():
    d, c, ts, te, rs, b = make_packed(random_counts(np.random.default_rng(3), 6000, 0, 20), 3, seed=3)
    d[[len(d) - 5, len(d) // 2]] = -1.0  # in different ranges
    for n in (1, 2, 3):
        with tfmo.num_threads(n), pytest.raises(tf.errors.InvalidArgumentError,
                                               match=rf"densities\[{len(d) // 2}\] = -1"):
            tfmo.volume_render_packed(d, c, ts, te, rs, b)


# ---------------------------------------------------------------------------------------------------------------
# Invalid input


def _valid():
    return make_packed([2, 3, 0, 4], 3, seed=12, bg="shared")


def _bad_input_cases():
    d, c, ts, te, rs, b = _valid()
    cases = []

    def case(name, pattern, dl=True, **changes):
        """dl: the case applies to the distortion-loss ops too (it changes row_splits or t)."""
        a = dict(d=d, c=c, ts=ts, te=te, rs=rs, b=b)
        a.update(changes)
        cases.append(pytest.param(a, pattern, dl and not ({"d", "c", "b"} & set(changes)), id=name))

    case("splits_not_from_0", r"row_splits\[0\] must be 0, got 1", rs=np.array([1, 2, 5, 5, 9], np.int32))
    case("splits_decreasing", r"non-decreasing, got row_splits\[2\] = 5 > row_splits\[3\] = 4",
         rs=np.array([0, 2, 5, 4, 9], np.int32))
    case("splits_last_not_n", r"row_splits\[4\] must equal the number of samples N = 9, got 8",
         rs=np.array([0, 2, 5, 5, 8], np.int32))
    case("splits_past_n", r"must equal the number of samples N = 9, got 10", rs=np.array([0, 2, 5, 5, 10], np.int32))
    case("splits_negative", r"non-decreasing, got row_splits\[0\] = 0 > row_splits\[1\] = -1",
         rs=np.array([0, -1, 5, 5, 9], np.int32))
    case("splits_rank_2", r"row_splits must have shape \[R \+ 1\]", rs=rs.reshape(1, -1))
    case("splits_empty", r"row_splits must have shape \[R \+ 1\]", rs=np.zeros(0, np.int32))
    case("samples_without_rays", r"row_splits\[0\] must equal the number of samples N = 9, got 0",
         rs=np.zeros(1, np.int32))
    bad = te.copy()
    bad[3] = ts[3] - 0.01
    case("start_after_end", r"t_starts\[3\] = .* > t_ends\[3\] = .* \(ray 1\)", te=bad)
    bad = ts.copy()
    bad[4] = te[3] - 0.01
    case("overlap", r"sorted and non-overlapping, got t_ends\[3\] = .* > t_starts\[4\] = .* \(ray 1\)", ts=bad)
    bad_ts, bad_te = ts.copy(), te.copy()
    bad_ts[[5, 6]], bad_te[[5, 6]] = ts[[6, 5]], te[[6, 5]]
    case("unsorted", r"sorted and non-overlapping, got t_ends\[5\] = .* > t_starts\[6\]", ts=bad_ts, te=bad_te)
    bad = d.copy()
    bad[7] = -0.5
    case("negative_density", r"densities must be >= 0, got densities\[7\] = -0.5 \(ray 3\)", d=bad)
    case("colors_wrong_n", r"colors must have shape \[samples, channels\] = \[9, C\]", c=c[:8])
    case("colors_rank_3", r"colors must have shape", c=c[:, :, None])
    case("colors_no_channels", r"colors must have shape", c=np.zeros((9, 0), np.float32))
    case("t_starts_wrong_n", r"t_starts must have shape \[9\]", ts=ts[:8])
    case("t_ends_rank_2", r"t_ends must have shape \[9\]", te=te[None])
    case("densities_rank_2", r"densities must have rank 1", d=d[None])
    case("background_wrong_c", r"background must have shape \[C\] = \[3\], \[rays, C\] = \[4, 3\]", b=b[:2])
    case("background_wrong_rays", r"background must have shape", b=np.zeros((3, 3), np.float32))
    case("background_rank_3", r"background must have shape", b=np.zeros((4, 3, 1), np.float32))
    return cases


@pytest.mark.parametrize("a,pattern,dl", _bad_input_cases())
def test_kernels_reject_bad_input(a, pattern, dl):
    """The raw ops (no Python wrapper checks): forward and gradient kernels of both ops where the input applies."""
    raw = ops()
    bg = tf.zeros([0]) if a["b"] is None else a["b"]
    with pytest.raises(tf.errors.InvalidArgumentError, match="volume_render_packed: .*" + pattern):
        raw.volume_render_packed(a["d"], a["c"], a["ts"], a["te"], a["rs"], bg)
    r = max(np.asarray(a["rs"]).reshape(-1).shape[0] - 1, 0)
    n = np.asarray(a["d"]).reshape(-1).shape[0]
    cdim = np.asarray(a["c"]).shape[-1] if np.asarray(a["c"]).ndim == 2 else 3
    ups = [np.zeros((r, cdim), np.float32), np.zeros(r, np.float32), np.zeros(r, np.float32), np.zeros(n, np.float32)]
    with pytest.raises(tf.errors.InvalidArgumentError, match="volume_render_packed_grad: .*" + pattern):
        raw.volume_render_packed_grad(a["d"], a["c"], a["ts"], a["te"], a["rs"], bg, *ups)
    if dl:
        w = np.abs(_valid()[0])
        with pytest.raises(tf.errors.InvalidArgumentError, match="distortion_loss_packed: .*" + pattern):
            raw.distortion_loss_packed(w, a["ts"], a["te"], a["rs"])
        with pytest.raises(tf.errors.InvalidArgumentError, match="distortion_loss_packed_grad: .*" + pattern):
            raw.distortion_loss_packed_grad(w, a["ts"], a["te"], a["rs"], np.zeros(r, np.float32))


def test_gradient_kernels_check_upstream_shapes():
    d, c, ts, te, rs, b = _valid()
    raw = ops()
    ups = [np.zeros((4, 3), np.float32), np.zeros(4, np.float32), np.zeros(4, np.float32), np.zeros(9, np.float32)]
    for i, bad in enumerate([np.zeros((4, 2), np.float32), np.zeros(3, np.float32), np.zeros(5, np.float32),
                             np.zeros(8, np.float32)]):
        u = list(ups)
        u[i] = bad
        name = ("grad_color", "grad_depth", "grad_opacity", "grad_weights")[i]
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"{name} must have shape"):
            raw.volume_render_packed_grad(d, c, ts, te, rs, b, *u)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"grad_loss must have shape \[4\]"):
        raw.distortion_loss_packed_grad(d, ts, te, rs, np.zeros(3, np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"volume_render_packed: termination_threshold must be in \[0, 1\], got 1.5"):
        raw.volume_render_packed(d, c, ts, te, rs, b, termination_threshold=1.5)


def test_nan_inputs_propagate_like_volume_render():
    d, c, ts, te, rs, b = _valid()
    d = d.copy()
    d[3] = np.nan  # ray 1
    out = tfmo.volume_render_packed(d, c, ts, te, rs, b)
    assert np.isnan(out.opacity.numpy()[1]) and np.isfinite(out.opacity.numpy()[[0, 2, 3]]).all()
    ts2 = ts.copy()
    ts2[0] = np.nan  # NaN is not "unsorted": it passes the checks and propagates
    out = tfmo.volume_render_packed(d, c, ts2, te, rs, b)
    assert np.isnan(out.depth.numpy()[0])


def test_wrapper_rejects_bad_static_input():
    d, c, ts, te, rs, b = _valid()
    f = tfmo.volume_render_packed
    with pytest.raises(ValueError, match="densities must have rank 1"):
        f(d[None], c, ts, te, rs, b)
    with pytest.raises(ValueError, match=r"colors.shape\[0\] \(samples\) is 8, expected 9"):
        f(d, c[:8], ts, te, rs, b)
    with pytest.raises(ValueError, match=r"t_ends.shape\[0\]"):
        f(d, c, ts, te[:8], rs, b)
    with pytest.raises(ValueError, match=r"background.shape\[0\] \(rays\) is 3, expected 4"):
        f(d, c, ts, te, rs, np.zeros((3, 3), np.float32))
    with pytest.raises(ValueError, match=r"background.shape\[0\] \(channels\)"):
        f(d, c, ts, te, rs, b[:2])
    with pytest.raises(ValueError, match="row_splits must be int32"):
        f(d, c, ts, te, rs.astype(np.float32), b)
    with pytest.raises(ValueError, match="row_splits needs at least one entry"):
        f(d, c, ts, te, np.zeros(0, np.int32), b)
    with pytest.raises(ValueError, match="row_splits must have rank 1"):
        f(d, c, ts, te, rs[None], b)
    with pytest.raises(ValueError, match="termination_threshold"):
        f(d, c, ts, te, rs, b, termination_threshold=-1)
    with pytest.raises(ValueError, match="must be float32, got float64"):
        f(tf.constant(d, tf.float64), c, ts, te, rs, b)
    with pytest.raises(ValueError, match=r"t_starts.shape\[0\]"):
        tfmo.distortion_loss_packed(d, ts[:3], te, rs)
    # int64 row_splits (tf.RaggedTensor's default) are accepted
    np.testing.assert_array_equal(f(d, c, ts, te, tf.constant(rs, tf.int64), b).color.numpy(),
                                  f(d, c, ts, te, rs, b).color.numpy())


# ---------------------------------------------------------------------------------------------------------------
# Graph mode


def test_tf_function_with_unknown_sizes_does_not_retrace():
    spec = [tf.TensorSpec([None], tf.float32), tf.TensorSpec([None, 3], tf.float32),
            tf.TensorSpec([None], tf.float32), tf.TensorSpec([None], tf.float32), tf.TensorSpec([None], tf.int32),
            tf.TensorSpec([3], tf.float32)]
    traces = []

    @tf.function(input_signature=spec)
    def step(d, c, ts, te, rs, bg):
        traces.append(1)
        with tf.GradientTape() as tape:
            tape.watch([d, c, ts, te, bg])
            out = tfmo.volume_render_packed(d, c, ts, te, rs, bg, termination_threshold=0.01)
            assert out.color.shape.as_list() == [None, 3] and out.weights.shape.as_list() == [None]
            loss = tf.reduce_sum(out.color) + tf.reduce_sum(tfmo.distortion_loss_packed(out.weights, ts, te, rs))
        return (out, loss) + tuple(tape.gradient(loss, [d, c, ts, te, bg]))

    for seed, counts in enumerate(([3, 0, 5], [1, 2, 3, 4, 0, 7])):
        a = make_packed(counts, 3, seed=seed)
        out, loss, *grads = step(*a)
        assert_outputs_close(out, np_volume_render_packed(*a, 0.01))
        assert all(np.isfinite(g.numpy()).all() for g in grads)
    assert len(traces) == 1


def test_static_shapes_are_inferred():
    @tf.function
    def f():
        out = ops().volume_render_packed(tf.zeros([10]), tf.zeros([10, 4]), tf.zeros([10]), tf.zeros([10]),
                                         tf.constant([0, 4, 10]), tf.zeros([0]))
        g = ops().distortion_loss_packed_grad(tf.zeros([10]), tf.zeros([10]), tf.zeros([10]),
                                              tf.constant([0, 4, 10]), tf.zeros([2]))
        assert out[0].shape.as_list() == [2, 4] and out[1].shape.as_list() == [2]
        assert out[3].shape.as_list() == [10] and g[2].shape.as_list() == [10]
        return out

    f.get_concrete_function()


def test_graph_mode_shape_function_rejects_bad_rank():
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
        def f(x):
            return ops().distortion_loss_packed(x, tf.zeros([3]), tf.zeros([3]), tf.constant([0, 3]))
        f.get_concrete_function()
