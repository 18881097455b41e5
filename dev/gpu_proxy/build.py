#!/usr/bin/env python3
"""The GPU proxy's build: every metal_kernels/*.metal, unchanged, compiled to PTX for an NVIDIA sm_90 GPU (H100,
H200) with clang++-16 in CUDA mode, no CUDA installation needed. dev/gpu_proxy/run.py times the result on the GPU.

    python3 dev/gpu_proxy/build.py build --out DIR [--msl 3.0 --msl 2.4] [--jobs 2] [--no-report] [FILE.metal ...]
    python3 dev/gpu_proxy/build.py tcnn --src TCNN_CHECKOUT --out DIR

writes, for each .metal file NAME:
  DIR/NAME.ptx            MSL 3.0 (native float atomics);
  DIR/msl2.4/NAME.ptx     MSL 2.4 (no atomic_float: the kernels' compare-and-swap loops), when 2.4 is built;
  DIR/baselines.ptx       dev/gpu_proxy/baselines.cu: the bare CUDA gather/scatter limits of the hash grid;
  DIR/nerf_glue.ptx       dev/gpu_proxy/nerf_glue.cu: the elementwise steps between a NeRF step's kernels;
  DIR/manifest.json       every kernel's entry point (parameters in launch order, see below), file, line, barrier use;
  DIR/glue/, DIR/stage/   the generated CUDA sources and the staged .metal copies (for reading compiler errors);
and prints a register/stack report per kernel from ptxas (found as $TFMO_PTXAS, in the pip package
nvidia-cuda-nvcc-cu12 / nvidia-cuda-nvcc, or on PATH; printed, never asserted; skipped with a note when absent).

How a .metal file becomes CUDA (development only; nothing here ships):
  - msl_emu's staging (tf_metal_ops/msl_emu.py: stage) copies the file with `#line` to the original and rewrites
    pointers to threadgroup memory; function-constant declarations become __constant__ globals of the same name;
  - the generated unit defines MSL_EMU_TARGET "gpu_proxy/target.h" and includes msl_emu's <metal_stdlib>, so the
    CUDA target layer (dev/gpu_proxy/include/gpu_proxy/target.h, conventions there) serves it, and the staged file
    inside `#pragma clang force_cuda_host_device`, so every function is device code;
  - per kernel, an `extern "C" __global__` entry point named like the kernel, generated from the signature parse
    the emulated GPU uses (msl_emu.parse_metal: one parser); launch contract in dev/gpu_proxy/include/gpu_proxy/
    entry.h. Entry parameters: buffers in ascending [[buffer(n)]] order (pointers; `constant` ones `const T*
    __restrict__`), one uint byte length per [[threadgroup(n)]] in ascending n, then grid_x, grid_y, grid_z;
  - `gpu_proxy_sizeof_KERNEL` (a .global u32 array in the PTX) holds sizeof of each buffer parameter's element
    type in entry order (0 for the others), so a launcher can check its struct packing against the compiler;
  - flags: -O3 -ffp-contract=off (as the metallibs: no a*b+c contraction; CUDA mode defaults to fast and then
    ignores `#pragma clang fp contract(off)`).
Runs without TensorFlow: tf_metal_ops/msl_emu.py is loaded by path (it imports only the standard library).

`tcnn` builds DIR/libtfmo_tcnn.so for `dev/gpu_proxy/run.py --tcnn DIR/libtfmo_tcnn.so`, from a checkout of
NVlabs/tiny-cuda-nn with its fmt and CUTLASS submodules (commit 6ee3546 is the one bench/gpu_proxy.md names):
  - dev/gpu_proxy/tcnn_grid.cu: tiny-cuda-nn's own hash-grid kernels (its encodings/grid.h, unchanged);
  - dev/gpu_proxy/tcnn_mlp.cu: its FullyFusedMLP (networks/fully_fused_mlp.h with src/fully_fused_mlp.cu,
    src/common_host.cu and src/object.cu, unchanged; the backward's weight-gradient products use CUTLASS).
Needs nvcc (CUDA >= 12); no GPU: the library links the CUDA runtime statically, and the driver API that tiny-cuda-nn's
memory arena calls is resolved when run.py loads the library beside libcuda.so.1. tiny-cuda-nn's src/fully_fused_mlp.cu
takes about 10 CPU-minutes of ptxas: each source's object is kept in DIR/obj and rebuilt only when the source or a
flag changes. Nothing of tiny-cuda-nn is kept in this repository.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import types
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROXY_INCLUDE = ROOT / "dev" / "gpu_proxy" / "include"
BASELINES = ROOT / "dev" / "gpu_proxy" / "baselines.cu"
NERF_GLUE = ROOT / "dev" / "gpu_proxy" / "nerf_glue.cu"
ARCH = "sm_90"
MSL_VERSIONS = {"3.0": 300, "2.4": 240}
CUDA_FLAGS = ["-x", "cuda", "--cuda-device-only", f"--cuda-gpu-arch={ARCH}", "-nocudainc", "-nocudalib",
              "--cuda-path=/nonexistent-cuda", "-Xclang", "-target-feature", "-Xclang", "+ptx78",  # PTX ISA 7.8 (sm_90): the warp shuffle/vote builtins need it declared
              "-std=c++20", "-O3", "-S", "-ffp-contract=off",
              "-Wall", "-Wno-unknown-attributes", "-Wno-unused-function", "-Wno-unused-variable"]


class BuildError(RuntimeError):
    """A file that does not compile, or a missing compiler; the message names the file and the first error."""


def load_msl_emu():
    """tf_metal_ops.msl_emu of this checkout, without the package's __init__ (which imports TensorFlow): where no
    tf_metal_ops is imported yet, the package is entered as a bare module whose path is this checkout's
    tf_metal_ops/ (msl_emu and the msl_check it reads signatures with import nothing else of it)."""
    if "tf_metal_ops" not in sys.modules:
        pkg = types.ModuleType("tf_metal_ops")
        pkg.__path__ = [str(ROOT / "tf_metal_ops")]
        sys.modules["tf_metal_ops"] = pkg
    return importlib.import_module("tf_metal_ops.msl_emu")


def find_clang() -> str:
    exe = os.environ.get("CLANGXX") or shutil.which("clang++-16")
    if not exe:
        raise BuildError("gpu_proxy: clang++-16 not found (apt-get install clang-16, or set CLANGXX)")
    return exe


def find_ptxas() -> str | None:
    """$TFMO_PTXAS, else bin/ptxas of an installed nvidia-cuda-nvcc(-cu12) wheel, else ptxas on PATH."""
    if os.environ.get("TFMO_PTXAS"):
        return os.environ["TFMO_PTXAS"]
    for dist in ("nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvcc"):
        try:
            files = importlib.metadata.files(dist) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in files:
            if f.name == "ptxas" and f.parent.name == "bin":
                return str(f.locate())
    return shutil.which("ptxas")


# ---- generation ------------------------------------------------------------------------------------------------
def entry_params(kernel) -> list[dict]:
    """The entry point's parameters in launch order (see the module docstring), as manifest records."""
    out = []
    for p in sorted((p for p in kernel.params if p.kind == "buffer"), key=lambda p: p.index):
        out.append({"name": p.name, "role": "buffer", "index": p.index, "type": p.type, "decl": p.decl,
                    "address_space": p.address_space, "const": p.const, "reference": not p.pointer, "ptx": ".u64"})
    for p in sorted((p for p in kernel.params if p.kind == "threadgroup"), key=lambda p: p.index):
        out.append({"name": f"{p.name}_bytes", "role": "threadgroup_bytes", "index": p.index, "type": p.type,
                    "decl": p.decl, "ptx": ".u32"})
    for axis in "xyz":
        out.append({"name": f"grid_{axis}", "role": "grid", "ptx": ".u32"})
    return out


