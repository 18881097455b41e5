"""Keras 3 layer owning a fused MLP's flat parameter vector (TensorFlow backend only).

Dtypes: the parameters have the policy's ``variable_dtype`` and are passed to the MLP in the ``compute_dtype`` with
the input (``"mixed_float16"``: a float32 vector, the op computing in float16 storage with float32 sums).
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
import tensorflow as tf

from tf_metal_ops import _library
from tf_metal_ops.fused_mlp.layout import check_config, check_int, fused_mlp_layout
from tf_metal_ops.fused_mlp.ops import fused_mlp
from tf_metal_ops.fused_mlp.pure_tf import fused_mlp_tf

IMPLEMENTATIONS = ("auto", "op", "pure_tf")
_warned_fallback = False


def resolve_implementation(implementation):
    """``(name, fn)``: the op for "op", pure TF for "pure_tf", the op if the library loads for "auto"."""
    global _warned_fallback

    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"FusedMLP: implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation == "pure_tf":
        return "pure_tf", fused_mlp_tf
    try:
        _library.ops()
        return "op", fused_mlp
    except (_library.OpLibraryError, ImportError) as e:
        if implementation == "op":
            raise
        if not _warned_fallback:
            warnings.warn(f"FusedMLP: the op library is unavailable ({e}); using the pure-TF implementation")
            _warned_fallback = True
        return "pure_tf", fused_mlp_tf


@keras.saving.register_keras_serializable(package="tf_metal_ops")
class FusedMLP(keras.layers.Layer):
    """A fully fused MLP (tiny-cuda-nn's FullyFusedMLP) with its trainable flat parameter vector ``params``.

    Input ``[..., n_input]`` (n_input from the input's last dim at build time, at most ``width``); output
    ``[..., n_output]``. ``feature_major=True``: the input is ``[n_input, N]`` (rank 2; the hash grid's
    feature-major encoding, :func:`~tf_metal_ops.fused_mlp`), the output ``[N, n_output]``. ``params`` (layout: :func:`~tf_metal_ops.fused_mlp_layout`) starts as tiny-cuda-nn's
    initialisation: each matrix Xavier-uniform, biases 0. ``implementation``: "op" (the compiled kernels; no XLA
    inside the layer), "pure_tf" (plain TF ops, XLA-compatible) or "auto" (the op when the library loads).
    ``products``: "float32" or "bfloat16" (the CPU kernels' products; :func:`~tf_metal_ops.fused_mlp`).

    Example:
      >>> import tensorflow as tf, tf_metal_ops
      >>> mlp = tf_metal_ops.FusedMLP(n_output=4, width=64, n_hidden_layers=2, activation="relu")
      >>> y = mlp(tf.random.stateless_uniform([10, 32], seed=[1, 2]))
      >>> y.shape, mlp.params.shape
      (TensorShape([10, 4]), TensorShape([7168]))
    """

    def __init__(self, n_output, width=64, n_hidden_layers=2, activation="relu", output_activation="none",
                 use_bias=False, implementation="auto", products="float32", feature_major=False, **kwargs):
        super().__init__(**kwargs)
        if keras.backend.backend() != "tensorflow":
            raise RuntimeError(f"FusedMLP needs the TensorFlow Keras backend, not {keras.backend.backend()}")
        self._options = check_config("FusedMLP", width, n_hidden_layers, n_output, activation, output_activation,
                                     use_bias, products, feature_major)
        self.implementation = implementation
        self.resolved_implementation, self._mlp = resolve_implementation(implementation)
        self.supports_jit = self.resolved_implementation == "pure_tf"  # keras' jit_compile="auto" reads this
        self.param_layout = None

    def build(self, input_shape):
        fm = self._options["feature_major"]
        if fm and len(input_shape) != 2:
            raise ValueError(f"FusedMLP: with feature_major the input must be [n_input, N], got shape {input_shape}")
        what = "the input's first dim (n_input)" if fm else "the input's last dim (n_input)"
        n_input = input_shape[0] if fm else input_shape[-1]
        if n_input is None:
            raise ValueError(f"FusedMLP: {what} must be known, got shape {input_shape}")
        check_int("FusedMLP", what, n_input, 1, self._options["width"])
        o = self._options
        self.param_layout = fused_mlp_layout(int(n_input), o["n_output"], width=o["width"],
                                       n_hidden_layers=o["n_hidden_layers"], use_bias=o["use_bias"])
        scale = self.param_layout.init_scale().astype(np.float32)

        # a seeded initializer (not keras.random's global seed generator, whose state a layer first built inside
        # another layer's call cannot update)
        uniform = keras.initializers.RandomUniform(minval=-1.0, maxval=1.0)

        def initializer(shape, dtype=None):
            return tf.cast(uniform(shape, "float32") * scale, dtype or "float32")

        self.params = self.add_weight(name="params", shape=(self.param_layout.n_params,), initializer=initializer,
                                      dtype=self.variable_dtype, trainable=True)

    def call(self, inputs):
        o = self._options
        x = tf.convert_to_tensor(inputs)
        if o["feature_major"] and x.shape.rank != 2:
            raise ValueError(f"FusedMLP: with feature_major the input must be [n_input, N], got shape {x.shape}")
        flat = x.shape.rank != 2  # [..., n_input] -> [N, n_input] -> [..., n_output]
        if flat:
            lead = tf.shape(x)[:-1]
            x = tf.reshape(x, [-1, self.param_layout.n_input])
        params = tf.cast(self.params, x.dtype)
        y = self._mlp(x, params, **o)
        return tf.reshape(y, tf.concat([lead, [o["n_output"]]], axis=0)) if flat else y

    def compute_output_shape(self, input_shape):
        if self._options["feature_major"]:
            return (input_shape[1], self._options["n_output"])
        return tuple(input_shape[:-1]) + (self._options["n_output"],)

    def get_config(self):
        config = super().get_config()
        config.update(self._options)
        config["implementation"] = self.implementation
        return config
