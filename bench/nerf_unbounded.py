"""The NeRF example on an unbounded scene: test PSNR against training time of the bounded model in a box and of the
unbounded model (contraction, cascaded occupancy grid, cone stepping), at the same training budget, and of the
unbounded model trained on poses that pycolmap's structure from motion estimated from the images alone.

The scene is the example's unbounded test scene (``nerf.data.unbounded_scene``: a ground plane to the horizon, a
distant dome, an object cluster), rendered by its ray tracer with 2x2 supersampling.

* ``bounded``, ``unbounded`` (and ``unbounded-app16``, with a 16-d appearance vector per image): ``--views`` views of
  64x48 seen by the scene's five COLMAP camera models, written as a COLMAP binary model with the renderer's poses
  (pycolmap's writer); ``train.py --data DIR --holdout-every 8 --minutes M`` with ``--scene bounded`` (today's model:
  the box [-1.5, 1.5]^3, a white background) or the defaults of a capture (``--scene auto`` → unbounded).
* ``unbounded-sfm`` (and ``bounded-sfm``, the bounded model on the same data): the same ring of ``--views`` views,
  rendered at 256x192 by the scene's SIMPLE_PINHOLE camera only; pycolmap's SIFT features, matching
  (``--sfm-matching``: exhaustive, every pair, by default, or sequential, as for a video) and incremental mapping
  estimate the poses (``--sfm-focal known``, the default: the focal length given and kept, as for a calibrated camera;
  ``estimate``: from COLMAP's default prior, refined), the largest reconstruction is the capture (``sparse/0``), and
  the model trains on it at 64x48 (``--downscale 4``, area-averaged), every 8th view held out. The held-out views
  are rendered through ``nerf.models.render_image`` from **the capture's own cameras**: each test image's camera as
  the COLMAP model stores it, in the capture's world frame, as a user's capture (and mip-NeRF 360's protocol) has
  them. They are also rendered from the renderer's true cameras, mapped into the SfM frame by a similarity fitted to
  the camera centres (Umeyama, refitted on the inliers): that figure includes structure from motion's own pose
  error, which the report measures (pose errors after alignment; the Sampson distance of COLMAP's verified matches to
  the true epipolar geometry, which shows that the renderer's poses and the images agree). The ground truth is the
  256x192 render area-averaged to 64x48.

Per run: test PSNR at each evaluation (every budget/8 of training, on the first 8 test views; the final one on all
of them, or on the first N with ``--train-args "--final-views N"``), samples per ray, rays per step and the occupied fraction of each cascade; written to ``--out`` (``.md``
and ``.json``) with the CPU model and the load average before and after each run (other jobs may share the machine:
training time is wall time).

``--scale 4`` trains ``bounded`` and ``unbounded`` on the scene's full 256x192 images instead of 64x48. ``--tree DIR``
runs another checkout's ``train.py`` (with its own ``tf_metal_ops`` on PYTHONPATH) on the same capture, so that two
versions of the sampler can be compared: start one run per tree at the same time (both then see the same load) with
``--reuse-capture`` on a shared capture. The table gives, per run, the samples per ray that trained and that were
marched (they differ when the marched samples are culled, ``train.py --cull``) and the rays per step.

    python bench/nerf_unbounded.py --minutes 10                                    # all variants, ~45 minutes
    python bench/nerf_unbounded.py --minutes 2 --variants bounded,unbounded --out /tmp/u.md
    python bench/nerf_unbounded.py --minutes 10 --variants unbounded --scale 4 --eval-views 2 \
        --train-args "--eval-every 150 --final-views 8" --tree ../before --work /tmp/b --out /tmp/before.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

os.environ.setdefault("GLOG_minloglevel", "2")  # pycolmap's (COLMAP's) log: warnings and errors only
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
sys.path.insert(0, EXAMPLES)
sys.path.insert(0, HERE)

from bench_util import cpu_model  # noqa: E402

VARIANTS = {
    "bounded": ["--scene", "bounded"],
    "unbounded": [],
    "unbounded-app16": ["--appearance-dim", "16"],
    "unbounded-sfm": [],
    "bounded-sfm": ["--scene", "bounded"],
}
HOLDOUT_EVERY = 8
SFM_SCALE = 4  # SfM sees 256x192 renders (SIFT finds too few features at 64x48)
SFM_CAMERA = 0  # the scene's SIMPLE_PINHOLE camera (f = 50 px at 64x48)


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


TRAIN_OPTIONS = dict(tree=os.path.dirname(HERE), eval_views=8, extra=[])  # main() sets them from the flags


def train(data: str, out: str, minutes: float, extra: list) -> dict:
    """``train.py`` of ``TRAIN_OPTIONS["tree"]`` (its own package on PYTHONPATH) in its own process → its
    metrics.json (and the command)."""
    tree = TRAIN_OPTIONS["tree"]
    cmd = [sys.executable, os.path.join(tree, "examples", "nerf", "train.py"), "--data", data, "--minutes",
           str(minutes), "--out", out, "--no-progress", "--eval-views", str(TRAIN_OPTIONS["eval_views"]), *extra,
           *TRAIN_OPTIONS["extra"]]
    load0 = load_average()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree] + [v for v in [os.environ.get("PYTHONPATH")] if v]))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=args_cwd())
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.json")) as f:
        doc = json.load(f)
    doc["bench"] = dict(command=" ".join(cmd[1:]), load_before=load0, load_after=load_average(),
                        log_tail=r.stdout.strip().splitlines()[-1])
    return doc


def args_cwd() -> str:
    """train.py runs outside the repository root (there, ``import tf_metal_ops`` would find the unbuilt sources)."""
    return os.path.dirname(TRAIN_OPTIONS["tree"])


# ---------------------------------------------------------------------------------------- structure from motion


def umeyama(src: np.ndarray, dst: np.ndarray):
    """The similarity (s, R, t) minimising sum |dst - (s R src + t)|^2 (Umeyama 1991) for points [N, 3]."""
    mu_s, mu_d = src.mean(0), dst.mean(0)
    xs, xd = src - mu_s, dst - mu_d
    cov = xd.T @ xs / len(src)
    U, S, Vt = np.linalg.svd(cov)
    D = np.eye(3)
    if np.linalg.det(U) * np.linalg.det(Vt) < 0:
        D[2, 2] = -1
    R = U @ D @ Vt
    s = float(np.trace(np.diag(S) @ D) / (xs ** 2).sum(axis=1).mean())
    return s, R, mu_d - s * R @ mu_s


def run_sfm(capture, root: str, camera_model: str = "SIMPLE_PINHOLE", focal_prior=None,
            refine_focal: bool = True, matching: str = "exhaustive") -> dict:
    """Images of ``capture`` → ``root/images`` and pycolmap's largest reconstruction → ``root/sparse/0``. Returns
    the reconstruction's summary: registered image names, their camera-to-world poses (OpenGL convention, SfM frame),
    the estimated intrinsics, mean reprojection error, seconds."""
    import pycolmap

    from nerf.data import capture_writers as writers

    writers.write_images(os.path.join(root, "images"), capture, "png")
    work = os.path.join(root, "sfm_work")
    os.makedirs(work, exist_ok=True)
    db = os.path.join(work, "database.db")
    t0 = time.perf_counter()
    reader = pycolmap.ImageReaderOptions()
    reader.camera_model = camera_model
    if focal_prior is not None:  # what a camera's EXIF data gives COLMAP: an initial focal length, then refined
        H, W = capture.images.shape[1:3]
        reader.camera_params = f"{focal_prior},{W / 2},{H / 2}"
    pycolmap.extract_features(db, os.path.join(root, "images"), camera_mode=pycolmap.CameraMode.SINGLE,
                              reader_options=reader)
    if matching == "sequential":  # a video's order: each image with its 10 successors (the ring closes by overlap)
        pairing = pycolmap.SequentialPairingOptions()
        pairing.overlap = 10
        pycolmap.match_sequential(db, pairing_options=pairing)
    else:
        pycolmap.match_exhaustive(db)
    options = pycolmap.IncrementalPipelineOptions()
    options.ba_refine_focal_length = bool(refine_focal)
    recs = pycolmap.incremental_mapping(db, os.path.join(root, "images"), work, options=options)
    if not recs:
        raise SystemExit("structure from motion registered no images")
    rec = max(recs.values(), key=lambda r: r.num_reg_images())
    model_dir = os.path.join(root, "sparse", "0")
    os.makedirs(model_dir, exist_ok=True)
    rec.write_binary(model_dir)
    seconds = time.perf_counter() - t0
    names, c2w = [], []
    for img in sorted(rec.images.values(), key=lambda im: im.name):
        names.append(img.name)
        c2w.append(opengl_c2w(img.cam_from_world() if callable(img.cam_from_world) else img.cam_from_world))
    cam = next(iter(rec.cameras.values()))
    return dict(names=names, c2w=np.stack(c2w), params=[float(p) for p in cam.params], model=str(cam.model),
                reprojection_error=float(rec.compute_mean_reprojection_error()), points=int(rec.num_points3D()),
                reconstructions=[int(r.num_reg_images()) for r in recs.values()], seconds=seconds)


def robust_umeyama(src: np.ndarray, dst: np.ndarray, rounds: int = 5):
    """:func:`umeyama` refitted on the inliers: points whose residual is within 3 × the median residual (a camera
    that structure from motion placed far off would otherwise tilt the whole alignment) → (s, R, t, inlier mask)."""
    keep = np.ones(len(src), bool)
    for _ in range(rounds):
        s, R, t = umeyama(src[keep], dst[keep])
        res = np.linalg.norm(dst - (s * src @ R.T + t), axis=-1)
        new = res <= 3.0 * np.median(res[keep]) + 1e-12
        if np.array_equal(new, keep):
            break
        keep = new
    return s, R, t, keep


def pose_errors(true_c2w, est_c2w, s, R, t):
    """Camera centre (scene units of the true data world / ring radius) and rotation (degrees) errors of the
    estimated poses mapped into the true frame by the inverse of (s, R, t)."""
    centres = (est_c2w[:, :3, 3] - t) @ R / s
    err = np.linalg.norm(centres - true_c2w[:, :3, 3], axis=-1)
    rot = []
    for a, b in zip(true_c2w, est_c2w):
        M = a[:3, :3].T @ (R.T @ b[:3, :3])
        rot.append(np.degrees(np.arccos(np.clip((np.trace(M) - 1) / 2, -1, 1))))
    return err, np.asarray(rot)


def epipolar_check(root: str, capture, all_names: list, true_c2w) -> dict:
    """How well the renderer's poses explain the images, independently of the reconstruction: for each pair of
    consecutive views that COLMAP's matcher verified, the Sampson distance (px at 256x192) of its inlier matches to
    the epipolar geometry of the *true* relative pose. Small distances mean the images and the true poses agree, so
    a pose error of the reconstruction is structure from motion's own."""
    import pycolmap

    from nerf.data import unbounded_scene as scene
    from nerf.data.cameras import colmap_camera

    cam = colmap_camera(*scene.camera_params(SFM_CAMERA, SFM_SCALE))
    K = np.array([[cam.fx, 0, cam.cx], [0, cam.fy, cam.cy], [0, 0, 1.0]])
    Ki = np.linalg.inv(K)
    db = pycolmap.Database.open(os.path.join(root, "sfm_work", "database.db"))
    ids = {im.name: im.image_id for im in db.read_all_images()}

    def w2c(c2w):  # OpenGL camera-to-world → OpenCV world-to-camera (R, t)
        R = c2w[:3, :3] @ np.diag([1.0, -1.0, -1.0])
        return R.T, -R.T @ c2w[:3, 3]

    medians = []
    for i in range(len(all_names) - 1):
        a, b = ids.get(all_names[i]), ids.get(all_names[i + 1])
        if a is None or b is None or not db.exists_two_view_geometry(a, b):
            continue
        m = db.read_two_view_geometry(a, b).inlier_matches
        if len(m) < 8:
            continue
        ka, kb = db.read_keypoints(a)[:, :2], db.read_keypoints(b)[:, :2]
        (Ra, ta), (Rb, tb) = w2c(true_c2w[i]), w2c(true_c2w[i + 1])
        R = Rb @ Ra.T
        t = tb - R @ ta
        F = Ki.T @ np.array([[0, -t[2], t[1]], [t[2], 0, -t[0]], [-t[1], t[0], 0]]) @ R @ Ki
        xa = np.c_[ka[m[:, 0]], np.ones(len(m))]
        xb = np.c_[kb[m[:, 1]], np.ones(len(m))]
        Fa, Fb = xa @ F.T, xb @ F
        d2 = np.sum(xb * Fa, 1) ** 2 / (Fa[:, 0] ** 2 + Fa[:, 1] ** 2 + Fb[:, 0] ** 2 + Fb[:, 1] ** 2)
        medians.append(float(np.median(np.sqrt(d2))))
    db.close()
    return dict(pairs=len(medians), median_px=float(np.median(medians)) if medians else None,
                max_px=float(np.max(medians)) if medians else None)


