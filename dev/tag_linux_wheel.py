#!/usr/bin/env python3
"""Gives a Linux wheel of tf-metal-ops its manylinux tag, from what its library really needs.

    python dev/tag_linux_wheel.py WHEEL --out DIR     # needs auditwheel (pip install auditwheel)

setup.py tags a Linux build py3-none-linux_x86_64 (the library links no libpython). `auditwheel show` reads the
library's versioned glibc/libstdc++ symbols: they allow manylinux_2_N (its "sym_tag"). The one library outside every
manylinux policy must be TensorFlow's own libtensorflow_framework.so.2, which the user's TensorFlow provides (found
through the $ORIGIN/../tensorflow rpath) and which must never be grafted into the wheel. When that holds, the wheel
is re-tagged py3-none-manylinux_2_N_<arch> into DIR (and `auditwheel show` is asked again about the result); else
nothing is written. Exit status 0 / 1 (a check failed) / 2 (auditwheel missing).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

TF_LIBS = {"libtensorflow_framework.so.2"}


def show(wheel: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "auditwheel", "show", "--json", wheel], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"auditwheel show {wheel} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout)


def problems_of(report: dict) -> list:
    problems = []
    external = set(report["external_libs"])
    if external - TF_LIBS:
        problems.append(f"libraries outside every manylinux policy besides TensorFlow's: {sorted(external - TF_LIBS)}")
    blockers = set(report["policy_upgrades"].get(report["sym_tag"], {}).get("libs_to_eliminate", []))
    if blockers - TF_LIBS:
        problems.append(f"{report['sym_tag']} is blocked by {sorted(blockers - TF_LIBS)}, not only by TensorFlow's")
    if not report["sym_tag"].startswith("manylinux_"):
        problems.append(f"the versioned symbols allow no manylinux tag: {report['sym_tag']}")
    return problems


def tag(wheel: str, out_dir: str) -> str:
    name = os.path.basename(wheel)
    m = re.match(r"^(.+)-py3-none-linux_(\w+)\.whl$", name)
    if not m:
        raise ValueError(f"{name}: expected a py3-none-linux_<arch> wheel (setup.py's tag for a Linux build)")
    report = show(wheel)
    print(f"auditwheel show: versioned symbols {json.dumps(report['versioned_symbols'], sort_keys=True)}")
    print(f"auditwheel show: external libraries {sorted(report['external_libs'])}; symbols allow {report['sym_tag']}")
    problems = problems_of(report)
    if problems:
        raise ValueError("; ".join(problems))
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(wheel, tmp)
        r = subprocess.run([sys.executable, "-m", "wheel", "tags", "--remove", "--platform-tag", report["sym_tag"],
                            os.path.join(tmp, name)], capture_output=True, text=True, check=True)
        tagged = os.path.join(tmp, r.stdout.strip().splitlines()[-1])
        again = show(tagged)
        if again["sym_tag"] != report["sym_tag"] or problems_of(again):
            raise ValueError(f"the re-tagged wheel reads differently: {again['sym_tag']}, {problems_of(again)}")
        os.makedirs(out_dir, exist_ok=True)
        final = os.path.join(out_dir, os.path.basename(tagged))
        shutil.move(tagged, final)
    return final


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("wheel")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        import auditwheel  # noqa: F401
    except ImportError:
        print("tag_linux_wheel: auditwheel is not installed: `pip install auditwheel`", file=sys.stderr)
        return 2
    try:
        print(tag(args.wheel, args.out))
    except (ValueError, RuntimeError) as e:
        print(f"tag_linux_wheel: {e}; no wheel written", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
