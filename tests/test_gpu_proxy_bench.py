"""The GPU proxy benchmark (dev/gpu_proxy/run.py) without a GPU: its NumPy float64 references, which decide whether a
kernel's output on the device is right before it is timed, agree with the package's CPU ops on the benchmark's own
inputs (small sizes); the packed layouts and level tables it builds are the ones the ops accept; a wrong output
fails its check; and its runner (check before timing, warm-up, medians, the results file) works end to end over a
fake CuPy whose only kernels are NumPy versions of the scan. Its argument packing against the PTX entries is
tests/test_gpu_proxy.py's dry run."""

import collections
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tf_metal_ops
from tf_metal_ops.hash_grid import HashGridConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dev"))
from gpu_proxy import cases  # noqa: E402
from gpu_proxy import run as bench  # noqa: E402


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
    return cs, cfg, cs["hash_grid_encode_d3f2_float32, G=4 (host)"].arrays


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
    exp = cs[f"hash_grid_encode_d3f2_{dtype}, G=4 (host)"].reference()
    name = "out16" if half else "out"
    assert_expected(out.numpy(), exp[name], f"encode {dtype}")
    gp_case = cs["hash_grid_grad_params_d3f2_float16 (float32 accumulation), random points, run sums" if half else
                 "hash_grid_grad_params_d3f2_float32, native float atomics (MSL 3.0), random points, plain atomics"]
    ref, tol = gp_case.reference()["acc"]
    assert_within(gp.numpy().reshape(-1), ref, tol * (100 if half else 1), f"param gradient {dtype}")
    if half:
        return  # the float16 op rounds its gradients to half; the float32 checks below cover the math
    assert_expected(gx.numpy(), cs["hash_grid_grad_positions_float32"].reference()["dx"], "position gradient")
    second = cs["hash_grid_grad2_points_float32"].reference()
    assert_expected(g2[0].numpy(), second["ddy"], "second order d/d(dy)")
    assert_expected(g2[2].numpy(), second["dx2"], "second order d/dx")
    ref, tol = cs["hash_grid_grad2_params_d3f2_float32, native float atomics (MSL 3.0), random points, run sums"].reference()["acc"]
    assert_within(g2[1].numpy().reshape(-1), ref, tol, "second order d/dparams")
    # The CAS case is checked against the same reference, and a wrong accumulator fails it.
    cas = cs["hash_grid_grad_params_d3f2_float32, CAS loop (MSL 2.4), random points, run sums"].reference()["acc"]
    assert not cases.within(gp.numpy().reshape(-1) * 1.001 + 1e-3, *cas)[0]


def test_ray_ordered_points_reference_matches_the_cpu_op(hash_grid):
    """The NeRF-like case (points in ray order: runs of equal rows on the coarse levels) has a reference of its own."""
    cs, cfg, a = hash_grid
    x, p, dy = tf.constant(a["x_rays"]), tf.constant(a["params"]), tf.constant(a["dy"])
    with tf.GradientTape() as tape:
        tape.watch(p)
        y = tf.reduce_sum(tf_metal_ops.hash_grid_encode(x, p, **cfg.op_kwargs()) * dy)
    gp = tape.gradient(y, p).numpy().reshape(-1)
    ref, tol = cs["hash_grid_grad_params_d3f2_float32, native float atomics (MSL 3.0), rays, run sums"].reference()["acc"]
    assert_within(gp, ref, tol, "param gradient, ray-ordered points")
    assert np.mean(np.all(np.diff(a["x_rays"], axis=0) ** 2 < 1e-4, axis=1)) > 0.9  # adjacent points are close