def rotation_residuals(true_c2w, est_c2w) -> np.ndarray:
    """Per camera, the angle (degrees) left between the estimated and the true rotation after the one rotation that
    best maps the true frame's orientations onto the estimate's (chordal mean): the reconstruction's own rotation
    error, independent of how the camera centres align."""
    A, B = true_c2w[:, :3, :3], est_c2w[:, :3, :3]
    U, _, Vt = np.linalg.svd(sum(b @ a.T for a, b in zip(A, B)))
    Q = U @ np.diag([1.0, 1.0, np.linalg.det(U @ Vt)]) @ Vt
    cos = [(np.trace(a.T @ Q.T @ b) - 1) / 2 for a, b in zip(A, B)]
    return np.degrees(np.arccos(np.clip(cos, -1, 1)))


def sfm_capture(args, work: str) -> dict:
    """The unbounded-sfm capture, once per benchmark run: the 256x192 ring, pycolmap's reconstruction
    (``work/sfm``), the split, and what is known of the reconstruction's accuracy."""
    from nerf.data import capture_writers as writers
    from nerf.data import unbounded_scene as scene
    from nerf.data.cameras import colmap_camera
    from nerf.data.capture import split_names

    capture = scene.render(n_views=args.views, ss=1, scale=SFM_SCALE, cameras=[SFM_CAMERA])
    root = os.path.join(work, "sfm")
    shutil.rmtree(root, ignore_errors=True)
    true_cam = colmap_camera(*scene.camera_params(SFM_CAMERA, SFM_SCALE))
    prior = true_cam.fx if args.sfm_focal == "known" else None
    sfm = run_sfm(capture, root, "SIMPLE_PINHOLE", focal_prior=prior, refine_focal=args.sfm_focal == "estimate",
                  matching=args.sfm_matching)
    all_names = [f"{n}.png" for n in capture.names]
    _, test = split_names(all_names, root, None, HOLDOUT_EVERY)
    test = [n for n in test if n in set(sfm["names"])]
    split = os.path.join(work, "sfm_split.json")
    with open(split, "w") as f:
        json.dump({"train": [n for n in sfm["names"] if n not in set(test)], "test": test}, f)
    # the similarity from the data world (the renderer's poses as a capture stores them) to the SfM frame
    true_c2w = writers.data_c2w(capture)
    index = {n: i for i, n in enumerate(all_names)}
    reg = [index[n] for n in sfm["names"]]
    s, R, t, inl = robust_umeyama(true_c2w[reg, :3, 3], sfm["c2w"][:, :3, 3])
    centre_err, rot_err = pose_errors(true_c2w[reg], sfm["c2w"], s, R, t)
    residual = rotation_residuals(true_c2w[reg], sfm["c2w"])
    ring = float(np.median(np.linalg.norm(true_c2w[:, :3, 3] - true_c2w[:, :3, 3].mean(0), axis=-1)))
    summary = dict(registered=len(reg), views=len(all_names), reconstructions=sfm["reconstructions"],
                   alignment_inliers=int(inl.sum()), outliers=[sfm["names"][i] for i in np.nonzero(~inl)[0]],
                   points=sfm["points"], reprojection_error_px=sfm["reprojection_error"],
                   seconds=round(sfm["seconds"], 1), model=sfm["model"], params=sfm["params"],
                   true_params=list(scene.camera_params(SFM_CAMERA, SFM_SCALE)[3]), focal=args.sfm_focal,
                   centre_error_over_ring_median=float(np.median(centre_err[inl]) / ring),
                   centre_error_over_ring_max=float(np.max(centre_err[inl]) / ring),
                   rotation_error_deg_median=float(np.median(rot_err[inl])),
                   rotation_error_deg_max=float(np.max(rot_err[inl])),
                   rotation_residual_deg_median=float(np.median(residual)),
                   rotation_residual_deg_max=float(np.max(residual)),
                   epipolar=epipolar_check(root, capture, all_names, true_c2w))
    return dict(capture=capture, root=root, split=split, test=test, all_names=all_names, true_c2w=true_c2w,
                sim=(s, R, t), summary=summary)


