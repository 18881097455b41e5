#!/usr/bin/env python3
"""The strict Metal-language check (tf_metal_ops/msl_check.py) on every metal_kernels/*.metal and every
csrc/shared/*.h, at MSL 2.4 and 3.0. Prints each finding as `file:line:col: error: message [rule]` and exits with
status 1 when there is one (2 when clang++ >= 16 is missing). Runs without TensorFlow: the module is loaded from
its file, not through the tf_metal_ops package.

    python3 tools/check_msl.py [--version 2.4 --version 3.0] [FILE ...]
"""

import argparse
import glob
import importlib.util
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSIONS = ("2.4", "3.0")
INCLUDE_DIRS = [os.path.join(ROOT, "csrc", "shared"), os.path.join(ROOT, "metal_kernels")]


def load_msl_check():
    path = os.path.join(ROOT, "tf_metal_ops", "msl_check.py")
    spec = importlib.util.spec_from_file_location("tf_metal_ops_msl_check", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up by name
    spec.loader.exec_module(module)
    return module


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
