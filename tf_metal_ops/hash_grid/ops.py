"""``hash_grid_encode``: the compiled multiresolution hash-grid op (CPU kernels everywhere, Metal kernels on a Mac).

Conventions (coordinates, level table, hashing, interpolation, clamp policy): ``tf_metal_ops.hash_grid.config``.
Gradients w.r.t. both ``params`` and ``positions`` are registered (eager, ``tf.function``, SavedModel). The CPU
parameter gradient is bitwise deterministic (independent of run and thread count). The GPU one sums with float
atomics (the rounding order varies between runs) unless ``deterministic=True`` (or TensorFlow's
``tf.config.experimental.enable_op_determinism()`` when the op is built), or the GPU has no float atomics (no Metal
3: MSL 2.4's are compare-and-swap loops): then the GPU sums each table entry as a
64-bit fixed-point integer with integer atomics, bitwise reproducible (scale per level from a bound B of the terms,
the largest incoming gradient for the first order; each term rounded within 2^-31 B; see
``metal_kernels/hash_grid.metal``).

Custom ops have no XLA kernel: a function compiled with ``jit_compile=True`` cannot contain this op. Keep XLA for the
rest of a model by jit-compiling those parts as separate inner functions and calling them from a plain
``tf.function`` that also calls ``hash_grid_encode``::

    mlp_xla = tf.function(lambda h: mlp(h), jit_compile=True)   # XLA-compiled part

    @tf.function                                                 # plain graph around it
    def step(x):
        with tf.GradientTape() as tape:
            h = hash_grid_encode(x, table, **opts)              # custom op (CPU or Metal kernels)
            loss = tf.reduce_mean(tf.square(mlp_xla(h) - target))
        return tape.gradient(loss, [table] + mlp.trainable_variables)

Second derivatives (eikonal losses): the position-gradient op ``HashGridEncodeGradPositions`` has a registered
gradient w.r.t. all its inputs (its incoming ``dy``, the tables and the positions; the op
``HashGridEncodeGradPositionsGrad``, tiny-cuda-nn's ``kernel_grid_backward_input_backward_*``), so
``tf.GradientTape`` nested twice works: an eikonal loss on ``d(mlp(encode(x)))/dx`` trains the MLP and the tables.
Conventions: smoothstep has a second derivative in x; linear only the mixed partials d^2/(dx_i dx_j), i != j (it
is linear along each axis inside a cell); nearest has none (zero). The CPU kernel is bitwise deterministic; the
Metal one scatters the table gradient with float atomics. The parameter-gradient op ``HashGridEncodeGradParams``
and the second-order op itself have no registered gradient: asking for one raises LookupError instead of
returning a wrong value.
"""

from __future__ import annotations

import numbers
import os

import tensorflow as tf

from tf_metal_ops._library import ops
from tf_metal_ops.hash_grid._args import OPTION_NAMES, call_config, check_flag

__all__ = ["hash_grid_encode", "hash_grid_encode_params_grad"]

# Attrs the gradients copy from the forward op besides the config (_ATTRS).
_CALL_ATTRS = ("deterministic", "feature_major")

_ATTRS = OPTION_NAMES  # the config attrs of every hash-grid op


def _max_level_tensor(max_level, n_levels):
    """max_level -> scalar int32 (level count) or float32 (tcnn fraction) tensor."""
    if max_level is None:
        return tf.constant(n_levels, tf.int32)
    if isinstance(max_level, bool):
        raise ValueError("hash_grid_encode: max_level must be an int (level count) or a float (fraction), got a bool")
    if isinstance(max_level, numbers.Integral):
        return tf.constant(int(max_level), tf.int32)
    if isinstance(max_level, numbers.Real):
        return tf.constant(float(max_level), tf.float32)
    t = tf.convert_to_tensor(max_level)
    if t.dtype not in (tf.int32, tf.float32):
        raise ValueError(f"hash_grid_encode: max_level must be int32 or float32, got {t.dtype.name}")
    if t.shape.rank not in (None, 0):
        raise ValueError(f"hash_grid_encode: max_level must be a scalar, got shape {t.shape}")
    return t


def _op_determinism_enabled():
    """TensorFlow's ``tf.config.experimental.enable_op_determinism()`` state (TF has no public getter; its own
    ops read this function), or the ``TF_DETERMINISTIC_OPS`` variable that setting also honours."""
    try:
        from tensorflow.python.framework import config as tf_config

        return bool(tf_config.is_op_determinism_enabled())
    except (ImportError, AttributeError):
        return os.environ.get("TF_DETERMINISTIC_OPS", "").lower() in ("1", "true")


def _deterministic(fn, value):
    """The op's ``deterministic`` attr: ``value``, or TensorFlow's op-determinism setting when None."""
    if check_flag(fn, "deterministic", value, allow_none=True) is None:
        return _op_determinism_enabled()
    return value


