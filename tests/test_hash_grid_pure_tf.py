"""The pure-TF hash grid against the NumPy float64 reference (forward and both gradients) over randomized
configurations, plus a scalar per-point implementation (tcnn's index loop, Python ints) that checks both.

Tolerances (params uniform in [-1, 1], dy standard normal):
  forward, float32 params: |pure_tf - reference| <= 2e-6 (float32 accumulation of <= 16 corner terms);
  forward and d/dparams, float16 params: rtol 2^-10 (one float16 rounding of a float32 result) + a small atol;
  d/dparams: atol 2e-5, rtol 1e-5;  d/dpositions: rtol 1e-4 + atol 1e-5 * max|reference| (terms scale with the
  level scale, up to ~10^3 here, and cancel).
Both compute ``pos = fma(scale, x, 0.5)`` with one float32 rounding (the convention, as tcnn's ``fmaf``: the reference
with ``fma32``, pure TF exactly in float64 with round-to-odd, eagerly and under XLA), so both pick the same cells and
the same frac; the scalar oracle rounds the exact rational value of ``x*scale + 0.5`` (a third construction).
"""

import inspect
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import tensorflow as tf

from tf_metal_ops.hash_grid import HashGridConfig, pure_tf, reference
from tf_metal_ops.hash_grid.config import HASH_PRIMES, MAX_BASE

from support import hash_grid_cases
from support.hash_grid_cases import GRID_TYPES, INTERPOLATIONS, random_positions, seeded


def random_config(rng, d=None, grid_type=None, interpolation=None):
    return hash_grid_cases.random_config(rng, d, grid_type, interpolation, max_entries=2**20)  # small dense tables


def random_max_level(rng, cfg):
    kind = rng.integers(0, 4)
    if kind == 0:
        return None
    if kind == 1:
        return int(rng.integers(0, cfg.n_levels + 2))
    return float(rng.choice([0.0, 0.3, 0.5, 0.77, 1.0, 2.0]))


# ---- a third, scalar implementation: tcnn's per-point loop with Python ints ----------------------------------
def round_f32(v: Fraction) -> float:
    """The float32 nearest to the rational v (ties to even), by comparing the candidates exactly."""
    f = np.float32(float(v))
    cands = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    return float(min(cands, key=lambda c: (abs(Fraction(float(c)) - v), int(np.float32(c).view(np.uint32)) & 1)))


def tcnn_grid_index(c, cfg, level):
    """tcnn's current grid_index (common_device.h) with Python ints and uint32 masks."""
    d, res, size = cfg.n_input_dims, cfg.resolution(level), cfg.level_sizes[level]
    idx, stride = 0, 1
    if res <= MAX_BASE[d]:
        for i in range(d):
            idx = (idx + c[i] * stride) % 2**32
            stride = stride * res % 2**32
    else:
        stride = 0xFFFFFFFF
    if cfg.grid_type == "hash" and size < stride:
        idx = 0
        for i in range(d):
            idx ^= (c[i] * HASH_PRIMES[i]) % 2**32
    return idx % size


def scalar_encode(x, table, cfg, max_level=None):
    d, f = cfg.n_input_dims, cfg.n_features_per_level
    n_active = reference.n_active_levels(cfg.n_levels, max_level)
    out = np.zeros((len(x), cfg.n_output_dims))
    for n, point in enumerate(x):
        xs = [min(max(0.0 if math.isnan(v) else float(v), 0.0), 1.0) for v in point]
        for level in range(n_active):
            scale = Fraction(float(np.float32(cfg.scale(level))))
            pos = [round_f32(scale * Fraction(v) + Fraction(1, 2)) for v in xs]  # fmaf: one rounding
            grid = [math.floor(p) for p in pos]
            frac = [p - g for p, g in zip(pos, grid)]
            if cfg.interpolation == "smoothstep":
                frac = [t * t * (3 - 2 * t) for t in frac]
            bit_sets = [(0,) * d] if cfg.interpolation == "nearest" else itertools.product((0, 1), repeat=d)
            for bits in bit_sets:
                idx = tcnn_grid_index([g + b for g, b in zip(grid, bits)], cfg, level)
                w = 1.0
                if cfg.interpolation != "nearest":
                    for b, t in zip(bits, frac):
                        w *= t if b else 1 - t
                out[n, level * f : (level + 1) * f] += w * table[cfg.offsets[level] + idx]
    return out


