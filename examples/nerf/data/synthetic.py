"""The built-in scene: a seeded, exactly ray-traced synthetic NeRF dataset (no download).

Scene (world coordinates, **+z up**, everything inside the cube ``[-1, 1]^3``):

* a checkered floor disc at z = -0.55 (radius 0.95),
* a red/yellow striped sphere, a blue/white checkered sphere (checker in latitude/longitude),
* a rotated green box with a solid checker texture, a purple striped pillar, a small orange sphere on top,

shaded with Lambert (one directional light + ambient) and hard shadows (shadow rays), so the images carry texture
detail at several scales, occlusion and shadowing. The appearance is view-independent (diffuse), so the ground truth
is exactly representable by a radiance field.

Cameras: a hemisphere of radius ``radius`` (default 4) around the origin, looking at the origin (camera convention in
:mod:`nerf.data.rays`; focal 138.89 px at 100×100, the field of view of the Blender scenes), near 2, far 6.

* train: ``n_train`` cameras at random (seeded) azimuths and elevations in [10°, 70°] (uniform in area), none
  within 5° of a held-out camera,
* val: a ring at elevation 50°, test: a ring at elevation 35°, at fixed azimuths — novel views, not in the training set.

Pixels are supersampled (``ss × ss`` rays per pixel, averaged; 4×4 by default, like the antialiased Blender renders
of NeRF-synthetic), so edges are antialiased and the alpha channel is fractional there. With 2×2 the ground truth
itself aliases (checker edges change from view to view) and that inconsistency, not the model, bounds test PSNR. Images are stored as RGBA uint8 (like PNGs). The whole dataset is a pure function of its
parameters; it is cached as ``<cache>/nerf_builtin_<hash of parameters>.npz`` with ``<cache>`` =
``$TF_METAL_OPS_CACHE`` or ``~/.cache/tf-metal-ops`` and regenerated only when that file is missing.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass

import numpy as np

from nerf.data.dataset import Dataset, DatasetError, Views
from nerf.data.rays import focal_from_fov, get_rays, spherical_pose

GENERATOR_VERSION = 1
CAMERA_ANGLE_X = 0.6911112070083618  # the Blender NeRF-synthetic field of view → focal 138.89 px at W = 100
EPS = 1e-4
MIN_HELDOUT_ANGLE_DEG = 5.0  # no training camera within this angle of a val/test camera


@dataclass(frozen=True)
class SceneParams:
    H: int = 100
    W: int = 100
    n_train: int = 100
    n_val: int = 8
    n_test: int = 16
    seed: int = 0
    radius: float = 4.0
    near: float = 2.0
    far: float = 6.0
    ss: int = 4  # rays per pixel and axis (the ground truth is the pixel-area average)
    train_elevation_deg: tuple = (10.0, 70.0)
    val_elevation_deg: float = 50.0
    test_elevation_deg: float = 35.0

    def key(self) -> str:
        blob = json.dumps({"v": GENERATOR_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def focal(self) -> float:
        return focal_from_fov(self.W, CAMERA_ANGLE_X)


# ----------------------------------------------------------------------------------------------- primitives


def _dot(a, b):
    return np.einsum("...i,...i->...", a, b)


def _checker(*coords):
    return (np.sum([np.floor(c) for c in coords], axis=0) % 2).astype(np.float64)


def _mix(c0, c1, s):
    return np.asarray(c0)[None] * (1.0 - s[:, None]) + np.asarray(c1)[None] * s[:, None]


class Sphere:
    def __init__(self, center, radius, texture):
        self.c, self.r, self.texture = np.asarray(center, float), float(radius), texture

    def intersect(self, o, d):
        oc = o - self.c
        b = _dot(oc, d)
        disc = b * b - (_dot(oc, oc) - self.r**2)
        with np.errstate(invalid="ignore"):
            s = np.sqrt(disc)
        t0, t1 = -b - s, -b + s
        t = np.where(t0 > EPS, t0, np.where(t1 > EPS, t1, np.inf))
        return np.where(disc >= 0, t, np.inf)

    def normal(self, p):
        return (p - self.c) / self.r

    def signed_distance(self, p):
        """Euclidean distance of points ``[N, 3]`` to the sphere, negative inside."""
        return np.linalg.norm(p - self.c, axis=-1) - self.r

    def surface_distance(self, p):
        return np.abs(self.signed_distance(p))

    def albedo(self, p):
        q = (p - self.c) / self.r
        if self.texture == "stripes":  # latitude stripes, red / yellow, plus a slow tint along x
            s = (np.sin(2 * math.pi * q[:, 2] / 0.3) > 0).astype(float)
            base = _mix((0.85, 0.12, 0.1), (0.95, 0.8, 0.15), s)
            return base * (0.85 + 0.15 * q[:, :1])
        if self.texture == "latlong":  # blue / white checker in longitude (12) × latitude (8)
            lon = np.arctan2(q[:, 1], q[:, 0]) / (2 * math.pi) * 12
            lat = np.arcsin(np.clip(q[:, 2], -1, 1)) / math.pi * 8
            return _mix((0.1, 0.25, 0.85), (0.92, 0.94, 0.96), _checker(lon, lat))
        if self.texture == "gradient":  # orange with a vertical gradient to pink
            return _mix((1.0, 0.55, 0.1), (0.95, 0.35, 0.6), 0.5 + 0.5 * q[:, 2])
        raise ValueError(self.texture)


class Box:
    """Box with half extents ``h``, rotated by ``angle`` about the world z axis."""

    def __init__(self, center, half, angle, texture):
        self.c, self.h, self.texture = np.asarray(center, float), np.asarray(half, float), texture
        ca, sa = math.cos(angle), math.sin(angle)
        self.R = np.array([[ca, -sa, 0], [sa, ca, 0], [0, 0, 1.0]])  # local → world

    def _local(self, v):
        return v @ self.R  # R^T v

    def intersect(self, o, d):
        ol, dl = self._local(o - self.c), self._local(d)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = 1.0 / dl
            t1, t2 = (-self.h - ol) * inv, (self.h - ol) * inv
        t1, t2 = np.nan_to_num(t1, nan=-np.inf), np.nan_to_num(t2, nan=np.inf)
        tmin = np.max(np.minimum(t1, t2), axis=-1)
        tmax = np.min(np.maximum(t1, t2), axis=-1)
        t = np.where(tmin > EPS, tmin, tmax)
        return np.where((tmax >= tmin) & (tmax > EPS), t, np.inf)

    def normal(self, p):
        pl = self._local(p - self.c) / self.h
        k = np.argmax(np.abs(pl), axis=-1)
        n = np.zeros_like(pl)
        n[np.arange(len(pl)), k] = np.sign(pl[np.arange(len(pl)), k])
        return n @ self.R.T

    def signed_distance(self, p):
        """Exact Euclidean distance of points ``[N, 3]`` to the box surface, negative inside."""
        q = np.abs(self._local(p - self.c)) - self.h
        outside = np.linalg.norm(np.maximum(q, 0.0), axis=-1)
        return outside + np.minimum(np.max(q, axis=-1), 0.0)

    def surface_distance(self, p):
        return np.abs(self.signed_distance(p))

    def albedo(self, p):
        pl = self._local(p - self.c)
        if self.texture == "checker3d":
            return _mix((0.1, 0.55, 0.2), (0.7, 0.9, 0.45), _checker(*(pl.T / 0.1)))
        if self.texture == "hstripes":
            s = (np.sin(2 * math.pi * pl[:, 2] / 0.16) > 0).astype(float)
            return _mix((0.45, 0.15, 0.6), (0.9, 0.85, 0.95), s)
        raise ValueError(self.texture)


class Disc:
    """Horizontal disc (the floor), two-sided, normal +z."""

    def __init__(self, center, radius):
        self.c, self.r = np.asarray(center, float), float(radius)

    def intersect(self, o, d):
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (self.c[2] - o[:, 2]) / d[:, 2]
        p = o + np.nan_to_num(t)[:, None] * d
        inside = np.sum((p[:, :2] - self.c[:2]) ** 2, axis=-1) <= self.r**2
        return np.where((t > EPS) & inside, t, np.inf)

    def normal(self, p):
        return np.broadcast_to(np.array([0.0, 0.0, 1.0]), p.shape)

    def surface_distance(self, p):
        """Euclidean distance of points ``[N, 3]`` to the disc (zero thickness: no inside)."""
        q = p - self.c
        radial = np.maximum(np.hypot(q[:, 0], q[:, 1]) - self.r, 0.0)
        return np.hypot(radial, q[:, 2])

    def albedo(self, p):
        q = p - self.c
        c = _checker(q[:, 0] / 0.2, q[:, 1] / 0.2)
        base = _mix((0.95, 0.9, 0.8), (0.55, 0.3, 0.2), c)
        ring = (np.sqrt(q[:, 0] ** 2 + q[:, 1] ** 2) > 0.85)[:, None]  # a dark rim
        return np.where(ring, np.array([0.15, 0.15, 0.2]), base)


SCENE = [
    Disc((0.0, 0.0, -0.55), 0.95),
    Sphere((0.35, 0.3, -0.15), 0.4, "stripes"),
    Sphere((-0.45, 0.35, -0.3), 0.25, "latlong"),
    Box((-0.2, -0.45, -0.3), (0.25, 0.15, 0.25), math.radians(30), "checker3d"),
    Box((0.5, -0.4, -0.1), (0.08, 0.08, 0.45), math.radians(-20), "hstripes"),
    Sphere((0.0, 0.05, 0.45), 0.15, "gradient"),
]
LIGHT = np.array([0.5, 0.3, 0.8]) / np.linalg.norm([0.5, 0.3, 0.8])
AMBIENT = 0.3


def surface_distance(points, scene=SCENE) -> np.ndarray:
    """Unsigned Euclidean distance ``[N]`` (float64) of points ``[N, 3]`` to the nearest primitive surface of
    ``scene`` (the analytic geometry of the built-in scene, world frame). Every primitive's whole surface counts,
    also the parts hidden inside another primitive or under the floor.

    Example:
      >>> import numpy as np
      >>> from nerf.data import synthetic
      >>> synthetic.surface_distance(np.array([[0.0, 0.05, 0.6], [0.0, 0.0, -0.55]])).round(6).tolist()
      [0.0, 0.0]
    """
    p = np.asarray(points, np.float64).reshape(-1, 3)
    return np.min(np.stack([prim.surface_distance(p) for prim in scene]), axis=0)


def first_hit(o: np.ndarray, d: np.ndarray, scene=SCENE):
    """The nearest intersection of rays ``[N, 3]`` (unit ``d``) with ``scene``: ``(t [N], which [N])``, the distance
    along the ray (``inf`` for a miss) and the index of the primitive hit."""
    ts = np.stack([prim.intersect(np.asarray(o, np.float64), np.asarray(d, np.float64)) for prim in scene])  # [P, N]
    return np.min(ts, axis=0), np.argmin(ts, axis=0)


def trace(o: np.ndarray, d: np.ndarray, scene=SCENE) -> np.ndarray:
    """Ray-trace rays ``[N,3]`` (unit ``d``) → RGBA ``[N,4]`` float64 (alpha 0 where nothing is hit).

    A primitive with ``emissive = True`` shows its albedo unshaded; one with ``casts_shadow = False`` is left out
    of the shadow rays (e.g. a sky dome around the scene)."""
    o, d = np.asarray(o, np.float64), np.asarray(d, np.float64)
    t, which = first_hit(o, d, scene)
    hit = np.isfinite(t)
    rgba = np.zeros((len(o), 4))
    p = o + np.where(hit, t, 0)[:, None] * d
    normal, albedo = np.zeros_like(p), np.zeros_like(p)
    for k, prim in enumerate(scene):
        m = hit & (which == k)
        if m.any():
            normal[m], albedo[m] = prim.normal(p[m]), prim.albedo(p[m])
    # hard shadows: is anything between the hit point and the light?
    ph = p[hit] + 1e-3 * normal[hit]
    lit = np.ones(len(ph), bool)
    for prim in scene:
        if getattr(prim, "casts_shadow", True):
            lit &= ~np.isfinite(prim.intersect(ph, np.broadcast_to(LIGHT, ph.shape)))
    lambert = np.clip(normal[hit] @ LIGHT, 0.0, 1.0) * lit
    shade = AMBIENT + (1.0 - AMBIENT) * lambert
    emissive = np.array([getattr(prim, "emissive", False) for prim in scene])[which[hit]]
    shade = np.where(emissive, 1.0, shade)
    rgba[hit, :3] = np.clip(albedo[hit] * shade[:, None], 0.0, 1.0)
    rgba[hit, 3] = 1.0
    return rgba


def render_view(params: SceneParams, c2w) -> np.ndarray:
    """One RGBA view ``[H, W, 4]`` float64 in [0, 1], ``ss × ss`` supersampled."""
    H, W, s = params.H, params.W, params.ss
    o, d = get_rays(H * s, W * s, params.focal * s, c2w)  # sub-pixel centres of the same camera
    rgba = trace(o.reshape(-1, 3), d.reshape(-1, 3)).reshape(H, s, W, s, 4)
    # average premultiplied colour and alpha over the pixel, then un-premultiply (straight alpha like a PNG)
    rgba[..., :3] *= rgba[..., 3:]
    rgba = rgba.mean(axis=(1, 3))
    a = rgba[..., 3:]
    rgba[..., :3] = np.where(a > 0, rgba[..., :3] / np.maximum(a, 1e-12), 0.0)
    return rgba


def camera_poses(params: SceneParams) -> dict[str, np.ndarray]:
    """Held-out rings first; training cameras are drawn (seeded) and rejected when closer than
    ``MIN_HELDOUT_ANGLE_DEG`` to any val/test camera, so held-out views really are novel."""
    ring = lambda n, el_deg, phase: [  # noqa: E731
        spherical_pose(params.radius, 2 * math.pi * (k + phase) / n, math.radians(el_deg)) for k in range(n)
    ]
    val = ring(params.n_val, params.val_elevation_deg, 0.25)
    test = ring(params.n_test, params.test_elevation_deg, 0.5)
    held = np.array([m[:3, 3] for m in val + test]).reshape(-1, 3) / params.radius
    rng = np.random.default_rng(params.seed)
    lo, hi = (math.radians(e) for e in params.train_elevation_deg)
    cos_min = math.cos(math.radians(MIN_HELDOUT_ANGLE_DEG))
    train = []
    while len(train) < params.n_train:
        az = rng.uniform(0, 2 * math.pi)
        el = math.asin(rng.uniform(math.sin(lo), math.sin(hi)))  # uniform in area on the band
        m = spherical_pose(params.radius, az, el)
        if len(held) and np.max(held @ (m[:3, 3] / params.radius)) > cos_min:
            continue
        train.append(m)
    empty = np.zeros((0, 4, 4))
    return {"train": np.stack(train) if train else empty, "val": np.stack(val) if val else empty,
            "test": np.stack(test) if test else empty}


def generate(params: SceneParams = SceneParams()) -> dict[str, np.ndarray]:
    """All views as arrays: ``{split}_rgba`` uint8 [N,H,W,4], ``{split}_poses`` float32 [N,4,4], ``focal``, timing."""
    t0 = time.perf_counter()
    out = {}
    for split, poses in camera_poses(params).items():
        views = [render_view(params, c2w) for c2w in poses]
        out[f"{split}_rgba"] = np.round(np.stack(views) * 255).astype(np.uint8) if views else np.zeros(
            (0, params.H, params.W, 4), np.uint8)
        out[f"{split}_poses"] = poses.astype(np.float32)
    out["focal"] = np.float64(params.focal)
    out["gen_seconds"] = np.float64(time.perf_counter() - t0)
    out["params_json"] = np.array(json.dumps(asdict(params)))
    return out


def cache_dir() -> str:
    return os.environ.get("TF_METAL_OPS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tf-metal-ops")


def cache_path(params: SceneParams, directory: str | None = None) -> str:
    return os.path.join(directory or cache_dir(), f"nerf_builtin_{params.key()}.npz")


def load_arrays(params: SceneParams = SceneParams(), directory: str | None = None, verbose: bool = False):
    """The generated arrays, from the cache if present, else generated and written there (atomically)."""
    path = cache_path(params, directory)
    if os.path.isfile(path):
        try:
            with np.load(path) as f:
                return {k: f[k] for k in f.files}, path, True
        except Exception:  # a corrupt cache file (e.g. a killed writer on a filesystem without atomic rename)
            pass
    if verbose:
        print(f"generating the built-in scene ({params.n_train + params.n_val + params.n_test} views of "
              f"{params.H}x{params.W}) -> {path}", flush=True)
    arrays = generate(params)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp.npz"
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)
    if verbose:
        print(f"  generated in {float(arrays['gen_seconds']):.1f} s", flush=True)
    return arrays, path, False


def load_builtin(background=(1.0, 1.0, 1.0), cache: str | None = None, verbose: bool = False,
                 **params) -> Dataset:
    """The built-in scene as a :class:`Dataset`, RGBA composited on ``background`` (default white).

    Keyword arguments override :class:`SceneParams` fields (e.g. ``H=32, W=32, n_train=10`` for tests).
    """
    try:
        p = SceneParams(**params)
    except TypeError as e:
        raise DatasetError(f"built-in scene: {e}") from None
    arrays, path, cached = load_arrays(p, cache, verbose)
    bg = np.broadcast_to(np.asarray(background, np.float32), (3,)).copy()

    def views(split):
        rgba = arrays[f"{split}_rgba"].astype(np.float32) / 255.0
        a = rgba[..., 3:]
        return Views(rgba[..., :3] * a + bg * (1.0 - a), arrays[f"{split}_poses"], a[..., 0])

    return Dataset(views("train"), views("val"), views("test"), p.H, p.W, float(arrays["focal"]), p.near, p.far,
                   bg, name="builtin", info={"cache": path, "cached": cached,
                                             "gen_seconds": float(arrays["gen_seconds"]), "params": asdict(p)})
