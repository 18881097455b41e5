"""metal_kernels/render.metal (VolumeRender and DistortionLoss), executed on the CPU through the MSL emulation
(csrc/msl_emu) under ASan+UBSan, must match the CPU ops (forward and backward) on random inputs.

Tolerances, not bit equality: the CPU kernels use their own vectorised exp, the emulated kernels libm's (and a
GPU its fast-math exp). What this cannot show (csrc/msl_emu/README.md, "Limits"): GPU rounding, address-space
mistakes. The kernels are one SIMD group per ray (SIMD-group scans, no threadgroup memory): rays are independent,
and one test runs them shuffled. Needs clang++-16 (skips without it; fails under TFMO_REQUIRE_MAC_CHECKS=1).
"""

import numpy as np
import pytest

BG_MODES = {"none": 0, "shared": 1, "per_ray": 2}


@pytest.fixture(scope="module")
def vr_driver(msl_emu):
    return msl_emu.build("tests/msl_emu/volume_render_driver.cc")


@pytest.fixture(scope="module")
def dl_driver(msl_emu):
    return msl_emu.build("tests/msl_emu/distortion_loss_driver.cc")


@pytest.fixture(scope="module")
def raw_ops():
    import tensorflow as tf

    import tf_metal_ops

    return tf.load_op_library(tf_metal_ops.library_path())


def make_case(R, S, C, bg, seed, dens_scale=3.0):
    rng = np.random.default_rng(seed)
    d = rng.uniform(0, dens_scale, (R, S)).astype(np.float32)
    c = rng.uniform(0, 1, (R, S, C)).astype(np.float32)
    t = (1.0 + np.cumsum(rng.uniform(0.0, 0.3, (R, S + 1)), axis=1)).astype(np.float32)
    b = {"none": np.zeros(0, np.float32), "shared": rng.uniform(size=C).astype(np.float32),
         "per_ray": rng.uniform(size=(R, C)).astype(np.float32)}[bg]
    ups = (rng.normal(size=(R, C)).astype(np.float32), rng.normal(size=R).astype(np.float32),
           rng.normal(size=R).astype(np.float32), rng.normal(size=(R, S)).astype(np.float32))
    return d, c, t, b, ups


def run_vr(msl_emu, exe, d, c, t, b, thr, bg, ups=None, env=None, tg=64):
    R, S = d.shape
    C = c.shape[2]
    inputs = {"densities": d.ravel(), "colors": c.ravel(), "t": t.ravel(), "background": b.ravel()}
    scalars = {"R": R, "S": S, "C": C, "bg_mode": BG_MODES[bg], "threshold": repr(float(thr)), "tg": tg}
    if ups is None:
        names = {"color": (R, C), "depth": (R,), "opacity": (R,), "weights": (R, S)}
        scalars["kernel"] = "forward"
    else:
        names = {"grad_densities": (R, S), "grad_colors": (R, S, C), "grad_t": (R, S + 1),
                 "grad_background": (R, C)}
        scalars["kernel"] = "backward"
        for k, v in zip(("grad_color", "grad_depth", "grad_opacity", "grad_weights"), ups):
            inputs[k] = v.ravel()
    res = msl_emu.run(exe, inputs=inputs, outputs={k: np.float32 for k in names}, scalars=scalars, env=env)
    return [res.outputs[k].reshape(shape) for k, shape in names.items()]


def assert_close(got, want, what):
    for i, (g, w) in enumerate(zip(got, want)):
        w = np.asarray(w)
        scale = max(1.0, float(np.abs(w).max())) if w.size else 1.0
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5 * scale, err_msg=f"{what}: output {i}")


CASES = [
    # R, S, C, bg, threshold
    (1, 1, 3, "shared", 0.0),
    (37, 1, 1, "none", 0.0),
    (65, 16, 3, "per_ray", 0.0),
    (65, 16, 3, "per_ray", 0.05),
    (50, 48, 3, "shared", 0.01),
    (20, 24, 5, "none", 0.3),  # C > 4: the kernel accumulates in the output row
    (9, 7, 1, "per_ray", 1.0),
    (7, 0, 3, "shared", 0.0),  # S == 0: empty densities/colors/weights, bound as t
]


@pytest.mark.parametrize("R,S,C,bg,thr", CASES)
def test_volume_render_emulated_matches_cpu(msl_emu, vr_driver, raw_ops, R, S, C, bg, thr):
    d, c, t, b, ups = make_case(R, S, C, bg, seed=R * 100 + S * 10 + C)
    want_fwd = [x.numpy() for x in raw_ops.volume_render(d, c, t, b, termination_threshold=thr)]
    got_fwd = run_vr(msl_emu, vr_driver, d, c, t, b, thr, bg)
    assert_close(got_fwd, want_fwd, "forward")
    want_bwd = [x.numpy() for x in raw_ops.volume_render_grad(d, c, t, b, *ups, termination_threshold=thr)]
    got_bwd = run_vr(msl_emu, vr_driver, d, c, t, b, thr, bg, ups=ups)
    assert_close(got_bwd, want_bwd, "backward")


