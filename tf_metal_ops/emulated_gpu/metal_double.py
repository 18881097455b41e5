"""The Metal backend on Linux: ``TF_METAL_OPS_EMULATED_GPU=metal`` builds the unchanged Metal backend
(``csrc/metal/*.mm``) with the GPU host code, over test doubles of Apple's stack (tools/apple_mock: Foundation,
libdispatch, malloc zones, Metal, and a tensorflow-metal-like PluggableDevice), on the GNUstep Objective-C runtime
(libobjc2).

The runtime is a test tool and never ships: ``TF_METAL_OPS_OBJC_RUNTIME`` names it, either the unpacked directory
(``include/``, ``lib/libobjc.so``) or its ``.tgz`` (unpacked into the cache). Built at first use into the package
cache like the emulated GPU, keyed by the sources, compiler, TensorFlow and runtime.

Products (one directory): the doubles of Apple's stack (``libtfmo_apple_double.so``, holding the package's kernels
compiled by msl_emu, i.e. the "GPU"), the device, the GPU kernel library, and the double's metallibs.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from tf_metal_ops import _builder, _env

RUNTIME_SWITCH = _env.OBJC_RUNTIME
APPLE_LIBRARY = "libtfmo_apple_double.so"
DEVICE_LIBRARY = "libtfmo_metal_double_device.so"
KERNEL_LIBRARY = "libtf_metal_ops_metal_double.so"
METALLIBS = ("tf_metal_ops.metallib", "tf_metal_ops.metal3.metallib")
OBJC_FLAGS = ["-fobjc-runtime=gnustep-2.0", "-fobjc-arc", "-fblocks", "-fobjc-exceptions"]


def objc_runtime(error: type[Exception]) -> Path:
    """The libobjc2 directory named by TF_METAL_OPS_OBJC_RUNTIME (a .tgz is unpacked into the cache once)."""
    value = _env.objc_runtime()
    if not value:
        raise error(
            f"tf_metal_ops: TF_METAL_OPS_EMULATED_GPU=metal needs the GNUstep Objective-C runtime (libobjc2): set "
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
        raise error(f"tf_metal_ops: {RUNTIME_SWITCH}={value} is not a libobjc2 directory (include/objc, lib/)")
    return path


def key_parts(runtime: Path) -> list[str]:
    return ["metal-double", str(runtime), *sorted(p.name for p in (runtime / "lib").iterdir())]


def make(work: Path, *, root: Path, compiler: str, tf_include: str, tf_lib: str, runtime: Path, glue, coverage: list[str],
         error: type[Exception]) -> list[str]:
    """Compiles and links the Metal double's libraries into `work`; returns the metallib names (published too)."""
    csrc = root / "csrc"
    mock = root / "tools" / "apple_mock"
    metal_files = sorted((root / "metal_kernels").glob("*.metal"))
    tools = _builder.metal_sources_tool(root)
    embedded = work / "metal_embedded_sources.cc"
    tools.write_embedded_source(str(embedded), [str(f) for f in metal_files],
                                [str(root / "metal_kernels"), str(csrc / "shared")])

    tf_link = [f"-L{tf_lib}", "-l:libtensorflow_framework.so.2", f"-Wl,-rpath,{tf_lib}"]
    objc_link = [f"-L{runtime / 'lib'}", "-lobjc", f"-Wl,-rpath,{runtime / 'lib'}", "-lpthread", "-ldl"]
    common = ["-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter", "-DNDEBUG"]
    objc = ["-std=c++20", *common, *OBJC_FLAGS, f"-I{runtime / 'include'}", f"-I{mock / 'include'}", f"-I{csrc}",
            f"-I{csrc / 'shared'}", f"-I{tf_include}"]
    emu_includes = [f"-I{d}" for d in glue.include_dirs(root=root)]

    apple, kernels, device = [], [], []  # (source, object, flags)
    mrc = [f for f in objc if f != "-fobjc-arc"] + ["-fno-objc-arc"]  # foundation.mm, like Apple's, is not ARC
    for src in sorted((mock / "src").glob("*.mm")):
        if src.name != "tensorflow_metal_device.mm":
            apple.append((src, work / f"apple_{src.stem}.o", mrc if src.name == "foundation.mm" else objc))
    apple.append((embedded, work / "apple_embedded.o", ["-std=c++20", *common, f"-I{csrc}"]))
    apple.append((glue.launch_source(root), work / "kernel_launch.o", [*glue.base_flags(), "-O2", *emu_includes]))
    units = glue.generate(metal_files, work / "glue", root=root)
    for u in units:
        apple.append((u.source, work / f"glue_{u.source.stem}.o", [*glue.base_flags(), "-O2", *u.flags]))
    host = ["-std=c++20", *common, f"-I{tf_include}", f"-I{csrc}", f"-I{csrc / 'shared'}", *coverage]
    for src in sorted((csrc / "gpu").glob("*.cc")) + [csrc / "common" / n for n in ("tfc.cc", "thread_pool.cc")]:
        kernels.append((src, work / f"k_{src.stem}.o", host))
    for src in sorted((csrc / "metal").glob("*.mm")):
        kernels.append((src, work / f"k_metal_{src.stem}.o", [*objc, *coverage]))
    kernels.append((embedded, work / "k_embedded.o", ["-std=c++20", *common, f"-I{csrc}"]))
    device.append((mock / "src" / "tensorflow_metal_device.mm", work / "device.o", objc))
    jobs = apple + kernels + device
    _builder.compile_all(compiler, jobs, "building the Metal double (compiling {name})", error)

    origin = ["-Wl,-rpath,$ORIGIN", f"-L{work}", "-l:" + APPLE_LIBRARY]
    _builder.run([compiler, "-shared", "-o", str(work / APPLE_LIBRARY), *[str(o) for _, o, _ in apple], *objc_link],
                 "building the Metal double (linking the doubles of Apple's stack)", error)
    _builder.run([compiler, "-shared", *coverage, "-o", str(work / KERNEL_LIBRARY), *[str(o) for _, o, _ in kernels],
                  *origin, *tf_link, *objc_link], "building the Metal double (linking the GPU kernels)", error)
    _builder.run([compiler, "-shared", "-o", str(work / DEVICE_LIBRARY), *[str(o) for _, o, _ in device], *origin,
                  *tf_link, *objc_link], "building the Metal double (linking the device)", error)
    # The double's metallib format (tools/apple_mock/src/metal.mm): a magic line, then the kernels it holds.
    names = [k.name for u in units for k in u.kernels]
    for name in METALLIBS:
        (work / name).write_text("TFMO-MOCK-METALLIB 1\n" + "".join(n + "\n" for n in names))
    return [*METALLIBS, APPLE_LIBRARY]
