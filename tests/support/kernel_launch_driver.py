"""The test executable of kernels run by name (tests/msl_emu/launch/launch_driver.cc over csrc/emulated_gpu/kernel_launch.h,
no TensorFlow) and the scripts it reads: used by tests/test_emulated_kernel_launch.py and tests/test_msl_emu_atomics.py.

    exe = build(clang, [fixture.metal, ...])                 # ASan+UBSan, cached by a hash of what it is built from
    s = Script(tmp_path).kernel("k", grid=(n, 1, 1), group=(64, 1, 1)).buf(0, "float", x).cmd("launch")
    res, stderr, outs = run(exe, s)
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from support import msl_emu_build
from tf_metal_ops import msl_emu as glue  # the generator of the kernel-table units

REPO = Path(__file__).resolve().parents[2]
LAUNCH_DIR = REPO / "tests" / "msl_emu" / "launch"
DRIVER = LAUNCH_DIR / "launch_driver.cc"
# -O1 with ASan+UBSan: a thunk that casts a slot wrongly or indexes past a buffer is reported.
FLAGS = ["-O1", "-gline-tables-only", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
         "-fno-omit-frame-pointer", "-Werror"]


def _compile(clang: str, args: list[str]) -> None:
    res = subprocess.run([clang, *args], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise AssertionError(f"$ {clang} {' '.join(args)}\n{res.stdout}{res.stderr}")


def build(clang: str, metal_files: Sequence[Path], *, name: str = "launch", defines: Iterable[str] = ()):
    """(path of the launch driver linked with the glue of `metal_files`, the glue units); cached by a hash of
    everything it is built from (single-job compiles). `defines`: extra -D macros for every unit (MSL_EMU_VERSION=240)."""
    flags = FLAGS + [f"-D{d}" for d in defines]
    out_dir = msl_emu_build.cache_dir() / f"{name}-glue"  # stable, so unchanged sources keep the same hash
    units = glue.generate(list(metal_files), out_dir)
    h = hashlib.sha256()
    h.update(msl_emu_build._compiler_id(clang).encode())
    h.update("\0".join(flags + glue.base_flags()).encode())
    h.update(glue.content_hash(units, extra=[DRIVER, Path(__file__)]).encode())
    exe = msl_emu_build.cache_dir() / f"{name}_driver-{h.hexdigest()[:24]}"
    if exe.is_file():
        return exe, units
    inc = [f"-I{d}" for d in glue.include_dirs()]
    with tempfile.TemporaryDirectory(prefix=f"{name}-build-", dir=msl_emu_build.cache_dir()) as td:
        objs = []
        for u in units:
            obj = os.path.join(td, u.source.stem + ".o")
            _compile(clang, ["-x", "c++", *glue.base_flags(), *flags, *u.flags, "-c", str(u.source), "-o", obj])
            objs.append(obj)
        for src in (glue.launch_source(), DRIVER):
            obj = os.path.join(td, src.stem + ".o")
            _compile(clang, ["-x", "c++", *glue.base_flags(), *flags, *inc, "-c", str(src), "-o", obj])
            objs.append(obj)
        tmp = os.path.join(td, "a.out")
        _compile(clang, [*flags, *objs, "-o", tmp])
        os.replace(tmp, exe)
    return exe, units


class Script:
    """Builds a launch_driver script; files written under a temporary directory."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.lines: list[str] = []
        self.outs: dict[str, tuple[Path, np.dtype]] = {}
        self._n = 0

    def _file(self, data: bytes) -> Path:
        self._n += 1
        p = self.tmp / f"in{self._n}.bin"
        p.write_bytes(data)
        return p

    def kernel(self, name, *, grid=(1, 1, 1), group=(1, 1, 1), groups=False):
        self.lines += [f"kernel {name}", f"grid {'groups' if groups else 'threads'} {' '.join(map(str, grid))}",
                       f"group {' '.join(map(str, group))}"]
        return self

    def buf(self, slot, scalar, arr=None, *, nbytes=None, out=None, dtype=None):
        src = "-" if arr is None else str(self._file(np.ascontiguousarray(arr).tobytes()))
        n = nbytes if nbytes is not None else np.asarray(arr).nbytes
        dst = "-"
        if out is not None:
            self._n += 1
            p = self.tmp / f"out{self._n}.bin"
            self.outs[out] = (p, np.dtype(dtype))
            dst = str(p)
        self.lines.append(f"buf {slot} {scalar} {n} {src} {dst}")
        return self

    def bytes(self, slot, data: bytes):
        self.lines.append(f"bytes {slot} {len(data)} {self._file(data)}")
        return self

    def tgmem(self, index, n):
        self.lines.append(f"tgmem {index} {n}")
        return self

    def const(self, index, typ, value):
        bits = {"b": lambda v: int(bool(v)), "i": lambda v: v & 0xFFFFFFFF, "u": lambda v: v,
                "f": lambda v: struct.unpack("<I", struct.pack("<f", v))[0]}[typ](value)
        self.lines.append(f"const {index} {typ} {bits}")
        return self

    def cmd(self, line):
        self.lines.append(line)
        return self


def run(launcher, script: Script, env=None, check=True):
    """Runs the script through the driver `launcher` ((exe, units) of build()); (result, stderr, outputs by name).
    check: the exit status is 0 and no launch failed."""
    exe, _ = launcher
    full_env = dict(os.environ)
    full_env.update(msl_emu_build.SANITIZER_ENV)
    full_env.update(env or {})
    res = subprocess.run([str(exe)], input="\n".join(script.lines) + "\n", capture_output=True, text=True,
                         env=full_env, timeout=300, check=False)
    stderr = msl_emu_build.ASAN_FIBER_WARNING.sub("", res.stderr)
    if check:
        assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}{stderr}"
        assert not [l for l in res.stdout.splitlines() if l.startswith("launch: ERR")], res.stdout
    outs = {}
    if res.returncode == 0:
        for name, (p, dt) in script.outs.items():
            if p.exists():
                outs[name] = np.fromfile(p, dtype=dt)
    return res, stderr, outs
