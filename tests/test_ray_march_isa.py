"""The RayMarch CPU kernel has two marches of the candidate loop: the scalar one (csrc/cpu/ray_march_cpu.cc, the
reference and the non-x86 path) and an AVX2 one (csrc/cpu/ray_march_cpu_isa.h, x86-64 GCC builds), one chosen per
process; TF_METAL_OPS_RAY_MARCH_ISA=avx2|default|auto selects one. Each path runs in its own subprocess, its chunk
counters (tfmo_ray_march_cpu_paths) prove it was the only one that ran, and all outputs (t_starts, t_ends,
row_splits, ray_indices, positions) must agree bit for bit over cases that reach every branch: sparse shells (mip skips),
random, all-occupied and all-empty grids, G = 1, 2, 3, odd and even, 64 and 128, both cell lookups (the per-cell
level table, built when G^3 <= 32 R, and the bitfield + mip otherwise), cone_angle > 0, a max_samples cap that
bites, jitter on and off, direction components equal to 0, rays missing the box, per-ray near/far (some empty),
more rays than one march chunk (1024)."""

import json

import numpy as np
import pytest

from support.isa_subprocess import only_ran, run_each_build, run_with_isa

ISAS = ("default", "avx2")

SCRIPT = r'''
import ctypes, json, sys, numpy as np, tensorflow as tf
import tf_metal_ops as tfmo
from tf_metal_ops._library import native

def pack(occ):
    return np.packbits(occ.reshape(-1).astype(np.uint8), bitorder="little")

def grid_bits(kind, G, rng, lo, hi):
    n = G ** 3
    if kind == "full":
        return pack(np.ones(n, bool))
    if kind == "empty":
        return pack(np.zeros(n, bool))
    if kind == "random":
        return pack(rng.uniform(size=n) < 0.3)
    if kind == "sparse":
        return pack(rng.uniform(size=n) < 0.02)
    # "shell": cells whose centre lies at radius 0.3 .. 0.7 of the box centre (normalised)
    idx = np.arange(n)
    ijk = np.stack([idx % G, (idx // G) % G, idx // (G * G)], 1)
    x = (ijk + 0.5) / G * 2.0 - 1.0
    rad = np.linalg.norm(x, axis=1)
    return pack((rad >= 0.3) & (rad <= 0.7))

def rays(R, rng, lo, hi):
    c, h = (lo + hi) / 2, (hi - lo) / 2
    kind = np.arange(R) % 6
    o = c + h * rng.uniform(-2.5, 2.5, (R, 3))
    inside = c + h * rng.uniform(-0.9, 0.9, (R, 3))
    o[kind == 1] = inside[kind == 1]
    target = c + h * rng.uniform(-0.8, 0.8, (R, 3))
    d = target - o
    d[kind == 2] = -d[kind == 2] + rng.normal(size=(np.sum(kind == 2), 3))  # mostly away from the box: misses
    d *= rng.uniform(0.3, 3.0, (R, 1))  # not unit length
    ax = kind == 3  # one component 0, from inside the box
    o[ax] = inside[ax]
    d[ax, rng.integers(0, 3, ax.sum())] = 0.0
    two = kind == 4  # two components 0
    o[two] = inside[two]
    keep = rng.integers(0, 3, two.sum())
    dd = np.zeros((two.sum(), 3))
    dd[np.arange(two.sum()), keep] = rng.choice([-1.0, 1.0], two.sum()) * rng.uniform(0.5, 2.0, two.sum())
    d[two] = dd
    # kind 5: origins on the box faces (aimed at the box)
    face = kind == 5
    o[face, 0] = np.where(rng.uniform(size=face.sum()) < 0.5, lo[0], hi[0])
    return o.astype(np.float32), d.astype(np.float32)

class Grid:
    def __init__(self, bits, G, aabb):
        self.bits, self.resolution, self.aabb = tf.constant(bits, tf.uint8), G, aabb

cases = json.loads(sys.argv[2])
out = {}
for n, (G, kind, R, kw, nf) in enumerate(cases):
    rng = np.random.default_rng(n)
    aabb = np.array([[-1.1, -0.9, -1.3], [0.9, 1.2, 0.7]], np.float32) if n % 2 else \
        np.array([[-1, -1, -1], [1, 1, 1]], np.float32)
    lo, hi = aabb[0].astype(np.float64), aabb[1].astype(np.float64)
    o, d = rays(R, rng, lo, hi)
    bits = grid_bits(kind, G, rng, lo, hi)
    near = far = None
    if nf:
        near = rng.uniform(0.0, 1.0, R).astype(np.float32)
        far = (near + rng.uniform(-0.3, 3.0, R)).astype(np.float32)  # some far < near: no samples
    res = tfmo.ray_march(o, d, Grid(bits, G, aabb), near=near, far=far, **kw)
    for name, v in zip(res._fields, res):
        out[f"{n}_{name}"] = v.numpy()
np.savez(sys.argv[1], **out)
lib = native()
f = lib.tfmo_ray_march_cpu_paths
p_ll, p_int = ctypes.POINTER(ctypes.c_longlong), ctypes.POINTER(ctypes.c_int)
f.argtypes = [p_ll, p_int, p_int, p_int, p_int, p_int]
f.restype = None
calls = (ctypes.c_longlong * 2)()
built, supported, selected, requested, fell_back = (ctypes.c_int() for _ in range(5))
f(calls, ctypes.byref(built), ctypes.byref(supported), ctypes.byref(selected), ctypes.byref(requested),
  ctypes.byref(fell_back))
names = ("default", "avx2")
print(json.dumps({"calls": dict(zip(names, calls)), "built": [x for i, x in enumerate(names) if built.value >> i & 1],
                  "supported": [x for i, x in enumerate(names) if supported.value >> i & 1],
                  "selected": names[selected.value],
                  "requested": None if requested.value == -1 else "?" if requested.value == -2 else names[requested.value],
                  "fell_back": bool(fell_back.value)}))
'''

