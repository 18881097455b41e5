"""NeRF models (Keras 3, TensorFlow backend): the keras.io positional-encoding MLP baseline and an Instant-NGP
style hash-grid model.

Both are ``keras.Model`` subclasses called as ``model(rays_o, rays_d, training=...)`` on a batch of rays
(``[R, 3]`` origins and unit directions, see :mod:`nerf.data.rays`) and return a dict with ``color`` [R,3],
``depth`` [R], ``opacity`` [R], ``weights`` [R,S] and the sample distances ``t`` [R,S] and ``edges`` [R,S+1].
The hash model with ``sampler="occupancy"`` returns packed samples instead: ``weights`` [N], ``t_starts``,
``t_ends`` [N], ``row_splits`` [R+1] and ``ray_indices`` [N] (the convention of ``tf_metal_ops.ray_march``).
Their constructor arguments are plain JSON values (``get_config``), so :func:`save_model`/:func:`load_model` store a
config + weights file (+ the occupancy grid's state).
"""

from __future__ import annotations

import json
import math
import os

import keras
import numpy as np
import tensorflow as tf

# ------------------------------------------------------------------------------------------------ shared pieces


def stratified_t(t_near, t_far, n_samples: int, perturb: bool, seed=None):
    """Stratified samples between per-ray ``t_near``/``t_far`` ``[R]``: one per equal bin, uniformly jittered inside
    its bin when ``perturb`` (training), at the bin centre otherwise.

    Returns ``(t, edges)``: sample distances ``[R, S]`` and interval edges ``[R, S+1]`` (``t_near``, the midpoints
    between consecutive samples, ``t_far``) — sample i stands for ``[edges_i, edges_{i+1}]``, the convention of
    ``tf_metal_ops.volume_render``. Without jitter the edges are exactly the bin boundaries.

    ``seed``: an int ``[2]`` tensor makes the jitter a pure function of it (``tf.random.stateless_uniform``), so a
    training run resumed from a checkpoint, or split over workers, draws exactly the samples it would have drawn;
    ``None`` uses TF's stateful random ops.
    """
    R = tf.shape(t_near)[0]
    if perturb and seed is not None:
        u = tf.random.stateless_uniform([R, n_samples], seed=seed, dtype=t_near.dtype)
    elif perturb:
        u = tf.random.uniform([R, n_samples], dtype=t_near.dtype)
    else:
        u = tf.fill([R, n_samples], tf.constant(0.5, t_near.dtype))
    k = tf.range(n_samples, dtype=t_near.dtype)[None, :]
    t = t_near[:, None] + (t_far - t_near)[:, None] * (k + u) / n_samples
    edges = tf.concat([t_near[:, None], 0.5 * (t[:, 1:] + t[:, :-1]), t_far[:, None]], axis=-1)
    return t, edges


def composite_tf(sigma, rgb, edges, t, background=None):
    """Plain-TF alpha compositing as in the NeRF paper / keras.io example (cumprod of 1 - alpha), what a user writes
    by hand. ``sigma`` [R,S] densities, ``rgb`` [R,S,3], interval ``edges`` [R,S+1], sample distances ``t`` [R,S].
    Returns color (over ``background``), depth, opacity, weights.
    """
    delta = edges[:, 1:] - edges[:, :-1]
    alpha = 1.0 - tf.exp(-sigma * delta)
    trans = tf.math.cumprod(1.0 - alpha + 1e-10, axis=-1, exclusive=True)
    weights = alpha * trans
    color = tf.reduce_sum(weights[..., None] * rgb, axis=-2)
    opacity = tf.reduce_sum(weights, axis=-1)
    depth = tf.reduce_sum(weights * t, axis=-1)
    if background is not None:
        color = color + (1.0 - opacity)[:, None] * background
    return color, depth, opacity, weights


def positional_encoding(x, n_freqs: int):
    """keras.io NeRF encoding: ``[x, sin(2^i x), cos(2^i x)]`` for i < n_freqs (no pi, as in that example)."""
    parts = [x]
    for i in range(n_freqs):
        parts += [tf.sin(2.0**i * x), tf.cos(2.0**i * x)]
    return tf.concat(parts, axis=-1)


def sh_encoding_deg4(d):
    """Real spherical harmonics of degree < 4 (16 values) of unit directions ``[..., 3]`` (tiny-cuda-nn's form)."""
    x, y, z = d[..., 0], d[..., 1], d[..., 2]
    xy, xz, yz, x2, y2, z2 = x * y, x * z, y * z, x * x, y * y, z * z
    return tf.stack([
        tf.fill(tf.shape(x), tf.constant(0.28209479177387814, d.dtype)),
        -0.48860251190291987 * y, 0.48860251190291987 * z, -0.48860251190291987 * x,
        1.0925484305920792 * xy, -1.0925484305920792 * yz, 0.94617469575755997 * z2 - 0.31539156525251999,
        -1.0925484305920792 * xz, 0.54627421529603959 * (x2 - y2),
        0.59004358992664352 * y * (-3.0 * x2 + y2), 2.8906114426405538 * xy * z,
        0.45704579946446572 * y * (1.0 - 5.0 * z2), 0.3731763325901154 * z * (5.0 * z2 - 3.0),
        0.45704579946446572 * x * (1.0 - 5.0 * z2), 1.4453057213202769 * z * (x2 - y2),
        0.59004358992664352 * x * (-x2 + 3.0 * y2),
    ], axis=-1)


@tf.custom_gradient
def trunc_exp(x):
    """exp with its input clipped to ±15 (forward and gradient): the Instant-NGP density activation."""
    y = tf.exp(tf.clip_by_value(x, -15.0, 15.0))

    def grad(g):
        return g * y

    return y, grad


# Occupancy sampler: steps per box diagonal of the default step size (Instant-NGP: 1024 for its unit cube, sqrt(3)/1024;
# coarser here, see the README's "Occupancy sampler" section for the measurement behind it).
STEPS_PER_DIAGONAL = 256


