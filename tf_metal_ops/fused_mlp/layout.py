"""The fused MLP's configuration checks and its flat parameter vector: layout, count and initial values.

Layout (the op's, csrc/ops/fused_mlp_args.h; docs/fused_mlp.md compares it with tiny-cuda-nn's): L =
n_hidden_layers + 1 weight matrices, each row-major ``[outputs, inputs]``, back to back:
``W_1 [width, in_pad]``, ``W_2 .. W_{L-1} [width, width]``, ``W_L [out_pad, width]``, where in_pad and out_pad are
n_input and n_output rounded up to a multiple of 16 (tiny-cuda-nn's FullyFusedMLP layout); then, with
``use_bias``, the biases ``b_1 .. b_{L-1} [width]`` and ``b_L [n_output]``. Padding entries never change the output
and get zero gradient.
"""

from __future__ import annotations

import dataclasses
import numbers

import numpy as np

ACTIVATIONS = ("none", "relu", "leaky_relu", "sigmoid", "exponential", "softplus")
PRODUCTS = ("float32", "bfloat16")  # the products option (docs/fused_mlp.md "bfloat16 products")
WIDTHS = (16, 32, 64, 128)
MAX_HIDDEN_LAYERS = 8
LEAKY_SLOPE = 0.01  # tiny-cuda-nn's LeakyReLU slope (csrc/shared/fused_mlp_math.h FM_LEAKY_SLOPE)


def _round16(n):
    return (n + 15) // 16 * 16


def check_int(fn, name, value, lo, hi):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not lo <= value <= hi:
        raise ValueError(f"{fn}: {name} must be an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


def check_config(fn, width, n_hidden_layers, n_output, activation, output_activation, use_bias, products="float32",
                 feature_major=False):
    """The checked attrs as a dict (ValueError naming ``fn`` and the argument otherwise)."""
    if isinstance(width, bool) or width not in WIDTHS:
        raise ValueError(f"{fn}: width must be one of {WIDTHS}, got {width!r}")
    n_hidden_layers = check_int(fn, "n_hidden_layers", n_hidden_layers, 1, MAX_HIDDEN_LAYERS)
    n_output = check_int(fn, "n_output", n_output, 1, int(width))
    for name, act in (("activation", activation), ("output_activation", output_activation)):
        if act not in ACTIVATIONS:
            raise ValueError(f"{fn}: {name} must be one of {ACTIVATIONS}, got {act!r}")
    if not isinstance(use_bias, bool):
        raise ValueError(f"{fn}: use_bias must be True or False, got {use_bias!r}")
    if not isinstance(products, str) or products not in PRODUCTS:
        raise ValueError(f"{fn}: products must be one of {PRODUCTS}, got {products!r}")
    if not isinstance(feature_major, bool):
        raise ValueError(f"{fn}: feature_major must be True or False, got {feature_major!r}")
    return dict(n_hidden_layers=n_hidden_layers, width=int(width), n_output=n_output, activation=activation,
                output_activation=output_activation, use_bias=use_bias, products=products,
                feature_major=feature_major)


@dataclasses.dataclass(frozen=True)
class FusedMlpLayout:
    """Where every matrix and bias of a fused MLP sits in its flat parameter vector.

    ``matrices``: ``(offset, (rows, cols))`` per layer, row-major (rows = outputs, padded; cols = inputs, padded);
    ``biases``: ``(offset, length)`` per layer (empty without ``use_bias``); ``n_params``: the vector's length.
    """

    n_input: int
    n_output: int
    width: int
    n_hidden_layers: int
    use_bias: bool
    matrices: tuple
    biases: tuple
    n_params: int

    def unpack(self, params):
        """``(weights, biases)``: NumPy views of ``params`` (a 1-D array) as the row-major matrices and the biases."""
        params = np.asarray(params)
        if params.shape != (self.n_params,):
            raise ValueError(f"FusedMlpLayout.unpack: params must have shape ({self.n_params},), got {params.shape}")
        weights = [params[o:o + r * c].reshape(r, c) for o, (r, c) in self.matrices]
        biases = [params[o:o + n] for o, n in self.biases]
        return weights, biases

    def init_params(self, seed=0, dtype=np.float32):
        """Initial parameters as tiny-cuda-nn initialises its MLPs: every matrix Xavier-uniform,
        U(-s, s) with s = sqrt(6 / (rows + cols)) of its padded shape; padding entries and biases 0."""
        rng = np.random.default_rng(seed)
        return (rng.uniform(-1.0, 1.0, self.n_params) * self.init_scale()).astype(dtype)

    def init_scale(self):
        """Per parameter, the half-width of its initial uniform distribution (0 for padding and biases)."""
        scale = np.zeros(self.n_params, np.float64)
        for m, (o, (r, c)) in enumerate(self.matrices):
            s = np.zeros((r, c))
            real_rows = self.n_output if m == len(self.matrices) - 1 else r
            real_cols = self.n_input if m == 0 else c
            s[:real_rows, :real_cols] = np.sqrt(6.0 / (r + c))
            scale[o:o + r * c] = s.reshape(-1)
        return scale


def fused_mlp_layout(n_input, n_output, *, width, n_hidden_layers, use_bias=False):
    """The parameter layout of a fused MLP with ``n_input`` inputs and ``n_output`` outputs (both at most
    ``width``; see :class:`FusedMlpLayout`).

    Example:
      >>> from tf_metal_ops import fused_mlp_layout
      >>> lay = fused_mlp_layout(32, 3, width=64, n_hidden_layers=2)
      >>> lay.n_params  # 64*32 + 64*64 + 16*64: W_L padded to 16 output rows
      7168
      >>> lay.matrices
      ((0, (64, 32)), (2048, (64, 64)), (6144, (16, 64)))
      >>> fused_mlp_layout(3, 1, width=16, n_hidden_layers=1, use_bias=True).biases
      ((512, 16), (528, 1))
      >>> params = lay.init_params(seed=0)
      >>> params.shape, params.dtype, float(abs(params[2048:6144]).max()) <= (6 / (64 + 64)) ** 0.5
      ((7168,), dtype('float32'), True)
    """
    fn = "fused_mlp_layout"
    cfg = check_config(fn, width, n_hidden_layers, n_output, "none", "none", use_bias)
    n_input = check_int(fn, "n_input", n_input, 1, cfg["width"])
    w, layers = cfg["width"], cfg["n_hidden_layers"]
    shapes = [(w, _round16(n_input))] + [(w, w)] * (layers - 1) + [(_round16(cfg["n_output"]), w)]
    matrices, at = [], 0
    for r, c in shapes:
        matrices.append((at, (r, c)))
        at += r * c
    biases = []
    if use_bias:
        for length in [w] * layers + [cfg["n_output"]]:
            biases.append((at, length))
            at += length
    return FusedMlpLayout(n_input, cfg["n_output"], w, layers, use_bias, tuple(matrices), tuple(biases), at)
