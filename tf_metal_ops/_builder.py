"""The one builder behind every build this package runs at run time: the emulated GPU (``emulated_gpu``), users' op
libraries (``extension``) and inline Metal kernels (``inline_kernels``).

    out = _builder.cached_build(root / f"{name}-{key}", ["libx.so"], make, error=MyError)

Invariants:
  - a build's directory is named by a content key (``content_key``) that covers everything its outputs depend on:
    the compiler's identity, the flags, the TensorFlow and Python versions where they matter, and the bytes of every
    input file; its manifest (tfmo-build.json) names the key and each output's SHA-256, checked on every hit;
  - the cache cannot be planted: directories are created 0700, and a directory or entry that another user owns,
    that group or others may write, or that is a symbolic link is never loaded (a warning, once, and the build goes
    to a private directory of the process instead);
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

import atexit
import concurrent.futures
import functools
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import threading
import warnings
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


# ---- the cache's safety -------------------------------------------------------------------------------------------
# A cache directory (the root, the directories under it, an entry) is used only when this user owns it, it is not a
# symbolic link and neither group nor others may write it; an entry's files likewise, and its manifest must name
# the key it was built for with each file's SHA-256. Otherwise the package warns once and builds in a private
# directory of this process instead, so a library another user planted is never loaded.
MANIFEST = "tfmo-build.json"
_warned: set[str] = set()
_private: list[Path] = []
_private_lock = threading.Lock()


class UnsafeCacheWarning(UserWarning):
    """A cache directory or entry another user could have written: it is not used."""


def unsafe_reason(path: Path) -> str | None:
    """Why `path` must not be trusted (a symbolic link, another user's, writable by group or others), else None."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if st.st_uid != os.getuid():
        return f"is owned by another user (uid {st.st_uid}, not {os.getuid()})"
    if st.st_mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _warn_once(path: Path, reason: str, instead: Path) -> None:
    if str(path) in _warned:
        return
    _warned.add(str(path))
    warnings.warn(f"tf_metal_ops: not using the build cache {path}: it {reason}; building in the private directory "
                  f"{instead} instead (fix the owner and permissions, e.g. `chmod go-w`, or set {_env.CACHE})",
                  UnsafeCacheWarning, stacklevel=4)


def private_root() -> Path:
    """A directory of this process only (0700), where builds go when the cache cannot be trusted."""
    with _private_lock:
        if not _private:
            d = Path(tempfile.mkdtemp(prefix="tf-metal-ops-private-cache-"))
            atexit.register(shutil.rmtree, d, True)
            _private.append(d)
        return _private[0]


def _safe_parent(out_dir: Path) -> Path:
    """`out_dir`, or where it goes in the private directory when a directory above it is not safe. Missing
    directories are created 0700: from the cache root down when out_dir is under it, else out_dir's parent."""
    root = _env.cache_root()
    try:
        rel = out_dir.relative_to(root)
        chain = [root, *[root.joinpath(*rel.parts[:i]) for i in range(1, len(rel.parts))]]
    except ValueError:
        rel, chain = Path(out_dir.name), [out_dir.parent]
    for d in chain:
        try:
            d.mkdir(mode=0o700, exist_ok=True)
            reason = unsafe_reason(d)
        except OSError as e:
            reason = f"cannot be created or read ({e})"
        if reason is not None:
            instead = private_root() / rel
            _warn_once(d, reason, instead.parent)
            instead.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            return instead
    return out_dir


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _entry_state(out_dir: Path, outputs: Sequence[str], key: str) -> str | None:
    """None when out_dir is a complete entry built for `key` that this user alone can write; "missing" when there is
    no entry; else why it must not be loaded."""
    if not os.path.lexists(out_dir):
        return "missing"
    reason = unsafe_reason(out_dir)
    if reason is not None:
        return reason
    try:
        manifest = json.loads((out_dir / MANIFEST).read_text())
        files = manifest["files"]
        if manifest.get("key") != key or not all(n in files for n in outputs):
            return "stale"
        for name, digest in files.items():
            reason = unsafe_reason(out_dir / name)
            if reason is not None:
                return f"holds {name}, which {reason}"
            if _file_digest(out_dir / name) != digest:
                return f"holds {name}, which is not the file built for it"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "stale"  # an incomplete entry, or one of a version that wrote no manifest
    return None


_locks_guard = threading.Lock()
_locks: dict[Path, threading.Lock] = {}


def _lock_for(out_dir: Path) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(out_dir, threading.Lock())


def cached_build(out_dir: Path, outputs: Sequence[str], make: Callable[[Path], Iterable[str]],
                 error: type[Exception], *, key: str | None = None) -> Path:
    """Returns the entry directory holding `outputs` for `key` (default: out_dir's name), building them first unless
    a safe entry built for that key is there. That is `out_dir`, or a directory of this process's private cache when
    the cache cannot be trusted (see unsafe_reason; a warning says so once).

    ``make(work)`` produces the outputs in the empty directory `work` and returns the names of any further files
    to publish (e.g. an optional metallib). Raises `error` (from make, or when publishing fails)."""
    out_dir = _safe_parent(Path(out_dir))
    key = key or out_dir.name
    state = _entry_state(out_dir, outputs, key)
    if state is None:
        return out_dir
    with _lock_for(out_dir):
        state = _entry_state(out_dir, outputs, key)
        if state is None:
            return out_dir
        if state == "stale":  # this user's own incomplete or older entry: replaced
            trash = Path(tempfile.mkdtemp(prefix=f"{out_dir.name[:40]}.old-", dir=out_dir.parent))
            try:
                os.rename(out_dir, trash / "entry")
            except OSError:
                pass
            shutil.rmtree(trash, ignore_errors=True)
        elif state != "missing":  # another user's, or writable by others: never loaded, not touched
            instead = private_root() / "entries" / out_dir.name
            _warn_once(out_dir, state, instead.parent)
            instead.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            return cached_build(instead, outputs, make, error, key=key)
        work = Path(tempfile.mkdtemp(prefix=f"{out_dir.name[:40]}.build-", dir=out_dir.parent))
        try:
            extra = list(make(work) or ())
            staged = Path(tempfile.mkdtemp(prefix=f"{out_dir.name[:40]}.stage-", dir=out_dir.parent))  # 0700
            files = {}
            for name in dict.fromkeys([*outputs, *extra]):
                if not (work / name).is_file():
                    raise error(f"tf_metal_ops: the build in {work} did not produce {name}")
                shutil.copy2(work / name, staged / name)
                os.chmod(staged / name, stat.S_IMODE(os.stat(staged / name).st_mode) & ~0o022)
                files[name] = _file_digest(staged / name)
            (staged / MANIFEST).write_text(json.dumps({"key": key, "files": files}, indent=1))
            try:
                os.rename(staged, out_dir)  # atomic; a concurrent identical result is as good as ours
            except OSError:
                shutil.rmtree(staged, ignore_errors=True)
                if _entry_state(out_dir, outputs, key) is not None:
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return out_dir
