"""The loader of nerfstudio's and instant-ngp's ``transforms.json``.

Intrinsics ``fl_x, fl_y, cx, cy, w, h`` and distortion ``k1, k2, k3, p1, p2`` at the top level (shared) and/or in
each frame (a frame's own value wins); instant-ngp's ``camera_angle_x``/``camera_angle_y`` stand in for missing
focal lengths and the image centre for a missing principal point. ``camera_model`` is ``OPENCV`` (the default) or
``PINHOLE``/``SIMPLE_PINHOLE``; fisheye and equirectangular models are refused. ``transform_matrix`` is
camera-to-world in the OpenGL camera convention. The data's own world frame is the one before nerfstudio's
``applied_transform`` (3×4 or 4×4; COLMAP's frame for ``ns-process-data`` output), so the poses are mapped back
through its inverse. instant-ngp's ``aabb_scale`` is kept in ``Dataset.info``.
"""

from __future__ import annotations

import math
import os

import numpy as np

from nerf.data.cameras import Camera, CameraModelError, checked
from nerf.data.capture import Frame, assemble
from nerf.data.dataset import Dataset, DatasetError
from nerf.data.loaders import _read_json_object

CAMERA_MODELS = ("OPENCV", "PINHOLE", "SIMPLE_PINHOLE")


def _matrix(value, where, shapes=((4, 4), (3, 4))) -> np.ndarray:
    try:
        m = np.asarray(value, np.float64)
    except (ValueError, TypeError):
        m = np.zeros(0)
    if m.shape not in shapes or not np.all(np.isfinite(m)):
        raise DatasetError(f"{where} must be a finite 4x4 (or 3x4) matrix, got {value!r:.80}")
    if m.shape == (3, 4):
        m = np.vstack([m, [0, 0, 0, 1.0]])
    return m


def _camera(meta: dict, fr: dict, where: str) -> Camera:
    def get(key, default=None):
        v = fr.get(key, meta.get(key, default))
        if v is not None and not isinstance(v, (int, float)):
            raise DatasetError(f"{where}: '{key}' must be a number, got {v!r}")
        return v

    model = str(fr.get("camera_model", meta.get("camera_model", "OPENCV")))
    if model not in CAMERA_MODELS:
        raise DatasetError(f"{where}: unknown camera_model {model!r} (supported: {', '.join(CAMERA_MODELS)})")
    w, h = get("w"), get("h")
    if w is None or h is None:
        raise DatasetError(f"{where}: needs the image size 'w' and 'h' (per frame or at the top level)")
    fx, fy = get("fl_x"), get("fl_y")
    ax, ay = get("camera_angle_x"), get("camera_angle_y")
    fx = fx if fx is not None else (0.5 * w / math.tan(0.5 * ax) if ax else None)
    fy = fy if fy is not None else (0.5 * h / math.tan(0.5 * ay) if ay else fx)
    fx = fx if fx is not None else fy
    if fx is None:
        raise DatasetError(f"{where}: needs a focal length ('fl_x'/'fl_y' or 'camera_angle_x')")
    dist = tuple(float(get(k, 0.0)) for k in ("k1", "k2", "k3", "p1", "p2"))
    if model != "OPENCV" and any(dist):
        raise DatasetError(f"{where}: camera_model {model} has no distortion, but k1..p2 are {dist}")
    try:
        return checked(Camera(int(w), int(h), float(fx), float(fy), float(get("cx", w / 2)), float(get("cy", h / 2)),
                              dist))
    except CameraModelError as e:
        raise DatasetError(f"{where}: {e}") from None


def load_transforms(root: str, downscale_factor: int = 1, split_file: str | None = None,
                    holdout_every: int | None = None, background=(1.0, 1.0, 1.0), **_ignored) -> Dataset:
    path = os.path.join(root, "transforms.json")
    meta = _read_json_object(path)
    frames_meta = meta.get("frames")
    if not isinstance(frames_meta, list):
        raise DatasetError(f"{path}: 'frames' must be a list")
    if not frames_meta:
        raise DatasetError(f"{path}: zero registered images ('frames' is empty)")
    applied = _matrix(meta["applied_transform"], f"{path}: 'applied_transform'") if "applied_transform" in meta \
        else np.eye(4)
    to_data_world = np.linalg.inv(applied)
    frames = []
    for k, fr in enumerate(frames_meta):
        where = f"frame {k} of {path}"
        if not isinstance(fr, dict) or "file_path" not in fr or "transform_matrix" not in fr:
            raise DatasetError(f"{path}: frame {k} needs 'file_path' and 'transform_matrix'")
        c2w = to_data_world @ _matrix(fr["transform_matrix"], f"{path}: frame {k} 'transform_matrix'")
        c2w[:3, :3] /= np.cbrt(np.linalg.det(c2w[:3, :3]))  # a scaling applied_transform leaves unit axes
        name = os.path.normpath(str(fr["file_path"]))
        img = os.path.join(root, name)
        if not os.path.splitext(img)[1]:
            img += ".png"
        shared = not ("w" in fr and "h" in fr)
        frames.append(Frame(name, img, c2w, _camera(meta, fr, where), where,
                            ": 'w' and 'h' are given once for all frames; images of several sizes need them in each "
                            "frame" if shared else ""))
    images_dir = os.path.commonpath([os.path.dirname(f.path) for f in frames]) if frames else root
    info = {"format": "transforms.json"}
    if "aabb_scale" in meta:
        info["aabb_scale"] = meta["aabb_scale"]
    return assemble(frames, None, path, images_dir, os.path.basename(os.path.normpath(root)), downscale_factor,
                    split_file, holdout_every, background, info=info)