def default_step_size(bound: float) -> float:
    """Default ray-marching step of the occupancy sampler for the box [-bound, bound]^3."""
    return 2.0 * bound * math.sqrt(3.0) / STEPS_PER_DIAGONAL


def ray_aabb(rays_o, rays_d, bound: float):
    """Entry/exit distances ``[R]`` of rays through the box ``[-bound, bound]^3`` (exit < entry: miss)."""
    inv = 1.0 / tf.where(tf.abs(rays_d) < 1e-9, tf.fill(tf.shape(rays_d), 1e-9), rays_d)
    t1, t2 = (-bound - rays_o) * inv, (bound - rays_o) * inv
    return tf.reduce_max(tf.minimum(t1, t2), -1), tf.reduce_min(tf.maximum(t1, t2), -1)


# ------------------------------------------------------------------------------------------------ baseline MLP


@keras.saving.register_keras_serializable(package="nerf_example")
class MLPNeRF(keras.Model):
    """The keras.io "NeRF" example: positional encoding (16 frequencies) of the sample position, 8 × Dense(64,
    relu) with the encoded input concatenated back in after layer 4, Dense(4) → sigmoid colour and relu density,
    stratified samples between near and far, plain TF compositing. No view direction, as in that example."""

    def __init__(self, n_freqs=16, width=64, depth=8, skip=4, n_samples=32, near=2.0, far=6.0,
                 background=(1.0, 1.0, 1.0), jitter=True, **kwargs):
        super().__init__(**kwargs)
        self.cfg = dict(n_freqs=n_freqs, width=width, depth=depth, skip=skip, n_samples=n_samples, jitter=bool(jitter),
                        near=float(near), far=float(far), background=[float(b) for b in background])
        self.dense = [keras.layers.Dense(width, activation="relu", name=f"dense_{i}") for i in range(depth)]
        self.out = keras.layers.Dense(4, name="out")

    def field(self, x):
        enc = positional_encoding(x, self.cfg["n_freqs"])
        h = enc
        for i, layer in enumerate(self.dense):
            h = layer(h)
            if i + 1 == self.cfg["skip"]:
                h = tf.concat([h, enc], axis=-1)
        raw = self.out(h)
        return tf.nn.relu(raw[..., 3]), tf.sigmoid(raw[..., :3])

    def call(self, rays_o, rays_d, training=False, jitter_seed=None):
        c = self.cfg
        R = tf.shape(rays_o)[0]
        t_near, t_far = tf.fill([R], c["near"]), tf.fill([R], c["far"])
        t, edges = stratified_t(t_near, t_far, c["n_samples"], perturb=training and c["jitter"], seed=jitter_seed)
        pts = rays_o[:, None, :] + rays_d[:, None, :] * t[..., None]
        sigma, rgb = self.field(pts)
        color, depth, opacity, weights = composite_tf(sigma, rgb, edges, t, tf.constant(c["background"]))
        return dict(color=color, depth=depth, opacity=opacity, weights=weights, t=t, edges=edges)

    def build_for_rays(self):
        self(tf.zeros([1, 3]), tf.constant([[0.0, 0.0, -1.0]]))

    def table_variables(self):
        return []

    def get_config(self):
        return {**super().get_config(), **self.cfg}


# ------------------------------------------------------------------------------------------------- hash model


GRID_CHUNK = 2 ** 17  # points per density evaluation of a grid update


@keras.saving.register_keras_serializable(package="nerf_example")
def make_occupancy_grid(bound, grid_resolution=64, grid_warmup_steps=64, cascades=1):
    """The occupancy grid of a HashNeRF: ``grid_resolution``^3 cells over [-bound, bound]^3 (``cascades`` > 1: that
    many grids, each over twice the box of the previous, ``tf_metal_ops.OccupancyGrid(cascades=K)``). Under a
    tf.distribute strategy create it outside ``strategy.scope()`` and pass it as ``HashNeRF(grid=...)``: a plain
    per-worker variable set (the strategy would mirror it and broadcast its initial uint8 bitfield, which the
    collectives do not carry), kept identical on every worker by the trainer."""
    from tf_metal_ops import OccupancyGrid

    b = float(bound)
    return OccupancyGrid(aabb=((-b, -b, -b), (b, b, b)), resolution=int(grid_resolution),
                         warmup_steps=int(grid_warmup_steps), cascades=int(cascades), name="occupancy_grid")


