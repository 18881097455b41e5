"""Type-checks and compiles the macOS build of the op library on Linux, against the real macOS SDK headers.

    python dev/check_mac_host.py                      # every csrc/**/*.mm and csrc/**/*.cc + embedded sources
    python dev/check_mac_host.py FILE...              # only these files
    python dev/check_mac_host.py --expect-fail FILE...  # negative controls: passes only if each FILE is rejected

Each file is compiled with clang++-16 for arm64-apple-macos12 and x86_64-apple-macos12 with -c (every diagnostic of
-fsyntax-only, plus code generation) to a Mach-O object whose header is verified (64-bit magic, CPU type). Flags: those of
the macOS build plus -Werror and -Werror=unguarded-availability-new (APIs newer than macOS 12 need @available).
Nothing is linked (the SDK copy has no libraries). Objects go to a temporary directory, never into the repo.

Environment:
  MACOS_SDK       an unpacked SDK directory (containing usr/include), used as is;
  MACOS_SDK_TGZ   else the SDK tarball (default: ../shared/macos-sdk/MacOSX13.3.sdk.min.tgz from the repo root),
                  unpacked once into $XDG_CACHE_HOME/tf-metal-ops/macos-sdk (default ~/.cache/...), outside the repo:
                  Apple's licence forbids copying the SDK into the project;
  CLANGXX         compiler (default clang++-16: clang 14 cannot parse the SDK's libc++);
  TF_INCLUDE      TensorFlow's C API headers (default: tensorflow/include of the installed tensorflow, found
                  without importing it).

Broken files may carry "// expect-error: TEXT" lines: with --expect-fail, each TEXT must appear in the
compiler's messages, so a file rejected for an unrelated reason does not count as caught.
Exit status: 0 when everything passed, 1 on any failure, 2 when the toolchain is missing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import hashlib
import importlib.util
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = ("arm64-apple-macos12", "x86_64-apple-macos12")
MH_MAGIC_64 = 0xFEEDFACF
CPU_TYPES = {"arm64": 0x0100000C, "x86_64": 0x01000007}  # CPU_TYPE_ARM64, CPU_TYPE_X86_64
EXPECT_RE = re.compile(r"//\s*expect-error:\s*(.+?)\s*$")
HOW_TO = (
    "to enable the Mac host check: `apt-get install clang-16` (or set CLANGXX), and set MACOS_SDK_TGZ to "
    "MacOSX13.3.sdk.min.tgz (or MACOS_SDK to an unpacked SDK)"
)


class ToolchainMissing(Exception):
    """clang++-16, the SDK or the TensorFlow headers are not available; the message says how to get them."""


# ---- Toolchain ---------------------------------------------------------------------------------------------
def find_clang() -> str:
    clang = os.environ.get("CLANGXX") or "clang++-16"
    path = shutil.which(clang)
    if path is None:
        raise ToolchainMissing(f"{clang} not found: {HOW_TO}")
    return path


def _inside_repo(path: str) -> bool:
    real, root = os.path.realpath(path), os.path.realpath(ROOT)
    return real == root or real.startswith(root + os.sep)


def _cache_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tf-metal-ops", "macos-sdk")


def _sdk_in(directory: str):
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        candidate = os.path.join(directory, name)
        if name.endswith(".sdk") and os.path.isdir(os.path.join(candidate, "usr", "include")):
            return candidate
    return None


def find_sdk() -> str:
    """Path of an unpacked macOS SDK (unpacking the tarball into the cache the first time)."""
    sdk = os.environ.get("MACOS_SDK")
    if sdk:
        if not os.path.isdir(os.path.join(sdk, "usr", "include")):
            raise ToolchainMissing(f"MACOS_SDK={sdk} is not an SDK directory (no usr/include): {HOW_TO}")
        return sdk
    tgz = os.environ.get("MACOS_SDK_TGZ") or os.path.join(ROOT, "..", "shared", "macos-sdk", "MacOSX13.3.sdk.min.tgz")
    tgz = os.path.abspath(tgz)
    if not os.path.isfile(tgz):
        raise ToolchainMissing(f"no macOS SDK: {tgz} does not exist; {HOW_TO}")
    st = os.stat(tgz)
    key = hashlib.sha256(f"{os.path.basename(tgz)}:{st.st_size}:{int(st.st_mtime)}".encode()).hexdigest()[:12]
    cache = os.path.join(_cache_root(), key)
    if _inside_repo(cache):
        raise ToolchainMissing(f"the SDK cache {cache} is inside the repository; set XDG_CACHE_HOME elsewhere")
    found = _sdk_in(cache)
    if found:
        return found
    os.makedirs(_cache_root(), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="unpack-", dir=_cache_root())
    try:
        with tarfile.open(tgz) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter="data")
            else:
                tar.extractall(tmp)
        if _sdk_in(tmp) is None:
            raise ToolchainMissing(f"{tgz} holds no *.sdk directory with usr/include")
        try:
            os.rename(tmp, cache)  # atomic: a concurrent run either wins or finds it done
        except OSError:
            if _sdk_in(cache) is None:
                raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return _sdk_in(cache)


def find_tf_include() -> str:
    inc = os.environ.get("TF_INCLUDE")
    if not inc:
        spec = importlib.util.find_spec("tensorflow")
        if spec is None or not spec.submodule_search_locations:
            raise ToolchainMissing("TensorFlow is not installed (its C API headers are needed); or set TF_INCLUDE")
        inc = os.path.join(list(spec.submodule_search_locations)[0], "include")
    if not os.path.isfile(os.path.join(inc, "tensorflow", "c", "kernels.h")):
        raise ToolchainMissing(f"{inc} has no tensorflow/c/kernels.h; set TF_INCLUDE")
    return inc


def toolchain():
    """(clang, sdk, tf_include); raises ToolchainMissing."""
    return find_clang(), find_sdk(), find_tf_include()


# ---- Sources -----------------------------------------------------------------------------------------------
def discover_sources():
    """The macOS build's sources: every csrc/**/*.mm and *.cc except csrc/emulated_gpu/ (the Linux-only emulated GPU)."""
    files = glob.glob(os.path.join(ROOT, "csrc", "**", "*.mm"), recursive=True)
    files += glob.glob(os.path.join(ROOT, "csrc", "**", "*.cc"), recursive=True)
    emulated = os.path.join(ROOT, "csrc", "emulated_gpu") + os.sep
    return sorted(f for f in files if not f.startswith(emulated))


