"""Line coverage of the backend-neutral GPU host code (csrc/gpu/*) when the tests run it on the emulated GPU.

    python dev/emulated_gpu_coverage.py [--min 90] [--tests FILE ...] [--missed] [--json OUT]
    python dev/emulated_gpu_coverage.py --profdata DIR/merged.profdata --library LIB.so   # report a run again
    python dev/emulated_gpu_coverage.py --backend metal [--missed]   # csrc/metal/*.mm on the Apple doubles

1. Builds the emulated GPU with TF_METAL_OPS_EMULATED_GPU_COVERAGE=1 (tf_metal_ops.emulated_gpu.build(): the host sources,
   csrc/gpu/*.cc + csrc/common/tfc.cc + csrc/emulated_gpu/direct_backend.cc, compiled and the kernel library linked with
   clang's source-based coverage, -fprofile-instr-generate -fcoverage-mapping, into a cache dir of its own).
2. Runs `pytest tests/test_emulated_gpu.py tests/test_emulated_gpu_errors.py` (default --tests) with
   TF_METAL_OPS_EMULATED_GPU_COVERAGE=1 and LLVM_PROFILE_FILE=<tmp>/%p-%m.profraw: every check subprocess that loads the
   kernel library writes its own profile when it exits (a process killed by a signal writes none).
3. Merges them with llvm-profdata-16 and reports with llvm-cov-16 (export, show) against the built kernel
   library: a per-file table of csrc/gpu/* and the total line coverage of csrc/gpu/*, then, separately,
   csrc/emulated_gpu/direct_backend.cc (the direct backend, not shipped to Macs) and the other instrumented files.
   --missed lists the lines no test executed (file:line ranges), for every csrc/gpu file.
4. --backend direct (default) prints the number of non-blank, non-comment lines of csrc/metal/*.mm, which that
   run does not execute. --backend metal builds and runs the metal backend over the Apple doubles instead
   (dev/apple_doubles/build.py; needs TF_METAL_OPS_OBJC_RUNTIME), runs the tests' metal cases
   (METAL_TESTS, -k metal) and reports csrc/metal/* (the .mm files and the
   headers they compile) beside csrc/gpu/*; --missed lists its
   unexecuted lines too.

Exit status: 0 when the measured total (csrc/gpu/* for direct, csrc/metal/* for metal) is >= --min percent
(default 90 / 85), 1 below it, 2 when pytest failed or no profile was written. Needs llvm-profdata-16 and llvm-cov-16 (`apt-get install llvm-16`; or set LLVM_PROFDATA /
LLVM_COV) and clang++-16 (like tests/test_emulated_gpu.py). The installed package is what gets built and tested:
reinstall (`pip install --no-build-isolation --no-deps .`) after changing csrc/.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_TESTS = ["tests/test_emulated_gpu.py", "tests/test_emulated_gpu_errors.py", "tests/test_emulated_gpu_host_layer.py"]
METAL_TESTS = ["tests/test_emulated_gpu.py", "tests/test_emulated_gpu_errors.py", "tests/test_metal_kernel.py",
               "tests/test_metal_backend.py"]
COVERAGE_ENV = {"TF_METAL_OPS_EMULATED_GPU_COVERAGE": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
BACKENDS = ("direct", "metal")


def tool(env_name: str, default: str) -> str:
    path = shutil.which(os.environ.get(env_name, default))
    if path is None:
        sys.exit(f"{default} not found: `apt-get install -y llvm-16` (or set {env_name})")
    return path


def build_coverage_library(backend: str = "direct") -> str:
    """Builds (cached) the coverage variant in a fresh process; returns the kernel library's path."""
    if backend == "metal":  # the backend directory of dev/apple_doubles/build.py
        code = ("import json, runpy; from tf_metal_ops import emulated_gpu as e; "
                f"d = runpy.run_path({os.path.join(ROOT, 'dev', 'apple_doubles', 'build.py')!r})['build'](); "
                "print(json.dumps({k: str(v) for k, v in e.prebuilt(d).items()}))")
    else:
        code = ("import json; from tf_metal_ops import emulated_gpu as e; "
                "print(json.dumps({k: str(v) for k, v in e.build(verbose=True, gpu_backend='direct').items()}))")
    env = dict(os.environ, **COVERAGE_ENV)
    env.pop("TF_METAL_OPS_EMULATED_GPU", None)
    env.setdefault("TF_METAL_OPS_CLANGXX", shutil.which("clang++-16") or "clang++-16")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=tempfile.gettempdir())
    if res.returncode != 0:
        sys.exit(f"building the coverage variant of the emulated GPU failed:\n{res.stdout}\n{res.stderr[-4000:]}")
    paths = json.loads(res.stdout.strip().splitlines()[-1])
    if "-coverage" not in os.path.basename(os.path.dirname(paths["kernels"])):
        sys.exit(f"{paths['kernels']} is not a coverage build: is the installed tf_metal_ops older than "
                 "TF_METAL_OPS_EMULATED_GPU_COVERAGE? Reinstall it (pip install --no-build-isolation --no-deps .)")
    return paths["kernels"]


