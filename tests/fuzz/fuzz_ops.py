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

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import tf_metal_ops  # noqa: E402

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


FUZZERS = {"zero_out": fuzz_zero_out}

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("op", choices=sorted(FUZZERS))
    p.add_argument("--examples", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    FUZZERS[a.op](a.examples, a.seed)
    print(f"fuzz {a.op}: {a.examples} examples passed")
    sys.exit(0)
