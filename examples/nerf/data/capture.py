"""What the loaders of real captures (COLMAP, ``transforms.json``) share: the frames, their images at the chosen
resolution, the held-out split, the scene normalisation and the :class:`~nerf.data.Dataset`.

* Images: 8- or 16-bit PNG or JPEG through imageio, RGBA composited on the background, kept in memory as 8-bit RGB
  (rays are made per training batch from the pixels sampled, :mod:`nerf.data.pixel_rays`); read by a few threads
  with a progress bar. ``downscale_factor`` N reads ``images_N/`` next to
  the images folder when present (nerfstudio's and LLFF's pyramids, sizes ``W/N × H/N`` rounded either way),
  else area-averages the full images (cropped at the right and bottom to a multiple of N; the crop keeps the
  intrinsics). Intrinsics scale by ``1/N``.
* Split: ``split_file``, a JSON object ``{"train": [names], "test": [names]}`` of image names as the capture names
  them (paths relative to the images folder), or every ``holdout_every``-th image in name order to test, starting
  with the first (the LLFF / mip-NeRF 360 convention; default 8). Validation uses the test views.
* Masks (nerfstudio's ``mask_path``): one-channel images of the image's size, zero where the pixel leaves the loss
  and the metrics; downscaled, a pixel stays only where every pixel it averages stays. Pixels of a camera without a
  ray (:mod:`nerf.data.cameras`) leave them too.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from nerf.data.cameras import Camera, valid_fraction
from nerf.data.dataset import Dataset, DatasetError, Views
from nerf.data.loaders import _read_json_object, composite, downscale, read_image
from nerf.data import normalise

DEFAULT_HOLDOUT_EVERY = 8


@dataclass
class Frame:
    """One image of a capture: ``name`` (as the capture names it), its file, camera-to-world ``c2w`` [4,4] in the
    data's world frame (OpenGL camera convention) and its full-resolution :class:`Camera`; ``where`` names the
    file and entry that defined it, for messages; ``size_note`` is added to a message about the image's size."""

    name: str
    path: str
    c2w: np.ndarray
    camera: Camera
    where: str
    size_note: str = ""
    mask_path: str | None = None


def pyramid_path(frame: Frame, images_dir: str, factor: int) -> str | None:
    """``images_N/<name>`` for ``images/<name>`` when that folder exists (``images_dir`` is ``images/``)."""
    if factor == 1:
        return None
    folder = os.path.normpath(images_dir) + f"_{factor}"
    if not os.path.isdir(folder):
        return None
    rel = os.path.relpath(frame.path, images_dir)
    path = os.path.join(folder, rel)
    if not os.path.isfile(path):  # pyramids are often written as PNG whatever the originals were
        stem = os.path.splitext(path)[0]
        path = next((stem + e for e in (".png", ".jpg", ".jpeg", ".JPG", ".PNG") if os.path.isfile(stem + e)), path)
    return path