def run_tests(tests: list[str], profile_dir: str, extra: list[str]) -> int:
    # The `pytest` script (not `python -m pytest`): the checkout must not shadow the installed package (conftest.py).
    pytest = shutil.which("pytest", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    cmd = [pytest] if pytest else [sys.executable, "-c", "import sys, pytest; sys.path.pop(0); sys.exit(pytest.main())"]
    cmd += ["-q", "-p", "no:cacheprovider", *tests, *extra]
    env = dict(os.environ, **COVERAGE_ENV, LLVM_PROFILE_FILE=os.path.join(profile_dir, "%p-%m.profraw"))
    print("$ " + " ".join(f"{k}={v}" for k, v in COVERAGE_ENV.items()) +
          f" LLVM_PROFILE_FILE={env['LLVM_PROFILE_FILE']} " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def merge(profdata_tool: str, profile_dir: str) -> str:
    raws = sorted(glob.glob(os.path.join(profile_dir, "*.profraw")))
    if not raws:
        print("no profile was written: did any test load the coverage build of the kernel library?", file=sys.stderr)
        sys.exit(2)
    out = os.path.join(profile_dir, "merged.profdata")
    subprocess.run([profdata_tool, "merge", "-sparse", *raws, "-o", out], check=True)
    print(f"merged {len(raws)} profiles into {out}")
    return out


def short(path: str) -> str:
    """csrc/... for the package's sources (compiled from the installed package data or the checkout)."""
    i = path.rfind("csrc/")
    return path[i:] if i >= 0 else path


def objects(library: str, extra: list[str]) -> list[str]:
    """llvm-cov's binaries: the kernel library, then -object for each other instrumented library (op kit builds)."""
    return [library, *[f"-object={e}" for e in extra]]


def export_summary(cov_tool: str, library: str, profdata: str, extra: list[str] = ()) -> dict[str, dict]:
    res = subprocess.run([cov_tool, "export", "-summary-only", "-format=text", *objects(library, list(extra)),
                          f"-instr-profile={profdata}"], capture_output=True, text=True, check=True)
    files = {}
    for f in json.loads(res.stdout)["data"][0]["files"]:
        files[f["filename"]] = f["summary"]
    return files


LINE = re.compile(r"^\s*(\d+)\|\s*([0-9.]+[kMGTPE]?|)\|")


def missed_lines(cov_tool: str, library: str, profdata: str, source: str, extra: list[str] = ()) -> list[int]:
    """Lines with an execution count of 0 in `llvm-cov show` (lines without code have no count)."""
    res = subprocess.run([cov_tool, "show", "-format=text", "-show-instantiations=false", "-use-color=false",
                          *objects(library, list(extra)), f"-instr-profile={profdata}", source],
                         capture_output=True, text=True, check=True)
    out = []
    for line in res.stdout.splitlines():
        m = LINE.match(line)
        if m and m.group(2) == "0":
            out.append(int(m.group(1)))
    return out


def ranges(lines: list[int]) -> str:
    parts, start, prev = [], None, None
    for n in lines + [None]:
        if start is not None and (n is None or n != prev + 1):
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = None
        if n is not None and start is None:
            start = n
        prev = n
    return ", ".join(parts)


def objc_lines(root: str = ROOT) -> dict[str, int]:
    """Non-blank, non-comment lines of csrc/metal/*.mm (// and /* */ comments; string literals respected)."""
    counts = {}
    for path in sorted(glob.glob(os.path.join(root, "csrc", "metal", "*.mm"))):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        code_lines, in_block, n = set(), False, 1
        i, quote = 0, None
        while i < len(text):
            c, nxt = text[i], text[i + 1:i + 2]
            if c == "\n":
                n += 1
                i += 1
                continue
            if in_block:
                if c == "*" and nxt == "/":
                    in_block, i = False, i + 2
                else:
                    i += 1
                continue
            if quote:
                code_lines.add(n)
                if c == "\\":
                    i += 2
                    continue
                if c == quote:
                    quote = None
                i += 1
                continue
            if c == "/" and nxt == "/":
                while i < len(text) and text[i] != "\n":
                    i += 1
                continue
            if c == "/" and nxt == "*":
                in_block, i = True, i + 2
                continue
            if c in "\"'":
                quote = c
            if not c.isspace():
                code_lines.add(n)
            i += 1
        counts[os.path.relpath(path, root)] = len(code_lines)
    return counts


def table(rows: list[tuple[str, dict]], title: str) -> tuple[int, int]:
    print(f"\n{title}")
    print(f"{'file':42} {'lines':>6} {'missed':>7} {'line cover':>11} {'functions':>10} {'regions':>9}")
    total = covered = 0
    for name, s in rows:
        ln, fn, rg = s["lines"], s["functions"], s["regions"]
        print(f"{name:42} {ln['count']:6d} {ln['count'] - ln['covered']:7d} {ln['percent']:10.2f}% "
              f"{fn['covered']:4d}/{fn['count']:<5d} {rg['percent']:8.2f}%")
        total += ln["count"]
        covered += ln["covered"]
    return total, covered


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--min", type=float, default=None,
                    help="minimum line coverage in percent: of csrc/gpu/* (emulated, default 90), of "
                         "csrc/metal/* (metal, default 85)")
    ap.add_argument("--tests", nargs="+", default=None,
                    help=f"pytest files, relative to the repo root (default: {' '.join(DEFAULT_TESTS)}, those present)")
    ap.add_argument("--pytest-args", default="", help="extra pytest arguments, e.g. \"-k zero_out\"")
    ap.add_argument("--profdata", help="report this merged profile instead of running the tests")
    ap.add_argument("--library", help="with --profdata: the kernel library that run loaded (printed by the run); "
                    "default: build/find the current coverage build, which differs once csrc/ changed")
    ap.add_argument("--keep", help="write the profiles here (default: a new temporary directory, kept)")
    ap.add_argument("--missed", action="store_true", help="list the csrc/gpu lines no test executed")
    ap.add_argument("--json", help="also write the per-file summaries and the total here")
    ap.add_argument("--backend", choices=BACKENDS, default="direct",
                    help="the GPU backend to measure: the emulated one, or csrc/metal/*.mm over the Apple doubles")
    args = ap.parse_args(argv)

    profdata_tool, cov_tool = tool("LLVM_PROFDATA", "llvm-profdata-16"), tool("LLVM_COV", "llvm-cov-16")
    profile_dir = None
    if not args.profdata:
        profile_dir = args.keep or tempfile.mkdtemp(prefix="tfmo-emu-coverage-")
        # A cache of this run's own: every instrumented library in it (the package's kernel library and the op-kit
        # libraries the tests build, e.g. the host-layer probe) matches this run's sources and profiles.
        os.environ["TF_METAL_OPS_CACHE"] = os.path.join(profile_dir, "cache")
    metal = args.backend == "metal"
    if args.min is None:
        args.min = 85.0 if metal else 90.0
    if metal and not args.pytest_args:
        args.pytest_args = "-k metal"  # the metal cases of the tests that run under both backends
    library = args.library if args.profdata and args.library else build_coverage_library(args.backend)
    print(f"kernel library (coverage build): {library}")
    status = 0
    if args.profdata:
        profdata = args.profdata
    else:
        tests = args.tests or [t for t in (METAL_TESTS if metal else DEFAULT_TESTS)
                               if os.path.isfile(os.path.join(ROOT, t))]
        os.makedirs(profile_dir, exist_ok=True)
        for old in glob.glob(os.path.join(profile_dir, "*.profraw")):
            os.remove(old)
        rc = run_tests(tests, profile_dir, args.pytest_args.split())
        if rc != 0:
            print(f"pytest failed (exit {rc}); the coverage below is of the tests that ran", file=sys.stderr)
            status = 2
        profdata = merge(profdata_tool, profile_dir)

    extra = sorted(glob.glob(os.path.join(profile_dir, "cache", "extensions", "*-coverage", "*.so"))) if profile_dir else []
    for e in extra:
        print(f"op-kit library (coverage build): {e}")
    files = export_summary(cov_tool, library, profdata, extra)
    gpu = sorted((short(f), s) for f, s in files.items() if "/csrc/gpu/" in f)
    if not gpu:
        sys.exit("the profile covers no csrc/gpu file: wrong library or profile?")
    total, covered = table(gpu, "GPU host code (csrc/gpu/*, backend-neutral: the same code the Metal build runs)")
    pct = 100.0 * covered / total if total else 0.0
    print(f"{'TOTAL csrc/gpu/*':42} {total:6d} {total - covered:7d} {pct:10.2f}%")
    table([(short(f), s) for f, s in files.items() if f.endswith("csrc/emulated_gpu/direct_backend.cc")],
          "Direct backend (csrc/emulated_gpu/direct_backend.cc, Linux only; not in the total)")
    others = sorted((short(f), s) for f, s in files.items() if "/csrc/" in f and "/csrc/gpu/" not in f
                    and not f.endswith("direct_backend.cc") and s["lines"]["count"])
    table(others, "Other instrumented sources compiled into the host objects (headers shared with the CPU kernels)")

    mm_files = sorted(f for f in files if "/csrc/metal/" in f)
    if metal:
        table([(short(f), files[f]) for f in mm_files],
              "Metal backend (csrc/metal/*.mm) over the Apple doubles (dev/apple_doubles)")
    missed = {}
    if args.missed:
        print("\nLines of csrc/gpu/* no test executed:")
        for f in sorted(f for f in files if "/csrc/gpu/" in f) + mm_files:
            lines = missed_lines(cov_tool, library, profdata, f, extra)
            missed[short(f)] = lines
            if lines:
                print(f"  {short(f)}: {ranges(lines)}")
    mm = objc_lines()
    if not metal:
        print("\nObjective-C++ this run does not execute (csrc/metal/*.mm, non-blank non-comment lines; --backend "
              "metal runs it): " + ", ".join(f"{k} {v}" for k, v in mm.items()) + f"; total {sum(mm.values())}")
    print(f"\ncsrc/gpu/* line coverage on the {args.backend} backend: {covered}/{total} = {pct:.2f}%"
          + ("" if metal else f" (minimum {args.min:g}%)"))
    if metal:
        ln = [files[f]["lines"] for f in mm_files]
        mm_total, mm_covered = sum(x["count"] for x in ln), sum(x["covered"] for x in ln)
        pct = 100.0 * mm_covered / mm_total if mm_total else 0.0
        print(f"csrc/metal/*.mm line coverage on the Apple doubles: {mm_covered}/{mm_total} = {pct:.2f}% "
              f"(minimum {args.min:g}%)")
    print(f"profile: {profdata}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"library": library, "profdata": profdata, "gpu_total": {"lines": total, "covered": covered,
                       "percent": pct}, "files": {short(k): v for k, v in files.items() if "/csrc/" in k},
                       "missed_lines": missed, "objc_lines": mm}, f, indent=1)
    if status:
        return status
    return 0 if pct >= args.min else 1


if __name__ == "__main__":
    sys.exit(main())