def sfm_variant(args, work: str, name: str, sfm: dict) -> dict:
    """Trains variant ``name`` (``VARIANTS[name]``) on the SfM capture; evaluates it from the capture's own cameras
    and from the renderer's."""
    out = os.path.join(work, f"run-{name}")
    doc = train(sfm["root"], out, args.minutes, ["--downscale", str(SFM_SCALE), "--split", sfm["split"],
                                                  *VARIANTS[name]])
    doc["sfm"] = dict(sfm["summary"])
    doc["sfm"]["capture_camera_psnr"] = capture_camera_psnr(out, sfm["capture"], sfm["test"], sfm["all_names"],
                                                            os.path.join(sfm["root"], "sparse", "0"))
    doc["sfm"]["true_camera_psnr"] = true_camera_psnr(out, sfm["capture"], sfm["test"], sfm["all_names"],
                                                      sfm["true_c2w"], sfm["sim"])
    return doc


def opengl_c2w(cam_from_world) -> np.ndarray:
    """A pycolmap ``Rigid3d`` (world → camera, OpenCV axes) → 4x4 camera-to-world in the OpenGL convention."""
    R, t = cam_from_world.rotation.matrix(), cam_from_world.translation
    m = np.eye(4)
    m[:3, :3] = R.T @ np.diag([1.0, -1.0, -1.0])  # OpenCV → OpenGL camera axes
    m[:3, 3] = -R.T @ t
    return m