def _encoded_shape(positions, cfg, feature_major):
    """The static shape of the encoding (and of its gradient): [N, L*F], or [L*F, N] when feature-major."""
    n = positions.shape[0] if positions.shape.rank == 2 else None
    return [cfg.n_output_dims, n] if feature_major else [n, cfg.n_output_dims]


def _checked_inputs(fn, positions, params, config, options):
    """(positions, params, HashGridConfig) after the static checks of ``fn``'s arguments (ValueError): the config is
    ``config`` or the one ``options`` give."""
    positions = tf.convert_to_tensor(positions)
    if positions.dtype != tf.float32:
        raise ValueError(f"{fn}: positions must be float32, got {positions.dtype.name}")
    params = tf.convert_to_tensor(params)
    if params.dtype not in (tf.float32, tf.float16):
        raise ValueError(f"{fn}: params must be float32 or float16, got {params.dtype.name}")
    if positions.shape.rank is not None and positions.shape.rank != 2:
        raise ValueError(f"{fn}: positions must have rank 2 [N, D], got shape {positions.shape}")
    if params.shape.rank is not None and params.shape.rank != 2:
        raise ValueError(f"{fn}: params must have rank 2 [total_entries, F], got shape {params.shape}")
    d = positions.shape[-1] if positions.shape.rank == 2 else None
    if d is not None and not 1 <= d <= 4:
        raise ValueError(f"{fn}: positions must have 1 to 4 columns (D), got shape {positions.shape}")
    # Validates the options (ValueError); with a known D also the params shape.
    cfg = call_config(fn, d, config, options)
    if (d is not None or config is not None) and params.shape.rank == 2 and not params.shape.is_compatible_with(
            cfg.params_shape):
        raise ValueError(
            f"{fn}: params must have shape {list(cfg.params_shape)} for this config "
            f"(D={cfg.n_input_dims}, {', '.join(f'{k}={v!r}' for k, v in cfg.op_kwargs().items())}), got {params.shape}"
        )
    return positions, params, cfg


def hash_grid_encode(positions, params, *, config=None, max_level=None, deterministic=None, feature_major=False,
                     name=None, **options):
    """Encodes ``positions [N, D]`` (float32 in [0,1], D = 1..4) with the tables ``params [total_entries, F]``
    (float32 or float16) into ``[N, n_levels * F]`` in params' dtype, level-major (level l's features at columns
    l*F .. l*F+F-1); with ``feature_major=True`` into its transpose ``[n_levels * F, N]`` (tiny-cuda-nn's layout:
    the GPU kernel then writes whole rows and reads one level's table at a time, its fastest form; a following
    dense layer takes it as ``tf.matmul(y, w, transpose_a=True)``). Gradients flow in the same layout.

    The encoding's options: ``config``, a :class:`HashGridConfig` (its ``n_input_dims`` must be D), or its fields as
    keywords (``n_levels=16, n_features_per_level=2, log2_hashmap_size=19, base_resolution=16,
    per_level_scale=2.0, grid_type="hash", interpolation="linear"``; the defaults for those left out), not both.
    ``params`` must have ``hash_grid_table_layout(D, ...).params_shape``. Positions outside [0,1] are clamped
    (NaN -> 0) and get zero position gradient. ``max_level``: None = all levels; an int k = the first k levels
    (clipped to 0..n_levels); a float m = tcnn's fraction, levels l < m*n_levels + 1e-3; a scalar tensor of
    either kind. Finer levels output zero and get no gradient. ``deterministic``: a bitwise reproducible table
    gradient on the GPU too (None: whether ``tf.config.experimental.enable_op_determinism()`` was called; GPUs
    without Metal 3 always give one). Bad arguments raise
    ValueError here when visible statically, else InvalidArgumentError from the kernel.

    Example:
      >>> import numpy as np, tensorflow as tf, tf_metal_ops
      >>> cfg = tf_metal_ops.HashGridConfig(3, n_levels=4, n_features_per_level=2, log2_hashmap_size=10)
      >>> cfg.params_shape
      (4096, 2)
      >>> params = tf.reshape(tf.range(8192, dtype=tf.float32) % 7 / 7, cfg.params_shape)
      >>> y = tf_metal_ops.hash_grid_encode([[0.1, 0.2, 0.3], [0.5, 0.5, 0.5]], params, config=cfg)
      >>> y.shape
      TensorShape([2, 8])
      >>> print(np.round(y.numpy()[1], 3))
      [0.571 0.714 0.714 0.857 0.857 0.    0.143 0.286]
      >>> y_t = tf_metal_ops.hash_grid_encode([[0.1, 0.2, 0.3], [0.5, 0.5, 0.5]], params, config=cfg,
      ...                                     feature_major=True)
      >>> y_t.shape, bool(tf.reduce_all(y_t == tf.transpose(y)))
      (TensorShape([8, 2]), True)
    """
    det = _deterministic("hash_grid_encode", deterministic)
    fm = check_flag("hash_grid_encode", "feature_major", feature_major)
    with tf.name_scope(name or "hash_grid_encode"):
        positions, params, cfg = _checked_inputs("hash_grid_encode", positions, params, config, options)
        level = _max_level_tensor(max_level, cfg.n_levels)
        out = ops().hash_grid_encode(
            positions,
            params,
            level,
            deterministic=det,
            feature_major=fm,
            **{k: getattr(cfg, k) for k in _ATTRS},
        )
        out.set_shape(_encoded_shape(positions, cfg, fm))
        return out


