"""Loaders of the NeRF example (examples/nerf/data/loaders.py) on files the tests write."""

import json
import math
import os

import imageio.v3 as iio
import numpy as np
import pytest

from nerf.data import DatasetError, load_dataset
from nerf.data.loaders import downscale, load_blender, load_tiny_npz
from nerf.data.rays import spherical_pose

pytestmark = pytest.mark.nerf  # the NeRF example's tests: `pytest tests -m nerf` (README)

RNG = np.random.default_rng(0)


def poses(n):
    return np.stack([spherical_pose(4.0, 0.7 * k, 0.4) for k in range(n)]).astype(np.float32)


# ------------------------------------------------------------------------------------------------- tiny npz


def test_tiny_npz_float_and_uint8(tmp_path):
    imgs = RNG.uniform(0, 1, (10, 8, 12, 3)).astype(np.float32)
    p = tmp_path / "tiny.npz"
    np.savez(p, images=imgs, poses=poses(10), focal=np.float64(13.5))
    ds = load_dataset(str(p))
    assert (ds.H, ds.W, ds.focal) == (8, 12, 13.5)
    assert len(ds.train) == 8 and len(ds.test) == 2 and ds.val is ds.test  # Keras-style 80 % split
    np.testing.assert_array_equal(ds.train.images, imgs[:8])
    np.testing.assert_array_equal(ds.test.poses, poses(10)[8:])
    np.testing.assert_array_equal(ds.background, [0, 0, 0])

    u8 = (imgs * 255).round().astype(np.uint8)
    np.savez(p, images=u8, poses=poses(10)[:, :3, :], focal=np.array([13.5]))  # [N,3,4] poses accepted
    ds = load_tiny_npz(str(p), n_train=5, downscale_factor=2)
    assert (ds.H, ds.W, ds.focal, len(ds.train)) == (4, 6, 6.75, 5)
    np.testing.assert_allclose(ds.train.images[0, 0, 0], (u8[0, :2, :2] / 255.0).mean(axis=(0, 1)), atol=1e-6)
    np.testing.assert_array_equal(ds.train.poses[:, 3], np.tile([0, 0, 0, 1], (5, 1)))


@pytest.mark.parametrize(
    "arrays, match",
    [
        (dict(images=np.zeros((3, 4, 4, 3)), poses=np.zeros((3, 4, 4))), r"missing array\(s\) \['focal'\]"),
        (dict(images=np.zeros((3, 4, 4)), poses=np.zeros((3, 4, 4)), focal=1.0), r"'images' must have shape"),
        (dict(images=np.zeros((3, 4, 4, 3)), poses=np.zeros((2, 4, 4)), focal=1.0), r"2 poses for 3 images"),
        (dict(images=np.zeros((3, 4, 4, 3)), poses=np.zeros((3, 4)), focal=1.0), r"poses must have shape"),
        (dict(images=np.full((3, 4, 4, 3), 7.0), poses=np.zeros((3, 4, 4)), focal=1.0), r"in \[0, 1\]"),
        (dict(images=np.zeros((3, 4, 4, 3)), poses=np.zeros((3, 4, 4)), focal=-2.0), r"'focal' must be one positive"),
        (dict(images=np.zeros((3, 5, 4, 3)), poses=np.zeros((3, 4, 4)), focal=1.0), r"not a multiple of .* 2"),
    ],
)
def test_tiny_npz_errors(tmp_path, arrays, match):
    p = tmp_path / "bad.npz"
    np.savez(p, **arrays)
    with pytest.raises(DatasetError, match=match) as e:
        load_tiny_npz(str(p), downscale_factor=2 if "not a multiple" in match else 1)
    assert str(p) in str(e.value)


def test_tiny_npz_not_a_zip_and_missing_path(tmp_path):
    p = tmp_path / "junk.npz"
    p.write_bytes(b"this is not a zip file")
    with pytest.raises(DatasetError, match=r"junk.npz: not a readable .npz"):
        load_dataset(str(p))
    with pytest.raises(DatasetError, match=r"nope.npz: no such file"):
        load_dataset(str(tmp_path / "nope.npz"))
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(DatasetError, match=r"not a .npz file or a folder"):
        load_dataset(str(tmp_path / "x.txt"))
    assert issubclass(DatasetError, ValueError)


# ------------------------------------------------------------------------------------------- Blender layout


def write_blender(root, sizes=None, n=(3, 1, 2), angle=0.69111, H=8, W=12, ext=False):
    """A NeRF-synthetic folder with random RGBA PNGs; returns {split: rgba uint8 [N,H,W,4]}."""
    os.makedirs(root, exist_ok=True)
    out = {}
    for split, count in zip(("train", "val", "test"), n):
        if count == 0:
            continue
        os.makedirs(os.path.join(root, split), exist_ok=True)
        frames, imgs = [], []
        for k in range(count):
            h, w = (sizes or {}).get((split, k), (H, W))
            rgba = RNG.integers(0, 256, (h, w, 4), dtype=np.uint8)
            rgba[0, 0, 3] = 0  # one fully transparent and one opaque pixel for the compositing check
            rgba[0, 1, 3] = 255
            iio.imwrite(os.path.join(root, split, f"r_{k}.png"), rgba)
            imgs.append(rgba)
            frames.append({"file_path": f"./{split}/r_{k}" + (".png" if ext else ""), "rotation": 0.1,
                           "transform_matrix": spherical_pose(4.0, k, 0.5).tolist()})
        with open(os.path.join(root, f"transforms_{split}.json"), "w") as f:
            json.dump({"camera_angle_x": angle, "frames": frames}, f)
        out[split] = np.stack(imgs) if len({i.shape for i in imgs}) == 1 else imgs
    return out


