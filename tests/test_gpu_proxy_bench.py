"""The GPU proxy benchmark (bench/gpu_proxy.py) without a GPU: its NumPy float64 references, which decide whether a
kernel's output on the device is right before it is timed, agree with the package's CPU ops on the benchmark's own
inputs (small sizes); the packed layouts and level tables it builds are the ones the ops accept; and a wrong output
fails its check. Its argument packing against the PTX entries is tests/test_gpu_proxy.py's dry run."""

import collections
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tf_metal_ops
from tf_metal_ops.hash_grid import HashGridConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import gpu_proxy_cases as cases  # noqa: E402


def by_name(case_list):
    return {c.name: c for c in case_list}


def assert_within(got, ref, tol, what):
    ok, ratio = cases.within(got, ref, tol)
    assert ok, f"{what}: max |error| / tolerance = {ratio:.3g}"


def assert_expected(got, expected, what):
    """expected: a Case.reference() value, (ref, tol) or (ref, tol, index into got)."""
    ref, tol, *index = expected
    ok, ratio = cases.within(got[index[0]] if index else got, ref, tol)
    assert ok, f"{what}: max |error| / tolerance = {ratio:.3g}"


@pytest.fixture(scope="module")
def hash_grid():
    kw = dict(n=2048, n_levels=8, F=2, log2_T=12, base=16, per_level_scale=1.3819)
    cs = by_name(cases.hash_grid_cases(**kw))
    cfg = HashGridConfig(3, n_levels=8, n_features_per_level=2, log2_hashmap_size=12, base_resolution=16,
                         per_level_scale=1.3819, grid_type="hash", interpolation="linear")
    return cs, cfg, cs["hash_grid_encode_float32"].arrays


def test_level_table_is_the_packages(hash_grid):
    _, cfg, a = hash_grid
    levels = a["levels"]
    assert list(levels["offset"]) == list(cfg.offsets)[:cfg.n_levels]
    assert list(levels["size"]) == list(cfg.level_sizes) and list(levels["resolution"]) == list(cfg.resolutions)
    np.testing.assert_array_equal(levels["scale"], np.float32(cfg.scales))
    assert list(levels["mode"] == 0) == list(cfg.hashed_levels) and any(levels["mode"] == 0) and any(levels["mode"] != 0)
    assert a["params"].shape == cfg.params_shape


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_hash_grid_references_match_the_cpu_ops(hash_grid, dtype):
    cs, cfg, a = hash_grid
    half = dtype == "float16"
    x = tf.constant(a["x"])
    p = tf.constant(a["params16"] if half else a["params"])
    dy = tf.constant(a["dy16"] if half else a["dy"])
    ddx = tf.constant(a["ddx"])
    with tf.GradientTape(persistent=True) as outer:
        outer.watch([x, p, dy])
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([x, p])
            out = tf_metal_ops.hash_grid_encode(x, p, **cfg.op_kwargs())
            y = tf.reduce_sum(tf.cast(out, tf.float32) * tf.cast(dy, tf.float32))
        gx = tape.gradient(y, x)
        phi = tf.reduce_sum(gx * ddx)
    gp = tape.gradient(y, p)
    g2 = outer.gradient(phi, [dy, p, x])
    exp = cs[f"hash_grid_encode_{dtype}"].reference()
    name = "out16" if half else "out"
    assert_expected(out.numpy(), exp[name], f"encode {dtype}")
    gp_case = cs["hash_grid_grad_params_float16 (float32 accumulation)" if half else
                 "hash_grid_grad_params_float32, native float atomics (MSL 3.0)"]
    ref, tol = gp_case.reference()["acc"]
    assert_within(gp.numpy().reshape(-1), ref, tol * (100 if half else 1), f"param gradient {dtype}")
    if half:
        return  # the float16 op rounds its gradients to half; the float32 checks below cover the math
    assert_expected(gx.numpy(), cs["hash_grid_grad_positions_float32"].reference()["dx"], "position gradient")
    second = cs["hash_grid_grad2_points_float32"].reference()
    assert_expected(g2[0].numpy(), second["ddy"], "second order d/d(dy)")
    assert_expected(g2[2].numpy(), second["dx2"], "second order d/dx")
    ref, tol = cs["hash_grid_grad2_params_float32"].reference()["acc"]
    assert_within(g2[1].numpy().reshape(-1), ref, tol, "second order d/dparams")
    # The CAS case is checked against the same reference, and a wrong accumulator fails it.
    cas = cs["hash_grid_grad_params_float32, CAS loop (MSL 2.4)"].reference()["acc"]
    assert not cases.within(gp.numpy().reshape(-1) * 1.001 + 1e-3, *cas)[0]


