"""Global atomic operations per hash-grid backward, per level, counted on the emulated GPU: the figure that stands for
the table gradient's scatter cost until a Mac times it (GPU times on NVIDIA hardware: bench/gpu_proxy.md).

    python bench/hash_grid_atomics.py                      # writes bench/hash_grid_atomics.md and .json
    python bench/hash_grid_atomics.py --quick --md '' --json ''   # smoke run (2^14 points), nothing written
    python bench/hash_grid_atomics.py --repeats 3          # also emulation seconds, counting off / on

Config: HashNeRF's defaults (examples/nerf/models.py): D=3, L=16, F=2, log2 T=17, N_min=16, finest 512
(b = 32^(1/15)), linear interpolation, float32 table; 2^18 points in two sets:
  uniform  x ~ U[0,1)^3, independent;
  rays     2^12 rays x 64 samples, ray-major (a ray's samples are consecutive, as HashNeRF flattens [R, S, 3]): the
           built-in scene's cameras (radius 4, elevation 10..70 deg, 100x100 pixels, Blender's field of view),
           a random pixel of a random camera per ray (as a training batch), 64 stratified jittered samples between
           the ray's entry into and exit from the box [-1, 1]^3 within [near 2, far 6], normalised to [0,1]^3 as
           HashNeRF does.
Passes, each counted with tf_metal_ops.emulated_gpu.count_atomics on /GPU:0 (TF_METAL_OPS_EMULATED_GPU=1, the
package's own host code and unchanged metal_kernels/hash_grid.metal):
  grad_params   d/dparams of the encoding (tape.gradient(y, params, output_gradients=dy));
  grad2_params  the second-order pass (d/dparams of sum(w * d/dx), the eikonal-loss path: nested tapes).
Each pass runs once at MSL 3.0 (atomic_float fetch_add) and once at MSL 2.4 (TF_METAL_OPS_EMULATED_GPU_MSL=2.4: the
CAS loop), each in its own process. Per level: the atomics on the accumulator's rows of that level (the buffer bound
to the kernels' parameter --acc-param, split at the level offsets); "atomics" = read-modify-write operations
(fetch_add, ...) + compare-exchange attempts; at MSL 2.4 also the failed attempts (retries). Threadgroup-memory
atomics are reported apart. Reference columns computed from the positions alone (tf_metal_ops.hash_grid.reference):
  scatter    N * 2^D * F: one atomic per point, corner and feature (what a kernel without aggregation does);
  simd/c     sum over SIMD groups (32 consecutive points of one level, the kernels' grid) and corners of the distinct
             rows among the 32 lanes, * F: what perfect per-corner SIMD-group aggregation would leave;
  simd       the same with the rows of all corners of a SIMD group pooled.
What the retries mean: threads of one threadgroup run one after another on one CPU thread, so a CAS fails only when
a threadgroup on another worker thread wrote the word between the load and the CAS: retries depend on the number of
workers (--workers, default all CPUs) and the CPU, not on a GPU. Attempts - retries = successes is exact.

Before and after: bench/hash_grid_atomics_before.json holds a run of the kernels before SIMD-group aggregation
(the commit it names); every run whose config and point count match it adds a "Before → after" table per level
(--baseline PATH picks another run). After changing hash_grid.metal, rerun the same command. Emulation times are
given only with --repeats, to show what counting costs (they say nothing about a GPU; kernels that call SIMD-group
functions run on the emulation's fibers, which is slow at 2^18 points).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

from bench_util import cpu_model

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NERF = dict(n_levels=16, n_features_per_level=2, log2_hashmap_size=17, base_resolution=16, finest_resolution=512)
SIMD = 32
MSL_VERSIONS = ("3.0", "2.4")
PASSES = ("grad_params", "grad2_params")
FIELDS = ("rmw", "cas", "cas_failed", "load", "store")


def hash_config():
    from tf_metal_ops.hash_grid import HashGridConfig

    c = dict(NERF)
    finest = c.pop("finest_resolution")
    scale = math.exp(math.log(finest / c["base_resolution"]) / max(c["n_levels"] - 1, 1))  # HashNeRF's formula
    return HashGridConfig(3, per_level_scale=scale, **c)


# ---- point sets ------------------------------------------------------------------------------------------------
def uniform_points(n, rng):
    import numpy as np

    return rng.random((n, 3), dtype=np.float32)


def ray_points(n_rays, n_samples, rng, *, radius=4.0, size=100, near=2.0, far=6.0, bound=1.0):
    """[n_rays * n_samples, 3] float32 in [0,1]^3, ray-major (module docstring)."""
    import numpy as np

    fov = 0.6911112070083618  # Blender NeRF-synthetic camera_angle_x (examples/nerf/data/synthetic.py)
    focal = 0.5 * size / math.tan(0.5 * fov)
    az = rng.uniform(0, 2 * math.pi, n_rays)
    el = np.radians(rng.uniform(10.0, 70.0, n_rays))
    pos = radius * np.stack([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)], -1)
    fwd = -pos / np.linalg.norm(pos, axis=-1, keepdims=True)  # looking at the origin
    right = np.cross(fwd, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right, axis=-1, keepdims=True)
    up = np.cross(right, fwd)
    px, py = rng.integers(0, size, n_rays) + 0.5, rng.integers(0, size, n_rays) + 0.5
    d = fwd + ((px - 0.5 * size) / focal)[:, None] * right - ((py - 0.5 * size) / focal)[:, None] * up
    d /= np.linalg.norm(d, axis=-1, keepdims=True)
    inv = 1.0 / np.where(np.abs(d) < 1e-9, 1e-9, d)
    t1, t2 = (-bound - pos) * inv, (bound - pos) * inv
    t_in, t_out = np.minimum(t1, t2).max(-1), np.maximum(t1, t2).min(-1)
    t_near = np.maximum(t_in, near)
    t_far = np.maximum(np.minimum(t_out, far), t_near + 1e-4)
    u = (np.arange(n_samples) + rng.random((n_rays, n_samples))) / n_samples  # stratified, jittered
    t = t_near[:, None] + (t_far - t_near)[:, None] * u
    pts = pos[:, None, :] + d[:, None, :] * t[..., None]
    x = np.clip((pts / bound + 1.0) * 0.5, 0.0, 1.0)
    return x.reshape(-1, 3).astype(np.float32)


def point_sets(log2_points, seed=0):
    import numpy as np

    n = 1 << log2_points
    rng = np.random.default_rng(seed)
    samples = 64
    return {"uniform": uniform_points(n, rng), "rays": ray_points(n // samples, samples, rng)}


def reference_counts(x, cfg):
    """Per level: scatter, simd/c, simd (module docstring), from the rows each point's corners touch."""
    import numpy as np

    from tf_metal_ops.hash_grid import reference

    n = len(x)
    pad = (-n) % SIMD
    out = []
    for level in range(cfg.n_levels):
        rows = np.stack([r for r, _, _ in reference.level_corners(x, cfg, level)], 1)  # [N, corners]
        rows = np.pad(rows, ((0, pad), (0, 0)), constant_values=-1).reshape(-1, SIMD, rows.shape[1])
        valid = rows >= 0

        def distinct(a, v):  # per SIMD group: distinct values of a[g][v[g]]
            s = np.sort(np.where(v, a, -1), axis=1)
            new = np.concatenate([s[:, :1] >= 0, (s[:, 1:] != s[:, :-1]) & (s[:, 1:] >= 0)], axis=1)
            return int(new.sum())

        per_corner = sum(distinct(rows[:, :, c], valid[:, :, c]) for c in range(rows.shape[2]))
        pooled = distinct(rows.reshape(rows.shape[0], -1), valid.reshape(valid.shape[0], -1))
        F = cfg.n_features_per_level
        out.append({"scatter": n * rows.shape[2] * F, "simd_per_corner": per_corner * F, "simd": pooled * F})
    return out


