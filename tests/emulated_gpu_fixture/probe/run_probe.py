"""Runs HostLayerProbe's scenarios on the emulated GPU (called by tests/test_emulated_gpu_host_layer.py)."""
import os
import sys

os.environ.setdefault("TF_METAL_OPS_EMULATED_GPU", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_metal_ops  # noqa: E402,F401
from tf_metal_ops import emulated_gpu, extension  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
lib = extension.load("host_layer_probe", [os.path.join(HERE, f) for f in ("probe_op.cc", "probe_gpu.cc", "probe.metal")])
tf.config.set_soft_device_placement(False)  # an error must come from the GPU kernel, not a CPU fallback

x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
with tf.device("/GPU:0"):
    y = lib.host_layer_probe(tf.constant(x), mode="block_sum")
sums = np.add.reduceat(x.astype(np.float64), np.arange(0, 1000, 64))
np.testing.assert_allclose(y.numpy(), -(sums * 2 - 1 + 0.5), rtol=1e-5, atol=1e-4)
counts = emulated_gpu.dispatch_counts(library=lib.library_path)
assert counts.get("probe_block_sum") == 1 and counts.get("probe_finish") == 1, counts
print("block_sum ok", y.device)

EXPECTED = {
    "missing_constants": ("InternalError", "function constant 0 'kScale' (uint) of"),
    "wrong_constant_type": ("InternalError", "function constant 0 'kScale' is uint, but the value given is int"),
    "float_to_half": ("InternalError", "half"),
    "missing_slot": ("InternalError", "buffer(2)"),
    "missing_threadgroup_memory": ("InternalError", "threadgroup(0)"),
    "unknown_kernel": ("InternalError", "Metal function 'probe_no_such_kernel' is not in the emulated kernel library"),
    "slot_out_of_range": ("InternalError", "buffer slot 31 is out of range"),
    "null_tensor": ("InternalError", "null tensor"),
    "empty_tensor": ("InternalError", "an empty tensor has no GPU buffer"),
    "bytes_too_big": ("InternalError", "5000 bytes (setBytes takes 1 to 4096"),
    "bytes_empty": ("InternalError", "0 bytes (setBytes takes 1 to 4096"),
    "threadgroup_memory_zero": ("InternalError", "threadgroup memory 0: length 0"),
    "threadgroup_memory_slot": ("InternalError", "threadgroup memory slot 40 is out of range"),
    "grid_too_big": ("InvalidArgumentError", "exceeds the 32-bit limit per dimension"),
    "group_dimension_zero": ("InternalError", "a threadgroup dimension is 0"),
    "too_many_groups": ("InvalidArgumentError", "exceed the 32-bit grid limit"),
    "no_grid": ("InternalError", "the pass has no grid"),
    "read_unaligned_offset": ("InternalError", "RunAndRead: offset 2 and size 4 must be multiples of 4 bytes"),
    "read_unaligned_size": ("InternalError", "RunAndRead: offset 0 and size 6 must be multiples of 4 bytes"),
    "check_grid_size": ("InvalidArgumentError", "the test quantity = 8589934592 exceeds 4294967295"),
    "nonsense": ("InvalidArgumentError", "unknown mode nonsense"),
}
failures = []
for mode, (cls, text) in EXPECTED.items():
    try:
        with tf.device("/GPU:0"):
            lib.host_layer_probe(tf.constant(x), mode=mode).numpy()
    except tf.errors.OpError as e:
        got = type(e).__name__
        if got != cls or text not in e.message or "GPU:0" not in str(e):
            failures.append(f"{mode}: expected {cls} with {text!r}, got {got}: {e.message}")
    else:
        failures.append(f"{mode}: no error")
stats = emulated_gpu.device_stats()
assert all(s["error"] is None for s in stats["streams"]), stats  # no misuse reached the device
if failures:
    sys.exit("\n".join(failures))
print(f"ok {len(EXPECTED)} misuses rejected")
