"""NumPy float64 reference of the fused MLP (forward and backward), for tests: written from the definitions in
docs/fused_mlp.md, independent of the kernels and of TensorFlow."""

from __future__ import annotations

import numpy as np

from tf_metal_ops.fused_mlp.layout import LEAKY_SLOPE, fused_mlp_layout


def activate(name, x):
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "leaky_relu":
        return np.where(x > 0, x, LEAKY_SLOPE * x)
    if name == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    if name == "exponential":
        return np.exp(x)
    if name == "softplus":
        return np.logaddexp(0.0, x)
    return x


def derivative(name, x):
    """d activate(name, x) / dx from the pre-activation x (relu: 0 at 0; leaky_relu: the slope at 0)."""
    if name == "relu":
        return (x > 0).astype(np.float64)
    if name == "leaky_relu":
        return np.where(x > 0, 1.0, LEAKY_SLOPE)
    if name == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-x))
        return s * (1.0 - s)
    if name == "exponential":
        return np.exp(x)
    if name == "softplus":
        return 1.0 / (1.0 + np.exp(-x))
    return np.ones_like(x)


def _unpack(x, params, width, n_hidden_layers, n_output, use_bias):
    x = np.asarray(x, np.float64)
    lay = fused_mlp_layout(x.shape[1], n_output, width=width, n_hidden_layers=n_hidden_layers, use_bias=use_bias)
    weights, biases = lay.unpack(np.asarray(params, np.float64))
    if not use_bias:
        biases = [np.zeros(w.shape[0]) for w in weights]
    else:
        biases = [np.pad(b, (0, w.shape[0] - b.shape[0])) for w, b in zip(weights, biases)]
    xp = np.zeros((x.shape[0], weights[0].shape[1]))
    xp[:, :x.shape[1]] = x
    return lay, weights, biases, xp


def forward(x, params, *, width, n_hidden_layers, n_output, activation="relu", output_activation="none",
            use_bias=False):
    """(y [N, n_output], pre-activations per layer, inputs per layer), float64."""
    lay, weights, biases, h = _unpack(x, params, width, n_hidden_layers, n_output, use_bias)
    pre, inputs = [], []
    for m, (w, b) in enumerate(zip(weights, biases)):
        inputs.append(h)
        z = h @ w.T + b
        pre.append(z)
        h = activate(output_activation if m == len(weights) - 1 else activation, z)
    return h[:, :n_output], pre, inputs


def backward(dy, x, params, *, width, n_hidden_layers, n_output, activation="relu", output_activation="none",
             use_bias=False):
    """(dx [N, n_input], dparams [P]): the gradients of sum(dy * y), float64."""
    lay, weights, biases, _ = _unpack(x, params, width, n_hidden_layers, n_output, use_bias)
    _, pre, inputs = forward(x, params, width=width, n_hidden_layers=n_hidden_layers, n_output=n_output,
                             activation=activation, output_activation=output_activation, use_bias=use_bias)
    dparams = np.zeros(lay.n_params)
    g = np.zeros((np.shape(x)[0], weights[-1].shape[0]))
    g[:, :n_output] = np.asarray(dy, np.float64)
    for m in range(len(weights) - 1, -1, -1):
        g = g * derivative(output_activation if m == len(weights) - 1 else activation, pre[m])
        o, (r, c) = lay.matrices[m]
        dparams[o:o + r * c] = (g.T @ inputs[m]).reshape(-1)
        if use_bias:
            bo, n = lay.biases[m]
            dparams[bo:bo + n] = g.sum(axis=0)[:n]
        g = g @ weights[m]
    # Padding of W_1's columns (zero inputs) and of W_L's rows (no output) gets no gradient.
    return g[:, :np.shape(x)[1]], dparams
