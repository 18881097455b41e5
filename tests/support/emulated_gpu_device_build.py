"""Build the emulated Metal GPU PluggableDevice (PLUGIN_SOURCES in csrc/emulated_gpu/) and run Python with it loaded.

    plugin = build_plugin()                         # cached .so, built with clang++-16 if on PATH, else g++
    run = run_with_plugin(plugin, "import tensorflow as tf; ...", timeout=60)   # fresh python, plugin loaded first
    exe = build_native_test()                       # tests/native/emulated_device_test.cc

Conventions:
  - the plugin is compiled exactly as the project requires: -std=c++17 -O2 -fPIC -shared -Wall -Wextra -Werror
    against TensorFlow's C headers only, linked with -l:libtensorflow_framework.so.2 -lpthread;
  - builds are cached under $TFMO_EMU_DEVICE_CACHE (default <tmp>/tfmo-emu-device-<uid>), keyed by a hash of the
    compiler, flags, TensorFlow's include dir and the sources (with every header in csrc/emulated_gpu/), and published
    by atomic rename (concurrent builds are safe);
  - the compiler is $TFMO_CXX, else clang++-16 if on PATH, else g++.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

from support.paths import REPO_ROOT

REPO = Path(REPO_ROOT).resolve()
EMU_DIR = REPO / "csrc" / "emulated_gpu"
# The device library's sources: the list of tf_metal_ops.emulated_gpu.DEVICE_SOURCES (this module does not import
# the package).
PLUGIN_SOURCES = [EMU_DIR / name for name in ("device_memory.cc", "fault_reporter.cc", "streams.cc", "emu_stream.cc",
                                              "device_copies.cc", "se_plugin.cc", "device_stats.cc")]
NATIVE_TEST_SOURCE = REPO / "tests" / "native" / "emulated_device_test.cc"
PLUGIN_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror")
NATIVE_TEST_FLAGS = ("-std=c++17", "-O1", "-g", "-Wall", "-Wextra", "-Werror")

# Loads the plugin before anything else touches TensorFlow (a PluggableDevice must be registered before the first op).
PRELUDE = """\
import os, sys
from tensorflow.python.framework import load_library
load_library.load_pluggable_device_library(os.environ["TFMO_EMU_DEVICE_PLUGIN"])
"""


class BuildError(RuntimeError):
    pass


def tf_paths() -> tuple[str, str]:
    """(TensorFlow include dir, TensorFlow package dir holding libtensorflow_framework.so.2), asked of a subprocess
    so that this module does not import TensorFlow itself."""
    out = subprocess.run(
        [sys.executable, "-c",
         "import os, tensorflow as tf; print(tf.sysconfig.get_include()); print(os.path.dirname(tf.__file__))"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    if out.returncode != 0:
        raise BuildError(f"cannot locate TensorFlow:\n{out.stderr}")
    include, libdir = out.stdout.strip().splitlines()[-2:]
    return include, libdir


_TF_PATHS: tuple[str, str] | None = None


def _tf() -> tuple[str, str]:
    global _TF_PATHS
    if _TF_PATHS is None:
        _TF_PATHS = tf_paths()
    return _TF_PATHS


def find_compiler() -> str:
    """$TFMO_CXX, else clang++-16 on PATH, else g++."""
    env = os.environ.get("TFMO_CXX")
    if env:
        return env
    return shutil.which("clang++-16") or shutil.which("g++") or "g++"


def cache_dir() -> Path:
    d = Path(os.environ.get("TFMO_EMU_DEVICE_CACHE") or Path(tempfile.gettempdir()) / f"tfmo-emu-device-{os.getuid()}")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _compile(cxx: str, args: Sequence[str], sources: Sequence[Path], name: str, out_dir: Path | None,
             suffix: str = "") -> Path:
    h = hashlib.sha256()
    for part in (cxx, *args):
        h.update(part.encode() + b"\0")
    for src in (*sources, *sorted(EMU_DIR.glob("*.h"))):
        h.update(str(src).encode() + b"\0" + src.read_bytes())
    target_dir = Path(out_dir) if out_dir is not None else cache_dir()
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / f"{name}-{h.hexdigest()[:16]}{suffix}"
    if target.exists():
        return target
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    run = subprocess.run([cxx, *args, "-o", str(tmp)], capture_output=True, text=True, timeout=600)
    if run.returncode != 0 or run.stderr.strip():
        tmp.unlink(missing_ok=True)
        raise BuildError(f"{cxx} failed (exit {run.returncode}):\n{' '.join([cxx, *args])}\n{run.stdout}{run.stderr}")
    os.replace(tmp, target)
    return target


def build_plugin(cxx: str | None = None, out_dir: Path | None = None, extra_flags: Sequence[str] = ()) -> Path:
    """Compiles the plugin (warnings are errors; any compiler output fails the build); returns the .so path.
    extra_flags: e.g. ("-g", "-fsanitize=thread") for a sanitizer build (the native test then needs the same)."""
    cxx = cxx or find_compiler()
    include, libdir = _tf()
    args = [*PLUGIN_FLAGS, *extra_flags, f"-I{include}", *map(str, PLUGIN_SOURCES), f"-L{libdir}",
            "-l:libtensorflow_framework.so.2", "-lpthread"]
    return _compile(cxx, args, PLUGIN_SOURCES, f"tfmo_emu_device_{Path(cxx).name}", out_dir, suffix=".so")


def build_native_test(cxx: str | None = None, out_dir: Path | None = None, extra_flags: Sequence[str] = ()) -> Path:
    """Compiles tests/native/emulated_device_test.cc (dlopens the plugin given on its command line)."""
    cxx = cxx or find_compiler()
    include, libdir = _tf()
    args = [*NATIVE_TEST_FLAGS, *extra_flags, f"-I{EMU_DIR}", f"-I{include}", str(NATIVE_TEST_SOURCE), f"-L{libdir}",
            "-l:libtensorflow_framework.so.2", f"-Wl,-rpath,{libdir}", "-ldl", "-lpthread"]
    return _compile(cxx, args, [NATIVE_TEST_SOURCE], f"emulated_device_test_{Path(cxx).name}", out_dir)


def run_with_plugin(plugin: Path, code: str, *, env: Mapping[str, str] | None = None, timeout: float = 60,
                    args: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh python with the plugin loaded first (TFMO_EMU_DEVICE_PLUGIN holds its path)."""
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TFMO_EMU_DEVICE_PLUGIN": str(plugin), **(env or {})}
    return subprocess.run([sys.executable, "-c", PRELUDE + code, *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=str(REPO))