@pytest.mark.parametrize("grid_type", GRID_TYPES)
@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
@pytest.mark.parametrize("d", [1, 2, 3, 4])
def test_scalar_oracle(d, grid_type, interpolation):
    rng = seeded("scalar", d, grid_type, interpolation)
    cfg = random_config(rng, d, grid_type, interpolation)
    x = random_positions(rng, 24, d)
    table = rng.uniform(-1, 1, cfg.params_shape)
    max_level = random_max_level(rng, cfg)
    expected = scalar_encode(x, table, cfg, max_level)
    np.testing.assert_allclose(reference.encode(x, table, cfg, max_level=max_level), expected, rtol=0, atol=1e-12)
    got = pure_tf.encode(x, table.astype(np.float32), cfg, max_level=max_level).numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-6)


def test_hash_by_hand():
    # D=2, T=8, N_min=4: scale 3, resolution 4 (16 > 8: hashed). x=(0.5, 0.5): pos 2.0 -> grid (2, 2);
    # hash = 2 ^ (2 * 2654435761 mod 2^32) = 2 ^ 1013904226 = 1013904224 -> & 7 = 0. x=(0, 1): grid (0, 3):
    # 3 * 2654435761 mod 2^32 = 3668339987 -> & 7 = 3.
    cfg = HashGridConfig(2, n_levels=1, n_features_per_level=1, log2_hashmap_size=3, base_resolution=4,
                         interpolation="nearest")
    assert cfg.hashed_levels == (True,)
    table = np.arange(8, dtype=np.float32)[:, None] + 10
    x = np.array([[0.5, 0.5], [0.0, 1.0]], np.float32)
    np.testing.assert_array_equal(reference.encode(x, table, cfg), [[10], [13]])
    np.testing.assert_array_equal(pure_tf.encode(x, table, cfg).numpy(), [[10], [13]])


CASES = [(d, gt, interp) for d in (1, 2, 3, 4) for gt in GRID_TYPES for interp in INTERPOLATIONS]


@pytest.mark.parametrize("d, grid_type, interpolation", CASES)
def test_forward_and_gradients(d, grid_type, interpolation):
    rng = seeded("fwd", d, grid_type, interpolation)
    for _ in range(2):
        cfg = random_config(rng, d, grid_type, interpolation)
        n = 64
        x = random_positions(rng, n, d)
        p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
        dy = rng.standard_normal((n, cfg.n_output_dims)).astype(np.float32)
        max_level = random_max_level(rng, cfg)
        xt, pt = tf.constant(x), tf.constant(p)
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([xt, pt])
            y = pure_tf.encode(xt, pt, cfg, max_level=max_level)
            loss = tf.reduce_sum(y * dy)
        gx, gp = tape.gradient(loss, [xt, pt], unconnected_gradients="zero")
        assert y.shape == (n, cfg.n_output_dims) and y.dtype == tf.float32
        np.testing.assert_allclose(y.numpy(), reference.encode(x, p, cfg, max_level=max_level), rtol=0, atol=2e-6)
        rgp = reference.grad_params(x, p, dy, cfg, max_level=max_level)
        np.testing.assert_allclose(tf.convert_to_tensor(gp).numpy(), rgp, rtol=1e-5, atol=2e-5)
        rgx = reference.grad_positions(x, p, dy, cfg, max_level=max_level)
        np.testing.assert_allclose(gx.numpy(), rgx, rtol=1e-4, atol=1e-5 * max(np.abs(rgx).max(), 1e-3))
        # the out-of-range rows have zero position gradient; in-range ones generally do not
        assert gx.numpy()[0, 0] == 0 and gx.numpy()[1, -1] == 0 and gx.numpy()[2, 0] == 0
        n_active = reference.n_active_levels(cfg.n_levels, max_level)
        if interpolation != "nearest" and n_active > 0 and max(cfg.scales[:n_active]) > 0:
            assert np.abs(rgx[6:]).max() > 0  # (scale 0, e.g. base_resolution 1 at level 0, is constant)


