"""A reader of COLMAP's sparse model files, binary and text: ``cameras``, ``images`` and ``points3D``
(``.bin`` or ``.txt``), as documented at https://colmap.github.io/format.html and written by COLMAP and pycolmap.

Only what the NeRF loader needs is kept: the cameras, each registered image's pose and camera and name, and the 3-D
points with their colours. Every problem raises :class:`~nerf.data.DatasetError` naming the file and the entry.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

from nerf.data.cameras import Camera, CameraModelError, colmap_camera, model_name, model_names, param_names
from nerf.data.dataset import DatasetError


@dataclass(frozen=True)
class ColmapImage:
    """A registered image: ``qvec`` (w, x, y, z) and ``tvec`` of COLMAP's ``cam_from_world`` (x_cam = R x_world + t,
    OpenCV camera axes), its camera id and file name relative to the images folder."""

    image_id: int
    qvec: np.ndarray
    tvec: np.ndarray
    camera_id: int
    name: str

    def rotation(self) -> np.ndarray:
        w, x, y, z = self.qvec / np.linalg.norm(self.qvec)  # checked finite and non-zero (checked_pose)
        return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                         [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                         [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])

    def c2w(self) -> np.ndarray:
        """Camera-to-world 4×4 in the example's OpenGL camera convention (:mod:`nerf.data.rays`)."""
        R = self.rotation()
        m = np.eye(4)
        m[:3, :3] = R.T @ np.diag([1.0, -1.0, -1.0])  # OpenCV camera axes (y down, z forward) → OpenGL
        m[:3, 3] = -R.T @ self.tvec
        return m


@dataclass
class ColmapModel:
    cameras: dict  # camera id → Camera
    camera_models: dict  # camera id → COLMAP model name
    images: list  # ColmapImage, in image-id order
    points: np.ndarray  # [P, 3] float64
    colors: np.ndarray  # [P, 3] uint8
    path: str
    ext: str


def find_model(root: str) -> str | None:
    """The folder of the sparse model under ``root``: ``root/sparse/0``, ``root/sparse``, ``root/colmap/sparse/0``
    (nerfstudio's ``ns-process-data``) or ``root`` itself."""
    for d in (os.path.join(root, "sparse", "0"), os.path.join(root, "sparse"), os.path.join(root, "colmap", "sparse", "0"),
              root):
        if any(os.path.isfile(os.path.join(d, f"cameras.{e}")) for e in ("bin", "txt")):
            return d
    return None


def read_model(path: str) -> ColmapModel:
    """``path/{cameras,images,points3D}.bin`` (preferred) or ``.txt``; ``points3D`` may be missing."""
    for ext in ("bin", "txt"):
        if os.path.isfile(os.path.join(path, f"cameras.{ext}")):
            break
    else:
        raise DatasetError(f"{path}: no cameras.bin or cameras.txt (a COLMAP sparse model)")
    files = {k: os.path.join(path, f"{k}.{ext}") for k in ("cameras", "images", "points3D")}
    if not os.path.isfile(files["images"]):
        raise DatasetError(f"{files['images']}: file not found (next to {files['cameras']})")
    reader = _Binary if ext == "bin" else _Text
    cameras, models = reader.cameras(files["cameras"])
    images = reader.images(files["images"])
    for im in images:
        if im.camera_id not in cameras:
            raise DatasetError(f"{files['images']}: image {im.image_id} ({im.name}) uses camera {im.camera_id}, "
                               f"which {files['cameras']} does not define")
    if os.path.isfile(files["points3D"]):
        points, colors = reader.points(files["points3D"])
    else:
        points, colors = np.zeros((0, 3)), np.zeros((0, 3), np.uint8)
    return ColmapModel(cameras, models, sorted(images, key=lambda im: im.image_id), points, colors, path, ext)


def checked_pose(path: str, image_id: int, q, t) -> None:
    """A pose entry's quaternion is finite and non-zero and its translation finite (else the one-line error)."""
    if not np.all(np.isfinite(q)) or np.linalg.norm(q) < 1e-12:
        raise DatasetError(f"{path}: image {image_id}: the quaternion (QW QX QY QZ) must be finite and non-zero, "
                           f"got {np.asarray(q).tolist()}")
    if not np.all(np.isfinite(t)):
        raise DatasetError(f"{path}: image {image_id}: the translation (TX TY TZ) must be finite, got "
                           f"{np.asarray(t).tolist()}")


def _camera(path, camera_id, model, width, height, params) -> Camera:
    try:
        return colmap_camera(model, width, height, params)
    except CameraModelError as e:
        raise DatasetError(f"{path}: camera {camera_id}: {e}") from None


