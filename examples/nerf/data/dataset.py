"""The in-memory dataset every loader returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class DatasetError(ValueError):
    """A data file or folder is missing or malformed; the message names the file and what is wrong."""


@dataclass
class Views:
    """Images of one split: ``images`` [N,H,W,3], float32 in [0,1] or uint8 (real captures: 8-bit, the colour is
    ``value / 255``), already composited on the dataset background; ``poses`` [N,4,4] float32 camera-to-world (see
    :mod:`nerf.data.rays`), optional ``alphas`` [N,H,W].

    Real captures also carry ``cameras``, one :class:`nerf.data.cameras.Camera` per view (intrinsics and
    distortion at the dataset's resolution), the images' file ``names`` and optional ``masks`` [N,H,W] bool (False:
    the pixel leaves the loss and the metrics); without ``cameras`` every view is the dataset's pinhole camera
    (``focal``, principal point at the image centre)."""

    images: np.ndarray
    poses: np.ndarray
    alphas: np.ndarray | None = None
    cameras: list | None = None
    names: list | None = None
    masks: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def image(self, k: int) -> np.ndarray:
        """View ``k``'s image as float32 ``[H, W, 3]`` in [0, 1]."""
        return to_float(self.images[k])


def to_float(pixels: np.ndarray) -> np.ndarray:
    """Pixels of :attr:`Views.images` (uint8 or float) → float32 in [0, 1]."""
    if pixels.dtype == np.uint8:
        return pixels.astype(np.float32) * np.float32(1.0 / 255.0)
    return np.asarray(pixels, np.float32)


@dataclass
class Dataset:
    train: Views
    val: Views
    test: Views
    H: int
    W: int
    focal: float
    near: float = 2.0
    far: float = 6.0
    background: np.ndarray = field(default_factory=lambda: np.ones(3, np.float32))
    name: str = ""
    info: dict = field(default_factory=dict)
    # the similarity from the data's own world frame (e.g. COLMAP's) to the frame of ``poses`` (4×4, x' = T x)
    world_to_scene: np.ndarray = field(default_factory=lambda: np.eye(4))

    def split(self, name: str) -> Views:
        if name not in ("train", "val", "test"):
            raise ValueError(f"unknown split {name!r} (train, val or test)")
        return getattr(self, name)

    def rays(self, split: str, index: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Origins and unit directions of one view (``[H, W, 3]``) or of all views of ``split`` (``[N, H, W, 3]``),
        float32, through the undistorted pixel centres of each view's camera."""
        from nerf.data.rays import camera_rays, get_rays

        views = self.split(name=split)
        ks = range(len(views)) if index is None else [index]
        out = [camera_rays(views.cameras[k], views.poses[k]) if views.cameras is not None
               else get_rays(self.H, self.W, self.focal, views.poses[k]) for k in ks]
        if index is not None:
            return out[0]
        if not out:
            return np.zeros((0, self.H, self.W, 3), np.float32), np.zeros((0, self.H, self.W, 3), np.float32)
        return np.stack([o for o, _ in out]), np.stack([d for _, d in out])

    def valid_pixels(self, split: str, index: int) -> np.ndarray | None:
        """``[H, W]`` bool: the pixels of view ``index`` that count in the metrics (a ray, and not masked out), or
        None when all do."""
        views = self.split(name=split)
        valid = None
        if views.cameras is not None:
            from nerf.data.cameras import camera_directions

            d = camera_directions(views.cameras[index])
            if not np.all(np.isfinite(d)):
                valid = np.all(np.isfinite(d), -1)
        if views.masks is not None:
            valid = views.masks[index] if valid is None else valid & views.masks[index]
        return valid

    def summary(self) -> str:
        return (f"{self.name}: {len(self.train)} train / {len(self.val)} val / {len(self.test)} test views of "
                f"{self.H}x{self.W}, focal {self.focal:.2f} px, near {self.near}, far {self.far}, "
                f"background {np.round(self.background, 3).tolist()}")
