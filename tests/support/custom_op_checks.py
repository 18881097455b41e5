"""Checks of examples/custom_op (a user's op written with the op kit), run in a subprocess by
tests/test_custom_op_example.py from a copy of the example in a fresh directory:

    cd tests && PYTHONPATH=EXAMPLE_DIR python -m support.custom_op_checks       # CPU kernels
    cd tests && PYTHONPATH=EXAMPLE_DIR TF_METAL_OPS_EMULATED_GPU=1 python -m support.custom_op_checks
                                                                  # + the GPU kernels on the emulated GPU

Values against a NumPy float64 reference (rtol 1e-5), the gradient with tf.test.compute_gradient (float32 finite
differences: atol 2e-3), a Keras model.compile(loss=RobustLoss()) fit, errors; prints timings of load().
"""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_metal_ops  # noqa: E402
from tf_metal_ops import emulated_gpu  # noqa: E402

import robust_loss as rl  # noqa: E402  (EXAMPLE_DIR/robust_loss.py)


def reference(p, t, eps):
    d = p.astype(np.float64) - t.astype(np.float64)
    return (np.sqrt(d * d + eps * eps) - eps).sum(axis=1)


def main():
    t0 = time.perf_counter()
    lib = rl.library()
    print(f"load() {time.perf_counter() - t0:.2f} s")
    gpu = emulated_gpu.enabled()
    devices = ["/CPU:0"] + (["/GPU:0"] if gpu else [])
    rng = np.random.default_rng(0)
    for device in devices:
        for n, c, eps in ((1, 1, 1e-3), (1000, 3, 1e-2), (5, 0, 1e-3), (0, 4, 1e-3)):
            p = rng.standard_normal((n, c)).astype(np.float32)
            t = rng.standard_normal((n, c)).astype(np.float32)
            with tf.device(device):
                pv, tv = tf.constant(p), tf.constant(t)
                with tf.GradientTape() as tape:
                    tape.watch([pv, tv])
                    loss = rl.robust_loss(pv, tv, eps)
                gp, gt = tape.gradient(loss, [pv, tv])
            if device == "/GPU:0" and n and c:
                assert loss.device.endswith("GPU:0") and gp.device.endswith("GPU:0"), (loss.device, gp.device)
            np.testing.assert_allclose(loss.numpy(), reference(p, t, eps), rtol=1e-5, atol=1e-6)
            d = p.astype(np.float64) - t
            np.testing.assert_allclose(gp.numpy(), d / np.sqrt(d * d + eps * eps), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(gt.numpy(), -gp.numpy())
        with tf.device(device):
            p = tf.constant(rng.standard_normal((6, 3)).astype(np.float32))
            t = tf.constant(rng.standard_normal((6, 3)).astype(np.float32))
            theoretical, numerical = tf.test.compute_gradient(lambda x: rl.robust_loss(x, t, 0.1), [p])
            np.testing.assert_allclose(theoretical[0], numerical[0], atol=2e-3)
            try:
                lib.robust_loss(tf.zeros((3, 2)), tf.zeros((3, 4)), epsilon=0.1)
            except tf.errors.InvalidArgumentError as e:
                assert "one shape" in str(e), e
            else:
                raise AssertionError("mismatched shapes must fail in the kernel")
            try:
                lib.robust_loss(tf.zeros((3, 2)), tf.zeros((3, 2)), epsilon=-1.0)
            except tf.errors.InvalidArgumentError as e:
                assert "epsilon must be > 0" in str(e), e
            else:
                raise AssertionError("epsilon <= 0 must fail")
    if gpu:
        counts = emulated_gpu.dispatch_counts(library=lib.library_path)
        assert counts.get("robust_loss_forward", 0) > 0 and counts.get("robust_loss_backward", 0) > 0, counts
        print("GPU dispatches", counts)
    rl.main()  # the Keras model.compile(loss=RobustLoss()) demo; prints the loss before/after
    print("ok", ", ".join(devices))


if __name__ == "__main__":
    main()
