"""ZeroOut: the hello-world op (TensorFlow's classic custom-op example)."""

from __future__ import annotations

import tensorflow as tf

from tf_metal_ops._library import ops

_DTYPES = (tf.int32, tf.int64, tf.float32, tf.float16)


def zero_out(x, name=None):
    """Returns a tensor of ``x``'s shape and dtype whose first element (flat order) is ``x``'s and all others 0.

    A 0-d tensor is returned unchanged; an empty tensor gives an empty tensor of the same shape.
    Supported dtypes: int32, int64, float32, float16 (a Python list of ints becomes int32).
    Gradient: d(out)/d(x) keeps the first element's gradient and zeroes the rest, i.e. ``zero_out(dy)``.

    Example:
      >>> import tf_metal_ops
      >>> tf_metal_ops.zero_out([[1, 2], [3, 4]]).numpy()
      array([[1, 0],
             [0, 0]], dtype=int32)
    """
    x = tf.convert_to_tensor(x)
    if x.dtype not in _DTYPES:
        raise ValueError(
            f"zero_out: x must be one of {[d.name for d in _DTYPES]}, got {x.dtype.name}"
        )
    return ops().zero_out(x, name=name)


@tf.RegisterGradient("ZeroOut")
def _zero_out_grad(op, dy):
    if not op.inputs[0].dtype.is_floating:
        return [None]
    return [ops().zero_out(dy)]