def hash_grid_encode_params_grad(positions, params, output_grad, *, config=None, max_level=None, deterministic=None,
                                 feature_major=False, name=None, **options):
    """The gradient of ``sum(hash_grid_encode(positions, params, **options) * output_grad)`` w.r.t. ``params``,
    computed without the forward pass (the registered gradient's op, called directly): equal, bitwise on the CPU, to
    ``tape.gradient(hash_grid_encode(positions, params, ...), params, output_gradients=output_grad)``.

    For data-parallel training that exchanges the per-sample output gradients ``[N, n_levels * F]`` (and the
    positions) instead of the dense table gradient: each worker then computes the table gradient of the whole
    batch itself. ``config`` or ``options``, ``deterministic``, ``feature_major`` (``output_grad`` then ``[n_levels * F, N]``):
    those of :func:`hash_grid_encode` (the same defaults).

    Example:
      >>> import tensorflow as tf
      >>> from tf_metal_ops.hash_grid import HashGridConfig, hash_grid_encode_params_grad
      >>> cfg = HashGridConfig(2, n_levels=2, n_features_per_level=2, log2_hashmap_size=6)
      >>> params = tf.zeros(cfg.params_shape)
      >>> g = hash_grid_encode_params_grad([[0.25, 0.5]], params, tf.ones([1, 4]), config=cfg)
      >>> float(tf.reduce_sum(g))  # each level's corner weights sum to 1, times F = 2 features
      4.0
    """
    fm = check_flag("hash_grid_encode_params_grad", "feature_major", feature_major)
    with tf.name_scope(name or "hash_grid_encode_params_grad"):
        positions, params, cfg = _checked_inputs("hash_grid_encode_params_grad", positions, params, config, options)
        dy = tf.convert_to_tensor(output_grad)
        if dy.dtype != params.dtype:
            raise ValueError(f"hash_grid_encode_params_grad: output_grad must have params' dtype {params.dtype.name}, "
                             f"got {dy.dtype.name}")
        want = _encoded_shape(positions, cfg, fm)
        if dy.shape.rank is not None and not dy.shape.is_compatible_with(want):
            layout = f"[{cfg.n_output_dims}, N] (feature_major)" if fm else f"[N, {cfg.n_output_dims}]"
            raise ValueError(f"hash_grid_encode_params_grad: output_grad must have shape {layout} "
                             f"with N = positions' rows ({positions.shape[0]}), got {dy.shape}")
        level = _max_level_tensor(max_level, cfg.n_levels)
        return ops().hash_grid_encode_grad_params(
            dy, positions, params, level, deterministic=_deterministic("hash_grid_encode_params_grad", deterministic),
            feature_major=fm, **{k: getattr(cfg, k) for k in _ATTRS})


def _attrs(op):
    out = {}
    for k in _ATTRS + _CALL_ATTRS:
        v = op.get_attr(k)
        out[k] = v.decode() if isinstance(v, bytes) else v
    return out


@tf.RegisterGradient("HashGridEncode")
def _hash_grid_encode_grad(op, dy):
    positions, params, max_level = op.inputs
    attrs = _attrs(op)
    # Eager backprop tells which inputs need no gradient; graphs prune the unused gradient op anyway.
    skip = set(getattr(op, "skip_input_indices", None) or ())
    g_pos = None
    g_params = None
    if 0 not in skip:
        g_pos = ops().hash_grid_encode_grad_positions(dy, positions, params, max_level, **attrs)
    if 1 not in skip:
        g_params = ops().hash_grid_encode_grad_params(dy, positions, params, max_level, **attrs)
    return [g_pos, g_params, None]


@tf.RegisterGradient("HashGridEncodeGradPositions")
def _hash_grid_encode_grad_positions_grad(op, ddx):
    """Gradient of the position gradient w.r.t. (dy, positions, params): one op computes all three."""
    dy, positions, params, max_level = op.inputs
    if ddx is None:
        return [None, None, None, None]
    d_dy, d_params, d_pos = ops().hash_grid_encode_grad_positions_grad(
        tf.cast(ddx, tf.float32), dy, positions, params, max_level, **_attrs(op)
    )
    return [d_dy, d_pos, d_params, None]
