#!/usr/bin/env python
"""Train the NeRF variants with the same training-time budget and compare them.

    python examples/nerf/compare.py --minutes 10 --out runs/compare

Runs, one after another (each in its own process, so none inherits another's threads or compiled functions):

* ``mlp``               — the keras.io-style positional-encoding MLP (XLA-compiled train step);
* ``hash-op-occupancy`` — the hash-grid model with the tf_metal_ops kernels and the occupancy sampler (ray_march
                          through an occupancy grid, volume_render_packed, batches of a fixed sample budget);
* ``hash-op``           — the same model with the kernels and the uniform sampler (64 samples on each of 4096 rays);
* ``hash-puretf``       — the same hash-grid model in pure TF (the package's pure-TF hash grid, plain-TF
                          compositing, uniform sampler) with an XLA-compiled train step: the strongest thing a user can
                          write without the custom ops.

Writes ``OUT/<variant>/`` (each run's train.py outputs), ``OUT/compare.png`` (test PSNR vs training time) and
``OUT/compare.md`` + ``OUT/compare.json`` (final PSNR, PSNR at fractions of the budget, s/epoch, ms/step).
Extra arguments after ``--`` go to every train.py run (e.g. ``-- --data lego/ --downscale 8``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys

VARIANTS = {
    "mlp": ["--model", "mlp"],
    "hash-op-occupancy": ["--model", "hash", "--impl", "op", "--sampler", "occupancy"],
    "hash-op": ["--model", "hash", "--impl", "op", "--sampler", "uniform"],
    "hash-puretf": ["--model", "hash", "--impl", "pure_tf", "--sampler", "uniform"],
}


def psnr_at(evals, seconds, slack):
    """Test PSNR of the last evaluation at or before ``seconds`` of training (None if there is none). An evaluation
    due at ``seconds`` runs after the step that crosses it, so up to ``slack`` seconds late counts as on time."""
    before = [e for e in evals if e["train_seconds"] <= seconds + slack]
    return before[-1]["test_psnr"] if before else None


def time_to_reach(evals, target):
    """Training seconds of the first evaluation with test PSNR ≥ ``target`` (None if none reaches it)."""
    hit = [e["train_seconds"] for e in evals if e["test_psnr"] >= target]
    return hit[0] if hit else None


def final_samples_per_ray(metrics):
    """Mean samples per ray over the last 10 % of a run's steps (None for runs that did not record them)."""
    spr = metrics.get("samples_per_ray")
    if not spr:
        return None
    tail = spr[-max(1, len(spr) // 10):]
    return sum(tail) / len(tail)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "examples/nerf/compare.py", *argv])
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description="Same-budget comparison of the NeRF variants")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--out", default="runs/compare")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {list(VARIANTS)}")
    p.add_argument("--eval-every", type=float, default=None, help="seconds (default: budget / 20)")
    p.add_argument("--eval-views", type=int, default=16,
                   help="test views of every evaluation (the same views each time, so the curves are comparable)")
    p.add_argument("--progress", action="store_true", help="show each run's tqdm bar")
    p.add_argument("--reuse", action="store_true",
                   help="variants whose OUT/<variant>/metrics.json holds a finished run are not run again")
    args = p.parse_args(argv)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    budget = args.minutes * 60
    eval_every = args.eval_every or budget / 20
    train_py = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")
    os.makedirs(args.out, exist_ok=True)

    results, provenance = {}, {}
    for name in names:
        out = os.path.join(args.out, name)
        cmd = [sys.executable, train_py, *VARIANTS[name], "--minutes", str(args.minutes), "--eval-every",
               str(eval_every), "--eval-views", str(args.eval_views), "--final-views", str(args.eval_views),
               "--out", out, *([] if args.progress else ["--no-progress"]), *extra]
        metrics_path = os.path.join(out, "metrics.json")
        if args.reuse and os.path.isfile(metrics_path):
            with open(metrics_path) as f:
                results[name] = json.load(f)
            if "final" in results[name] and results[name]["config"]["minutes"] == args.minutes:
                print(f"=== {name}: reusing {metrics_path}", flush=True)
                mtime = datetime.datetime.fromtimestamp(os.path.getmtime(metrics_path), datetime.timezone.utc)
                provenance[name] = dict(reused=True, measured=mtime.isoformat(timespec="seconds"),
                                        command=f"reused {metrics_path} (written by an earlier compare.py run)")
                continue
        print(f"=== {name}: {' '.join(cmd[1:])}", flush=True)
        r = subprocess.run(cmd)
        if r.returncode != 0:
            print(f"error: the {name} run failed (exit code {r.returncode})", file=sys.stderr)
            raise SystemExit(1)
        with open(metrics_path) as f:
            results[name] = json.load(f)
        provenance[name] = dict(reused=False, measured=started,
                                command=shlex.join(["python", "examples/nerf/train.py", *cmd[2:]]))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, m in results.items():
        ev = m["evals"]
        ax.plot([e["train_seconds"] / 60 for e in ev], [e["test_psnr"] for e in ev], "o-", label=name)
    ax.set(xlabel="training time (min)", ylabel="test PSNR (dB)",
           title=f"NeRF, equal {args.minutes:g}-minute budget ({results[names[0]]['dataset'].split(':')[0]})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "compare.png"), dpi=110)
    plt.close(fig)

    fracs = (0.2, 0.5, 1.0)
    rows, table = [], {}
    header = ("| variant | params | steps | epochs | s/epoch | ms/step | samples/ray | " +
              " | ".join(f"PSNR @ {f * args.minutes:g} min" for f in fracs) + " |")
    rows += [header, "|" + "---|" * (7 + len(fracs))]
    for name, m in results.items():
        fm = m["final"]
        at = [psnr_at(m["evals"][:-1], f * budget, 2 * fm["seconds_per_step"]) if f < 1 else fm["test_psnr"]
              for f in fracs]
        spr = final_samples_per_ray(m)
        table[name] = dict(n_params=m["n_params"], steps=fm["steps"], epochs=fm["epochs"], samples_per_ray=spr,
                           seconds_per_epoch=fm["seconds_per_epoch"], ms_per_step=1000 * fm["seconds_per_step"],
                           final_test_psnr=fm["test_psnr"], final_eval_views=fm["eval_views"],
                           psnr_at={f"{f:g}": v for f, v in zip(fracs, at)}, **provenance[name])
        rows.append(f"| {name} | {m['n_params']:,} | {fm['steps']} | {fm['epochs']:.2f} | "
                    f"{fm['seconds_per_epoch']:.1f} | {1000 * fm['seconds_per_step']:.0f} | "
                    f"{'-' if spr is None else f'{spr:.1f}'} | " +
                    " | ".join("-" if v is None else f"{v:.2f}" for v in at) + " |")
    notes = []
    if "hash-op" in table and "mlp" in table:
        t = table
        notes.append(f"hash-op vs mlp: {t['hash-op']['final_test_psnr'] - t['mlp']['final_test_psnr']:+.2f} dB; "
                     f"time per epoch mlp / hash-op = "
                     f"{t['mlp']['seconds_per_epoch'] / t['hash-op']['seconds_per_epoch']:.2f}x")
    if "hash-op" in table and "hash-puretf" in table:
        t = table
        notes.append(f"hash-op vs hash-puretf (XLA): {t['hash-op']['final_test_psnr'] - t['hash-puretf']['final_test_psnr']:+.2f}"
                     f" dB; time per epoch puretf / op = "
                     f"{t['hash-puretf']['seconds_per_epoch'] / t['hash-op']['seconds_per_epoch']:.2f}x")
        target = t["hash-puretf"]["final_test_psnr"]
        reach = time_to_reach(results["hash-op"]["evals"], target)
        t["hash-op"]["seconds_to_puretf_final"] = reach
        notes.append(f"hash-op reaches hash-puretf's final {target:.2f} dB after "
                     + (f"{reach / 60:.1f} min of training ({budget / reach:.1f}x sooner)" if reach else
                        "- (not within the budget)"))
    if "hash-op-occupancy" in table and "hash-op" in table:
        t = table
        occ, uni = t["hash-op-occupancy"], t["hash-op"]
        notes.append(f"hash-op-occupancy vs hash-op (uniform sampler): {occ['final_test_psnr'] - uni['final_test_psnr']:+.2f}"
                     f" dB; ms/step {occ['ms_per_step']:.0f} vs {uni['ms_per_step']:.0f}")
        target = uni["final_test_psnr"]
        reach = time_to_reach(results["hash-op-occupancy"]["evals"], target)
        occ["seconds_to_uniform_final"] = reach
        notes.append(f"hash-op-occupancy reaches hash-op's final {target:.2f} dB after "
                     + (f"{reach / 60:.1f} min of training ({budget / reach:.1f}x sooner)" if reach else
                        "- (not within the budget)"))
    notes += [f"{name}: reused from an earlier run (measured {p['measured']}; {p['command']}), not measured by this "
              "comparison" for name, p in provenance.items() if p["reused"]]
    text = "\n".join(rows + [""] + notes) + "\n"
    with open(os.path.join(args.out, "compare.md"), "w") as f:
        f.write(f"Equal training-time budget: {args.minutes:g} min per variant (evaluations excluded).\n\n" + text)
    with open(os.path.join(args.out, "compare.json"), "w") as f:
        # date and command of this comparison; each variant says whether it was measured here or reused (--reuse)
        json.dump({"minutes": args.minutes, "date": started, "command": command, "variants": table}, f, indent=1)
    print(text, end="")
    print(f"plot: {os.path.join(args.out, 'compare.png')}")
    return table


if __name__ == "__main__":
    main()
