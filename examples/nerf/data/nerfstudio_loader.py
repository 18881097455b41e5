"""The loader of nerfstudio's and instant-ngp's ``transforms.json``.

Every field is read or refused by name; the ones the example does not use are listed in one warning
(:class:`UnusedFieldsWarning`).

* Cameras: ``fl_x, fl_y, cx, cy, w, h`` and distortion ``k1..k4, p1, p2`` at the top level (shared) and/or in each
  frame (a frame's own value wins); instant-ngp's ``camera_angle_x``/``camera_angle_y`` stand in for missing focal
  lengths and the image centre for a missing principal point. ``camera_model``: ``OPENCV`` (the default; COLMAP's
  OPENCV, or FULL_OPENCV when ``k3`` is set), ``OPENCV_FISHEYE`` (COLMAP's, ``k1..k4``; instant-ngp's
  ``"is_fisheye": true`` means the same), ``PINHOLE``/``SIMPLE_PINHOLE``; ``EQUIRECTANGULAR`` and any other model
  are refused.
* Poses: ``transform_matrix`` is camera-to-world in the OpenGL camera convention. The data's own world frame is the
  one before nerfstudio's ``applied_transform`` (3×4 or 4×4; COLMAP's frame for ``ns-process-data`` output) and
  ``applied_scale``, so poses and points are mapped back through both.
* ``ply_file_path``: the sparse points (a PLY of vertices ``x, y, z``, in the frame of the poses), used for the
  scene normalisation and near/far.
* ``train_filenames`` / ``val_filenames`` / ``test_filenames``: the split (test views: ``test_filenames``, else
  ``val_filenames``), unless ``--split`` or ``--holdout-every`` is given.
* ``mask_path`` per frame: a mask image (zero: the pixel leaves the loss and the metrics).
* instant-ngp's ``aabb_scale`` is kept in ``Dataset.info``.
"""

from __future__ import annotations

import math
import os
import warnings

import numpy as np

from nerf.data.cameras import CameraModelError, colmap_camera
from nerf.data.capture import Frame, assemble
from nerf.data.dataset import Dataset, DatasetError
from nerf.data.loaders import _read_json_object

CAMERA_MODELS = ("OPENCV", "OPENCV_FISHEYE", "PINHOLE", "SIMPLE_PINHOLE")
INTRINSICS = ("fl_x", "fl_y", "cx", "cy", "w", "h", "k1", "k2", "k3", "k4", "p1", "p2", "camera_angle_x",
              "camera_angle_y", "camera_model", "is_fisheye")
TOP_FIELDS = set(INTRINSICS) | {"frames", "applied_transform", "applied_scale", "ply_file_path", "train_filenames",
                                "val_filenames", "test_filenames", "aabb_scale"}
FRAME_FIELDS = set(INTRINSICS) | {"file_path", "transform_matrix", "mask_path"}


class UnusedFieldsWarning(UserWarning):
    """Fields of a ``transforms.json`` the example does not use (listed once per file)."""


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


def _camera(meta: dict, fr: dict, where: str):
    def get(key, default=None):
        v = fr.get(key, meta.get(key, default))
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise DatasetError(f"{where}: '{key}' must be a finite number, got {v!r}")
        return v

    fisheye = fr.get("is_fisheye", meta.get("is_fisheye", False))
    if not isinstance(fisheye, bool):
        raise DatasetError(f"{where}: 'is_fisheye' must be true or false, got {fisheye!r}")
    model = str(fr.get("camera_model", meta.get("camera_model", "OPENCV_FISHEYE" if fisheye else "OPENCV")))
    if fisheye and model != "OPENCV_FISHEYE":
        raise DatasetError(f"{where}: 'is_fisheye' is true but camera_model is {model}")
    if model not in CAMERA_MODELS:
        raise DatasetError(f"{where}: camera_model {model!r} is not supported (supported: {', '.join(CAMERA_MODELS)})")
    w, h = get("w"), get("h")
    if w is None or h is None:
        raise DatasetError(f"{where}: needs the image size 'w' and 'h' (per frame or at the top level)")
    if w != int(w) or h != int(h) or w <= 0 or h <= 0:
        raise DatasetError(f"{where}: 'w' and 'h' must be positive integers, got {w!r} and {h!r}")
    fx, fy = get("fl_x"), get("fl_y")
    ax, ay = get("camera_angle_x"), get("camera_angle_y")
    fx = fx if fx is not None else (0.5 * w / math.tan(0.5 * ax) if ax else None)
    fy = fy if fy is not None else (0.5 * h / math.tan(0.5 * ay) if ay else fx)
    fx = fx if fx is not None else fy
    if fx is None:
        raise DatasetError(f"{where}: needs a focal length ('fl_x'/'fl_y' or 'camera_angle_x')")
    cx, cy = get("cx", w / 2), get("cy", h / 2)
    k = {n: float(get(n, 0.0)) for n in ("k1", "k2", "k3", "k4", "p1", "p2")}
    if model == "OPENCV_FISHEYE":
        if k["p1"] or k["p2"]:
            raise DatasetError(f"{where}: camera_model OPENCV_FISHEYE has no tangential distortion, but p1, p2 are "
                               f"{k['p1']}, {k['p2']}")
        name, params = "OPENCV_FISHEYE", (fx, fy, cx, cy, k["k1"], k["k2"], k["k3"], k["k4"])
    elif model == "OPENCV":
        if k["k4"]:
            raise DatasetError(f"{where}: k4 = {k['k4']} with camera_model OPENCV (a radial r^8 term) is not "
                               "supported; COLMAP's OPENCV models have none")
        if k["k3"]:
            name, params = "FULL_OPENCV", (fx, fy, cx, cy, k["k1"], k["k2"], k["p1"], k["p2"], k["k3"], 0, 0, 0)
        else:
            name, params = "OPENCV", (fx, fy, cx, cy, k["k1"], k["k2"], k["p1"], k["p2"])
    else:
        if any(k.values()):
            raise DatasetError(f"{where}: camera_model {model} has no distortion, but k1..p2 are {k}")
        name, params = "PINHOLE", (fx, fy, cx, cy)
    try:
        return colmap_camera(name, int(w), int(h), params)
    except CameraModelError as e:
        raise DatasetError(f"{where}: {e}") from None


