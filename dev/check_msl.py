#!/usr/bin/env python3
"""The strict Metal-language check (tf_metal_ops.msl_check) on every metal_kernels/*.metal and every
csrc/shared/*.h, at MSL 2.4 and 3.0. Prints each finding as `file:line:col: error: message [rule]` and exits with
status 1 when there is one (2 when clang++ >= 16 is missing).

    python3 dev/check_msl.py [--version 2.4 --version 3.0] [FILE ...]

Runs without TensorFlow and without building or installing the package: tf_metal_ops.msl_check is imported from
this checkout under its own name, with the tf_metal_ops package registered as a bare package (its directory as
the search path, its __init__ not run, since that imports TensorFlow and the op library). The subpackage needs
nothing of tf_metal_ops but _builder and _env, both standard-library modules (tests/test_import_graph.py checks it).
"""

import argparse
import glob
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSIONS = ("2.4", "3.0")
INCLUDE_DIRS = [os.path.join(ROOT, "csrc", "shared"), os.path.join(ROOT, "metal_kernels")]


def load_msl_check():
    """tf_metal_ops.msl_check of this checkout, imported without running tf_metal_ops/__init__.py."""
    if "tf_metal_ops" not in sys.modules:
        spec = importlib.machinery.ModuleSpec("tf_metal_ops", None, is_package=True)
        package = importlib.util.module_from_spec(spec)
        package.__path__ = [os.path.join(ROOT, "tf_metal_ops")]
        sys.modules["tf_metal_ops"] = package
    return importlib.import_module("tf_metal_ops.msl_check")


def default_files():
    return sorted(glob.glob(os.path.join(ROOT, "metal_kernels", "*.metal"))) + sorted(
        glob.glob(os.path.join(ROOT, "csrc", "shared", "*.h")))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="sources to check (default: metal_kernels/*.metal, csrc/shared/*.h)")
    ap.add_argument("--version", action="append", dest="versions", help="MSL version (repeatable; default 2.4 and 3.0)")
    ap.add_argument("--jobs", type=int, default=2, help="clang processes at once (default 2)")
    args = ap.parse_args(argv)
    msl_check = load_msl_check()
    try:
        compiler = msl_check.find_compiler()
    except msl_check.MSLCompilerNotFound as e:
        print(e, file=sys.stderr)
        return 2
    files = args.files or default_files()
    versions = args.versions or list(VERSIONS)
    jobs = [(f, v) for f in files for v in versions]
    t0 = time.monotonic()
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = list(pool.map(lambda fv: msl_check.check_file(fv[0], msl_version=fv[1], include_dirs=INCLUDE_DIRS,
                                                                 compiler=compiler), jobs))
    seen, bad = set(), 0
    for (f, v), findings in zip(jobs, results):
        status = "FAIL" if findings else "PASS"
        print(f"{status}  {os.path.relpath(f, ROOT)}  MSL {v}: {len(findings)} finding(s)")
        for x in findings:
            key = (str(x), v)
            if key not in seen:
                seen.add(key)
                print(f"  {os.path.relpath(x.file, ROOT) if os.path.isabs(x.file) else x.file}:{x.line}:{x.column}: "
                      f"error: {x.message} [{x.rule}] (MSL {v})")
        bad += bool(findings)
    print(f"summary: {len(jobs) - bad}/{len(jobs)} clean ({len(files)} files x {len(versions)} versions, "
          f"{time.monotonic() - t0:.1f} s, {compiler})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
