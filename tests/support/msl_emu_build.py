"""Build and run MSL-emulation test drivers (csrc/msl_emu): the reusable part of the Metal-kernel tests.

A driver is a C++ file (tests/msl_emu/*_driver.cc) that #includes "harness.h" and then a .metal file, runs
the kernel with msl_emu::dispatch_threads and writes its outputs (pattern: csrc/msl_emu/README.md).

    exe = build_driver("tests/msl_emu/hash_grid_driver.cc")           # ASan+UBSan, cached
    out = run_driver(exe, inputs={"x": arr}, outputs={"y": arr.dtype}, scalars={"dtype": "float32"})
    out["y"]                                                             # numpy array

Conventions:
  - builds are cached under $TFMO_MSL_EMU_CACHE (default: <tmp>/tfmo-msl-emu-<uid>), keyed by a hash of the
    compiler, the flags and every file the build can read (csrc/msl_emu, csrc/shared, metal_kernels, the
    driver's directory), so editing any of them rebuilds; concurrent builds are safe (atomic rename);
  - every .metal file is staged (copied, with a #line directive back to the original) after rewriting
    `threadgroup` in pointer/reference types (`threadgroup float* p`) to MSL_EMU_TGP, because the header
    expands the `threadgroup` storage qualifier to `static thread_local`, which is illegal/wrong there;
  - the compiler is $TFMO_CLANGXX or clang++-16 on PATH; find_clang() returns None when missing (the tests'
    skip-or-fail policy lives in tests/support/native.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from support.paths import REPO_ROOT
from tf_metal_ops import msl_emu

REPO = Path(REPO_ROOT).resolve()


# `threadgroup T* p` -> `MSL_EMU_TGP T* p` (one implementation: tf_metal_ops.msl_emu).
rewrite_threadgroup_pointers = msl_emu.rewrite_threadgroup_pointers

EMU_INCLUDE = REPO / "csrc" / "msl_emu" / "include"
EMU_DIR = REPO / "csrc" / "msl_emu"
SHARED_DIR = REPO / "csrc" / "shared"
KERNELS_DIR = REPO / "metal_kernels"
DRIVERS_DIR = REPO / "tests" / "msl_emu"

CLANG_NAME = "clang++-16"
INSTALL_HINT = "install clang 16 (`apt-get install clang-16`) or point TFMO_CLANGXX at a clang++ >= 16"
BUILD_FLAGS = (
    "-std=c++20",
    "-O1",
    "-gline-tables-only",  # file:line in the sanitizer reports; full -g only costs compile time
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
)
SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1:abort_on_error=0:detect_stack_use_after_return=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}
EMU_ERROR_EXIT = 70  # msl_emu::kErrorExitCode (divergent barrier, bad dispatch, ...)
HARNESS_ERROR_EXIT = 2  # msl_emu::Harness::fail
# ASan prints this once per process when fibers switch; it is expected (the fibers are annotated).
ASAN_FIBER_WARNING = re.compile(r"^==\d+==WARNING: ASan doesn't fully support makecontext/swapcontext.*\n", re.M)

class DriverError(RuntimeError):
    """A driver failed to build or exited non-zero; the message carries the command and its stderr."""


def find_clang() -> str | None:
    """Path of the clang++ to use, or None."""
    override = os.environ.get("TFMO_CLANGXX")
    if override:
        return shutil.which(override) or (override if os.path.isfile(override) else None)
    return shutil.which(CLANG_NAME)


def cache_dir() -> Path:
    d = os.environ.get("TFMO_MSL_EMU_CACHE") or os.path.join(tempfile.gettempdir(), f"tfmo-msl-emu-{os.getuid()}")
    p = Path(d)
    p.mkdir(parents=True, exist_ok=True)
    return p


def _source_files(driver: Path) -> list[Path]:
    files: set[Path] = {driver, Path(msl_emu.__file__).resolve()}  # msl_emu.py: the staging rewrite
    for d in (EMU_DIR, SHARED_DIR, KERNELS_DIR, driver.parent):
        if d.is_dir():
            files.update(p for p in d.rglob("*") if p.is_file() and not p.name.startswith("."))
    return sorted(files)


def _compiler_id(clang: str) -> str:
    out = subprocess.run([clang, "--version"], capture_output=True, text=True, check=False)
    return f"{os.path.realpath(clang)}\n{out.stdout}"


def build_driver(
    driver: str | Path,
    *,
    defines: Iterable[str] = (),
    extra_flags: Iterable[str] = (),
    sanitize: bool = True,
    clang: str | None = None,
) -> Path:
    """Compiles `driver` (path, absolute or relative to the repo) and returns the executable (cached).

    defines: e.g. ["MSL_EMU_VERSION=230"]. Raises DriverError with the compiler output on failure.
    """
    clang = clang or find_clang()
    if clang is None:
        raise DriverError(f"{CLANG_NAME} not found: {INSTALL_HINT}")
    driver = Path(driver)
    if not driver.is_absolute():
        driver = REPO / driver
    flags = list(BUILD_FLAGS if sanitize else ("-std=c++20", "-O1", "-g"))
    flags += [f"-D{d}" for d in defines] + list(extra_flags)

    h = hashlib.sha256()
    h.update(_compiler_id(clang).encode())
    h.update("\0".join(flags).encode())
    for f in _source_files(driver):
        h.update(str(f.relative_to(REPO) if f.is_relative_to(REPO) else f).encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    key = h.hexdigest()[:24]
    root = cache_dir()
    exe = root / f"{driver.stem}-{key}"
    if exe.is_file():
        return exe

    # Stage the driver and every .metal file it might include (same directory, so `#include "x.metal"`
    # finds the rewritten copy before the original).
    stage = Path(tempfile.mkdtemp(prefix=f"{driver.stem}-", dir=root))
    try:
        metal_files = sorted(KERNELS_DIR.glob("*.metal")) + sorted(driver.parent.glob("*.metal"))
        for src in metal_files:
            text = rewrite_threadgroup_pointers(src.read_text())
            (stage / src.name).write_text(f'#line 1 "{src}"\n{text}')
        staged_driver = stage / driver.name
        staged_driver.write_text(f'#line 1 "{driver}"\n{driver.read_text()}')
        includes = [EMU_INCLUDE, EMU_DIR, SHARED_DIR, driver.parent, KERNELS_DIR]
        tmp_exe = stage / "a.out"
        cmd = [clang, "-x", "c++", *flags, *[f"-I{p}" for p in includes], str(staged_driver), "-x", "none",
               "-o", str(tmp_exe)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise DriverError(f"building {driver} failed:\n$ {' '.join(cmd)}\n{res.stdout}{res.stderr}")
        os.replace(tmp_exe, exe)  # atomic: concurrent builders race harmlessly
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return exe


def syntax_check(source: str | Path, *, defines: Iterable[str] = (), clang: str | None = None) -> subprocess.CompletedProcess:
    """clang -fsyntax-only on one .metal/.cc file with the emulation's include path (no rewriting)."""
    clang = clang or find_clang()
    if clang is None:
        raise DriverError(f"{CLANG_NAME} not found: {INSTALL_HINT}")
    cmd = [clang, "-x", "c++", "-std=c++20", "-fsyntax-only", *[f"-D{d}" for d in defines],
           f"-I{EMU_INCLUDE}", f"-I{EMU_DIR}", f"-I{SHARED_DIR}", str(source)]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


