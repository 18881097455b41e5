"""The op kit: build a TensorFlow op library of your own the way this package builds its ops, CPU and GPU.

    import tf_metal_ops.extension as ext
    lib = ext.load("my_ops", sources=["my_op.cc", "my_op_gpu.cc", "my_op.metal"])   # -> tf.load_op_library module
    lib.my_op(x)

Sources by kind (the layout of this package: docs/writing_ops.md):
  - ``*.cc`` / ``*.cpp``: op definitions and CPU kernels, against the TF C API and ``common/tfc.h`` (always built);
  - ``*_gpu.cc``: GPU kernels' host code against ``gpu/gpu_host.h`` (built where a GPU backend exists: macOS with the
    Metal backend; Linux with the emulated GPU, ``TF_METAL_OPS_EMULATED_GPU=1``);
  - ``*.metal``: Metal kernels (macOS: a metallib when ``xcrun metal`` exists, else embedded source compiled at first
    use; emulated GPU: compiled as C++ through csrc/msl_emu);
  - ``*.mm``: Objective-C++ (macOS only).
The package's helpers (``tfc.cc``, ``thread_pool.cc``, ``gpu_host.cc`` and the backend) are compiled into the
library from the package's own shipped sources, so the library depends on nothing but TensorFlow.

Builds are cached by content hash (sources, headers, flags, compiler, TensorFlow) under
``$TF_METAL_OPS_CACHE/extensions`` (default ``~/.cache/tf-metal-ops``); a second ``load`` of unchanged sources
only loads. Compiler errors are raised as ``BuildError`` with the compiler's messages, which name your files.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Iterable, Sequence

from tf_metal_ops import _builder, _env, emulated_gpu, metal_sources, msl_emu

# TensorFlow is imported in the functions that use it: setup.py's BuildExt and get_include() work without it.


class BuildError(RuntimeError):
    """A user op library failed to build; the message holds the compiler command and its output."""


IS_MAC = sys.platform == "darwin"
CPP_SUFFIXES = (".cc", ".cpp", ".cxx")


# ---- where things are ---------------------------------------------------------------------------------------
def get_include() -> str:
    """Directory of the package's public headers: ``#include "common/tfc.h"`` (C-API helpers, kernel registration),
    ``"common/thread_pool.h"``, ``"gpu/gpu_host.h"`` (GPU host layer), ``"shared/device_compat.h"`` (math that
    compiles as C++ and as Metal). Add ``tf.sysconfig.get_include()`` too (see compile_flags())."""
    pkg = Path(__file__).resolve().parent
    installed = pkg / "include"
    if (installed / "common" / "tfc.h").is_file():
        return str(installed)
    return str(emulated_gpu.source_root() / "csrc")


def compile_flags() -> list[str]:
    """Compiler flags for a user op library: include dirs of TF and of this package, C++17, PIC."""
    import tensorflow as tf

    shared = str(Path(get_include()) / "shared")
    return ["-std=c++17", "-fPIC", f"-I{tf.sysconfig.get_include()}", f"-I{get_include()}", f"-I{shared}"]


def link_flags() -> list[str]:
    """Linker flags: TensorFlow's framework library (one binary loads in every TF >= 2.16 through the C API)."""
    import tensorflow as tf

    lib = tf.sysconfig.get_lib()
    if IS_MAC:
        return [f"-L{lib}", "-ltensorflow_framework.2", f"-Wl,-rpath,{lib}", "-undefined", "dynamic_lookup",
                "-framework", "Metal", "-framework", "Foundation"]
    return [f"-L{lib}", "-l:libtensorflow_framework.so.2", f"-Wl,-rpath,{lib}", "-lpthread", "-Wl,-Bsymbolic"]


def _runtime_sources(gpu: str | None) -> list[Path]:
    """The package's helper sources compiled into every user library (and the GPU backend when gpu is set)."""
    csrc = emulated_gpu.source_root() / "csrc"
    out = [csrc / "common" / "tfc.cc", csrc / "common" / "thread_pool.cc", csrc / "common" / "shape_fns.cc"]
    if gpu == "metal":
        out += [csrc / "gpu" / "gpu_host.cc", *sorted((csrc / "metal").glob("*.mm"))]
    elif gpu == "direct":
        out += [csrc / "gpu" / "gpu_host.cc", csrc / "common" / "inline_library.cc", csrc / "emulated_gpu" / "direct_backend.cc"]
    return out


def gpu_backend() -> str | None:
    """Which GPU backend a library built now gets: "metal" (macOS), "direct" (the emulated GPU is enabled or
    requested), or None (CPU kernels only)."""
    if IS_MAC:
        return "metal"
    if emulated_gpu.enabled() or emulated_gpu.requested():
        return "direct"
    return None


def find_cxx(gpu: str | None) -> str:
    """The C++ compiler: clang++ >= 16 for the emulated GPU (csrc/msl_emu needs it), else $CXX, c++, g++, clang++."""
    if gpu == "direct":
        return emulated_gpu.find_compiler()
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    hint = "install Xcode's command-line tools (`xcode-select --install`)" if IS_MAC else \
        "install a C++ compiler (Debian/Ubuntu: `apt-get install g++`, or clang-16 for the emulated GPU)"
    raise BuildError(f"tf_metal_ops.extension: no C++ compiler found: {hint}, or set CXX")