def _entry_source(k, file_name: str) -> str:
    ref = k.call if k.call.startswith("::") else "::" + k.call
    fn = f"decltype(&{ref})"
    pos = {p.name: i for i, p in enumerate(k.params)}
    decls, sizes = [], []
    for e in entry_params(k):
        if e["role"] == "buffer":
            i = pos[e["name"]]
            restrict = " __restrict__" if e["address_space"] == "constant" else ""
            decls.append(f"gpu_proxy::Pointee<{fn}, {i}>*{restrict} {e['name']}")
            sizes.append(f"sizeof(gpu_proxy::Pointee<{fn}, {i}>)")
        else:
            decls.append(f"unsigned gpu_proxy_{e['name']}")
            sizes.append("0u")
    clipped = "false" if k.uses_barriers else "true"
    body = [f"  const gpu_proxy::Context gpu_proxy_t =\n"
            f"      gpu_proxy::context(gpu_proxy_grid_x, gpu_proxy_grid_y, gpu_proxy_grid_z, {clipped});"]
    if not k.uses_barriers:
        body.append("  if (!gpu_proxy_t.in_grid) return;  // Metal clips edge threadgroups: these threads do not exist")
    else:
        body.append("  (void)gpu_proxy_t;")
    tg = sorted((p for p in k.params if p.kind == "threadgroup"), key=lambda p: p.index)
    offset = "0u"
    tg_ptr = {}
    for p in tg:
        body.append(f"  unsigned char* const gpu_proxy_tg_{p.name} = gpu_proxy_threadgroup_memory + {offset};")
        tg_ptr[p.name] = f"gpu_proxy_tg_{p.name}"
        offset = f"{offset} + gpu_proxy::round16(gpu_proxy_{p.name}_bytes)"
    args = []
    for i, p in enumerate(k.params):
        if p.kind == "buffer":
            args.append(p.name if p.pointer else f"*{p.name}")
        elif p.kind == "threadgroup":
            cast = f"reinterpret_cast<gpu_proxy::Pointee<{fn}, {i}>*>({tg_ptr[p.name]})"
            args.append(cast if p.pointer else f"*{cast}")
        else:
            args.append(f"gpu_proxy::attribute<gpu_proxy::Param<{fn}, {i}>>(gpu_proxy_t.{p.attribute})")
    sig = ",\n    ".join(decls)
    call = ",\n      ".join(args)
    return (f"// {k.name} ({file_name}:{k.line}){' uses barriers' if k.uses_barriers else ''}\n"
            f"extern \"C\" __global__ void gpu_proxy_entry_{k.name}(\n    {sig}) __asm__(\"{k.name}\");\n"
            f"extern \"C\" __global__ void gpu_proxy_entry_{k.name}(\n    {sig}) {{\n" + "\n".join(body) + "\n"
            f"  {ref}(\n      {call});\n}}\n"
            f"extern \"C\" __device__ const unsigned gpu_proxy_sizeof_{k.name}[] = {{{', '.join(sizes)}}};\n")


