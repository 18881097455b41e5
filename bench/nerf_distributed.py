#!/usr/bin/env python
"""NeRF with the occupancy sampler: 1 process on K cores against N workers on K/N cores each (launch_local.py),
the same global sample budget, on the built-in scene (examples/nerf/train.py defaults otherwise).

    python bench/nerf_distributed.py                        # 1 pair: 1 x 2 cores for 1 min, 2 x 1 core for 1.5 min
    python bench/nerf_distributed.py --pairs 2 --single-minutes 1.5

Each pair runs the single process, then the workers (back to back; --reverse swaps the order). Prints the CPU model,
the load average before each run, per run the median and mean step time (every timed step of the chief; grid
updates included), steps/s, the test PSNR at each evaluation against training time and the final PSNR on all test
views, the ratio of the median step times and the targets: workers' step time <= 2x the single
process's, and the workers' final PSNR >= the single process's. Outputs under --out (default bench/out/nerf_distributed).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from bench_util import cpu_model  # noqa: E402

TRAIN = os.path.join(ROOT, "examples", "nerf", "train.py")
LAUNCH = os.path.join(ROOT, "examples", "nerf", "launch_local.py")


def run(cmd, log):
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if p.returncode != 0:
        with open(log) as f:
            sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n" + f.read()[-3000:])


def summary(name, out, load):
    with open(os.path.join(out, "metrics.json")) as f:
        m = json.load(f)
    st = m["step_seconds"]
    med = statistics.median(st)
    curve = [(round(e["train_seconds"], 1), round(e["test_psnr"], 2)) for e in m["evals"]]
    return dict(name=name, load_avg=load, steps=m["final"]["steps"], train_seconds=round(m["final"]["train_seconds"], 1),
                median_step_ms=round(1000 * med, 1), mean_step_ms=round(1000 * statistics.fmean(st), 1),
                steps_per_s=round(1 / med, 2), final_psnr=round(m["final"]["test_psnr"], 2),
                final_views=m["final"]["eval_views"], psnr_vs_train_s=curve,
                grid_update_ms_median=round(1000 * (m["final"].get("grid_update_seconds_median") or 0), 1),
                samples_per_ray_last_100=round(m["final"].get("samples_per_ray_last_100") or 0, 2),
                allreduce_bytes_per_step=m.get("cluster", {}).get("allreduce_bytes_per_step"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cores", type=int, default=2, help="cores in all (the single process's threads)")
    p.add_argument("--single-minutes", type=float, default=1.0)
    p.add_argument("--workers-minutes", type=float, default=1.5)
    p.add_argument("--reverse", action="store_true", help="workers first in each pair")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "nerf_distributed"))
    p.add_argument("train_args", nargs="*", help="extra train.py arguments (after --)")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs; workers {a.workers} x "
          f"{a.cores // a.workers} core(s) vs 1 process x {a.cores} cores", flush=True)
    common = ["--no-progress", *a.train_args]
    results = []
    for pair in range(a.pairs):
        single_out, multi_out = os.path.join(a.out, f"single-{pair}"), os.path.join(a.out, f"workers-{pair}")
        jobs = [("single", single_out, [sys.executable, TRAIN, "--minutes", str(a.single_minutes), *common,
                                        "--out", single_out]),
                ("workers", multi_out, [sys.executable, LAUNCH, "--workers", str(a.workers), "--cores-per-worker",
                                        str(a.cores // a.workers), "--", "--minutes", str(a.workers_minutes),
                                        *common, "--checkpoint-every", "0", "--out", multi_out])]
        for name, out, cmd in (jobs[::-1] if a.reverse else jobs):
            load = round(os.getloadavg()[0], 2)
            run(cmd, out + ".log")
            r = summary(name, out, load)
            r["pair"] = pair
            results.append(r)
            print(json.dumps(r), flush=True)
        s, w = results[-2:] if not a.reverse else results[-2:][::-1]
        ratio = w["median_step_ms"] / s["median_step_ms"]
        print(f"pair {pair}: workers / single median step time = {ratio:.2f} (target <= 2); final test PSNR "
              f"workers {w['final_psnr']} dB after {a.workers_minutes} min vs single {s['final_psnr']} dB after "
              f"{a.single_minutes} min (target: workers >= single)", flush=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(dict(cpu=cpu_model(), results=results), f, indent=1)


if __name__ == "__main__":
    main()
