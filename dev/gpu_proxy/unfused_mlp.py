"""The unfused baseline of the fused-MLP cases: the same network as separate cuBLAS products and elementwise kernels,
one launch per matrix product and per activation, every activation written to and read back from memory (what a
framework's Dense layers do). Half-precision operands; CuPy's float16 matmul is cuBLAS GemmEx with float32
accumulation. Biases none (tiny-cuda-nn's networks have none).

Layouts as the fused-MLP cases: params in fused_mlp's flat layout (docs/fused_mlp.md: matrices row-major
[outputs, inputs], the first one's inputs and the last one's outputs padded to 16), x [N, in_pad], y and dy
[N, out_pad] row-major. `spec`: (n_input padded, width, out_pad, n_hidden_layers, activation, output_activation),
activations by fused_mlp's codes (0 none, 1 relu, 3 sigmoid; the cases use no others).

Each function takes the CuPy module first and device arrays; dev/gpu_proxy/run.py calls them for launches of the
module "cupy" on the current (default) stream, so CUDA events time them as they time kernels.
"""

from __future__ import annotations


def matrices(cp, params, spec):
    """The weight matrices of the flat vector, as views."""
    in_pad, width, out_pad, n_hidden, _, _ = spec
    shapes = [(width, in_pad)] + [(width, width)] * (n_hidden - 1) + [(out_pad, width)]
    out, at = [], 0
    for r, c in shapes:
        out.append(params[at:at + r * c].reshape(r, c))
        at += r * c
    return out


def activate(cp, code, v):
    if code == 1:
        return cp.maximum(v, 0)
    if code == 3:
        return 1 / (1 + cp.exp(-v))
    if code == 0:
        return v
    raise ValueError(f"unfused_mlp: activation code {code} not supported here")


def derivative(cp, code, y):
    """f'(x) from y = f(x) (csrc/shared/fused_mlp_math.h)."""
    if code == 1:
        return (y > 0).astype(y.dtype)
    if code == 3:
        return y * (1 - y)
    if code == 0:
        return cp.ones_like(y)
    raise ValueError(f"unfused_mlp: activation code {code} not supported here")


def forward(cp, spec, params, x, y, hidden=None):
    """y[...] = the network of x; hidden (a list) receives the post-activation values when given."""
    ws = matrices(cp, params, spec)
    h = x
    for m, w in enumerate(ws):
        h = activate(cp, spec[5] if m == len(ws) - 1 else spec[4], h @ w.T)
        if hidden is not None and m < len(ws) - 1:
            hidden.append(h)
    y[...] = h


def train(cp, spec, params, grads, x, dy, y, dx):
    """The forward keeping the hidden values, then dx and the parameter gradient grads (overwritten)."""
    hidden = []
    forward(cp, spec, params, x, y, hidden)
    ws, gs = matrices(cp, params, spec), matrices(cp, grads, spec)
    g = dy * derivative(cp, spec[5], y)
    for m in range(len(ws) - 1, -1, -1):
        prev = hidden[m - 1] if m > 0 else x
        cp.matmul(g.T, prev, out=gs[m])
        dh = g @ ws[m]
        if m > 0:
            g = dh * derivative(cp, spec[4], prev)
        else:
            dx[...] = dh
