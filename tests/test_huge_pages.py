"""Large CPU outputs are advised onto transparent huge pages (csrc/common/huge_pages.h), and the advice changes no
value.

The advice is a hint to Linux: the check reads it back from /proc/self/smaps, where a mapping advised
MADV_HUGEPAGE carries the VmFlag "hg". Whether huge pages are then used depends on the kernel's THP mode and free
memory, so the test asks only for the advice. The output's address comes from its DLPack capsule (.numpy() copies
the buffer into NumPy's own allocation, which NumPy advises itself).
"""

import ctypes
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_metal_ops

HUGE = 2 << 20
LINUX_THP = sys.platform.startswith("linux") and os.path.isdir("/sys/kernel/mm/transparent_hugepage")


def vm_flags(address):
    """The VmFlags of the mapping holding `address` (/proc/self/smaps)."""
    current = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                current = lo <= address < hi
            elif current and line.startswith("VmFlags:"):
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def interior(tensor):
    """An address inside the 2 MB-aligned part of an eager CPU tensor's own buffer."""
    capsule = tf.experimental.dlpack.to_dlpack(tensor)
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    p = ctypes.c_void_p.from_address(get(capsule, b"dltensor")).value  # DLManagedTensor.dl_tensor.data
    nbytes = tensor.shape.num_elements() * tensor.dtype.size
    begin = (p + HUGE - 1) // HUGE * HUGE
    assert begin + HUGE <= p + nbytes, "the buffer has no aligned 2 MB inside"
    return begin


def mlp_case(rows):
    """Width 128, float32: the CPU kernel keeps the hidden activations (else it computes them again in the
    gradient)."""
    lay = tf_metal_ops.fused_mlp_layout(32, 16, width=128, n_hidden_layers=2)
    params = tf.constant(lay.init_params(seed=3))
    x = tf.constant(np.random.default_rng(0).standard_normal((rows, 32)).astype(np.float32))
    return x, params, dict(n_hidden_layers=2, width=128, n_output=16)


# Instant-NGP's NeRF grid: rows x 32 float32 encodings, a 16 MB table gradient.
TABLE_CFG = dict(n_levels=16, n_features_per_level=2, log2_hashmap_size=17, base_resolution=16, per_level_scale=1.38)


def encode_with_gradient(rows):
    """(encoding of `rows` random points, its table, the table gradient of sum(encoding))."""
    lay = tf_metal_ops.HashGridConfig(n_input_dims=3, **TABLE_CFG)
    table = tf.Variable(tf.random.stateless_uniform(lay.params_shape, [0, 2], -1e-2, 1e-2))
    pos = tf.random.stateless_uniform([rows, 3], [0, 3])
    with tf.GradientTape() as tape:
        enc = tf_metal_ops.hash_grid_encode(pos, table, **TABLE_CFG)
    return pos, table, enc, tape.gradient(enc, table, output_gradients=tf.ones_like(enc))


@pytest.mark.skipif(not LINUX_THP, reason="transparent huge pages are a Linux feature (no THP sysfs here)")
def test_large_outputs_are_advised_huge_pages():
    rows = 1 << 16  # hidden 2 x 65536 x 128 float32 = 64 MB, dx 8 MB; encoding 8 MB, table gradient 16 MB
    x, params, cfg = mlp_case(rows)
    ops = tf_metal_ops._library.ops()
    y, hidden = ops.fused_mlp(x, params, training=True, activation="relu", output_activation="none",
                              use_bias=False, products="float32", feature_major=False, **cfg)
    dx, _ = ops.fused_mlp_grad(tf.ones_like(y), x, params, y, hidden, activation="relu", output_activation="none",
                               use_bias=False, products="float32", feature_major=False, **cfg)
    _, _, enc, d_table = encode_with_gradient(rows)
    for name, t in (("hidden", hidden), ("dx", dx), ("encoding", enc), ("table gradient", d_table)):
        assert "hg" in vm_flags(interior(t)), f"{name} ({t.shape}) is not advised MADV_HUGEPAGE"


def test_advised_outputs_hold_the_same_values():
    """Rows are independent: the 2^16-row call (advised outputs) equals the same rows computed in 16 small calls,
    bit for bit, forward and gradient."""
    rows = 1 << 16
    x, params, cfg = mlp_case(rows)
    w = tf.constant(np.random.default_rng(1).standard_normal((rows, 16)).astype(np.float32))

    def run(xs, ws):
        with tf.GradientTape() as tape:
            tape.watch(xs)
            y = tf_metal_ops.fused_mlp(xs, params, **cfg)
            loss = tf.reduce_sum(y * ws)
        return y.numpy(), tape.gradient(loss, xs).numpy()

    y, dx = run(x, w)
    parts = [run(x[i:i + 4096], w[i:i + 4096]) for i in range(0, rows, 4096)]
    np.testing.assert_array_equal(y, np.concatenate([p[0] for p in parts]))
    np.testing.assert_array_equal(dx, np.concatenate([p[1] for p in parts]))
    pos, table, enc, d_table = encode_with_gradient(rows)
    np.testing.assert_array_equal(enc.numpy()[:4096], tf_metal_ops.hash_grid_encode(pos[:4096], table,
                                                                                    **TABLE_CFG).numpy())
    g = d_table.numpy()
    assert np.isfinite(g).all()
    # Each point's interpolation weights sum to 1 on every level, for each of the 2 features.
    np.testing.assert_allclose(g.sum(), float(rows * 16 * 2), rtol=1e-4)