@pytest.mark.parametrize("seed", range(12))
def test_random_configs_float16(seed):
    rng = seeded("f16", seed)
    cfg = random_config(rng)
    x = random_positions(rng, 48, cfg.n_input_dims)
    p16 = rng.uniform(-1, 1, cfg.params_shape).astype(np.float16)
    y = pure_tf.encode(x, p16, cfg)
    assert y.dtype == tf.float16
    ref = reference.encode(x, p16, cfg)
    np.testing.assert_allclose(y.numpy().astype(np.float64), ref, rtol=2**-10, atol=1e-6)
    dy = rng.standard_normal((48, cfg.n_output_dims)).astype(np.float16)
    pt = tf.constant(p16)
    with tf.GradientTape() as tape:
        tape.watch(pt)
        loss = tf.reduce_sum(tf.cast(pure_tf.encode(x, pt, cfg), tf.float32) * dy)
    gp = tf.convert_to_tensor(tape.gradient(loss, pt))
    assert gp.dtype == tf.float16
    rgp = reference.grad_params(x, p16, dy, cfg)
    # accumulated in float32 and rounded to float16 once
    np.testing.assert_allclose(gp.numpy().astype(np.float64), rgp, rtol=2**-10, atol=1e-4)


def test_float64_params():
    rng = seeded("f64")
    cfg = random_config(rng, 3, "hash", "smoothstep")
    x = random_positions(rng, 32, 3)
    p = rng.uniform(-1, 1, cfg.params_shape)
    y = pure_tf.encode(x, p, cfg)
    assert y.dtype == tf.float64
    np.testing.assert_allclose(y.numpy(), reference.encode(x, p, cfg), rtol=0, atol=1e-12)


@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
def test_jit_compile(interpolation):
    """pure_tf works inside tf.function(jit_compile=True), forward and gradients, on a default-sized config."""
    rng = seeded("jit", interpolation)
    cfg = HashGridConfig(3, n_levels=8, per_level_scale=1.5, log2_hashmap_size=14, interpolation=interpolation)
    x = random_positions(rng, 500, 3)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    dy = rng.standard_normal((500, cfg.n_output_dims)).astype(np.float32)

    @tf.function(jit_compile=True)
    def fwd_bwd(x, p):
        with tf.GradientTape() as tape:
            tape.watch([x, p])
            y = pure_tf.encode(x, p, cfg)
            loss = tf.reduce_sum(y * dy)
        gx, gp = tape.gradient(loss, [x, p], unconnected_gradients="zero")
        return y, gx, tf.convert_to_tensor(gp)

    y, gx, gp = fwd_bwd(tf.constant(x), tf.constant(p))
    np.testing.assert_allclose(y.numpy(), reference.encode(x, p, cfg, pos_rounding="fma"), rtol=0, atol=2e-6)
    np.testing.assert_allclose(gp.numpy(), reference.grad_params(x, p, dy, cfg, pos_rounding="fma"), atol=2e-5)
    rgx = reference.grad_positions(x, p, dy, cfg, pos_rounding="fma")
    np.testing.assert_allclose(gx.numpy(), rgx, rtol=1e-4, atol=1e-5 * max(np.abs(rgx).max(), 1e-3))


