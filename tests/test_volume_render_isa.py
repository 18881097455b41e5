"""The volume-render CPU ray loops (VolumeRender and VolumeRenderPacked, forward and gradient) are built for
x86-64-v4 (AVX-512), x86-64-v3 (AVX2) and the baseline ISA, one chosen per process; TF_METAL_OPS_VOLUME_RENDER_ISA
selects one. Each available build runs in its own subprocess, its ray-range counters
(tf_metal_ops.diagnostics.volume_render_cpu_paths) prove it was the only one that ran, and the forward outputs and
gradients of all builds must agree bit for bit (same source, -ffp-contract=off, no reassociation: the same float
operations in every lane). DistortionLoss and DistortionLossPacked have a single build (no ISA clones)."""

import numpy as np
import pytest

from support.isa_subprocess import only_ran, run_each_build, run_with_isa
from tf_metal_ops.diagnostics import VOLUME_RENDER_ISAS

# Runs forward + gradient of VolumeRender over cases chosen to reach every branch of the loops: S below, at and
# above the vector width and not a multiple of it (scalar tails), C == 3 (unrolled) and other C, no / shared /
# per-ray background, early termination on and off, tiny densities (alpha's polynomial branch), huge densities
# (exp underflow), zero-width intervals.
SCRIPT = r'''
import json, sys, numpy as np, tensorflow as tf
import tf_metal_ops as tfmo
from tf_metal_ops.diagnostics import volume_render_cpu_paths
out = {}
cases = [(1, 3, "none", 0.0), (5, 1, "shared", 0.0), (7, 3, "per_ray", 0.01), (8, 4, "shared", 0.0),
         (33, 3, "shared", 0.02), (64, 5, "none", 0.0), (129, 3, "per_ray", 0.0), (257, 2, "shared", 1e-4)]
for k, (S, C, bg, thr) in enumerate(cases):
    rng = np.random.default_rng(k)
    R = 61
    scale = rng.choice([1e-3, 0.05, 1.0, 3.0, 50.0, 1e4], size=(R, 1))
    d = (rng.uniform(0.0, 1.0, (R, S)) * scale).astype(np.float32)
    d[rng.uniform(size=(R, S)) < 0.1] = 0.0
    c = rng.uniform(0.0, 1.0, (R, S, C)).astype(np.float32)
    steps = rng.uniform(0.0, 0.3, (R, S + 1))
    steps[rng.uniform(size=steps.shape) < 0.05] = 0.0
    t = (2.0 + np.cumsum(steps, axis=1)).astype(np.float32)
    b = {"none": None, "shared": rng.uniform(size=C), "per_ray": rng.uniform(size=(R, C))}[bg]
    dens, cols, tt = tf.constant(d), tf.constant(c), tf.constant(t)
    bgt = None if b is None else tf.constant(b.astype(np.float32))
    watch = [dens, cols, tt] + ([] if bgt is None else [bgt])
    with tf.GradientTape() as tape:
        tape.watch(watch)
        res = tfmo.volume_render(dens, cols, tt, bgt, termination_threshold=thr)
        loss = sum(tf.reduce_sum(o * tf.constant(rng.standard_normal(o.shape).astype(np.float32))) for o in res)
    grads = tape.gradient(loss, watch)
    for name, v in zip(("color", "depth", "opacity", "weights"), res):
        out[f"{k}_{name}"] = v.numpy()
    for name, g in zip(("g_dens", "g_cols", "g_t", "g_bg"), grads):
        out[f"{k}_{name}"] = g.numpy()
# VolumeRenderPacked: ragged rays (0..30 samples, one longer than a 2048-sample chunk), the same variety.
for k, (C, bg, thr) in enumerate([(3, "per_ray", 0.0), (3, "shared", 0.01), (2, "none", 0.0), (5, "shared", 1e-3)]):
    rng = np.random.default_rng(100 + k)
    counts = rng.integers(0, 31, 400)
    counts[[7, 8]] = 0
    counts[200] = 2500
    R, N = len(counts), int(counts.sum())
    rs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    scale = np.repeat(rng.choice([1e-3, 0.05, 1.0, 3.0, 50.0, 1e4], size=R), counts)
    d = (rng.uniform(0.0, 1.0, N) * scale).astype(np.float32)
    d[rng.uniform(size=N) < 0.1] = 0.0
    lengths = rng.uniform(0.0, 0.3, N) * (rng.uniform(size=N) > 0.05)
    gaps = rng.uniform(0.0, 0.2, N) * (rng.uniform(size=N) < 0.3)
    ray = np.repeat(np.arange(R), counts)
    edges = np.cumsum(np.stack([gaps, lengths], 1).reshape(-1))
    base = np.concatenate([[0.0], edges])[2 * rs[:-1]][ray]
    ts, te = (2.0 + edges[0::2] - base).astype(np.float32), (2.0 + edges[1::2] - base).astype(np.float32)
    te = np.maximum(te, ts)
    c = rng.uniform(0.0, 1.0, (N, C)).astype(np.float32)
    b = {"none": None, "shared": rng.uniform(size=C), "per_ray": rng.uniform(size=(R, C))}[bg]
    xs = [tf.constant(x) for x in (d, c, ts, te)] + ([] if b is None else [tf.constant(b.astype(np.float32))])
    with tf.GradientTape() as tape:
        tape.watch(xs)
        res = tfmo.volume_render_packed(*xs[:4], rs, None if b is None else xs[4], termination_threshold=thr)
        loss = sum(tf.reduce_sum(o * tf.constant(rng.standard_normal(o.shape).astype(np.float32))) for o in res)
    for name, v in zip(("color", "depth", "opacity", "weights"), res):
        out[f"p{k}_{name}"] = v.numpy()
    for name, g in zip(("g_dens", "g_cols", "g_ts", "g_te", "g_bg"), tape.gradient(loss, xs)):
        out[f"p{k}_{name}"] = g.numpy()
np.savez(sys.argv[1], **out)
print(json.dumps(volume_render_cpu_paths()))
'''


