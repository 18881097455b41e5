"""The NeRF example's capture loaders on what users bring: an ns-process-data folder (colmap/sparse/0,
sparse_pc.ply, masks, filename lists, fields the example does not use), fisheye transforms.json (nerfstudio's
OPENCV_FISHEYE and instant-ngp's is_fisheye), and corrupted files, each refused by one DatasetError line naming the
file; plus the per-batch rays of examples/nerf/data/pixel_rays.py."""

import json
import os
import shutil
import struct

import imageio.v3 as iio
import numpy as np
import pytest

from nerf.data import DatasetError, load_dataset
from nerf.data import capture_writers as writers
from nerf.data import unbounded_scene as scene
from nerf.data.dataset import Views
from nerf.data.nerfstudio_loader import UnusedFieldsWarning
from nerf.data.pixel_rays import PixelRays, shuffled

pytestmark = pytest.mark.nerf  # the NeRF example's tests: `pytest tests -m nerf` (README)

FISHEYE = scene.CAMERAS.index(next(c for c in scene.CAMERAS if c[0] == "OPENCV_FISHEYE"))


@pytest.fixture(scope="module")
def capture():
    return scene.render(n_views=8, ss=1, n_points=160)


@pytest.fixture(scope="module")
def fisheye_capture():
    return scene.render(n_views=6, ss=1, n_points=60, cameras=[FISHEYE])


def write_ply(path, points):
    from plyfile import PlyData, PlyElement

    v = np.array([tuple(p) for p in points], dtype=[("x", "f8"), ("y", "f8"), ("z", "f8")])
    PlyData([PlyElement.describe(v, "vertex")]).write(path)


@pytest.fixture(scope="module")
def ns_folder(capture, tmp_path_factory):
    """ns-process-data's layout: images/, colmap/sparse/0/, transforms.json with applied_transform, ply_file_path,
    per-frame mask_path and colmap_im_id, train/val/test_filenames; masks/ zero on the left quarter of frame 1."""
    root = str(tmp_path_factory.mktemp("ns") / "scene")
    writers.write_colmap(root, capture, binary=True)
    os.makedirs(os.path.join(root, "colmap"))
    shutil.move(os.path.join(root, "sparse"), os.path.join(root, "colmap", "sparse"))
    shutil.rmtree(os.path.join(root, "images"))
    path = writers.write_transforms(root, capture)
    doc = json.load(open(path))
    applied = np.vstack([np.array(doc["applied_transform"]), [0, 0, 0, 1.0]])
    pts = capture.points @ scene.GEN_TO_DATA[:3, :3].T + scene.GEN_TO_DATA[:3, 3]
    write_ply(os.path.join(root, "sparse_pc.ply"), pts @ applied[:3, :3].T + applied[:3, 3])
    os.makedirs(os.path.join(root, "masks"))
    for k, fr in enumerate(doc["frames"]):
        m = np.full((48, 64), 255, np.uint8)
        if k == 1:
            m[:, :16] = 0
        name = os.path.basename(fr["file_path"])
        iio.imwrite(os.path.join(root, "masks", name), m)
        fr.update(mask_path=f"masks/{name}", colmap_im_id=k + 1)
    names = [fr["file_path"] for fr in doc["frames"]]
    doc.update(ply_file_path="sparse_pc.ply", train_filenames=names[1:6], val_filenames=names[6:],
               test_filenames=names[:1] + names[6:], orientation_override="none")
    json.dump(doc, open(path, "w"))
    return root


def test_ns_process_data_folder(capture, ns_folder):
    with pytest.warns(UnusedFieldsWarning, match=r"transforms\.json: fields not used by this example: "
                                                 r"orientation_override, frames\[\]\.colmap_im_id$"):
        ds = load_dataset(ns_folder)
    assert ds.train.names == [f"images/frame_{i:03d}.png" for i in range(1, 6)]
    assert ds.test.names == [f"images/frame_{i:03d}.png" for i in (0, 6, 7)]
    assert ds.info["points3D"] == len(capture.points) and ds.info["unused_fields"]
    # the sparse points of the PLY, mapped back through applied_transform, normalise as COLMAP's own model does
    os.rename(os.path.join(ns_folder, "transforms.json"), os.path.join(ns_folder, "t.json"))
    try:
        colmap = load_dataset(ns_folder)  # the colmap/sparse/0 layout on its own
    finally:
        os.rename(os.path.join(ns_folder, "t.json"), os.path.join(ns_folder, "transforms.json"))
    assert colmap.info["format"] == "colmap-bin" and colmap.info["points3D"] == len(capture.points)
    np.testing.assert_allclose(ds.world_to_scene, colmap.world_to_scene, atol=1e-9)
    assert 0.05 < ds.near < 1 < ds.far < 1000  # from the points, not the defaults of a capture without any
    # masks: frame 1's left quarter leaves training; the test views' masks keep every pixel
    assert ds.train.masks.shape == (5, 48, 64) and ds.train.masks[0, :, :16].sum() == 0
    assert ds.train.masks.sum() == 5 * 48 * 64 - 48 * 16
    rays = PixelRays(ds.train, ds.focal)
    idx = np.arange(rays.n)
    o, d, rgb, view = rays.rays(idx)
    assert len(view) == rays.n - 48 * 16 and (view == 0).sum() == 48 * 48
    assert ds.valid_pixels("test", 0) is not None and ds.valid_pixels("test", 0).all()
    # --holdout-every overrides the capture's lists
    assert load_dataset(ns_folder, holdout_every=4).test.names == ["images/frame_000.png", "images/frame_004.png"]


