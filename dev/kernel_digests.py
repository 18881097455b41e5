"""SHA-256 digests of every op's outputs and gradients on a fixed set of inputs, on /CPU:0 and, with
TF_METAL_OPS_EMULATED_GPU set, on the emulated GPU: a change that must not move a result (a kernel rewritten as a
template, a new signature reader) prints the same digests before and after.

    python dev/kernel_digests.py > cpu.txt
    TF_METAL_OPS_EMULATED_GPU=1 python dev/kernel_digests.py --device GPU > gpu_direct.txt
    TF_METAL_OPS_EMULATED_GPU=$(python dev/apple_doubles/build.py) python dev/kernel_digests.py --device GPU

Table gradients are taken with deterministic=True (fixed-point sums): the float-atomic scatter's summation order
varies from run to run on a GPU, so its bits are not a property of the code. Every other output is.
"""

from __future__ import annotations

import argparse
import hashlib
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_metal_ops as t  # noqa: E402

# (dims, n_features, grid_type, interpolation): the specialised instances (3, 2, linear), (2, 2), (3, 4) and the
# general kernel (D = 1, 4; smoothstep; nearest; dense and tiled grids).
HASH_GRID_CASES = [
    (3, 2, "hash", "linear"), (2, 2, "hash", "linear"), (3, 4, "hash", "linear"), (4, 2, "hash", "linear"),
    (1, 8, "dense", "linear"), (3, 2, "tiled", "smoothstep"), (2, 4, "hash", "nearest"),
]


def digest(x) -> str:
    if x is None or not np.issubdtype(np.asarray(x).dtype, np.number):
        raise TypeError(f"not a numeric tensor: {x!r}")
    a = np.ascontiguousarray(np.asarray(x))
    return hashlib.sha256(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes()).hexdigest()[:16]


def hash_grid(device, rng, out):
    for dims, f, grid, interp in HASH_GRID_CASES:
        for dtype in (np.float32, np.float16):
            for fm in (False, True):
                n, levels, log2 = 777, 6, 12
                x = rng.random((n, dims), dtype=np.float32)
                cfg = dict(n_levels=levels, n_features_per_level=f, log2_hashmap_size=log2, base_resolution=4,
                           per_level_scale=1.5, grid_type=grid, interpolation=interp, feature_major=fm,
                           deterministic=True)
                rows = t.hash_grid.HashGridConfig(n_levels=levels, n_features_per_level=f, log2_hashmap_size=log2,
                                                  base_resolution=4, per_level_scale=1.5, grid_type=grid,
                                                  n_input_dims=dims).n_params // f
                p = (rng.standard_normal((rows, f)) * 0.1).astype(dtype)
                shape = (levels * f, n) if fm else (n, levels * f)
                dy = rng.standard_normal(shape).astype(dtype)
                ddx = rng.standard_normal((n, dims)).astype(np.float32)
                with tf.device(device):
                    xv, pv, dyv, ddxv = map(tf.constant, (x, p, dy, ddx))
                    with tf.GradientTape(persistent=True) as outer:
                        outer.watch([xv, pv, dyv])
                        with tf.GradientTape(persistent=True) as inner:
                            inner.watch([xv, pv])
                            y = t.hash_grid_encode(xv, pv, **cfg)
                        gx, gp = inner.gradient(y, [xv, pv], output_gradients=dyv)
                        s = tf.reduce_sum(gx * ddxv)
                    g2 = outer.gradient(s, [dyv, xv, pv]) if interp != "nearest" else [None] * 3
                assert y.device.endswith(device.lstrip("/")), f"ran on {y.device}, not {device}"
                key = f"hash_grid d{dims} f{f} {grid} {interp} {np.dtype(dtype).name} fm={int(fm)}"
                out[key + " encode"] = digest(y)
                out[key + " grad_positions"] = digest(gx)
                out[key + " grad_params(det)"] = digest(gp)
                for name, g in zip(("grad2 d/ddy", "grad2 d/dx", "grad2 d/dparams(det)"), g2):
                    if g is not None:
                        out[key + " " + name] = digest(g)


