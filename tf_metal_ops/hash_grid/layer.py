"""Keras 3 layer owning a hash-grid table (TensorFlow backend only).

Dtypes: positions are always used as float32 (a float16 position cannot tell fine cells apart, so the layer does
not autocast its input). The table variable has the policy's ``variable_dtype`` and is passed to the encoding in the
``compute_dtype``: ``dtype="float16"`` gives a float16 table, ``"mixed_float16"`` a float32 table fed to the op as
float16 (the op then gets float16 params either way); the output has the compute dtype.
"""

from __future__ import annotations

import warnings

import keras
import tensorflow as tf

from tf_metal_ops import _library
from tf_metal_ops.hash_grid import pure_tf
from tf_metal_ops.hash_grid._args import check_flag
from tf_metal_ops.hash_grid.config import HashGridConfig
from tf_metal_ops.hash_grid.ops import hash_grid_encode, hash_grid_encode_params_grad

IMPLEMENTATIONS = ("auto", "op", "pure_tf")
_warned_fallback = False


def _op_encode():
    """``hash_grid_encode`` of the compiled op library, or raises OpLibraryError/ImportError."""
    _library.ops()  # raises OpLibraryError when the library is missing or does not load
    return hash_grid_encode


def resolve_implementation(implementation):
    """``(name, encode_fn)``: the op for "op", pure TF for "pure_tf", the op if it loads for "auto"."""
    global _warned_fallback

    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation == "pure_tf":
        return "pure_tf", pure_tf.hash_grid_encode
    try:
        return "op", _op_encode()
    except (_library.OpLibraryError, ImportError) as e:
        if implementation == "op":
            raise
        if not _warned_fallback:
            warnings.warn(f"HashGridEncoding: the op library is unavailable ({e}); using the pure-TF implementation")
            _warned_fallback = True
        return "pure_tf", pure_tf.hash_grid_encode


