"""Loaders for real NeRF data: the tiny-NeRF ``.npz`` and the NeRF-synthetic "Blender" folder layout, and the
dispatch to the loaders of real captures (COLMAP: :mod:`nerf.data.colmap_loader`; nerfstudio / instant-ngp
``transforms.json``: :mod:`nerf.data.nerfstudio_loader`).

Every problem with the input raises :class:`~nerf.data.DatasetError` (a ``ValueError``) whose message names the file
and says what is wrong, so the training script can print one line instead of a traceback.
"""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np

from nerf.data.dataset import Dataset, DatasetError, Views
from nerf.data.rays import focal_from_fov


FORMATS = ("'builtin', a tiny-NeRF .npz file, or a folder with transforms_train.json (NeRF-synthetic), "
           "transforms.json (nerfstudio / instant-ngp) or sparse/0/cameras.bin|txt (COLMAP)")


def detect_format(path: str) -> str:
    """``"npz"``, ``"blender"``, ``"transforms"`` or ``"colmap"``: what the file or folder ``path`` holds."""
    from nerf.data.colmap_model import find_model

    if not os.path.exists(path):
        raise DatasetError(f"{path}: no such file or directory (expected {FORMATS})")
    if not os.path.isdir(path):
        if path.endswith(".npz"):
            return "npz"
        raise DatasetError(f"{path}: not a .npz file or a folder (expected {FORMATS})")
    if os.path.isfile(os.path.join(path, "transforms_train.json")):
        return "blender"
    if os.path.isfile(os.path.join(path, "transforms.json")):
        return "transforms"
    if find_model(path) is not None:
        return "colmap"
    raise DatasetError(f"{path}: no known data layout in this folder (expected {FORMATS})")


def load_path(path: str, split_file: str | None = None, holdout_every: int | None = None, **kwargs) -> Dataset:
    """Loads ``path`` in the format :func:`detect_format` finds. ``split_file`` and ``holdout_every`` choose the
    held-out views of real captures; the other formats come with their splits and refuse them."""
    kind = detect_format(path)
    if kind in ("npz", "blender") and (split_file is not None or holdout_every is not None):
        raise DatasetError(f"{path}: --split and --holdout-every apply to COLMAP and transforms.json captures; "
                           "this data comes with its own split")
    if kind == "npz":
        return load_tiny_npz(path, **kwargs)
    if kind == "blender":
        return load_blender(path, **kwargs)
    if kind == "transforms":
        from nerf.data.nerfstudio_loader import load_transforms

        return load_transforms(path, split_file=split_file, holdout_every=holdout_every, **kwargs)
    from nerf.data.colmap_loader import load_colmap

    return load_colmap(path, split_file=split_file, holdout_every=holdout_every, **kwargs)