def rendering(device, rng, out):
    r, s = 300, 37
    sigma = (rng.random((r, s)) * 3).astype(np.float32)
    rgb = rng.random((r, s, 3)).astype(np.float32)
    tt = np.sort(rng.random((r, s + 1)), axis=1).astype(np.float32)
    bg = rng.random((r, 3)).astype(np.float32)
    with tf.device(device):
        args = list(map(tf.constant, (sigma, rgb, tt, bg)))
        with tf.GradientTape() as tape:
            tape.watch(args)
            res = t.volume_render(*args)
            loss = sum(tf.reduce_sum(v * (i + 1)) for i, v in enumerate(res))
        grads = tape.gradient(loss, args)
        w = res[-1]
        with tf.GradientTape() as tape:
            tape.watch([w, args[2]])
            dl = t.distortion_loss(w, args[2])
        dgrads = tape.gradient(dl, [w, args[2]])
    for i, v in enumerate(res):
        out[f"volume_render out{i}"] = digest(v)
    for i, g in enumerate(grads):
        out[f"volume_render grad{i}"] = digest(g)
    out["distortion_loss"] = digest(dl)
    for i, g in enumerate(dgrads):
        out[f"distortion_loss grad{i}"] = digest(g)
    # packed
    counts = rng.integers(0, 20, size=200)
    splits = np.r_[0, np.cumsum(counts)].astype(np.int64)
    n = int(splits[-1])
    d = (rng.random(n) * 3).astype(np.float32)
    c = rng.random((n, 3)).astype(np.float32)
    edges = np.cumsum(rng.random(2 * n) * 0.05).astype(np.float32)  # sorted, non-overlapping samples
    t0, t1 = edges[0::2].copy(), edges[1::2].copy()
    with tf.device(device):
        pa = list(map(tf.constant, (d, c, t0, t1)))
        sp = tf.constant(splits)
        with tf.GradientTape() as tape:
            tape.watch(pa)
            res = t.volume_render_packed(*pa, sp)
            loss = sum(tf.reduce_sum(v * (i + 1)) for i, v in enumerate(res))
            dl = t.distortion_loss_packed(res[-1], pa[2], pa[3], sp)
            total = loss + dl
        grads = tape.gradient(total, pa)
    for i, v in enumerate(res):
        out[f"volume_render_packed out{i}"] = digest(v)
    out["distortion_loss_packed"] = digest(dl)
    for i, g in enumerate(grads):
        out[f"render_packed grad{i}"] = digest(g)


def ray_march(device, rng, out):
    for cascades in (1, 3):
        grid = t.OccupancyGrid(((-1, -1, -1), (1, 1, 1)), resolution=32, cascades=cascades)
        grid.bits.assign(grid._pack(tf.constant(rng.random(grid.num_cells) < 0.3)))
        o = (rng.random((500, 3)) * 2 - 1).astype(np.float32)
        dvec = rng.standard_normal((500, 3)).astype(np.float32)
        dvec /= np.linalg.norm(dvec, axis=1, keepdims=True)
        with tf.device(device):
            res = t.ray_march(tf.constant(o), tf.constant(dvec), grid, near=0.0, far=4.0, step_size=0.02,
                              cone_angle=0.004, max_samples=64, jitter=True, seed=7)
        for name in ("t_starts", "t_ends", "row_splits", "ray_indices", "positions"):
            out[f"ray_march k{cascades} {name}"] = digest(getattr(res, name))


def zero_out(device, rng, out):
    for dtype in (np.int32, np.int64, np.float32, np.float16):
        x = rng.integers(1, 100, size=(31, 7)).astype(dtype)
        with tf.device(device):
            out[f"zero_out {np.dtype(dtype).name}"] = digest(t.zero_out(tf.constant(x)))


def fused_mlp(device, rng, out):
    # (n_input, n_output, width, hidden layers, activation, output activation, bias): NeRF's density and colour
    # networks, and every width with the other activations (rows not a multiple of a block, so padding is exercised).
    cases = [(32, 16, 64, 1, "relu", "none", False), (32, 3, 64, 2, "relu", "sigmoid", False),
             (5, 7, 16, 3, "leaky_relu", "exponential", True), (20, 32, 32, 2, "softplus", "relu", True),
             (100, 1, 128, 1, "sigmoid", "softplus", False)]
    for n_in, n_out, width, layers, act, out_act, bias in cases:
        lay = t.fused_mlp_layout(n_in, n_out, width=width, n_hidden_layers=layers, use_bias=bias)
        for dtype in (np.float32, np.float16):
            x = tf.constant(rng.uniform(-1, 1, (1000, n_in)).astype(dtype))
            params = tf.constant((rng.standard_normal(lay.n_params) / np.sqrt(width)).astype(dtype))
            key = f"fused_mlp {n_in}->{layers}x{width}->{n_out} {act}/{out_act} bias={bias} {np.dtype(dtype).name}"
            with tf.device(device), tf.GradientTape() as tape:
                tape.watch([x, params])
                y = t.fused_mlp(x, params, n_hidden_layers=layers, width=width, n_output=n_out, activation=act,
                                output_activation=out_act, use_bias=bias)
                loss = tf.reduce_sum(tf.cast(y, tf.float32) * tf.cast(tf.range(n_out) + 1, tf.float32))
            gx, gp = tape.gradient(loss, [x, params])
            out[key] = digest(y)
            out[key + " grad_x"] = digest(gx)
            out[key + " grad_params"] = digest(gp)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("CPU", "GPU"), default="CPU")
    args = ap.parse_args()
    device = f"/{args.device}:0"
    out = {}
    for fn in (hash_grid, rendering, ray_march, fused_mlp, zero_out):
        fn(device, np.random.default_rng(0), out)
    for k, v in out.items():
        print(f"{v}  {k}")
    print(f"{hashlib.sha256(''.join(out.values()).encode()).hexdigest()[:16]}  ALL ({len(out)} outputs, {device})")


if __name__ == "__main__":
    main()