# A source that uses SIMD-group matrices (their types or functions).
_MATRIX_USE = re.compile(r"\bsimdgroup_(?:matrix|float8x8|half8x8|bfloat8x8|load|store|multiply)")


def generate(metal_file: Path, out: Path):
    """Stages metal_file, writes out/glue/NAME.cu; returns (the parsed MetalFile, the .cu path, include dirs)."""
    msl_emu = load_msl_emu()
    stage_dir, glue_dir = out / "stage", out / "glue"
    glue_dir.mkdir(parents=True, exist_ok=True)
    staged = msl_emu.stage([metal_file], stage_dir)[0]
    staged.write_text(msl_emu.replace_function_constants(
        staged.read_text(), lambda c: f"__constant__ {c.type} {c.name};  // function constant {c.index}"))
    dirs = [PROXY_INCLUDE, stage_dir, metal_file.parent] + [
        d for d in msl_emu.include_dirs(None, ROOT) if d not in (metal_file.parent, ROOT / "csrc" / "emulated_gpu")]
    mf = msl_emu.parse_metal(metal_file, search=dirs[2:])
    parts = [f"// Generated by dev/gpu_proxy/build.py from {metal_file.relative_to(ROOT) if metal_file.is_relative_to(ROOT) else metal_file}. Do not edit."]
    if _MATRIX_USE.search(staged.read_text()):
        parts.append("#define GPU_PROXY_MATRIX_LANES 1  // SIMD-group matrices: warps numbered in their layout (gpu_proxy/lanes.h)")
    parts += ['#include "gpu_proxy/entry.h"  // first: before <metal_stdlib>\'s keyword macros',
             '#define MSL_EMU_TARGET "gpu_proxy/target.h"  // <metal_stdlib>\'s CUDA target layer (dev/gpu_proxy/include)',
             "#include <metal_stdlib>       // csrc/msl_emu/include: msl_emu's, one header set for every target",
             "#pragma clang force_cuda_host_device begin",
             f'#include "{staged.name}"',
             "#pragma clang force_cuda_host_device end",
             ""]
    parts += [_entry_source(k, metal_file.name) for k in mf.kernels]
    cu = glue_dir / f"{metal_file.stem}.cu"
    cu.write_text("\n".join(parts))
    return mf, cu, dirs


