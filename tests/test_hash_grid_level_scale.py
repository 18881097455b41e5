"""The level scale exactly as tiny-cuda-nn computes it: ``exp2f(float(l) * log2f(b)) * N_min - 1.0f``, each step
rounded to float32 (log2 and exp2 correctly rounded). Checked bitwise against an independent float32 reference
(the exact log2/exp2 from ``decimal`` at 60 digits, rounded to float32; the products and the difference in NumPy
float32 arithmetic), for HashGridConfig (Python: pure TF and the NumPy reference use it) and the host level table
of csrc/shared/hash_grid_math.h (the CPU and Metal kernels use it), over many (b, N_min, L)."""

import math
import os
import subprocess
from decimal import Decimal, localcontext

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.paths import REPO_ROOT
from tf_metal_ops.hash_grid import HashGridConfig
from tf_metal_ops.hash_grid import config as config_mod
from tf_metal_ops.hash_grid.config import MAX_SCALE

F32 = np.float32


def _round_f32(d):
    """The float32 nearest to the Decimal ``d`` (the nearest of three neighbours: no double rounding)."""
    c = F32(float(d))
    cands = (np.nextafter(c, F32(-np.inf)), c, np.nextafter(c, F32(np.inf)))
    return min(cands, key=lambda f: abs(Decimal(float(f)) - d))


def exact_log2_f32(b):
    with localcontext() as ctx:
        ctx.prec = 60
        return _round_f32(Decimal(float(b)).ln() / Decimal(2).ln())


def exact_exp2_f32(x):
    with localcontext() as ctx:
        ctx.prec = 60
        return _round_f32((Decimal(float(x)) * Decimal(2).ln()).exp())


def reference_scales(b, nmin, n_levels):
    """tcnn's float32 steps, independently: log2f, float32 product, exp2f (exact values rounded), float32 * and -."""
    log2_b = exact_log2_f32(F32(b))
    out = []
    for level in range(n_levels):
        x = F32(level) * log2_b
        out.append(float(exact_exp2_f32(x) * F32(nmin) - F32(1.0)))
    return out


def double_scales(b, nmin, n_levels):
    """The package's previous sequence: double precision, rounded once at the end."""
    return [float(F32(2.0 ** (level * math.log2(float(F32(b)))) * nmin - 1.0)) for level in range(n_levels)]


def f32_bits(v):
    return int(np.asarray(v, np.float32).view(np.int32))


# (b, N_min, L) with a finest scale <= 2^24 (the op's bound); b a float32 in [1, 2.5] as the op's attr is float32
configs = st.tuples(st.floats(1.0, 2.5, width=32), st.integers(1, 512), st.integers(1, 32)).filter(
    lambda c: c[1] * float(c[0]) ** (c[2] - 1) < 0.99 * MAX_SCALE)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(configs)
def test_config_scales_equal_float32_reference(c):
    b, nmin, n_levels = c
    cfg = HashGridConfig(3, n_levels=n_levels, base_resolution=nmin, per_level_scale=b)
    ref = reference_scales(b, nmin, n_levels)
    assert [f32_bits(s) for s in cfg.scales] == [f32_bits(s) for s in ref]
    assert cfg.resolutions == tuple(int(math.ceil(s)) + 1 for s in ref)


# The float32 arguments in range (x in [0, 24.5], b in [1, 2^24 + 2]) whose exact 2^x / log2 b lies within 4 double
# ulps of a midpoint between float32 values (exhaustive search: dev/check_level_scale_rounding.py); at
# 0x1.853a6ep-9, glibc's double exp2 is exactly the midpoint and rounds to the wrong float.
HARD_EXP2 = [float.fromhex(v) for v in ("0x1.853a6ep-9", "0x1.0f0af8p-11", "0x1.05535ap-7", "0x1.0f39eep-18")]
HARD_LOG2 = [float.fromhex("0x1.40f572p+1")]


def test_hard_cases_and_random_arguments_are_correctly_rounded():
    """The tables of arguments whose exp2/log2 lies within 4 double ulps of a float32 midpoint hold the exactly
    rounded values; elsewhere the libm value rounded to float is exact too (random arguments in range)."""
    assert sorted(config_mod._EXP2_HARD) == sorted(HARD_EXP2) and list(config_mod._LOG2_HARD) == HARD_LOG2
    for x in HARD_EXP2:
        assert F32(config_mod._exp2_f32(x)) == exact_exp2_f32(x), x.hex()
    for b in HARD_LOG2:
        assert F32(config_mod._log2_f32(b)) == exact_log2_f32(b), b.hex()
    rng = np.random.default_rng(25)
    xs = np.concatenate([rng.uniform(0.0, 24.5, 1500), 2.0 ** rng.uniform(-30, 0, 1500)]).astype(np.float32)
    for x in xs:
        assert F32(config_mod._exp2_f32(float(x))) == exact_exp2_f32(x), float(x).hex()
    bs = np.concatenate([rng.uniform(1.0, 2.5, 1000), 2.0 ** rng.uniform(0, 24, 500)]).astype(np.float32)
    for b in bs:
        assert F32(config_mod._log2_f32(float(b))) == exact_log2_f32(b), float(b).hex()