def generate_embedded_source(out_dir: str) -> str:
    spec = importlib.util.spec_from_file_location("metal_sources", os.path.join(ROOT, "tf_metal_ops", "metal_sources.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    metal_files = sorted(glob.glob(os.path.join(ROOT, "metal_kernels", "*.metal")))
    include_dirs = [os.path.join(ROOT, "metal_kernels"), os.path.join(ROOT, "csrc", "shared")]
    out = os.path.join(out_dir, "metal_embedded_sources.cc")
    mod.write_embedded_source(out, metal_files, include_dirs)
    return out, len(metal_files)


# ---- Compiling ---------------------------------------------------------------------------------------------
def compile_flags(path: str, target: str, sdk: str, tf_include: str):
    lang = "objective-c++" if path.endswith(".mm") else "c++"
    flags = [
        "-x", lang, "--target=" + target, "-isysroot", sdk, "-nostdinc++", "-isystem",
        os.path.join(sdk, "usr", "include", "c++", "v1"), "-std=c++17",
        "-Wall", "-Wextra", "-Werror", "-Werror=unguarded-availability-new",
        "-fvisibility=hidden", "-DNDEBUG", "-DTFMO_WITH_METAL=1",  # as the macOS build (setup.py)
        "-I" + tf_include, "-I" + os.path.join(ROOT, "csrc"), "-I" + os.path.join(ROOT, "csrc", "shared"),
    ]
    if lang == "objective-c++":
        flags += ["-fobjc-arc", "-fblocks"]
    return flags


def check_macho(obj: str, arch: str):
    """None if obj is a 64-bit Mach-O object for arch, else what is wrong."""
    with open(obj, "rb") as f:
        header = f.read(8)
    if len(header) < 8:
        return "object file is truncated"
    magic, cputype = struct.unpack("<II", header)
    if magic != MH_MAGIC_64:
        return f"not a 64-bit Mach-O object (magic 0x{magic:08x})"
    if cputype != CPU_TYPES[arch]:
        return f"Mach-O CPU type 0x{cputype:08x}, expected {arch} (0x{CPU_TYPES[arch]:08x})"
    return None


def compile_one(clang, sdk, tf_include, path, target, obj_dir):
    """(ok, summary, compiler output) for one file and target."""
    flags = compile_flags(path, target, sdk, tf_include)
    t0 = time.monotonic()
    arch = target.split("-")[0]
    obj = os.path.join(obj_dir, "%s.%s.o" % (hashlib.sha1(path.encode()).hexdigest()[:10], arch))
    r = subprocess.run([clang] + flags + ["-c", path, "-o", obj], capture_output=True, text=True)
    if r.returncode != 0:
        return False, "object", r.stderr
    problem = check_macho(obj, arch)
    if problem:
        return False, "object", problem
    return True, "object: Mach-O 64 %s, %d bytes, %.1fs" % (
        arch, os.path.getsize(obj), time.monotonic() - t0), r.stderr


def _rel(path):
    return os.path.relpath(path, ROOT) if _inside_repo(path) else path


def run(files, expect_fail=False, jobs=None, show=print):
    """Compiles files for every target. Returns True when every file passed (expect_fail: was rejected, with its
    expect-error texts in the messages)."""
    clang, sdk, tf_include = toolchain()
    show(f"compiler: {clang}\nSDK: {sdk}\nTensorFlow C API: {tf_include}")
    failures = 0
    with tempfile.TemporaryDirectory(prefix="tfmo-mac-check-") as obj_dir:
        tasks = [(f, t) for f in files for t in TARGETS]
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
            results = list(pool.map(lambda ft: compile_one(clang, sdk, tf_include, ft[0], ft[1], obj_dir), tasks))
        by_file = {}
        for (path, target), (ok, summary, output) in zip(tasks, results):
            by_file.setdefault(path, []).append((target, ok, summary, output))
            if not expect_fail:
                show("%s  %-40s %-22s %s" % ("PASS" if ok else "FAIL", _rel(path), target,
                                            summary if ok else summary + " check failed"))
                if not ok:
                    failures += 1
                    show(_indent(output))
        if expect_fail:
            for path, outcomes in by_file.items():
                with open(path, encoding="utf-8") as f:
                    expected = [m.group(1) for m in map(EXPECT_RE.search, f) if m]
                for target, ok, summary, output in outcomes:
                    missing = [e for e in expected if e not in output]
                    if ok:
                        failures += 1
                        show("FAIL  %-40s %-22s compiled, but it must be rejected" % (_rel(path), target))
                    elif missing:
                        failures += 1
                        show("FAIL  %-40s %-22s rejected, but without %s:" % (_rel(path), target, missing))
                        show(_indent(output))
                    else:
                        first = next((line for line in output.splitlines() if "error:" in line), output.strip())
                        show("PASS  %-40s %-22s rejected: %s" % (_rel(path), target, _short(first)))
    total = len(files) * len(TARGETS)
    word = "rejected as expected" if expect_fail else "passed"
    show(f"summary: {total - failures}/{total} file x target checks {word} ({len(files)} files, {len(TARGETS)} targets)")
    return failures == 0


def _indent(text):
    return "\n".join("    " + line for line in text.strip().splitlines()[:40])


def _short(line):
    line = line.replace(ROOT + os.sep, "")
    return line if len(line) <= 160 else line[:157] + "..."


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="*", help="files to check (default: csrc/**/*.mm, csrc/**/*.cc, embedded sources)")
    p.add_argument("--expect-fail", nargs="+", metavar="FILE", help="files that must be rejected")
    p.add_argument("-j", "--jobs", type=int, default=None)
    a = p.parse_args(argv)
    try:
        if a.expect_fail:
            return 0 if run([os.path.abspath(f) for f in a.expect_fail], expect_fail=True, jobs=a.jobs) else 1
        if a.files:
            return 0 if run([os.path.abspath(f) for f in a.files], jobs=a.jobs) else 1
        with tempfile.TemporaryDirectory(prefix="tfmo-embedded-") as gen_dir:
            embedded, n_metal = generate_embedded_source(gen_dir)
            files = discover_sources()
            print(f"sources: {len(files)} from csrc/ + embedded source of {n_metal} metal_kernels/*.metal file(s)")
            return 0 if run(files + [embedded], jobs=a.jobs) else 1
    except ToolchainMissing as e:
        print(f"check_mac_host: toolchain missing: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