def read_ply_points(path: str, where: str) -> np.ndarray:
    """The vertices ``[P, 3]`` (float64) of the PLY file ``path``."""
    from plyfile import PlyData

    if not os.path.isfile(path):
        raise DatasetError(f"{where}: 'ply_file_path' names {path}, which is not on disk")
    try:
        v = PlyData.read(path)["vertex"]
        pts = np.stack([np.asarray(v[c], np.float64) for c in ("x", "y", "z")], -1)
    except Exception as e:
        raise DatasetError(f"{path}: not a PLY file of vertices x, y, z ({type(e).__name__}: {e})") from None
    if not np.all(np.isfinite(pts)):
        raise DatasetError(f"{path}: vertex positions must be finite")
    return pts


def _filenames(meta: dict, key: str, path: str):
    names = meta.get(key)
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise DatasetError(f"{path}: '{key}' must be a list of file names")
    return [os.path.normpath(n) for n in names]


def _warn_unused(meta: dict, frames: list, path: str) -> list:
    unused = sorted(k for k in meta if k not in TOP_FIELDS)
    per_frame = sorted({k for fr in frames for k in fr if k not in FRAME_FIELDS})
    listed = unused + [f"frames[].{k}" for k in per_frame]
    if listed:
        warnings.warn(f"{path}: fields not used by this example: {', '.join(listed)}", UnusedFieldsWarning,
                      stacklevel=3)
    return listed


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
    scale = meta.get("applied_scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (math.isfinite(scale) and scale > 0):
        raise DatasetError(f"{path}: 'applied_scale' must be a positive number, got {scale!r}")
    to_data_world = np.linalg.inv(np.diag([scale, scale, scale, 1.0]) @ applied)
    frames = []
    for k, fr in enumerate(frames_meta):
        where = f"frame {k} of {path}"
        if not isinstance(fr, dict) or "file_path" not in fr or "transform_matrix" not in fr:
            raise DatasetError(f"{path}: frame {k} needs 'file_path' and 'transform_matrix'")
        c2w = to_data_world @ _matrix(fr["transform_matrix"], f"{path}: frame {k} 'transform_matrix'")
        det = np.linalg.det(c2w[:3, :3])
        if not det > 1e-12:
            raise DatasetError(f"{path}: frame {k} 'transform_matrix' has a singular or mirrored rotation "
                               f"(determinant {det:.3g})")
        c2w[:3, :3] /= np.cbrt(det)  # a scaling applied_transform leaves unit axes
        name = os.path.normpath(str(fr["file_path"]))
        img = os.path.join(root, name)
        if not os.path.splitext(img)[1]:
            img += ".png"
        mask = fr.get("mask_path")
        if mask is not None and not isinstance(mask, str):
            raise DatasetError(f"{where}: 'mask_path' must be a file name, got {mask!r}")
        shared = not ("w" in fr and "h" in fr)
        frames.append(Frame(name, img, c2w, _camera(meta, fr, where), where,
                            ": 'w' and 'h' are given once for all frames; images of several sizes need them in each "
                            "frame" if shared else "", None if mask is None else os.path.join(root, mask)))
    points = None
    if "ply_file_path" in meta:
        ply = read_ply_points(os.path.join(root, str(meta["ply_file_path"])), path)
        points = ply @ to_data_world[:3, :3].T + to_data_world[:3, 3]
    lists = {k: _filenames(meta, f"{k}_filenames", path) for k in ("train", "val", "test")}
    split = None
    if split_file is None and holdout_every is None and lists["train"] is not None:
        test = lists["test"] if lists["test"] is not None else lists["val"]
        if test is None:
            raise DatasetError(f"{path}: 'train_filenames' without 'test_filenames' or 'val_filenames'")
        split = {"train": lists["train"], "test": test, "where": f"{path}: 'train/val/test_filenames'"}
    unused = _warn_unused(meta, frames_meta, path)
    images_dir = os.path.commonpath([os.path.dirname(f.path) for f in frames]) if frames else root
    info = {"format": "transforms.json", "camera_models": sorted({f.camera.model for f in frames})}
    if points is not None:
        info["points3D"] = int(len(points))
    if unused:
        info["unused_fields"] = unused
    if "aabb_scale" in meta:
        info["aabb_scale"] = meta["aabb_scale"]
    return assemble(frames, points, path, images_dir, os.path.basename(os.path.normpath(root)), downscale_factor,
                    split_file, holdout_every, background, info=info, split=split)