def capture_camera_psnr(run: str, capture, test: list, all_names: list, model_dir: str) -> dict:
    """PSNR of the held-out views rendered by the saved model from the capture's own cameras: each test image's
    camera as the capture's COLMAP model (``model_dir``, read by pycolmap) stores it, in the capture's world frame
    (intrinsics scaled to 64x48), through ``render_image``; against the 256x192 images area-averaged. The protocol
    of a user's capture (and of mip-NeRF 360): the test cameras come from the same structure from motion."""
    import pycolmap

    from nerf import models
    from nerf.data.cameras import Camera

    model = models.load_model(os.path.join(run, "model"))
    rec = pycolmap.Reconstruction(model_dir)
    by_name = {im.name: im for im in rec.images.values()}
    psnrs = {}
    for name in test:
        im = by_name[name]
        cam = rec.cameras[im.camera_id]
        f, cx, cy = (float(v) / SFM_SCALE for v in cam.params[:3])  # SIMPLE_PINHOLE: f, cx, cy
        H, W = cam.height // SFM_SCALE, cam.width // SFM_SCALE
        w2c = im.cam_from_world() if callable(im.cam_from_world) else im.cam_from_world
        rgb, _, _ = models.render_image(model, Camera.pinhole(W, H, f, f, cx, cy), opengl_c2w(w2c), frame="data")
        i = all_names.index(name)
        gt = capture.images[i].astype(np.float64).reshape(H, SFM_SCALE, W, SFM_SCALE, 3).mean(axis=(1, 3)) / 255
        psnrs[name] = float(-10 * np.log10(np.mean((rgb - gt) ** 2)))
    return dict(per_view=psnrs, mean=float(np.mean(list(psnrs.values()))))