def downscale(images: np.ndarray, factor: int, what: str = "images") -> np.ndarray:
    """Area-average ``[..., H, W, C]`` by an integer ``factor`` (H and W must be multiples of it)."""
    if factor == 1:
        return images
    if factor < 1 or int(factor) != factor:
        raise DatasetError(f"{what}: downscale factor must be a positive integer, got {factor}")
    *lead, H, W, C = images.shape
    if H % factor or W % factor:
        raise DatasetError(f"{what}: image size {H}x{W} is not a multiple of the downscale factor {factor}")
    x = images.reshape(*lead, H // factor, factor, W // factor, factor, C)
    return x.mean(axis=(-4, -2), dtype=np.float64).astype(np.float32)


def _to_unit_float(images: np.ndarray, where: str) -> np.ndarray:
    if images.dtype == np.uint8:
        return images.astype(np.float32) / 255.0
    if images.dtype == np.uint16:
        return images.astype(np.float32) / 65535.0
    if not np.issubdtype(images.dtype, np.floating):
        raise DatasetError(f"{where}: images have dtype {images.dtype}, expected uint8 or float in [0, 1]")
    images = images.astype(np.float32)
    if not np.all(np.isfinite(images)) or images.min() < -1e-3 or images.max() > 1 + 1e-3:
        raise DatasetError(f"{where}: float images must be finite and in [0, 1] (found [{np.nanmin(images):.3g}, "
                           f"{np.nanmax(images):.3g}])")
    return np.clip(images, 0.0, 1.0)


def _check_poses(poses, where: str, n: int | None = None) -> np.ndarray:
    poses = np.asarray(poses)
    if poses.ndim != 3 or poses.shape[1:] not in ((4, 4), (3, 4)):
        raise DatasetError(f"{where}: poses must have shape [N, 4, 4] (or [N, 3, 4]), got {list(poses.shape)}")
    if n is not None and poses.shape[0] != n:
        raise DatasetError(f"{where}: {poses.shape[0]} poses for {n} images")
    if not np.all(np.isfinite(poses)):
        raise DatasetError(f"{where}: poses contain NaN or inf")
    if poses.shape[1] == 3:
        poses = np.concatenate([poses, np.broadcast_to([[[0, 0, 0, 1.0]]], (len(poses), 1, 4))], axis=1)
    return poses.astype(np.float32)


def composite(rgba: np.ndarray, background) -> np.ndarray:
    """Straight-alpha RGBA ``[..., 4]`` in [0,1] over a constant background colour → RGB."""
    a = rgba[..., 3:]
    return rgba[..., :3] * a + np.asarray(background, np.float32) * (1.0 - a)


# ---------------------------------------------------------------------------------------------- tiny NeRF .npz


def load_tiny_npz(path: str, n_train: int | None = None, downscale_factor: int = 1, near: float = 2.0,
                  far: float = 6.0, background=(0.0, 0.0, 0.0), **_ignored) -> Dataset:
    """``images`` [N,H,W,3] (float in [0,1] or uint8), ``poses`` [N,4,4] camera-to-world, ``focal`` (pixels).

    As in the Keras example the first ``n_train`` images (default 80 %) train and the rest are held out
    (val = test). The images have no alpha: ``background`` (default black) is only what the model renders where
    it sees nothing.
    """
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in ("images", "poses", "focal") if k not in f.files]
            if missing:
                raise DatasetError(f"{path}: missing array(s) {missing} (has {sorted(f.files)}; a tiny-NeRF .npz "
                                   "holds images, poses and focal)")
            images, poses, focal = f["images"], f["poses"], f["focal"]
    except DatasetError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise DatasetError(f"{path}: not a readable .npz file ({type(e).__name__}: {e})") from None
    if images.ndim != 4 or images.shape[-1] not in (3, 4):
        raise DatasetError(f"{path}: 'images' must have shape [N, H, W, 3], got {list(images.shape)}")
    images = _to_unit_float(images, path)
    if images.shape[-1] == 4:
        images = composite(images, background)
    poses = _check_poses(poses, path, len(images))
    focal = np.asarray(focal, np.float64).reshape(-1)
    if focal.size != 1 or not np.isfinite(focal[0]) or focal[0] <= 0:
        raise DatasetError(f"{path}: 'focal' must be one positive number, got {focal.tolist()}")
    images = downscale(images, downscale_factor, path)
    focal = float(focal[0]) / downscale_factor
    n = len(images)
    if n < 2:
        raise DatasetError(f"{path}: need at least 2 images (train + held out), found {n}")
    n_train = int(round(0.8 * n)) if n_train is None else n_train
    if not 0 < n_train < n:
        raise DatasetError(f"{path}: n_train={n_train} must leave at least one of {n} images held out")
    held = Views(images[n_train:], poses[n_train:])
    _, H, W, _ = images.shape
    return Dataset(Views(images[:n_train], poses[:n_train]), held, held, H, W, focal, near, far,
                   np.asarray(background, np.float32), name=os.path.basename(path), info={"path": path})


# ------------------------------------------------------------------------------------------------ Blender layout


def _read_json_object(path: str, what: str = "'frames'") -> dict:
    try:
        with open(path) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise DatasetError(f"{path}: file not found") from None
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path}: malformed JSON ({e})") from None
    if not isinstance(meta, dict):
        raise DatasetError(f"{path}: expected a JSON object with {what}")
    return meta


def _read_json(path: str) -> dict:
    meta = _read_json_object(path, "'camera_angle_x' and 'frames'")
    if "camera_angle_x" not in meta:
        raise DatasetError(f"{path}: missing 'camera_angle_x'")
    if not isinstance(meta["camera_angle_x"], (int, float)) or not 0 < meta["camera_angle_x"] < np.pi:
        raise DatasetError(f"{path}: 'camera_angle_x' must be an angle in radians in (0, pi), got "
                           f"{meta['camera_angle_x']!r}")
    if not isinstance(meta.get("frames"), list) or not meta["frames"]:
        raise DatasetError(f"{path}: 'frames' must be a non-empty list")
    return meta


def read_image(path: str, where: str, noun: str = "image", channels: str = "rgb", **imread_kwargs) -> np.ndarray:
    """An image file → float32 ``[H, W, 3 or 4]`` in [0, 1] (``channels="any"``: also ``[H, W]`` and ``[H, W, 2]``, as
    stored); a missing one is "``where``: ``noun`` PATH not found"."""
    import imageio.v3 as iio

    if not os.path.isfile(path):
        raise DatasetError(f"{where}: {noun} {path} not found")
    try:
        img = iio.imread(path, **imread_kwargs)
    except Exception as e:
        raise DatasetError(f"{path}: cannot read image ({type(e).__name__}: {e})") from None
    if channels == "any" and (img.ndim == 2 or (img.ndim == 3 and img.shape[-1] in (1, 2, 3, 4))):
        return _to_unit_float(img, path)
    if img.ndim == 2:
        img = img[..., None].repeat(3, -1)
    if img.ndim != 3 or img.shape[-1] not in (3, 4):
        raise DatasetError(f"{path}: expected an RGB or RGBA image, got shape {list(img.shape)}")
    return _to_unit_float(img, path)


