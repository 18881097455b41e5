"""The in-memory dataset every loader returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class DatasetError(ValueError):
    """A data file or folder is missing or malformed; the message names the file and what is wrong."""


@dataclass
class Views:
    """Images of one split: ``images`` [N,H,W,3] float32 in [0,1] (already composited on the dataset background),
    ``poses`` [N,4,4] float32 camera-to-world (see :mod:`nerf.data.rays`), optional ``alphas`` [N,H,W]."""

    images: np.ndarray
    poses: np.ndarray
    alphas: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.images.shape[0])


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

    def split(self, name: str) -> Views:
        if name not in ("train", "val", "test"):
            raise ValueError(f"unknown split {name!r} (train, val or test)")
        return getattr(self, name)

    def summary(self) -> str:
        return (f"{self.name}: {len(self.train)} train / {len(self.val)} val / {len(self.test)} test views of "
                f"{self.H}x{self.W}, focal {self.focal:.2f} px, near {self.near}, far {self.far}, "
                f"background {np.round(self.background, 3).tolist()}")
