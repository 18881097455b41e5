"""``fused_mlp``: the compiled fully fused MLP (tiny-cuda-nn's FullyFusedMLP; CPU kernels and Metal kernels).

The op ``FusedMlp`` returns the hidden activations (float32) as a second output when ``training`` and its device
keeps them (the GPU always; the CPU at width 128 with float32 products, otherwise ``FusedMlpGrad`` computes them
again per block and ``hidden`` is ``[0, N, width]``: docs/fused_mlp.md, "Kept activations"); its registered gradient runs
``FusedMlpGrad`` on that output (or, for a forward run without training, runs the forward once more with it).
``FusedMlpGrad`` has no registered gradient: a second derivative raises LookupError instead of returning a wrong
value. Custom ops have no XLA kernel; ``fused_mlp_tf`` is the same math in plain TF ops.
"""

from __future__ import annotations

import tensorflow as tf

from tf_metal_ops._library import ops
from tf_metal_ops.fused_mlp.layout import check_config, fused_mlp_layout

__all__ = ["fused_mlp"]

# The attrs FusedMlp shares with FusedMlpGrad (T is inferred from the inputs).
_CONFIG_ATTRS = ("n_hidden_layers", "width", "n_output", "activation", "output_activation", "use_bias", "products",
                 "feature_major")


def _as_tensor(value, hint):
    """A tensor of ``value``: its own dtype when it has one (tensors, variables, NumPy arrays), else ``hint``
    (Python numbers and lists)."""
    if hasattr(value, "dtype"):
        return tf.convert_to_tensor(value)
    return tf.convert_to_tensor(value, dtype_hint=hint)


def checked_args(fn, x, params, n_hidden_layers, width, n_output, activation, output_activation, use_bias,
                 products="float32", feature_major=False):
    """(x, params, config dict) after the static checks of ``fn``'s arguments (ValueError naming ``fn``)."""
    cfg = check_config(fn, width, n_hidden_layers, n_output, activation, output_activation, use_bias, products,
                       feature_major)
    layout = "[n_input, N] (feature_major)" if feature_major else "[N, n_input]"
    x = _as_tensor(x, tf.float32)
    if x.dtype not in (tf.float32, tf.float16):
        raise ValueError(f"{fn}: x must be float32 or float16, got {x.dtype.name}")
    params = _as_tensor(params, x.dtype)
    if params.dtype != x.dtype:
        raise ValueError(f"{fn}: params must have x's dtype {x.dtype.name}, got {params.dtype.name}")
    if x.shape.rank is not None and x.shape.rank != 2:
        raise ValueError(f"{fn}: x must have rank 2 {layout}, got shape {x.shape}")
    if params.shape.rank is not None and params.shape.rank != 1:
        raise ValueError(f"{fn}: params must be a vector (rank 1), got shape {params.shape}")
    n_input = input_count(x, feature_major)
    if n_input is not None:
        if not 1 <= n_input <= cfg["width"]:
            raise ValueError(f"{fn}: x must have shape {layout} with 1 to width ({cfg['width']}) inputs, got shape "
                             f"{x.shape}")
        want = fused_mlp_layout(n_input, cfg["n_output"], width=cfg["width"], n_hidden_layers=cfg["n_hidden_layers"],
                                use_bias=cfg["use_bias"]).n_params
        if params.shape.rank == 1 and params.shape[0] is not None and params.shape[0] != want:
            raise ValueError(f"{fn}: params must have {want} values for n_input={n_input}, "
                             f"{', '.join(f'{k}={v!r}' for k, v in cfg.items())} (fused_mlp_layout), "
                             f"got shape {params.shape}")
    return x, params, cfg


def input_count(x, feature_major):
    """n_input of ``x`` (its second dimension, or its first with ``feature_major``) when known statically."""
    return x.shape[0 if feature_major else 1] if x.shape.rank == 2 else None


def row_count(x, feature_major):
    """N of ``x`` (its first dimension, or its second with ``feature_major``) when known statically."""
    return x.shape[1 if feature_major else 0] if x.shape.rank == 2 else None


def _gradient_needed(tensors):
    """Whether a gradient tape records operations on ``tensors`` now (then the forward keeps its activations)."""
    try:
        from tensorflow.python.eager import record

        return bool(record.should_record_backprop([t for t in tensors if isinstance(t, tf.Tensor)]))
    except (ImportError, AttributeError):
        return True