def test_mask_of_the_wrong_size(ns_folder, tmp_path):
    root = str(tmp_path / "scene")
    shutil.copytree(ns_folder, root)
    iio.imwrite(os.path.join(root, "masks", "frame_002.png"), np.zeros((40, 64), np.uint8))
    with pytest.raises(DatasetError, match=r"frame_002\.png: mask size 64x40 differs from .*camera size 64x48"):
        load_dataset(root)


@pytest.mark.parametrize("style", ["nerfstudio", "instant-ngp"])
def test_fisheye_transforms_json(fisheye_capture, tmp_path, style):
    """OPENCV_FISHEYE (k1..k4) / is_fisheye: every pixel's ray is the renderer's ray through pycolmap's fisheye."""
    root = str(tmp_path / style)
    path = writers.write_transforms(root, fisheye_capture, instant_ngp=style == "instant-ngp")
    doc = json.load(open(path))
    assert ("is_fisheye" in doc["frames"][0]) == (style == "instant-ngp") and doc["frames"][0]["k4"] != 0
    ds = load_dataset(root, holdout_every=3)
    assert ds.info["camera_models"] == ["OPENCV_FISHEYE"]
    o, d = ds.rays("train")
    M = ds.world_to_scene @ scene.GEN_TO_DATA
    for k, name in enumerate(ds.train.names):
        i = fisheye_capture.names.index(os.path.splitext(os.path.basename(name))[0])
        _, want = scene.pixel_rays(*scene.CAMERAS[FISHEYE], fisheye_capture.c2w[i])
        want = want @ M[:3, :3].T
        np.testing.assert_allclose(d[k], want / np.linalg.norm(want, axis=-1, keepdims=True), atol=2e-6)
    # the same views read as a plain OPENCV camera (k4 dropped) give other rays: the check can fail
    doc["frames"] = [{k: v for k, v in fr.items() if k not in ("is_fisheye", "k3", "k4")} for fr in doc["frames"]]
    doc["camera_model"] = "OPENCV"
    json.dump(doc, open(path, "w"))
    _, d2 = load_dataset(root, holdout_every=3).rays("train")
    assert np.max(np.abs(d2 - d)) > 1e-2


def test_fisheye_fields_that_contradict_are_refused(fisheye_capture, tmp_path):
    root = str(tmp_path / "ngp")
    path = writers.write_transforms(root, fisheye_capture, instant_ngp=True)
    doc = json.load(open(path))
    doc["frames"][0]["camera_model"] = "OPENCV"
    json.dump(doc, open(path, "w"))
    with pytest.raises(DatasetError, match=r"frame 0 of .*'is_fisheye' is true but camera_model is OPENCV"):
        load_dataset(root)
    doc["frames"][0].update(camera_model="OPENCV", is_fisheye=False, k4=0.01)
    json.dump(doc, open(path, "w"))
    with pytest.raises(DatasetError, match=r"frame 0 of .*k4 = 0\.01 with camera_model OPENCV .* not supported"):
        load_dataset(root)


# ------------------------------------------------------------------------------------------ corrupted inputs


@pytest.fixture(scope="module")
def colmap_txt(capture, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("txt") / "scene")
    writers.write_colmap(root, capture, binary=False)
    return root


def edited(colmap_txt, tmp_path, file, edit):
    root = str(tmp_path / "scene")
    shutil.copytree(colmap_txt, root)
    path = os.path.join(root, "sparse", "0", file)
    lines = open(path).read().split("\n")
    first = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    lines[first] = edit(lines[first])
    open(path, "w").write("\n".join(lines))
    return root


def fields(new):
    def edit(line):
        f = line.split()
        for k, v in new.items():
            f[k] = v
        return " ".join(f)
    return edit


