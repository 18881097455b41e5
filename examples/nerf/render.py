#!/usr/bin/env python
"""Videos out of a trained NeRF: a trajectory of views rendered to PNGs and an MP4.

    python examples/nerf/render.py RUN/model --out DIR --views test --data CAPTURE [--downscale N]
                                   [--holdout-every N | --split FILE]
    python examples/nerf/render.py RUN/model --out DIR --orbit N (--data CAPTURE | --focal F --size WxH --radius R)
                                   [--radius R] [--elevation DEG] [--fps 24] [--no-mp4] [--chunk 4096]

* ``--views test`` (or ``val``, ``train``): the views of that split of the capture ``--data`` (loaded as train.py
  loads it: the same ``--downscale``, ``--holdout-every`` / ``--split``), each from its own camera (any COLMAP
  model, distortion included) and pose.
* ``--orbit N``: N views on a horizontal circle around the scene centre (the origin of the model's frame, +z up:
  :mod:`nerf.data.normalise`), evenly spaced in azimuth, each looking at the centre. The camera is the capture's
  first test view's (first training view's without test views), or the pinhole ``--focal F`` (pixels) of size
  ``--size WxH`` centred in the image. The circle's radius and elevation are the capture's training cameras' mean
  distance from the centre and mean elevation unless ``--radius`` (model frame units) and ``--elevation``
  (degrees above the horizontal plane) say otherwise; without ``--data``, ``--radius`` is needed (elevation 30°).

Writes ``DIR/frame_000.png``, ... (8-bit RGB, the camera's size; pixels without a ray are black) and, unless
``--no-mp4``, ``DIR/render.mp4`` (H.264 through imageio's ffmpeg backend, ``imageio-ffmpeg``; ``--fps`` frames per
second; an odd width or height gets one black column or row, as H.264's 4:2:0 sampling needs even sizes).

Poses go through :func:`nerf.models.render_image`: the capture's poses in its own (data) frame, mapped by the
model's saved ``world_to_scene``; the orbit in the model's (scene) frame.

A bad argument (no model in the directory, ``--orbit 0``, no camera for the orbit, no ffmpeg backend for the MP4,
a capture that does not load, ...) is one line on stderr and exit code 2, before TensorFlow loads.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # examples/ → `import nerf`

import numpy as np  # noqa: E402

from nerf.config import check_at_least  # noqa: E402  (no TensorFlow)
from nerf.data.cameras import Camera  # noqa: E402  (no TensorFlow)
from nerf.data.rays import spherical_pose  # noqa: E402
from nerf.export import read_model_meta  # noqa: E402

DEFAULT_FPS = 24.0
DEFAULT_ELEVATION = 30.0  # degrees, the orbit's without a capture
DEFAULT_CHUNK = 4096
SPLITS = ("test", "val", "train")
MP4_NAME = "render.mp4"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Render a trained NeRF along a trajectory (a capture's views or an "
                                            "orbit) to DIR/frame_*.png and DIR/render.mp4.")
    p.add_argument("model", help="a saved model directory (train.py's OUT/model: model.json, model.weights.h5)")
    p.add_argument("--out", required=True, help="output directory (created)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--views", choices=SPLITS, help="the views of this split of --data, each from its own camera")
    which.add_argument("--orbit", type=int, metavar="N", help="N views on a circle around the scene centre")
    p.add_argument("--data", default=None,
                   help="the capture (as train.py's --data): its views for --views, its camera and camera circle "
                        "for --orbit")
    p.add_argument("--downscale", type=int, default=1, help="the capture at 1/N resolution (as train.py)")
    held = p.add_mutually_exclusive_group()
    held.add_argument("--split", default=None, metavar="FILE", help="the capture's held-out views (as train.py)")
    held.add_argument("--holdout-every", type=int, default=None, metavar="N",
                      help="every N-th image is held out (as train.py; default 8)")
    p.add_argument("--focal", type=float, default=None, help="--orbit: a pinhole camera's focal length (pixels)")
    p.add_argument("--size", default=None, metavar="WxH", help="--orbit: that camera's image size, e.g. 320x240")
    p.add_argument("--radius", type=float, default=None,
                   help="--orbit: the circle's radius (model frame units; default: the training cameras' mean "
                        "distance from the centre)")
    p.add_argument("--elevation", type=float, default=None,
                   help="--orbit: degrees above the horizontal plane (default: the training cameras' mean; "
                        f"{DEFAULT_ELEVATION:g} without --data)")
    p.add_argument("--fps", type=float, default=DEFAULT_FPS, help=f"MP4 frame rate (default {DEFAULT_FPS:g})")
    p.add_argument("--no-mp4", action="store_true", help="PNGs only")
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help=f"rays per model call (default {DEFAULT_CHUNK})")
    return p


def parse_size(text: str) -> tuple[int, int]:
    """``"WxH"`` → ``(W, H)``, positive integers; ValueError otherwise.

    >>> parse_size("320x240")
    (320, 240)
    """
    parts = str(text).lower().split("x")
    try:
        w, h = (int(v) for v in parts)
    except ValueError:
        raise ValueError(f"--size must be WIDTHxHEIGHT in pixels, e.g. 320x240, got {text!r}") from None
    if w < 1 or h < 1:
        raise ValueError(f"--size must be positive, got {text!r}")
    return w, h


def mp4_backend_available() -> bool:
    """Whether imageio can write MP4 here (its ffmpeg plugin needs the ``imageio-ffmpeg`` package)."""
    return importlib.util.find_spec("imageio_ffmpeg") is not None


def check_args(p: argparse.ArgumentParser, args) -> dict:
    """Every argument checked before anything heavy runs; argparse's error (usage, exit code 2) otherwise. Returns
    the model's metadata."""
    if args.orbit is not None and args.orbit < 1:
        p.error(f"--orbit must be at least 1 view, got {args.orbit}")
    if args.views is not None and args.data is None:
        p.error(f"--views {args.views} renders the views of a capture: give it with --data")
    if args.views is not None and (args.focal is not None or args.size is not None or args.radius is not None
                                   or args.elevation is not None):
        p.error("--focal, --size, --radius and --elevation are for --orbit; --views renders each view's own camera")
    if (args.focal is None) != (args.size is None):
        p.error("--focal and --size go together (a pinhole camera of that focal length and image size)")
    if args.focal is not None and not (math.isfinite(args.focal) and args.focal > 0):
        p.error(f"--focal must be a positive number of pixels, got {args.focal}")
    if args.size is not None:
        try:
            parse_size(args.size)
        except ValueError as e:
            p.error(str(e))
    if args.orbit is not None and args.data is None and args.focal is None:
        p.error("--orbit needs a camera: --data CAPTURE (its first test camera) or --focal F --size WxH")
    if args.radius is not None and not (math.isfinite(args.radius) and args.radius > 0):
        p.error(f"--radius must be positive, got {args.radius}")
    if args.orbit is not None and args.data is None and args.radius is None:
        p.error("--orbit without --data needs --radius (the circle's radius in the model's frame)")
    if args.elevation is not None and not (math.isfinite(args.elevation) and -90 < args.elevation < 90):
        p.error(f"--elevation must be between -90 and 90 degrees, got {args.elevation}")
    check_at_least(p, "--downscale", args.downscale, 1)
    if not (math.isfinite(args.fps) and args.fps > 0):
        p.error(f"--fps must be positive, got {args.fps}")
    check_at_least(p, "--chunk", args.chunk, 1)
    if not args.no_mp4 and not mp4_backend_available():
        p.error("writing the MP4 needs imageio's ffmpeg backend: pip install imageio-ffmpeg (or pass --no-mp4 for "
                "the PNGs only)")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        p.error(f"--out {args.out}: exists and is not a directory")
    try:
        return read_model_meta(args.model)
    except ValueError as e:
        p.error(str(e))