# ---- worker: one MSL version, on the emulated GPU ---------------------------------------------------------------
def summarise(launches, acc_param, n_levels):
    """Per kernel: global and threadgroup counts; per level: the acc parts summed over the launches."""
    kernels, levels = {}, [dict.fromkeys(FIELDS, 0) for _ in range(n_levels)]
    for r in launches:
        if not r["counted"]:
            raise SystemExit(f"launch of {r['kernel']} was not counted (inline kernel)")
        k = kernels.setdefault(r["kernel"], {"launches": 0, "global": dict.fromkeys(FIELDS, 0),
                                              "threadgroup": dict.fromkeys(FIELDS, 0)})
        k["launches"] += 1
        for f in FIELDS:
            k["threadgroup"][f] += r["threadgroup"][f]
        for b in r["buffers"]:
            for f in FIELDS:
                k["global"][f] += b["total"][f]
            if b["param"] == acc_param:
                if len(b["parts"]) != n_levels:
                    raise SystemExit(f"{r['kernel']}: '{acc_param}' has {len(b['parts'])} parts, not {n_levels}")
                for lv, part in zip(levels, b["parts"]):
                    for f in FIELDS:
                        lv[f] += part[f]
    return {"kernels": kernels, "levels": levels}


def worker(args) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf

    import tf_metal_ops as t
    from tf_metal_ops import emulated_gpu

    if not emulated_gpu.enabled():
        raise SystemExit("the emulated GPU is not enabled (TF_METAL_OPS_EMULATED_GPU=1 must be set before TF starts)")
    cfg = hash_config()
    kw = cfg.op_kwargs()
    F = cfg.n_features_per_level
    split = {args.acc_param: [o * F * 4 for o in cfg.offsets[:-1]]}  # float32 accumulator rows of F floats
    rng = np.random.default_rng(1)
    params = rng.uniform(-1e-2, 1e-2, cfg.params_shape).astype(np.float32)
    out = {}
    for name, x in point_sets(args.log2_points).items():
        dy = rng.standard_normal((len(x), cfg.n_output_dims)).astype(np.float32)
        w = rng.standard_normal(x.shape).astype(np.float32)
        with tf.device("/GPU:0"):
            xt, dyt, wt = tf.constant(x), tf.constant(dy), tf.constant(w)
            p = tf.constant(params)  # a constant, watched: variables stay on the CPU (docs/emulated_gpu.md)

            def first():
                with tf.GradientTape() as tape:
                    tape.watch(p)
                    y = t.hash_grid_encode(xt, p, **kw)
                return tape, y

            def second():
                with tf.GradientTape() as outer:
                    outer.watch(p)
                    with tf.GradientTape() as inner:
                        inner.watch(xt)
                        y = t.hash_grid_encode(xt, p, **kw)
                    gx = inner.gradient(y, xt, output_gradients=dyt)
                    loss = tf.reduce_sum(gx * wt)
                return outer, loss

            res = {}
            for pass_name, make, target in (("grad_params", first, dyt), ("grad2_params", second, None)):
                tape, y = make()
                emulated_gpu.synchronize()
                with emulated_gpu.count_atomics(split=split) as counting:
                    g = tape.gradient(y, p, output_gradients=target)
                g.numpy()
                rec = summarise(counting.launches, args.acc_param, cfg.n_levels)
                # Emulation seconds of the same backward without and with counting (what counting costs).
                times = {"off": [], "on": []}
                for _ in range(args.repeats):
                    for mode in ("off", "on"):
                        tape, y = make()
                        emulated_gpu.synchronize()
                        t0 = time.perf_counter()
                        if mode == "on":
                            with emulated_gpu.count_atomics(split=split):
                                g = tape.gradient(y, p, output_gradients=target)
                        else:
                            g = tape.gradient(y, p, output_gradients=target)
                            emulated_gpu.synchronize()
                        g.numpy()
                        times[mode].append(time.perf_counter() - t0)
                rec["seconds"] = {m: sorted(v)[len(v) // 2] for m, v in times.items() if v}
                res[pass_name] = rec
        out[name] = res
    return out


# ---- main -----------------------------------------------------------------------------------------------------
def git_commit():
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "metal_kernels", "csrc", ":(exclude)*.md"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + (" + uncommitted changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_worker(msl, args):
    with tempfile.TemporaryDirectory() as td:
        path = os.path.join(td, "out.json")
        env = dict(os.environ, TF_METAL_OPS_EMULATED_GPU="1", TF_METAL_OPS_EMULATED_GPU_MSL=msl,
                   TF_CPP_MIN_LOG_LEVEL="3")
        if args.workers:
            env["TF_METAL_OPS_EMULATED_GPU_WORKERS"] = str(args.workers)
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", path, "--log2-points", str(args.log2_points),
               "--acc-param", args.acc_param, "--repeats", str(args.repeats)]
        subprocess.run(cmd, check=True, env=env, cwd=tempfile.gettempdir())
        with open(path) as f:
            return json.load(f)


def fmt(v):
    return f"{v:,}"


def markdown(report) -> str:
    cfg, runs, ref = report["config"], report["runs"], report["reference"]
    L = cfg["n_levels"]
    lines = [
        "# Hash-grid backward: global atomic operations per level (emulated GPU)",
        "",
        f"{report['date']}, {report['cpu']} ({report['cores']} cores), emulated GPU with {report['workers']} worker "
        f"threads; kernels of commit {report['commit']}. Command:",
        "",
        "```bash",
        report["command"],
        "```",
        "",
        f"HashNeRF default config: D=3, L={L}, F={cfg['F']}, log2 T={cfg['log2_hashmap_size']}, N_min="
        f"{cfg['base_resolution']}, b={cfg['per_level_scale']:.4f} (finest 512), float32 table; "
        f"{fmt(report['points'])} points. The script's docstring defines every column. \"atomics\" = "
        "read-modify-write operations + compare-exchange attempts on device memory; MSL 2.4 is the CAS loop "
        "(attempts / failed attempts). Counts are exact; the retries depend on the emulation's worker threads "
        "(threads of a threadgroup run one after another), not on a GPU.",
        "",
    ]
    for pass_name in PASSES:
        lines += [f"## {pass_name}", ""]
        lines += ["| points | MSL | kernel | launches | global atomics | CAS retries | atomic loads | threadgroup atomics |",
                  "|---|---|---|---|---|---|---|---|"]
        for pts in runs["3.0"]:
            for msl in MSL_VERSIONS:
                for kname, k in runs[msl][pts][pass_name]["kernels"].items():
                    g, tg = k["global"], k["threadgroup"]
                    lines.append(f"| {pts} | {msl} | {kname} | {k['launches']} | {fmt(g['rmw'] + g['cas'])} | "
                                 f"{fmt(g['cas_failed'])} | {fmt(g['load'])} | {fmt(tg['rmw'] + tg['cas'])} |")
        timed = [(pts, msl, runs[msl][pts][pass_name]["seconds"]) for pts in runs["3.0"] for msl in MSL_VERSIONS
                 if runs[msl][pts][pass_name].get("seconds")]
        if timed:
            lines += ["", "Emulation seconds of the whole pass (median), counting off / on: " +
                      "; ".join(f"{pts} MSL {msl}: {s['off']:.2f} / {s['on']:.2f}" for pts, msl, s in timed) + "."]
        lines.append("")
        for pts in runs["3.0"]:
            lines += [f"### {pass_name}, {pts} points: per level", "",
                      "| level | resolution | rows | MSL 3.0 atomics | MSL 2.4 CAS attempts | MSL 2.4 retries | scatter "
                      "| simd/c | simd |", "|---|---|---|---|---|---|---|---|---|"]
            tot = dict.fromkeys(("a3", "c4", "r4", "sc", "spc", "s"), 0)
            for lv in range(L):
                a = runs["3.0"][pts][pass_name]["levels"][lv]
                b = runs["2.4"][pts][pass_name]["levels"][lv]
                r = ref[pts][lv]
                vals = dict(a3=a["rmw"] + a["cas"], c4=b["rmw"] + b["cas"], r4=b["cas_failed"], sc=r["scatter"],
                            spc=r["simd_per_corner"], s=r["simd"])
                for k2, v in vals.items():
                    tot[k2] += v
                lines.append(f"| {lv} | {cfg['resolutions'][lv]} | {fmt(cfg['level_sizes'][lv])} | {fmt(vals['a3'])} | "
                             f"{fmt(vals['c4'])} | {fmt(vals['r4'])} | {fmt(vals['sc'])} | {fmt(vals['spc'])} | "
                             f"{fmt(vals['s'])} |")
            lines.append(f"| all | | {fmt(sum(cfg['level_sizes']))} | {fmt(tot['a3'])} | {fmt(tot['c4'])} | "
                         f"{fmt(tot['r4'])} | {fmt(tot['sc'])} | {fmt(tot['spc'])} | {fmt(tot['s'])} |")
            lines.append("")
    base = report.get("baseline")
    if base:
        lines += ["## Before → after", "",
                  f"Global atomics at MSL 3.0 (read-modify-writes + CAS attempts) per level: the baseline "
                  f"`{os.path.relpath(base['path'], ROOT)}` ({base['date']}, kernels of commit {base['commit']}, "
                  f"{base['workers']} workers) against this run.", ""]
        sets = list(runs["3.0"])
        for pass_name in PASSES:
            head = " | ".join(f"{pts} before | {pts} after | after / before" for pts in sets)
            lines += [f"### {pass_name}", "", f"| level | {head} |", "|---|" + "---|---|---|" * len(sets)]
            cols = []
            for pts in sets:
                before = [b["rmw"] + b["cas"] for b in base["runs"]["3.0"][pts][pass_name]["levels"]]
                after = [a["rmw"] + a["cas"] for a in runs["3.0"][pts][pass_name]["levels"]]
                cols.append((before + [sum(before)], after + [sum(after)]))
            for i, name in enumerate([*map(str, range(L)), "all"]):
                cells = []
                for before, after in cols:
                    vb, va = before[i], after[i]
                    cells.append(f"{fmt(vb)} | {fmt(va)} | " + (f"{va / vb:.3f}" if vb else "-"))
                lines.append(f"| {name} | " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines)


def load_baseline(path, report):
    """The earlier run at `path` when it measured the same config and points, else None (and says why)."""
    if not path or not os.path.isfile(path):
        return None
    with open(path) as f:
        base = json.load(f)
    if base.get("config") != report["config"] or base.get("points") != report["points"]:
        print(f"baseline {path}: another config or point count; no before/after table", flush=True)
        return None
    base["path"] = path
    return base


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log2-points", type=int, default=18)
    ap.add_argument("--quick", action="store_true", help="2^14 points, one timing repeat (a smoke run)")
    ap.add_argument("--workers", type=int, default=0, help="emulated GPU worker threads (default: all CPUs)")
    ap.add_argument("--repeats", type=int, default=0,
                    help="also time each pass with counting off and on, this many times (median; emulation seconds)")
    ap.add_argument("--acc-param", default="acc", help="the gradient kernels' accumulator parameter name")
    ap.add_argument("--md", default=os.path.join(HERE, "hash_grid_atomics.md"), help="'' to skip")
    ap.add_argument("--json", default=os.path.join(HERE, "hash_grid_atomics.json"), help="'' to skip")
    ap.add_argument("--baseline", default=os.path.join(HERE, "hash_grid_atomics_before.json"),
                    help="an earlier run's JSON: adds a before/after table when config and points match ('' to skip)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.log2_points = 14
    if args.worker:
        res = worker(args)
        with open(args.worker, "w") as f:
            json.dump(res, f)
        return
    import datetime

    import numpy as np

    cpu = cpu_model()
    print(f"CPU: {cpu} ({os.cpu_count()} cores)", flush=True)
    cfg = hash_config()
    runs = {}
    for msl in MSL_VERSIONS:
        print(f"=== MSL {msl}: emulated GPU worker process", flush=True)
        runs[msl] = run_worker(msl, args)
    print("=== reference counts from the positions", flush=True)
    ref = {name: reference_counts(x, cfg) for name, x in point_sets(args.log2_points).items()}
    cmd = "python bench/hash_grid_atomics.py" + (" --quick" if args.quick else
                                                 f" --log2-points {args.log2_points}" if args.log2_points != 18 else "")
    cmd += f" --workers {args.workers}" if args.workers else ""
    cmd += f" --repeats {args.repeats}" if args.repeats and not args.quick else ""
    report = {
        "date": datetime.date.today().isoformat(), "cpu": cpu, "cores": os.cpu_count(),
        "workers": args.workers or os.cpu_count(), "commit": git_commit(), "command": cmd,
        "points": 1 << args.log2_points,
        "config": {"n_levels": cfg.n_levels, "F": cfg.n_features_per_level, "log2_hashmap_size": cfg.log2_hashmap_size,
                   "base_resolution": cfg.base_resolution, "per_level_scale": cfg.per_level_scale,
                   "resolutions": list(cfg.resolutions), "level_sizes": list(cfg.level_sizes)},
        "runs": runs, "reference": ref,
    }
    report["baseline"] = load_baseline(args.baseline, report)
    md = markdown(report)
    print(md)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md + "\n")
    if args.json:
        with open(args.json, "w") as f:
            saved = {k: v for k, v in report.items() if k != "baseline"}
            json.dump(saved, f, indent=1, default=lambda o: o.item() if isinstance(o, np.generic) else str(o))
            f.write("\n")


if __name__ == "__main__":
    main()
