"""Writers of a rendered :class:`~nerf.data.unbounded_scene.Capture` in the formats of the reference tools: a COLMAP
sparse model through pycolmap's own ``Reconstruction.write_binary``/``write_text``, and nerfstudio's /
instant-ngp's ``transforms.json`` (plain JSON, their field names), with the images as 8- or 16-bit PNG or JPEG.

Poses and points are written in the capture's data world (``GEN_TO_DATA`` applied), as a user's capture has them.
"""

from __future__ import annotations

import json
import os
import struct
import zlib

import numpy as np

from nerf.data.cameras import param_names
from nerf.data.unbounded_scene import GEN_TO_DATA, Capture

# nerfstudio's ns-process-data writes its poses in this frame (COLMAP's axes permuted) and records it
NERFSTUDIO_APPLIED_TRANSFORM = np.array([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, -1.0, 0.0]])


def data_c2w(capture: Capture) -> np.ndarray:
    """The capture's camera-to-world poses in its data world (unit rotation axes, OpenGL convention)."""
    G = GEN_TO_DATA
    s = np.cbrt(np.linalg.det(G[:3, :3]))
    out = np.array(capture.c2w, np.float64)
    out[:, :3, :3] = (G[:3, :3] / s) @ out[:, :3, :3]
    out[:, :3, 3] = out[:, :3, 3] @ G[:3, :3].T + G[:3, 3]
    return out


