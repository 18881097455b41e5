#!/usr/bin/env python3
"""Checks what an sdist and a wheel of tf-metal-ops hold: what ships, and nothing that only checks the package.

    python dev/check_dist.py SDIST.tar.gz WHEEL.whl

Prints each archive's files grouped by folder (two levels) and fails (exit 1) when
  - either holds anything of dev/ or tests/ (the development tools, the Apple doubles, the test suite), a macOS
    SDK or Objective-C runtime file, or a compiled object;
  - the wheel lacks the op library, the package's modules, the sources the emulated GPU and inline kernels compile
    at run time (tf_metal_ops/_sources/csrc/msl_emu, csrc/emulated_gpu, metal_kernels) or the op kit's headers;
  - the sdist lacks setup.py's inputs (csrc/, metal_kernels/, pyproject.toml, setup.py, MANIFEST.in).
Standard library only.
"""

from __future__ import annotations

import collections
import re
import sys
import tarfile
import zipfile

FORBIDDEN = [
    (re.compile(r"(^|/)(dev|tests)/"), "a development tool or test"),
    (re.compile(r"apple_doubles|apple_mock|/Foundation/Foundation\.h$|/Metal/Metal\.h$"), "an Apple double"),
    (re.compile(r"\.tbd$|MacOSX\d|libobjc"), "a macOS SDK or Objective-C runtime file"),
    (re.compile(r"\.o$|__pycache__|\.pyc$"), "a build by-product"),
]
WHEEL_REQUIRED = [
    r"^tf_metal_ops/libtf_metal_ops\.so$",
    r"^tf_metal_ops/__init__\.py$",
    r"^tf_metal_ops/msl_emu\.py$",
    r"^tf_metal_ops/metal_sources\.py$",
    r"^tf_metal_ops/emulated_gpu/__init__\.py$",
    r"^tf_metal_ops/msl_check/__init__\.py$",
    r"^tf_metal_ops/_sources/csrc/msl_emu/include/metal_stdlib$",
    r"^tf_metal_ops/_sources/csrc/msl_check/include/metal_stdlib$",
    r"^tf_metal_ops/_sources/csrc/emulated_gpu/direct_backend\.cc$",
    r"^tf_metal_ops/_sources/metal_kernels/hash_grid\.metal$",
    r"^tf_metal_ops/include/gpu/gpu_host\.h$",
]
SDIST_REQUIRED = [r"^setup\.py$", r"^pyproject\.toml$", r"^MANIFEST\.in$", r"^csrc/ops/hash_grid_op\.cc$",
                  r"^csrc/msl_emu/include/metal_stdlib$", r"^metal_kernels/hash_grid\.metal$"]


def wheel_files(path: str) -> list[str]:
    with zipfile.ZipFile(path) as z:
        return [n for n in z.namelist() if not n.endswith("/") and ".dist-info/" not in n]


def sdist_files(path: str) -> list[str]:
    with tarfile.open(path) as t:
        names = [m.name for m in t.getmembers() if m.isfile()]
    return [n.split("/", 1)[1] for n in names if "/" in n and ".egg-info/" not in n and not n.endswith("PKG-INFO")]


def report(label: str, files: list[str], required: list[str]) -> list[str]:
    groups = collections.Counter("/".join(f.split("/")[:2]) if f.count("/") >= 2 else f.split("/")[0] for f in files)
    print(f"{label}: {len(files)} files")
    for group, n in sorted(groups.items()):
        print(f"  {n:4d}  {group}")
    problems = [f"{label}: {f} is {why}" for f in files for rx, why in FORBIDDEN if rx.search(f)]
    problems += [f"{label}: nothing matches {rx}" for rx in required if not any(re.search(rx, f) for f in files)]
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    sdist, wheel = argv
    problems = report(sdist, sdist_files(sdist), SDIST_REQUIRED) + report(wheel, wheel_files(wheel), WHEEL_REQUIRED)
    for p in problems:
        print("FAIL", p)
    print("ok: the sdist and the wheel hold what ships and nothing of dev/ or tests/" if not problems else
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