@pytest.mark.parametrize("packed", [False, True])
def test_render_references_match_the_cpu_ops(packed):
    cs = cases.render_cases(R=32, S=16, C=3, packed=packed)
    a = cs[0].arrays
    prefix = "packed_" if packed else ""
    sigma, colors, bg = (tf.constant(a[k]) for k in ("sigma", "colors", "bg"))
    if packed:
        ts, te, rs = tf.constant(a["ts"]), tf.constant(a["te"]), tf.constant(a["splits"].astype(np.int64))
        assert np.any(np.diff(a["splits"]) == 0) and np.any(a["ts"][1:] > a["te"][:-1])  # empty rays and gaps
        render = lambda s, c, b: tf_metal_ops.volume_render_packed(s, c, ts, te, rs, b)  # noqa: E731
        dloss = lambda w: tf_metal_ops.distortion_loss_packed(w, ts, te, rs)  # noqa: E731
        tvars = [ts, te]
    else:
        t = tf.constant(a["t"])
        render = lambda s, c, b: tf_metal_ops.volume_render(tf.reshape(s, (32, 16)), tf.reshape(c, (32, 16, 3)), t, b)  # noqa: E731,E501
        dloss = lambda w: tf_metal_ops.distortion_loss(tf.reshape(w, (32, 16)), t)  # noqa: E731
        tvars = [t]
    w_in = tf.constant(a["w_in"])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([sigma, colors, bg, w_in, *tvars])
        color, depth, opacity, weights = render(sigma, colors, bg)
        y = (tf.reduce_sum(color * a["gC"]) + tf.reduce_sum(depth * a["gD"]) + tf.reduce_sum(opacity * a["gO"]) +
             tf.reduce_sum(tf.reshape(weights, [-1]) * a["gW"]))
        loss = dloss(w_in)
        z = tf.reduce_sum(loss * a["gl"])
    fwd = cs[0].reference()
    for k, v in (("color", color), ("depth", depth), ("opacity", opacity), ("weights", weights)):
        assert_within(np.reshape(v.numpy(), fwd[k][0].shape), *fwd[k], f"{prefix}forward {k}")
    back = cs[1].reference()
    g = tape.gradient(y, [sigma, colors, *tvars])
    assert_within(g[0].numpy(), *back["g_sigma"], f"{prefix}backward densities")
    assert_within(g[1].numpy(), *back["g_colors"], f"{prefix}backward colors")
    if packed:
        assert_within(g[2].numpy(), *back["g_ts"], "packed backward t_starts")
        assert_within(g[3].numpy(), *back["g_te"], "packed backward t_ends")
    else:
        assert_within(g[2].numpy(), *back["g_t"], "backward t")
    gbg = tape.gradient(y, bg).numpy()
    assert_within(gbg, back["g_bg"][0].sum(axis=0), np.abs(back["g_bg"][0]).sum(axis=0) * 1e-4 + 1e-6, "background")
    assert_within(loss.numpy(), *cs[2].reference()["loss"], f"{prefix}distortion loss")
    dl = cs[3].reference()
    gd = tape.gradient(z, [w_in, *tvars])
    assert_within(gd[0].numpy(), *dl["g_w"], f"{prefix}distortion grad weights")
    if packed:
        assert_within(gd[1].numpy(), *dl["g_ts"], "packed distortion grad t_starts")
        assert_within(gd[2].numpy(), *dl["g_te"], "packed distortion grad t_ends")
    else:
        assert_within(gd[1].numpy(), *dl["g_t"], "distortion grad t")


def test_ray_march_references_match_the_op():
    cs = by_name(cases.ray_march_cases(R=512, G=32, max_samples=256))
    a = cs["ray_march_mip (all levels)"].arrays
    p = a["params"][0]
    G, step = int(p["G"]), float(p["step_size"])
    box = [float(p["lo_x"])] * 3 + [float(p["hi_x"])] * 3
    # The mip: level 1 of an all-occupied grid is all ones; of the sparse grid, the OR of 2x2x2 blocks.
    occ = np.unpackbits(a["bits"], bitorder="little")[:G ** 3].astype(bool).reshape(G, G, G)
    lvl1 = np.unpackbits(a["mip"], bitorder="little")[:(G // 2) ** 3].astype(bool).reshape((G // 2,) * 3)
    np.testing.assert_array_equal(lvl1, occ.reshape(G // 2, 2, G // 2, 2, G // 2, 2).any(axis=(1, 3, 5)))
    grid = collections.namedtuple("Grid", "bits aabb resolution")(a["bits_full"], np.reshape(box, (2, 3)), G)
    full = tf_metal_ops.ray_march(a["o"], a["d"], grid, step_size=step, max_samples=256, jitter=False)
    counts = np.diff(full.row_splits.numpy())
    case = cs["ray_march_count (sparse grid)"]
    out = {"scan_full": np.concatenate([[0], counts]), "scan": np.concatenate([[0], counts])}
    assert case.check(out) == []
    out["scan_full"] = out["scan_full"] + np.where(np.arange(len(counts) + 1) == 7, 3, 0)
    assert case.check(out) != []  # a wrong count fails the check
    ref, tol = cs["ray_march_scan (block + block + add)"].reference()["scan_in"]
    assert ref[0] == 0 and np.array_equal(ref[1:], np.cumsum(a["scan_in"][1:]))
