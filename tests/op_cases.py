"""One representative call per public op (forward, and backward where the op has a gradient), used by the
concurrency, fork and memory tests. A case is (inputs, fn): fixed seeded numpy inputs, and a function of the
input tensors returning a list of tensors, usable eagerly and inside tf.function. Repeated calls must agree
exactly."""

import numpy as np
import tensorflow as tf

import tf_metal_ops


def _zero_out():
    x = np.arange(1, 4097, dtype=np.float32).reshape(64, 64)
    return [x], lambda x: [tf_metal_ops.zero_out(x)]


CASES = {"zero_out": _zero_out}


def run_eager(name):
    inputs, fn = CASES[name]()
    return [t.numpy() for t in fn(*[tf.constant(a) for a in inputs])]