def test_blender_load_composite_focal(tmp_path):
    root = str(tmp_path / "lego")
    raw = write_blender(root)
    ds = load_dataset(root, background=(0.0, 1.0, 0.0))
    assert (len(ds.train), len(ds.val), len(ds.test)) == (3, 1, 2)
    assert (ds.H, ds.W) == (8, 12)
    assert ds.focal == pytest.approx(0.5 * 12 / math.tan(0.5 * 0.69111))
    rgba = raw["train"].astype(np.float64) / 255
    expected = rgba[..., :3] * rgba[..., 3:] + np.array([0, 1, 0]) * (1 - rgba[..., 3:])
    np.testing.assert_allclose(ds.train.images, expected, atol=1e-6)
    np.testing.assert_array_equal(ds.train.images[:, 0, 0], np.tile([0, 1, 0], (3, 1)))  # transparent → background
    np.testing.assert_allclose(ds.train.images[:, 0, 1], rgba[:, 0, 1, :3], atol=1e-6)  # opaque → own colour
    np.testing.assert_allclose(ds.train.alphas, rgba[..., 3], atol=1e-6)
    np.testing.assert_allclose(ds.test.poses[1], spherical_pose(4.0, 1, 0.5), atol=1e-6)
    # file_path with an extension works too
    root2 = str(tmp_path / "ext")
    write_blender(root2, ext=True)
    assert len(load_blender(root2).train) == 3


def test_blender_downscale_is_area_average_of_composited(tmp_path):
    root = str(tmp_path / "s")
    raw = write_blender(root)
    full = load_blender(root, background=(1, 1, 1))
    half = load_blender(root, background=(1, 1, 1), downscale_factor=2)
    assert (half.H, half.W) == (4, 6) and half.focal == pytest.approx(full.focal / 2)
    np.testing.assert_allclose(half.train.images, full.train.images.reshape(3, 4, 2, 6, 2, 3).mean((2, 4)), atol=1e-6)
    np.testing.assert_allclose(downscale(np.arange(16.0).reshape(4, 4, 1), 2)[..., 0], [[2.5, 4.5], [10.5, 12.5]])
    del raw


def test_blender_missing_val_falls_back_to_test(tmp_path):
    root = str(tmp_path / "s")
    write_blender(root, n=(2, 0, 1))
    ds = load_blender(root)
    assert len(ds.val) == 1 and ds.val is ds.test


def test_blender_errors(tmp_path):
    # no transforms_train.json
    os.makedirs(tmp_path / "empty")
    with pytest.raises(DatasetError, match=r"empty: no known data layout .*transforms_train.json"):
        load_dataset(str(tmp_path / "empty"))
    # malformed json
    root = str(tmp_path / "a")
    write_blender(root)
    with open(os.path.join(root, "transforms_val.json"), "w") as f:
        f.write('{"camera_angle_x": 0.7, "frames": [')
    with pytest.raises(DatasetError, match=r"transforms_val.json: malformed JSON"):
        load_dataset(root)
    # missing camera_angle_x / bad frames / bad matrix
    for meta, match in [
        ({"frames": [{}]}, r"missing 'camera_angle_x'"),
        ({"camera_angle_x": "wide", "frames": [{}]}, r"'camera_angle_x' must be an angle"),
        ({"camera_angle_x": 0.7, "frames": []}, r"'frames' must be a non-empty list"),
        ({"camera_angle_x": 0.7, "frames": [{"file_path": "./val/r_0"}]}, r"frame 0 needs 'file_path' and"),
        ({"camera_angle_x": 0.7, "frames": [{"file_path": "./val/r_0", "transform_matrix": [[1, 0], [0, 1]]}]},
         r"'transform_matrix' must be 4x4"),
        ({"camera_angle_x": 0.7, "frames": [{"file_path": "./val/r_9", "transform_matrix": np.eye(4).tolist()}]},
         r"transforms_val.json: frame image .*r_9.png not found"),
    ]:
        with open(os.path.join(root, "transforms_val.json"), "w") as f:
            json.dump(meta, f)
        with pytest.raises(DatasetError, match=match):
            load_dataset(root)
    # images of inconsistent size within a split
    root = str(tmp_path / "b")
    write_blender(root, sizes={("train", 2): (8, 10)})
    with pytest.raises(DatasetError, match=r"r_2.png: image size 10x8 differs from the first frame's 12x8"):
        load_dataset(root)
    # a split with another size than the training split
    root = str(tmp_path / "c")
    write_blender(root, sizes={("test", 0): (4, 6), ("test", 1): (4, 6)})
    with pytest.raises(DatasetError, match=r"transforms_test.json: images 6x4 .* differ from the training split"):
        load_dataset(root)
    # a file that is not an image
    root = str(tmp_path / "d")
    write_blender(root)
    (tmp_path / "d" / "train" / "r_1.png").write_bytes(b"not a png")
    with pytest.raises(DatasetError, match=r"r_1.png: cannot read image"):
        load_dataset(root)
    # downscale factor that does not divide the size
    root = str(tmp_path / "e")
    write_blender(root)
    with pytest.raises(DatasetError, match=r"not a multiple of the downscale factor 3"):
        load_blender(root, downscale_factor=3)
