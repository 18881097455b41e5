#!/usr/bin/env python3
"""Builds the emulated GPU's **metal** backend: the unchanged ``csrc/metal/*.mm`` with the GPU host code, over test
doubles of Apple's stack (this folder: Foundation, libdispatch, malloc zones, Metal, and a tensorflow-metal-like
PluggableDevice), on the GNUstep Objective-C runtime (libobjc2). A development tool: neither it nor the doubles ship.

    python dev/apple_doubles/build.py [--coverage]     # prints the backend directory
    TF_METAL_OPS_EMULATED_GPU=<that directory> python examples/zero_out.py

The runtime is a test tool too: ``TF_METAL_OPS_OBJC_RUNTIME`` names it, either the unpacked directory (``include/``,
``lib/libobjc.so``) or its ``.tgz`` (unpacked into the cache). The build goes into the package's build cache, keyed by
the sources, compiler, TensorFlow and runtime; the directory holds ``backend.json`` (tf_metal_ops.emulated_gpu's
BACKEND_MANIFEST), which ``tf_metal_ops.emulated_gpu`` loads like any prebuilt backend.

Products: the Apple doubles (``libtfmo_apple_doubles.so``, holding the package's kernels compiled by
msl_emu, i.e. the "GPU"; the backend's runtime), the device, the GPU kernel library, and the doubles' metallibs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
from pathlib import Path

from tf_metal_ops import _builder, _env, emulated_gpu, metal_sources, msl_emu

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RUNTIME_SWITCH = "TF_METAL_OPS_OBJC_RUNTIME"
APPLE_LIBRARY = "libtfmo_apple_doubles.so"
DEVICE_LIBRARY = "libtfmo_apple_doubles_device.so"
KERNEL_LIBRARY = "libtf_metal_ops_apple_doubles.so"
METALLIBS = ("tf_metal_ops.metallib", "tf_metal_ops.metal3.metallib")
OBJC_FLAGS = ["-fobjc-runtime=gnustep-2.0", "-fobjc-arc", "-fblocks", "-fobjc-exceptions"]


class BuildError(RuntimeError):
    """The metal backend could not be built; the message says why."""


def objc_runtime() -> Path:
    """The libobjc2 directory named by TF_METAL_OPS_OBJC_RUNTIME (a .tgz is unpacked into the cache once)."""
    value = os.environ.get(RUNTIME_SWITCH, "")
    if not value:
        raise BuildError(
            f"the metal backend over the Apple doubles needs the GNUstep Objective-C runtime (libobjc2): set "
            f"{RUNTIME_SWITCH} to its directory or .tgz (in this project: ../shared/objc-runtime/*.tgz)")
    path = Path(value)
    if path.is_file():
        out = _env.cache_root() / "objc-runtime" / _builder.content_key([path.name], [path], length=12)
        if not (out / "libobjc2" / "lib").is_dir():
            out.mkdir(parents=True, exist_ok=True)
            with tarfile.open(path) as t:
                t.extractall(out, filter="data")
        path = out / "libobjc2"
    if not (path / "include" / "objc" / "runtime.h").is_file() or not (path / "lib").is_dir():
        raise BuildError(f"{RUNTIME_SWITCH}={value} is not a libobjc2 directory (include/objc, lib/)")
    return path


def build(coverage: bool | None = None) -> Path:
    """Builds the metal backend into the cache (once per content key) and returns its directory. `coverage`: host
    code with clang's source-based coverage (default: TF_METAL_OPS_EMULATED_GPU_COVERAGE=1)."""
    coverage = _env.emulated_gpu_coverage() if coverage is None else coverage
    cov = emulated_gpu.COVERAGE_FLAGS if coverage else []
    runtime = objc_runtime()
    root = REPO
    compiler = emulated_gpu.find_compiler()
    tf_include, tf_lib = emulated_gpu.tensorflow_dirs()
    extra = ["metal-backend", str(runtime), *sorted(p.name for p in (runtime / "lib").iterdir())]
    files = _builder.tree_files(HERE, ("include", "src")) + [Path(__file__), Path(metal_sources.__file__)]
    key = emulated_gpu.key(compiler, tf_include, tf_lib, root, extra, files)
    out = emulated_gpu.cache_root() / ("metal-" + key + ("-coverage" if cov else ""))
    _builder.cached_build(
        out, [KERNEL_LIBRARY, DEVICE_LIBRARY, APPLE_LIBRARY, emulated_gpu.BACKEND_MANIFEST],
        lambda work: make(work, root=root, compiler=compiler, tf_include=tf_include, tf_lib=tf_lib, runtime=runtime,
                          coverage=cov),
        BuildError)
    return out