# ---- building ------------------------------------------------------------------------------------------------
def _classify(sources: Sequence[str | os.PathLike]) -> dict[str, list[Path]]:
    kinds: dict[str, list[Path]] = {"cpu": [], "gpu": [], "metal": [], "objc": []}
    for s in sources:
        p = Path(s).resolve()
        if not p.is_file():
            raise BuildError(f"tf_metal_ops.extension: source {s} does not exist")
        if p.suffix == ".metal":
            kinds["metal"].append(p)
        elif p.suffix == ".mm":
            kinds["objc"].append(p)
        elif p.suffix in CPP_SUFFIXES:
            kinds["gpu" if p.stem.endswith("_gpu") else "cpu"].append(p)
        else:
            raise BuildError(f"tf_metal_ops.extension: {s}: unknown source kind (expected .cc, .cpp, .mm or .metal)")
    if not kinds["cpu"]:
        raise BuildError("tf_metal_ops.extension: no C++ source with op definitions (*.cc other than *_gpu.cc)")
    return kinds


def _headers_near(files: Iterable[Path]) -> list[Path]:
    dirs = {f.parent for f in files}
    return sorted(h for d in dirs for h in d.glob("*") if h.suffix in (".h", ".hpp", ".metal") and h.is_file())


def _key(name: str, compiler: str, gpu: str | None, kinds, flags: Sequence[str], ldflags: Sequence[str]) -> str:
    import tensorflow as tf

    parts = [name, _builder.compiler_identity(compiler), tf.__version__, str(gpu), sys.version, *flags, "|", *ldflags]
    files = [f for fs in kinds.values() for f in fs]
    files += _headers_near(files) + _builder.tree_files(emulated_gpu.source_root(), ("csrc", "csrc/msl_emu"))
    return _builder.content_key(parts, [*files, Path(__file__), Path(msl_emu.__file__)])


def build(name: str, sources: Sequence[str | os.PathLike], *, extra_cflags: Sequence[str] = (),
          extra_ldflags: Sequence[str] = (), build_directory: str | os.PathLike | None = None,
          verbose: bool = False) -> Path:
    """Compiles the library (or finds it in the cache) and returns its path. See load()."""
    if not name.isidentifier():
        raise ValueError(f"tf_metal_ops.extension: name must be an identifier, got {name!r}")
    gpu = gpu_backend()
    kinds = _classify(sources)
    if kinds["objc"] and not IS_MAC:
        kinds["objc"] = []  # Objective-C++ is macOS-only
    cxx = find_cxx(gpu)
    # TF_METAL_OPS_EMULATED_GPU_COVERAGE=1 (dev/emulated_gpu_coverage.py): host code instrumented, as the package's own.
    cov = emulated_gpu.coverage_flags() if gpu == "direct" else []
    flags = [*compile_flags(), "-O2", "-fvisibility=hidden", "-DNDEBUG", *cov, *extra_cflags]
    ldflags = [*link_flags(), *cov, *extra_ldflags]
    root = Path(build_directory) if build_directory else _env.cache_root() / "extensions"
    out_dir = root / f"{name}-{_key(name, cxx, gpu, kinds, flags, ldflags)}{'-coverage' if cov else ''}"
    lib_name = f"lib{name}.so"

    def make(work: Path):
        if verbose:
            print(f"tf_metal_ops.extension: building {name} ({gpu or 'CPU'} kernels) in {work}", file=sys.stderr)
        jobs: list[tuple[Path, list[str]]] = []  # (source, flags)
        cpu_sources = kinds["cpu"] + ([s for s in _runtime_sources(gpu) if s.suffix != ".mm"])
        gpu_sources = kinds["gpu"] if gpu else []
        cxx_std = "-std=c++20" if gpu == "direct" else "-std=c++17"
        for s in cpu_sources + gpu_sources:
            jobs.append((s, [*[f for f in flags if not f.startswith("-std=")], cxx_std, f"-I{s.parent}"]))
        if gpu == "metal":
            objc = [*flags, "-x", "objective-c++", "-fobjc-arc", "-fblocks"]
            for s in kinds["objc"]:
                jobs.append((s, [*objc, f"-I{s.parent}"]))
            # The Metal backend's files include its internal headers as "metal/...", which get_include() lacks.
            for s in [p for p in _runtime_sources(gpu) if p.suffix == ".mm"]:
                jobs.append((s, [*objc, f"-I{s.parent.parent}"]))
            jobs.append((_embedded_metal(kinds["metal"], work), [*flags]))  # the backend needs the table, even empty
        elif gpu == "direct" and kinds["metal"]:
            units = msl_emu.generate(kinds["metal"], work / "glue")
            for u in units:
                jobs.append((u.source, [*msl_emu.base_flags(), "-O2", *u.flags]))
            jobs.append((msl_emu.launch_source(), [*msl_emu.base_flags(), "-O2",
                                                *[f"-I{d}" for d in msl_emu.include_dirs()]]))
        objects = [str(work / f"{i:03d}_{source.stem}.o") for i, (source, _) in enumerate(jobs)]
        _builder.compile_all(cxx, [(source, obj, job_flags) for obj, (source, job_flags) in zip(objects, jobs)],
                             "tf_metal_ops.extension: compiling {source}", BuildError)
        _builder.run([cxx, "-shared", "-o", str(work / lib_name), *objects, *ldflags],
                     f"tf_metal_ops.extension: linking {lib_name}", BuildError)
        if gpu == "metal" and kinds["metal"]:
            _build_metallib(kinds["metal"], work)
        return [f.name for f in work.iterdir() if f.suffix == ".metallib"]

    return _builder.cached_build(out_dir, [lib_name], make, BuildError) / lib_name