@pytest.mark.parametrize("packed", [False, True])
def test_render_launches_dispatch_the_hosts_lanes_per_ray(packed):
    """The render kernels, dense and packed, run one SIMD group of kVrpLanes threads per ray (csrc/shared/
    render_math.h; the host's RayThreads / RunRayKernel): the bench dispatches the same, or its rays go unrendered."""
    import re
    header = (Path(__file__).resolve().parent.parent / "csrc" / "shared" / "render_math.h").read_text()
    lanes = int(re.search(r"\bkVrpLanes\s*=\s*(\d+)", header).group(1))
    assert cases.VRP_LANES == lanes
    R = 32
    launches = [l for c in cases.render_cases(R=R, S=16, C=3, packed=packed) for l in c.launches]
    assert len(launches) == 4
    for l in launches:
        assert l.threads == (lanes * R, 1, 1) and l.group[0] % lanes == 0, (l.kernel, l.threads, l.group)


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
    t_grads = ("g_ts", "g_te") if packed else ("g_t",)  # the gradients of tvars: t_starts, t_ends, or t
    for got, name in zip(g[2:], t_grads):
        assert_within(got.numpy(), *back[name], f"{prefix}backward {name}")
    gbg = tape.gradient(y, bg).numpy()
    assert_within(gbg, back["g_bg"][0].sum(axis=0), np.abs(back["g_bg"][0]).sum(axis=0) * 1e-4 + 1e-6, "background")
    assert_within(loss.numpy(), *cs[2].reference()["loss"], f"{prefix}distortion loss")
    dl = cs[3].reference()
    gd = tape.gradient(z, [w_in, *tvars])
    assert_within(gd[0].numpy(), *dl["g_w"], f"{prefix}distortion grad weights")
    for got, name in zip(gd[1:], t_grads):
        assert_within(got.numpy(), *dl[name], f"{prefix}distortion grad {name}")


def test_fused_mlp_references_match_the_cpu_op():
    """The fused-MLP cases' float64 references (y and dparams of the forward + backward) against the package's op
    on the CPU (float16 in, float32 sums), within the cases' own tolerances; the launches pack what the host packs."""
    cs = [c for c in cases.fused_mlp_cases(n=200) if c.name.endswith("forward_backward_float16")]
    assert len(cs) == 2
    for case, (layers, n_out, act, out_act) in zip(cs, ((1, 16, "relu", "none"), (2, 3, "relu", "sigmoid"))):
        a = case.arrays
        x, p, dy = (tf.constant(a[k]) for k in ("x", "params", "dy"))
        with tf.GradientTape() as tape:
            tape.watch(p)
            y = tf_metal_ops.fused_mlp(x, p, n_hidden_layers=layers, width=64, n_output=n_out, activation=act,
                                       output_activation=out_act)
        dp = tape.gradient(y, p, output_gradients=dy)
        ref = case.reference()
        assert_within(y.numpy(), *ref["y"], f"{case.name} y")
        assert_within(dp.numpy(), *ref["dparams"], f"{case.name} dparams")
        fwd, bwd, red = case.launches
        assert a["args_bwd"]["parts"][0] >= 1 and a["partial"].size == a["args_bwd"]["parts"][0] * p.shape[0]
        assert fwd.constants == bwd.constants == {"fm_activation": 1, "fm_output_activation": 0 if layers == 1 else 3}
        assert bwd.threads[0] == a["args_bwd"]["parts"][0] * bwd.group[0] and red.threads == (p.shape[0], 1, 1)


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


class _FakeCupy:
    """Just enough of CuPy for dev/gpu_proxy/run.py's runner on the CPU: buffers are NumPy arrays, events count
    launches, and the kernels are the NumPy functions in `kernels` (every other kernel does nothing, so its case
    fails its check). Tests the runner's plumbing, not a GPU."""

    def __init__(self, kernels):
        import types

        self.__version__ = "fake"
        self.float32 = np.float32
        self.kernels, self.launches = kernels, []
        class Event:  # its time: the number of launches so far
            def record(self_):
                self_.t = len(self.launches)

            def synchronize(self_):
                pass

        runtime = types.SimpleNamespace(deviceSynchronize=lambda: None, driverGetVersion=lambda: 0,
                                        runtimeGetVersion=lambda: 0,
                                        getDeviceProperties=lambda i: {"name": b"fake GPU"})
        self.cuda = types.SimpleNamespace(Event=Event, get_elapsed_time=lambda a, b: float(b.t - a.t),
                                          runtime=runtime)
        outer = self

        class RawModule:
            def __init__(self_, path):
                self_.path = path

            def get_function(self_, name):
                def launch(blocks, group, args, shared_mem=0):
                    outer.launches.append(name)
                    outer.kernels.get(name, lambda *a: None)(*args)
                return launch

        self.RawModule = RawModule

    def asarray(self, a):
        return np.array(a)

    def asnumpy(self, a):
        return np.array(a)

    def ones(self, n, dtype):
        return np.ones(n, dtype)

    def empty_like(self, a):
        launches = self.launches

        class Copied(np.ndarray):  # a copy into it counts as one launch
            def __setitem__(self_, key, value):
                launches.append("copy")
                super().__setitem__(key, value)

        return np.empty_like(a).view(Copied)


