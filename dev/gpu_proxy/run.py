#!/usr/bin/env python3
"""The GPU proxy benchmark: the unchanged metal_kernels/*.metal, compiled to PTX by dev/gpu_proxy/build.py, timed on
an NVIDIA GPU beside the limit of each kernel. A proxy: NVIDIA hardware, not an Apple GPU; good for comparing kernel
variants and for gross inefficiency, not for Apple's absolute times (bench/gpu_proxy.md says what it can and cannot
tell).

Results: bench/gpu_proxy.md, whose section between the marks LATEST_BEGIN and LATEST_END below this runner rewrites
(the GPU, driver, date and the commit of the PTX in its header); the rest of that document is prose.

Per case (dev/gpu_proxy/cases.py: hash grid encode with float32/float16 tables, param gradient with native atomics
and the MSL 2.4 CAS loop, position gradient, second order; volume rendering and distortion loss, dense and packed,
forward and backward; ray marching count/scan/fill and the occupancy mip), at NeRF sizes; the table gradients also
on ray-ordered points (samples in order along rays, as a NeRF batch has them), plain atomics vs SIMD-group run sums:
  1. one run, its outputs checked against a NumPy float64 reference (or invariants, where stated) BEFORE timing;
     a case that fails is reported and not timed;
  2. warm-up runs, then the median of >= 20 CUDA-event timings (default 25) of the case's launches alone;
  3. beside its bound: a bare CUDA gather/scatter launched as tiny-cuda-nn launches its forward (hash grid), or the
     bytes the kernel must move at the GPU's measured device-to-device copy bandwidth (the rest).

Commands:
    python3 dev/gpu_proxy/build.py build --out gpu_proxy_ptx          # clang-16, no GPU, no CUDA
    python3 dev/gpu_proxy/run.py --ptx gpu_proxy_ptx --dry-run         # no GPU: packing vs the PTX entry signatures
    python3 dev/gpu_proxy/run.py --ptx gpu_proxy_ptx                   # on the GPU machine: cupy, numpy
    python3 dev/gpu_proxy/run.py --ptx gpu_proxy_ptx --tcnn gpu_proxy_tcnn/libtfmo_tcnn.so   # + tiny-cuda-nn
The GPU machine needs python3, numpy and cupy, no TensorFlow and no clang; the PTX (1.4 MB) is built elsewhere and
copied with the tree. The manifest records the commit the PTX was built from. A full run takes a few minutes, most
of it the NumPy references.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))  # dev/: the folder gpu_proxy/ is imported from
from gpu_proxy import build as build_tool  # noqa: E402
from gpu_proxy import cases as cases_mod  # noqa: E402
from gpu_proxy import unfused_mlp  # noqa: E402


def load_build_tool():
    """dev/gpu_proxy/build.py (PTX entry and sizeof parsers, ptxas report); it imports only the standard library."""
    return build_tool


# The empty kernel whose launches in a row bound a case of tiny kernels (dev/gpu_proxy/baselines.cu).
LAUNCH_FLOOR = cases_mod.Launch("baselines", "launch_floor", [], (1, 1, 1), (32, 1, 1), msl=False)


def round16(n: int) -> int:
    return (n + 15) // 16 * 16


# ---- the dry run: every launch's arguments against its PTX entry ------------------------------------------------
class Signatures:
    def __init__(self, ptx_dir: Path):
        tool = load_build_tool()
        self.dir = Path(ptx_dir)
        manifest = self.dir / "manifest.json"
        if not manifest.is_file():
            raise SystemExit(f"{manifest} not found: build it with `python3 dev/gpu_proxy/build.py build --out {ptx_dir}`")
        self.manifest = json.loads(manifest.read_text())
        self.entries, self.sizes = {}, {}
        for ptx in self.dir.rglob("*.ptx"):
            module = str(ptx.relative_to(self.dir).with_suffix(""))
            text = ptx.read_text()
            self.entries[module], self.sizes[module] = tool.ptx_entries(text), tool.ptx_sizeof(text)


def check_launch(sig: Signatures, case, launch) -> list[str]:
    where = f"{case.name}: {launch.module}:{launch.kernel}"
    if launch.module == "cupy":  # a Python function of dev/gpu_proxy/unfused_mlp.py, no PTX
        fails = [] if hasattr(unfused_mlp, launch.kernel) else [f"{where}: no function {launch.kernel}"]
        return fails + [f"{where}: no array {v!r}" for kind, v in launch.args if kind == "buf" and v not in case.arrays]
    entries = sig.entries.get(launch.module)
    if entries is None:
        return [f"{where}: no module {launch.module}.ptx"]
    if launch.kernel not in entries:
        return [f"{where}: no .entry {launch.kernel}"]
    ptx = entries[launch.kernel]
    ours = [".u64" if kind == "buf" else ".u32" for kind, _ in launch.args] + ([".u32"] * 3 if launch.msl else [])
    if ours != ptx:
        return [f"{where}: arguments {ours} but the entry takes {ptx}"]
    fails = []
    for kind, value in launch.args:
        if kind == "buf" and value not in case.arrays:
            fails.append(f"{where}: no array {value!r}")
    if fails or not launch.msl:
        return fails
    params = sig.manifest["kernels"][launch.kernel]["params"]
    sizes = sig.sizes[launch.module][launch.kernel]
    tg_bytes = 0
    for (kind, value), p, size in zip(launch.args, params, sizes):
        if p["role"] == "buffer":
            a = case.arrays[value]
            want = cases_mod.MSL_DTYPES.get(p["type"])
            if want is None:
                fails.append(f"{where}: parameter {p['decl']} {p['name']}: no NumPy dtype known for {p['type']}")
            elif np.dtype(want) != a.dtype:
                fails.append(f"{where}: {p['name']} is {p['decl']} but {value!r} is {a.dtype}")
            if a.dtype.itemsize != size:
                fails.append(f"{where}: {p['name']}: element of {a.dtype.itemsize} bytes, the compiler's is {size}")
            if p["reference"] and a.size != 1:
                fails.append(f"{where}: {p['name']} is a reference ({p['decl']}): bind one element, not {a.size}")
        elif p["role"] == "threadgroup_bytes":
            tg_bytes += round16(int(value))
    declared = sig.manifest["files"].get(launch.module.split("/")[-1], {}).get("function_constants", [])
    for name in launch.constants:
        if name not in declared:
            fails.append(f"{where}: function constant {name!r} is not declared in {launch.module} ({declared})")
    if tg_bytes != launch.shared:
        fails.append(f"{where}: dynamic shared memory {launch.shared} B, the threadgroup lengths need {tg_bytes} B")
    if sig.manifest["kernels"][launch.kernel]["uses_barriers"] and any(
            t % g for t, g in zip(launch.threads, launch.group)):
        fails.append(f"{where}: a kernel with barriers must be dispatched as whole threadgroups")
    if np.prod(launch.group) > 1024:
        fails.append(f"{where}: {np.prod(launch.group)} threads per threadgroup > 1024")
    return fails


def dry_run(ptx_dir: Path, cases) -> int:
    sig = Signatures(ptx_dir)
    fails, n = [], 0
    for case in cases:
        if case.prepare:
            case.prepare(case, None)
        for launch in case.setup + case.launches:
            fails += check_launch(sig, case, launch)
            n += 1
        if case.bound[0] == "case" and case.bound[1] not in {c.name for c in cases}:
            fails.append(f"{case.name}: bound case {case.bound[1]!r} does not exist")
    if sig.entries.get(LAUNCH_FLOOR.module, {}).get(LAUNCH_FLOOR.kernel) != []:
        fails.append(f"{LAUNCH_FLOOR.module}.ptx: no parameterless .entry {LAUNCH_FLOOR.kernel} (the launch floor)")
    for f in fails:
        print("MISMATCH", f)
    print(f"gpu_proxy dry run: {n} launches of {len(cases)} cases checked against {ptx_dir}: "
          f"{'all match' if not fails else f'{len(fails)} mismatches'} (nothing ran on a GPU)")
    return 1 if fails else 0


# ---- the device run ---------------------------------------------------------------------------------------------
class Device:
    """CuPy launcher of the cases' launches (cupy imported here only)."""

    def __init__(self, ptx_dir: Path, tcnn_lib: Path | None = None):
        import cupy as cp

        self.cp, self.dir, self.modules, self.buffers = cp, Path(ptx_dir), {}, {}
        # dev/gpu_proxy/tcnn_grid.cu, tcnn_mlp.cu: int f(pointers..., u32 / float values...); its arguments by kind.
        # tiny-cuda-nn's memory arena calls the driver API, which the library leaves to libcuda.so.1, loaded first.
        if tcnn_lib:
            ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
        self.tcnn = ctypes.CDLL(str(tcnn_lib)) if tcnn_lib else None
        self.tcnn_args = {"buf": lambda v: ctypes.c_void_p(self.buffers[v].data.ptr), "u32": ctypes.c_uint32,
                          "f32": ctypes.c_float, "host": lambda v: v.ctypes.data_as(ctypes.c_void_p)}

    def function(self, launch):
        if launch.module == "tcnn":
            return getattr(self.tcnn, launch.kernel)
        if launch.module not in self.modules:
            self.modules[launch.module] = self.cp.RawModule(path=str(self.dir / f"{launch.module}.ptx"))
        return self.modules[launch.module].get_function(launch.kernel)

    def upload(self, arrays: dict, names):
        for n in names:
            a = arrays[n]
            raw = np.frombuffer(np.ascontiguousarray(a).tobytes(), np.uint8) if a.dtype.fields else a
            self.buffers[n] = self.cp.asarray(raw if raw.size else np.zeros(1, raw.dtype))

    def download(self, name, like=None):
        host = self.cp.asnumpy(self.buffers[name])
        return host.view(like.dtype).reshape(like.shape) if like is not None and like.size else host

    def launch(self, launch):
        if launch.module == "tcnn":  # a host function launching tiny-cuda-nn's kernel on the legacy default stream
            err = self.function(launch)(*[self.tcnn_args[kind](v) for kind, v in launch.args])
            if err:
                raise RuntimeError(f"{launch.kernel}: cudaError {err}")
            return
        if launch.module == "cupy":  # dev/gpu_proxy/unfused_mlp.py: cuBLAS and CuPy's elementwise kernels
            getattr(unfused_mlp, launch.kernel)(self.cp, *[self.buffers[v] if kind == "buf" else v
                                                             for kind, v in launch.args])
            return
        args = [self.buffers[v] if kind == "buf" else np.uint32(v) for kind, v in launch.args]
        function = self.function(launch)  # loads the module
        for name, value in launch.constants.items():  # the module's __constant__ int of the function constant
            self.cp.ndarray((1,), self.cp.int32, memptr=self.modules[launch.module].get_global(name))[...] = value
        if launch.msl:
            blocks = tuple((t + g - 1) // g for t, g in zip(launch.threads, launch.group))
            args += [np.uint32(t) for t in launch.threads]
        else:
            blocks = launch.threads
        function(blocks, launch.group, tuple(args), shared_mem=launch.shared)

    def copy_bandwidth(self, mib=1024, repeats=20) -> float:
        """Device-to-device copy, bytes read + written per second (median)."""
        cp = self.cp
        src = cp.ones(mib << 18, cp.float32)
        dst = cp.empty_like(src)
        times = []
        for i in range(repeats + 3):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            dst[...] = src
            b.record()
            b.synchronize()
            if i >= 3:
                times.append(cp.cuda.get_elapsed_time(a, b) / 1e3)
        return 2 * src.nbytes / statistics.median(times)

    def launch_floor(self, k: int, repeats=25) -> float:
        """ms of k launches in a row of an empty kernel (one block of 32 threads), median: the least time a case of
        k launches can take."""
        cp, times = self.cp, []
        for i in range(repeats + 3):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            for _ in range(k):
                self.launch(LAUNCH_FLOOR)
            b.record()
            b.synchronize()
            if i >= 3:
                times.append(cp.cuda.get_elapsed_time(a, b))
        return statistics.median(times)


def names_of(case):
    return sorted({v for l in case.setup + case.launches for kind, v in l.args if kind == "buf"})


def run_case(dev: Device, case, warmup: int, repeats: int) -> dict:
    cp = dev.cp
    if case.prepare:
        case.prepare(case, dev)
    names = names_of(case)
    dev.upload(case.arrays, names)
    for l in case.setup + case.launches:
        dev.launch(l)
    cp.cuda.runtime.deviceSynchronize()
    out = {n: dev.download(n, case.arrays[n]) for n in names}
    failures, worst = [], 0.0
    for name, (ref, tol, *index) in case.reference().items():
        ok, ratio = cases_mod.within(out[name][index[0]] if index else out[name], ref, tol)
        worst = max(worst, ratio)
        if not ok:
            failures.append(f"{name}: max |error| / tolerance = {ratio:.3g}")
    if case.check:  # a list of failures, or (failures, the largest |error| / tolerance of its comparisons)
        checked = case.check(out)
        found, ratio = checked if isinstance(checked, tuple) else (checked, 0.0)
        failures += found
        worst = max(worst, ratio)
    if failures:
        return {"failures": failures}
    times = []
    for i in range(warmup + repeats):
        if case.restore:
            dev.upload(case.arrays, case.restore)
        for l in case.setup:
            dev.launch(l)
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        for l in case.launches:
            dev.launch(l)
        b.record()
        b.synchronize()
        if i >= warmup:
            times.append(cp.cuda.get_elapsed_time(a, b))
    return {"ms": statistics.median(times), "spread": (max(times) - min(times)) / statistics.median(times),
            "worst": worst, "failures": []}


def git_commit(manifest: dict) -> str:
    return manifest.get("commit", "unknown")


LATEST_BEGIN = "<!-- latest run: begin (written by dev/gpu_proxy/run.py, which replaces everything up to the end mark) -->"
LATEST_END = "<!-- latest run: end -->"


def latest_run_section(rows, env: dict, registers: dict) -> str:
    """The results document's latest-run section: the run's GPU, driver, date, commit and one table."""
    lines = [
        LATEST_BEGIN,
        "## Latest run",
        "",
        f"- GPU: {env['gpu']}; driver {env['driver']}; CUDA runtime {env['runtime']}; cupy {env['cupy']}",
        f"- date: {env['date']}; commit {env['commit']} (of the PTX build); PTX: clang-16 CUDA mode, sm_90, -O3 "
        "-ffp-contract=off (dev/gpu_proxy/build.py)",
        f"- copy bandwidth (device to device, read + write): {env['bw'] / 1e9:.0f} GB/s",
        f"- each row: median of {env['repeats']} CUDA-event timings after {env['warmup']} warm-up runs, checked "
        "against a NumPy float64 reference (or the invariants named) before timing",
        "",
        "| kernel | ms | bound | bound ms | ratio | regs / stack B | check |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        reg = registers.get(r["kernel"], {})
        regs = f"{reg['registers']} / {reg['stack']}" if reg else "—"
        if r.get("failures"):
            lines.append(f"| {r['name']} | not timed | | | | {regs} | FAILED: {'; '.join(r['failures'])} |")
            continue
        ratio = f"{r['ms'] / r['bound_ms']:.2f}x" if r.get("bound_ms") else "—"
        bound_ms = f"{r['bound_ms']:.3f}" if r.get("bound_ms") else "—"
        lines.append(f"| {r['name']} | {r['ms']:.3f} | {r['bound']} | {bound_ms} | {ratio} | {regs} | "
                     f"ok (max err/tol {r['worst']:.2g}){'; ' + r['note'] if r['note'] else ''} |")
    lines.append(LATEST_END)
    return "\n".join(lines)


def write_md(path: Path, rows, env: dict, registers: dict):
    """Replaces the latest-run section of the results document at `path` (the text between LATEST_BEGIN and
    LATEST_END); a file without that section is written as a document holding the section alone."""
    section = latest_run_section(rows, env, registers)
    text = path.read_text() if path.is_file() else ""
    if LATEST_BEGIN in text and LATEST_END in text:
        head, rest = text.split(LATEST_BEGIN, 1)
        text = head + section + rest.split(LATEST_END, 1)[1]
    else:
        text = "# GPU proxy: the Metal kernels timed on an NVIDIA GPU\n\n" + section + "\n"
    path.write_text(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ptx", type=Path, default=ROOT / "gpu_proxy_ptx", help="dev/gpu_proxy/build.py build output")
    ap.add_argument("--md", type=Path, default=ROOT / "bench" / "gpu_proxy.md")
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--dry-run", action="store_true", help="check the packing against the PTX; no GPU")
    ap.add_argument("--small", action="store_true", help="small inputs (the tests' sizes)")
    ap.add_argument("--only", default="", help="run the cases whose name contains this (alternatives split by |)")
    ap.add_argument("--copy-mib", type=int, default=1024, help="buffer size of the copy-bandwidth measurement")
    ap.add_argument("--tcnn", type=Path, default=None,
                    help="also time tiny-cuda-nn's own kernels: the library dev/gpu_proxy/build.py tcnn builds")
    args = ap.parse_args(argv)
    if args.repeats < 20:
        ap.error("--repeats must be >= 20")
    cases = [c for c in cases_mod.all_cases(small=args.small, tcnn=args.tcnn is not None and not args.dry_run)]
    if args.dry_run:
        return dry_run(args.ptx, cases)
    cases = [c for c in cases if any(o in c.name for o in args.only.split("|"))]
    sig = Signatures(args.ptx)
    dev = Device(args.ptx, args.tcnn)
    cp = dev.cp
    bw = dev.copy_bandwidth(args.copy_mib)
    props = cp.cuda.runtime.getDeviceProperties(0)
    env = {"gpu": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
           "driver": cp.cuda.runtime.driverGetVersion(), "runtime": cp.cuda.runtime.runtimeGetVersion(),
           "cupy": cp.__version__, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "commit": git_commit(sig.manifest), "bw": bw, "repeats": args.repeats, "warmup": args.warmup}
    rows, by_name, floors = [], {}, {}
    for case in cases:
        try:
            r = run_case(dev, case, args.warmup, args.repeats)
        except Exception as e:  # one broken case is reported in its row; the others still run
            r = {"failures": [f"{type(e).__name__}: {e}"]}
        r.update(name=case.name, kernel=(case.launches[0].module, case.launches[0].kernel), note=case.note)
        if not r["failures"]:
            kind, what = case.bound
            if kind == "copy":  # the bytes at copy bandwidth, or the launches when they take longer
                k = len(case.launches)
                if k not in floors:
                    floors[k] = dev.launch_floor(k)
                r["bound"] = f"{case.bound_bytes() / 1e6:.1f} MB at copy bandwidth"
                r["bound_ms"] = case.bound_bytes() / bw * 1e3
                if floors[k] > r["bound_ms"]:
                    r["bound"] = f"launch floor: {k} empty launch{'es' if k > 1 else ''} ({r['bound']}: {r['bound_ms']:.3f})"
                    r["bound_ms"] = floors[k]
            else:
                r["bound"] = what
                r["bound_ms"] = by_name.get(what, {}).get("ms")
        by_name[case.name] = r
        rows.append(r)
        print(f"{case.name:<60} " + (f"{r['ms']:.3f} ms" if not r["failures"] else f"FAILED {r['failures']}"),
              flush=True)
    tool = load_build_tool()
    ptxas, registers = tool.find_ptxas(), {}
    if ptxas:
        for module in sorted({c.launches[0].module for c in cases} - {"tcnn", "cupy"}):
            for kernel, r in tool.register_report(ptxas, args.ptx / f"{module}.ptx").items():
                registers[(module, kernel)] = r
    write_md(args.md, rows, env, registers)
    print(f"wrote {args.md}")
    return 1 if any(r["failures"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
