"""The NeRF example on an unbounded scene: test PSNR against training time of the bounded model in a box and of the
unbounded model (contraction, cascaded occupancy grid, cone stepping), at the same training budget, and of the
unbounded model trained on poses that pycolmap's structure from motion estimated from the images alone.

The scene is the example's unbounded test scene (``nerf.data.unbounded_scene``: a ground plane to the horizon, a
distant dome, an object cluster), rendered by its ray tracer with 2x2 supersampling.

* ``bounded``, ``unbounded`` (and ``unbounded-app16``, with a 16-d appearance vector per image): ``--views`` views of
  64x48 seen by the scene's five COLMAP camera models, written as a COLMAP binary model with the renderer's poses
  (pycolmap's writer); ``train.py --data DIR --holdout-every 8 --minutes M`` with ``--scene bounded`` (today's model:
  the box [-1.5, 1.5]^3, a white background) or the defaults of a capture (``--scene auto`` → unbounded).
* ``unbounded-sfm``: the same ring of ``--views`` views, rendered at 256x192 by the scene's SIMPLE_PINHOLE camera
  only; pycolmap's SIFT features, matching (``--sfm-matching``: sequential, as for a video, by default, or
  exhaustive) and incremental mapping estimate the poses (``--sfm-focal
  known``, the default: the focal length given and kept, as for a calibrated camera; ``estimate``: from COLMAP's
  default prior, refined), the largest reconstruction is the capture (``sparse/0``), and the model trains on it at
  64x48 (``--downscale 4``, area-averaged), every 8th view (of all views, registered or not) held out. It is
  evaluated from **the capture's own cameras** (the renderer's poses and intrinsics, in the data world of the
  scene) through ``nerf.models.render_image``: the SfM frame differs from the data world by a similarity, estimated
  from the registered cameras' centres (Umeyama, refitted on the inliers), which maps the true test cameras into
  the SfM frame. The ground truth is the 256x192 render area-averaged to 64x48.

Per run: test PSNR at each evaluation (every budget/8 of training, on the first 8 test views; the final one on all
of them), samples per ray, rays per step and the occupied fraction of each cascade; written to ``--out`` (``.md``
and ``.json``) with the CPU model and the load average before and after each run (other jobs may share the machine:
training time is wall time).

    python bench/nerf_unbounded.py --minutes 10                                    # all variants, ~35 minutes
    python bench/nerf_unbounded.py --minutes 2 --variants bounded,unbounded --out /tmp/u.md
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
}
HOLDOUT_EVERY = 8
SFM_SCALE = 4  # SfM sees 256x192 renders (SIFT finds too few features at 64x48)
SFM_CAMERA = 0  # the scene's SIMPLE_PINHOLE camera (f = 50 px at 64x48)


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def train(data: str, out: str, minutes: float, extra: list) -> dict:
    """``train.py`` in its own process → its metrics.json (and the command)."""
    cmd = [sys.executable, os.path.join(EXAMPLES, "nerf", "train.py"), "--data", data, "--minutes", str(minutes),
           "--out", out, "--no-progress", "--eval-views", "8", *extra]
    load0 = load_average()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.json")) as f:
        doc = json.load(f)
    doc["bench"] = dict(command=" ".join(cmd[1:]), load_before=load0, load_after=load_average(),
                        log_tail=r.stdout.strip().splitlines()[-1])
    return doc


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
        w2c = img.cam_from_world() if callable(img.cam_from_world) else img.cam_from_world  # pycolmap >= 3.12
        R, t = w2c.rotation.matrix(), w2c.translation
        m = np.eye(4)
        m[:3, :3] = R.T @ np.diag([1.0, -1.0, -1.0])  # OpenCV → OpenGL camera axes
        m[:3, 3] = -R.T @ t
        names.append(img.name)
        c2w.append(m)
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


def sfm_variant(args, work: str) -> dict:
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
    train_names = [n for n in sfm["names"] if n not in set(test)]
    split = os.path.join(work, "sfm_split.json")
    with open(split, "w") as f:
        json.dump({"train": train_names, "test": [n for n in test if n in set(sfm["names"])]}, f)
    # the similarity from the data world (the renderer's poses as a capture stores them) to the SfM frame
    true_c2w = writers.data_c2w(capture)
    index = {n: i for i, n in enumerate(all_names)}
    reg = [index[n] for n in sfm["names"]]
    s, R, t, inl = robust_umeyama(true_c2w[reg, :3, 3], sfm["c2w"][:, :3, 3])
    centre_err, rot_err = pose_errors(true_c2w[reg], sfm["c2w"], s, R, t)
    ring = float(np.median(np.linalg.norm(true_c2w[:, :3, 3] - true_c2w[:, :3, 3].mean(0), axis=-1)))
    out = os.path.join(work, "run-unbounded-sfm")
    doc = train(root, out, args.minutes, ["--downscale", str(SFM_SCALE), "--split", split])
    doc["sfm"] = dict(registered=len(reg), views=len(all_names), reconstructions=sfm["reconstructions"],
                      alignment_inliers=int(inl.sum()), outliers=[sfm["names"][i] for i in np.nonzero(~inl)[0]],
                      points=sfm["points"], reprojection_error_px=sfm["reprojection_error"],
                      seconds=round(sfm["seconds"], 1), model=sfm["model"], params=sfm["params"],
                      true_params=list(scene.camera_params(SFM_CAMERA, SFM_SCALE)[3]), focal=args.sfm_focal,
                      centre_error_over_ring_median=float(np.median(centre_err[inl]) / ring),
                      centre_error_over_ring_max=float(np.max(centre_err[inl]) / ring),
                      rotation_error_deg_median=float(np.median(rot_err[inl])),
                      rotation_error_deg_max=float(np.max(rot_err[inl])))
    doc["sfm"]["true_camera_psnr"] = true_camera_psnr(out, capture, test, all_names, true_c2w, (s, R, t))
    return doc


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
        rgb, _, _ = models.render_image(model, H, W, (cam.fx, cam.fy, cam.cx, cam.cy), normalise.apply(S, true_c2w[i]))
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
                occupied=last.get("occupied_per_cascade") or [last.get("occupied_fraction")],
                curve=[(round(e["train_seconds"] / 60, 2), round(e["test_psnr"], 2)) for e in ev],
                load=(doc["bench"]["load_before"], doc["bench"]["load_after"]), command=doc["bench"]["command"])


def write_report(path: str, args, rows: list, docs: dict, header: dict):
    lines = [f"# NeRF example on the unbounded test scene: bounded vs unbounded model (`bench/nerf_unbounded.py`)",
             "", f"CPU: {header['cpu']}, {os.cpu_count()} cores; {args.views} views of 64x48 (every "
             f"{HOLDOUT_EVERY}th held out: {header['test_views']} test views); {args.minutes} minutes of training "
             f"per run; written {header['date']} UTC.", "",
             "| variant | test PSNR (dB) | steps | ms/step | samples/ray | rays/step | occupied per cascade | "
             "load avg before → after |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        occ = ", ".join(f"{100 * v:.1f}%" for v in r["occupied"] if v is not None)
        lines.append(f"| {r['variant']} | {r['final_psnr']:.2f} | {r['steps']} | {r['ms_per_step']:.0f} | "
                     f"{r['samples_per_ray']:.1f} | {r['rays_per_step']:.0f} | {occ} | {r['load'][0]} → "
                     f"{r['load'][1]} |")
    lines += ["", "Test PSNR (dB) against training minutes (the periodic evaluations on the first 8 test views, the "
                  "last one on all of them):", ""]
    for r in rows:
        lines.append(f"* {r['variant']}: " + ", ".join(f"{m:.2f} min {p:.2f}" for m, p in r["curve"]))
    if "unbounded-sfm" in docs:
        s = docs["unbounded-sfm"]["sfm"]
        lines += ["", f"Structure from motion (pycolmap: SIFT, {args.sfm_matching} matching, incremental mapping; "
                      f"SIMPLE_PINHOLE camera, {64 * SFM_SCALE}x{48 * SFM_SCALE} renders, trained at 64x48):", "",
                  f"* registered {s['registered']} of {s['views']} views (reconstructions: {s['reconstructions']}), "
                  f"{s['points']} points, mean reprojection error {s['reprojection_error_px']:.3f} px, "
                  f"{s['seconds']} s;",
                  f"* focal length {s['focal']}: SfM's camera {np.round(s['params'], 2).tolist()} vs true "
                  f"{np.round(s['true_params'], 2).tolist()} (f, cx, cy at {64 * SFM_SCALE}x{48 * SFM_SCALE});",
                  f"* the Umeyama alignment of the camera centres (refitted on the inliers: "
                  f"{s['alignment_inliers']} of {s['registered']}; outliers {s['outliers']}); on the inliers, "
                  f"centre error / ring radius median "
                  f"{s['centre_error_over_ring_median']:.4f}, max {s['centre_error_over_ring_max']:.4f}; rotation "
                  f"error median {s['rotation_error_deg_median']:.3f}°, max {s['rotation_error_deg_max']:.3f}°;",
                  f"* test PSNR from **the capture's own cameras** (true intrinsics and poses, mapped into the SfM "
                  f"frame, `render_image`): **{s['true_camera_psnr']['mean']:.2f} dB** (per view: "
                  + ", ".join(f"{v:.2f}" for v in s["true_camera_psnr"]["per_view"].values())
                  + f"); from the SfM cameras themselves (metrics.json): "
                  f"{docs['unbounded-sfm']['evals'][-1]['test_psnr']:.2f} dB."]
    lines += ["", "Commands (train.py arguments):", ""] + [f"* {r['variant']}: `{r['command']}`" for r in rows]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0, help="training budget per run")
    p.add_argument("--views", type=int, default=128, help="views of the capture")
    p.add_argument("--variants", default="bounded,unbounded,unbounded-sfm",
                   help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--sfm-focal", choices=("known", "estimate"), default="known",
                   help="unbounded-sfm: the focal length given and kept (a calibrated camera), or estimated by "
                        "structure from motion from COLMAP's default prior")
    p.add_argument("--sfm-matching", choices=("sequential", "exhaustive"), default="sequential",
                   help="unbounded-sfm: pairs to match: each view with its 10 successors in capture order (a "
                        "video's; the ring's views are in order), or all pairs")
    p.add_argument("--work", default="/tmp/nerf_unbounded_bench", help="captures and runs")
    p.add_argument("--out", default=os.path.join(HERE, "nerf_unbounded.md"), help="report (.md; .json beside it)")
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        p.error(f"unknown variant(s) {bad}; choose from {list(VARIANTS)}")
    if not (args.minutes > 0) or args.views < 2 * HOLDOUT_EVERY:
        p.error(f"--minutes must be positive and --views at least {2 * HOLDOUT_EVERY}")
    print(f"CPU: {cpu_model()}; load {load_average()}", flush=True)

    from nerf.data import capture_writers as writers
    from nerf.data import unbounded_scene as scene

    os.makedirs(args.work, exist_ok=True)
    data = os.path.join(args.work, "capture")
    shutil.rmtree(data, ignore_errors=True)
    writers.write_colmap(data, scene.render(n_views=args.views, ss=2), binary=True)
    docs, rows = {}, []
    for v in variants:
        t0 = time.perf_counter()
        if v == "unbounded-sfm":
            docs[v] = sfm_variant(args, args.work)
        else:
            docs[v] = train(data, os.path.join(args.work, f"run-{v}"), args.minutes,
                            ["--holdout-every", str(HOLDOUT_EVERY), *VARIANTS[v]])
        rows.append(summary_rows(v, docs[v]))
        r = rows[-1]
        print(f"{v}: test PSNR {r['final_psnr']:.2f} dB after {r['minutes']:.1f} min ({r['steps']} steps), "
              f"{r['samples_per_ray']:.1f} samples/ray, occupied {r['occupied']}, load {r['load']}, "
              f"{time.perf_counter() - t0:.0f} s" + (f"; true cameras {docs[v]['sfm']['true_camera_psnr']['mean']:.2f}"
                                                   f" dB" if v == "unbounded-sfm" else ""), flush=True)
    header = dict(cpu=cpu_model(), date=time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                  test_views=len(range(0, args.views, HOLDOUT_EVERY)))
    write_report(args.out, args, rows, docs, header)
    per_step = ("train_losses", "samples_per_ray", "marched_per_ray", "rays_per_step", "step_seconds")
    slim = {k: {kk: vv for kk, vv in d.items() if kk not in per_step} for k, d in docs.items()}
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump(dict(header=header, rows=rows, runs=slim), f, indent=1, default=float)
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
