"""The emulated GPU: a Metal-emulating TensorFlow GPU device, so the package's GPU code path runs inside TensorFlow on
any Linux machine.

Opt-in, for development and tests: set ``TF_METAL_OPS_EMULATED_GPU=1`` (or ``=direct``) before ``import tf_metal_ops``
(or call ``enable()`` before TensorFlow runs its first op). The first use compiles, into the package cache, and loads

1. the device: a PluggableDevice (``DEVICE_SOURCES`` in ``csrc/emulated_gpu/``) registering device type ``"GPU"``,
   whose memory lives at addresses that fault when host code reads them and whose streams are serial queues;
2. the op library's GPU kernels (``csrc/gpu/*.cc``, the same host code the Metal build compiles) on the emulated GPU's
   **direct** backend (``csrc/emulated_gpu/direct_backend.cc``), with the unchanged ``metal_kernels/*.metal`` compiled
   as C++ through the MSL-on-CPU runtime (``csrc/msl_emu``, ``tf_metal_ops.msl_emu``), each dispatch checked against
   the kernel's ``[[buffer(n)]]`` signature.

Then every TF program sees ``/GPU:0`` and the ops placed there run their Metal kernels on the CPU. It is slow (a
kernel thread is a C++ call) and cannot show GPU rounding, races that the emulated order hides, or anything of the
Metal backend itself: see docs/emulated_gpu.md.

A backend built elsewhere is loaded from its directory: ``TF_METAL_OPS_EMULATED_GPU=/path/to/dir``, where
``dir/backend.json`` names the backend and its libraries (``BACKEND_MANIFEST``). The repository's development tool
``dev/apple_doubles/build.py`` builds the **metal** backend that way: the unchanged ``csrc/metal/*.mm`` over test
doubles of Apple's stack. That tool is not part of the package.

Needs clang++ >= 16 (``apt-get install clang-16``, or ``TF_METAL_OPS_CLANGXX``). The build is cached under
``$TF_METAL_OPS_CACHE`` (default ``$XDG_CACHE_HOME/tf-metal-ops``), keyed by the sources, compiler and TensorFlow.

    >>> import os
    >>> os.environ["TF_METAL_OPS_EMULATED_GPU"] = "1"   # before TensorFlow runs its first op  # doctest: +SKIP
    >>> import tf_metal_ops, tensorflow as tf                                                  # doctest: +SKIP
    >>> with tf.device("/GPU:0"): y = tf_metal_ops.zero_out([[1, 2], [3, 4]])                 # doctest: +SKIP
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import sys
import threading
from pathlib import Path

from typing import Iterable

from tf_metal_ops import _builder, _env, _library, msl_emu

# TensorFlow is imported in the functions that use it: requested() and info() work without importing it.

ENV_SWITCH = _env.EMULATED_GPU
DEVICE_LIBRARY = "libtfmo_emulated_gpu_device.so"
KERNEL_LIBRARY = "libtf_metal_ops_emulated_gpu.so"
BACKEND_MANIFEST = "backend.json"  # {"name", "device", "kernels", "runtime"}: library file names in its directory
PLATFORM_NAME = "TFMO_EMULATED_METAL"
COVERAGE_SWITCH = _env.EMULATED_GPU_COVERAGE  # =1: host code with clang source-based coverage (own cache dir)
COVERAGE_FLAGS = ["-fprofile-instr-generate", "-fcoverage-mapping"]
# The device library's sources in csrc/emulated_gpu/ (C++17, TensorFlow's C headers only;
# tests/support/emulated_gpu_device_build.py builds the same list).
DEVICE_SOURCES = ("device_memory.cc", "fault_reporter.cc", "streams.cc", "emu_stream.cc", "device_copies.cc",
                  "se_plugin.cc", "device_stats.cc")


class EmulatedGPUError(RuntimeError):
    """The emulated GPU could not be built or loaded; the message says why and what to do."""


def requested() -> bool:
    """True when the environment asks for the emulated GPU (TF_METAL_OPS_EMULATED_GPU set to 1, direct, metal or a
    backend directory)."""
    return _env.emulated_gpu_request() is not None


def backend() -> str | None:
    """The backend TF_METAL_OPS_EMULATED_GPU asks for: "direct" (=1 or =direct), the name in a backend directory's
    manifest (=DIR; "metal" for dev/apple_doubles/build.py's), "metal" (=metal, which needs such a directory), else
    None."""
    request = _env.emulated_gpu_request()
    if request is None or request in ("direct", "metal"):
        return request
    try:
        return _manifest(Path(request))["name"]
    except EmulatedGPUError:
        return None


def _manifest(directory: Path) -> dict:
    path = directory / BACKEND_MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise EmulatedGPUError(
            f"tf_metal_ops: {ENV_SWITCH}={directory} is not an emulated GPU backend directory ({path}: {e}); "
            f"use 1 (the direct backend) or the directory a backend build printed") from None
    missing = [k for k in ("name", "device", "kernels") if not isinstance(manifest.get(k), str)]
    if missing:
        raise EmulatedGPUError(f"tf_metal_ops: {path} lacks {', '.join(missing)}")
    return manifest


def prebuilt(directory: str | os.PathLike) -> dict[str, Path]:
    """The libraries of the backend built into `directory` (its backend.json): {"device", "kernels", "runtime"}
    (runtime: the library that runs the kernels, compiles inline kernels and counts dispatches; the kernel library
    when the manifest names none)."""
    directory = Path(directory)
    manifest = _manifest(directory)
    out = {k: directory / manifest[k] for k in ("device", "kernels")}
    out["runtime"] = directory / manifest.get("runtime", manifest["kernels"])
    for k, p in out.items():
        if not p.is_file():
            raise EmulatedGPUError(f"tf_metal_ops: {directory / BACKEND_MANIFEST} names {p.name} ({k}), which is missing")
    return out


# ---- sources -------------------------------------------------------------------------------------------------
def source_root() -> Path:
    """Where csrc/, metal_kernels/ and csrc/msl_emu/ are: the wheel's package data (tf_metal_ops/_sources), or the
    source checkout this package was installed from in editable mode."""
    root = _env.source_root()
    if root is not None:
        return root
    raise EmulatedGPUError(
        "tf_metal_ops: the emulated GPU's sources are missing (looked in {} and {}); ".format(*_env.source_roots()) +
        "reinstall tf-metal-ops from a wheel or source tree built by this version's setup.py"
    )


def _sources(root: Path) -> dict[str, list[Path]]:
    csrc = root / "csrc"
    return {
        "device": [csrc / "emulated_gpu" / name for name in DEVICE_SOURCES],
        "host": sorted((csrc / "gpu").glob("*.cc")) + [csrc / "common" / n for n in
                                                       ("tfc.cc", "thread_pool.cc", "inline_library.cc")]
        + [csrc / "emulated_gpu" / "direct_backend.cc"],
        "metal": sorted((root / "metal_kernels").glob("*.metal")),
    }


# ---- toolchain -----------------------------------------------------------------------------------------------
def find_compiler() -> str:
    """clang++ >= 16 (msl_emu needs clang's ext_vector_type and C++20); a clear error when there is none. The search
    is _builder.find_clangxx (TF_METAL_OPS_CLANGXX, else clang++-16..19, clang++)."""
    try:
        return _builder.find_clangxx()
    except _builder.CompilerNotFound as e:
        if _env.clangxx():
            raise EmulatedGPUError(str(e)) from None
        raise EmulatedGPUError(
            "tf_metal_ops: the emulated GPU needs clang++ >= 16 to build its device "
            "(Debian/Ubuntu: `apt-get install clang-16`; or point TF_METAL_OPS_CLANGXX at a clang++ >= 16)"
        ) from None


def tensorflow_dirs() -> tuple[str, str]:
    """(include dir, lib dir) of the imported TensorFlow."""
    import tensorflow as tf

    return tf.sysconfig.get_include(), tf.sysconfig.get_lib()


def cache_root() -> Path:
    return _env.cache_root() / "emulated-gpu"


def coverage_flags() -> list[str]:
    """COVERAGE_FLAGS when TF_METAL_OPS_EMULATED_GPU_COVERAGE=1 (dev/emulated_gpu_coverage.py), else none."""
    return COVERAGE_FLAGS if _env.emulated_gpu_coverage() else []


# ---- build ---------------------------------------------------------------------------------------------------
def key(compiler: str, tf_include: str, tf_lib: str, root: Path, extra: Iterable[str] = (),
        extra_files: Iterable[Path] = ()) -> str:
    """The content key of a build of the GPU kernels from the sources at `root` (the compiler, TensorFlow, Python,
    every source the build reads, this module and msl_emu's generator); `extra`/`extra_files`: what else a backend
    build depends on."""
    import tensorflow as tf

    parts = [_builder.compiler_identity(compiler), tf.__version__, tf_include, tf_lib, sys.version, *extra]
    files = _builder.tree_files(root, ("csrc", "metal_kernels"))
    return _builder.content_key(parts, [*files, *extra_files, Path(msl_emu.__file__), Path(__file__)])


def build(verbose: bool = False, gpu_backend: str | None = None) -> dict[str, Path]:
    """Compiles the device and the direct backend's GPU kernel library into the cache (once per content hash);
    returns their paths {"device", "kernels", "runtime"}. The .metal files are compiled at MSL 3.0, or at MSL 2.4
    under TF_METAL_OPS_EMULATED_GPU_MSL=2.4 (no atomic_float: the kernels' CAS-loop paths; the host code gets the
    same MSL_EMU_VERSION, so NativeFloatAtomics answers false). A backend directory (TF_METAL_OPS_EMULATED_GPU=DIR,
    or `gpu_backend` given as a directory) is not compiled here: its libraries are returned."""
    request = gpu_backend or _env.emulated_gpu_request() or "direct"
    if request == "metal":
        raise EmulatedGPUError(
            f"tf_metal_ops: {ENV_SWITCH}=metal: the Metal backend over test doubles of Apple's stack is a development "
            "tool of the source repository, not part of the package: build it with `python dev/apple_doubles/build.py` "
            f"(it prints a directory) and set {ENV_SWITCH} to that directory")
    if request != "direct":
        return prebuilt(request)
    root = source_root()
    compiler = find_compiler()
    tf_include, tf_lib = tensorflow_dirs()
    cov = coverage_flags()
    msl = _env.emulated_gpu_msl()
    msl_defines = [] if msl == "3.0" else [f"-DMSL_EMU_VERSION={msl.replace('.', '')}0"]
    out = cache_root() / ("direct-" + key(compiler, tf_include, tf_lib, root, extra=msl_defines)
                          + ("-coverage" if cov else "") + ("" if msl == "3.0" else "-msl" + msl.replace(".", "")))

    def make(work: Path):
        if verbose:
            print(f"tf_metal_ops: building the emulated GPU into {out} (first use; about a minute)", file=sys.stderr)
        src = _sources(root)
        link = [f"-L{tf_lib}", "-l:libtensorflow_framework.so.2", f"-Wl,-rpath,{tf_lib}", "-lpthread"]
        common = ["-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter", "-DNDEBUG"]
        tf_flags = [f"-I{tf_include}", f"-I{root / 'csrc'}", f"-I{root / 'csrc' / 'shared'}"]
        units = msl_emu.generate(src["metal"], work / "glue", root=root)
        emu_includes = [f"-I{d}" for d in msl_emu.include_dirs(root=root)]
        jobs = []  # (source, object, flags)
        for f in src["host"]:
            jobs.append((f, work / (f.stem + ".o"), ["-std=c++20", *common, *msl_defines, *tf_flags, *cov]))
        jobs.append((msl_emu.launch_source(root), work / "kernel_launch.o", [*msl_emu.base_flags(), "-O2", *emu_includes]))
        for u in units:
            jobs.append((u.source, work / (u.source.stem + ".o"),
                         [*msl_emu.base_flags(), "-O2", *msl_defines, *u.flags]))
        kernel_objects = [str(o) for _, o, _ in jobs]
        device_objects = [str(work / f"device_{f.stem}.o") for f in src["device"]]
        jobs += [(f, Path(o), ["-std=c++17", *common, f"-I{tf_include}"]) for f, o in zip(src["device"], device_objects)]
        _builder.compile_all(compiler, jobs, "building the emulated GPU (compiling {name})", EmulatedGPUError)
        _builder.run([compiler, "-shared", *cov, "-o", str(work / KERNEL_LIBRARY), *kernel_objects, *link],
                     "building the emulated GPU (linking the GPU kernels)", EmulatedGPUError)
        _builder.run([compiler, "-shared", "-o", str(work / DEVICE_LIBRARY), *device_objects, *link],
                     "building the emulated GPU (linking the device)", EmulatedGPUError)
        return ()

    _builder.cached_build(out, [KERNEL_LIBRARY, DEVICE_LIBRARY], make, EmulatedGPUError)
    return {"device": out / DEVICE_LIBRARY, "kernels": out / KERNEL_LIBRARY, "runtime": out / KERNEL_LIBRARY}


# ---- load ----------------------------------------------------------------------------------------------------
_lock = threading.Lock()
_loaded: dict[str, Path] = {}
_loaded_name: list[str] = []


def enable(verbose: bool = True) -> dict[str, str]:
    """Builds (first use) and loads the emulated GPU device and the GPU kernels. Idempotent. Call it before
    TensorFlow runs its first op (importing tf_metal_ops with TF_METAL_OPS_EMULATED_GPU=1 does)."""
    with _lock:
        if _loaded:
            return {k: str(v) for k, v in _loaded.items()}
        import tensorflow as tf
        from tensorflow.python.framework import load_library

        if tf.config.list_physical_devices("GPU"):
            raise EmulatedGPUError(
                "tf_metal_ops: this TensorFlow already has a GPU device "
                f"({tf.config.list_physical_devices('GPU')[0].name}); the emulated GPU registers device type \"GPU\" "
                "and needs a TensorFlow without one (tensorflow-cpu, or CUDA_VISIBLE_DEVICES='')"
            )
        paths = build(verbose=verbose)
        name = backend() or "direct"
        _library.ops()  # op definitions first: the GPU kernels register for them
        load_library.load_pluggable_device_library(str(paths["device"]))
        # Logical, not physical: a context initialised before the plugin loaded lists the device but never uses it.
        if not tf.config.list_logical_devices("GPU"):
            raise EmulatedGPUError(
                "tf_metal_ops: the emulated GPU device loaded but TensorFlow lists no GPU: TensorFlow had already "
                f"initialised its devices. Set {ENV_SWITCH}=1 before the first TensorFlow op (import tf_metal_ops "
                "first, or call tf_metal_ops.emulated_gpu.enable() at the top of the program)"
            )
        if _env.no_gpu_kernels():
            raise EmulatedGPUError(
                "tf_metal_ops: TF_METAL_OPS_NO_GPU_KERNELS=1 is set, so no GPU kernel would be registered and every op "
                "would silently run on the CPU; unset it to use the emulated GPU")
        tf.load_op_library(str(paths["kernels"]))
        _loaded.update(paths)
        _loaded_name.append(name)
        return {k: str(v) for k, v in paths.items()}


def enabled() -> bool:
    """True once enable() has loaded the device in this process."""
    return bool(_loaded)


@functools.lru_cache(maxsize=None)
def _handle(which: str) -> ctypes.CDLL:
    if not _loaded:
        raise EmulatedGPUError("tf_metal_ops: the emulated GPU is not enabled in this process")
    mode = getattr(os, "RTLD_NOLOAD", 0)
    lib = ctypes.CDLL(str(_loaded[which]), mode=mode)
    return lib


def kernel_library() -> ctypes.CDLL:
    """ctypes handle on the loaded GPU kernel library (its extern "C" entry points)."""
    return _handle("kernels")


def loaded_backend() -> str | None:
    """"direct" or "metal": the backend whose GPU kernels this process loaded, else None."""
    return _loaded_name[0] if _loaded_name else None


def compiler_targets() -> list[ctypes.CDLL]:
    """The loaded libraries that compile inline kernels through tfmo_set_inline_compiler: the backend's runtime (the
    direct backend's kernel library; for the metal backend the Apple doubles, whose newLibraryWithSource: compiles
    through msl_emu)."""
    if not _loaded:
        return []
    return [_handle("runtime")]


def synchronize() -> None:
    """Waits until the device has run everything enqueued so far (ops return before their kernels ran)."""
    _handle("device").tfmo_emu_device_synchronize()


def dispatch_counts(sync: bool = True, library: str | None = None) -> dict[str, int]:
    """Kernel name -> number of dispatches the emulated GPU ran in this process (the GPU path really ran), for the
    package's GPU kernels or, with `library`, for an op library built with tf_metal_ops.extension.
    Synchronises first unless sync=False: kernels run asynchronously on the device's streams."""
    if sync:
        synchronize()
    lib = _handle("runtime") if library is None else ctypes.CDLL(str(library), mode=getattr(os, "RTLD_NOLOAD", 0))
    lib.tfmo_emu_dispatch_counts.restype = ctypes.c_char_p
    return json.loads(lib.tfmo_emu_dispatch_counts().decode())


class AtomicCounting:
    """What count_atomics() returns: ``launches`` (filled when the ``with`` block ends) is one dict per kernel launch
    that ran inside the block, in the order they ran:

    ``{"op", "kernel", "counted", "grid", "group", "grid_is_threadgroups", "threadgroup", "buffers"}``; ``counted``
    is false (and the last two keys absent) for inline kernels (tf_metal_ops.metal_kernel, compile_shader), which are
    not counted. ``buffers``: one per ``[[buffer(n)]]`` parameter, by slot: ``{"slot", "param", "bytes", "total",
    "parts"}``, ``parts`` the buffer divided at the ``split`` offsets given for that parameter name (each part has
    ``"begin"``, its first byte). ``threadgroup``, ``total`` and every part are counts ``{"rmw", "cas",
    "cas_failed", "load", "store"}``: read-modify-write calls (fetch_add/sub/and/or/xor/min/max, exchange),
    compare-exchange attempts, failed attempts (CAS-loop retries), atomic loads and stores (csrc/msl_emu/README.md,
    "Counting atomics", says what they mean and what the retries can show)."""

    def __init__(self, split: dict[str, Iterable[int]] | None):
        self.split = {}
        for name, offsets in (split or {}).items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"split: {name!r} is not a kernel parameter name")
            offs = [int(o) for o in offsets]
            if any(o < 0 for o in offs) or any(b <= a for a, b in zip(offs, offs[1:])):
                raise ValueError(f"split[{name!r}]: byte offsets must be >= 0 and ascending, got {offs}")
            self.split[name] = offs
        self.launches: list[dict] = []

    def _spec(self) -> bytes:
        return ";".join(f"{k}:{','.join(map(str, v))}" for k, v in self.split.items()).encode()

    def __enter__(self) -> "AtomicCounting":
        if loaded_backend() != "direct":
            raise EmulatedGPUError("tf_metal_ops: count_atomics needs the emulated GPU's direct backend "
                                   f"({ENV_SWITCH}=1); this process runs {loaded_backend() or 'no emulated GPU'}")
        with _lock:
            if _counting:
                raise EmulatedGPUError("tf_metal_ops: count_atomics is already active (one block at a time)")
            _counting.append(self)
        synchronize()  # work enqueued before the block is not counted
        lib = _handle("runtime")
        if lib.tfmo_emu_atomic_counting(1, self._spec()) != 0:
            raise ValueError(f"split: malformed {self.split!r}")
        return self

    def __exit__(self, *exc) -> None:
        try:
            synchronize()
            lib = _handle("runtime")
            lib.tfmo_emu_atomic_counts.restype = ctypes.c_char_p
            self.launches = json.loads(lib.tfmo_emu_atomic_counts().decode())
            lib.tfmo_emu_atomic_counting(0, b"")
        finally:
            with _lock:
                _counting.clear()


_counting: list[AtomicCounting] = []


def count_atomics(split: dict[str, Iterable[int]] | None = None) -> AtomicCounting:
    """Counts the atomic operations of every kernel the emulated GPU (direct backend) runs inside a ``with`` block,
    per launch and per buffer; ``split`` divides the buffer bound to a kernel parameter (by its name in the .metal
    source) at byte offsets, e.g. a table's levels. Counting is off outside such a block. The block synchronises on
    entry and exit (kernels run asynchronously), so the records are complete. Result: AtomicCounting.launches.

        >>> with tf_metal_ops.emulated_gpu.count_atomics(split={"acc": [4096]}) as c:  # doctest: +SKIP
        ...     g = tape.gradient(y, params)         # a hash grid's table gradient on /GPU:0
        >>> {r["kernel"]: sum(b["total"]["rmw"] for b in r["buffers"]) for r in c.launches}  # doctest: +SKIP
        {'hash_grid_fill_zero': 0, 'hash_grid_grad_params_float32': 1048576}
    """
    return AtomicCounting(split)


def metal_info() -> dict | None:
    """The Metal backend's own report (tfmo_metal_info: device, metallib, compile statistics, GPU errors) when this
    process runs the metal backend, else None."""
    if loaded_backend() != "metal":
        return None
    lib = kernel_library()
    lib.tfmo_metal_info.restype = ctypes.c_char_p
    return json.loads(lib.tfmo_metal_info().decode())


def device_stats() -> dict:
    """The emulated GPU's memory and stream statistics (live allocations, deferred frees, work run, failures)."""
    lib = _handle("device")
    lib.tfmo_emu_device_stats.restype = ctypes.c_char_p
    return json.loads(lib.tfmo_emu_device_stats().decode())


def info() -> dict:
    """For backend_info(): whether the emulated GPU is requested/enabled, and where its libraries are."""
    out = {"requested": requested(), "enabled": enabled(), "backend": loaded_backend() or backend()}
    if _loaded:
        out.update({k: str(v) for k, v in _loaded.items()})
        try:
            out["dispatches"] = sum(dispatch_counts().values())
            if loaded_backend() == "metal":
                out["metal"] = metal_info()
        except Exception as e:  # report, never raise
            out["error"] = str(e)
    return out
