"""``fused_mlp_tf``: the fused MLP in plain TensorFlow ops (XLA-compatible, any device), the same math, parameter
layout and dtype rules as the op (float16 computed in float32, rounded once at the end). ``products="bfloat16"``
rounds the operands of the forward's matmuls to bfloat16 (TF's cast: nearest even) and multiplies in float32; the
gradient passes the roundings unchanged, so the backward's matmuls take the rounded forward operands and float32
gradients: close to the op's bfloat16 products, not bitwise."""

from __future__ import annotations

import tensorflow as tf

from tf_metal_ops.fused_mlp.layout import LEAKY_SLOPE, fused_mlp_layout
from tf_metal_ops.fused_mlp.ops import checked_args, input_count

@tf.custom_gradient
def _round_bf16(v):
    """v rounded to bfloat16 (kept float32); the gradient passes unchanged."""
    return tf.cast(tf.cast(v, tf.bfloat16), tf.float32), lambda dv: dv


_ACTIVATIONS = {
    "none": lambda z: z,
    "relu": tf.nn.relu,
    "leaky_relu": lambda z: tf.nn.leaky_relu(z, alpha=LEAKY_SLOPE),
    "sigmoid": tf.math.sigmoid,
    "exponential": tf.math.exp,
    "softplus": tf.math.softplus,
}


def fused_mlp_tf(x, params, *, n_hidden_layers, width, n_output, activation="relu", output_activation="none",
                 use_bias=False, products="float32", feature_major=False, name=None):
    """:func:`~tf_metal_ops.fused_mlp` in plain TF ops: ``x [N, n_input]`` (``[n_input, N]`` with
    ``feature_major``) and the flat ``params`` (float32 or float16, the same dtype) -> ``[N, n_output]``. Gradients
    come from TF's autodiff. Use it under XLA (``jit_compile=True``) or on devices without the op's kernels.

    Example:
      >>> import numpy as np, tensorflow as tf, tf_metal_ops
      >>> opts = dict(n_hidden_layers=2, width=16, n_output=2, activation="relu")
      >>> params = tf_metal_ops.fused_mlp_layout(3, 2, width=16, n_hidden_layers=2).init_params(seed=1)
      >>> x = tf.random.stateless_uniform([5, 3], seed=[1, 2])
      >>> y = tf_metal_ops.fused_mlp_tf(x, params, **opts)
      >>> y.shape
      TensorShape([5, 2])
      >>> bool(np.allclose(y, tf_metal_ops.fused_mlp(x, params, **opts), atol=1e-6))
      True
    """
    fn = "fused_mlp_tf"
    with tf.name_scope(name or fn):
        x, params, cfg = checked_args(fn, x, params, n_hidden_layers, width, n_output, activation,
                                      output_activation, use_bias, products, feature_major)
        bf16 = cfg["products"] == "bfloat16"
        n_input = input_count(x, feature_major)
        if n_input is None:
            raise ValueError(f"{fn}: x's input count (n_input) must be known statically, got shape {x.shape}")
        if feature_major:
            x = tf.transpose(x)
        lay = fused_mlp_layout(n_input, n_output, width=width, n_hidden_layers=n_hidden_layers, use_bias=use_bias)
        dtype = x.dtype
        p = tf.cast(params, tf.float32)
        h = tf.cast(x, tf.float32)
        for m, (offset, (rows, cols)) in enumerate(lay.matrices):
            last = m == len(lay.matrices) - 1
            w = tf.reshape(p[offset:offset + rows * cols], [rows, cols])
            if m == 0:
                w = w[:, :n_input]  # the padding columns multiply zeros
            if last:
                w = w[:n_output]  # the padding rows feed no output
            if bf16:
                h, w = _round_bf16(h), _round_bf16(w)
            h = tf.matmul(h, w, transpose_b=True)
            if use_bias:
                bo, length = lay.biases[m]
                h = h + p[bo:bo + length]
            h = _ACTIVATIONS[cfg["output_activation"] if last else cfg["activation"]](h)
        return tf.cast(h, dtype)
