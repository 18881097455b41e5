"""Property-based fuzzing of the public ops, one op per process (run by tests/test_fuzz.py in a subprocess, so a
hard crash fails the test instead of killing pytest).

    python tests/fuzz/fuzz_ops.py OP --examples 1000 [--seed 0]

Every generated call must either return a documented result (checked here) or raise ValueError (wrapper) /
tf.errors.InvalidArgumentError (kernel) with a message naming the offending argument. Anything else fails.
"""

import argparse
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


def expect_clean_error(exc, names):
    """A raised error is fine when it is of an expected class and its message names an argument."""
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
        try:
            y = tf_metal_ops.zero_out(x).numpy()
        except Exception as e:
            assert x.dtype.name not in ("int32", "int64", "float32", "float16"), f"{x.dtype} rejected: {e}"
            expect_clean_error(e, ["zero_out: x"])
            return
        assert y.shape == x.shape and y.dtype == x.dtype
        expected = np.zeros_like(x)
        if x.size:
            expected.reshape(-1)[0] = x.reshape(-1)[0]
        np.testing.assert_array_equal(y, expected)

    run()


@st.composite
def ray_batch(draw):
    """Mostly well-formed render inputs with one thing at a time possibly wrong."""
    r, s, c = draw(st.integers(0, 5)), draw(st.integers(0, 6)), draw(st.integers(0, 4))
    shapes = {"densities": [r, s], "colors": [r, s, c], "t": [r, s + 1]}
    broken = draw(st.sampled_from([None, "densities", "colors", "t"]))
    if broken:  # wrong rank or a wrong dimension
        shape = list(shapes[broken])
        if draw(st.booleans()):
            shape = shape[:-1] if len(shape) > 1 else shape + [2]
        else:
            i = draw(st.integers(0, len(shape) - 1))
            shape[i] += draw(st.sampled_from([-1, 1, 3]))
        shapes[broken] = [max(d, 0) for d in shape]
    dtype = draw(st.sampled_from(["float32"] * 6 + ["float64", "float16", "int32"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    density_scale = draw(st.sampled_from([0.0, 1.0, 1e4, 1e38]))
    out = {
        "densities": (rng.random(shapes["densities"]) * density_scale).astype(dtype),
        "colors": rng.random(shapes["colors"]).astype(dtype),
        "t": np.sort(rng.uniform(0, draw(st.sampled_from([1.0, 1e6])), shapes["t"]), axis=-1).astype(dtype),
    }
    special = draw(st.sampled_from([None, "nan", "inf", "negative", "unsorted"]))
    if dtype == "int32" and special in ("nan", "inf"):
        special = None
    for name in ("densities", "t"):
        a = out[name]
        if a.size and special and draw(st.booleans()):
            flat = a.reshape(-1)
            flat[draw(st.integers(0, flat.size - 1))] = {
                "nan": np.nan, "inf": np.inf, "negative": -1.0, "unsorted": -1e3}[special]
    bg = draw(st.sampled_from([None, "shared", "per_ray", "bad"]))
    if bg == "shared":
        out["background"] = rng.random([c]).astype(np.float32)
    elif bg == "per_ray":
        out["background"] = rng.random([r, c]).astype(np.float32)
    elif bg == "bad":
        out["background"] = rng.random([c + 1, 2, 1]).astype(np.float32)
    return out


RENDER_ARGS = ["densities", "colors", r"\bt\b", "background", "termination_threshold", "weights"]


def fuzz_volume_render(examples, seed_value):
    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(b=ray_batch(), thr=st.sampled_from([0.0, 1e-4, 0.5, 1.0, -0.1, 2.0, float("nan")]))
    def run(b, thr):
        try:
            out = tf_metal_ops.volume_render(b["densities"], b["colors"], b["t"], b.get("background"),
                                             termination_threshold=thr)
        except Exception as e:
            expect_clean_error(e, RENDER_ARGS)
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

    run()


def fuzz_distortion_loss(examples, seed_value):
    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(b=ray_batch())
    def run(b):
        w, t = b["densities"], b["t"]
        try:
            loss = tf_metal_ops.distortion_loss(w, t)
        except Exception as e:
            expect_clean_error(e, RENDER_ARGS)
            return
        assert loss.shape == (w.shape[0],)
        # Finite inputs of moderate size give a finite loss (NaN/inf propagate, as in TF's own ops).
        if np.isfinite(w).all() and np.isfinite(t).all() and np.abs(w).max(initial=0) <= 1e4 \
                and np.abs(t).max(initial=0) <= 1e6:
            assert np.isfinite(loss.numpy()).all()

    run()


FUZZERS = {
    "zero_out": fuzz_zero_out,
    "volume_render": fuzz_volume_render,
    "distortion_loss": fuzz_distortion_loss,
}

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("op", choices=sorted(FUZZERS))
    p.add_argument("--examples", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    FUZZERS[a.op](a.examples, a.seed)
    print(f"fuzz {a.op}: {a.examples} examples passed")
    sys.exit(0)
