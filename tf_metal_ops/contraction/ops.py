"""Scene contraction in TensorFlow (``contract``, ``contract_to_unit``): elementwise, differentiable by autodiff,
XLA-compilable. Conventions: ``tf_metal_ops.contraction``."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

NORMS = ("l2", "inf")


def _check_norm(fn, norm):
    if not isinstance(norm, str) or norm not in NORMS:
        raise ValueError(f"{fn}: norm must be one of {NORMS}, got {norm!r}")
    return norm


def _positions(fn, x):
    x = tf.convert_to_tensor(x, dtype_hint=tf.float32)
    if not x.dtype.is_floating:
        raise ValueError(f"{fn}: positions must be a floating-point tensor, got {x.dtype.name} (cast it with tf.cast)")
    if x.shape.rank == 0:
        raise ValueError(f"{fn}: positions must have shape [..., 3], got a scalar")
    if x.shape.rank is not None and x.shape[-1] is not None and x.shape[-1] != 3:
        raise ValueError(f"{fn}: positions must have shape [..., 3], got {x.shape}")
    return x


def _check_aabb(fn, aabb):
    box = np.asarray(aabb, dtype=np.float64)
    if box.shape != (2, 3) or not np.all(np.isfinite(box)) or not np.all(box[0] < box[1]):
        raise ValueError(f"{fn}: aabb must be ((xmin, ymin, zmin), (xmax, ymax, zmax)), finite, min < max; "
                         f"got {aabb!r}")
    return box


def _contract(x, norm):
    """The contraction of x [..., 3] (checked arguments)."""
    if norm == "l2":
        # |x|^2 has the finite gradient 2x everywhere; the outer branch uses n >= 1 only, so neither branch of the
        # tf.where carries a NaN or inf gradient (a plain tf.norm has 0/0 at x = 0).
        n = tf.sqrt(tf.maximum(tf.reduce_sum(tf.square(x), axis=-1, keepdims=True), 1.0))
    else:
        n = tf.maximum(tf.reduce_max(tf.abs(x), axis=-1, keepdims=True), 1.0)
    outside = (2.0 - 1.0 / n) * (x / n)
    return tf.where(n > 1.0, outside, x)


def contract(positions, *, norm="l2", name=None):
    """mip-NeRF 360's scene contraction: x if ||x|| <= 1, else (2 - 1/||x||) x / ||x||.

    Maps R^3 onto the open ball (``norm="l2"``, mip-NeRF 360) or cube (``norm="inf"``, nerfstudio's
    ``SceneContraction(order=inf)``) of radius 2: the unit region is unchanged and everything outside it is squeezed
    into the shell 1 < ||y|| < 2, distance growing like 1/||x|| (far points get resolution in proportion to their
    disparity). Continuous with a continuous first derivative (the Jacobian is the identity on ||x|| = 1 for the
    L2 norm); the gradient is exact and finite everywhere, including x = 0.

    Args:
      positions: [..., 3] floating-point tensor (float16/32/64; the output has its dtype). float32 inputs must
        have |x| < 1.8e19 for the L2 norm (its square must not overflow).
      norm: "l2" or "inf".

    Returns [..., 3] contracted positions, ||y|| < 2 in the chosen norm.

    Example:
      >>> import tf_metal_ops
      >>> y = tf_metal_ops.contract([[0.5, 0.0, 0.0], [4.0, 0.0, 0.0], [3.0, 4.0, 0.0]])
      >>> y.numpy().round(4)
      array([[0.5 , 0.  , 0.  ],
             [1.75, 0.  , 0.  ],
             [1.08, 1.44, 0.  ]], dtype=float32)
    """
    fn = "contract"
    norm = _check_norm(fn, norm)
    with tf.name_scope(name or "contract"):
        return _contract(_positions(fn, positions), norm)


def contract_to_unit(positions, aabb=((-1.0, -1.0, -1.0), (1.0, 1.0, 1.0)), *, norm="l2", name=None):
    """Scene positions -> [0, 1]^3 for an encoding over the unit cube (the hash grid): the box ``aabb`` is mapped
    onto the unit region [-1, 1]^3 (x' = (x - centre) / half_extent, per axis), contracted (``contract``), then
    rescaled, u = (contract(x') + 2) / 4.

    So the box itself fills [1/4, 3/4]^3 (with ``norm="inf"``; its inscribed ball with ``"l2"``) at full resolution
    and all of space outside it the rest of the cube (nerfstudio's nerfacto does the same with ``aabb`` = [-1, 1]^3).

    Args:
      positions: [..., 3] floating-point tensor, in the scene's coordinates.
      aabb: ((xmin, ymin, zmin), (xmax, ymax, zmax)), finite, min < max: the region kept uncontracted.
      norm: "l2" or "inf" (see ``contract``).

    Returns [..., 3] in [0, 1]^3 (the open cube for finite input), the dtype of ``positions``.

    Example:
      >>> import tf_metal_ops
      >>> box = ((-2.0, -2.0, -2.0), (2.0, 2.0, 2.0))
      >>> u = tf_metal_ops.contract_to_unit([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [6.0, 0.0, 0.0]], box)
      >>> u.numpy().round(4)  # the centre, the box's face, a point two box sizes further out
      array([[0.5   , 0.5   , 0.5   ],
             [0.75  , 0.5   , 0.5   ],
             [0.9167, 0.5   , 0.5   ]], dtype=float32)
    """
    fn = "contract_to_unit"
    norm = _check_norm(fn, norm)
    box = _check_aabb(fn, aabb)
    with tf.name_scope(name or "contract_to_unit"):
        x = _positions(fn, positions)
        centre = tf.constant((box[0] + box[1]) / 2.0, x.dtype)
        inv_half = tf.constant(2.0 / (box[1] - box[0]), x.dtype)
        return (_contract((x - centre) * inv_half, norm) + 2.0) * 0.25
