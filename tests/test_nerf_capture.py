"""The NeRF example's loaders of real captures (colmap_model.py, colmap_loader.py, nerfstudio_loader.py, capture.py and
normalise.py in examples/nerf/data/) on a capture of the unbounded test scene (nerf.data.unbounded_scene: 16 views
of 64x48, five COLMAP camera models) written by the formats' own writers: pycolmap for COLMAP's .bin and .txt, JSON for
nerfstudio's and instant-ngp's transforms.json. The capture is rendered once per pytest run."""

import json
import os
import shutil
import struct
import subprocess
import sys

import imageio.v3 as iio
import numpy as np
import pycolmap
import pytest

from nerf.data import DatasetError, load_dataset
from nerf.data import capture_writers as writers
from nerf.data import unbounded_scene as scene
from nerf.data.cameras import Camera, model_name, param_names
from nerf.data.colmap_model import read_model
from nerf.data.loaders import detect_format
from support.paths import EXAMPLES

pytestmark = pytest.mark.nerf  # the NeRF example's tests: `pytest tests -m nerf` (README)


@pytest.fixture(scope="session")
def capture():
    return scene.render()


@pytest.fixture(scope="session")
def folders(capture, tmp_path_factory):
    """The capture as: COLMAP binary (PNG, with an images_2/ pyramid), COLMAP text (JPEG), nerfstudio
    transforms.json (per-frame intrinsics, 16-bit PNG), instant-ngp transforms.json (the PINHOLE camera's views,
    shared intrinsics, aabb_scale)."""
    root = tmp_path_factory.mktemp("captures")
    out = {k: str(root / k) for k in ("colmap-bin", "colmap-txt", "nerfstudio", "instant-ngp")}
    writers.write_colmap(out["colmap-bin"], capture, binary=True, ext="png", pyramid=(2,))
    writers.write_colmap(out["colmap-txt"], capture, binary=False, ext="jpg")
    writers.write_transforms(out["nerfstudio"], capture, bits=16)
    pinhole = [i for i, k in enumerate(capture.camera_index) if scene.CAMERAS[k][0] == "PINHOLE"]
    writers.write_transforms(out["instant-ngp"], capture, views=pinhole, shared=True, instant_ngp=True)
    return out


@pytest.fixture(scope="session")
def loaded(folders):
    return {k: load_dataset(v) for k, v in folders.items()}


def copy_of(folders, kind, tmp_path):
    dst = str(tmp_path / kind)
    shutil.copytree(folders[kind], dst)
    return dst


# ------------------------------------------------------------------------------------------- the COLMAP reader


@pytest.mark.parametrize("kind", ["colmap-bin", "colmap-txt"])
def test_colmap_reader_matches_pycolmap(folders, kind):
    path = os.path.join(folders[kind], "sparse", "0")
    mine, ref = read_model(path), pycolmap.Reconstruction(path)
    assert sorted(mine.cameras) == sorted(ref.cameras) and len(mine.cameras) == 5
    for cid, cam in ref.cameras.items():
        m = mine.cameras[cid]
        assert mine.camera_models[cid] == cam.model.name and (m.width, m.height) == (cam.width, cam.height)
        assert (m.fx, m.fy, m.cx, m.cy) == (cam.focal_length_x, cam.focal_length_y, cam.principal_point_x,
                                            cam.principal_point_y)
    assert [im.image_id for im in mine.images] == sorted(ref.images) and len(mine.images) == 16
    for im in mine.images:
        r = ref.images[im.image_id]
        assert (im.name, im.camera_id) == (r.name, r.camera_id)
        np.testing.assert_allclose(im.rotation(), r.cam_from_world().rotation.matrix(), atol=1e-12)
        np.testing.assert_allclose(im.tvec, r.cam_from_world().translation, atol=1e-12)
    ids = sorted(ref.points3D)
    np.testing.assert_allclose(mine.points, [ref.points3D[i].xyz for i in ids], atol=1e-12)
    np.testing.assert_array_equal(mine.colors, [ref.points3D[i].color for i in ids])