P = dict(step_size=0.0371, cone_angle=0.0, max_samples=1024, jitter=True, seed=3)
# (G, grid, R, march kwargs, per-ray near/far). The level table is used iff G^3 <= 32 R (and G^3 <= 2^24).
CASES = [
    (1, "full", 300, P, False),
    (1, "empty", 300, P, True),
    (2, "random", 300, dict(P, jitter=False), False),
    (3, "shell", 300, dict(P, cone_angle=0.05), True),
    (3, "random", 300, dict(P, max_samples=3), False),
    (7, "sparse", 700, dict(P, step_size=0.0123, cone_angle=0.04, seed=11), False),
    (16, "full", 500, dict(P, max_samples=3, jitter=False), True),
    (16, "empty", 500, P, False),
    (21, "shell", 2500, dict(P, step_size=0.0123), False),
    (33, "random", 3000, dict(P, cone_angle=0.02, seed=7), True),
    (64, "shell", 9000, dict(P, step_size=0.0135), False),  # the NeRF case: level table
    (64, "shell", 1500, dict(P, step_size=0.0135, jitter=False), True),  # bitfield + mip
    (64, "sparse", 8192, dict(P, max_samples=3), False),
    (65, "random", 2000, dict(P, step_size=0.1371, seed=4), False),  # long steps, bitfield + mip
    (128, "shell", 3000, dict(P, step_size=0.0068, max_samples=256), True),  # bitfield + mip
    (128, "sparse", 66000, dict(P, step_size=0.02, cone_angle=0.01), False),  # level table
]


def _run(tmp_path, isa):
    """SCRIPT with TF_METAL_OPS_RAY_MARCH_ISA=isa (None: unset) -> (arrays, paths, stderr)."""
    return run_with_isa(tmp_path, "TF_METAL_OPS_RAY_MARCH_ISA", isa, SCRIPT, json.dumps(CASES))


def test_every_path_is_selectable_and_they_agree_bitwise(tmp_path):
    results, supported = run_each_build(tmp_path, "TF_METAL_OPS_RAY_MARCH_ISA", ISAS, SCRIPT, json.dumps(CASES))
    if len(results) < 2:
        pytest.skip(f"only the scalar march can run here (supported: {supported}): nothing to compare")
    ref = results["default"]
    assert len(ref) == 5 * len(CASES)
    total = sum(len(ref[f"{n}_t_starts"]) for n in range(len(CASES)))
    assert total > 100000  # the comparison covered real work
    for n, case in enumerate(CASES):  # every non-empty grid case gives samples (else the case tests nothing)
        assert (len(ref[f"{n}_t_starts"]) > 0) == (case[1] != "empty"), (n, case)
    for isa, arrays in results.items():
        assert set(arrays) == set(ref), isa
        for k in ref:
            a, b = ref[k], arrays[k]
            assert a.dtype == b.dtype and a.shape == b.shape, (isa, k, a.shape, b.shape)
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), (
                f"{isa} vs default: {k} differs in {np.count_nonzero(a.view(np.uint32) != b.view(np.uint32))} "
                f"elements")


def test_default_choice_is_the_best_supported_path(tmp_path):
    _, paths, _ = _run(tmp_path, None)
    assert paths["requested"] is None and not paths["fell_back"]
    assert paths["selected"] == paths["supported"][-1], paths  # names are ordered default < avx2
    assert only_ran(paths, paths["selected"]), paths


def test_unknown_path_name_is_reported_and_falls_back_to_the_automatic_choice(tmp_path):
    _, paths, err = _run(tmp_path, "avx1024")
    assert paths["requested"] == "?" and paths["fell_back"], paths
    assert paths["selected"] == paths["supported"][-1], paths
    assert only_ran(paths, paths["selected"]), paths
    assert "TF_METAL_OPS_RAY_MARCH_ISA=avx1024 is not one of avx2, default, auto" in err, err[-2000:]