def true_camera_psnr(run: str, capture, test: list, all_names: list, true_c2w, sim) -> dict:
    """PSNR of the held-out views rendered by the saved model from the capture's own cameras (true intrinsics at
    64x48, true poses mapped into the SfM frame by ``sim``), against the 256x192 renders area-averaged."""
    from nerf import models
    from nerf.data import normalise
    from nerf.data import unbounded_scene as scene
    from nerf.data.cameras import colmap_camera

    model = models.load_model(os.path.join(run, "model"))
    s, R, t = sim
    S = np.eye(4)
    S[:3, :3], S[:3, 3] = s * R, t
    cam = colmap_camera(*scene.camera_params(SFM_CAMERA, 1))  # the true camera at 64x48
    H, W = cam.height, cam.width
    psnrs = {}
    for name in test:
        i = all_names.index(name)
        rgb, _, _ = models.render_image(model, cam, normalise.apply(S, true_c2w[i]), frame="data")
        gt = capture.images[i].astype(np.float64).reshape(H, SFM_SCALE, W, SFM_SCALE, 3).mean(axis=(1, 3)) / 255
        psnrs[name] = float(-10 * np.log10(np.mean((rgb - gt) ** 2)))
    return dict(per_view=psnrs, mean=float(np.mean(list(psnrs.values()))))