class HashNeRF(keras.Model):
    """Instant-NGP style: multiresolution hash-grid encoding of the position (in the box ``[-bound, bound]^3``),
    a small density MLP (one hidden layer of 64 → 16 outputs, the first is log-density through ``trunc_exp``, all
    16 are the geometry feature) and a colour MLP (2 × 64) on the feature plus the spherical-harmonics encoding of
    the view direction; ``n_samples`` stratified samples per ray inside the box (∩ [near, far]).

    ``implementation="op"``: ``tf_metal_ops`` hash-grid op + ``tf_metal_ops.volume_render`` (+ ``distortion_loss``);
    ``"pure_tf"``: the package's pure-TF hash grid + ``volume_render_tf`` (the same compositing math in plain TF ops)
    — everything XLA-compilable, the strongest model a user can write without the custom ops. With ``"op"`` and
    ``xla_inner`` the parts before and after the hash-grid op run as inner XLA-compiled functions.

    ``sampler="occupancy"``: instead of ``n_samples`` stratified samples, ``tf_metal_ops.ray_march`` walks each ray
    with a constant ``step_size`` through the occupied cells of ``self.grid`` (an ``OccupancyGrid`` of
    ``grid_resolution``^3 cells over the scene box, at most ``max_samples`` per ray, jittered by a per-step seed
    in training), the field runs on the packed samples' midpoints and ``volume_render_packed`` composites them.
    The grid is the caller's to update (:meth:`update_grid`); its state is saved beside the weights.
    ``early_stop`` > 0 or ``alpha_threshold`` > 0: a density-only pass without gradient over the marched samples
    first, then ``tf_metal_ops.cull_samples_packed`` keeps the samples whose transmittance is at least ``early_stop``
    and whose opacity is at least ``alpha_threshold`` (Instant-NGP's and nerfacc's compaction); the field with its
    gradients runs on those only, in training and evaluation alike.

    ``unbounded=True`` (occupancy sampler only; real captures, see the example's README, "Unbounded scenes"): the
    box ``[-bound, bound]^3`` is the uncontracted unit region, and the samples' positions go through
    ``tf_metal_ops.contract_to_unit`` (mip-NeRF 360's contraction, ``contraction_norm`` "inf" by default as in
    nerfacto) before the hash grid, so all of space has a place in the encoding. The occupancy grid has
    ``cascades`` levels (cascade c over the box scaled by 2^c), the march steps ``dt = clamp(t * cone_angle,
    step_size, cell diagonal of the cascade)`` from the data's ``near`` out of the outermost cascade (``far`` is
    not applied: the distant surroundings lie beyond the sparse points that set it), and rays that leave it end on
    black (``background`` is ignored: the far region is part of the scene).

    ``mlp``: "fused" (the default) runs the density and colour MLPs as ``tf_metal_ops.FusedMLP`` layers (the fused
    MLP op, or its pure-TF form with ``implementation="pure_tf"`` or ``xla_inner``), with biases; "keras" as ``keras.layers.Dense``
    stacks of the same shapes (models saved before this option existed load as "keras"). ``hidden`` must then be
    16, 32, 64 or 128. ``feature_major`` (fused MLPs only): the hash grid encodes into ``[L*F, M]`` (tiny-cuda-nn's
    layout, the GPU encode's fastest) and the density MLP reads that in place; the output's ``features`` then have
    that layout. The results are bitwise those of the default layout.

    ``appearance_dim`` > 0 (occupancy sampler): a per-training-image appearance vector (``n_appearance`` of them,
    initialised to 0) is appended to the colour MLP's input; ``call(..., appearance_ids=[R] int)`` picks each ray's,
    and without ids (evaluation, test views, ``render_image``) every ray gets the **mean** of the training images'
    vectors.
    """

    SAMPLERS = ("uniform", "occupancy")
    CONTRACTION_NORMS = ("inf", "l2")
    MLPS = ("fused", "keras")

    def __init__(self, n_levels=16, n_features_per_level=2, log2_hashmap_size=17, base_resolution=16,
                 finest_resolution=512, n_samples=64, near=2.0, far=6.0, bound=1.0, background=(1.0, 1.0, 1.0),
                 implementation="op", hidden=64, xla_inner=False, jitter=True, sampler="uniform",
                 grid_resolution=64, grid_warmup_steps=64, step_size=None, max_samples=1024, early_stop=0.0,
                 alpha_threshold=0.0, unbounded=False, cascades=1, cone_angle=0.0, contraction_norm="inf",
                 appearance_dim=0, n_appearance=0, grid=None, mlp="fused", feature_major=False, **kwargs):
        super().__init__(**kwargs)
        if mlp not in self.MLPS:
            raise ValueError(f"mlp must be one of {self.MLPS}, got {mlp!r}")
        if feature_major and mlp != "fused":
            raise ValueError("feature_major needs mlp='fused' (Dense layers take [M, L*F])")
        if mlp == "fused" and int(hidden) not in (16, 32, 64, 128):
            raise ValueError(f"mlp='fused' needs hidden in 16, 32, 64, 128, got {hidden}")
        if sampler not in self.SAMPLERS:
            raise ValueError(f"sampler must be one of {self.SAMPLERS}, got {sampler!r}")
        if sampler != "occupancy" and (unbounded or int(cascades) != 1 or float(cone_angle) != 0.0
                                       or int(appearance_dim) != 0):
            raise ValueError("unbounded, cascades, cone_angle and appearance_dim need sampler='occupancy'")
        if int(appearance_dim) < 0 or int(n_appearance) < 0 or (int(appearance_dim) > 0 and int(n_appearance) < 1):
            raise ValueError(f"appearance_dim must be >= 0 and, when positive, n_appearance >= 1 (one vector per "
                             f"training image); got appearance_dim={appearance_dim}, n_appearance={n_appearance}")
        if not (math.isfinite(float(cone_angle)) and float(cone_angle) >= 0.0):
            raise ValueError(f"cone_angle must be >= 0, got {cone_angle}")
        if contraction_norm not in self.CONTRACTION_NORMS:
            raise ValueError(f"contraction_norm must be one of {self.CONTRACTION_NORMS}, got {contraction_norm!r}")
        if unbounded:
            background = (0.0, 0.0, 0.0)
        from tf_metal_ops.hash_grid.layer import HashGridEncoding

        per_level_scale = math.exp(math.log(finest_resolution / base_resolution) / max(n_levels - 1, 1))
        cfg = dict(n_levels=n_levels, n_features_per_level=n_features_per_level,
                   log2_hashmap_size=log2_hashmap_size, base_resolution=base_resolution,
                   finest_resolution=finest_resolution, n_samples=n_samples, near=float(near), far=float(far),
                   bound=float(bound), background=[float(b) for b in background],
                   implementation=implementation, hidden=hidden, xla_inner=bool(xla_inner),
                   jitter=bool(jitter), sampler=sampler, mlp=mlp)
        if feature_major:
            cfg["feature_major"] = True
        if sampler == "occupancy":
            cfg.update(grid_resolution=int(grid_resolution), grid_warmup_steps=int(grid_warmup_steps),
                       step_size=float(default_step_size(bound) if step_size is None else step_size),
                       max_samples=int(max_samples), early_stop=float(early_stop),
                       alpha_threshold=float(alpha_threshold))
            if unbounded or int(cascades) != 1 or float(cone_angle) != 0.0 or int(appearance_dim) != 0:
                cfg.update(unbounded=bool(unbounded), cascades=int(cascades), cone_angle=float(cone_angle),
                           contraction_norm=contraction_norm, appearance_dim=int(appearance_dim),
                           n_appearance=int(n_appearance))
        self.cfg = cfg
        self.unbounded = bool(unbounded)
        self.grid = None
        if sampler == "occupancy":
            self.grid = grid if grid is not None else make_occupancy_grid(bound, grid_resolution, grid_warmup_steps,
                                                                          cascades)
            b = float(bound)
            if self.grid.resolution != int(grid_resolution) or self.grid.cascades != int(cascades) or \
                    not np.array_equal(self.grid.aabb, np.float32([(-b, -b, -b), (b, b, b)])):
                raise ValueError(f"grid: an OccupancyGrid of {grid_resolution}^3 cells over [-{b}, {b}]^3 with "
                                 f"{cascades} cascade(s) is needed, got {self.grid.resolution}^3 over "
                                 f"{self.grid.aabb.tolist()} with {self.grid.cascades}")
        self.appearance = None
        if int(appearance_dim) > 0:
            self.appearance = self.add_weight(shape=(int(n_appearance), int(appearance_dim)), initializer="zeros",
                                              name="appearance")
        self.encoding = HashGridEncoding(n_levels=n_levels, n_features_per_level=n_features_per_level,
                                         log2_hashmap_size=log2_hashmap_size, base_resolution=base_resolution,
                                         per_level_scale=per_level_scale, implementation=implementation,
                                         feature_major=bool(feature_major), name="hash_grid")
        if mlp == "fused":
            from tf_metal_ops.fused_mlp.layer import FusedMLP

            # the op, or its pure-TF form where the MLPs run inside XLA-compiled functions (custom ops have no XLA kernel)
            mlp_impl = "pure_tf" if implementation == "pure_tf" or xla_inner else "op"
            fused = dict(width=int(hidden), activation="relu", use_bias=True, implementation=mlp_impl)
            self.density_mlp = [FusedMLP(16, n_hidden_layers=1, feature_major=bool(feature_major),
                                         name="density_mlp", **fused)]
            self.color_mlp = [FusedMLP(3, n_hidden_layers=2, output_activation="sigmoid", name="color_mlp", **fused)]
        else:
            self.density_mlp = [keras.layers.Dense(hidden, activation="relu", name="density_0"),
                                keras.layers.Dense(16, name="density_out")]
            self.color_mlp = [keras.layers.Dense(hidden, activation="relu", name="color_0"),
                              keras.layers.Dense(hidden, activation="relu", name="color_1"),
                              keras.layers.Dense(3, activation="sigmoid", name="color_out")]

    def _pre(self, rays_o, rays_d, training, jitter_seed=None, view_sh=None):
        """Samples, normalised positions in [0,1]^3, inside-the-box mask, SH of the view direction."""
        c = self.cfg
        t0, t1 = ray_aabb(rays_o, rays_d, c["bound"])
        t_near = tf.maximum(t0, c["near"])
        t_far = tf.maximum(tf.minimum(t1, c["far"]), t_near + 1e-4)  # rays missing the box: an empty segment
        t, edges = stratified_t(t_near, t_far, c["n_samples"], perturb=training and c["jitter"], seed=jitter_seed)
        pts = rays_o[:, None, :] + rays_d[:, None, :] * t[..., None]
        x = (pts / c["bound"] + 1.0) * 0.5
        inside = tf.cast(tf.reduce_all((x >= 0.0) & (x <= 1.0), axis=-1), tf.float32)
        x = tf.reshape(tf.clip_by_value(x, 0.0, 1.0), [-1, 3])
        sh = sh_encoding_deg4(rays_d) if view_sh is None else view_sh
        return t, edges, x, inside, sh

    def _field(self, feat, sh, app=None):
        """Flat samples: hash features ``[M, L*F]`` (``[L*F, M]`` with ``feature_major``) and SH of their view
        direction ``[M, 16]`` → density ``[M]``, colour ``[M, 3]`` (density MLP on the features; colour MLP on its
        16 outputs + the SH, + with ``appearance_dim`` the samples' appearance vectors ``app`` [M, dim], default the
        mean one)."""
        h = feat
        for layer in self.density_mlp:
            h = layer(h)
        parts = [h, sh]
        if self.appearance is not None:
            if app is None:
                app = tf.broadcast_to(tf.reduce_mean(self.appearance, axis=0, keepdims=True),
                                      [tf.shape(h)[0], self.cfg["appearance_dim"]])
            parts.append(app)
        c = tf.concat(parts, axis=-1)
        for layer in self.color_mlp:
            c = layer(c)
        return trunc_exp(h[:, 0]), c

    def _post(self, feat, inside, sh):
        """Uniform sampler: the field on ``[R*S]`` samples → density ``[R, S]`` (0 outside the box), colour."""
        S = self.cfg["n_samples"]
        R = tf.shape(sh)[0]
        sh = tf.reshape(tf.broadcast_to(sh[:, None, :], [R, S, 16]), [-1, 16])
        sigma, rgb = self._field(feat, sh)
        return tf.reshape(sigma, [R, S]) * inside, tf.reshape(rgb, [R, S, 3])

    def _normalise(self, pts):
        """World positions → [0,1]^3 hash-grid coordinates: of the box [-bound, bound]^3 (clipped), or, unbounded,
        ``contract_to_unit`` with that box as the unit region (all of space)."""
        b = self.cfg["bound"]
        if self.unbounded:
            import tf_metal_ops

            return tf_metal_ops.contract_to_unit(pts, ((-b, -b, -b), (b, b, b)), norm=self.cfg["contraction_norm"])
        return tf.clip_by_value((pts / b + 1.0) * 0.5, 0.0, 1.0)

    def spacing(self, t):
        """Ray distances → the distances the distortion loss sees: ``t`` itself in a bounded scene; unbounded,
        mip-NeRF 360's idea of a normalised spacing, here the contraction of ``t / bound`` (t while t <= bound,
        then 2 - bound / t), so far intervals weigh as much as their disparity, not their length."""
        if not self.unbounded:
            return t
        u = t / self.cfg["bound"]
        return tf.where(u <= 1.0, u, 2.0 - 1.0 / tf.maximum(u, 1.0))

    def density(self, pts):
        """Density ``[M]`` at world positions ``[M, 3]`` (encoding + density MLP only; for the occupancy grid)."""
        return self._density_at(self._normalise(pts))

    def _density_at(self, x):
        """Density ``[M]`` at hash-grid coordinates ``[M, 3]`` in [0, 1]^3 (with Dense layers the output layer's
        first column only: the geometry feature is not needed; the fused MLP computes its 16 outputs at once)."""
        if self.cfg["mlp"] == "fused":
            return trunc_exp(self.density_mlp[0](self.encoding(x))[:, 0])
        hidden, out = self.density_mlp
        h = hidden(self.encoding(x))
        if not out.built:  # --early-stop's pass runs before the first full call builds it
            out.build(h.shape)
        return trunc_exp(tf.matmul(h, out.kernel[:, :1])[:, 0] + out.bias[0])

    def chunked_density(self, points, chunk: int = GRID_CHUNK):
        """:meth:`density` at ``points`` [M, 3], ``chunk`` points at a time (a grid update's working set stays
        bounded whatever the number of cells)."""
        m = tf.shape(points)[0]
        pad = (-m) % chunk
        x = tf.reshape(tf.pad(points, [[0, pad], [0, 0]]), [-1, chunk, 3])
        out = tf.map_fn(lambda p: tf.reshape(self.density(p), [-1]), x, fn_output_signature=tf.float32,
                        parallel_iterations=1)
        return tf.reshape(out, [-1])[:m]

    def update_grid(self, step, seed, n_cells=None, evaluate=None):
        """One occupancy-grid update (tf.function-compatible). The grid stores the optical thickness of a step of
        the box diagonal / 1024 (Instant-NGP's: its minimal step), so its threshold 0.01 means density > ~3 for the
        box [-1,1]^3, independent of the marching step: space no training ray has shaped (density ~1 at
        initialisation) counts as empty. ``n_cells``: random cells (plus as many occupied ones) per update after
        warm-up (default G^3/4, Instant-NGP's). ``evaluate(fn, points)``: how ``fn`` (the thickness) is evaluated
        at the update's points (default ``fn(points)``; e.g. shared among replicas)."""
        G = self.cfg["grid_resolution"]
        dt = 2.0 * math.sqrt(3.0) * self.cfg["bound"] / 1024
        K = self.grid.cascades
        n = K * G ** 3 // 4 if n_cells is None else n_cells
        if K == 1:
            thickness = lambda p: self.chunked_density(p) * dt  # noqa: E731
        else:  # Instant-NGP: the minimal step of cascade c is 2^c times the finest (p's cascade: its box's level)
            def thickness(p):
                m = tf.reduce_max(tf.abs(p), axis=-1) / self.cfg["bound"]
                c = tf.clip_by_value(tf.math.ceil(tf.math.log(tf.maximum(m, 1.0)) / math.log(2.0)), 0.0, K - 1.0)
                return self.chunked_density(p) * dt * tf.pow(2.0, c)
        fn = thickness if evaluate is None else (lambda p: evaluate(thickness, p))
        return self.grid.update(fn, step=step, n_cells=n, seed=seed)

    def march(self, rays_o, rays_d, training=False, jitter_seed=None):
        """Packed samples of the occupancy sampler (a ``RayMarchResult``); jitter only in training."""
        import tf_metal_ops

        c = self.cfg
        jitter = bool(training and c["jitter"])
        seed = 0
        if jitter and jitter_seed is not None:
            js = tf.cast(jitter_seed, tf.int64)
            seed = js[0] * 1000003 + js[1]
        march = tf_metal_ops.ray_march if c["implementation"] == "op" else tf_metal_ops.ray_march_tf
        return march(rays_o, rays_d, self.grid, near=c["near"], far=None if self.unbounded else c["far"],
                     step_size=c["step_size"], cone_angle=c.get("cone_angle", 0.0), max_samples=c["max_samples"],
                     jitter=jitter, seed=seed)

    def _sample_coords(self, rays_o, rays_d, m):
        """Hash-grid coordinates [N, 3] of the packed samples ``m``: the march's ``positions`` (the grid's box is the
        hash grid's [0, 1]^3), or, unbounded, the contraction of the midpoints ``o + d (t0 + t1) / 2``."""
        if not self.unbounded:
            return m.positions
        mid = 0.5 * (m.t_starts + m.t_ends)
        pts = tf.gather(rays_o, m.ray_indices) + tf.gather(rays_d, m.ray_indices) * mid[:, None]
        return self._normalise(pts)

    def _prune(self, m, x):
        """Culling before the training pass: the density alone (no gradient) at every marched sample (hash-grid
        coordinates ``x``), then ``tf_metal_ops.cull_samples_packed`` with the model's ``early_stop`` and
        ``alpha_threshold`` → (the kept samples, their coordinates)."""
        import tf_metal_ops

        c = self.cfg
        sigma = tf.stop_gradient(self._density_at(x))
        kept = tf_metal_ops.cull_samples_packed(sigma, m.t_starts, m.t_ends, m.row_splits,
                                                early_stop_eps=c["early_stop"],
                                                alpha_threshold=c.get("alpha_threshold", 0.0))
        i = kept.indices
        return (type(m)(tf.gather(m.t_starts, i), tf.gather(m.t_ends, i), kept.row_splits,
                        tf.gather(m.ray_indices, i), tf.gather(m.positions, i)), tf.gather(x, i))

    def _call_packed(self, rays_o, rays_d, training, jitter_seed, view_sh, appearance_ids=None):
        import tf_metal_ops

        c = self.cfg
        m = self.march(rays_o, rays_d, training, jitter_seed)
        n_marched = tf.shape(m.t_starts)[0]
        x = self._sample_coords(rays_o, rays_d, m)
        if c["early_stop"] > 0 or c.get("alpha_threshold", 0.0) > 0:
            m, x = self._prune(m, x)
        sh = tf.gather(sh_encoding_deg4(rays_d) if view_sh is None else view_sh, m.ray_indices)
        app = None
        if self.appearance is not None and appearance_ids is not None:
            # one-hot product, not a gather: a dense gradient (the fused Adam step takes dense gradients)
            per_ray = tf.matmul(tf.one_hot(tf.cast(appearance_ids, tf.int32), c["n_appearance"]), self.appearance)
            app = tf.gather(per_ray, m.ray_indices)
        feat = self.encoding(x)
        sigma, rgb = self._field(feat, sh, app)
        render = (tf_metal_ops.volume_render_packed if c["implementation"] == "op"
                  else tf_metal_ops.volume_render_packed_tf)
        color, depth, opacity, weights = render(sigma, rgb, m.t_starts, m.t_ends, m.row_splits,
                                                background=tf.constant(c["background"]))
        return dict(color=color, depth=depth, opacity=opacity, weights=weights, t_starts=m.t_starts,
                    t_ends=m.t_ends, row_splits=m.row_splits, ray_indices=m.ray_indices, n_marched=n_marched,
                    features=feat, positions=x)

    def call(self, rays_o, rays_d, training=False, jitter_seed=None, view_sh=None, appearance_ids=None):
        """``jitter_seed``: optional int ``[2]`` tensor, the stateless seed of the sample jitter (see stratified_t).
        ``view_sh``: optional ``sh_encoding_deg4(rays_d)`` ``[R, 16]`` computed beforehand (the training rays'
        directions never change: train.py encodes them once). Besides the render, the output holds the samples'
        hash-grid coordinates ``positions [M, 3]`` and their encoding ``features [M, L*F]`` (``[L*F, M]`` with
        ``feature_major``; the trainer may compute the table's gradient from these). ``appearance_ids``: int [R],
        each ray's training image (models with ``appearance_dim``; None: the mean appearance)."""
        c = self.cfg
        if c["sampler"] == "occupancy":
            return self._call_packed(rays_o, rays_d, training, jitter_seed, view_sh, appearance_ids)
        op = c["implementation"] == "op"
        if op and c.get("xla_inner", False):
            # custom ops have no XLA kernel: compile the parts around them as separate inner XLA functions
            if not hasattr(self, "_pre_xla"):
                self._pre_xla = {
                    True: tf.function(lambda o, d, s=None, v=None: self._pre(o, d, True, s, v), jit_compile=True),
                    False: tf.function(lambda o, d, s=None, v=None: self._pre(o, d, False, s, v), jit_compile=True)}
                self._post_xla = tf.function(self._post, jit_compile=True)
            pre, post = self._pre_xla[bool(training)], self._post_xla
            t, edges, x, inside, sh = pre(rays_o, rays_d, jitter_seed, view_sh)
        else:
            post = self._post
            t, edges, x, inside, sh = self._pre(rays_o, rays_d, training, jitter_seed, view_sh)
        feat = self.encoding(x)
        sigma, rgb = post(feat, inside, sh)
        bg = tf.constant(c["background"])
        import tf_metal_ops

        render = tf_metal_ops.volume_render if op else tf_metal_ops.volume_render_tf
        color, depth, opacity, weights = render(sigma, rgb, edges, background=bg)
        return dict(color=color, depth=depth, opacity=opacity, weights=weights, t=t, edges=edges, features=feat,
                    positions=x)

    def build_for_rays(self):
        self(tf.constant([[0.0, 0.0, 4.0]]), tf.constant([[0.0, 0.0, -1.0]]))

    def table_variables(self):
        return [self.encoding.table]

    def get_config(self):
        return {**super().get_config(), **self.cfg}