class _Binary:
    @staticmethod
    def _open(path):
        with open(path, "rb") as f:
            return f.read()

    @staticmethod
    def cameras(path):
        buf, cams, models = _Buffer(_Binary._open(path), path), {}, {}
        for _ in range(buf.unpack("<Q")[0]):
            camera_id, model_id, width, height = buf.unpack("<iiQQ")
            name = model_name(model_id)
            if name is None:
                raise DatasetError(f"{path}: camera {camera_id}: unknown camera model id {model_id} (COLMAP's "
                                   f"models: {', '.join(model_names())})")
            params = buf.unpack(f"<{len(param_names(name))}d")
            cams[camera_id] = _camera(path, camera_id, name, width, height, params)
            models[camera_id] = name
        return cams, models

    @staticmethod
    def images(path):
        buf, images = _Buffer(_Binary._open(path), path), []
        for _ in range(buf.unpack("<Q")[0]):
            image_id, qw, qx, qy, qz, tx, ty, tz, camera_id = buf.unpack("<idddddddi")
            name = buf.cstring()
            checked_pose(path, image_id, (qw, qx, qy, qz), (tx, ty, tz))
            n2d = buf.unpack("<Q")[0]
            buf.skip(24 * n2d)  # x, y (double), point3D id (int64) per 2-D point
            images.append(ColmapImage(image_id, np.array([qw, qx, qy, qz]), np.array([tx, ty, tz]), camera_id, name))
        return images

    @staticmethod
    def points(path):
        buf, xyz, rgb = _Buffer(_Binary._open(path), path), [], []
        for _ in range(buf.unpack("<Q")[0]):
            pid, x, y, z, r, g, b, _err, track = buf.unpack("<QdddBBBdQ")
            buf.skip(8 * track)  # image id, point2D index (int32 each) per observation
            if not np.all(np.isfinite((x, y, z))):
                raise DatasetError(f"{path}: point {pid} has a non-finite position {[x, y, z]}")
            xyz.append((x, y, z))
            rgb.append((r, g, b))
        return np.array(xyz, np.float64).reshape(-1, 3), np.array(rgb, np.uint8).reshape(-1, 3)


class _Buffer:
    def __init__(self, data: bytes, path: str):
        self.data, self.pos, self.path = data, 0, path

    def unpack(self, fmt):
        n = struct.calcsize(fmt)
        if self.pos + n > len(self.data):
            raise DatasetError(f"{self.path}: truncated at byte {self.pos} (not a complete COLMAP binary file)")
        out = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += n
        return out

    def skip(self, n):
        if self.pos + n > len(self.data):
            raise DatasetError(f"{self.path}: truncated at byte {self.pos} (not a complete COLMAP binary file)")
        self.pos += n

    def cstring(self):
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise DatasetError(f"{self.path}: truncated image name at byte {self.pos}")
        s = self.data[self.pos:end].decode("utf-8", errors="replace")
        self.pos = end + 1
        return s


class _Text:
    @staticmethod
    def _lines(path):
        """(line number, text) of the lines that are not comments; blank lines are kept (images.txt has them)."""
        with open(path, encoding="utf-8") as f:
            return [(k + 1, ln.rstrip("\n")) for k, ln in enumerate(f) if not ln.startswith("#")]

    @staticmethod
    def cameras(path):
        cams, models = {}, {}
        for k, ln in _Text._lines(path):
            f = ln.split()
            if not f:
                continue
            try:
                if len(f) < 4:
                    raise IndexError
                camera_id, model, width, height = int(f[0]), f[1], int(f[2]), int(f[3])
                params = [float(v) for v in f[4:]]
            except (ValueError, IndexError):
                raise DatasetError(f"{path}:{k}: expected 'CAMERA_ID MODEL WIDTH HEIGHT PARAMS...', "
                                   f"got {ln!r}") from None
            cams[camera_id] = _camera(path, camera_id, model, width, height, params)
            models[camera_id] = model
        return cams, models

    @staticmethod
    def images(path):
        lines = [(k, ln) for k, ln in _Text._lines(path)]
        while lines and not lines[-1][1].strip():
            lines.pop()
        images, i = [], 0
        while i < len(lines):
            k, ln = lines[i]
            if not ln.strip():  # stray blank line between entries
                i += 1
                continue
            f = ln.split()
            try:
                if len(f) != 10:  # COLMAP's image names hold no spaces
                    raise ValueError
                image_id = int(f[0])
                q = np.array([float(v) for v in f[1:5]])
                t = np.array([float(v) for v in f[5:8]])
                camera_id, name = int(f[8]), f[9]
            except ValueError:
                raise DatasetError(f"{path}:{k}: expected 'IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME' (10 "
                                   f"fields), got {len(f)}: {ln[:120]!r}") from None
            checked_pose(f"{path}:{k}", image_id, q, t)
            if i + 1 < len(lines) and len(lines[i + 1][1].split()) % 3:
                k2, ln2 = lines[i + 1]
                raise DatasetError(f"{path}:{k2}: expected the 2-D points of image {image_id} as 'X Y POINT3D_ID' "
                                   f"triples, got {len(ln2.split())} fields")
            images.append(ColmapImage(image_id, q, t, camera_id, name))
            i += 2  # the next line holds the image's 2-D points (possibly empty)
        return images

    @staticmethod
    def points(path):
        xyz, rgb = [], []
        for k, ln in _Text._lines(path):
            f = ln.split()
            if not f:
                continue
            try:
                if len(f) < 8 or len(f) % 2:  # the track is (IMAGE_ID, POINT2D_IDX) pairs
                    raise ValueError
                p = [float(v) for v in f[1:4]]
                c = [int(v) for v in f[4:7]]
                float(f[7])
            except ValueError:
                raise DatasetError(f"{path}:{k}: expected 'POINT3D_ID X Y Z R G B ERROR' and (IMAGE_ID, "
                                   f"POINT2D_IDX) pairs, got {len(f)} fields: {ln[:120]!r}") from None
            if not np.all(np.isfinite(p)):
                raise DatasetError(f"{path}:{k}: point {f[0]} has a non-finite position {p}")
            if not all(0 <= v <= 255 for v in c):
                raise DatasetError(f"{path}:{k}: point {f[0]} has colour {c}, outside 0..255")
            xyz.append(p)
            rgb.append(c)
        return np.array(xyz, np.float64).reshape(-1, 3), np.array(rgb, np.uint8).reshape(-1, 3)