def load_frame_image(frame: Frame, images_dir: str, factor: int, background) -> tuple[np.ndarray, Camera]:
    """The frame's RGB image at 1/``factor`` resolution and its camera there."""
    cam = frame.camera
    small = pyramid_path(frame, images_dir, factor)
    if small is not None:
        img = read_image(small, f"{frame.where} ({frame.name}, --downscale {factor})")
        h, w = img.shape[:2]
        if abs(w - cam.width / factor) >= 1 or abs(h - cam.height / factor) >= 1:
            raise DatasetError(f"{small}: image size {w}x{h} is not 1/{factor} of {frame.name}'s camera size "
                               f"{cam.width}x{cam.height} ({frame.where})")
        cam = cam.scaled(1.0 / factor, w, h)
    else:
        img = read_image(frame.path, f"{frame.where} ({frame.name})")
        h, w = img.shape[:2]
        if (w, h) != (cam.width, cam.height):
            raise DatasetError(f"{frame.path}: image size {w}x{h} differs from its camera's {cam.width}x{cam.height} "
                               f"({frame.where}){frame.size_note}")
        if factor > 1:
            img = img[:h - h % factor, :w - w % factor]
            if img.shape[-1] == 4:  # premultiply so that the average is the average of composited pixels
                img = np.concatenate([img[..., :3] * img[..., 3:], img[..., 3:]], -1)
                img = downscale(img, factor, frame.path)
                a = img[..., 3:]
                img = np.concatenate([np.where(a > 0, img[..., :3] / np.maximum(a, 1e-12), 0), a], -1)
            else:
                img = downscale(img, factor, frame.path)
            cam = cam.scaled(1.0 / factor, w // factor, h // factor)
    if img.shape[-1] == 4:
        img = composite(img, background)
    return img, cam


def load_frame_mask(frame: Frame, factor: int, shape) -> np.ndarray:
    """The frame's mask (True: the pixel trains and counts) at 1/``factor`` resolution, of image shape ``shape``."""
    m = read_image(frame.mask_path, f"{frame.where} ({frame.name})", "mask", channels="any")
    m = m[..., 0] if m.ndim == 3 else m
    h, w = m.shape
    cam = frame.camera
    if (w, h) != (cam.width, cam.height):
        raise DatasetError(f"{frame.mask_path}: mask size {w}x{h} differs from {frame.name}'s camera size "
                           f"{cam.width}x{cam.height} ({frame.where})")
    keep = m > 0
    if factor > 1:
        keep = keep[:h - h % factor, :w - w % factor]
        keep = keep.reshape(h // factor, factor, w // factor, factor).all(axis=(1, 3))
    if keep.shape != tuple(shape):
        raise DatasetError(f"{frame.mask_path}: mask of {w}x{h} does not match {frame.name}'s image at 1/{factor}")
    return keep


def to_uint8(img: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(img * 255.0), 0, 255).astype(np.uint8)


def split_names(names: list, where: str, split_file: str | None, holdout_every: int | None,
                given: dict | None = None):
    """(train names, test names) of the capture's image ``names``: from ``split_file``, else every
    ``holdout_every``-th, else the capture's own lists ``given`` (``{"train", "test", "where"}``), else every 8th."""
    if split_file is not None or (given is not None and holdout_every is None):
        if split_file is not None:
            spec = _read_json_object(split_file, "'train' and 'test' lists of image names")
        else:
            spec, split_file = given, given["where"]
        if not all(isinstance(spec.get(k), list) for k in ("train", "test")):
            raise DatasetError(f"{split_file}: expected a JSON object {{\"train\": [image names], \"test\": [image "
                               "names]}")
        known = set(names)
        for k in ("train", "test"):
            for n in spec[k]:
                if n not in known:
                    raise DatasetError(f"{split_file}: '{k}' names image {n!r}, which is not an image of {where} "
                                       f"(it has {len(names)}, e.g. {sorted(names)[:3]})")
        train, test = list(spec["train"]), list(spec["test"])
        both = sorted(set(train) & set(test))
        if both:
            raise DatasetError(f"{split_file}: image {both[0]!r} is in both 'train' and 'test'")
        if not train or not test:
            raise DatasetError(f"{split_file}: 'train' and 'test' must each name at least one image")
        return train, test
    every = DEFAULT_HOLDOUT_EVERY if holdout_every is None else int(holdout_every)
    if every < 2:
        raise DatasetError(f"--holdout-every must be at least 2, got {every}")
    ordered = sorted(names)
    test = ordered[::every]
    train = [n for n in ordered if n not in set(test)]
    if not train:
        raise DatasetError(f"{where}: {len(names)} image(s) leave none for training with --holdout-every {every}")
    return train, test


def assemble(frames: list, points: np.ndarray | None, where: str, images_dir: str, name: str,
             downscale_factor: int = 1, split_file: str | None = None, holdout_every: int | None = None,
             background=(1.0, 1.0, 1.0), info: dict | None = None, split: dict | None = None) -> Dataset:
    """The :class:`Dataset` of ``frames`` (``where`` names the file that lists them, ``images_dir`` the folder their
    names are relative to): images at 1/``downscale_factor``, the split (``split``: the capture's own train and test
    lists, see :func:`split_names`), normalised poses and cameras."""
    if not frames:
        raise DatasetError(f"{where}: zero registered images")
    if downscale_factor < 1 or int(downscale_factor) != downscale_factor:
        raise DatasetError(f"--downscale must be a positive integer, got {downscale_factor}")
    by_name = {}
    for fr in frames:
        if fr.name in by_name:
            raise DatasetError(f"{where}: image {fr.name!r} is listed twice ({by_name[fr.name].where}, {fr.where})")
        by_name[fr.name] = fr
    train_names, test_names = split_names(list(by_name), where, split_file, holdout_every, split)
    for fr in frames:  # before reading any image: every listed image exists
        if not os.path.isfile(fr.path):
            raise DatasetError(f"{fr.where} names image {fr.name!r}, but {fr.path} is not on disk")
        if fr.mask_path is not None and not os.path.isfile(fr.mask_path):
            raise DatasetError(f"{fr.where} names mask {fr.mask_path}, which is not on disk")
    for cam in sorted({fr.camera for fr in frames}, key=repr):
        if valid_fraction(cam) == 0:
            user = next(fr for fr in frames if fr.camera == cam)
            raise DatasetError(f"{user.where} ({user.name}): no pixel of its {cam.model} camera {list(cam.params)} "
                               "has a ray (the distortion has no inverse anywhere in the image)")
    bg = np.broadcast_to(np.asarray(background, np.float32), (3,)).copy()
    T = normalise.world_to_scene(np.stack([f.c2w for f in frames]), points)
    factor = int(downscale_factor)
    _, first_cam = load_frame_image(by_name[train_names[0]], images_dir, factor, bg)
    H, W = first_cam.height, first_cam.width

    def load(fr, imgs, masks, k):
        img, cam = load_frame_image(fr, images_dir, factor, bg)
        if img.shape[:2] != (H, W):
            raise DatasetError(f"{fr.path}: image size {img.shape[1]}x{img.shape[0]} differs from "
                               f"{by_name[train_names[0]].path}'s {W}x{H} at 1/{factor} ({fr.where}): the example "
                               "trains on images of one size; resize them or split the capture by camera")
        imgs[k] = to_uint8(img)
        if masks is not None and fr.mask_path is not None:
            masks[k] = load_frame_mask(fr, factor, (H, W))
        return cam

    def views(names, what):
        imgs = np.empty((len(names), H, W, 3), np.uint8)
        with_masks = any(by_name[n].mask_path is not None for n in names)
        masks = np.ones((len(names), H, W), bool) if with_masks else None
        with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as pool:
            jobs = [pool.submit(load, by_name[n], imgs, masks, k) for k, n in enumerate(names)]
            cams = [j.result() for j in tqdm(jobs, desc=f"{what} images", unit="img", leave=False,
                                             disable=len(names) < 16)]
        poses = np.stack([normalise.apply(T, by_name[n].c2w) for n in names]).astype(np.float32)
        return Views(imgs, poses, None, cams, list(names), masks)

    train, test = views(train_names, "training"), views(test_names, "test")
    fx = float(np.mean([c.fx for c in train.cameras]))
    s = float(np.cbrt(np.linalg.det(T[:3, :3])))
    near, far = _near_far(train.poses, normalise.transform_points(T, points) if points is not None and len(points)
                          else None)
    doc = {"path": where, "images": len(frames), "world_to_scene_scale": s, **(info or {})}
    return Dataset(train, test, test, H, W, fx, near, far, bg, name=name, info=doc, world_to_scene=T)


def _near_far(c2w: np.ndarray, points: np.ndarray | None) -> tuple[float, float]:
    """Ray distances (scene units) that hold the sparse points seen in front of the cameras: half the 1st
    percentile of their depths and twice the 99th; without points 0.05 and 1000 (the models clip to their box)."""
    if points is None:
        return 0.05, 1000.0
    depths = []
    for m in c2w:
        z = -(points - m[:3, 3]) @ m[:3, 2]
        depths.append(z[z > 0])
    z = np.concatenate(depths) if depths else np.zeros(0)
    if len(z) == 0:
        return 0.05, 1000.0
    return float(max(0.5 * np.percentile(z, 1), 1e-3)), float(2.0 * np.percentile(z, 99))