def make(work: Path, *, root: Path, compiler: str, tf_include: str, tf_lib: str, runtime: Path,
         coverage: list[str]) -> list[str]:
    """Compiles and links the backend's libraries into `work`; returns the names of the other files to publish."""
    error = BuildError
    csrc = root / "csrc"
    doubles = HERE
    metal_files = sorted((root / "metal_kernels").glob("*.metal"))
    embedded = work / "metal_embedded_sources.cc"
    metal_sources.write_embedded_source(str(embedded), [str(f) for f in metal_files],
                                [str(root / "metal_kernels"), str(csrc / "shared")])

    tf_link = [f"-L{tf_lib}", "-l:libtensorflow_framework.so.2", f"-Wl,-rpath,{tf_lib}"]
    objc_link = [f"-L{runtime / 'lib'}", "-lobjc", f"-Wl,-rpath,{runtime / 'lib'}", "-lpthread", "-ldl"]
    common = ["-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter", "-DNDEBUG"]
    objc = ["-std=c++20", *common, *OBJC_FLAGS, f"-I{runtime / 'include'}", f"-I{doubles / 'include'}", f"-I{csrc}",
            f"-I{csrc / 'shared'}", f"-I{tf_include}"]
    emu_includes = [f"-I{d}" for d in msl_emu.include_dirs(root=root)]

    apple, kernels, device = [], [], []  # (source, object, flags)
    mrc = [f for f in objc if f != "-fobjc-arc"] + ["-fno-objc-arc"]  # foundation.mm, like Apple's, is not ARC
    for src in sorted((doubles / "src").glob("*.mm")):
        if src.name != "tensorflow_metal_device.mm":
            apple.append((src, work / f"apple_{src.stem}.o", mrc if src.name == "foundation.mm" else objc))
    apple.append((embedded, work / "apple_embedded.o", ["-std=c++20", *common, f"-I{csrc}"]))
    apple.append((msl_emu.launch_source(root), work / "kernel_launch.o", [*msl_emu.base_flags(), "-O2", *emu_includes]))
    units = msl_emu.generate(metal_files, work / "glue", root=root)
    for u in units:
        apple.append((u.source, work / f"glue_{u.source.stem}.o", [*msl_emu.base_flags(), "-O2", *u.flags]))
    host = ["-std=c++20", *common, f"-I{tf_include}", f"-I{csrc}", f"-I{csrc / 'shared'}", *coverage]
    for src in sorted((csrc / "gpu").glob("*.cc")) + [csrc / "common" / n for n in ("tfc.cc", "thread_pool.cc")]:
        kernels.append((src, work / f"k_{src.stem}.o", host))
    for src in sorted((csrc / "metal").glob("*.mm")):
        kernels.append((src, work / f"k_{src.stem}.o", [*objc, *coverage]))
    kernels.append((embedded, work / "k_embedded.o", ["-std=c++20", *common, f"-I{csrc}"]))
    device.append((doubles / "src" / "tensorflow_metal_device.mm", work / "device.o", objc))
    jobs = apple + kernels + device
    _builder.compile_all(compiler, jobs, "building the Apple doubles (compiling {name})", error)

    origin = ["-Wl,-rpath,$ORIGIN", f"-L{work}", "-l:" + APPLE_LIBRARY]
    _builder.run([compiler, "-shared", "-o", str(work / APPLE_LIBRARY), *[str(o) for _, o, _ in apple], *objc_link],
                 "building the Apple doubles (linking the Apple doubles)", error)
    _builder.run([compiler, "-shared", *coverage, "-o", str(work / KERNEL_LIBRARY), *[str(o) for _, o, _ in kernels],
                  *origin, *tf_link, *objc_link], "building the Apple doubles (linking the GPU kernels)", error)
    _builder.run([compiler, "-shared", "-o", str(work / DEVICE_LIBRARY), *[str(o) for _, o, _ in device], *origin,
                  *tf_link, *objc_link], "building the Apple doubles (linking the device)", error)
    # The doubles' metallib format (dev/apple_doubles/src/metal.mm): a magic line, then the kernels it holds.
    names = [k.name for u in units for k in u.kernels]
    for name in METALLIBS:
        (work / name).write_text("TFMO-MOCK-METALLIB 1\n" + "".join(n + "\n" for n in names))
    manifest = {"name": "metal", "device": DEVICE_LIBRARY, "kernels": KERNEL_LIBRARY, "runtime": APPLE_LIBRARY}
    (work / emulated_gpu.BACKEND_MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return [*METALLIBS]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--coverage", action="store_true", help="host code with clang source-based coverage")
    args = ap.parse_args(argv)
    try:
        print(build(coverage=args.coverage or None))
    except (BuildError, emulated_gpu.EmulatedGPUError) as e:
        print(f"dev/apple_doubles/build.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