# ----------------------------------------------------------------------------------------------- save / load

MODELS = {"mlp": MLPNeRF, "hash": HashNeRF}


def build_model(kind: str, **cfg) -> keras.Model:
    model = MODELS[kind](**cfg)
    model.build_for_rays()
    return model


def save_model(model: keras.Model, directory: str, world_to_scene=None) -> str:
    """``directory/model.json`` (kind + config + the data's ``world_to_scene``), ``directory/model.weights.h5`` and,
    for the occupancy sampler, ``directory/occupancy_grid.npz`` (the grid's density estimate, bitfield and update
    count). ``world_to_scene`` (4×4, default the model's own or the identity) maps the data's world frame to the
    frame the model was trained in; :func:`render_image` applies it to poses given in the data's frame."""
    os.makedirs(directory, exist_ok=True)
    kind = {v: k for k, v in MODELS.items()}[type(model)]
    cfg = {k: v for k, v in model.get_config().items() if k in model.cfg}
    T = world_to_scene if world_to_scene is not None else getattr(model, "world_to_scene", np.eye(4))
    model.world_to_scene = np.asarray(T, np.float64)
    with open(os.path.join(directory, "model.json"), "w") as f:
        json.dump({"kind": kind, "config": cfg, "world_to_scene": model.world_to_scene.tolist()}, f, indent=1)
    path = os.path.join(directory, "model.weights.h5")
    model.save_weights(path)
    grid = getattr(model, "grid", None)
    if grid is not None:
        np.savez(os.path.join(directory, "occupancy_grid.npz"), density=grid.density.numpy(), bits=grid.bits.numpy(),
                 step=grid.step.numpy())
    return path