def test_volume_render_emulated_extremes(msl_emu, vr_driver, raw_ops):
    d, c, t, b, ups = make_case(24, 32, 3, "shared", seed=5)
    d[:8] = 0.0  # transparent rays
    d[8:16, 4:] = 1e30  # opaque wall
    d[16:, :] = 1e-7  # almost transparent: alpha by the series
    for thr in (0.0, 0.01):
        want = [x.numpy() for x in raw_ops.volume_render(d, c, t, b, termination_threshold=thr)]
        got = run_vr(msl_emu, vr_driver, d, c, t, b, thr, "shared")
        assert all(np.isfinite(g).all() for g in got)
        assert_close(got, want, "forward")
        want = [x.numpy() for x in raw_ops.volume_render_grad(d, c, t, b, *ups, termination_threshold=thr)]
        got = run_vr(msl_emu, vr_driver, d, c, t, b, thr, "shared", ups=ups)
        assert all(np.isfinite(g).all() for g in got)
        assert_close(got, want, "backward")


def test_volume_render_emulated_marks_invalid_rays_nan(msl_emu, vr_driver):
    d, c, t, b, ups = make_case(6, 5, 3, "per_ray", seed=2)
    d[1, 2] = -1.0  # negative density
    t[4, 3] = t[4, 2] - 0.5  # t decreasing
    fwd = run_vr(msl_emu, vr_driver, d, c, t, b, 0.0, "per_ray")
    bwd = run_vr(msl_emu, vr_driver, d, c, t, b, 0.0, "per_ray", ups=ups)
    for out in fwd + bwd:
        bad = np.isnan(out.reshape(6, -1))
        assert bad[[1, 4]].all() and not bad[[0, 2, 3, 5]].any()


def test_volume_render_emulated_empty_batch_and_order(msl_emu, vr_driver, raw_ops):
    d, c, t, b, ups = make_case(0, 8, 3, "none", seed=0)
    assert [o.shape for o in run_vr(msl_emu, vr_driver, d, c, t, b, 0.0, "none")] == [(0, 3), (0,), (0,), (0, 8)]
    d, c, t, b, ups = make_case(100, 12, 3, "shared", seed=8)
    want = [x.numpy() for x in raw_ops.volume_render_grad(d, c, t, b, *ups)]
    got = run_vr(msl_emu, vr_driver, d, c, t, b, 0.0, "shared", ups=ups, tg=32,
                 env={"MSL_EMU_ORDER": "shuffle", "MSL_EMU_SEED": "3", "MSL_EMU_WORKERS": "2"})
    assert_close(got, want, "backward (shuffled, 2 workers)")


def run_dl(msl_emu, exe, w, t, g=None, env=None):
    R, S = w.shape
    inputs = {"weights": w.ravel(), "t": t.ravel()}
    scalars = {"R": R, "S": S, "kernel": "forward" if g is None else "backward"}
    if g is None:
        names = {"loss": (R,)}
    else:
        inputs["grad_loss"] = g
        names = {"grad_weights": (R, S), "grad_t": (R, S + 1)}
    res = msl_emu.run(exe, inputs=inputs, outputs={k: np.float32 for k in names}, scalars=scalars, env=env)
    return [res.outputs[k].reshape(shape) for k, shape in names.items()]


@pytest.mark.parametrize("R,S", [(1, 1), (33, 2), (65, 40), (5, 0), (0, 4)])
def test_distortion_loss_emulated_matches_cpu(msl_emu, dl_driver, raw_ops, R, S):
    rng = np.random.default_rng(R + S)
    w = rng.uniform(0, 1, (R, S)).astype(np.float32)
    t = np.cumsum(rng.uniform(0, 0.5, (R, S + 1)), axis=1).astype(np.float32)
    g = rng.normal(size=R).astype(np.float32)
    assert_close(run_dl(msl_emu, dl_driver, w, t), [raw_ops.distortion_loss(w, t).numpy()], "forward")
    assert_close(run_dl(msl_emu, dl_driver, w, t, g),
                 [x.numpy() for x in raw_ops.distortion_loss_grad(w, t, g)], "backward")


def test_distortion_loss_emulated_marks_unsorted_rays_nan(msl_emu, dl_driver):
    rng = np.random.default_rng(0)
    w = rng.uniform(0, 1, (4, 6)).astype(np.float32)
    t = np.cumsum(rng.uniform(0.1, 0.5, (4, 7)), axis=1).astype(np.float32)
    t[2, 5] = t[2, 4] - 0.01
    g = np.ones(4, np.float32)
    (loss,) = run_dl(msl_emu, dl_driver, w, t)
    assert np.isnan(loss[2]) and np.isfinite(loss[[0, 1, 3]]).all()
    for out in run_dl(msl_emu, dl_driver, w, t, g):
        assert np.isnan(out[2]).all() and np.isfinite(out[[0, 1, 3]]).all()