@keras.saving.register_keras_serializable(package="tf_metal_ops")
class HashGridEncoding(keras.layers.Layer):
    """Multiresolution hash-grid encoding (Instant-NGP) with its trainable table.

    Input ``[..., D]`` positions in [0, 1] (D = 1..4, from the input's last dim at build time); output
    ``[..., n_levels * n_features_per_level]``, level-major, or with ``feature_major=True`` its transpose
    ``[n_levels * n_features_per_level, ...]`` (tiny-cuda-nn's layout, the GPU encode's fastest: see
    :func:`~tf_metal_ops.hash_grid.ops.hash_grid_encode`). The table ``[total_entries, F]`` is initialised
    uniform in ±1e-4. ``implementation``: "op" (the compiled kernels; no XLA inside the layer), "pure_tf" (plain
    TF ops, XLA-compatible) or "auto" (the op when the library loads, else pure TF with a warning).
    Call argument ``max_level`` (coarse-to-fine training): an int k keeps the first k levels, a float m keeps levels
    l < m*L + 1e-3 (tcnn's fraction); a scalar tensor of either kind avoids retracing. Finer levels output 0.

    Example:
      >>> import tensorflow as tf, tf_metal_ops
      >>> enc = tf_metal_ops.HashGridEncoding(n_levels=4, n_features_per_level=2, log2_hashmap_size=10)
      >>> y = enc(tf.random.stateless_uniform([5, 3], seed=[1, 2]))
      >>> y.shape, enc.table.shape
      (TensorShape([5, 8]), TensorShape([4096, 2]))
      >>> enc_t = tf_metal_ops.HashGridEncoding(n_levels=4, log2_hashmap_size=10, feature_major=True)
      >>> enc_t(tf.zeros([5, 3])).shape
      TensorShape([8, 5])
    """

    def __init__(
        self,
        n_levels=16,
        n_features_per_level=2,
        log2_hashmap_size=19,
        base_resolution=16,
        per_level_scale=2.0,
        grid_type="hash",
        interpolation="linear",
        implementation="auto",
        feature_major=False,
        **kwargs,
    ):
        kwargs.pop("autocast", None)
        super().__init__(autocast=False, **kwargs)
        if keras.backend.backend() != "tensorflow":
            raise RuntimeError(f"HashGridEncoding needs the TensorFlow Keras backend, not {keras.backend.backend()}")
        self._options = dict(
            n_levels=n_levels,
            n_features_per_level=n_features_per_level,
            log2_hashmap_size=log2_hashmap_size,
            base_resolution=base_resolution,
            per_level_scale=per_level_scale,
            grid_type=grid_type,
            interpolation=interpolation,
        )
        HashGridConfig(1, **self._options)  # validate now (D is checked at build)
        self.feature_major = check_flag("HashGridEncoding", "feature_major", feature_major)
        self.implementation = implementation
        self.resolved_implementation, self._encode = resolve_implementation(implementation)
        self.supports_jit = self.resolved_implementation == "pure_tf"  # keras' jit_compile="auto" reads this
        # autocast=False: keras converts arrays to tensors without casting floats to the compute dtype (positions
        # stay float32 under mixed precision) and passes Python numbers (max_level) through unchanged.
        self.hash_grid_config = None

    def build(self, input_shape):
        d = input_shape[-1]
        if d is None:
            raise ValueError(f"HashGridEncoding: the input's last dim (D) must be known, got shape {input_shape}")
        self.hash_grid_config = HashGridConfig(int(d), **self._options)
        self.table = self.add_weight(
            name="table",
            shape=self.hash_grid_config.params_shape,
            initializer=keras.initializers.RandomUniform(-1e-4, 1e-4),
            dtype=self.variable_dtype,
            trainable=True,
        )

    def call(self, inputs, max_level=None):
        cfg = self.hash_grid_config
        x = tf.cast(inputs, tf.float32)
        flat = x.shape.rank != 2  # [..., D] -> [N, D] -> [..., L*F]
        if flat:
            lead = tf.shape(x)[:-1]
            x = tf.reshape(x, [-1, cfg.n_input_dims])
        params = tf.cast(self.table, self.compute_dtype) if self.table.dtype != self.compute_dtype else self.table
        y = self._encode(x, params, config=cfg, max_level=max_level, feature_major=self.feature_major)
        if not flat:
            return y
        shape = [[cfg.n_output_dims], lead] if self.feature_major else [lead, [cfg.n_output_dims]]
        return tf.reshape(y, tf.concat(shape, axis=0))

    def table_gradient(self, inputs, output_gradients, max_level=None):
        """The gradient of ``sum(self(inputs) * output_gradients)`` w.r.t. the table (``inputs [N, D]``,
        ``output_gradients`` shaped like the output: ``[N, n_levels * F]``, or ``[n_levels * F, N]`` when
        feature-major), without the forward pass on the op implementation
        (:func:`~tf_metal_ops.hash_grid.ops.hash_grid_encode_params_grad`; pure TF: a tape over the forward). For
        data-parallel training that all-gathers per-sample output gradients instead of all-reducing the table's.

        >>> enc = HashGridEncoding(n_levels=2, log2_hashmap_size=8, implementation="pure_tf")
        >>> x = tf.constant([[0.25, 0.5, 0.75]])
        >>> _ = enc(x)  # builds the table
        >>> float(tf.reduce_sum(enc.table_gradient(x, tf.ones([1, 4]))))  # 2 levels x 2 features x weights summing to 1
        4.0
        """
        cfg = self.hash_grid_config
        if cfg is None:
            raise ValueError("HashGridEncoding.table_gradient: the layer is not built (call it once first)")
        x = tf.cast(inputs, tf.float32)
        params = tf.cast(self.table, self.compute_dtype) if self.table.dtype != self.compute_dtype else self.table
        dy = tf.cast(output_gradients, params.dtype)
        if self.resolved_implementation == "op":
            g = hash_grid_encode_params_grad(x, params, dy, config=cfg, max_level=max_level,
                                             feature_major=self.feature_major)
        else:
            params = tf.convert_to_tensor(params)
            with tf.GradientTape() as tape:
                tape.watch(params)
                y = self._encode(x, params, config=cfg, max_level=max_level, feature_major=self.feature_major)
            g = tape.gradient(y, params, output_gradients=dy)
        return tf.cast(tf.convert_to_tensor(g), self.table.dtype)  # pure TF: IndexedSlices -> dense

    def compute_output_shape(self, input_shape):
        cols = (self._options["n_levels"] * self._options["n_features_per_level"],)
        return cols + tuple(input_shape[:-1]) if self.feature_major else tuple(input_shape[:-1]) + cols

    def get_config(self):
        config = super().get_config()
        config.update(self._options)
        config["per_level_scale"] = float(self._options["per_level_scale"])
        config["implementation"] = self.implementation
        config["feature_major"] = self.feature_major
        return config