def load_model(directory: str) -> keras.Model:
    with open(os.path.join(directory, "model.json")) as f:
        meta = json.load(f)
    cfg = dict(meta["config"])
    if meta["kind"] == "hash":
        cfg.setdefault("mlp", "keras")  # saved before the fused MLP existed: Dense layers
    model = build_model(meta["kind"], **cfg)
    model.world_to_scene = np.asarray(meta.get("world_to_scene", np.eye(4)), np.float64)
    model.load_weights(os.path.join(directory, "model.weights.h5"))
    grid = getattr(model, "grid", None)
    if grid is not None:
        with np.load(os.path.join(directory, "occupancy_grid.npz")) as z:
            grid.density.assign(z["density"])
            grid.bits.assign(z["bits"])
            grid.step.assign(z["step"])
    return model


FRAMES = ("data", "scene")  # render_image's frames of c2w


def render_image(model, camera, c2w, frame: str = "data", *legacy, chunk: int = 4096,
                 max_chunk_samples: int = 2 ** 18):
    """Render the view of ``camera`` posed at ``c2w`` with a trained model → (rgb [H,W,3], depth [H,W], opacity
    [H,W]) numpy arrays, ``H×W`` the camera's ``height×width``.

    ``camera`` is a :class:`nerf.data.cameras.Camera` (any COLMAP model, distortion included: each pixel centre's
    ray is the camera's unprojection, :func:`nerf.data.cameras.camera_directions`). ``c2w`` ([4,4] or [3,4]) is
    camera-to-world in the example's OpenGL convention (looking down −z, +y up; :mod:`nerf.data.rays`) in the frame
    ``frame`` names:

    * ``"data"``: the data's own world frame (e.g. COLMAP's), mapped into the model's frame through
      ``model.world_to_scene`` (saved with the model; the identity if none);
    * ``"scene"``: the frame the model was trained in (the scene frame of :mod:`nerf.data.normalise`; the built-in
      scene's world).

    A pixel without a ray (its direction NaN: no inverse of the distortion there) is not rendered: rgb, depth and
    opacity 0. ``depth`` is in the model's frame units. See :func:`render_rays` for ``chunk`` and
    ``max_chunk_samples``.

    The form ``render_image(model, H, W, focal_or_intrinsics, c2w)`` still works and warns (DeprecationWarning):
    a focal length is ``Camera.pinhole(W, H, focal, focal, W / 2, H / 2)`` with ``frame="scene"``, a tuple
    ``(fx, fy, cx, cy)`` is ``Camera.pinhole(W, H, fx, fy, cx, cy)`` with ``frame="data"``.

    Example:
      >>> import numpy as np
      >>> from nerf import models
      >>> from nerf.data.cameras import Camera
      >>> model = models.build_model("mlp", n_samples=4, width=8, depth=1, skip=1)
      >>> cam = Camera(8, 6, "OPENCV", (6.0, 6.0, 4.0, 3.0, -0.1, 0.0, 0.0, 0.0))  # 8x6 pixels, k1 = -0.1
      >>> c2w = np.eye(4); c2w[2, 3] = 4.0  # 4 units out on +z, looking at the origin
      >>> rgb, depth, opacity = models.render_image(model, cam, c2w, frame="scene")
      >>> rgb.shape, depth.shape, opacity.shape
      ((6, 8, 3), (6, 8), (6, 8))
    """
    if not _is_camera(camera):
        if np.ndim(camera) == 0 and legacy:
            return _render_image_legacy(model, camera, c2w, frame, *legacy, chunk=chunk,
                                        max_chunk_samples=max_chunk_samples)
        raise ValueError(f"camera must be a nerf.data.cameras.Camera, got {type(camera).__name__} {camera!r}")
    if legacy:
        raise ValueError(f"render_image(model, camera, c2w, frame) takes no further positional arguments, got "
                         f"{len(legacy)} more (chunk and max_chunk_samples are keyword arguments)")
    o, d, valid = camera_rays_in_scene(model, camera, c2w, frame)
    H, W = camera.height, camera.width
    rgb, depth, acc = np.zeros((H * W, 3), np.float32), np.zeros(H * W, np.float32), np.zeros(H * W, np.float32)
    if valid.any():
        rgb[valid], depth[valid], acc[valid] = _render_flat(model, o, d, chunk, max_chunk_samples)
    return rgb.reshape(H, W, 3), depth.reshape(H, W), acc.reshape(H, W)


