#!/usr/bin/env python3
"""Builds the macOS arm64 wheel on Linux: tf_metal_ops-<version>-py3-none-macosx_12_0_arm64.whl.

    python dev/build_mac_wheel.py --out DIR [--jobs N]

1. TensorFlow for macOS arm64 (macos_cross.BUILD_TF: its include/ and libtensorflow_framework.2.dylib) from
   `pip download`, cached outside the repo (macos_cross.py);
2. compiles setup.py's own sources with its own flags (setup.build_spec("macos", ...)) for arm64-apple-macos12 with
   clang++-16 against the 13.3 SDK headers (ccache when installed), the Metal kernels embedded as source (no Metal
   compiler exists for Linux; the backend compiles them at first use, as a Mac build without `xcrun metal`);
3. links strictly with ld64.lld-16 against the 12.0 .tbd stubs and TF's framework dylib (no -undefined
   dynamic_lookup), ad-hoc code-signed by the linker;
4. checks it (dev/check_mac_symbols.py: every bind resolved against each TF version in macos_cross.CHECK_TFS, the
   install name, rpaths, exports, minos, signature);
5. packs it with setup.py's own command classes (the package data of every wheel), checks the wheel's contents
   (dev/check_dist.py's rules: nothing of dev/, tests/ or the SDK) and only then writes it into DIR.

Exit status: 0 when the wheel was written, 1 when the build or a check failed (no wheel written), 2 when a tool, an
archive or the network is missing (the message says which and how to get it).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import glob
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_dist  # noqa: E402
import check_mac_symbols  # noqa: E402
import macos_cross  # noqa: E402

ROOT = macos_cross.ROOT
PLATFORM = "macosx_12_0_arm64"


def preflight():
    """Everything that needs no work, first: the build fails in seconds when something is missing."""
    macos_cross.clangxx(), macos_cross.ld64_lld()
    headers_sdk, stubs_sdk = macos_cross.sdk_headers(), macos_cross.sdk_stubs()
    tf_dir = macos_cross.tensorflow(macos_cross.BUILD_TF, headers=True)
    check_mac_symbols.tf_dirs(macos_cross.CHECK_TFS)  # the check's downloads too, before minutes of compiling
    return headers_sdk, stubs_sdk, tf_dir


def compile_all(spec, headers_sdk, obj_dir, jobs, show):
    ccache = shutil.which("ccache")
    env = dict(os.environ, CCACHE_BASEDIR=ROOT, CCACHE_NOHASHDIR="1")

    def one(src):
        obj = os.path.join(obj_dir, hashlib.sha1(src.encode()).hexdigest()[:12] + ".o")
        cmd = macos_cross.compile_command(src, obj, spec, headers_sdk)
        r = subprocess.run(([ccache] if ccache else []) + cmd, capture_output=True, text=True, env=env)
        return src, obj, r

    objs, failed = [], []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for src, obj, r in pool.map(one, spec["sources"]):
            if r.returncode != 0:
                failed.append(f"{src}:\n{r.stderr}")
            objs.append(obj)
    if failed:
        raise SystemExit("build_mac_wheel: compile failed\n" + "\n".join(failed))
    show(f"compiled {len(objs)} sources for {macos_cross.TARGET}" + (" (ccache)" if ccache else ""))
    return objs


def pack_wheel(library, dist_dir, build_dir):
    """The wheel, from setup.py's command classes: build_py's package data, the prebuilt library, the py3-none tag."""
    setup = macos_cross.load_setup()
    from setuptools import Extension
    from setuptools import setup as run_setup

    class PrebuiltLibrary(setup.BuildOpLibrary):
        def build_extensions(self):
            for ext in self.extensions:
                target = self.get_ext_fullpath(ext.name)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copyfile(library, target)

    cwd, log = os.getcwd(), io.StringIO()
    os.chdir(ROOT)  # setuptools reads pyproject.toml and the package from the current directory
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # setuptools' deprecation banners; its errors still raise
            run_setup(
                script_args=["-q", "build", "--build-base", build_dir, "egg_info", "--egg-base", build_dir,
                             "bdist_wheel", "--plat-name", PLATFORM, "--dist-dir", dist_dir,
                             "--bdist-dir", os.path.join(build_dir, "bdist")],
                ext_modules=[Extension("tf_metal_ops.libtf_metal_ops", sources=[])],
                cmdclass=dict(setup.CMDCLASS, build_ext=PrebuiltLibrary),
            )
    except BaseException:
        sys.stderr.write(log.getvalue())
        raise
    finally:
        os.chdir(cwd)
    wheels = glob.glob(os.path.join(dist_dir, "*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"build_mac_wheel: expected one wheel, got {wheels}")
    return wheels[0]


def check_wheel(wheel, library):
    """Problems of the wheel itself: its tag, its library (the one checked), check_dist's rules."""
    problems = []
    if not os.path.basename(wheel).endswith(f"-py3-none-{PLATFORM}.whl"):
        problems.append(f"{os.path.basename(wheel)}: expected the tag py3-none-{PLATFORM}")
    with zipfile.ZipFile(wheel) as z:
        with open(library, "rb") as f:
            if z.read("tf_metal_ops/libtf_metal_ops.so") != f.read():
                problems.append("the wheel's libtf_metal_ops.so is not the library that was checked")
        wheel_meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))).decode()
    if f"Tag: py3-none-{PLATFORM}" not in wheel_meta or "Root-Is-Purelib: false" not in wheel_meta:
        problems.append("WHEEL metadata: " + wheel_meta.replace("\n", "; "))
    return problems + check_dist.report(os.path.basename(wheel), check_dist.wheel_files(wheel), check_dist.WHEEL_REQUIRED)


