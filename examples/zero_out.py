"""The seed's usage of the hello-world op, through the package and through tf.load_op_library.

    python examples/zero_out.py
    TF_METAL_OPS_EMULATED_GPU=1 python examples/zero_out.py     # Linux: on the emulated GPU (docs/emulated_gpu.md)
"""

import json

import tensorflow as tf

import tf_metal_ops

# The package API.
print(tf_metal_ops.zero_out([[1, 2], [3, 4]]).numpy())

# The seed's exact usage: load the op library by path; the module has `zero_out`.
zero_out_module = tf.load_op_library(tf_metal_ops.library_path())
print(zero_out_module.zero_out([[1, 2], [3, 4]]).numpy())

# On a Mac with tensorflow-metal (or on the emulated GPU) the op runs on the GPU; elsewhere backend_info says why not.
info = tf_metal_ops.backend_info()
print(json.dumps({k: info[k] for k in ("tensorflow", "kernels", "metal_usable", "metal_reason")}, indent=2))
if info["gpu_backend"]:  # "metal" on a Mac, "direct" or "metal" on the emulated GPU
    with tf.device("/GPU:0"):
        y = tf_metal_ops.zero_out(tf.constant([[1.0, 2.0], [3.0, 4.0]]))
    print(y.device, y.numpy())