def _run(tmp_path, isa):
    """SCRIPT with TF_METAL_OPS_VOLUME_RENDER_ISA=isa (None: unset) -> (arrays, paths, stderr)."""
    return run_with_isa(tmp_path, "TF_METAL_OPS_VOLUME_RENDER_ISA", isa, SCRIPT)


def test_every_isa_build_is_selectable_and_they_agree_bitwise(tmp_path):
    results, supported = run_each_build(tmp_path, "TF_METAL_OPS_VOLUME_RENDER_ISA", VOLUME_RENDER_ISAS, SCRIPT)
    if len(results) < 2:
        pytest.skip(f"only the default build can run here (supported: {supported}): nothing to compare")
    ref_isa = "default"
    ref = results[ref_isa]
    # VolumeRender: 8 cases x (4 outputs + 4 gradients), no g_bg in the 2 cases without background;
    # VolumeRenderPacked: 4 cases x (4 outputs + 5 gradients), no g_bg in the case without background.
    assert len(ref) == 8 * 8 - 2 + 4 * 9 - 1
    for isa, arrays in results.items():
        assert set(arrays) == set(ref), isa
        for k in ref:
            a, b = ref[k], arrays[k]
            assert a.dtype == b.dtype == np.float32 and a.shape == b.shape, (isa, k)
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), (
                f"{isa} vs {ref_isa}: {k} differs in {np.count_nonzero(a.view(np.uint32) != b.view(np.uint32))} "
                f"elements, max |diff| {np.max(np.abs(a - b))}")


def test_default_choice_is_the_best_supported_build(tmp_path):
    _, paths, err = _run(tmp_path, None)
    assert paths["requested"] is None and not paths["fell_back"]
    assert paths["selected"] == paths["supported"][-1], paths  # names are ordered default < avx2 < avx512
    assert only_ran(paths, paths["selected"]), paths


def test_unknown_isa_name_is_reported_and_falls_back_to_the_automatic_choice(tmp_path):
    _, paths, err = _run(tmp_path, "avx1024")
    assert paths["requested"] == "?" and paths["fell_back"], paths
    assert paths["selected"] == paths["supported"][-1], paths
    assert only_ran(paths, paths["selected"]), paths
    assert "TF_METAL_OPS_VOLUME_RENDER_ISA=avx1024 is not one of avx512, avx2, default, auto" in err, err[-2000:]