def load_capture(p: argparse.ArgumentParser, args):
    """The dataset of --data (None without it); a dataset error is argparse's error."""
    if args.data is None:
        return None
    from nerf.data import DatasetError, load_dataset

    held = {k: v for k, v in (("split_file", args.split), ("holdout_every", args.holdout_every)) if v is not None}
    try:
        if args.data == "builtin":
            if held or args.downscale != 1:
                p.error("--split, --holdout-every and --downscale apply to real data; the built-in scene has its own")
            return load_dataset("builtin")
        return load_dataset(args.data, downscale_factor=args.downscale, **held)
    except DatasetError as e:
        p.error(str(e))


def view_camera(ds, views, k: int) -> Camera:
    """View ``k``'s camera: its own (real captures) or the dataset's pinhole camera centred in the image."""
    if views.cameras is not None:
        return views.cameras[k]
    return Camera.pinhole(ds.W, ds.H, ds.focal, ds.focal, ds.W / 2, ds.H / 2)


def capture_views(ds, split: str) -> list[tuple[Camera, np.ndarray]]:
    """``(camera, c2w in the data's own frame)`` of every view of ``split``: the dataset's poses (its scene frame)
    mapped back through the inverse of its ``world_to_scene``."""
    from nerf.data.normalise import apply

    views = ds.split(split)
    back = np.linalg.inv(np.asarray(ds.world_to_scene, np.float64))
    return [(view_camera(ds, views, k), apply(back, views.poses[k])) for k in range(len(views))]


def orbit_poses(n: int, radius: float, elevation_deg: float) -> np.ndarray:
    """``[n, 4, 4]`` camera-to-world poses on the circle of ``radius`` at ``elevation_deg`` around the origin (+z up),
    azimuths ``2πk/n`` from +x, each looking at the origin.

    >>> P = orbit_poses(4, 2.0, 0.0)
    >>> (np.round(P[:2, :3, 3], 6) + 0.0).tolist(), (np.round(-P[1, :3, 2], 6) + 0.0).tolist()  # + 0.0: no -0.0
    ([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0]], [0.0, -1.0, 0.0])
    """
    el = math.radians(elevation_deg)
    return np.stack([spherical_pose(radius, 2 * math.pi * k / n, el) for k in range(n)])