def write_png16(path: str, img: np.ndarray) -> None:
    """A 16-bit RGB PNG (Pillow, imageio's PNG writer here, writes 8 bits per channel only)."""
    img = np.asarray(img, np.uint16)
    H, W, _ = img.shape
    raw = b"".join(b"\0" + img[r].astype(">u2").tobytes() for r in range(H))

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 16, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def write_images(folder: str, capture: Capture, ext: str = "png", bits: int = 8, pyramid: tuple = ()) -> list:
    """The images as ``folder/<name>.<ext>`` (and area-averaged ``folder_N/`` for N in ``pyramid``) → file names."""
    import imageio.v3 as iio

    os.makedirs(folder, exist_ok=True)
    names = [f"{n}.{ext}" for n in capture.names]
    for name, img in zip(names, capture.images):
        path = os.path.join(folder, name)
        if bits == 16:
            write_png16(path, img.astype(np.uint16) * 257)
        else:
            iio.imwrite(path, img, quality=95) if ext == "jpg" else iio.imwrite(path, img)
        for n in pyramid:
            os.makedirs(f"{os.path.normpath(folder)}_{n}", exist_ok=True)
            H, W, _ = img.shape
            small = img.reshape(H // n, n, W // n, n, 3).mean(axis=(1, 3)).round().astype(np.uint8)
            iio.imwrite(os.path.join(f"{os.path.normpath(folder)}_{n}", name), small)
    return names


def write_colmap(root: str, capture: Capture, binary: bool = True, ext: str = "png", pyramid: tuple = ()) -> str:
    """``root/images/`` and ``root/sparse/0/{cameras,images,points3D}.{bin|txt}`` written by pycolmap → the model
    folder. One COLMAP camera per entry of ``CAMERAS`` used by the capture, ids from 1."""
    import pycolmap

    names = write_images(os.path.join(root, "images"), capture, ext, pyramid=pyramid)
    rec = pycolmap.Reconstruction()
    for k in sorted(set(capture.camera_index.tolist())):
        cam = capture.camera(k)
        rec.add_camera_with_trivial_rig(pycolmap.Camera(camera_id=k + 1, model=cam.model, width=cam.width,
                                                        height=cam.height, params=list(cam.params)))
    for i, (name, c2w) in enumerate(zip(names, data_c2w(capture))):
        R_cv = c2w[:3, :3] @ np.diag([1.0, -1.0, -1.0])  # OpenGL → OpenCV camera axes
        cam_from_world = pycolmap.Rigid3d(pycolmap.Rotation3d(R_cv.T), -R_cv.T @ c2w[:3, 3])
        image = pycolmap.Image(name=name, camera_id=int(capture.camera_index[i]) + 1, image_id=i + 1)
        rec.add_image_with_trivial_frame(image, cam_from_world)
    pts = capture.points @ GEN_TO_DATA[:3, :3].T + GEN_TO_DATA[:3, 3]
    for p, c in zip(pts, capture.colors):
        rec.add_point3D(p, pycolmap.Track(), c)
    model_dir = os.path.join(root, "sparse", "0")
    os.makedirs(model_dir, exist_ok=True)
    (rec.write_binary if binary else rec.write_text)(model_dir)
    return model_dir


def write_transforms(root: str, capture: Capture, views=None, shared: bool = False, bits: int = 8,
                     instant_ngp: bool = False) -> str:
    """``root/images/`` and ``root/transforms.json`` → its path.

    nerfstudio style (default): per-frame ``fl_x, fl_y, cx, cy, w, h, k1, k2, p1, p2``, ``camera_model`` OPENCV,
    poses in the frame of :data:`NERFSTUDIO_APPLIED_TRANSFORM`, recorded as ``applied_transform``. ``shared``:
    the intrinsics once at the top level (``views`` must then be of one camera). ``instant_ngp``: instant-ngp's
    fields (``camera_angle_x``, ``aabb_scale``, no ``applied_transform``: poses in the data world)."""
    views = list(range(len(capture.names))) if views is None else list(views)
    sub = Capture(capture.images[views], [capture.names[i] for i in views], capture.camera_index[views],
                  capture.c2w[views], capture.points, capture.colors, capture.scale, capture.size)
    names = write_images(os.path.join(root, "images"), sub, "png", bits)
    applied = np.eye(4) if instant_ngp else np.vstack([NERFSTUDIO_APPLIED_TRANSFORM, [0, 0, 0, 1.0]])

    def intrinsics(k):
        cam = sub.camera(k)
        p = dict(zip(param_names(cam.model), cam.params))
        out = dict(fl_x=cam.fx, fl_y=cam.fy, cx=cam.cx, cy=cam.cy, w=cam.width, h=cam.height,
                   k1=p.get("k1", p.get("k", 0.0)), k2=p.get("k2", 0.0))
        if cam.model == "OPENCV_FISHEYE":
            out.update(k3=p["k3"], k4=p["k4"], **({"is_fisheye": True} if instant_ngp else {}))
        else:
            out.update(p1=p.get("p1", 0.0), p2=p.get("p2", 0.0))
        return out

    frames = []
    for name, k, c2w in zip(names, sub.camera_index, data_c2w(sub)):
        fr = {"file_path": f"images/{name}", "transform_matrix": (applied @ c2w).tolist()}
        if not shared:
            fr.update(intrinsics(int(k)))
        frames.append(fr)
    fisheye = {sub.camera(int(k)).model == "OPENCV_FISHEYE" for k in sub.camera_index}
    if len(fisheye) > 1:
        raise ValueError("a transforms.json holds one camera model: fisheye and other views cannot be mixed")
    doc = {"frames": frames} if instant_ngp else {
        "camera_model": "OPENCV_FISHEYE" if fisheye.pop() else "OPENCV", "frames": frames}
    if shared:
        ks = set(sub.camera_index.tolist())
        if len(ks) != 1:
            raise ValueError(f"shared intrinsics need views of one camera, got cameras {sorted(ks)}")
        doc.update(intrinsics(ks.pop()))
    if instant_ngp:
        doc["camera_angle_x"] = float(2 * np.arctan(0.5 * doc.get("w", 64) / doc.get("fl_x", 50.0)))
        doc["aabb_scale"] = 16
    else:
        doc["applied_transform"] = NERFSTUDIO_APPLIED_TRANSFORM.tolist()
    path = os.path.join(root, "transforms.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    return path
