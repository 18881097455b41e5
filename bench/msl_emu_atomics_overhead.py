"""What atomic counting costs the MSL emulation (csrc/msl_emu/include/msl_emu/atomic_counts.h), per kernel launch.

    python bench/msl_emu_atomics_overhead.py [--threads 22] [--rounds 9] [--md bench/msl_emu_atomics_overhead.md]

Two -O2 builds of the kernel-by-name launch driver (tests/msl_emu/launch/launch_driver.cc over
csrc/emulated_gpu/kernel_launch.cc, the emulated GPU's launcher) with the kernels of
tests/msl_emu/launch/atomics_fixture.metal: one with -DMSL_EMU_COUNT_ATOMICS=0 (the counting compiled out: the
reference), one as the emulated GPU is built (counting compiled in, switched per launch). Kernels, 2^22 threads,
groups of 256, one worker thread:
  plain_double  y[i] = 2 x[i]: no atomics;
  atomic_adds   4 atomic_fetch_add per thread on a 2^20-word buffer (an atomics-only kernel: the worst case).
Modes: "compiled out", "off" (compiled in, not counting: the state of every launch outside count_atomics), "on"
(counting, the buffers as ranges). The figure is CPU time (user + system) per launch: the CPU time of a driver run
with 6 launches minus one with 1 launch, divided by 5 (process start and allocation cancel), median over --rounds
rounds with the modes interleaved. CPU time rather than wall time because the machine may be shared.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_util import cpu_model

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FIXTURE = ROOT / "tests" / "msl_emu" / "launch" / "atomics_fixture.metal"
DRIVER = ROOT / "tests" / "msl_emu" / "launch" / "launch_driver.cc"


def load_glue():
    """tf_metal_ops/msl_emu.py of this checkout, by path (standard library only; the package's __init__ imports
    TensorFlow)."""
    spec = importlib.util.spec_from_file_location("tfmo_msl_emu_for_overhead_bench", ROOT / "tf_metal_ops" / "msl_emu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


glue = load_glue()


def build(out: Path, defines: list[str]) -> Path:
    clang = os.environ.get("TF_METAL_OPS_CLANGXX") or shutil.which("clang++-16")
    if not clang:
        raise SystemExit("needs clang++-16 (apt-get install clang-16) or TF_METAL_OPS_CLANGXX")
    units = glue.generate([FIXTURE], out / "glue", root=ROOT)
    inc = [f"-I{d}" for d in glue.include_dirs(root=ROOT)]
    flags = ["-O2", "-DNDEBUG", *defines]
    objs = []
    for src, extra in [(u.source, list(u.flags)) for u in units] + [(glue.launch_source(ROOT), inc), (DRIVER, inc)]:
        obj = out / (src.stem + ".o")
        subprocess.run([clang, "-x", "c++", *glue.base_flags(), *flags, *extra, "-c", str(src), "-o", str(obj)],
                       check=True)
        objs.append(str(obj))
    exe = out / "launch_driver"
    subprocess.run([clang, *objs, "-o", str(exe), "-lpthread"], check=True)
    return exe


def script(kernel: str, n: int, count: bool, launches: int, args_file: Path) -> str:
    lines = ["atomics on"] if count else []
    if kernel == "plain_double":
        lines += ["kernel plain_double", f"grid threads {n} 1 1", "group 256 1 1", f"buf 0 float {4 * n} - -",
                  f"buf 1 float {4 * n} - -"]
    else:
        lines += ["kernel atomic_adds", f"grid threads {n} 1 1", "group 256 1 1", f"buf 0 uint {4 << 20} - -",
                  f"bytes 1 16 {args_file}"]
    return "\n".join(lines + ["launch"] * launches) + "\n"


def cpu_seconds(exe: Path, text: str) -> float:
    env = dict(os.environ, TF_METAL_OPS_EMULATED_GPU_WORKERS="1")
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run([str(exe)], input=text, text=True, env=env, capture_output=True, check=False)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0 or "ERR" in res.stdout:
        raise SystemExit(f"{exe} failed:\n{res.stdout}{res.stderr}")
    return (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=22, help="log2 of the threads per launch")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--md", default=str(HERE / "msl_emu_atomics_overhead.md"), help="'' to skip")
    args = ap.parse_args()
    n = 1 << args.threads
    cpu = cpu_model()
    print(f"CPU: {cpu} ({os.cpu_count()} cores)", flush=True)
    with tempfile.TemporaryDirectory(prefix="tfmo-atomics-overhead-") as td:
        td = Path(td)
        (td / "out").mkdir(), (td / "in").mkdir()
        exes = {"compiled out": build(td / "out", ["-DMSL_EMU_COUNT_ATOMICS=0"]), "in": build(td / "in", [])}
        args_file = td / "args.bin"
        args_file.write_bytes(struct.pack("<IIII", n, 4, 1 << 20, 0xFFFFFFFF))
        modes = {"compiled out": (exes["compiled out"], False), "off": (exes["in"], False), "on": (exes["in"], True)}
        results = {}
        for kernel in ("plain_double", "atomic_adds"):
            per = {m: [] for m in modes}
            for _ in range(args.rounds):
                for m, (exe, count) in modes.items():
                    one = cpu_seconds(exe, script(kernel, n, count, 1, args_file))
                    six = cpu_seconds(exe, script(kernel, n, count, 6, args_file))
                    per[m].append((six - one) / 5 * 1e3)
            results[kernel] = {m: statistics.median(v) for m, v in per.items()}
    ref = "compiled out"
    lines = ["# Atomic counting: what it costs the MSL emulation", "",
             f"{cpu} ({os.cpu_count()} cores), one worker thread, 2^{args.threads} threads per launch, median of "
             f"{args.rounds} rounds. Command: `python bench/msl_emu_atomics_overhead.py`; the script's docstring says "
             "what is measured.", "",
             "| kernel | compiled out (ms) | off (ms) | on (ms) | off / compiled out | on / compiled out |",
             "|---|---|---|---|---|---|"]
    for kernel, r in results.items():
        lines.append(f"| {kernel} | {r[ref]:.1f} | {r['off']:.1f} | {r['on']:.1f} | {r['off'] / r[ref]:.3f} | "
                     f"{r['on'] / r[ref]:.3f} |")
    md = "\n".join(lines)
    print(md)
    if args.md:
        Path(args.md).write_text(md + "\n")


if __name__ == "__main__":
    main()
