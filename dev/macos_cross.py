"""What building and checking the macOS arm64 library on Linux needs, found or fetched once and cached outside the repo:
clang++-16 and ld64.lld-16, the macOS SDK headers (13.3) and link stubs (12.0 .tbd), and TensorFlow for macOS arm64
(its C API headers and libtensorflow_framework.2.dylib, from `pip download`).

Environment:
  CLANGXX            compiler (default clang++-16);  LD64_LLD  linker (default ld64.lld-16)
  TFMO_SHARED        the shared folder (default ../shared from the repo root), for the two archives below
  MACOS_SDK_TGZ      the headers archive (default $TFMO_SHARED/macos-sdk/MacOSX13.3.sdk.min.tgz)
  MACOS_SDK_TBD_TGZ  the link stubs archive (default $TFMO_SHARED/macos-sdk/MacOSX12.0.sdk.tbd.tgz)
  XDG_CACHE_HOME     the cache's parent (default ~/.cache): tf-metal-ops/{macos-sdk,tf-macos-arm64}/
Apple's licence forbids copying the SDK files into the project, a wheel or a fixture: they stay in the cache.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = "arm64-apple-macos12"
# TensorFlow for macOS arm64: the build's headers (BUILD_TF), and the framework libraries the symbol check binds
# against: each version the [metal] extra allows (2.18, 2.19: pyproject.toml) and the oldest the package claims (2.16).
BUILD_TF = "2.19.0"
CHECK_TFS = ("2.16.2", "2.18.1", "2.19.0")
FRAMEWORK = "libtensorflow_framework.2.dylib"


class Missing(Exception):
    """A tool, archive or download is not available; the message names it and how to get it."""


def cache_dir(*parts: str) -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(os.path.abspath(base), "tf-metal-ops", *parts)
    root = os.path.realpath(ROOT)
    if os.path.realpath(path).startswith(root + os.sep):
        raise Missing(f"the cache {path} is inside the repository; set XDG_CACHE_HOME elsewhere")
    return path


def tool(env: str, default: str, package: str) -> str:
    name = os.environ.get(env) or default
    path = shutil.which(name)
    if path is None:
        raise Missing(f"{name} not found: `apt-get install {package}` (or set {env})")
    return path


def clangxx() -> str:
    return tool("CLANGXX", "clang++-16", "clang-16")


def ld64_lld() -> str:
    return tool("LD64_LLD", "ld64.lld-16", "lld-16")


def _archive(env: str, name: str) -> str:
    shared = os.environ.get("TFMO_SHARED") or os.path.join(ROOT, "..", "shared")
    path = os.path.abspath(os.environ.get(env) or os.path.join(shared, "macos-sdk", name))
    if not os.path.isfile(path):
        raise Missing(f"{path} does not exist: set {env} to {name} (or TFMO_SHARED to the folder holding "
                      f"macos-sdk/{name}); it cannot be committed (Apple's licence)")
    return path


def _unpacked(tgz: str, marker: str) -> str:
    """The *.sdk directory of tgz (which must contain marker), unpacked into the cache the first time."""
    st = os.stat(tgz)
    key = hashlib.sha256(f"{os.path.basename(tgz)}:{st.st_size}:{int(st.st_mtime)}".encode()).hexdigest()[:12]
    parent = cache_dir("macos-sdk")
    done = os.path.join(parent, key)

    def sdk_in(d):
        for n in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            if n.endswith(".sdk") and os.path.exists(os.path.join(d, n, marker)):
                return os.path.join(d, n)
        return None

    if sdk_in(done):
        return sdk_in(done)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="unpack-", dir=parent)
    try:
        with tarfile.open(tgz) as tar:
            tar.extractall(tmp, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        if sdk_in(tmp) is None:
            raise Missing(f"{tgz} holds no *.sdk directory with {marker}")
        try:
            os.rename(tmp, done)
        except OSError:
            if sdk_in(done) is None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sdk_in(done)


def sdk_headers() -> str:
    return _unpacked(_archive("MACOS_SDK_TGZ", "MacOSX13.3.sdk.min.tgz"), os.path.join("usr", "include"))


def sdk_stubs() -> str:
    return _unpacked(_archive("MACOS_SDK_TBD_TGZ", "MacOSX12.0.sdk.tbd.tgz"),
                     os.path.join("usr", "lib", "libSystem.B.tbd"))


def tensorflow(version: str, headers: bool = False) -> str:
    """A cache directory holding TF `version`'s libtensorflow_framework.2.dylib for macOS arm64 (and, with headers,
    its include/), downloaded with pip the first time. Only those members are kept; the 250 MB wheel is deleted."""
    out = cache_dir("tf-macos-arm64", version)
    have_headers = os.path.isfile(os.path.join(out, "include", "tensorflow", "c", "kernels.h"))
    if os.path.isfile(os.path.join(out, FRAMEWORK)) and (have_headers or not headers):
        return out
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="download-", dir=out) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-cache-dir", "--only-binary=:all:",
               "--platform", "macosx_12_0_arm64", "--python-version", "3.11", "--retries", "0", "--timeout", "20",
               "-d", tmp, f"tensorflow=={version}"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if r.returncode != 0 or not wheels:
            raise Missing(f"could not download TensorFlow {version} for macOS arm64 (network or PyPI unreachable?): "
                          f"{' '.join(cmd)}\n{r.stderr.strip()[-800:]}")
        with zipfile.ZipFile(os.path.join(tmp, wheels[0])) as z:
            for info in z.infolist():
                rel = info.filename[len("tensorflow/"):] if info.filename.startswith("tensorflow/") else None
                if rel == FRAMEWORK or (headers and rel and rel.startswith("include/") and not info.is_dir()):
                    target = os.path.join(out, FRAMEWORK + ".part") if rel == FRAMEWORK else os.path.join(tmp, rel)
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    with z.open(info) as src, open(target, "wb") as dst:
                        shutil.copyfileobj(src, dst)
        if headers:  # whole or not at all
            shutil.rmtree(os.path.join(out, "include"), ignore_errors=True)
            os.replace(os.path.join(tmp, "include"), os.path.join(out, "include"))
    if not os.path.isfile(os.path.join(out, FRAMEWORK + ".part")) and not os.path.isfile(os.path.join(out, FRAMEWORK)):
        raise Missing(f"the TensorFlow {version} wheel for macOS arm64 has no tensorflow/{FRAMEWORK}")
    if os.path.isfile(os.path.join(out, FRAMEWORK + ".part")):
        os.replace(os.path.join(out, FRAMEWORK + ".part"), os.path.join(out, FRAMEWORK))  # written last: the marker
    return out


def load_setup():
    """setup.py as a module (its setup() call runs only as a script): build_spec() is the one list of sources and
    flags, and its command classes build the wheel."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tfmo_setup", os.path.join(ROOT, "setup.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compile_command(src: str, obj: str, spec: dict, headers_sdk: str) -> list:
    """clang++-16 for arm64-apple-macos12 against the SDK headers, with build_spec()'s flags."""
    cmd = [clangxx(), "--target=" + TARGET, "-isysroot", headers_sdk, "-nostdinc++",
           "-isystem", os.path.join(headers_sdk, "usr", "include", "c++", "v1")]
    cmd += spec["compile_args"] + (spec["objcxx_args"] if src.endswith(".mm") else [])
    cmd += ["-D" + k if v is None else f"-D{k}={v}" for k, v in spec["define_macros"]]
    cmd += ["-I" + (d if os.path.isabs(d) else os.path.join(ROOT, d)) for d in spec["include_dirs"]]
    return cmd + ["-c", src if os.path.isabs(src) else os.path.join(ROOT, src), "-o", obj]


def link_command(objs: list, out: str, spec: dict, stubs_sdk: str, sdk_version: str = "13.3") -> list:
    """A strict ld64.lld link (every symbol resolved at link time) against the .tbd stubs and TF's framework dylib."""
    return ([clangxx(), "--target=" + TARGET, "-fuse-ld=lld", "--ld-path=" + ld64_lld(), "-isysroot", stubs_sdk,
             "-dynamiclib"] + objs + ["-L" + d for d in spec["library_dirs"]] + spec["link_args"]
            + ["-l" + lib for lib in spec["libraries"]]
            + ["-Wl,-platform_version,macos,%s,%s" % (TARGET_MIN, sdk_version), "-o", out])


TARGET_MIN = "12.0"