# ------------------------------------------------------------------------------------------------- report


def summary_rows(name: str, doc: dict) -> dict:
    ev = doc["evals"]
    last = ev[-1]
    return dict(variant=name, final_psnr=last["test_psnr"], minutes=last["train_seconds"] / 60,
                steps=doc["final"]["steps"], ms_per_step=1e3 * doc["final"]["seconds_per_step"],
                samples_per_ray=last["samples_per_ray"], rays_per_step=last["rays_per_step"],
                marched_per_ray=last.get("marched_per_ray", last["samples_per_ray"]),
                mean_samples_per_ray=float(np.mean(doc["samples_per_ray"])),
                mean_marched_per_ray=float(np.mean(doc.get("marched_per_ray") or doc["samples_per_ray"])),
                mean_rays_per_step=float(np.mean(doc["rays_per_step"])),
                occupied=last.get("occupied_per_cascade") or [last.get("occupied_fraction")],
                curve=[(round(e["train_seconds"] / 60, 2), round(e["test_psnr"], 2)) for e in ev],
                load=(doc["bench"]["load_before"], doc["bench"]["load_after"]), command=doc["bench"]["command"])


def write_report(path: str, args, rows: list, docs: dict, header: dict):
    lines = [f"# NeRF example on the unbounded test scene: bounded vs unbounded model (`bench/nerf_unbounded.py`)",
             "", f"CPU: {header['cpu']}, {os.cpu_count()} cores; {args.views} views of {64 * args.scale}x"
             f"{48 * args.scale} (every "
             f"{HOLDOUT_EVERY}th held out: {header['test_views']} test views); {args.minutes} minutes of training "
             f"per run; written {header['date']} UTC.", "",
             "| variant | test PSNR (dB) | steps | ms/step | samples/ray (trained) | marched/ray | rays/step | "
             "occupied per cascade | load avg before → after |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        occ = ", ".join(f"{100 * v:.1f}%" for v in r["occupied"] if v is not None)
        lines.append(f"| {r['variant']} | {r['final_psnr']:.2f} | {r['steps']} | {r['ms_per_step']:.0f} | "
                     f"{r['samples_per_ray']:.1f} | {r['marched_per_ray']:.1f} | {r['rays_per_step']:.0f} | {occ} | "
                     f"{r['load'][0]} → {r['load'][1]} |")
    lines += ["", "Samples per ray, rays per step: over the last evaluation interval; over the whole run: " + "; ".join(
        f"{r['variant']} {r['mean_samples_per_ray']:.1f} trained, {r['mean_marched_per_ray']:.1f} marched, "
        f"{r['mean_rays_per_step']:.0f} rays" for r in rows) + "."]
    extra = args.train_args.split()
    final = extra[extra.index("--final-views") + 1] if "--final-views" in extra[:-1] else None
    last = ("the last one on all of them" if final is None else "no final evaluation" if final == "0"
            else f"the last one on the first {final}")
    lines += ["", f"Test PSNR (dB) against training minutes (the periodic evaluations on the first "
                  f"{args.eval_views} test views, {last}):", ""]
    for r in rows:
        lines.append(f"* {r['variant']}: " + ", ".join(f"{m:.2f} min {p:.2f}" for m, p in r["curve"]))
    sfm_runs = [v for v in docs if v.endswith("-sfm")]
    if sfm_runs:
        s = docs[sfm_runs[0]]["sfm"]
        e = s["epipolar"]
        lines += ["", f"Structure from motion (pycolmap: SIFT, {args.sfm_matching} matching, incremental mapping; "
                      f"SIMPLE_PINHOLE camera, {64 * SFM_SCALE}x{48 * SFM_SCALE} renders, trained at 64x48):", "",
                  f"* registered {s['registered']} of {s['views']} views (reconstructions: {s['reconstructions']}), "
                  f"{s['points']} points, mean reprojection error {s['reprojection_error_px']:.3f} px, "
                  f"{s['seconds']} s;",
                  f"* focal length {s['focal']}: SfM's camera {np.round(s['params'], 2).tolist()} vs true "
                  f"{np.round(s['true_params'], 2).tolist()} (f, cx, cy at {64 * SFM_SCALE}x{48 * SFM_SCALE});",
                  f"* the renderer's poses agree with the images: over {e['pairs']} verified consecutive pairs, the "
                  f"median Sampson distance of the inlier matches to the true epipolar geometry is "
                  f"{e['median_px']:.3f} px (pair medians up to {e['max_px']:.3f} px);",
                  f"* the reconstruction's pose error: the Umeyama alignment of the camera centres (refitted on the "
                  f"inliers: {s['alignment_inliers']} of {s['registered']}; outliers {s['outliers']}); on the "
                  f"inliers, centre error / ring radius median {s['centre_error_over_ring_median']:.4f}, max "
                  f"{s['centre_error_over_ring_max']:.4f}; rotation error median "
                  f"{s['rotation_error_deg_median']:.3f}°, max {s['rotation_error_deg_max']:.3f}° (after the best "
                  f"common rotation instead: median {s['rotation_residual_deg_median']:.3f}°, max "
                  f"{s['rotation_residual_deg_max']:.3f}°; at 64x48, 1° is {50 * np.pi / 180:.2f} px);", "",
                  "Held-out views (every 8th) of the SfM runs, rendered by the saved model through "
                  "`nerf.models.render_image`:", "",
                  "| variant | from the capture's own cameras (COLMAP's, the data world) | from the renderer's "
                  "cameras (mapped into the SfM frame by the alignment) | train.py's evaluation (metrics.json) |",
                  "|---|---|---|---|"]
        for v in sfm_runs:
            d = docs[v]["sfm"]
            lines.append(f"| {v} | **{d['capture_camera_psnr']['mean']:.2f} dB** | "
                         f"{d['true_camera_psnr']['mean']:.2f} dB | {docs[v]['evals'][-1]['test_psnr']:.2f} dB |")
        lines += ["", "Per view, from the capture's own cameras: " + "; ".join(
            f"{v}: " + ", ".join(f"{x:.2f}" for x in docs[v]["sfm"]["capture_camera_psnr"]["per_view"].values())
            for v in sfm_runs) + "."]
    lines += ["", "Commands (train.py arguments):", ""] + [f"* {r['variant']}: `{r['command']}`" for r in rows]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0, help="training budget per run")
    p.add_argument("--views", type=int, default=128, help="views of the capture")
    p.add_argument("--variants", default="bounded,unbounded,unbounded-sfm,bounded-sfm",
                   help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--sfm-focal", choices=("known", "estimate"), default="known",
                   help="unbounded-sfm: the focal length given and kept (a calibrated camera), or estimated by "
                        "structure from motion from COLMAP's default prior")
    p.add_argument("--sfm-matching", choices=("sequential", "exhaustive"), default="exhaustive",
                   help="unbounded-sfm: pairs to match: each view with its 10 successors in capture order (a "
                        "video's; the ring's views are in order), or all pairs")
    p.add_argument("--scale", type=int, default=1,
                   help="bounded, unbounded: the capture's images are scale x 64x48 (4: the scene's full 256x192)")
    p.add_argument("--eval-views", type=int, default=8, help="test views of the periodic evaluations")
    p.add_argument("--tree", default=os.path.dirname(HERE),
                   help="repository whose examples/nerf/train.py (and tf_metal_ops, on PYTHONPATH) trains: another "
                        "checkout compares its sampler with this one's")
    p.add_argument("--train-args", default="", help="more train.py arguments for every run (one string)")
    p.add_argument("--reuse-capture", action="store_true",
                   help="bounded, unbounded: keep WORK/capture when present (written by an earlier run with the same "
                        "--views and --scale)")
    p.add_argument("--work", default="/tmp/nerf_unbounded_bench", help="captures and runs")
    p.add_argument("--out", default=os.path.join(HERE, "nerf_unbounded.md"), help="report (.md; .json beside it)")
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        p.error(f"unknown variant(s) {bad}; choose from {list(VARIANTS)}")
    if not (args.minutes > 0) or args.views < 2 * HOLDOUT_EVERY or args.scale < 1 or args.eval_views < 1:
        p.error(f"--minutes must be positive, --views at least {2 * HOLDOUT_EVERY}, --scale and --eval-views at "
                f"least 1")
    if not os.path.isfile(os.path.join(args.tree, "examples", "nerf", "train.py")):
        p.error(f"--tree {args.tree}: no examples/nerf/train.py there")
    TRAIN_OPTIONS.update(tree=os.path.abspath(args.tree), eval_views=args.eval_views, extra=args.train_args.split())
    print(f"CPU: {cpu_model()}; load {load_average()}", flush=True)

    from nerf.data import capture_writers as writers
    from nerf.data import unbounded_scene as scene

    os.makedirs(args.work, exist_ok=True)
    data = os.path.join(args.work, "capture")
    if not (args.reuse_capture and os.path.isdir(os.path.join(data, "sparse"))):
        shutil.rmtree(data, ignore_errors=True)
        writers.write_colmap(data, scene.render(n_views=args.views, ss=2, scale=args.scale), binary=True)
    docs, rows, sfm = {}, [], None
    for v in variants:
        t0 = time.perf_counter()
        if v.endswith("-sfm"):
            sfm = sfm or sfm_capture(args, args.work)
            docs[v] = sfm_variant(args, args.work, v, sfm)
        else:
            docs[v] = train(data, os.path.join(args.work, f"run-{v}"), args.minutes,
                            ["--holdout-every", str(HOLDOUT_EVERY), *VARIANTS[v]])
        rows.append(summary_rows(v, docs[v]))
        r = rows[-1]
        print(f"{v}: test PSNR {r['final_psnr']:.2f} dB after {r['minutes']:.1f} min ({r['steps']} steps), "
              f"{r['samples_per_ray']:.1f} samples/ray ({r['marched_per_ray']:.1f} marched), "
              f"{r['rays_per_step']:.0f} rays/step, occupied {r['occupied']}, load {r['load']}, "
              f"{time.perf_counter() - t0:.0f} s" + (
                  f"; capture's cameras {docs[v]['sfm']['capture_camera_psnr']['mean']:.2f} dB, renderer's "
                  f"{docs[v]['sfm']['true_camera_psnr']['mean']:.2f} dB" if v.endswith("-sfm") else ""), flush=True)
    header = dict(cpu=cpu_model(), date=time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                  test_views=len(range(0, args.views, HOLDOUT_EVERY)), tree=TRAIN_OPTIONS["tree"],
                  commit=subprocess.run(["git", "-C", TRAIN_OPTIONS["tree"], "rev-parse", "--short", "HEAD"],
                                        capture_output=True, text=True).stdout.strip(),
                  train_args=args.train_args, scale=args.scale)
    write_report(args.out, args, rows, docs, header)
    per_step = ("train_losses", "samples_per_ray", "marched_per_ray", "rays_per_step", "step_seconds")
    slim = {k: {kk: vv for kk, vv in d.items() if kk not in per_step} for k, d in docs.items()}
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump(dict(header=header, rows=rows, runs=slim), f, indent=1, default=float)
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