@dataclasses.dataclass
class DriverRun:
    returncode: int
    stdout: str
    stderr: str  # without ASan's one-line fiber warning
    outputs: dict[str, np.ndarray]
    seconds: float


def run_driver(
    exe: str | Path,
    *,
    inputs: Mapping[str, np.ndarray] = {},
    outputs: Mapping[str, np.dtype | str | type] = {},
    scalars: Mapping[str, object] = {},
    env: Mapping[str, str] | None = None,
    check: bool = True,
    timeout: float = 300,
) -> DriverRun:
    """Runs a driver on numpy arrays (flattened, C order, little-endian) and returns its outputs as 1-D arrays.

    outputs maps name -> dtype of the raw file the driver writes. With check=True a non-zero exit raises
    DriverError (message includes stderr); with check=False the caller inspects returncode/stderr.
    """
    import time

    with tempfile.TemporaryDirectory(prefix="msl-emu-run-") as td:
        args = [str(exe)]
        for name, arr in inputs.items():
            a = np.ascontiguousarray(arr)
            if a.dtype.byteorder == ">":
                a = a.astype(a.dtype.newbyteorder("<"))
            path = os.path.join(td, f"in_{name}.bin")
            a.tofile(path)
            args.append(f"in:{name}:{a.dtype.name}:{a.size}={path}")
        out_paths = {}
        for name in outputs:
            out_paths[name] = os.path.join(td, f"out_{name}.bin")
            args.append(f"out:{name}={out_paths[name]}")
        for name, value in scalars.items():
            if isinstance(value, bool):
                value = int(value)
            args.append(f"{name}={value}")
        full_env = dict(os.environ)
        full_env.update(SANITIZER_ENV)
        full_env.update(env or {})
        t0 = time.perf_counter()
        res = subprocess.run(args, capture_output=True, text=True, env=full_env, timeout=timeout, check=False)
        seconds = time.perf_counter() - t0
        stderr = ASAN_FIBER_WARNING.sub("", res.stderr)
        if check and res.returncode != 0:
            raise DriverError(f"$ {' '.join(args)}\nexit status {res.returncode}\n{res.stdout}{stderr}")
        result = {}
        if res.returncode == 0:
            for name, dtype in outputs.items():
                result[name] = np.fromfile(out_paths[name], dtype=np.dtype(dtype))
        return DriverRun(res.returncode, res.stdout, stderr, result, seconds)


class Toolchain:
    """build_driver/run_driver/syntax_check bound to one compiler (what the `msl_emu` pytest fixture returns)."""

    def __init__(self, clang: str):
        self.clang = clang

    def build(self, driver: str | Path, **kw) -> Path:
        return build_driver(driver, clang=self.clang, **kw)

    def syntax_check(self, source: str | Path, **kw) -> subprocess.CompletedProcess:
        return syntax_check(source, clang=self.clang, **kw)

    run = staticmethod(run_driver)