def _fake_scan_block(data, sums, sp, tg_bytes, *grid):
    p = sp.view(cases.RM_SCAN_PARAMS)[0]
    n, off, b = int(p["n"]), int(p["offset"]), cases.RM_SCAN_BLOCK
    for g in range((n + b - 1) // b):
        block = data[off + g * b: off + min(n, (g + 1) * b)]
        block[:] = np.cumsum(block)
        sums[g] = block[-1]


def _fake_scan_add(data, sums, sp, *grid):
    p = sp.view(cases.RM_SCAN_PARAMS)[0]
    for i in range(cases.RM_SCAN_BLOCK, int(p["n"])):
        data[int(p["offset"]) + i] += sums[i // cases.RM_SCAN_BLOCK - 1]


def test_runner_plumbing_with_a_fake_cupy(tmp_path, monkeypatch):
    fake = _FakeCupy({"ray_march_scan_block": _fake_scan_block, "ray_march_scan_add": _fake_scan_add})
    monkeypatch.setitem(sys.modules, "cupy", fake)
    ptx = tmp_path / "ptx"
    ptx.mkdir()
    (ptx / "manifest.json").write_text('{"commit": "abc123", "kernels": {}, "files": {}}')
    monkeypatch.setattr(bench.load_build_tool(), "find_ptxas", lambda: None)
    md = tmp_path / "gpu_proxy.md"
    assert bench.main(["--ptx", str(ptx), "--md", str(md), "--small", "--only", "ray_march",
                       "--copy-mib", "1"]) == 1  # fakes fail
    text = md.read_text()
    rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ray_march")}
    assert set(rows) == {"ray_march_mip (all levels)", "ray_march_count (sparse grid)",
                         "ray_march_scan (block + block + add)", "ray_march_fill (sparse grid)"}
    scan = rows["ray_march_scan (block + block + add)"]
    assert " | 3.000 | " in scan and "ok (max err/tol 0)" in scan  # 3 launches between the events, then checked
    assert "FAILED: mip_out" in rows["ray_march_mip (all levels)"]
    assert "FAILED" in rows["ray_march_count (sparse grid)"] and "not timed" in rows["ray_march_fill (sparse grid)"]
    assert "commit abc123" in text and "GPU: fake GPU" in text
    n_scan = sum(1 for name in fake.launches if name == "ray_march_scan_block")
    assert n_scan == 2 * (1 + 5 + 25)  # one checked run, 5 warm-up runs, 25 timed runs; two block levels each


class _Exp2Cupy:
    """cupy as tcnn_level_scales uses it: asarray, and an ElementwiseKernel evaluating exp2f, here NumPy's 2^x
    rounded to float32 and moved `ulps` float32 steps on the levels listed (the device's ex2.approx is within 1 ulp)."""

    def __init__(self, ulps=None):
        self.ulps = ulps or {}

    def asarray(self, a):
        return _Host(np.asarray(a))

    def ElementwiseKernel(self, in_params, out_params, body, name):
        assert "exp2f" in body and in_params == "float32 x" and out_params == "float32 y"

        def run(x):
            y = np.exp2(x.a.astype(np.float64)).astype(np.float32)
            for level, k in self.ulps.items():
                y[level] = np.float32(y[level]) if k == 0 else np.nextafter(y[level], np.float32(np.inf * k))
            return _Host(y)
        return run


class _Host:
    def __init__(self, a):
        self.a = a

    def get(self):
        return self.a


def test_tcnn_cases_pack_tcnns_layouts_and_check_with_its_level_scales(monkeypatch):
    """dev/gpu_proxy/run.py --tcnn: tiny-cuda-nn's kernels read our inputs in its layouts, and are checked against the
    float64 reference computed with the level scales its kernels compute (one ulp of 2^x apart from ours on some
    levels: a point near a cell boundary then lands in the neighbouring cell)."""
    kw = dict(n=2048, n_levels=8, F=2, log2_T=12, base=16, per_level_scale=1.3819)
    ours = by_name(cases.hash_grid_cases(**kw))
    monkeypatch.setitem(sys.modules, "cupy", _Exp2Cupy())
    cs = by_name(cases.hash_grid_cases(tcnn=True, **kw))
    tc = {k: v for k, v in cs.items() if k.startswith("tiny-cuda-nn")}
    assert len(tc) == 4 and set(cs) - set(tc) == set(ours)
    a = next(iter(tc.values())).arrays
    levels, rows = a["levels"], a["params"].shape[0]
    for case in tc.values():
        (launch,) = case.launches
        assert launch.module == "tcnn" and not launch.msl
        kinds = [k for k, _ in launch.args]
        assert kinds == ["buf", "buf", "buf", "host", "u32", "u32", "u32", "f32"]
        offsets = launch.args[3][1]
        assert offsets.dtype == np.uint32 and list(offsets) == list(levels["offset"]) + [rows]
        assert launch.args[4:7] == [("u32", 2048), ("u32", 8), ("u32", 16)]
        assert launch.args[7][1] == np.float32(np.log2(np.float64(np.float32(1.3819))))  # log2f(b), tcnn's host
    # With scales equal to ours, the references are ours in tiny-cuda-nn's [L*F, N] layout.
    fwd = tc["tiny-cuda-nn kernel_grid (f32 table)"].reference()["out_fm"]
    mine = ours["hash_grid_encode_fm_d3f2_float32, threadgroup 512 (host)"].reference()["out_fm"]
    np.testing.assert_array_equal(fwd[0], mine[0])
    grad = tc["tiny-cuda-nn kernel_grid_backward (f32 table, float atomics)"].reference()["acc"]
    mine = ours["hash_grid_grad_params_d3f2_float32, native float atomics (MSL 3.0), random points, run sums, "
                "feature-major"].reference()["acc"]
    np.testing.assert_array_equal(grad[0], mine[0])
    # One level's 2^x one ulp up: that level's scale moves (16 ulps of 2^x, one rounding of scale - 1), no other,
    # and only that level's outputs can change (the points at its cell boundaries).
    monkeypatch.setitem(sys.modules, "cupy", _Exp2Cupy({5: 1}))
    t = cases.tcnn_level_scales(levels, float(np.float32(np.log2(np.float64(np.float32(1.3819))))), 16)
    assert list(np.nonzero(t["scale"] != levels["scale"])[0]) == [5] and t["scale"][5] > levels["scale"][5]
    cs = by_name(cases.hash_grid_cases(tcnn=True, **kw))
    moved = cs["tiny-cuda-nn kernel_grid (f32 table)"].reference()["out_fm"][0]
    changed = np.nonzero(np.any(moved != fwd[0], axis=1))[0]
    assert set(changed) <= {10, 11}  # level 5's two feature rows


def test_tcnn_build_names_what_the_checkout_lacks(tmp_path):
    tool = bench.load_build_tool()
    with pytest.raises(tool.BuildError, match="grid.h missing"):
        tool.build_tcnn(tmp_path, tmp_path / "out")


def _nerf_step_on_the_cpu(a):
    """One NeRF step of dev/gpu_proxy's nerf_step case computed by the package's CPU ops (float16 table and networks,
    the glue in NumPy as nerf_glue.cu does it): the outputs the device's sequence must give, by the case's names."""
    n = a["x"].shape[0]
    cfg = dict(n_levels=8, n_features_per_level=2, log2_hashmap_size=12, base_resolution=16, per_level_scale=1.3819)
    x, table, pd, pc = (tf.constant(a[k]) for k in ("x", "table", "params_d", "params_c"))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([table, pd])
        enc = tf_metal_ops.hash_grid_encode(x, table, feature_major=True, **cfg)
        h = tf_metal_ops.fused_mlp(enc, pd, n_hidden_layers=1, width=64, n_output=16, feature_major=True)
    h0 = h.numpy()[:, 0].astype(np.float32)
    sigma = np.exp(np.clip(h0, -15, 15)).astype(np.float32)
    c_in = tf.constant(np.concatenate([h.numpy(), a["sh"]], axis=1))
    with tf.GradientTape(persistent=True) as tape_c:
        tape_c.watch([c_in, pc])
        rgb = tf_metal_ops.fused_mlp(c_in, pc, n_hidden_layers=2, width=64, n_output=3, output_activation="sigmoid")
    colors = tf.constant(rgb.numpy().astype(np.float32))
    s = tf.constant(sigma)
    with tf.GradientTape() as tape_r:
        tape_r.watch([s, colors])
        color, _, _, weights = tf_metal_ops.volume_render_packed(
            s, colors, tf.constant(a["ts"]), tf.constant(a["te"]), tf.constant(a["splits"].astype(np.int64)),
            tf.constant(a["bg"]))
        loss = tf.reduce_sum(color * a["gC"])
    g_sigma, g_colors = (v.numpy() for v in tape_r.gradient(loss, [s, colors]))
    dy_c = g_colors.astype(np.float16)
    dc_in, dparams_c = (v.numpy() for v in tape_c.gradient(rgb, [c_in, pc], output_gradients=tf.constant(dy_c)))
    dh = dc_in[:, :16].astype(np.float32)
    dh[:, 0] += g_sigma * np.where(np.abs(h0) < 15, np.exp(h0), 0).astype(np.float32)
    dh = dh.astype(np.float16)
    denc, dparams_d = tape.gradient(h, [enc, pd], output_gradients=tf.constant(dh))
    grad_table = tape.gradient(enc, table, output_gradients=denc)
    return {"enc": enc.numpy(), "h": h.numpy(), "c_in": c_in.numpy(), "rgb": rgb.numpy(), "sigma": sigma,
            "colors": colors.numpy(), "color": color.numpy(), "weights": weights.numpy(), "g_sigma": g_sigma,
            "g_colors": g_colors, "dy_c": dy_c, "dc_in": dc_in, "dh": dh, "denc": denc.numpy(),
            "dparams_d": dparams_d.numpy(), "dparams_c": dparams_c, "grad_table": grad_table.numpy().reshape(-1)}


def test_nerf_step_check_passes_the_cpu_ops_and_names_a_wrong_stage(monkeypatch):
    """The NeRF-step sequence is checked stage by stage on the device's own intermediate outputs: the package's CPU
    ops' step passes, for ours and (outputs padded to FullyFusedMLP's 16 columns) for tiny-cuda-nn's; a wrong stage
    fails by name; both sequences launch the same glue and rendering between their own kernels."""
    monkeypatch.setitem(sys.modules, "cupy", _Exp2Cupy())
    kw = dict(n=4096, R=64, n_levels=8, log2_T=12)
    ours, theirs = sorted(cases.nerf_step_cases(tcnn=True, **kw), key=lambda c: "tiny-cuda-nn" in c.name)
    assert ours.name.endswith("(ours)") and ours.bound == ("case", theirs.name)
    a = ours.arrays
    out = _nerf_step_on_the_cpu(a)
    fails, worst = ours.check(out)
    assert fails == [] and 0 < worst <= 1
    pad = lambda v: np.pad(v, ((0, 0), (0, 13)))  # noqa: E731
    out_t = {k + "_t": pad(v) if k in ("rgb", "dy_c") else v for k, v in out.items()}
    assert theirs.check(out_t)[0] == []
    for stage, name, change in (("colour network dparams", "dparams_c", lambda v: v[::-1].copy()),
                                ("glue: density gradient", "dh", lambda v: v + np.float16(0.01)),
                                ("rendering: g_sigma", "g_sigma", lambda v: v[::-1].copy()),
                                ("table gradient", "grad_table", lambda v: v * np.float16(1.1))):
        bad = dict(out, **{name: change(out[name])})
        fails, worst = ours.check(bad)
        assert any(f.startswith(stage) for f in fails) and worst > 1, stage
    glue = lambda c: [(l.module, l.kernel) for l in c.launches if l.module in ("nerf_glue", "render_packed")]  # noqa: E731
    assert glue(ours) == glue(theirs) and len(glue(ours)) == 10
    assert [l.kernel for l in ours.launches if l.module == "fused_mlp"] == [
        "fused_mlp_forward_w64_float16"] * 2 + ["fused_mlp_backward_w64_float16", "fused_mlp_reduce_float16"] * 2
    assert a["args_d_train"]["feature_major"][0] == 1 and a["args_c_train"]["feature_major"][0] == 0
