"""Runs every benchmark and writes bench/results.json, bench/results.md and bench/results.png.

    python bench/run_all.py [--nerf-minutes 10] [--quick]

Benchmarks (each a script of its own, run in a fresh process, each printing ratios against baselines measured in
the same run): hash grid (bench/hash_grid.py), rendering ops (bench/render_ops.py), packed (ragged) rendering ops
(bench/render_packed.py), ray marching through an occupancy grid (bench/ray_march.py), call overhead
(bench/call_overhead.py), inline Metal kernels on the CPU (bench/metal_kernel.py: call overhead, compile time,
speed against tf.exp and the package's zero_out), the NeRF comparison at equal wall-clock budget (examples/nerf/compare.py), and the
Metal-emulating GPU vs the CPU kernels (bench/emulated_gpu.py; its own subprocess sets TF_METAL_OPS_EMULATED_GPU=1;
skipped, and said so, without clang++ >= 16; --skip-emulated-gpu leaves it out).
--quick shrinks sizes and budgets for a smoke run (the numbers are then not the reported ones).
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(name, cmd, json_path):
    print(f"=== {name}: {' '.join(cmd)}", flush=True)
    subprocess.run([sys.executable, *cmd], check=True, cwd=tempfile.gettempdir())
    with open(json_path) as f:
        return json.load(f)


def machine():
    import tensorflow as tf

    import tf_metal_ops

    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    return {"date": datetime.date.today().isoformat(), "platform": platform.platform(), "cpu": cpu,
            "cores": os.cpu_count(), "python": platform.python_version(), "tensorflow": tf.__version__,
            "tf_metal_ops": tf_metal_ops.__version__, "op_threads": tf_metal_ops.get_num_threads()}


def nerf_provenance(nerf):
    """Per NeRF variant: None when measured by this run_all.py run, else (date, command) of the earlier run its row
    comes from: the whole comparison when run_all.py was given --nerf-json (nerf["reused"]), or one variant that
    examples/nerf/compare.py --reuse took from an earlier run (its "reused" flag)."""
    whole = nerf.get("reused")
    out = {}
    for name, v in nerf["variants"].items():
        if v.get("reused"):
            out[name] = (v.get("measured", "date not recorded"), v.get("command", "command not recorded"))
        elif whole:
            out[name] = (v.get("measured") or whole["date"], whole["command"])
        else:
            out[name] = None
    return out


def load_reused_nerf(path):
    """An earlier compare.json, marked as not measured by this run: results["reused"] keeps where it came from (its
    own date and command when compare.py recorded them; older files do not, then the file's date stands in)."""
    with open(path) as f:
        nerf = json.load(f)
    mtime = datetime.datetime.fromtimestamp(os.path.getmtime(path), datetime.timezone.utc)
    nerf["reused"] = {"path": os.path.abspath(path),
                      "date": nerf.get("date") or f"{mtime.isoformat(timespec='seconds')} (date of {path})",
                      "command": nerf.get("command") or "python examples/nerf/compare.py (arguments not recorded)"}
    return nerf


def op_table(title, keys, rows, baseline="plain graph"):
    """Markdown lines: per row the `keys` columns, then op vs the plain-TF graph and XLA times (median_ms: op, tf,
    tf+xla; a row without tf+xla did not compile under XLA)."""
    lines = [title + "\n", "| " + " | ".join(keys) + f" | op (ms) | {baseline} (ms) | XLA (ms) | graph / op | XLA / op |",
             "|---" * (len(keys) + 5) + "|"]
    for row in rows:
        t = row["median_ms"]
        xla, xla_ratio = ((f"{t['tf+xla']:.1f}", f"{t['tf+xla'] / t['op']:.2f}x") if "tf+xla" in t
                          else ("does not compile", "-"))
        lines.append("| " + " | ".join(str(row[k]) for k in keys) + f" | {t['op']:.1f} | {t['tf']:.1f} | {xla} | "
                     f"{t['tf'] / t['op']:.2f}x | {xla_ratio} |")
    lines.append("")
    return lines


def markdown(results):
    m = results["machine"]
    nerf_src = nerf_provenance(results["nerf"]) if "nerf" in results else {}
    reused = any(v is not None for v in nerf_src.values())
    lines = ["# Benchmark results\n",
             f"{m['date']}, {m['cpu']} ({m['cores']} cores), {m['platform']}, Python {m['python']}, "
             f"TensorFlow {m['tensorflow']}, tf-metal-ops {m['tf_metal_ops']} ({m['op_threads']} op threads). "
             "Medians of several runs in one process; ratios against baselines measured in the same run"
             + (", except the NeRF rows marked *reused*: they come from an earlier run (date and command given) "
                "and were not measured in this one.\n" if reused else ".\n")]
    if "hash_grid" in results:
        r = results["hash_grid"]
        c = r["config"]
        dtypes = list(r["median_ms"])
        lines += [f"## Hash grid (D=3, L={c['n_levels']}, F={c['n_features_per_level']}, "
                  f"log2 T={c['log2_hashmap_size']}, N_min={c['base_resolution']}, b={c['per_level_scale']}, "
                  f"{c['points']} points)\n",
                  *([f"fwd+bwd table gradient: {r['table_gradient']}.\n"] if "table_gradient" in r else []),
                  "| median (ms) | " + " | ".join(f"{d} table" for d in dtypes) + " |", "|---" * (len(dtypes) + 1) + "|"]
        for key in r["median_ms"][dtypes[0]]:
            lines.append(f"| {key} | " + " | ".join(f"{r['median_ms'][d].get(key, float('nan')):.1f}" for d in dtypes)
                         + " |")
        lines += ["", "| speed-up of the op | dtype | vs plain tf.function | vs XLA |", "|---|---|---|---|"]
        lines += [f"| {row['mode']} | {row['dtype']} | {row['speedup_vs_graph']:.2f}x | {row['speedup_vs_xla']:.2f}x |"
                  for row in r["summary"]]
        lines.append("")
    if "render_ops" in results:
        c = results["render_ops"]["config"]
        lines += op_table(f"## Rendering ops (R={c['rays']}, S={c['samples']}, C={c['channels']})",
                          ["op", "mode"], results["render_ops"]["rows"])
    if "render_packed" in results:
        c = results["render_packed"]["config"]
        lines += op_table(f"## Packed rendering ops (N={c['samples']} samples, R={c['rays']} rays, {c['min_per_ray']}.."
                          f"{c['max_per_ray']} per ray, C={c['channels']})", ["op", "mode"],
                          results["render_packed"]["rows"], baseline="segment-op graph")
    if "ray_march" in results:
        c = results["ray_march"]["config"]
        lines += op_table(f"## Ray marching ({c['resolution']}^3 grid, sphere shell occupied, step {c['step_size']}, "
                          f"max_samples {c['max_samples']})", ["rays", "samples"], results["ray_march"]["rows"])
    if "call_overhead" in results:
        r = results["call_overhead"]
        lines += ["## Call overhead (eager, 4-element tensor)\n", "| call | µs | vs tf.identity |", "|---|---|---|"]
        base = r["median_us"]["tf.identity"]
        lines += [f"| {k} | {v:.2f} | {v / base:.2f}x |" for k, v in r["median_us"].items()]
        lines.append("")
    if "metal_kernel" in results:
        r = results["metal_kernel"]
        over = r["call_overhead_us"]
        lines += ["## Inline Metal kernels on the CPU (tf_metal_ops.metal_kernel)\n",
                  "| call (4-element tensor) | µs | vs tf.identity |", "|---|---|---|"]
        for k, v in over.items():
            base = over["eager tf.identity" if k.startswith("eager") else "tf.function tf.identity"]
            lines.append(f"| {k} | {v:.2f} | {v / base:.2f}x |")
        c = r["compile"]
        lines += ["", f"Compile (first call of a new kernel, fresh process): cold {c['cold_s']:.2f} s, from the disk "
                  f"cache {c['cached_s'] * 1e3:.0f} ms (the first kernel of an empty cache {c['first_ever_s']:.2f} s).",
                  "", f"| {r['size']} floats | inline (ms) | baseline (ms) | inline / baseline |", "|---|---|---|---|"]
        lines += [f"| {k} vs {v['baseline']} | {v['inline_ms']:.2f} | {v['baseline_ms']:.2f} | {v['ratio']:.2f}x |"
                  for k, v in r["cpu_speed"].items()]
        if "simd" in r:
            sd = r["simd"]
            lines += ["", f"SIMD-group calls (fibers): {sd['threads']} threads x {sd['calls_per_thread']} simd_sum "
                      f"calls {sd['simd_ms']:.2f} ms, the loop without the call {sd['plain_ms']:.2f} ms: "
                      f"{sd['ns_per_call']:.0f} ns per thread and call."]
        lines.append("")
    if "emulated_gpu" in results:
        r = results["emulated_gpu"]
        lines.append("## Metal-emulating GPU vs CPU kernels (seconds per op call)\n")
        if "skipped" in r:
            lines += [f"Skipped: {r['skipped']}", ""]
        else:
            lines += [f"/GPU:0 with TF_METAL_OPS_EMULATED_GPU=1 (the GPU host code and the Metal kernels run on the "
                      f"CPU, one C++ call per kernel thread; not a GPU speed) vs the same op on /CPU:0, both in one "
                      f"process; medians of {r['repeats']} runs (min..max).\n",
                      "| op | size | emulated /GPU:0 (s) | CPU kernels (s) | emulated / CPU |", "|---|---|---|---|---|"]
            for row in r["rows"]:
                g, c = row["emulated_gpu"], row["cpu"]
                lines.append(f"| {row['op']} | {row['size']} | {g['median_s']:.4f} ({g['min_s']:.4f}..{g['max_s']:.4f}) | "
                             f"{c['median_s']:.4f} ({c['min_s']:.4f}..{c['max_s']:.4f}) | {row['ratio']:.1f}x |")
            lines.append("")
    if "nerf" in results:
        r = results["nerf"]
        fracs = list(next(iter(r["variants"].values()))["psnr_at"])
        lines += [f"## NeRF, equal {r['minutes']:g}-minute training budget (built-in scene)\n",
                  "| variant | steps | s/epoch | ms/step | " +
                  " | ".join(f"test PSNR @ {float(f) * r['minutes']:g} min" for f in fracs) + " | measured |",
                  "|---" * (5 + len(fracs)) + "|"]
        for k, v in r["variants"].items():
            at = ("-" if v["psnr_at"][f] is None else f"{v['psnr_at'][f]:.2f}" for f in fracs)
            src = nerf_src[k]
            when = "this run" if src is None else f"*reused*: {src[0]}, `{src[1]}`"
            lines.append(f"| {k} | {v['steps']} | {v['seconds_per_epoch']:.1f} | {v['ms_per_step']:.0f} | "
                         + " | ".join(at) + f" | {when} |")
        reach = r["variants"].get("hash-op", {}).get("seconds_to_puretf_final")
        if reach:
            lines.append(f"\nhash-op reaches hash-puretf's {r['minutes']:g}-minute PSNR after {reach / 60:.1f} min.")
        lines.append("")
    return "\n".join(lines)


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, values = [], []
    for row in results.get("render_ops", {}).get("rows", []):
        t = row["median_ms"]
        labels.append(f"{row['op']}\n{row['mode']}")
        values.append((t["tf"] / t["op"], t["tf+xla"] / t["op"]))
    for row in results.get("render_packed", {}).get("rows", []):
        t = row["median_ms"]
        labels.append(f"{row['op']}\n{row['mode']}")
        values.append((t["tf"] / t["op"], t["tf+xla"] / t["op"] if "tf+xla" in t else 0.0))
    for row in results.get("hash_grid", {}).get("summary", []):
        labels.append(f"hash_grid {row['dtype']}\n{row['mode']}")
        values.append((row["speedup_vs_graph"], row["speedup_vs_xla"]))
    if not labels:
        return
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(labels)), 4))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], [v[0] for v in values], 0.4, label="vs plain tf.function")
    ax.bar([x + 0.2 for x in xs], [v[1] for v in values], 0.4, label="vs XLA")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("speed-up of the op (×)")
    ax.set_title("tf-metal-ops CPU kernels vs pure TensorFlow (same run)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nerf-minutes", type=float, default=10.0)
    p.add_argument("--skip-nerf", action="store_true")
    p.add_argument("--nerf-json", help="use this compare.json (from examples/nerf/compare.py) instead of rerunning; "
                   "its rows are marked reused, with their date and command, in results.md")
    p.add_argument("--skip-emulated-gpu", action="store_true")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=HERE)
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="tfmo-bench-")
    results = {"machine": machine()}
    q = args.quick
    results["call_overhead"] = run("call overhead", [os.path.join(HERE, "call_overhead.py"), "--json",
                                   os.path.join(tmp, "call.json")] + (["--calls", "500", "--repeats", "3"] if q else []),
                                   os.path.join(tmp, "call.json"))
    results["metal_kernel"] = run("inline Metal kernels", [os.path.join(HERE, "metal_kernel.py"), "--json",
                                  os.path.join(tmp, "metal_kernel.json")]
                                  + (["--calls", "300", "--repeats", "3", "--compile-runs", "1", "--size", "65536",
                                      "--simd-size", "8192"]
                                     if q else []), os.path.join(tmp, "metal_kernel.json"))
    results["render_ops"] = run("render ops", [os.path.join(HERE, "render_ops.py"), "--json",
                                os.path.join(tmp, "render.json")] + (["--rays", "4096", "--repeats", "3"] if q else []),
                                os.path.join(tmp, "render.json"))
    results["render_packed"] = run("packed rendering ops", [os.path.join(HERE, "render_packed.py"), "--json",
                                   os.path.join(tmp, "render_packed.json")]
                                   + (["--samples", "16384", "--repeats", "3"] if q else []),
                                   os.path.join(tmp, "render_packed.json"))
    results["ray_march"] = run("ray march", [os.path.join(HERE, "ray_march.py"), "--json",
                               os.path.join(tmp, "march.json")]
                               + (["--rays", "4096", "--resolution", "64", "--repeats", "3"] if q else []),
                               os.path.join(tmp, "march.json"))
    results["hash_grid"] = run("hash grid", [os.path.join(HERE, "hash_grid.py"), "--json",
                               os.path.join(tmp, "hash.json")] + (["--points", "16384", "--repeats", "3"] if q else []),
                               os.path.join(tmp, "hash.json"))
    if not args.skip_emulated_gpu:
        results["emulated_gpu"] = run("emulated GPU", [os.path.join(HERE, "emulated_gpu.py"), "--json",
                                      os.path.join(tmp, "emu.json")] + (["--quick", "--repeats", "3"] if q else []),
                                      os.path.join(tmp, "emu.json"))
    if args.nerf_json:
        results["nerf"] = load_reused_nerf(args.nerf_json)
    elif not args.skip_nerf:
        out = os.path.join(tmp, "nerf")
        minutes = 0.5 if q else args.nerf_minutes
        results["nerf"] = run("NeRF comparison", [os.path.join(ROOT, "examples", "nerf", "compare.py"),
                              "--minutes", str(minutes), "--out", out], os.path.join(out, "compare.json"))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(markdown(results))
    plot(results, os.path.join(args.out, "results.png"))
    print(f"wrote {os.path.join(args.out, 'results.md')}, results.json, results.png")


if __name__ == "__main__":
    main()