def _is_camera(camera) -> bool:
    from nerf.data.cameras import Camera

    return isinstance(camera, Camera)


def scene_pose(model, c2w, frame: str = "data") -> np.ndarray:
    """Camera-to-world ``c2w`` ([4,4] or [3,4]) in ``frame`` ("data": the data's world, "scene": the model's frame;
    see :func:`render_image`) → the 4×4 pose in the model's (scene) frame, float64. ValueError on a bad frame or
    pose.

    >>> import numpy as np
    >>> class M: world_to_scene = np.diag([0.5, 0.5, 0.5, 1.0])
    >>> c2w = np.eye(4); c2w[:3, 3] = [2.0, 0.0, 4.0]
    >>> scene_pose(M(), c2w)[:3, 3].tolist(), scene_pose(M(), c2w, "scene")[:3, 3].tolist()
    ([1.0, 0.0, 2.0], [2.0, 0.0, 4.0])
    """
    from nerf.data.normalise import apply

    if frame not in FRAMES:
        raise ValueError(f"frame must be 'data' (c2w in the data's own world frame) or 'scene' (the frame the model "
                         f"was trained in), got {frame!r}")
    m = np.asarray(c2w, np.float64)
    if m.shape not in ((4, 4), (3, 4)) or not np.all(np.isfinite(m)):
        raise ValueError(f"c2w must be a finite 4x4 (or 3x4) camera-to-world matrix, got shape {m.shape}")
    pose = np.eye(4)
    pose[:3] = m[:3]
    if frame == "scene":
        return pose
    T = getattr(model, "world_to_scene", None)
    return apply(np.eye(4) if T is None else T, pose)


