"""A custom loss with the package's rendering ops: photometric MSE + lambda * distortion, trained with model.fit.

The scene is synthetic and tiny so this runs in seconds on a CPU: rays are indexed by u in [0, 1] (a 1-D
"camera"); each ray sees an opaque surface of colour c(u) over a black background. A Keras MLP
maps (u, sample position) to a density and an RGB colour; ``tf_metal_ops.volume_render`` composites the samples
into a pixel colour and ``tf_metal_ops.distortion_loss`` regularises the weight distribution along each ray
(mip-NeRF 360: it pulls the weights into a compact peak instead of a haze of floaters).

How the custom loss plugs into Keras: ``RadianceFieldModel.train_step`` overrides the default step. Inside a
``tf.GradientTape`` it renders, forms ``mse + lam * mean(distortion)``, and applies the gradients; both custom
ops have registered gradients, so the tape differentiates through them (CPU kernels here, Metal kernels on a Mac).
The model is compiled with ``jit_compile=False``: XLA cannot compile custom ops.

    python examples/distortion_loss_fit.py                 # 8 epochs x 40 steps, prints the losses
    python examples/distortion_loss_fit.py --steps 5 --epochs 2 --lam 0   # quick, without the regulariser
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import tf_metal_ops as tfmo  # noqa: E402

NEAR, FAR = 2.0, 6.0


def surface_color(u):
    return np.stack([0.5 + 0.5 * np.cos(2 * np.pi * u), u, 1.0 - u], axis=-1)


def make_dataset(num_rays, batch, seed=0):
    rng = np.random.default_rng(seed)
    u = rng.uniform(0, 1, (num_rays, 1)).astype(np.float32)
    target = surface_color(u[:, 0]).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((u, target)).shuffle(num_rays, seed=seed).repeat().batch(batch)


def encode(x, freqs):
    """Positional encoding: x, sin(2^k pi x), cos(2^k pi x)."""
    scaled = x[..., None] * (np.pi * 2.0 ** np.arange(freqs, dtype=np.float32))
    return tf.concat([x[..., None], tf.sin(scaled), tf.cos(scaled)], axis=-1)


class RadianceFieldModel(keras.Model):
    """MLP radiance field over (u, t); ``call`` renders rays with the fused volume-rendering op."""

    def __init__(self, samples=32, lam=0.01, width=64, freqs=6, **kwargs):
        super().__init__(**kwargs)
        self.samples = samples
        self.lam = lam
        self.freqs = freqs
        self.mlp = keras.Sequential([
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(4),
        ])
        self.mse_tracker = keras.metrics.Mean(name="mse")
        self.dist_tracker = keras.metrics.Mean(name="distortion")
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def sample_edges(self, num_rays, training):
        """[R, S+1] interval edges; stratified jitter while training (still sorted)."""
        base = tf.linspace(NEAR, FAR, self.samples + 1)[None, :]
        base = tf.tile(base, [num_rays, 1])
        if training:
            step = (FAR - NEAR) / self.samples
            jitter = tf.random.uniform([num_rays, self.samples - 1], -0.4 * step, 0.4 * step)
            base = tf.concat([base[:, :1], base[:, 1:-1] + jitter, base[:, -1:]], axis=1)
        return base

    def call(self, u, training=False):
        num_rays = tf.shape(u)[0]
        t = self.sample_edges(num_rays, training)
        mid = 0.5 * (t[:, 1:] + t[:, :-1])
        u_b = tf.broadcast_to(u, tf.shape(mid))
        feats = tf.concat([encode(u_b, self.freqs), encode((mid - NEAR) / (FAR - NEAR), self.freqs)], axis=-1)
        raw = self.mlp(feats)  # [R, S, 4]
        densities = tf.nn.softplus(raw[..., 0] - 1.0) * 10.0
        colors = tf.sigmoid(raw[..., 1:])
        out = tfmo.volume_render(densities, colors, t)  # black background
        return out, t

    def train_step(self, data):
        u, target = data
        with tf.GradientTape() as tape:
            out, t = self(u, training=True)
            mse = tf.reduce_mean(tf.square(out.color - target))
            dist = tf.reduce_mean(tfmo.distortion_loss(out.weights, t))
            loss = mse + self.lam * dist
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        for tracker, value in ((self.mse_tracker, mse), (self.dist_tracker, dist), (self.loss_tracker, loss)):
            tracker.update_state(value)
        return {m.name: m.result() for m in self.metrics}

    @property
    def metrics(self):
        return [self.loss_tracker, self.mse_tracker, self.dist_tracker]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40, help="steps per epoch")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch", type=int, default=256, help="rays per step")
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--lam", type=float, default=0.01, help="weight of the distortion loss")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    keras.utils.set_random_seed(args.seed)
    model = RadianceFieldModel(samples=args.samples, lam=args.lam)
    model.compile(optimizer=keras.optimizers.Adam(3e-3), jit_compile=False)
    history = model.fit(make_dataset(4096, args.batch, args.seed), epochs=args.epochs, steps_per_epoch=args.steps,
                        shuffle=False, verbose=0)
    for epoch, (loss, mse, dist) in enumerate(zip(history.history["loss"], history.history["mse"],
                                                  history.history["distortion"])):
        print(f"epoch {epoch + 1}: loss {loss:.5f}  mse {mse:.5f}  distortion {dist:.5f}")

    # Evaluate: colour error, and how compact the weights along each ray are (the distortion loss's job;
    # compare --lam 0). A 1-D camera cannot pin down *where* the surface is, only what colour it has.
    u = np.linspace(0, 1, 200, dtype=np.float32)[:, None]
    out, t = model(u)
    mse = float(np.mean((out.color.numpy() - surface_color(u[:, 0])) ** 2))
    w = out.weights.numpy()
    mid = 0.5 * (t.numpy()[:, 1:] + t.numpy()[:, :-1])
    mean_t = np.sum(w * mid, axis=1) / np.maximum(w.sum(axis=1), 1e-6)
    spread = float(np.mean(np.sqrt(np.sum(w * (mid - mean_t[:, None]) ** 2, axis=1) / np.maximum(w.sum(1), 1e-6))))
    dist = float(np.mean(tfmo.distortion_loss(out.weights, t)))
    print(f"eval: colour mse {mse:.5f}  distortion {dist:.5f}  weight spread along rays {spread:.3f}  "
          f"mean opacity {float(np.mean(out.opacity)):.3f}")
    return history


if __name__ == "__main__":
    main()
