"""Fit a neural signed distance function (hash-grid encoding + small MLP) to a procedural shape with a known exact
SDF, with an eikonal loss — the use case of the hash grid's second derivatives (HashGridEncodeGradPositionsGrad).

    pip install ".[sdf]"          # scikit-image (marching cubes), tqdm, imageio
    python examples/sdf/train.py --minutes 3 --out runs/sdf

Nothing is downloaded: the shapes (a tilted torus by default; --shape box | sphere) are exact SDFs in NumPy.
Training samples points uniformly in the domain [-0.5, 0.5]^3 and near the surface and minimises
    mean |f(p) - sdf(p)|  +  lambda * mean (|grad_p f(p)| - 1)^2
where grad_p f is computed with a GradientTape (the hash grid's position gradient) inside the training tape, so
the optimizer's gradient goes through the second derivative of the encoding (w.r.t. its tables, the MLP's input
and the positions).

Outputs in --out: metrics.json (mean |SDF error| near the surface and on held-out uniform points, eikonal residual
mean ||grad f| - 1|, Chamfer distance between the marching-cubes surface and the true surface: the mean of
the mean distance of area-uniform mesh samples to the true surface (|sdf|, exact) and of area-uniform true-surface
samples to the mesh (exact point-to-triangle distances); all in domain units, side 1), mesh.ply (marching cubes
of f at level 0), render.png (sphere-traced f, Lambert-shaded with the normals grad f / |grad f|).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import tf_metal_ops  # noqa: E402

HALF = 0.5  # the domain is [-HALF, HALF]^3; the encoding sees p + HALF in [0, 1]^3


# ---- shapes: exact signed distance functions (float64, [N, 3] -> [N]) ----------------------------------------------
def _rotation(ax, ay):
    cx, sx, cy, sy = math.cos(ax), math.sin(ax), math.cos(ay), math.sin(ay)
    rx = np.array([[1, 0, 0], [0, cx, -sx], [0, sx, cx]])
    ry = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
    return ry @ rx


_ROT = _rotation(0.6, 0.35)


def sdf_torus(p, major=0.28, minor=0.1):
    q = p @ _ROT  # = R^T p per row: the torus rotated by R
    xz = np.hypot(q[:, 0], q[:, 2]) - major
    return np.hypot(xz, q[:, 1]) - minor


def sdf_box(p, half=(0.3, 0.2, 0.25), radius=0.04):
    q = np.abs(p @ _ROT) - (np.asarray(half) - radius)
    outside = np.linalg.norm(np.maximum(q, 0.0), axis=1)
    inside = np.minimum(np.max(q, axis=1), 0.0)
    return outside + inside - radius


def sdf_sphere(p, radius=0.3):
    return np.linalg.norm(p, axis=1) - radius


SHAPES = {"torus": sdf_torus, "box": sdf_box, "sphere": sdf_sphere}


def sdf_gradient(sdf, p, eps=1e-6):
    g = np.empty_like(p)
    for i in range(3):
        e = np.zeros(3)
        e[i] = eps
        g[:, i] = (sdf(p + e) - sdf(p - e)) / (2 * eps)
    return g


def surface_samples(sdf, n, rng, band=0.01):
    """~Area-uniform points on the zero level set: uniform points of a thin band, projected along the gradient
    (exact for an exact SDF)."""
    out = []
    while sum(len(o) for o in out) < n:
        p = rng.uniform(-HALF, HALF, (max(8 * n, 100_000), 3))
        p = p[np.abs(sdf(p)) < band]
        for _ in range(3):
            p = p - sdf(p)[:, None] * sdf_gradient(sdf, p)
        out.append(p)
    return np.concatenate(out)[:n]


def near_surface(surface, n, rng, sigmas=(0.005, 0.02, 0.06)):
    p = surface[rng.integers(0, len(surface), n)]
    s = np.asarray(sigmas)[rng.integers(0, len(sigmas), n)][:, None]
    return np.clip(p + rng.standard_normal((n, 3)) * s, -HALF, HALF)


# ---- the model -----------------------------------------------------------------------------------------------------
class NeuralSDF(tf.Module):
    """f(p) = MLP([hash_grid(p + 0.5), p]): a 3-D hash grid (smoothstep interpolation, so the encoding has second
    derivatives along each axis too) and a 2-hidden-layer softplus MLP."""

    def __init__(self, seed=0, n_levels=12, log2_hashmap_size=16, base_resolution=8, finest=384, hidden=64):
        super().__init__()
        self.grid_opts = dict(
            n_levels=n_levels, n_features_per_level=2, log2_hashmap_size=log2_hashmap_size,
            base_resolution=base_resolution,
            per_level_scale=tf_metal_ops.hash_grid.per_level_scale_from_finest_resolution(base_resolution, finest,
                                                                                          n_levels),
            interpolation="smoothstep",
        )
        layout = tf_metal_ops.hash_grid_table_layout(3, **self.grid_opts)
        rng = np.random.default_rng(seed)
        self.table = tf.Variable(rng.uniform(-1e-4, 1e-4, layout.params_shape).astype(np.float32), name="table")
        n_in = n_levels * 2 + 3

        def dense(i, o, scale=1.0):
            w = rng.standard_normal((i, o)).astype(np.float32) * np.float32(scale * math.sqrt(2.0 / i))
            return tf.Variable(w), tf.Variable(np.zeros(o, np.float32))

        self.w1, self.b1 = dense(n_in, hidden)
        self.w2, self.b2 = dense(hidden, hidden)
        self.w3, self.b3 = dense(hidden, 1, 0.5)

    @property
    def mlp_variables(self):
        return [self.w1, self.b1, self.w2, self.b2, self.w3, self.b3]

    def __call__(self, p):
        h = tf_metal_ops.hash_grid_encode(p + HALF, self.table, **self.grid_opts)
        h = tf.concat([h, p], axis=-1)
        beta = 100.0  # softplus(beta z) / beta: smooth (second derivatives exist), close to relu
        h = tf.nn.softplus(beta * (h @ self.w1 + self.b1)) / beta
        h = tf.nn.softplus(beta * (h @ self.w2 + self.b2)) / beta
        return (h @ self.w3 + self.b3)[:, 0]

    def value_and_gradient(self, p):
        with tf.GradientTape() as tape:
            tape.watch(p)
            f = self(p)
        return f, tape.gradient(f, p)


_POINTS = [tf.TensorSpec([None, 3], tf.float32)]  # one trace for every batch size


def compiled(fn):
    return tf.function(fn, input_signature=_POINTS)


def batched(fn, points, batch=1 << 17):
    outs = [fn(tf.constant(points[i:i + batch], tf.float32)) for i in range(0, len(points), batch)]
    if isinstance(outs[0], (tuple, list)):
        return [np.concatenate([o[k].numpy() for o in outs]) for k in range(len(outs[0]))]
    return np.concatenate([o.numpy() for o in outs])


# ---- outputs -------------------------------------------------------------------------------------------------------
def write_ply(path, verts, faces):
    with open(path, "wb") as f:
        f.write((f"ply\nformat binary_little_endian 1.0\nelement vertex {len(verts)}\nproperty float x\n"
                 f"property float y\nproperty float z\nelement face {len(faces)}\n"
                 "property list uchar int vertex_indices\nend_header\n").encode())
        f.write(np.asarray(verts, "<f4").tobytes())
        rec = np.empty(len(faces), dtype=[("n", "u1"), ("i", "<i4", 3)])
        rec["n"] = 3
        rec["i"] = faces
        f.write(rec.tobytes())


def sample_mesh(verts, faces, n, rng):
    tri = verts[faces]  # [F, 3, 3]
    area = 0.5 * np.linalg.norm(np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), axis=1)
    idx = rng.choice(len(faces), n, p=area / area.sum())
    u, v = rng.random((2, n))
    flip = u + v > 1
    u[flip], v[flip] = 1 - u[flip], 1 - v[flip]
    t = tri[idx]
    return t[:, 0] + u[:, None] * (t[:, 1] - t[:, 0]) + v[:, None] * (t[:, 2] - t[:, 0])


def closest_points_on_triangles(p, a, b, c):
    """Closest point to p on triangle (a, b, c), row by row (Ericson, Real-Time Collision Detection, 5.1.5)."""
    dot = lambda u, v: np.einsum("ij,ij->i", u, v)  # noqa: E731
    ab, ac, ap = b - a, c - a, p - a
    d1, d2 = dot(ab, ap), dot(ac, ap)
    bp, cp = p - b, p - c
    d3, d4 = dot(ab, bp), dot(ac, bp)
    d5, d6 = dot(ab, cp), dot(ac, cp)
    va, vb, vc = d3 * d6 - d5 * d4, d5 * d2 - d1 * d6, d1 * d4 - d3 * d2
    with np.errstate(divide="ignore", invalid="ignore"):
        denom = va + vb + vc
        out = a + ab * (vb / denom)[:, None] + ac * (vc / denom)[:, None]  # interior
        # regions, lowest priority first (a later assignment wins, as the early returns of the scalar version)
        m = (va <= 0) & (d4 - d3 >= 0) & (d5 - d6 >= 0)
        out[m] = (b + (c - b) * ((d4 - d3) / ((d4 - d3) + (d5 - d6)))[:, None])[m]
        m = (vb <= 0) & (d2 >= 0) & (d6 <= 0)
        out[m] = (a + ac * (d2 / (d2 - d6))[:, None])[m]
        m = (d6 >= 0) & (d5 <= d6)
        out[m] = c[m]
        m = (vc <= 0) & (d1 >= 0) & (d3 <= 0)
        out[m] = (a + ab * (d1 / (d1 - d3))[:, None])[m]
        m = (d3 >= 0) & (d4 <= d3)
        out[m] = b[m]
        m = (d1 <= 0) & (d2 <= 0)
        out[m] = a[m]
    return out


def distance_to_mesh(points, verts, faces, k=16):
    """Distance from each point to the triangle mesh: exact point-triangle distances to the k triangles with the
    nearest centroids (the closest triangle is among them for a fine, regular marching-cubes mesh)."""
    from scipy.spatial import cKDTree

    tri = verts[faces]
    _, idx = cKDTree(tri.mean(axis=1)).query(points, k=min(k, len(faces)))
    idx = idx.reshape(len(points), -1)
    best = np.full(len(points), np.inf)
    for j in range(idx.shape[1]):
        t = tri[idx[:, j]]
        q = closest_points_on_triangles(points, t[:, 0], t[:, 1], t[:, 2])
        best = np.minimum(best, np.linalg.norm(points - q, axis=1))
    return best


def extract_mesh(model, res):
    from skimage import measure

    lin = np.linspace(-HALF, HALF, res)
    grid = np.stack(np.meshgrid(lin, lin, lin, indexing="ij"), axis=-1).reshape(-1, 3)
    values = batched(compiled(model), grid).reshape(res, res, res)
    if not (values.min() < 0 < values.max()):
        return None, None
    step = lin[1] - lin[0]
    verts, faces, _, _ = measure.marching_cubes(values, level=0.0, spacing=(step, step, step))
    return verts - HALF, faces


def render(model, res, path):
    """Sphere tracing of f from a perspective camera, Lambert + ambient shading with normals grad f."""
    eye = np.array([0.9, 0.7, 1.1])
    forward = -eye / np.linalg.norm(eye)
    right = np.cross(forward, [0.0, 1.0, 0.0])
    right /= np.linalg.norm(right)
    up = np.cross(right, forward)
    s = np.linspace(-1, 1, res) * math.tan(math.radians(22))
    u, v = np.meshgrid(s, -s)
    dirs = forward + u[..., None] * right + v[..., None] * up
    dirs = (dirs / np.linalg.norm(dirs, axis=-1, keepdims=True)).reshape(-1, 3)
    # start where the ray enters the domain box
    with np.errstate(divide="ignore"):
        t0 = np.max(np.minimum((-HALF - eye) / dirs, (HALF - eye) / dirs), axis=1)
        t1 = np.min(np.maximum((-HALF - eye) / dirs, (HALF - eye) / dirs), axis=1)
    t = np.maximum(t0, 0.0) + 1e-4
    alive = t < t1
    hit = np.zeros(len(dirs), bool)
    f = compiled(model)
    for _ in range(96):
        idx = np.nonzero(alive & ~hit)[0]
        if len(idx) == 0:
            break
        p = np.clip(eye + t[idx, None] * dirs[idx], -HALF, HALF)
        d = batched(f, p)
        hit[idx[d < 1e-3]] = True
        t[idx] += np.maximum(d, 0.0) * 0.9
        alive[idx[t[idx] > t1[idx]]] = False
    img = np.ones((len(dirs), 3))
    idx = np.nonzero(hit)[0]
    if len(idx):
        p = np.clip(eye + t[idx, None] * dirs[idx], -HALF, HALF)
        _, g = batched(compiled(model.value_and_gradient), p)
        n = g / np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-8)
        light = np.array([0.5, 0.8, 0.6])
        light /= np.linalg.norm(light)
        lambert = np.clip(n @ light, 0, 1)
        base = np.array([0.85, 0.55, 0.35])
        img[idx] = base * (0.25 + 0.75 * lambert[:, None])
    img = (np.clip(img, 0, 1) * 255).astype(np.uint8).reshape(res, res, 3)
    import imageio.v3 as iio

    iio.imwrite(path, img)
    return float(hit.mean())


def evaluate(model, sdf, rng, n_eval, mesh_res):
    vg = compiled(model.value_and_gradient)
    uniform = rng.uniform(-HALF, HALF, (n_eval, 3))
    surface = surface_samples(sdf, max(n_eval, 20_000), rng)
    near = near_surface(surface, n_eval, rng, sigmas=(0.005, 0.01))
    out = {}
    for name, pts in (("heldout_uniform", uniform), ("near_surface", near)):
        f, g = batched(vg, pts)
        out[f"mean_abs_sdf_error_{name}"] = float(np.mean(np.abs(f - sdf(pts))))
        out[f"eikonal_residual_{name}"] = float(np.mean(np.abs(np.linalg.norm(g, axis=1) - 1.0)))
    verts, faces = extract_mesh(model, mesh_res)
    if verts is None:
        out["chamfer_l1"] = float("nan")
        return out, None, None
    mesh_pts = sample_mesh(verts, faces, len(surface), rng)
    d_mesh_to_true = np.abs(sdf(mesh_pts))  # exact distance to the true surface (an exact SDF)
    d_true_to_mesh = distance_to_mesh(surface, verts, faces)  # point-to-triangle distances
    out["chamfer_mesh_to_true"] = float(d_mesh_to_true.mean())
    out["chamfer_true_to_mesh"] = float(d_true_to_mesh.mean())
    out["chamfer_l1"] = 0.5 * (out["chamfer_mesh_to_true"] + out["chamfer_true_to_mesh"])
    out["mesh_vertices"], out["mesh_faces"] = int(len(verts)), int(len(faces))
    return out, verts, faces


# ---- training ------------------------------------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="torus")
    ap.add_argument("--minutes", type=float, default=3.0, help="training time budget (default 3)")
    ap.add_argument("--seconds", type=float, default=None, help="training time budget in seconds (overrides --minutes)")
    ap.add_argument("--steps", type=int, default=None, help="stop after this many steps (whichever comes first)")
    ap.add_argument("--batch", type=int, default=8192, help="points per step (half uniform, half near the surface)")
    ap.add_argument("--eikonal-weight", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--mesh-res", type=int, default=128, help="marching-cubes grid resolution")
    ap.add_argument("--render-res", type=int, default=256)
    ap.add_argument("--eval-points", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/sdf")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    budget = args.seconds if args.seconds is not None else 60.0 * args.minutes
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    tf.random.set_seed(args.seed)
    sdf = SHAPES[args.shape]

    model = NeuralSDF(seed=args.seed)
    import keras

    opt = keras.optimizers.Adam(learning_rate=args.lr, epsilon=1e-10)
    variables = [model.table] + model.mlp_variables
    pool = surface_samples(sdf, 200_000, rng)  # training points near the surface are drawn around these

    @tf.function
    def step(p, target):
        with tf.GradientTape() as tape:
            with tf.GradientTape() as inner:
                inner.watch(p)
                f = model(p)
            g = inner.gradient(f, p)  # HashGridEncodeGradPositions (+ the MLP's input gradient)
            sdf_loss = tf.reduce_mean(tf.abs(f - target))
            eik = tf.reduce_mean(tf.square(tf.norm(g, axis=-1) - 1.0))
            loss = sdf_loss + args.eikonal_weight * eik
        grads = tape.gradient(loss, variables)  # through HashGridEncodeGradPositionsGrad
        opt.apply_gradients(zip(grads, variables))
        return loss, sdf_loss, eik

    import tqdm

    half = args.batch // 2
    start = time.perf_counter()
    steps = 0
    history = []
    bar = tqdm.tqdm(total=round(budget), unit="s", disable=args.no_progress, file=sys.stdout, mininterval=1.0,
                    bar_format="{l_bar}{bar}| {n:.0f}/{total_fmt} s{postfix}")
    while True:
        elapsed = time.perf_counter() - start
        if elapsed >= budget or (args.steps is not None and steps >= args.steps):
            break
        opt.learning_rate.assign(args.lr * 0.05 ** (elapsed / budget))  # exponential decay to 5% over the budget
        p = np.concatenate([rng.uniform(-HALF, HALF, (half, 3)), near_surface(pool, args.batch - half, rng)])
        loss, sdf_loss, eik = step(tf.constant(p, tf.float32), tf.constant(sdf(p), tf.float32))
        steps += 1
        if steps % 20 == 0 or steps == 1:
            history.append((steps, round(elapsed, 2), float(loss), float(sdf_loss), float(eik)))
            bar.set_postfix_str(f"step {steps} loss {float(loss):.4f} |f-sdf| {float(sdf_loss):.4f} eik {float(eik):.4f}")
        bar.update(min(round(budget), time.perf_counter() - start) - bar.n)
    bar.close()
    train_seconds = time.perf_counter() - start

    metrics, verts, faces = evaluate(model, sdf, np.random.default_rng(args.seed + 1000), args.eval_points,
                                     args.mesh_res)
    if verts is not None:
        write_ply(os.path.join(args.out, "mesh.ply"), verts, faces)
    metrics["render_hit_fraction"] = render(model, args.render_res, os.path.join(args.out, "render.png"))
    metrics.update(shape=args.shape, steps=steps, train_seconds=round(train_seconds, 1),
                   steps_per_second=round(steps / max(train_seconds, 1e-9), 2), batch=args.batch,
                   eikonal_weight=args.eikonal_weight, mesh_res=args.mesh_res, grid=model.grid_opts,
                   units="domain [-0.5, 0.5]^3 (side 1)", history=history[-10:])
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    summary = {k: v for k, v in metrics.items() if k not in ("history", "grid")}
    print(json.dumps(summary, indent=2))
    return metrics


if __name__ == "__main__":
    main()