def camera_rays_in_scene(model, camera, c2w, frame: str = "data"):
    """The rays :func:`render_image` renders: origins and unit directions ``[M, 3]`` (float32, the model's frame)
    of the ``M`` pixels of ``camera`` that have a ray, in row-major pixel order, and the ``[H * W]`` bool mask of
    those pixels. ``camera`` is checked (:class:`nerf.data.cameras.CameraModelError`, a ValueError)."""
    from nerf.data.cameras import camera_directions, colmap_camera

    pose = scene_pose(model, c2w, frame)
    cam = colmap_camera(camera.model, camera.width, camera.height, camera.params)  # checked, hashable params
    local = camera_directions(cam).reshape(-1, 3)
    valid = np.all(np.isfinite(local), -1)
    d = local[valid] @ pose[:3, :3].T
    d /= np.linalg.norm(d, axis=-1, keepdims=True)
    o = np.broadcast_to(pose[:3, 3], d.shape)
    return o.astype(np.float32), d.astype(np.float32), valid


def _render_image_legacy(model, H, W, camera, c2w, *positional, chunk=4096, max_chunk_samples=2 ** 18):
    """``render_image(model, H, W, focal_or_intrinsics, c2w[, chunk[, max_chunk_samples]])``, with a
    DeprecationWarning naming the call to write instead."""
    import warnings

    from nerf.data.cameras import Camera

    if len(positional) > 2:
        raise ValueError(f"render_image(model, H, W, camera, c2w, chunk, max_chunk_samples) takes at most 7 "
                         f"positional arguments, got {5 + len(positional)}")
    chunk, max_chunk_samples = (tuple(positional) + (chunk, max_chunk_samples)[len(positional):])[:2]
    H, W = int(H), int(W)
    if np.ndim(camera) == 0:
        f = float(camera)
        cam, frame = Camera.pinhole(W, H, f, f, W / 2, H / 2), "scene"
        new = f"Camera.pinhole({W}, {H}, {f!r}, {f!r}, {W / 2!r}, {H / 2!r}), c2w, frame=\"scene\""
        old = "(model, H, W, focal, c2w)"
    elif np.shape(camera) == (4,):
        fx, fy, cx, cy = (float(v) for v in camera)
        cam, frame = Camera.pinhole(W, H, fx, fy, cx, cy), "data"
        new = f"Camera.pinhole({W}, {H}, {fx!r}, {fy!r}, {cx!r}, {cy!r}), c2w, frame=\"data\""
        old = "(model, H, W, (fx, fy, cx, cy), c2w)"
    else:
        raise ValueError(f"camera must be a nerf.data.cameras.Camera (or, deprecated, a focal length or "
                         f"(fx, fy, cx, cy)), got {camera!r}")
    warnings.warn(f"render_image{old} is deprecated: write render_image(model, {new}) with "
                  f"nerf.data.cameras.Camera; the image size comes from the Camera", DeprecationWarning,
                  stacklevel=3)
    return render_image(model, cam, c2w, frame, chunk=chunk, max_chunk_samples=max_chunk_samples)


