"""A user's custom loss op, written only with tf_metal_ops' op kit: the robust photometric (Charbonnier) loss
rho(d) = sqrt(d^2 + eps^2) - eps, summed over channels, with CPU and Metal kernels and a registered gradient.

    python robust_loss.py                                       # CPU kernels
    TF_METAL_OPS_EMULATED_GPU=1 python robust_loss.py           # Linux: GPU kernels on the emulated GPU

Files: robust_loss_op.cc (op definitions, CPU kernels), robust_loss_gpu.cc (GPU host code), robust_loss.metal
(Metal kernels), robust_loss_math.h (per-element math shared by both), robust_loss_host.h (attr and input checks).
"""

import functools
import os

import tensorflow as tf

import tf_metal_ops  # noqa: F401  (first: with TF_METAL_OPS_EMULATED_GPU=1 it creates the GPU before TF starts)
from tf_metal_ops import extension

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ["robust_loss_op.cc", "robust_loss_gpu.cc", "robust_loss.metal"]


@functools.lru_cache(maxsize=None)
def library():
    """The op library, built on first use (cached by content: later processes only load it)."""
    return extension.load("robust_loss", [os.path.join(HERE, s) for s in SOURCES])


def robust_loss(predictions, targets, epsilon=1e-3):
    """Per-row loss [N] of predictions and targets [N, C] (float32)."""
    predictions = tf.convert_to_tensor(predictions, tf.float32)
    targets = tf.convert_to_tensor(targets, tf.float32)
    if predictions.shape.rank is not None and predictions.shape.rank != 2:
        raise ValueError(f"robust_loss: predictions must be [N, C], got shape {predictions.shape}")
    if not epsilon > 0:
        raise ValueError(f"robust_loss: epsilon must be > 0, got {epsilon}")
    return library().robust_loss(predictions, targets, epsilon=float(epsilon))


@tf.RegisterGradient("RobustLoss")
def _robust_loss_grad(op, grad_loss):
    eps = op.get_attr("epsilon")
    g = library().robust_loss_grad(grad_loss, op.inputs[0], op.inputs[1], epsilon=eps)
    return [g, -g]


class RobustLoss(tf.keras.losses.Loss):
    """Keras loss: mean over the batch of the per-row robust loss (use in model.compile(loss=RobustLoss()))."""

    def __init__(self, epsilon=1e-3, name="robust_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.epsilon = epsilon

    def call(self, y_true, y_pred):
        return robust_loss(tf.reshape(y_pred, [tf.shape(y_pred)[0], -1]),
                           tf.reshape(y_true, [tf.shape(y_true)[0], -1]), self.epsilon)

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon}


def main():
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.random((2048, 8), dtype=np.float32)
    y = (x @ rng.standard_normal((8, 3)).astype(np.float32)).astype(np.float32)
    y[::17] += 5.0  # outliers: the robust loss shrugs them off
    with tf.device("/CPU:0"):  # variables on the CPU (see docs/emulated_gpu.md for the emulated GPU)
        model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(3)])
        # jit_compile=False: a custom op has no XLA kernel (Keras would otherwise XLA-compile the step on a GPU).
        model.compile(optimizer=tf.keras.optimizers.Adam(0.05), loss=RobustLoss(epsilon=1e-2), jit_compile=False)
        model.optimizer.build(model.trainable_variables)
    device = "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"
    with tf.device(device):
        hist = model.fit(x, y, epochs=20, batch_size=256, verbose=0)
    print(f"{device}: robust loss {hist.history['loss'][0]:.4f} -> {hist.history['loss'][-1]:.4f}")


if __name__ == "__main__":
    main()