def test_formats_are_detected(folders, tmp_path):
    assert [detect_format(folders[k]) for k in folders] == ["colmap", "colmap", "transforms", "transforms"]
    # a model in ROOT/sparse/ (no 0/) is found too
    root = copy_of(folders, "colmap-txt", tmp_path)
    for f in os.listdir(os.path.join(root, "sparse", "0")):
        shutil.move(os.path.join(root, "sparse", "0", f), os.path.join(root, "sparse", f))
    assert detect_format(root) == "colmap" and len(load_dataset(root).train) == 14


# ----------------------------------------------------------------------------------- rays and images, per format


def renderer_rays(capture, name, ds):
    """The generator's own rays of view ``name`` (pycolmap's unprojection, generator world) taken to the dataset's
    scene frame: through GEN_TO_DATA, then the dataset's world_to_scene."""
    i = capture.names.index(os.path.splitext(os.path.basename(name))[0])
    o, d = scene.pixel_rays(*scene.CAMERAS[capture.camera_index[i]], capture.c2w[i])
    M = ds.world_to_scene @ scene.GEN_TO_DATA
    d = d @ M[:3, :3].T
    return o @ M[:3, :3].T + M[:3, 3], d / np.linalg.norm(d, axis=-1, keepdims=True), i


@pytest.mark.parametrize("kind", ["colmap-bin", "colmap-txt", "nerfstudio", "instant-ngp"])
def test_loaded_rays_are_the_renderers_rays(capture, loaded, kind):
    """Same pixel, same ray (after normalisation), for every view of both splits and so every camera model."""
    ds = loaded[kind]
    models = set()
    for split in ("train", "test"):
        views = ds.split(split)
        o, d = ds.rays(split)
        for k, name in enumerate(views.names):
            want_o, want_d, i = renderer_rays(capture, name, ds)
            np.testing.assert_allclose(o[k], want_o, atol=2e-6, err_msg=f"{kind} {name}")
            np.testing.assert_allclose(d[k], want_d, atol=2e-6, err_msg=f"{kind} {name}")
            models.add(scene.CAMERAS[capture.camera_index[i]][0])
            # and the image is that view's: exact for PNG (16 bits kept at 8-bit precision), JPEG within its loss
            err = np.abs(views.image(k) - capture.images[i] / 255.0)
            if kind == "colmap-txt":
                assert err.mean() < 0.02
            else:
                assert err.max() <= (1.0 / 255 if kind == "nerfstudio" else 1e-6)
    if kind == "instant-ngp":
        assert models == {"PINHOLE"} and ds.info["aabb_scale"] == 16
    else:
        assert models == {scene.CAMERAS[k][0] for k in scene.DEFAULT_CAMERAS}


def test_renderer_rays_check_would_catch_a_pinhole_loader(capture, loaded):
    """Negative control: the distorted views' rays are not the rays of their pinhole part."""
    from nerf.data.rays import camera_rays

    ds = loaded["colmap-bin"]
    for k, cam in enumerate(ds.train.cameras):
        if cam.is_pinhole:
            continue
        _, d = camera_rays(Camera.pinhole(cam.width, cam.height, cam.fx, cam.fy, cam.cx, cam.cy), ds.train.poses[k])
        _, want, _ = renderer_rays(capture, ds.train.names[k], ds)
        assert np.max(np.abs(d - want)) > 1e-3