def camera_circle(ds, world_to_scene) -> tuple[float, float]:
    """The training cameras' mean distance from the origin of the model's frame and mean elevation (degrees) there,
    their poses mapped from the data's frame by the model's ``world_to_scene``."""
    from nerf.data.normalise import apply

    c = apply(np.asarray(world_to_scene, np.float64), np.stack([m for _, m in capture_views(ds, "train")]))[:, :3, 3]
    r = np.linalg.norm(c, axis=-1)
    return float(r.mean()), float(np.degrees(np.arcsin(np.clip(c[:, 2] / np.maximum(r, 1e-12), -1, 1))).mean())


def trajectory(p, args, meta, ds) -> tuple[list, str]:
    """The views to render, ``[(camera, c2w)]``, and the frame of their poses ("data" or "scene")."""
    if args.views is not None:
        views = capture_views(ds, args.views)
        if not views:
            p.error(f"{args.data}: no {args.views} views (--holdout-every N or --split FILE hold views out)")
        return views, "data"
    if args.focal is not None:
        w, h = parse_size(args.size)
        cam = Camera.pinhole(w, h, args.focal, args.focal, w / 2, h / 2)
    else:
        split = "test" if len(ds.test) else "train"
        cam = view_camera(ds, ds.split(split), 0)
    radius, elevation = args.radius, args.elevation
    if ds is not None and (radius is None or elevation is None):
        r, e = camera_circle(ds, meta.get("world_to_scene", np.eye(4)))
        radius = r if radius is None else radius
        elevation = e if elevation is None else elevation
    elevation = DEFAULT_ELEVATION if elevation is None else elevation
    return [(cam, pose) for pose in orbit_poses(args.orbit, radius, elevation)], "scene"


def to_uint8(rgb: np.ndarray) -> np.ndarray:
    return (np.clip(rgb, 0, 1) * 255).round().astype(np.uint8)


def even_sized(frame: np.ndarray) -> np.ndarray:
    """``frame`` [H, W, 3] padded with one black row / column where H / W is odd (H.264 4:2:0 needs even sizes)."""
    h, w = frame.shape[:2]
    return np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)))


def write_mp4(path: str, frames: list, fps: float) -> None:
    """``frames`` (uint8 [H, W, 3], one size) → an H.264 MP4 at ``fps`` through imageio's ffmpeg plugin."""
    import imageio.v2 as iio2

    with iio2.get_writer(path, format="FFMPEG", mode="I", fps=fps, codec="libx264", macro_block_size=1) as w:
        for f in frames:
            w.append_data(even_sized(f))


def render(model, views: list, frame: str, out: str, fps: float = DEFAULT_FPS, mp4: bool = True,
           chunk: int = DEFAULT_CHUNK) -> dict:
    """Renders ``views`` (``[(camera, c2w)]`` with ``c2w`` in ``frame``, see :func:`nerf.models.render_image`) with
    ``model`` to ``out/frame_NNN.png`` and (``mp4``) ``out/render.mp4``; returns the paths written. The MP4 needs
    every view of one size (ValueError otherwise, before rendering)."""
    import imageio.v3 as iio

    from nerf.models import render_image

    if mp4 and len({(c.width, c.height) for c, _ in views}) > 1:
        raise ValueError("the views' cameras have different image sizes: an MP4 needs one size (use --no-mp4)")
    os.makedirs(out, exist_ok=True)
    digits = max(3, len(str(len(views) - 1)))
    pngs, frames = [], []
    for k, (cam, c2w) in enumerate(views):
        rgb, _, _ = render_image(model, cam, c2w, frame, chunk=chunk)
        frames.append(to_uint8(rgb))
        pngs.append(os.path.join(out, f"frame_{k:0{digits}d}.png"))
        iio.imwrite(pngs[-1], frames[-1])
    doc = dict(pngs=pngs, mp4=None)
    if mp4:
        doc["mp4"] = os.path.join(out, MP4_NAME)
        write_mp4(doc["mp4"], frames, fps)
    return doc


def main(argv=None) -> dict:
    p = build_parser()
    args = p.parse_args(argv)
    meta = check_args(p, args)  # exits (code 2) on bad input, before TensorFlow loads
    ds = load_capture(p, args)
    views, frame = trajectory(p, args, meta, ds)
    if not args.no_mp4 and len({(c.width, c.height) for c, _ in views}) > 1:
        p.error("the views' cameras have different image sizes: an MP4 needs one size (pass --no-mp4)")
    from nerf.models import load_model

    model = load_model(args.model)
    doc = render(model, views, frame, args.out, args.fps, not args.no_mp4, args.chunk)
    cam = views[0][0]
    print(f"{len(doc['pngs'])} views of {cam.width}x{cam.height} in {args.out}"
          + (f"; {doc['mp4']} at {args.fps:g} fps" if doc["mp4"] else ""), flush=True)
    return doc


if __name__ == "__main__":
    main()
