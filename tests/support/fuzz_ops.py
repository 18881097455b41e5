"""Property-based fuzzing of the public ops, one op per process (run by tests/test_fuzz.py in a subprocess, so a
hard crash fails the test instead of killing pytest).

    cd tests && python -m support.fuzz_ops OP --examples 1000 [--seed 0]

Every generated call must either return a documented result (checked here) or raise ValueError (wrapper) /
tf.errors.InvalidArgumentError (kernel) with a message naming the offending argument. Anything else fails, and so
does a rejection of a call the generator knows to be valid (a valid call must return a checked result).

The last line printed is a JSON object of outcome counts (tests/test_fuzz.py asserts them): ``calls``,
``returned`` (a checked result), ``rejected`` (a clean error), ``valid_calls`` (calls known to be valid: each of
them returned, or the run failed) and ``faulty_calls`` (calls with an injected fault).
"""

import argparse
import json
import os
import re
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import warnings  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import tf_metal_ops  # noqa: E402

warnings.filterwarnings("ignore", category=RuntimeWarning)  # casts of huge values while generating

EXPECTED_ERRORS = (ValueError, TypeError, tf.errors.InvalidArgumentError)


# Printed at the end and asserted by tests/test_fuzz.py, so a run that only ever rejects is a failure.
OUTCOMES = {"calls": 0, "returned": 0, "rejected": 0, "valid_calls": 0, "faulty_calls": 0}


def start_call(valid, faulty=False):
    """Counts one generated call: ``valid`` = known to be valid (it must return), ``faulty`` = a fault was
    injected (it may be rejected; some faults leave the call valid, e.g. a shape change clamped to the same)."""
    OUTCOMES["calls"] += 1
    OUTCOMES["valid_calls"] += bool(valid)
    OUTCOMES["faulty_calls"] += bool(faulty)


def returned():
    OUTCOMES["returned"] += 1


def expect_clean_error(exc, names, valid=False, what=""):
    """A raised error is fine when the call was not known to be valid, is of an expected class and its message
    names an argument. A known-valid call that raises fails the run."""
    assert not valid, f"a valid call was rejected ({what}): {type(exc).__name__}: {str(exc)[:500]}"
    OUTCOMES["rejected"] += 1
    assert isinstance(exc, EXPECTED_ERRORS), f"unexpected {type(exc).__name__}: {exc}"
    msg = str(exc)
    assert any(re.search(n, msg) for n in names), f"message names no argument {names}: {msg[:300]}"


# Arrays of any rank (0-d and 0-sized included), any of these dtypes, with special values, and sometimes a
# non-contiguous (strided) view.
DTYPES = ["int32", "int64", "float32", "float16", "float64", "uint8", "bool"]


@st.composite
def arrays(draw, min_rank=0, max_rank=4, max_side=6, dtypes=DTYPES):
    rank = draw(st.integers(min_rank, max_rank))
    shape = tuple(draw(st.integers(0, max_side)) for _ in range(rank))
    dtype = np.dtype(draw(st.sampled_from(dtypes)))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    n = int(np.prod(shape))
    if dtype.kind == "f":
        base = rng.standard_normal(n) * draw(st.sampled_from([1.0, 1e3, 1e30]))
        special = rng.choice([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e38], size=n)
        base = np.where(rng.random(n) < draw(st.sampled_from([0.0, 0.1, 0.5])), special, base)
        a = base.astype(np.float64).astype(dtype).reshape(shape)
    elif dtype.kind == "b":
        a = (rng.random(n) < 0.5).reshape(shape)
    else:
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, size=n, dtype=dtype, endpoint=True).reshape(shape)
    if rank and all(shape) and draw(st.booleans()):
        a = np.repeat(a, 2, axis=0)[::2]  # a strided view over a larger buffer
    return a


def fuzz_zero_out(examples, seed_value):
    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(x=arrays())
    def run(x):
        valid = x.dtype.name in ("int32", "int64", "float32", "float16")  # the kernel's types; any shape
        start_call(valid, faulty=not valid)
        try:
            y = tf_metal_ops.zero_out(x).numpy()
        except Exception as e:
            expect_clean_error(e, ["zero_out: x"], valid, f"{x.dtype} {x.shape}")
            return
        assert y.shape == x.shape and y.dtype == x.dtype
        expected = np.zeros_like(x)
        if x.size:
            expected.reshape(-1)[0] = x.reshape(-1)[0]
        np.testing.assert_array_equal(y, expected)
        returned()

    run()