def _read_png(path: str, json_path: str) -> np.ndarray:
    img = read_image(path, json_path, "frame image", plugin="pillow")
    if img.shape[-1] == 3:
        img = np.concatenate([img, np.ones_like(img[..., :1])], -1)
    return img


def load_blender_split(root: str, split: str, downscale_factor: int = 1,
                       max_frames: int | None = None):
    """One ``transforms_{split}.json`` → (premultiplied RGBA [N,H,W,4] float32, poses, H, W, focal)."""
    json_path = os.path.join(root, f"transforms_{split}.json")
    meta = _read_json(json_path)
    frames = meta["frames"][:max_frames] if max_frames else meta["frames"]
    rgba, poses, shape0 = [], [], None
    for k, fr in enumerate(frames):
        if not isinstance(fr, dict) or "file_path" not in fr or "transform_matrix" not in fr:
            raise DatasetError(f"{json_path}: frame {k} needs 'file_path' and 'transform_matrix'")
        rel = str(fr["file_path"])
        img_path = os.path.normpath(os.path.join(root, rel))
        if not os.path.splitext(img_path)[1]:
            img_path += ".png"
        img = _read_png(img_path, json_path)
        if shape0 is None:
            shape0 = img.shape
        elif img.shape != shape0:
            raise DatasetError(f"{img_path}: image size {img.shape[1]}x{img.shape[0]} differs from the first frame's "
                               f"{shape0[1]}x{shape0[0]} in {json_path}")
        try:
            m = np.asarray(fr["transform_matrix"], np.float64)
        except (ValueError, TypeError):
            m = np.zeros(0)
        if m.shape not in ((4, 4), (3, 4)):
            raise DatasetError(f"{json_path}: frame {k} ({rel}): 'transform_matrix' must be 4x4, got shape "
                               f"{list(m.shape)}")
        rgba.append(img)
        poses.append(m)
    rgba = np.stack(rgba)
    H0, W0 = rgba.shape[1:3]
    # premultiply, then area-average: compositing is linear, so the result equals the average of the
    # full-resolution composited pixels whatever the background
    premult = np.concatenate([rgba[..., :3] * rgba[..., 3:], rgba[..., 3:]], -1)
    premult = downscale(premult, downscale_factor, json_path)
    focal = focal_from_fov(W0, float(meta["camera_angle_x"])) / downscale_factor
    return premult, _check_poses(np.stack(poses), json_path), H0 // downscale_factor, W0 // downscale_factor, focal


def load_blender(root: str, background=(1.0, 1.0, 1.0), downscale_factor: int = 1, near: float = 2.0,
                 far: float = 6.0, max_frames: int | None = None, **_ignored) -> Dataset:
    """A NeRF-synthetic folder: ``transforms_{train,val,test}.json`` + RGBA PNGs (a missing val split falls back
    to test and vice versa). Images are composited on ``background`` and area-downscaled by ``downscale_factor``."""
    if not os.path.isfile(os.path.join(root, "transforms_train.json")):
        raise DatasetError(f"{root}: no transforms_train.json in this folder (expected the NeRF-synthetic layout "
                           "transforms_{train,val,test}.json)")
    bg = np.broadcast_to(np.asarray(background, np.float32), (3,)).copy()
    splits, geom = {}, None
    for split in ("train", "val", "test"):
        if split != "train" and not os.path.isfile(os.path.join(root, f"transforms_{split}.json")):
            continue
        premult, poses, H, W, focal = load_blender_split(root, split, downscale_factor, max_frames)
        if geom is None:
            geom = (H, W, focal)
        elif (H, W) != geom[:2] or abs(focal - geom[2]) > 1e-6 * geom[2]:
            raise DatasetError(f"{os.path.join(root, f'transforms_{split}.json')}: images {W}x{H} with focal "
                               f"{focal:.3f} differ from the training split's {geom[1]}x{geom[0]}, focal {geom[2]:.3f}")
        a = premult[..., 3:]
        splits[split] = Views(np.clip(premult[..., :3] + bg * (1.0 - a), 0, 1), poses, a[..., 0])
    if "val" not in splits and "test" not in splits:
        raise DatasetError(f"{root}: needs transforms_val.json or transforms_test.json for held-out views")
    splits.setdefault("val", splits.get("test"))
    splits.setdefault("test", splits["val"])
    H, W, focal = geom
    return Dataset(splits["train"], splits["val"], splits["test"], H, W, focal, near, far, bg,
                   name=os.path.basename(os.path.normpath(root)), info={"path": root})
