"""Data for the NeRF example: cameras/rays, the built-in synthetic scene, loaders for real data.

Everything returns a :class:`Dataset` (train/val/test :class:`Views` plus the camera intrinsics, shared or per view,
and the world→scene similarity of real captures), so the training script does not care where the images came from.
"""

from nerf.data.rays import get_rays, look_at, project, focal_from_fov
from nerf.data.dataset import Dataset, DatasetError, Views

__all__ = ["Dataset", "DatasetError", "Views", "focal_from_fov", "get_rays", "look_at", "project", "load_dataset"]


def load_dataset(spec: str = "builtin", **kwargs) -> Dataset:
    """``"builtin"`` (generated and cached), a tiny-NeRF ``.npz`` file, or a folder: Blender layout, nerfstudio /
    instant-ngp ``transforms.json`` or a COLMAP sparse model (detected: :func:`nerf.data.loaders.detect_format`)."""
    if spec == "builtin":
        from nerf.data.synthetic import load_builtin

        return load_builtin(**kwargs)
    from nerf.data.loaders import load_path

    return load_path(spec, **kwargs)