def test_max_level_forms():
    rng = seeded("max_level")
    cfg = HashGridConfig(2, n_levels=6, log2_hashmap_size=8, per_level_scale=1.7)
    x = random_positions(rng, 40, 2)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    full = pure_tf.encode(x, p, cfg).numpy()
    f = cfg.n_features_per_level
    for max_level, n_active in [(0, 0), (2, 2), (6, 6), (99, 6), (-1, 0), (0.5, 4), (1.0, 6), (0.34, 3), (0.0, 1)]:
        assert reference.n_active_levels(6, max_level) == n_active, max_level
        for form in (max_level, tf.constant(max_level)):
            y = pure_tf.encode(x, p, cfg, max_level=form).numpy()
            np.testing.assert_array_equal(y[:, n_active * f :], 0)
            np.testing.assert_allclose(y[:, : n_active * f], full[:, : n_active * f], rtol=0, atol=1e-7)

    # a tensor max_level inside one tf.function: no retrace, no gradient into inactive levels
    @tf.function
    def grads(k):
        pt = tf.constant(p)
        with tf.GradientTape() as tape:
            tape.watch(pt)
            loss = tf.reduce_sum(pure_tf.encode(x, pt, cfg, max_level=k))
        return tf.convert_to_tensor(tape.gradient(loss, pt))

    g = grads(tf.constant(2)).numpy()
    off = cfg.offsets
    assert np.abs(g[: off[2]]).sum() > 0 and np.all(g[off[2] :] == 0)
    np.testing.assert_allclose(g, reference.grad_params(x, p, np.ones((40, 12)), cfg, max_level=2), atol=2e-5)


def test_empty_batch_and_unknown_batch():
    cfg = HashGridConfig(3, n_levels=4, log2_hashmap_size=10)
    p = np.zeros(cfg.params_shape, np.float32)
    assert pure_tf.encode(np.zeros((0, 3), np.float32), p, cfg).shape == (0, 8)
    fn = tf.function(lambda x: pure_tf.encode(x, p, cfg), input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    assert fn.get_concrete_function().structured_outputs.shape.as_list() == [None, 8]
    assert fn(tf.zeros([5, 3])).shape == (5, 8)


def test_bad_inputs():
    cfg = HashGridConfig(3, n_levels=4, log2_hashmap_size=10)
    p = np.zeros(cfg.params_shape, np.float32)
    with pytest.raises(ValueError, match="positions"):
        pure_tf.encode(np.zeros((4, 2), np.float32), p, cfg)
    with pytest.raises(ValueError, match="params"):
        pure_tf.encode(np.zeros((4, 3), np.float32), p[1:], cfg)
    with pytest.raises(TypeError, match="float32"):
        pure_tf.encode(np.zeros((4, 3), np.float64), p, cfg)
    with pytest.raises(ValueError, match="n_features_per_level"):
        pure_tf.hash_grid_encode(np.zeros((4, 3), np.float32), p, n_features_per_level=3)


def test_hash_grid_encode_wrapper_matches_config_path():
    rng = seeded("wrapper")
    x = random_positions(rng, 20, 3)
    kwargs = dict(n_levels=5, n_features_per_level=4, log2_hashmap_size=9, base_resolution=5,
                  per_level_scale=1.6, grid_type="tiled", interpolation="smoothstep")
    cfg = HashGridConfig(3, **kwargs)
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    np.testing.assert_array_equal(pure_tf.hash_grid_encode(x, p, **kwargs, max_level=3).numpy(),
                                  pure_tf.encode(x, p, cfg, max_level=3).numpy())


def test_signature_matches_op_wrapper():
    """pure_tf.hash_grid_encode is a drop-in for the op wrapper: same parameters and defaults."""
    try:
        from tf_metal_ops.hash_grid import ops
    except ImportError:
        pytest.skip("tf_metal_ops/hash_grid/ops.py does not exist yet")
    params = lambda f: [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]
    assert params(pure_tf.hash_grid_encode) == params(ops.hash_grid_encode)
