"""Checks of atomic counting on the emulated GPU (tf_metal_ops.emulated_gpu.count_atomics), run in a subprocess by
tests/test_emulated_gpu_atomics.py, under TF_METAL_OPS_EMULATED_GPU=1 and TF_METAL_OPS_EMULATED_GPU_MSL=3.0 or 2.4:

    cd tests && TF_METAL_OPS_EMULATED_GPU=1 python -m support.emulated_gpu_atomic_checks CHECK

The hash-grid check asserts what holds for any correct table-gradient kernel, so that it keeps holding when the
kernels aggregate before their atomics: per level, no atomics on the rows of inactive levels; at least F atomics per
distinct row the level's points touch (each contribution reaches its row) and at most one per point, corner and
feature (MSL 3.0, atomic_float); at MSL 2.4 the fixed-point sums' integer atomics (at most two per term, none for a
term that rounds to 0); no CAS loop at either version; the gradient equals the CPU op's (rtol 1e-4, atol 1e-5:
another order of the sums). Its last line carries the per-level counts and digests of the gradients: the MSL 2.4
default equals MSL 3.0's deterministic=True bit for bit (the same fixed-point computation).
"""

from __future__ import annotations

import ctypes
import json
import os

os.environ.setdefault("TF_METAL_OPS_EMULATED_GPU", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_metal_ops as t  # noqa: E402
from tf_metal_ops import emulated_gpu  # noqa: E402
from tf_metal_ops.hash_grid import HashGridConfig, reference  # noqa: E402

from support.gpu_check_runner import collect, main  # noqa: E402

MSL = os.environ.get("TF_METAL_OPS_EMULATED_GPU_MSL", "3.0") or "3.0"
FIELDS = ("rmw", "cas", "cas_failed", "load", "store")


def acc_levels(launches, n_parts, param):
    """Per part of buffer parameter ``param`` (the ``split`` given to count_atomics), the counts summed over the
    launches that bind it."""
    levels = [dict.fromkeys(FIELDS, 0) for _ in range(n_parts)]
    seen = 0
    for r in launches:
        assert r["counted"], r
        for b in r["buffers"]:
            if b["param"] != param:
                continue
            seen += 1
            assert len(b["parts"]) == n_parts, b
            assert sum(p["rmw"] + p["cas"] for p in b["parts"]) == b["total"]["rmw"] + b["total"]["cas"]
            for lv, part in zip(levels, b["parts"]):
                for f in FIELDS:
                    lv[f] += part[f]
    assert seen, [r["kernel"] for r in launches]
    return levels


def check_hash_grid_levels():
    """At MSL 3.0 the table gradients add with atomic_float into ``acc``; at MSL 2.4 (no atomic_float: its float
    adds would be CAS loops) they are fixed-point sums with integer atomics into ``words`` (csrc/gpu/hash_grid_gpu.cc
    FixedPoint), with no CAS loop at all. The last line: the per-level counts and a digest of the default gradients
    (and at MSL 3.0 of the deterministic=True ones), which the test compares across the versions."""
    import hashlib

    cfg = HashGridConfig(3, n_levels=6, n_features_per_level=2, log2_hashmap_size=11, base_resolution=4,
                         per_level_scale=1.7)
    n, active = 3000, 4
    rng = np.random.default_rng(0)
    x = rng.random((n, 3), dtype=np.float32)
    x[:64] = x[0]  # a SIMD group of identical points: many adds to the same rows
    p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    dy = rng.standard_normal((n, cfg.n_output_dims)).astype(np.float32)
    ddx = rng.standard_normal((n, 3)).astype(np.float32)
    kw = dict(cfg.op_kwargs(), max_level=active)
    F, corners = cfg.n_features_per_level, 8
    fixed = MSL == "2.4"
    # float sums: acc [rows * F] float; fixed point: words [2 * rows * F] (low, high word per value), then flags
    param = "words" if fixed else "acc"
    split = {param: [o * F * 8 for o in cfg.offsets] if fixed else [o * F * 4 for o in cfg.offsets[:-1]]}

    def run(device, count, deterministic=None):
        with tf.device(device):
            xt, pt, dyt, ddxt = (tf.constant(a) for a in (x, p, dy, ddx))
            with tf.GradientTape() as outer:
                outer.watch(pt)
                with tf.GradientTape(persistent=True) as inner:
                    inner.watch([xt, pt])
                    y = t.hash_grid_encode(xt, pt, deterministic=deterministic, **kw)
                gx = inner.gradient(y, xt, output_gradients=dyt)
                loss = tf.reduce_sum(gx * ddxt)
            if not count:
                return inner.gradient(y, pt, output_gradients=dyt).numpy(), outer.gradient(loss, pt).numpy(), None
            emulated_gpu.synchronize()
            with emulated_gpu.count_atomics(split=split) as first:
                g1 = inner.gradient(y, pt, output_gradients=dyt)
            with emulated_gpu.count_atomics(split=split) as second:
                g2 = outer.gradient(loss, pt)
            return g1.numpy(), g2.numpy(), (first.launches, second.launches)

    def digest(*arrays):
        h = hashlib.sha256()
        for a in arrays:
            h.update(a.tobytes())
        return h.hexdigest()[:16]

    g1, g2, (first, second) = run("/GPU:0", True)
    c1, c2, _ = run("/CPU:0", False)
    # Sums in another order than the CPU's (atomics, SIMD-group run sums) or fixed point (each term within 2^-31 of
    # the level's bound): float32 rounding relative to the largest entry, which the entries near zero inherit.
    np.testing.assert_allclose(g1, c1, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(c1).max())))
    np.testing.assert_allclose(g2, c2, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(c2).max())))
    kind = "_det" if fixed else ""
    kernels1, kernels2 = {r["kernel"] for r in first}, {r["kernel"] for r in second}
    # D=3, F=2, linear: the scatters of that configuration (csrc/gpu/hash_grid_gpu.cc ScatterKernel)
    assert f"hash_grid_grad_params{kind}_d3f2_float32" in kernels1, kernels1
    assert f"hash_grid_grad2_params{kind}_d3f2_float32" in kernels2, kernels2
    assert ("hash_grid_fixed_to_float32" in kernels1) == fixed and ("hash_grid_fill_zero" in kernels1) != fixed

    distinct = [len(np.unique(np.concatenate([r for r, _, _ in reference.level_corners(x, cfg, lv)])))
                for lv in range(active)]
    out = {}
    for name, launches in (("grad_params", first), ("grad2_params", second)):
        parts = acc_levels(launches, cfg.n_levels + (1 if fixed else 0), param)
        if fixed:  # finite terms only: the flags part is never touched
            assert parts.pop() == dict.fromkeys(FIELDS, 0), (name, "flags")
        for lv, c in enumerate(parts):
            atomics = c["rmw"] + c["cas"]
            if lv >= active:
                assert c == dict.fromkeys(FIELDS, 0), (name, lv, c)
                continue
            assert c["cas"] == 0 and c["load"] == 0, (name, lv, c)  # fetch_add only: no CAS loop at either version
            if fixed:
                # a term adds to its low word, and to the high word when it carries; terms that round to 0 add nothing
                assert distinct[lv] * F // 2 <= atomics <= 2 * n * corners * F, (name, lv, c, distinct[lv])
            else:
                assert distinct[lv] * F <= atomics <= n * corners * F, (name, lv, c, distinct[lv])
        out[name] = [c["rmw"] for c in parts]
    out["digest"] = digest(g1, g2)
    if not fixed:  # the deterministic gradients at MSL 3.0: the same computation as the MSL 2.4 default
        d1, d2, _ = run("/GPU:0", False, deterministic=True)
        out["digest_deterministic"] = digest(d1, d2)
    else:  # deterministic=True changes nothing where the sums are fixed point anyway
        d1, d2, _ = run("/GPU:0", False, deterministic=False)
        assert digest(d1, d2) == out["digest"], "deterministic=False gave other bits than the default"
    return json.dumps(out)


