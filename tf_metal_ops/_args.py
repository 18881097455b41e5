"""Argument checks shared by the Python wrappers of the ops (render, render_packed, ray_march, occupancy): each
raises ValueError naming the function and the argument, before anything runs."""

from __future__ import annotations

import numbers

import numpy as np
import tensorflow as tf


def _float32(x, fn, name):
    x = tf.convert_to_tensor(x, dtype_hint=tf.float32)
    if x.dtype != tf.float32:
        raise ValueError(f"{fn}: {name} must be float32, got {x.dtype.name} (cast it with tf.cast)")
    return x


def _check_rank(x, rank, fn, name, layout):
    if x.shape.rank is not None and x.shape.rank != rank:
        raise ValueError(f"{fn}: {name} must have rank {rank} {layout}, got shape {x.shape}")


def _check_dim(fn, what, got, want):
    if got is not None and want is not None and got != want:
        raise ValueError(f"{fn}: {what} is {got}, expected {want}")


def _check_threshold(fn, thr):
    if isinstance(thr, bool) or not isinstance(thr, numbers.Real) or not (0.0 <= float(thr) <= 1.0):
        raise ValueError(f"{fn}: termination_threshold must be a number in [0, 1], got {thr!r}")
    return float(thr)


def _check_background(fn, background, r, c):
    """background (a float32 tensor) of r rays (None: unknown) with c channels: [C] or [R, C]."""
    if background.shape.rank == 1:
        _check_dim(fn, "background.shape[0] (channels)", background.shape[0], c)
    elif background.shape.rank == 2:
        _check_dim(fn, "background.shape[0] (rays)", background.shape[0], r)
        _check_dim(fn, "background.shape[1] (channels)", background.shape[1], c)
    elif background.shape.rank is not None:
        raise ValueError(f"{fn}: background must have shape [C] or [rays, C], got {background.shape}")


def _check_int(fn, name, v, lo, hi=None):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo or (hi is not None and v > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{fn}: {name} must be an integer {rng}, got {v!r}")
    return int(v)


def _check_real(fn, name, v, lo, *, strict):
    ok = not isinstance(v, bool) and isinstance(v, numbers.Real) and np.isfinite(float(v))
    ok = ok and (float(v) > lo if strict else float(v) >= lo)
    if not ok:
        raise ValueError(f"{fn}: {name} must be a finite number {'>' if strict else '>='} {lo}, got {v!r}")
    return float(v)