def test_normalisation(capture, loaded):
    """Cameras within distance 1 of the origin, +z up: the generator's up and the scene's agree, whatever frame
    the capture was written in (GEN_TO_DATA turns it by ~110°); the centre is the point the cameras look at. Every
    format gives the same frame."""
    for kind in ("colmap-bin", "colmap-txt", "nerfstudio"):
        ds = loaded[kind]
        M = ds.world_to_scene @ scene.GEN_TO_DATA
        up = M[:3, :3] @ [0, 0, 1.0]
        # the mean of the cameras' up vectors: within 0.15° of the true up (the cameras tilt to varying targets)
        np.testing.assert_allclose(up / np.linalg.norm(up), [0, 0, 1], atol=2.5e-3)
        centres = np.concatenate([ds.train.poses[:, :3, 3], ds.test.poses[:, :3, 3]])
        np.testing.assert_allclose(np.max(np.linalg.norm(centres, axis=-1)), 1.0, rtol=1e-5)
        # the cluster (generator origin, the cameras' common target region) is near the scene origin
        assert np.linalg.norm(M[:3, 3]) < 0.15
        np.testing.assert_allclose(ds.world_to_scene, loaded["colmap-bin"].world_to_scene, atol=1e-6)
    assert loaded["colmap-bin"].info["points3D"] == len(capture.points)
    assert 0 < loaded["colmap-bin"].near < 1 < loaded["colmap-bin"].far


def test_downscale_reads_pyramid_or_area_averages(capture, folders):
    ds = load_dataset(folders["colmap-bin"], downscale_factor=2)  # images_2/ exists: read it
    full = load_dataset(folders["colmap-bin"])
    assert (ds.H, ds.W) == (24, 32)
    for k, name in enumerate(ds.train.names):
        np.testing.assert_allclose(ds.train.image(k),
                                   iio.imread(os.path.join(folders["colmap-bin"], "images_2", name)) / 255.0, atol=1e-7)
        a, b = ds.train.cameras[k], full.train.cameras[k]
        assert (a.fx, a.fy, a.cx, a.cy) == (b.fx / 2, b.fy / 2, b.cx / 2, b.cy / 2) and a == b.scaled(0.5, 32, 24)
    # the centre ray of a 2x2 block of the full image lies between its four pixels' rays
    _, d2 = ds.rays("train", 0)
    _, d1 = full.rays("train", 0)
    mean = d1.reshape(24, 2, 32, 2, 3).mean(axis=(1, 3))
    np.testing.assert_allclose(d2, mean / np.linalg.norm(mean, axis=-1, keepdims=True), atol=2e-4)
    # no pyramid (the text model's JPEGs): area average of the full-resolution images
    ds = load_dataset(folders["colmap-txt"], downscale_factor=2)
    full = load_dataset(folders["colmap-txt"])
    assert ds.test.images.dtype == np.uint8  # rounded to 8 bits after the average
    np.testing.assert_allclose(ds.test.images, full.test.images.reshape(-1, 24, 2, 32, 2, 3).mean(axis=(2, 4)),
                               atol=0.5 + 1e-6)


# ------------------------------------------------------------------------------------------------------- splits


def test_holdout_every_and_split_file(folders, tmp_path):
    names = [f"frame_{i:03d}.png" for i in range(16)]
    ds = load_dataset(folders["colmap-bin"])  # default: every 8th
    assert ds.test.names == names[::8] and ds.train.names == [n for n in names if n not in names[::8]]
    assert ds.val is ds.test
    ds = load_dataset(folders["colmap-bin"], holdout_every=4)
    assert ds.test.names == names[::4] and len(ds.train) == 12
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"train": names[:5], "test": ["frame_015.png", "frame_010.png"]}))
    ds = load_dataset(folders["colmap-bin"], split_file=str(split))
    assert ds.train.names == names[:5] and ds.test.names == ["frame_015.png", "frame_010.png"]
    # transforms.json names images by their file_path
    split.write_text(json.dumps({"train": ["images/frame_001.png"], "test": ["images/frame_000.png"]}))
    ds = load_dataset(folders["nerfstudio"], split_file=str(split))
    assert ds.train.names == ["images/frame_001.png"]


# ---------------------------------------------------------------------------------------------------- bad input


def test_missing_image_names_the_entry(folders, tmp_path):
    root = copy_of(folders, "colmap-bin", tmp_path)
    os.remove(os.path.join(root, "images", "frame_006.png"))
    with pytest.raises(DatasetError, match=r"^image 7 of .*images\.bin names image 'frame_006\.png', "
                                           r"but .*frame_006\.png is not on disk"):
        load_dataset(root)