def fused_mlp(x, params, *, n_hidden_layers, width, n_output, activation="relu", output_activation="none",
              use_bias=False, training=None, products="float32", feature_major=False, name=None):
    """The fully fused MLP (tiny-cuda-nn's FullyFusedMLP) of the rows of ``x [N, n_input]``:
    ``y = f_out(W_L f(... f(W_1 x + b_1) ...) + b_L)`` with ``n_hidden_layers`` hidden layers of ``width``
    neurons (16, 32, 64 or 128), ``n_output`` outputs (1..width) and ``n_input`` (1..width) inputs.

    ``params``: one flat vector, the weight matrices row-major ``[outputs, inputs]`` back to back as tiny-cuda-nn
    stores them (the first one's inputs and the last one's outputs padded to a multiple of 16), then the biases
    when ``use_bias``: :func:`~tf_metal_ops.fused_mlp_layout` gives the count, the offsets and initial values.
    ``activation``, ``output_activation``: "none", "relu", "leaky_relu" (slope 0.01), "sigmoid", "exponential" or
    "softplus". float32 or float16 (x and params the same dtype; float16 accumulates in float32).
    ``training``: keep what the gradient needs (None: whenever a gradient tape records ``x`` or ``params``; the CPU
    kernel computes the hidden activations again in the gradient unless width is 128 with float32 products,
    docs/fused_mlp.md). The gradient w.r.t. ``x`` and ``params`` is registered (eager, ``tf.function``, SavedModel); the
    parameter gradient is bitwise the same for every thread count and run. ``products``: "float32" (the default) or
    "bfloat16": the CPU kernels round the operands of every product (forward and gradients) to bfloat16 and sum in
    float32, on AMX tiles where the CPU has AMX-BF16 (their sums rounded the hardware's way), with AVX512-BF16's
    VDPBF16PS where it has that, and the same arithmetic in float32 code elsewhere
    (``tf_metal_ops.diagnostics.cpu_paths("fused_mlp")``; accuracy: docs/fused_mlp.md); the GPU kernels ignore it.
    ``feature_major``: ``x`` is ``[n_input, N]`` instead (the layout of ``hash_grid_encode(..., feature_major=True)``
    and of tiny-cuda-nn), read in place; the gradient w.r.t. ``x`` has that layout too; ``y`` is ``[N, n_output]``
    either way.
    Bad arguments raise ValueError here when visible statically, else InvalidArgumentError from the kernel. CPU and
    GPU (Metal) kernels; on the GPU float16 multiplies float16 operands, the activations rounded to float16 between
    layers, and sums in float32 (docs/fused_mlp.md, "GPU kernels").

    Example:
      >>> import numpy as np, tensorflow as tf, tf_metal_ops
      >>> lay = tf_metal_ops.fused_mlp_layout(4, 3, width=32, n_hidden_layers=2)
      >>> params = tf.Variable(lay.init_params(seed=0))
      >>> x = tf.random.stateless_normal([8, 4], seed=[0, 1])
      >>> with tf.GradientTape() as tape:
      ...     y = tf_metal_ops.fused_mlp(x, params, n_hidden_layers=2, width=32, n_output=3)
      ...     loss = tf.reduce_sum(y ** 2)
      >>> y.shape, tape.gradient(loss, params).shape
      (TensorShape([8, 3]), TensorShape([2048]))
      >>> y_fm = tf_metal_ops.fused_mlp(tf.transpose(x), params, n_hidden_layers=2, width=32, n_output=3,
      ...                               feature_major=True)
      >>> bool(tf.reduce_all(y_fm == y))
      True
    """
    fn = "fused_mlp"
    if training is not None and not isinstance(training, bool):
        raise ValueError(f"{fn}: training must be True, False or None, got {training!r}")
    with tf.name_scope(name or fn):
        x, params, cfg = checked_args(fn, x, params, n_hidden_layers, width, n_output, activation,
                                      output_activation, use_bias, products, feature_major)
        keep = _gradient_needed([x, params]) if training is None else training
        y, _ = ops().fused_mlp(x, params, training=keep, **cfg)
        y.set_shape([row_count(x, feature_major), cfg["n_output"]])
        return y


def _attrs(op):
    out = {}
    for k in _CONFIG_ATTRS:
        v = op.get_attr(k)
        out[k] = v.decode() if isinstance(v, bytes) else v
    return out


@tf.RegisterGradient("FusedMlp")
def _fused_mlp_grad(op, dy, unused_dhidden):
    """Gradient w.r.t. x and params. The hidden output is the backward's input, not a result: it carries no
    gradient (the wrapper never returns it)."""
    x, params = op.inputs
    attrs = _attrs(op)
    if op.get_attr("training"):
        y, hidden = op.outputs
    else:
        y, hidden = ops().fused_mlp(x, params, training=True, **attrs)
    if dy is None:
        dy = tf.zeros_like(y)
    dx, dparams = ops().fused_mlp_grad(dy, x, params, y, hidden, **attrs)
    dx.set_shape(x.shape)
    return [dx, dparams]
