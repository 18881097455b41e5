"""The one builder behind every build this package runs at run time: the emulated GPU (``emulated_gpu``), users' op
libraries (``extension``) and inline Metal kernels (``inline_kernels``).

    out = _builder.cached_build(root / f"{name}-{key}", ["libx.so"], make, error=MyError)

Invariants:
  - a build's directory is named by a content key (``content_key``) that covers everything its outputs depend on:
    the compiler's identity, the flags, the TensorFlow and Python versions where they matter, and the bytes of every
    input file; so a hit needs no check beyond the outputs' existence;
  - a published directory is complete: outputs are made in a private work directory, copied into a sibling staging
    directory and renamed into place (atomic; a concurrent identical build in another process loses harmlessly);
  - within one process, one build per directory runs at a time: other threads wait for it and reuse its result;
  - compile jobs run in parallel on every CPU; a failure raises the caller's error type with the command and the
    compiler's output.

The compiler of the MSL sources (the emulated GPU, inline kernels, the strict Metal-language check) is
``find_clangxx()``: clang++ >= 16, the version whose ext_vector_type, address spaces and C++20 they rely on.

The cache root is _env.cache_root(). Standard library and ``_env`` only, so ``msl_check`` can use it without the
rest of the package (dev/check_msl.py runs without TensorFlow).
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Callable, Iterable, Sequence

from tf_metal_ops import _env

CLANGXX_NAMES = ("clang++-16", "clang++-17", "clang++-18", "clang++-19", "clang++")


class CompilerNotFound(RuntimeError):
    """No clang++ >= 16 was found."""


def find_clangxx() -> str:
    """clang++ >= 16: TF_METAL_OPS_CLANGXX if set (an error when it is not clang++ >= 16), else the first of
    clang++-16..19, clang++ on PATH."""
    override = _env.clangxx()
    for name in [override] if override else CLANGXX_NAMES:
        path = shutil.which(name) or (name if os.path.isfile(name) else None)
        if path is None:
            continue
        major = _clang_major(path)
        if major is not None and major >= 16:
            return path
        if override:
            raise CompilerNotFound(f"tf_metal_ops: {_env.CLANGXX}={override} is not clang++ >= 16")
    raise CompilerNotFound(
        "tf_metal_ops needs clang++ >= 16 to check and compile Metal sources (Debian/Ubuntu: `apt-get install "
        f"clang-16`; or point {_env.CLANGXX} at a clang++ >= 16)"
    )


@functools.lru_cache(maxsize=16)
def _clang_major(path: str) -> int | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"clang version (\d+)", out)
    return int(m.group(1)) if m else None


@functools.lru_cache(maxsize=None)
def compiler_identity(compiler: str) -> str:
    """The compiler's resolved path and its ``--version`` text (part of every key)."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False).stdout
    return os.path.realpath(compiler) + "\0" + version


def content_key(parts: Iterable[str], files: Iterable[str | os.PathLike] = (), *, length: int = 20) -> str:
    """sha256 over `parts` (in order) and over each file's path and bytes (sorted, deduplicated)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(str(p).encode() + b"\0")
    for f in sorted({Path(f) for f in files}):
        h.update(str(f).encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:length]


def tree_files(root: Path, subdirs: Iterable[str]) -> list[Path]:
    """Every file under root/subdir for each subdir (no __pycache__), for content keys."""
    out = []
    for sub in subdirs:
        out += [p for p in (root / sub).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return out


def run(cmd: Sequence[str], what: str, error: type[Exception]) -> None:
    """Runs one build command; raises `error` with the command and its output when it fails."""
    res = subprocess.run(list(cmd), capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise error(f"{what} failed:\n$ {' '.join(cmd)}\n{res.stdout}{res.stderr}")


def run_parallel(jobs: Sequence[tuple[Sequence[str], str]], error: type[Exception]) -> None:
    """Runs (command, what) jobs on every CPU; the first failure is raised (as run() raises it)."""
    if len(jobs) == 1:
        run(jobs[0][0], jobs[0][1], error)
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(lambda job: run(job[0], job[1], error), jobs))


def compile_all(compiler: str, jobs: Iterable[tuple[Path, Path, Sequence[str]]], what: str,
                error: type[Exception]) -> None:
    """Compiles each (source, object, flags) job (``compiler *flags -c source -o object``) with run_parallel; `what`
    names a job in the error, formatted with ``{source}`` (its path) and ``{name}`` (its file name)."""
    run_parallel([([compiler, *flags, "-c", str(source), "-o", str(obj)],
                   what.format(source=source, name=Path(source).name)) for source, obj, flags in jobs], error)


_locks_guard = threading.Lock()
_locks: dict[Path, threading.Lock] = {}


def _lock_for(out_dir: Path) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(out_dir, threading.Lock())


def cached_build(out_dir: Path, outputs: Sequence[str], make: Callable[[Path], Iterable[str]],
                 error: type[Exception]) -> Path:
    """Returns `out_dir` holding `outputs`, building them first unless they are there.

    ``make(work)`` produces the outputs in the empty directory `work` and returns the names of any further files
    to publish (e.g. an optional metallib). Raises `error` (from make, or when publishing fails)."""
    out_dir = Path(out_dir)
    if all((out_dir / n).is_file() for n in outputs):
        return out_dir
    with _lock_for(out_dir):
        if all((out_dir / n).is_file() for n in outputs):
            return out_dir
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"{out_dir.name[:40]}.build-", dir=out_dir.parent))
        try:
            extra = list(make(work) or ())
            staged = Path(tempfile.mkdtemp(prefix=f"{out_dir.name[:40]}.stage-", dir=out_dir.parent))
            for name in dict.fromkeys([*outputs, *extra]):
                if not (work / name).is_file():
                    raise error(f"tf_metal_ops: the build in {work} did not produce {name}")
                shutil.copy2(work / name, staged / name)
            try:
                os.rename(staged, out_dir)  # atomic; a concurrent identical result is as good as ours
            except OSError:
                shutil.rmtree(staged, ignore_errors=True)
                if not all((out_dir / n).is_file() for n in outputs):
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return out_dir