def _embedded_metal(metal_files: list[Path], work: Path) -> Path:
    out = work / "metal_embedded_sources.cc"
    dirs = sorted({str(f.parent) for f in metal_files}) + [str(Path(get_include()) / "shared")]
    metal_sources.write_embedded_source(str(out), [str(f) for f in metal_files], dirs)
    return out


def _build_metallib(metal_files: list[Path], work: Path) -> None:
    dirs = sorted({str(f.parent) for f in metal_files}) + [str(Path(get_include()) / "shared")]
    metal_sources.build_metallib([str(f) for f in metal_files], dirs, str(work / "tf_metal_ops.metallib"))


def load(name: str, sources: Sequence[str | os.PathLike], *, extra_cflags: Sequence[str] = (),
         extra_ldflags: Sequence[str] = (), build_directory: str | os.PathLike | None = None,
         verbose: bool = False):
    """Builds (first call; cached by content) and loads an op library from your sources; returns the module of
    ``tf.load_op_library`` (one snake_case function per op). Like ``torch.utils.cpp_extension.load``.

    On Linux it builds the CPU kernels, plus the GPU kernels on the emulated GPU when TF_METAL_OPS_EMULATED_GPU=1
    (import tf_metal_ops first so the device exists); on macOS the Metal kernels too."""
    import tensorflow as tf

    if gpu_backend() == "direct" and not emulated_gpu.enabled():
        emulated_gpu.enable()
    path = build(name, sources, extra_cflags=extra_cflags, extra_ldflags=extra_ldflags,
                 build_directory=build_directory, verbose=verbose)
    module = tf.load_op_library(str(path))
    module.library_path = str(path)  # e.g. for tf_metal_ops.emulated_gpu.dispatch_counts(library=...)
    return module


# ---- packaging: build a user's op library at `pip install` time ----------------------------------------------
def _setuptools_classes():
    from setuptools import Extension
    from setuptools.command.build_ext import build_ext as _build_ext

    class OpLibrary(Extension):
        """An op library in a user's setup.py: ``OpLibrary("my_pkg.my_ops", sources=[...])`` is built by
        ``BuildExt`` into ``my_pkg/libmy_ops.so`` (+ a metallib on macOS); load it with
        ``tf.load_op_library(os.path.join(os.path.dirname(__file__), "libmy_ops.so"))``."""

        def __init__(self, name, sources, extra_cflags=(), extra_ldflags=()):
            super().__init__(name, sources=[str(s) for s in sources])
            self.extra_cflags, self.extra_ldflags = list(extra_cflags), list(extra_ldflags)

    class BuildExt(_build_ext):
        """build_ext that builds OpLibrary extensions with tf_metal_ops.extension.build (same flags, backends
        and checks as load()) and other extensions as usual. Needs tf_metal_ops and TensorFlow at build time
        (list both in the package's build-system requires)."""

        def build_extension(self, ext):
            if not isinstance(ext, OpLibrary):
                return super().build_extension(ext)
            short = ext.name.split(".")[-1]
            lib = build(short, [os.path.abspath(s) for s in ext.sources], extra_cflags=ext.extra_cflags,
                        extra_ldflags=ext.extra_ldflags, build_directory=os.path.abspath(self.build_temp),
                        verbose=True)
            dest_dir = os.path.dirname(self.get_ext_fullpath(ext.name))
            os.makedirs(dest_dir, exist_ok=True)
            for f in lib.parent.iterdir():
                if f.suffix in (".so", ".metallib"):
                    shutil.copy2(f, os.path.join(dest_dir, f.name))

        def get_ext_filename(self, fullname):
            ext = next((e for e in self.extensions if e.name == fullname), None)
            if isinstance(ext, OpLibrary):
                parts = fullname.split(".")
                return os.path.join(*parts[:-1], f"lib{parts[-1]}.so")
            return super().get_ext_filename(fullname)

    return OpLibrary, BuildExt


def __getattr__(name):  # OpLibrary / BuildExt import setuptools only when asked for
    if name in ("OpLibrary", "BuildExt"):
        OpLibrary, BuildExt = _setuptools_classes()
        globals().update(OpLibrary=OpLibrary, BuildExt=BuildExt)
        return globals()[name]
    raise AttributeError(name)