def test_unknown_camera_model_names_the_camera(folders, tmp_path):
    root = copy_of(folders, "colmap-txt", tmp_path)
    path = os.path.join(root, "sparse", "0", "cameras.txt")
    text = open(path).read().replace("2 PINHOLE 64 48 52 49 31.5 24.5",
                                     "2 PINHOLE_X 64 48 52 49 31.5 24.5")
    open(path, "w").write(text)
    with pytest.raises(DatasetError, match=r"cameras\.txt: camera 2: unknown camera model 'PINHOLE_X'"):
        load_dataset(root)
    # binary: the model id of camera 3 (the third record) patched to 99, no COLMAP model
    root = copy_of(folders, "colmap-bin", tmp_path)
    path = os.path.join(root, "sparse", "0", "cameras.bin")
    data = bytearray(open(path, "rb").read())
    pos = 8  # after the camera count; a record is id, model (int32), width, height (uint64), params (double)
    while struct.unpack_from("<i", data, pos)[0] != 3:
        pos += 24 + 8 * len(param_names(model_name(struct.unpack_from("<i", data, pos + 4)[0])))
    struct.pack_into("<i", data, pos + 4, 99)
    open(path, "wb").write(bytes(data))
    with pytest.raises(DatasetError, match=r"cameras\.bin: camera 3: unknown camera model id 99"):
        load_dataset(root)
    # transforms.json
    root = copy_of(folders, "instant-ngp", tmp_path)
    path = os.path.join(root, "transforms.json")
    doc = json.load(open(path))
    doc["frames"][1]["camera_model"] = "EQUIRECTANGULAR"
    json.dump(doc, open(path, "w"))
    with pytest.raises(DatasetError, match=r"frame 1 of .*transforms\.json: camera_model 'EQUIRECTANGULAR' is not "
                                           r"supported"):
        load_dataset(root)


def test_zero_registered_images(folders, tmp_path):
    root = copy_of(folders, "colmap-txt", tmp_path)
    path = os.path.join(root, "sparse", "0", "images.txt")
    open(path, "w").write("# Image list with two lines of data per image:\n")
    with pytest.raises(DatasetError, match=r"images\.txt: zero registered images"):
        load_dataset(root)
    root = copy_of(folders, "nerfstudio", tmp_path)
    path = os.path.join(root, "transforms.json")
    doc = json.load(open(path))
    doc["frames"] = []
    json.dump(doc, open(path, "w"))
    with pytest.raises(DatasetError, match=r"transforms\.json: zero registered images"):
        load_dataset(root)


def test_split_naming_an_unknown_image(folders, tmp_path):
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"train": ["frame_000.png"], "test": ["frame_099.png"]}))
    with pytest.raises(DatasetError, match=r"split\.json: 'test' names image 'frame_099\.png', which is not an image "
                                           r"of .*images\.bin"):
        load_dataset(folders["colmap-bin"], split_file=str(split))
    split.write_text(json.dumps({"train": ["frame_000.png"], "test": ["frame_000.png"]}))
    with pytest.raises(DatasetError, match=r"'frame_000\.png' is in both"):
        load_dataset(folders["colmap-bin"], split_file=str(split))
    with pytest.raises(DatasetError, match=r"--holdout-every must be at least 2"):
        load_dataset(folders["colmap-bin"], holdout_every=1)


def test_mixed_image_sizes(folders, tmp_path):
    # shared intrinsics (w, h once): an image of another size is refused, naming it
    root = copy_of(folders, "instant-ngp", tmp_path)
    doc = json.load(open(os.path.join(root, "transforms.json")))
    odd = os.path.join(root, doc["frames"][1]["file_path"])
    iio.imwrite(odd, np.zeros((40, 60, 3), np.uint8))
    with pytest.raises(DatasetError, match=r"frame_006\.png: image size 60x40 differs from its camera's 64x48 "
                                           r"\(frame 1 of .*transforms\.json\): 'w' and 'h' are given once for "
                                           r"all frames"):
        load_dataset(root)
    # COLMAP: an image on disk whose size is not its camera's
    root = copy_of(folders, "colmap-bin", tmp_path)
    iio.imwrite(os.path.join(root, "images", "frame_003.png"), np.zeros((48, 60, 3), np.uint8))
    with pytest.raises(DatasetError, match=r"frame_003\.png: image size 60x48 differs from its camera's 64x48 "
                                           r"\(image 4 of .*images\.bin\)"):
        load_dataset(root)