def build(out_dir, jobs, show=print):
    t0 = time.monotonic()
    headers_sdk, stubs_sdk, tf_dir = preflight()
    show(f"TensorFlow {macos_cross.BUILD_TF} for macOS arm64: {tf_dir} ({time.monotonic() - t0:.1f}s)")
    setup = macos_cross.load_setup()
    with tempfile.TemporaryDirectory(prefix="tfmo-mac-wheel-") as work:
        spec = setup.build_spec("macos", os.path.join(tf_dir, "include"), tf_dir, macos_cross.BUILD_TF,
                                os.path.join(work, "generated"))
        t1 = time.monotonic()
        objs = compile_all(spec, headers_sdk, work, jobs, show)
        t2 = time.monotonic()
        library = os.path.join(work, "libtf_metal_ops.so")
        cmd = macos_cross.link_command(objs, library, spec, stubs_sdk)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"build_mac_wheel: link failed: {' '.join(cmd)}\n{r.stderr}")
        t3 = time.monotonic()
        show(f"linked {library} ({os.path.getsize(library)} bytes) with {os.path.basename(macos_cross.ld64_lld())}")
        if not check_mac_symbols.check(library, check_mac_symbols.tf_dirs(macos_cross.CHECK_TFS), show=show):
            raise SystemExit("build_mac_wheel: the library failed the symbol check; no wheel written")
        t4 = time.monotonic()
        wheel = pack_wheel(library, os.path.join(work, "dist"), os.path.join(work, "build"))
        problems = check_wheel(wheel, library)
        if problems:
            raise SystemExit("build_mac_wheel: the wheel failed its check; no wheel written:\n  " + "\n  ".join(problems))
        os.makedirs(out_dir, exist_ok=True)
        final = os.path.join(out_dir, os.path.basename(wheel))
        shutil.copyfile(wheel, final + ".part")
        os.replace(final + ".part", final)
        show(f"times: TF download/cache {t1 - t0:.1f}s, compile {t2 - t1:.1f}s, link {t3 - t2:.1f}s, "
             f"check {t4 - t3:.1f}s, pack {time.monotonic() - t4:.1f}s")
        show(final)
        return final


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory that receives the wheel")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    try:
        build(os.path.abspath(args.out), args.jobs)
    except macos_cross.Missing as e:
        print(f"build_mac_wheel: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