@st.composite
def ray_batch(draw):
    """Mostly well-formed render inputs with one thing at a time possibly wrong."""
    r, s, c = draw(st.integers(0, 5)), draw(st.integers(0, 6)), draw(st.integers(0, 4))
    shapes = {"densities": [r, s], "colors": [r, s, c], "t": [r, s + 1]}
    fault = draw(st.sampled_from([None] * 6 + ["shape", "dtype", "special", "background"]))
    broken = draw(st.sampled_from(["densities", "colors", "t"])) if fault == "shape" else None
    if broken:  # wrong rank or a wrong dimension
        shape = list(shapes[broken])
        if draw(st.booleans()):
            shape = shape[:-1] if len(shape) > 1 else shape + [2]
        else:
            i = draw(st.integers(0, len(shape) - 1))
            shape[i] += draw(st.sampled_from([-1, 1, 3]))
        shapes[broken] = [max(d, 0) for d in shape]
    dtype = draw(st.sampled_from(["float64", "float16", "int32"])) if fault == "dtype" else "float32"
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    density_scale = draw(st.sampled_from([0.0, 1.0, 1e4, 1e38]))
    out = {
        "densities": (rng.random(shapes["densities"]) * density_scale).astype(dtype),
        "colors": rng.random(shapes["colors"]).astype(dtype),
        "t": np.sort(rng.uniform(0, draw(st.sampled_from([1.0, 1e6])), shapes["t"]), axis=-1).astype(dtype),
    }
    special = draw(st.sampled_from(["nan", "inf", "negative", "unsorted"])) if fault == "special" else None
    if dtype == "int32" and special in ("nan", "inf"):
        special = None
    for name in ("densities", "t"):
        a = out[name]
        if a.size and special and draw(st.booleans()):
            flat = a.reshape(-1)
            flat[draw(st.integers(0, flat.size - 1))] = {
                "nan": np.nan, "inf": np.inf, "negative": -1.0, "unsorted": -1e3}[special]
    bg = draw(st.sampled_from([None, "shared", "per_ray"] + (["bad"] if fault == "background" else [])))
    if bg == "shared":
        out["background"] = rng.random([c]).astype(np.float32)
    elif bg == "per_ray":
        out["background"] = rng.random([r, c]).astype(np.float32)
    elif bg == "bad":
        out["background"] = rng.random([c + 1, 2, 1]).astype(np.float32)
    # what was injected: (fault kind or None, the field whose shape was broken, the special value)
    # (zero channels is invalid for volume_render, documented: "colors needs at least one channel")
    kind = fault if fault != "background" or bg == "bad" else None
    if kind is None and c == 0:
        kind, broken = "shape", "colors"
    out["_fault"] = (kind, broken, special)
    return out


def _fault_of(b):
    b = dict(b)
    return b.pop("_fault"), b


RENDER_ARGS = ["densities", "colors", r"\bt\b", "background", "termination_threshold", "weights"]


def fuzz_volume_render(examples, seed_value):
    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(b=ray_batch(), thr=st.sampled_from([0.0, 0.0, 1e-4, 0.5, 1.0] * 3 + [-0.1, 2.0, float("nan")]))
    def run(b, thr):
        (fault, _, _), b = _fault_of(b)
        thr_ok = 0.0 <= thr <= 1.0  # False for NaN
        start_call(fault is None and thr_ok, faulty=fault is not None or not thr_ok)
        try:
            out = tf_metal_ops.volume_render(b["densities"], b["colors"], b["t"], b.get("background"),
                                             termination_threshold=thr)
        except Exception as e:
            shapes = {k: v.shape for k, v in b.items()}
            expect_clean_error(e, RENDER_ARGS, fault is None and thr_ok, f"shapes {shapes}, threshold {thr}")
            return
        r, s = b["densities"].shape
        c = b["colors"].shape[2]
        assert out.color.shape == (r, c) and out.weights.shape == (r, s)
        assert out.depth.shape == (r,) and out.opacity.shape == (r,)
        # Documented policy: NaN/inf inputs propagate; finite accepted inputs give finite outputs.
        if all(np.isfinite(np.asarray(v, np.float64)).all() for v in b.values()):
            for name, v in zip(out._fields, out):
                assert np.isfinite(v.numpy()).all(), f"non-finite {name} for finite inputs"
            w = out.weights.numpy()
            assert (w >= 0).all() and (out.opacity.numpy() <= 1 + 1e-6).all()
        returned()

    run()