def test_split_flags(folders, capsys):
    from nerf.config import parse_args

    cfg = parse_args(["--data", folders["colmap-bin"], "--holdout-every", "4"])
    assert (cfg.split, cfg.holdout_every) == (None, 4)
    for bad in (["--split", "s.json"], ["--data", "x", "--split", "s.json", "--holdout-every", "4"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
    assert "built-in scene has its own" in capsys.readouterr().err


def test_bad_data_stops_before_tensorflow_loads(folders, tmp_path):
    """train.py with a capture whose image is missing: exit code 2, one line naming the file, TensorFlow never
    imported."""
    root = copy_of(folders, "colmap-bin", tmp_path)
    os.remove(os.path.join(root, "images", "frame_002.png"))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from nerf import train\n"
            "try:\n    train.run(['--data', sys.argv[2], '--steps', '1', '--out', sys.argv[3]])\n"
            "except SystemExit as e:\n    print('exit', e.code, 'tensorflow' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code, EXAMPLES, root, str(tmp_path / "out")], capture_output=True,
                       text=True, timeout=60)
    assert r.stdout.strip().splitlines()[-1] == "exit 2 False", r.stdout + r.stderr
    assert "error: image 3 of " in r.stderr and "frame_002.png is not on disk" in r.stderr
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------------------------- training and rendering


def test_train_on_a_capture_and_render_in_its_own_frame(folders, tmp_path):
    """train.py --data on the COLMAP capture (a few steps of the hash model), then the saved model renders a view
    given as a pinhole camera in COLMAP's world frame: the same image as the rays of that camera in the scene
    frame, and not the image of the unmapped pose."""
    from nerf import models, train
    from nerf.data import normalise
    from nerf.data.rays import pinhole_rays

    out = str(tmp_path / "out")
    doc = train.run(["--data", folders["colmap-bin"], "--steps", "3", "--sampler", "uniform", "--samples", "16",
                     "--batch-rays", "256", "--log2-table", "12", "--levels", "4", "--finest-res", "64",
                     "--eval-views", "1", "--final-views", "1", "--no-progress", "--holdout-every", "4", "--out", out])
    assert np.isfinite(doc["final"]["test_psnr"]) and doc["final"]["reload_max_abs_diff"] < 1e-6
    ds = load_dataset(folders["colmap-bin"], holdout_every=4)
    model = models.load_model(os.path.join(out, "model"))
    np.testing.assert_allclose(model.world_to_scene, ds.world_to_scene, atol=1e-12)
    # a novel camera in the data (COLMAP) world: a test pose mapped back out of the scene frame
    T_inv = np.linalg.inv(ds.world_to_scene)
    c2w_data = normalise.apply(T_inv, ds.test.poses[0])
    intr = (40.0, 41.0, 15.0, 13.0)
    rgb, depth, _ = models.render_image(model, Camera.pinhole(32, 24, *intr), c2w_data, frame="data")
    want, _, _ = models.render_rays(model, *pinhole_rays(24, 32, intr, ds.test.poses[0]))
    np.testing.assert_allclose(rgb, want, atol=1e-5)
    unmapped, _, _ = models.render_rays(model, *pinhole_rays(24, 32, intr, c2w_data))
    assert np.max(np.abs(unmapped - want)) > 1e-3
    # frame="scene": a pose in the model's (scene) frame
    a, _, _ = models.render_image(model, Camera.pinhole(32, 24, 40.0, 40.0, 16.0, 12.0), ds.test.poses[0],
                                  frame="scene")
    b, _, _ = models.render_rays(model, *pinhole_rays(24, 32, (40.0, 40.0, 16.0, 12.0), ds.test.poses[0]))
    np.testing.assert_allclose(a, b, atol=1e-5)