def render_rays(model, rays_o, rays_d, chunk: int = 4096, max_chunk_samples: int = 2 ** 18):
    """Render rays ``[H, W, 3]`` (origins, unit directions, in the model's frame) → (rgb [H,W,3], depth [H,W],
    opacity [H,W]) numpy arrays.

    ``chunk`` rays per call; with the occupancy sampler (no jitter: deterministic samples) the rays are first
    marched alone to count their samples, and a call takes as many consecutive rays (up to 16 × ``chunk``) as
    fit in ``max_chunk_samples`` samples."""
    H, W = rays_o.shape[:2]
    rgb, depth, acc = _render_flat(model, rays_o, rays_d, chunk, max_chunk_samples)
    return rgb.reshape(H, W, 3), depth.reshape(H, W), acc.reshape(H, W)


def _render_flat(model, rays_o, rays_d, chunk: int, max_chunk_samples: int):
    """Rays ``[..., 3]`` → flat (rgb [R,3] clipped to [0, 1], depth [R], opacity [R]); see :func:`render_rays`."""
    o = np.asarray(rays_o, np.float32).reshape(-1, 3)
    d = np.asarray(rays_d, np.float32).reshape(-1, 3)
    fn = _eval_fn(model)
    bounds = list(range(0, len(o), chunk)) + [len(o)]
    if getattr(model, "grid", None) is not None:
        count = _count_fn(model)
        counts = np.concatenate([count(tf.constant(o[i:i + chunk]), tf.constant(d[i:i + chunk])).numpy()
                                 for i in range(0, len(o), chunk)])
        cum = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        bounds, start = [0], 0
        while start < len(o):
            end = int(np.searchsorted(cum, cum[start] + max_chunk_samples, side="right")) - 1
            start = min(max(end, start + 1), start + 16 * chunk, len(o))
            bounds.append(start)
    outs = [fn(tf.constant(o[a:b]), tf.constant(d[a:b])) for a, b in zip(bounds[:-1], bounds[1:])]
    rgb = np.concatenate([x[0].numpy() for x in outs]).reshape(-1, 3)
    depth = np.concatenate([x[1].numpy() for x in outs]).reshape(-1)
    acc = np.concatenate([x[2].numpy() for x in outs]).reshape(-1)
    return np.clip(rgb, 0, 1), depth, acc


RAYS_SPEC = tf.TensorSpec([None, 3], tf.float32)


def _eval_fn(model):
    fn = getattr(model, "_nerf_eval_fn", None)
    if fn is None:
        # XLA for models without custom ops (they have no XLA kernel) and without ragged samples
        jit = not (isinstance(model, HashNeRF) and (model.cfg["implementation"] == "op"
                                                    or model.cfg["sampler"] == "occupancy"))

        @tf.function(input_signature=[RAYS_SPEC, RAYS_SPEC], jit_compile=jit)
        def fn(o, d):
            out = model(o, d, training=False)
            return out["color"], out["depth"], out["opacity"]

        model._nerf_eval_fn = fn
    return fn


def _count_fn(model):
    """Samples per ray of the occupancy sampler at evaluation (no jitter) → int32 [R]."""
    fn = getattr(model, "_nerf_count_fn", None)
    if fn is None:
        @tf.function(input_signature=[RAYS_SPEC, RAYS_SPEC])
        def fn(o, d):
            rs = model.march(o, d, training=False).row_splits
            return rs[1:] - rs[:-1]

        model._nerf_count_fn = fn
    return fn