def test_the_double_sequence_differs():
    """The previous double-precision sequence is several ulps off tcnn's for common b (so the test above would
    catch a return to it), and for the SDF example's config its finest resolution differs (385 vs 384)."""
    worst = max(abs(f32_bits(a) - f32_bits(r)) for a, r in zip(double_scales(1.5, 16, 16), reference_scales(1.5, 16, 16)))
    assert worst >= 4
    b = config_mod.per_level_scale_from_finest_resolution(8, 384, 12)
    cfg = HashGridConfig(3, n_levels=12, log2_hashmap_size=16, base_resolution=8, per_level_scale=b)
    old = double_scales(b, 8, 12)
    assert int(math.ceil(old[11])) + 1 == 385 and cfg.resolutions[11] == 384
    assert cfg.level_sizes[11] == 2**16  # hashed either way: the table layout is unchanged


# ---- the C++ host level table (csrc/shared/hash_grid_math.h) ------------------------------------------------
@pytest.fixture(scope="module")
def level_table_exe(clang16, tmp_path_factory):
    exe = tmp_path_factory.mktemp("level_scale") / "level_scale_driver"
    subprocess.run([clang16, "-std=c++17", "-O2", "-ffp-contract=fast", "-I", os.path.join(REPO_ROOT, "csrc"),
                    os.path.join(REPO_ROOT, "tests", "native", "level_scale_driver.cc"), "-o", str(exe)], check=True)
    return str(exe)


def host_tables(exe, cases):
    """cases: (dims, n_levels, log2_hashmap_size, base_resolution, b, grid_type) -> per case (total, levels)."""
    grid_ids = {"hash": 0, "dense": 1, "tiled": 2}
    text = "".join(f"t {d} {n} {t} {m} {float(F32(b)).hex()} {grid_ids[g]}\n" for d, n, t, m, b, g in cases)
    run = subprocess.run([exe], input=text, capture_output=True, text=True, timeout=60, check=True)
    out = []
    for line in run.stdout.splitlines():
        total, *levels = line.split()
        out.append((int(total), [(float.fromhex(s), int(r), int(z), int(o))
                                 for s, r, z, o in (lv.split(":") for lv in levels)]))
    assert len(out) == len(cases)
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.filter_too_much,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(configs, st.integers(1, 4), st.integers(4, 20), st.sampled_from(["hash", "tiled"])),
                min_size=40, max_size=40))
def test_host_level_table_equals_reference(level_table_exe, drawn):
    cases = [(d, n, t, m, b, g) for (b, m, n), d, t, g in drawn]
    for (d, n, t, m, b, g), (total, levels) in zip(cases, host_tables(level_table_exe, cases)):
        kw = dict(n_levels=n, log2_hashmap_size=t, base_resolution=m, per_level_scale=b, grid_type=g,
                  n_features_per_level=1)
        if total < 0:  # the rows overflow int32: the C++ table stops there, the config refuses it
            with pytest.raises(ValueError, match="table entries"):
                HashGridConfig(d, **kw)
            continue
        ref = reference_scales(b, m, n)
        assert [f32_bits(s) for s, _, _, _ in levels] == [f32_bits(s) for s in ref], (d, n, t, m, b, g)
        cfg = HashGridConfig(d, **kw)
        assert [r for _, r, _, _ in levels] == list(cfg.resolutions)
        assert [z for _, _, z, _ in levels] == list(cfg.level_sizes)
        assert [o for _, _, _, o in levels] == list(cfg.offsets[:-1]) and total == cfg.total_entries


def test_host_hard_arguments(level_table_exe):
    """The C++ exp2/log2 give the exactly rounded values at the hard arguments (and at random ones), and the level
    table of b = the log2 hard argument uses it."""
    rng = np.random.default_rng(2525)
    xs = HARD_EXP2 + [float(v) for v in rng.uniform(0.0, 24.5, 300).astype(np.float32)]
    bs = HARD_LOG2 + [float(v) for v in rng.uniform(1.0, 2.5, 300).astype(np.float32)]
    text = "".join(f"e {x.hex()}\n" for x in xs) + "".join(f"l {b.hex()}\n" for b in bs)
    run = subprocess.run([level_table_exe], input=text, capture_output=True, text=True, timeout=60, check=True)
    got = [float.fromhex(v) for v in run.stdout.split()]
    assert got == [float(exact_exp2_f32(x)) for x in xs] + [float(exact_log2_f32(b)) for b in bs]
    (b_hard,) = HARD_LOG2
    (_, levels), = host_tables(level_table_exe, [(3, 8, 19, 16, b_hard, "hash")])
    assert [f32_bits(s) for s, _, _, _ in levels] == [f32_bits(s) for s in reference_scales(b_hard, 16, 8)]