def fuzz_distortion_loss(examples, seed_value):
    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(b=ray_batch())
    def run(b):
        (fault, broken, _), b = _fault_of(b)
        w, t = b["densities"], b["t"]
        # faults in colors/background do not concern this op (it takes weights and t only)
        relevant = fault is not None and fault != "background" and not (fault == "shape" and broken == "colors")
        start_call(not relevant, faulty=relevant)
        try:
            loss = tf_metal_ops.distortion_loss(w, t)
        except Exception as e:
            expect_clean_error(e, RENDER_ARGS, not relevant, f"weights {w.shape} {w.dtype}, t {t.shape} {t.dtype}")
            return
        assert loss.shape == (w.shape[0],)
        # Finite inputs of moderate size give a finite loss (NaN/inf propagate, as in TF's own ops).
        if np.isfinite(w).all() and np.isfinite(t).all() and np.abs(w).max(initial=0) <= 1e4 \
                and np.abs(t).max(initial=0) <= 1e6:
            assert np.isfinite(loss.numpy()).all()
        returned()

    run()


HASH_ARGS = ["positions", "params", "n_levels", "n_features_per_level", "log2_hashmap_size", "base_resolution",
             "per_level_scale", "grid_type", "interpolation", "max_level"]


@st.composite
def hash_grid_call(draw):
    """A valid config and inputs with at most one fault (half the time none): an invalid option, a wrong
    shape/dtype, a params size that does not match, or a bad max_level. Positions always range far outside [0,1]
    and include NaN/inf sometimes (a documented, valid input)."""
    opts = dict(
        n_levels=draw(st.integers(1, 6)),
        n_features_per_level=draw(st.sampled_from([1, 2, 4, 8])),
        log2_hashmap_size=draw(st.integers(4, 12)),
        base_resolution=draw(st.sampled_from([1, 2, 5, 16])),
        per_level_scale=draw(st.sampled_from([1.0, 1.3, 2.0, 3.5])),
        grid_type=draw(st.sampled_from(["hash", "dense", "tiled"])),
        interpolation=draw(st.sampled_from(["linear", "smoothstep", "nearest"])),
    )
    d = draw(st.integers(1, 4))
    n = draw(st.sampled_from([0, 1, 7, 64]))
    x_dtype, params_dtype = "float32", draw(st.sampled_from(["float32", "float16"]))
    max_level = draw(st.sampled_from([None, 0, 1, 3, 100, -2, 0.0, 0.5, 1.0]))
    rows_delta, x_rank_wrong = 0, False
    fault = draw(st.sampled_from([None] * 9 + ["option", "d", "rows", "x_dtype", "params_dtype", "rank", "max_level"]))
    if fault == "option":
        key, bad = draw(st.sampled_from([
            ("n_levels", 0), ("n_levels", 33), ("n_features_per_level", 3), ("log2_hashmap_size", 25),
            ("log2_hashmap_size", 0), ("base_resolution", 0), ("per_level_scale", 0.5),
            ("per_level_scale", float("nan")), ("per_level_scale", float("inf")), ("grid_type", "bogus"),
            ("interpolation", "cubic"), ("base_resolution", 2**26)]))
        opts[key] = bad
    elif fault == "d":
        d = draw(st.sampled_from([0, 5]))
    elif fault == "rows":
        rows_delta = draw(st.sampled_from([-1, 1, 8]))
    elif fault == "x_dtype":
        x_dtype = draw(st.sampled_from(["float64", "float16", "int32"]))
    elif fault == "params_dtype":
        params_dtype = draw(st.sampled_from(["float64", "int32"]))
    elif fault == "rank":
        x_rank_wrong = True
    elif fault == "max_level":
        max_level = draw(st.sampled_from([float("nan"), "2", True]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    x = rng.uniform(-0.5, 1.5, (n, d)) * draw(st.sampled_from([1.0, 1.0, 1e6]))
    if x.size and draw(st.booleans()):
        x.reshape(-1)[rng.integers(0, x.size)] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    x = x.astype(x_dtype) if x_dtype != "int32" else np.nan_to_num(x).astype(np.int32)
    if x_rank_wrong:
        x = x.reshape(-1)
    try:
        rows, f = tf_metal_ops.HashGridConfig(n_input_dims=d, **opts).params_shape
        config_ok = True
    except ValueError:  # an invalid option, or a valid combination whose table is too large (documented)
        rows, f = 64, 2
        config_ok = False
    params = rng.uniform(-1, 1, (max(rows + rows_delta, 0), f)).astype(params_dtype)
    valid = fault is None and config_ok  # every unfaulted call with a constructible config must return
    return x, params, opts, max_level, valid, fault


def fuzz_hash_grid(examples, seed_value):
    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(call=hash_grid_call())
    def run(call):
        x, params, opts, max_level, valid, fault = call
        start_call(valid, faulty=fault is not None)
        try:
            with tf.GradientTape() as tape:
                xt, pt = tf.constant(x), tf.constant(params)
                tape.watch([xt, pt])
                y = tf_metal_ops.hash_grid_encode(xt, pt, max_level=max_level, **opts)
                loss = tf.reduce_sum(tf.cast(y, tf.float32))
            gx, gp = tape.gradient(loss, [xt, pt])
        except Exception as e:
            expect_clean_error(e, HASH_ARGS, valid, f"x {x.shape} {x.dtype}, params {params.shape} {params.dtype}, "
                                                   f"{opts}, max_level={max_level!r}")
            return
        n = x.shape[0]
        assert y.shape == (n, opts["n_levels"] * opts["n_features_per_level"]) and y.dtype == params.dtype
        assert gx.shape == x.shape and gp.shape == params.shape
        # Documented policy: positions are clamped to [0,1] (NaN -> 0), so finite tables give finite outputs.
        assert np.isfinite(y.numpy()).all() and np.isfinite(gx.numpy()).all()
        returned()

    run()


@st.composite
def packed_batch(draw):
    """Packed (ragged) render inputs, mostly well-formed, with at most one fault: a wrong shape or rank, a wrong
    dtype, broken row_splits (not starting at 0, decreasing, not ending at N, float), special values (NaN, inf,
    negative densities, unsorted t: may be accepted), a bad background or a bad threshold."""
    R, c = draw(st.integers(0, 5)), draw(st.integers(1, 4))
    counts = [draw(st.integers(0, 4)) for _ in range(R)]
    n = sum(counts)
    rs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    edges = np.sort(rng.uniform(0.0, draw(st.sampled_from([1.0, 10.0])), 2 * n)).astype(np.float32)
    out = {"densities": (rng.random(n) * draw(st.sampled_from([0.0, 1.0, 10.0]))).astype(np.float32),
           "colors": rng.random((n, c)).astype(np.float32),
           "t_starts": edges[0::2].copy(), "t_ends": edges[1::2].copy(), "row_splits": rs}
    fault = draw(st.sampled_from([None] * 6 + ["shape", "dtype", "row_splits", "special", "background",
                                               "threshold"]))
    broken = None
    if fault == "shape":
        broken = draw(st.sampled_from(["densities", "colors", "t_starts", "t_ends"]))
        a = out[broken]
        if draw(st.booleans()):  # wrong rank
            out[broken] = a.reshape(a.shape + (1,)) if a.ndim == 1 else a.reshape(-1)
        else:  # one sample more, or one fewer (or one more when there is none)
            k = a.shape[0] + (1 if a.shape[0] == 0 or draw(st.booleans()) else -1)
            out[broken] = np.resize(a, (k,) + a.shape[1:])
        if broken == "colors" and out["colors"].ndim == 1 and n == 0:
            out["colors"] = np.zeros((0, 0), np.float32)  # zero channels (also invalid)
    elif fault == "dtype":
        broken = draw(st.sampled_from(["densities", "colors", "t_starts", "t_ends", "row_splits"]))
        out[broken] = out[broken].astype(draw(st.sampled_from(
            ["float64", "float16", "int32"] if broken != "row_splits" else ["float32", "uint8"])))
    elif fault == "row_splits":
        rs = rs.copy()
        how = draw(st.sampled_from(["first", "last", "decreasing", "empty"]))
        if how == "first":
            rs[0] = draw(st.sampled_from([-1, 1]))
        elif how == "last":
            rs[-1] += draw(st.sampled_from([-1, 1, 100]))
        elif how == "decreasing" and R >= 2:
            rs[1] = rs[-1] + 1
        elif how == "empty":
            rs = rs[:0]
        out["row_splits"] = rs
    elif fault == "special" and n:
        name = draw(st.sampled_from(["densities", "t_starts", "t_ends"]))
        out[name].reshape(-1)[draw(st.integers(0, n - 1))] = draw(st.sampled_from([np.nan, np.inf, -1.0, -1e3]))
    bg = draw(st.sampled_from([None, "shared", "per_ray"] + (["bad"] if fault == "background" else [])))
    if bg == "shared":
        out["background"] = rng.random([c]).astype(np.float32)
    elif bg == "per_ray":
        out["background"] = rng.random([R, c]).astype(np.float32)
    elif bg == "bad":
        out["background"] = rng.random(draw(st.sampled_from([[c + 1], [R + 1, c], [1, 1, c]]))).astype(np.float32)
    thr = draw(st.sampled_from([0.0, 1e-4, 0.5, 1.0] + ([-0.1, 2.0, float("nan")] if fault == "threshold" else [])))
    # a fault that changes nothing (a decreasing row_splits with fewer than 2 rays) leaves the call valid
    if fault == "row_splits" and np.array_equal(out["row_splits"], rs) and len(rs) and rs[0] == 0 \
            and (np.diff(rs) >= 0).all() and rs[-1] == n:
        fault = None
    if fault == "special" and not n or fault == "threshold" and 0.0 <= thr <= 1.0:
        fault = None
    if fault == "background" and bg != "bad":
        fault = None
    return out, thr, fault, broken


PACKED_ARGS = ["densities", "colors", "t_starts", "t_ends", "row_splits", "background", "termination_threshold",
               "weights", "samples"]


def _moderate(*arrays):
    return all(np.isfinite(a).all() and np.abs(a).max(initial=0) <= 1e4 for a in arrays)


def fuzz_volume_render_packed(examples, seed_value):
    from tf_metal_ops.render_packed.reference import np_volume_render_packed

    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(call=packed_batch())
    def run(call):
        b, thr, fault, _ = call
        start_call(fault is None, faulty=fault is not None)
        try:
            out = tf_metal_ops.volume_render_packed(
                b["densities"], b["colors"], b["t_starts"], b["t_ends"], b["row_splits"], b.get("background"),
                termination_threshold=thr)
        except Exception as e:
            shapes = {k: (v.shape, v.dtype.name) for k, v in b.items()}
            expect_clean_error(e, PACKED_ARGS, fault is None, f"{shapes}, threshold {thr}")
            return
        r, n = len(b["row_splits"]) - 1, b["densities"].shape[0]
        c = b["colors"].shape[1]
        assert out.color.shape == (r, c) and out.depth.shape == (r,) and out.opacity.shape == (r,)
        assert out.weights.shape == (n,)
        if fault is None:  # a valid call: the NumPy float64 reference, to float32 rounding
            want = np_volume_render_packed(b["densities"], b["colors"], b["t_starts"], b["t_ends"],
                                           b["row_splits"], b.get("background"), thr)
            for got, w in zip(out, want):
                np.testing.assert_allclose(got.numpy(), w, rtol=1e-4, atol=1e-5)
        elif _moderate(*(v for k, v in b.items() if v.dtype.kind == "f")):
            for name, v in zip(out._fields, out):
                assert np.isfinite(v.numpy()).all(), f"non-finite {name} for finite inputs"
        returned()

    run()


def fuzz_distortion_loss_packed(examples, seed_value):
    from tf_metal_ops.render_packed.reference import np_distortion_packed

    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(call=packed_batch())
    def run(call):
        b, _, fault, broken = call
        # colors, background and the threshold are not arguments of this op: faults there leave the call valid
        relevant = fault in ("shape", "dtype", "row_splits", "special") and broken != "colors"
        w = b["densities"]
        start_call(not relevant, faulty=relevant)
        try:
            with tf.GradientTape() as tape:
                wt, ts, te = (tf.constant(v) for v in (w, b["t_starts"], b["t_ends"]))
                tape.watch([wt, ts, te])
                loss = tf_metal_ops.distortion_loss_packed(wt, ts, te, b["row_splits"])
            grads = tape.gradient(loss, [wt, ts, te])
        except Exception as e:
            shapes = {k: (v.shape, v.dtype.name) for k, v in b.items()}
            expect_clean_error(e, PACKED_ARGS, not relevant, f"{shapes}")
            return
        r = len(b["row_splits"]) - 1
        assert loss.shape == (r,)
        assert [g.shape for g in grads] == [w.shape, b["t_starts"].shape, b["t_ends"].shape]
        if not relevant:
            want = np_distortion_packed(w, b["t_starts"], b["t_ends"], b["row_splits"])
            np.testing.assert_allclose(loss.numpy(), want, rtol=1e-4, atol=1e-5)
        elif _moderate(w, b["t_starts"], b["t_ends"]):
            assert np.isfinite(loss.numpy()).all()
        returned()

    run()


class _Grid:
    def __init__(self, bits, aabb, resolution):
        self.bits, self.aabb, self.resolution = bits, aabb, resolution


MARCH_ARGS = ["rays_o", "rays_d", "near", "far", "grid", "bits", "aabb", "resolution", "step_size", "cone_angle",
              "max_samples", "jitter", "seed"]


@st.composite
def ray_march_call(draw):
    """Rays through a small random occupancy grid, with at most one fault: ray shapes/dtypes, near/far shapes, a
    wrong bits length or dtype, a bad box (min >= max, NaN), a bad resolution, step, cone, cap, jitter or seed.
    Non-finite rays are a fault too (either result is fine, but no crash)."""
    from tf_metal_ops.ray_march import reference as ref

    R, G = draw(st.integers(0, 6)), draw(st.integers(1, 8))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    aabb = np.array([[-1.0, -1.2, -0.9], [1.1, 0.8, 1.0]], np.float32)
    o, d = ref.make_rays(R, seed=int(rng.integers(1 << 30)), aabb=aabb)
    o, d = o.astype(np.float32), d.astype(np.float32)
    bits = ref.random_bits(G, draw(st.sampled_from([0.0, 0.3, 1.0])), seed=int(rng.integers(1 << 30)))
    kw = dict(step_size=draw(st.sampled_from([0.01, 0.05, 0.3])), cone_angle=draw(st.sampled_from([0.0, 0.05])),
              max_samples=draw(st.sampled_from([1, 5, 64])), jitter=draw(st.booleans()),
              seed=draw(st.integers(-2**40, 2**40)))
    near = draw(st.sampled_from([None, 0.0, "per_ray"]))
    far = draw(st.sampled_from([None, 3.0, "per_ray"]))
    near = rng.uniform(0, 1, R).astype(np.float32) if near == "per_ray" else near
    far = rng.uniform(1, 4, R).astype(np.float32) if far == "per_ray" else far
    resolution = G
    fault = draw(st.sampled_from([None] * 10 + ["rays", "dtype", "near_far", "bits", "aabb", "resolution", "arg",
                                                "special"]))
    if fault == "rays":
        which = draw(st.sampled_from(["o", "d"]))
        bad = np.resize(o, draw(st.sampled_from([(R, 2), (R + 1, 3), (R, 3, 1)]))).astype(np.float32)
        o, d = (bad, d) if which == "o" else (o, bad)
    elif fault == "dtype":
        o = o.astype(draw(st.sampled_from(["float64", "float16", "int32"])))
    elif fault == "near_far":
        near = np.zeros(draw(st.sampled_from([[R + 1], [R, 1]])), np.float32)
    elif fault == "bits":
        bits = np.resize(bits, bits.size + draw(st.sampled_from([-1, 1]))) if draw(st.booleans()) \
            else bits.astype(np.int32)
    elif fault == "aabb":
        aabb = aabb.copy()
        aabb[draw(st.integers(0, 1)), draw(st.integers(0, 2))] = draw(st.sampled_from([np.nan, 5.0, -5.0, np.inf]))
        aabb = aabb if draw(st.booleans()) else aabb.reshape(-1)
    elif fault == "resolution":
        resolution = draw(st.sampled_from([0, -1, G + 1, 2**20]))
    elif fault == "arg":
        key, bad = draw(st.sampled_from([("step_size", 0.0), ("step_size", -1.0), ("step_size", float("nan")),
                                         ("cone_angle", -0.1), ("cone_angle", float("inf")), ("max_samples", 0),
                                         ("max_samples", 2.5), ("jitter", "yes"), ("seed", 1.5)]))
        kw[key] = bad
    elif fault == "special" and R:
        (o if draw(st.booleans()) else d)[draw(st.integers(0, R - 1)), draw(st.integers(0, 2))] = \
            draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    if fault == "special" and not R:
        fault = None
    return o, d, near, far, _Grid(bits, aabb, resolution), kw, fault


def fuzz_ray_march(examples, seed_value):
    from tf_metal_ops.ray_march import reference as ref

    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(call=ray_march_call())
    def run(call):
        o, d, near, far, grid, kw, fault = call
        start_call(fault is None, faulty=fault is not None)
        try:
            res = tf_metal_ops.ray_march(o, d, grid, near=near, far=far, **kw)
            t0, t1, rs, ri, pos = (v.numpy() for v in res)
        except Exception as e:
            expect_clean_error(e, MARCH_ARGS, fault is None,
                               f"o {o.shape} {o.dtype}, grid {grid.resolution}, near {near!r}, far {far!r}, {kw}")
            return
        R = o.shape[0]
        counts = np.diff(rs)
        assert rs.shape == (R + 1,) and rs[0] == 0 and (counts >= 0).all() and rs[-1] == len(t0) == len(t1)
        np.testing.assert_array_equal(ri, np.repeat(np.arange(R), counts))
        assert pos.shape == (len(t0), 3) and counts.max(initial=0) <= kw["max_samples"]
        if fault is None:  # a valid call: the packing invariants and the NumPy reference on unambiguous rays
            assert (t0 < t1).all() and ((pos >= 0) & (pos <= 1)).all()
            want, _, _, margins = ref.march(o, d, 0.0 if near is None else near, np.inf if far is None else far,
                                            grid.bits, grid.aabb, grid.resolution, kw["step_size"],
                                            kw["cone_angle"], kw["max_samples"], kw["jitter"], kw["seed"])
            clear = margins >= ref.MARGIN_EPS
            np.testing.assert_array_equal(counts[clear], want[clear])
        returned()

    run()


MLP_ARGS = ["x", "params", "width", "n_hidden_layers", "n_output", "activation", "output_activation", "use_bias"]


@st.composite
def fused_mlp_call(draw):
    """A valid fused-MLP configuration and inputs with at most one fault (most calls none): an invalid option, an
    input width out of range, a parameter count that does not match, a wrong dtype or rank. Inputs include NaN and
    inf sometimes (they propagate: a valid input)."""
    from tf_metal_ops.fused_mlp import ACTIVATIONS, fused_mlp_layout

    width = draw(st.sampled_from([16, 32, 64, 128]))
    opts = dict(n_hidden_layers=draw(st.integers(1, 8)), width=width, n_output=draw(st.integers(1, width)),
                activation=draw(st.sampled_from(ACTIVATIONS)), output_activation=draw(st.sampled_from(ACTIVATIONS)),
                use_bias=draw(st.booleans()))
    n_in = draw(st.integers(1, width))
    n = draw(st.sampled_from([0, 1, 7, 64, 130]))
    x_dtype = params_dtype = draw(st.sampled_from(["float32", "float16"]))
    params_delta, x_rank_wrong = 0, False
    fault = draw(st.sampled_from([None] * 9 + ["option", "n_input", "params_size", "x_dtype", "params_dtype",
                                              "rank"]))
    if fault == "option":
        key, bad = draw(st.sampled_from([
            ("width", 24), ("width", 256), ("n_hidden_layers", 0), ("n_hidden_layers", 9), ("n_output", 0),
            ("n_output", 129), ("activation", "tanh"), ("output_activation", "sine"), ("use_bias", 1)]))
        opts[key] = bad
    elif fault == "n_input":
        n_in = draw(st.sampled_from([0, width + 1]))
    elif fault == "params_size":
        params_delta = draw(st.sampled_from([-1, 1, 16]))
    elif fault == "x_dtype":
        x_dtype = draw(st.sampled_from(["float64", "int32"]))
    elif fault == "params_dtype":
        params_dtype = draw(st.sampled_from(["float64", "int32", "float16" if x_dtype == "float32" else "float32"]))
    elif fault == "rank":
        x_rank_wrong = True
    try:
        n_params = fused_mlp_layout(n_in, opts["n_output"], width=opts["width"],
                                    n_hidden_layers=opts["n_hidden_layers"], use_bias=opts["use_bias"]).n_params
    except (ValueError, TypeError):
        n_params = 300
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    scale = draw(st.sampled_from([1.0, 1.0, 1e3]))
    x = rng.standard_normal((n, n_in)) * scale
    if x.size and draw(st.booleans()):
        x.reshape(-1)[rng.integers(0, x.size)] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    x = x.astype(x_dtype) if x_dtype != "int32" else np.nan_to_num(x).astype(np.int32)
    if x_rank_wrong:
        x = x.reshape(-1)
    params = (rng.uniform(-1, 1, max(n_params + params_delta, 0)) / np.sqrt(opts["width"] if fault != "option" else 16))
    params = params.astype(params_dtype)
    return x, params, opts, fault


def fuzz_fused_mlp(examples, seed_value):
    from tf_metal_ops.fused_mlp import reference

    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(call=fused_mlp_call())
    def run(call):
        x, params, opts, fault = call
        start_call(fault is None, faulty=fault is not None)
        try:
            with tf.GradientTape() as tape:
                xt, pt = tf.constant(x), tf.constant(params)
                tape.watch([xt, pt])
                y = tf_metal_ops.fused_mlp(xt, pt, **opts)
                loss = tf.reduce_sum(tf.cast(y, tf.float32))
            gx, gp = tape.gradient(loss, [xt, pt])
        except Exception as e:
            expect_clean_error(e, MLP_ARGS, fault is None, f"x {x.shape} {x.dtype}, params {params.shape} "
                                                          f"{params.dtype}, {opts}")
            return
        assert y.shape == (x.shape[0], opts["n_output"]) and y.dtype == x.dtype
        assert gx.shape == x.shape and gx.dtype == x.dtype and gp.shape == params.shape and gp.dtype == params.dtype
        # Moderate values (inputs of unit scale, 1-Lipschitz activations, weights of 1/sqrt(width)): the op agrees with
        # the float64 reference on the finite rows (float16: one rounding of the float32 result).
        moderate = "exponential" not in (opts["activation"], opts["output_activation"])
        rows = np.isfinite(x).all(axis=1) & (np.abs(x).max(axis=1, initial=0) <= 10) if x.size else np.zeros(0, bool)
        if moderate and rows.any():
            want, _, _ = reference.forward(x[rows], params, **opts)
            tol = (2e-2 if x.dtype == np.float16 else 1e-3) * max(1.0, float(np.abs(want).max()))
            np.testing.assert_allclose(y.numpy().astype(np.float64)[rows], want, rtol=0, atol=tol)
        returned()

    run()


METAL_KERNEL_ARGS = ["input", "output", "grid", "threadgroup", "template", "dtype", "dimension", "out-of-bounds",
                     "buffer"]
_KERNELS = {}


@st.composite
def metal_kernel_call(draw):
    """A valid launch of a guarded elementwise kernel (out = 2 * inp) with at most one fault: the inputs' count or
    dtype, the grid or threadgroup (negative, too large, too many threads per group), the output shapes or dtypes
    (count, negative, too small: caught by the bounds check), a bad template argument."""
    n = draw(st.integers(0, 300))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    x = rng.standard_normal(n).astype(np.float32)
    tg = draw(st.sampled_from([1, 32, 256]))
    args = dict(inputs=[x], grid=(n, 1, 1), threadgroup=(tg, 1, 1), output_shapes=[(n,)],
                output_dtypes=[tf.float32], template=[("T", tf.float32)])
    fault = draw(st.sampled_from([None] * 6 + ["inputs", "input_dtype", "grid", "threadgroup", "output_shapes",
                                               "output_dtypes", "template"]))
    if fault == "inputs":
        args["inputs"] = draw(st.sampled_from([[], [x, x]]))
    elif fault == "input_dtype":
        args["inputs"] = [x.astype(np.complex64)]
    elif fault == "grid":
        args["grid"] = draw(st.sampled_from([(-1, 1, 1), (2**32, 1, 1), (n, 1), (n, 0, 1)]))
    elif fault == "threadgroup":
        args["threadgroup"] = draw(st.sampled_from([(2048, 1, 1), (64, 32, 1), (-4, 1, 1), (0, 1, 1)]))
    elif fault == "output_shapes":
        args["output_shapes"] = draw(st.sampled_from([[(-1,)], [(n,), (n,)], [(max(n - 1, 0),)]]))
    elif fault == "output_dtypes":
        args["output_dtypes"] = draw(st.sampled_from([[tf.float32, tf.float32], [], [tf.complex64]]))
    elif fault == "template":
        args["template"] = draw(st.sampled_from([[("T", "x")], [("T", 1.5)], [("1T", tf.float32)]]))
    return args, fault


def fuzz_metal_kernel(examples, seed_value):
    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(call=metal_kernel_call())
    def run(call):
        args, fault = call
        start_call(fault is None, faulty=fault is not None)
        try:
            if "k" not in _KERNELS:  # made inside the call so the negative control's rejection counts here
                _KERNELS["k"] = tf_metal_ops.metal_kernel("fuzz_twice", ["inp"], ["out"], """
                    uint i = thread_position_in_grid.x;
                    if (i < inp_shape[0]) out[i] = inp[i] * T(2);
                """)
            (y,) = _KERNELS["k"](**args)
            y = y.numpy()
        except Exception as e:
            expect_clean_error(e, METAL_KERNEL_ARGS, fault is None, f"{fault}: {args}")
            return
        if fault is None:
            np.testing.assert_array_equal(y, 2 * args["inputs"][0])
        returned()

    run()


FUZZERS = {
    "zero_out": fuzz_zero_out,
    "hash_grid": fuzz_hash_grid,
    "volume_render": fuzz_volume_render,
    "distortion_loss": fuzz_distortion_loss,
    "volume_render_packed": fuzz_volume_render_packed,
    "distortion_loss_packed": fuzz_distortion_loss_packed,
    "ray_march": fuzz_ray_march,
    "metal_kernel": fuzz_metal_kernel,
    "fused_mlp": fuzz_fused_mlp,
}

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("op", choices=sorted(FUZZERS))
    p.add_argument("--examples", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--inject-rejection", action="store_true",
                   help="negative control: every op call raises a clean-looking ValueError, so the run must fail")
    a = p.parse_args()
    # out-of-bounds accesses of inline kernels become clean errors (read when the kernel is created)
    os.environ.setdefault("TF_METAL_OPS_BOUNDS_CHECK", "1")
    if a.inject_rejection:
        def reject(*args, **kwargs):
            raise ValueError("injected rejection (zero_out: x, positions, densities)")

        for name in ("zero_out", "hash_grid_encode", "volume_render", "distortion_loss", "volume_render_packed",
                     "distortion_loss_packed", "ray_march", "metal_kernel", "fused_mlp"):
            setattr(tf_metal_ops, name, reject)
    FUZZERS[a.op](a.examples, a.seed)
    assert OUTCOMES["returned"] + OUTCOMES["rejected"] == OUTCOMES["calls"], OUTCOMES
    print(f"fuzz {a.op}: {OUTCOMES['calls']} calls for {a.examples} requested examples: "
          f"{OUTCOMES['returned']} returned a checked result, {OUTCOMES['rejected']} rejected cleanly "
          f"({OUTCOMES['valid_calls']} known valid, all returned; {OUTCOMES['faulty_calls']} with a fault)")
    print(json.dumps(OUTCOMES))
    sys.exit(0)