CORRUPT = {
    "zero quaternion": ("images.txt", fields({1: "0", 2: "0", 3: "0", 4: "0"}),
                        r"images\.txt:\d+: image \d+: the quaternion .* must be finite and non-zero"),
    "NaN quaternion": ("images.txt", fields({2: "nan"}), r"images\.txt:\d+: image \d+: the quaternion"),
    "NaN translation": ("images.txt", fields({6: "nan"}), r"images\.txt:\d+: image \d+: the translation .* finite"),
    "inf translation": ("images.txt", fields({7: "inf"}), r"images\.txt:\d+: image \d+: the translation .* finite"),
    "short images line": ("images.txt", lambda ln: " ".join(ln.split()[:9]), r"images\.txt:\d+: expected 'IMAGE_ID"),
    "long images line": ("images.txt", lambda ln: ln + " extra", r"images\.txt:\d+: expected .*got 11"),
    "short cameras line": ("cameras.txt", lambda ln: " ".join(ln.split()[:3]), r"cameras\.txt:\d+: expected"),
    "long cameras line": ("cameras.txt", lambda ln: ln + " 0.5", r"cameras\.txt: camera \d+: .* takes \d+ param"),
    "short points line": ("points3D.txt", lambda ln: " ".join(ln.split()[:6]), r"points3D\.txt:\d+: expected"),
    "odd track": ("points3D.txt", lambda ln: ln + " 7", r"points3D\.txt:\d+: expected .*pairs"),
    "colour above 255": ("points3D.txt", fields({4: "300"}), r"points3D\.txt:\d+: point \d+ has colour .*0\.\.255"),
    "negative colour": ("points3D.txt", fields({5: "-1"}), r"points3D\.txt:\d+: point \d+ has colour"),
    "NaN point": ("points3D.txt", fields({2: "nan"}), r"points3D\.txt:\d+: point \d+ has a non-finite position"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupted_text_model_is_one_line(colmap_txt, tmp_path, case):
    file, edit, message = CORRUPT[case]
    with pytest.raises(DatasetError, match=message) as e:
        load_dataset(edited(colmap_txt, tmp_path, file, edit))
    assert "\n" not in str(e.value)


def test_corrupted_binary_pose_and_points2d_line(capture, colmap_txt, tmp_path):
    root = str(tmp_path / "bin")
    writers.write_colmap(root, capture, binary=True)
    path = os.path.join(root, "sparse", "0", "images.bin")
    data = bytearray(open(path, "rb").read())
    struct.pack_into("<4d", data, 8 + 4, 0.0, 0.0, 0.0, 0.0)  # the first image's quaternion
    open(path, "wb").write(bytes(data))
    with pytest.raises(DatasetError, match=r"images\.bin: image 1: the quaternion"):
        load_dataset(root)
    # a 2-D points line that is not made of (X, Y, POINT3D_ID) triples
    root = str(tmp_path / "txt")
    shutil.copytree(colmap_txt, root)
    path = os.path.join(root, "sparse", "0", "images.txt")
    lines = open(path).read().split("\n")
    first = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    lines[first + 1] = "1.0 2.0"
    open(path, "w").write("\n".join(lines))
    with pytest.raises(DatasetError, match=r"images\.txt:\d+: expected the 2-D points of image \d+ as"):
        load_dataset(root)


# ---------------------------------------------------------------------------------------------- per-batch rays


def test_shuffled_is_a_permutation_and_depends_on_the_seed():
    for n in (1, 2, 7, 1000, 4097):
        p = shuffled(np.arange(n), n, [3, 1])
        assert sorted(p.tolist()) == list(range(n))
    a, b = shuffled(np.arange(1000), 1000, [3, 1]), shuffled(np.arange(1000), 1000, [3, 2])
    assert (a != b).mean() > 0.9 and abs(np.corrcoef(np.arange(1000), a)[0, 1]) < 0.1
    np.testing.assert_array_equal(shuffled(np.arange(200, 300), 1000, [3, 1]), a[200:300])  # any window
    big = shuffled(np.array([0, 10 ** 9, 2 * 10 ** 9 - 1]), 2 * 10 ** 9, 0)
    assert big.min() >= 0 and big.max() < 2 * 10 ** 9 and len(set(big.tolist())) == 3


def test_pixel_rays_are_the_views_rays(capture, colmap_txt):
    """A batch's rays (uint8 images, distorted cameras) equal the full views' rays and colours."""
    ds = load_dataset(colmap_txt, holdout_every=4)
    assert ds.train.images.dtype == np.uint8
    rays = PixelRays(ds.train, ds.focal)
    idx = shuffled(np.arange(500), rays.n, 0)
    o, d, rgb, view = rays.rays(idx)
    O, D = ds.rays("train")
    v, p = np.divmod(idx, ds.H * ds.W)
    r, c = np.divmod(p, ds.W)
    np.testing.assert_allclose(d, D[v, r, c], atol=1e-6)
    np.testing.assert_allclose(o, O[v, r, c], atol=1e-6)
    np.testing.assert_allclose(rgb, ds.train.images[v, r, c] / 255.0, atol=1e-7)
    assert view.tolist() == v.tolist()
    # pixels without a ray leave the batch
    cam = ds.train.cameras[0]
    strong = type(cam)(cam.width, cam.height, "SIMPLE_RADIAL", (20.0, 32.0, 24.0, -0.9))
    views = Views(ds.train.images[:1], ds.train.poses[:1], None, [strong])
    o, d, rgb, view = PixelRays(views).rays(np.arange(ds.H * ds.W))
    assert 0 < len(view) < ds.H * ds.W and np.all(np.isfinite(d))