def compile_ptx(source: Path, ptx: Path, include_dirs: list[Path], defines: list[str], what: str) -> float:
    ptx.parent.mkdir(parents=True, exist_ok=True)
    cmd = [find_clang(), *CUDA_FLAGS, *[f"-I{d}" for d in include_dirs], *[f"-D{d}" for d in defines],
           str(source), "-o", str(ptx)]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        errors = [ln for ln in r.stderr.splitlines() if " error: " in ln or ln.startswith("error:")]
        first = errors[0] if errors else r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "(no output)"
        raise BuildError(f"gpu_proxy: {what} does not compile as CUDA: {first}\n"
                         f"(the CUDA target layer of msl_emu's <metal_stdlib>, "
                         f"dev/gpu_proxy/include/gpu_proxy/target.h, lists what it supports)\n--- clang output ---\n{r.stderr}\n--- command ---\n{' '.join(cmd)}")
    return time.monotonic() - t0


# ---- PTX and ptxas ----------------------------------------------------------------------------------------------
_ENTRY = re.compile(r"\.entry\s+([A-Za-z_$][\w$]*)\s*\(([^)]*)\)", re.S)
_PARAM = re.compile(r"\.param\s+(\.\w+)(?:\s+\.align\s+\d+)?\s+[\w$]+")
_SIZEOF = re.compile(r"\.(?:global|const)\s+\.align\s+\d+\s+\.(?:b8|u32)\s+gpu_proxy_sizeof_(\w+)\[(\d+)\]\s*=\s*\{([^}]*)\}")


def ptx_entries(ptx_text: str) -> dict[str, list[str]]:
    """{entry name: [PTX parameter types, e.g. '.u64', '.u32']} of a PTX module."""
    return {m.group(1): _PARAM.findall(m.group(2)) for m in _ENTRY.finditer(ptx_text)}


def ptx_sizeof(ptx_text: str) -> dict[str, list[int]]:
    """{kernel: the element sizes of its entry parameters} from the gpu_proxy_sizeof_KERNEL arrays."""
    out = {}
    for m in _SIZEOF.finditer(ptx_text):
        vals = [int(v) for v in m.group(3).replace("\n", " ").split(",") if v.strip()]
        if ".b8" in m.group(0).split("gpu_proxy_sizeof_")[0]:  # little-endian bytes of u32s
            vals = [int.from_bytes(bytes(vals[i:i + 4]), "little") for i in range(0, len(vals), 4)]
        out[m.group(1)] = vals
    return out


_PTXAS_PROPS = re.compile(r"Function properties for (\S+)")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")


def register_report(ptxas: str, ptx: Path) -> dict[str, dict]:
    """{entry: {registers, stack, spill_stores, spill_loads}} from `ptxas -v` (entries only)."""
    r = subprocess.run([ptxas, f"-arch={ARCH}", "-v", str(ptx), "-o", os.devnull], capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"gpu_proxy: ptxas rejected {ptx}:\n{r.stderr}")
    entries = set(ptx_entries(ptx.read_text()))
    out, current = {}, None
    for line in r.stderr.splitlines():  # "Function properties for F", its frame line, then "Used N registers"
        if m := _PTXAS_PROPS.search(line):
            current = m.group(1) if m.group(1) in entries else None
            if current:
                out[current] = {}
        elif current and (m := _PTXAS_FRAME.search(line)):
            out[current].update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif current and (m := _PTXAS_REGS.search(line)):
            out[current]["registers"] = int(m.group(1))
    return {k: v for k, v in sorted(out.items()) if "registers" in v}


