"""The loader of a COLMAP capture: ``ROOT/sparse/0/{cameras,images,points3D}.{bin,txt}`` (or ``ROOT/sparse/``)
and the images in ``ROOT/images/`` (pyramids ``ROOT/images_N/``), as ``colmap mapper`` and nerfstudio's
``ns-process-data`` leave them. The data's own world frame is COLMAP's; the sparse points take part in the scene
normalisation (:mod:`nerf.data.normalise`)."""

from __future__ import annotations

import os

from nerf.data.capture import Frame, assemble
from nerf.data.colmap_model import find_model, read_model
from nerf.data.dataset import Dataset, DatasetError


def load_colmap(root: str, downscale_factor: int = 1, split_file: str | None = None,
                holdout_every: int | None = None, background=(1.0, 1.0, 1.0), images: str = "images",
                **_ignored) -> Dataset:
    model_dir = find_model(root)
    if model_dir is None:
        raise DatasetError(f"{root}: no COLMAP sparse model (sparse/0/cameras.bin or .txt)")
    model = read_model(model_dir)
    images_file = os.path.join(model_dir, f"images.{model.ext}")
    images_dir = os.path.join(root, images)
    if not os.path.isdir(images_dir):
        raise DatasetError(f"{root}: no {images}/ folder next to the sparse model {model_dir}")
    frames = [Frame(im.name, os.path.join(images_dir, im.name), im.c2w(), model.cameras[im.camera_id],
                    f"image {im.image_id} of {images_file}") for im in model.images]
    if not frames:
        raise DatasetError(f"{images_file}: zero registered images")
    return assemble(frames, model.points, images_file, images_dir, os.path.basename(os.path.normpath(root)),
                    downscale_factor, split_file, holdout_every, background,
                    info={"format": f"colmap-{model.ext}", "points3D": int(len(model.points)),
                          "camera_models": sorted(set(model.camera_models.values()))})