def check_api():
    lib = emulated_gpu.kernel_library()
    lib.tfmo_emu_atomic_counts.restype = ctypes.c_char_p
    with tf.device("/GPU:0"):
        y = t.zero_out(tf.constant([[1, 2], [3, 4]]))
    emulated_gpu.synchronize()
    assert json.loads(lib.tfmo_emu_atomic_counts()) == [], "counting is on outside a count_atomics block"
    for bad in ({"acc": [8, 4]}, {"acc": [-4]}, {"not a name": [4]}):
        try:
            emulated_gpu.count_atomics(split=bad)
        except ValueError:
            pass
        else:
            raise AssertionError(f"split={bad} was accepted")
    with emulated_gpu.count_atomics() as c:
        with tf.device("/GPU:0"):
            y = t.zero_out(tf.constant([[1, 2], [3, 4]]))
        try:
            with emulated_gpu.count_atomics():
                pass
        except emulated_gpu.EmulatedGPUError:
            pass
        else:
            raise AssertionError("a nested count_atomics block was accepted")
    assert y.numpy().tolist() == [[1, 0], [0, 0]]
    (rec,) = c.launches
    assert rec["counted"] and rec["kernel"].startswith("zero_out"), rec
    zero = dict.fromkeys(FIELDS, 0)
    assert rec["threadgroup"] == zero and all(b["total"] == zero for b in rec["buffers"]), rec
    with tf.device("/GPU:0"):
        t.zero_out(tf.constant([1.0]))
    emulated_gpu.synchronize()
    assert json.loads(lib.tfmo_emu_atomic_counts()) == [], "counting stayed on after the block"
    kernel = t.metal_kernel("twice", input_names=["inp"], output_names=["out"],
                            source="uint i = thread_position_in_grid.x; out[i] = 2.0f * inp[i];")
    with emulated_gpu.count_atomics() as c:
        with tf.device("/GPU:0"):
            x = tf.constant(np.arange(8, dtype=np.float32))
            (z,) = kernel(inputs=[x], grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[[8]],
                          output_dtypes=[tf.float32])
    np.testing.assert_array_equal(z.numpy(), 2 * np.arange(8))
    assert [r["counted"] for r in c.launches] == [False], c.launches  # inline kernels are not counted
    return f"{len(c.launches)} inline launch recorded as not counted"


CHECKS = collect(globals())

if __name__ == "__main__":
    main(CHECKS)