# ---- build ------------------------------------------------------------------------------------------------------
def source_commit() -> str:
    """HEAD of this checkout, '+dirty' when metal_kernels/, csrc/ or dev/gpu_proxy/ differ from it ('unknown'
    without git): recorded in the manifest, since the device copy of the tree has no history."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "metal_kernels", "csrc",
                                "dev/gpu_proxy"], capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def default_files() -> list[Path]:
    return sorted((ROOT / "metal_kernels").glob("*.metal"))


def ptx_path(out: Path, stem: str, msl: str) -> Path:
    return out / f"{stem}.ptx" if msl == "3.0" else out / f"msl{msl}" / f"{stem}.ptx"


def build(out: Path, files: list[Path] | None = None, msl_versions=("3.0", "2.4"), jobs: int = 2,
          baselines: bool = True, log=print) -> dict:
    """Compiles every file (and the baselines); writes out/manifest.json and returns it. Raises BuildError."""
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    files = [Path(f).resolve() for f in (files or default_files())]
    for v in msl_versions:
        if v not in MSL_VERSIONS:
            raise BuildError(f"gpu_proxy: unknown MSL version {v} (use {', '.join(MSL_VERSIONS)})")
    msl_emu = load_msl_emu()
    jobs_list, manifest = [], {"arch": ARCH, "msl_versions": list(msl_versions), "commit": source_commit(),
                               "files": {}, "kernels": {}}
    for f in files:
        try:
            mf, cu, dirs = generate(f, out)
        except msl_emu.GlueError as e:
            raise BuildError(f"gpu_proxy: {e}") from e
        manifest["files"][f.stem] = {"source": str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else str(f),
                                     "ptx": {v: str(ptx_path(out, f.stem, v).relative_to(out)) for v in msl_versions},
                                     "function_constants": [c.name for c in mf.constants]}
        for k in mf.kernels:
            manifest["kernels"][k.name] = {"file": f.stem, "line": k.line, "uses_barriers": k.uses_barriers,
                                           "params": entry_params(k)}
        for v in msl_versions:
            jobs_list.append((cu, ptx_path(out, f.stem, v), dirs, [f"MSL_EMU_VERSION={MSL_VERSIONS[v]}"],
                              f"{f.name} (MSL {v})"))
    if baselines:
        jobs_list.append((BASELINES, out / "baselines.ptx", [PROXY_INCLUDE], [], BASELINES.name))
        jobs_list.append((NERF_GLUE, out / "nerf_glue.ptx", [PROXY_INCLUDE], [], NERF_GLUE.name))
        manifest["baselines"] = "baselines.ptx"
        manifest["nerf_glue"] = "nerf_glue.ptx"
    t0 = time.monotonic()
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        secs = list(pool.map(lambda j: compile_ptx(*j), jobs_list))
    for j, s in zip(jobs_list, secs):
        log(f"  {j[4]:<32} -> {j[1].relative_to(out)}  ({s:.1f} s)")
    log(f"gpu_proxy: {len(jobs_list)} PTX modules in {time.monotonic() - t0:.1f} s -> {out}")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def print_register_report(out: Path, manifest: dict, log=print) -> None:
    ptxas = find_ptxas()
    if not ptxas:
        log("gpu_proxy: ptxas not found (pip install nvidia-cuda-nvcc-cu12, or set TFMO_PTXAS): no register report")
        return
    log(f"gpu_proxy: register/stack report ({ptxas}, -arch={ARCH}; not asserted)")
    log(f"  {'kernel':<36} {'MSL':>4} {'regs':>5} {'stack B':>8} {'spill st/ld B':>14}")
    modules = [(v, out / rel) for info in manifest["files"].values() for v, rel in info["ptx"].items()]
    for bare in ("baselines", "nerf_glue"):
        if manifest.get(bare):
            modules.append(("-", out / manifest[bare]))
    for v, ptx in modules:
        for name, r in register_report(ptxas, ptx).items():
            log(f"  {name:<36} {v:>4} {r['registers']:>5} {r['stack']:>8} {r['spill_stores']:>7}/{r['spill_loads']:<6}")


TCNN_SOURCES = ("src/common_host.cu", "src/object.cu", "src/fully_fused_mlp.cu")  # of the checkout
TCNN_WRAPPERS = ("tcnn_grid.cu", "tcnn_mlp.cu")  # of dev/gpu_proxy


def build_tcnn(src: Path, out: Path, nvcc: str = "nvcc") -> Path:
    """nvcc the tiny-cuda-nn wrappers and the checkout `src`'s sources they need into out/libtfmo_tcnn.so."""
    for need in ("include/tiny-cuda-nn/encodings/grid.h", "dependencies/fmt/include/fmt/format.h",
                 "dependencies/pcg32/pcg32.h", "dependencies/cutlass/include/cutlass/cutlass.h", *TCNN_SOURCES):
        if not (src / need).is_file():
            raise BuildError(f"gpu_proxy tcnn: {src / need} missing (a tiny-cuda-nn checkout with submodules?)")
    flags = ["-O3", "-std=c++17", f"-arch={ARCH}", "--expt-relaxed-constexpr", "--extended-lambda",
             "-DTCNN_MIN_GPU_ARCH=90", "-DTCNN_HALF_PRECISION=1", "-DFMT_HEADER_ONLY", "-DNDEBUG", "-Xcompiler",
             "-fPIC", "-w", f"-I{src / 'include'}", f"-I{src / 'dependencies'}",
             f"-I{src / 'dependencies' / 'fmt' / 'include'}", f"-I{src / 'dependencies' / 'cutlass' / 'include'}",
             f"-I{src / 'dependencies' / 'cutlass' / 'tools' / 'util' / 'include'}"]
    objects = out / "obj"
    objects.mkdir(parents=True, exist_ok=True)
    inputs = [src / s for s in TCNN_SOURCES] + [ROOT / "dev" / "gpu_proxy" / w for w in TCNN_WRAPPERS]
    stamp = hashlib.sha256(json.dumps([nvcc] + flags).encode()).hexdigest()[:16]
    def compile_one(source: Path) -> str:  # the sources at once: fully_fused_mlp.cu alone takes minutes
        obj = objects / f"{source.stem}.{stamp}.o"
        if not obj.is_file() or obj.stat().st_mtime < source.stat().st_mtime:
            r = subprocess.run([nvcc, *flags, "-c", str(source), "-o", str(obj)], capture_output=True, text=True)
            if r.returncode:
                raise BuildError(f"gpu_proxy tcnn: nvcc failed on {source}:\n{r.stdout}{r.stderr}")
        return str(obj)

    with ThreadPoolExecutor(len(inputs)) as pool:
        built = list(pool.map(compile_one, inputs))
    lib = out / "libtfmo_tcnn.so"
    r = subprocess.run([nvcc, "-shared", f"-arch={ARCH}", *built, "-o", str(lib)], capture_output=True, text=True)
    if r.returncode:
        raise BuildError(f"gpu_proxy tcnn: linking failed:\n{r.stdout}{r.stderr}")
    return lib


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the .metal files (default: metal_kernels/*.metal) to PTX")
    b.add_argument("files", nargs="*", type=Path)
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--msl", action="append", choices=sorted(MSL_VERSIONS), help="MSL version (repeatable; default both)")
    b.add_argument("--jobs", type=int, default=2)
    b.add_argument("--no-report", action="store_true", help="skip the ptxas register/stack report")
    t = sub.add_parser("tcnn", help="build tiny-cuda-nn's hash-grid kernels and FullyFusedMLP for dev/gpu_proxy/run.py --tcnn")
    t.add_argument("--src", type=Path, required=True, help="a tiny-cuda-nn checkout (with its fmt and cutlass submodules)")
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"))
    args = ap.parse_args(argv)
    if args.cmd == "tcnn":
        try:
            print(build_tcnn(args.src.resolve(), args.out, args.nvcc))
        except BuildError as e:
            print(e, file=sys.stderr)
            return 1
        return 0
    try:
        manifest = build(args.out, args.files or None, tuple(args.msl or ("3.0", "2.4")), args.jobs,
                         baselines=not args.files)
        if not args.no_report:
            print_register_report(args.out.resolve(), manifest)
    except BuildError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
