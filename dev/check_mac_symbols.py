#!/usr/bin/env python3
"""Checks that the macOS arm64 op library would load on a Mac: every symbol it imports is exported by the library it
is bound to (two-level namespace: bind ordinal -> the dylib of that load command).

    python dev/check_mac_symbols.py LIB_OR_WHEEL [--tf VERSION ...]   # default: macos_cross.CHECK_TFS
    python dev/check_mac_symbols.py --negative-controls               # two broken libraries must fail

For each TF version, TF's own libtensorflow_framework.2.dylib for macOS arm64 (macos_cross.tensorflow: only that file
of the wheel is kept) answers for @rpath/libtensorflow_framework.2.dylib, through its export trie (re-exports
followed); Apple's .tbd stubs of the 12.0 SDK answer for system libraries (re-exported libraries followed). Also: the
file is an arm64 dylib, minimum macOS 12.0, code-signed (LC_CODE_SIGNATURE), exports only tfmo_* functions, install
name @rpath/libtf_metal_ops.so, the one rpath @loader_path/../tensorflow. A bind with no library (flat lookup, as
`-undefined dynamic_lookup` leaves them) fails: TF loads op libraries with dlopen(RTLD_NOW).

Exit status: 0 when everything holds, 1 when something does not, 2 when a tool, archive or download is missing.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import subprocess
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import macho  # noqa: E402
import macos_cross  # noqa: E402

INSTALL_NAME = "@rpath/libtf_metal_ops.so"
RPATHS = ["@loader_path/../tensorflow"]
MINOS = macos_cross.TARGET_MIN
EXPORT_PREFIX = "_tfmo_"  # Mach-O names carry C's leading underscore
MH_DYLIB = 6
SPECIAL = {macho.ORDINAL_SELF: "this image", macho.ORDINAL_MAIN_EXECUTABLE: "the main executable",
           macho.ORDINAL_FLAT_LOOKUP: "no library (flat-namespace lookup: -undefined dynamic_lookup)",
           macho.ORDINAL_WEAK_LOOKUP: "any image (weak-definition lookup)"}


class Libraries:
    """install name -> exports, from TF's dylibs in a directory and the .tbd stubs of an SDK."""

    def __init__(self, tf_dir: str, stubs_sdk: str):
        self.exports, self.reexports, self.images = {}, {}, {}
        for path in sorted(glob.glob(os.path.join(tf_dir, "*.dylib"))):
            img = macho.read_macho(path)
            self.images[img.install_name] = img
            self.exports[img.install_name] = img.exports
            self.reexports[img.install_name] = img.reexported_dylibs
        for path in sorted(glob.glob(os.path.join(stubs_sdk, "**", "*.tbd"), recursive=True)):
            if os.path.islink(path):
                continue
            for stub in macho.read_tbd(path):
                self.exports.setdefault(stub.install_name, stub.exports)
                self.reexports.setdefault(stub.install_name, stub.reexported_libraries)

    def resolve(self, install_name: str, symbol: str, depth: int = 0):
        """The install name of the library that defines symbol as seen through install_name, or None."""
        if depth > 8 or install_name not in self.exports:
            return None
        found = self.exports[install_name].get(symbol) if isinstance(self.exports[install_name], dict) else (
            symbol if symbol in self.exports[install_name] else None)
        if found is not None:
            if isinstance(found, macho.Export) and found.flags & macho.EXPORT_SYMBOL_FLAGS_REEXPORT:
                target = self.images[install_name].dylibs[found.reexport_ordinal - 1]
                return self.resolve(target, found.reexport_name, depth + 1)
            return install_name
        for sub in self.reexports.get(install_name, []):
            where = self.resolve(sub, symbol, depth + 1)
            if where:
                return where
        return None


def library_of(path: str, tmp: str) -> str:
    """path itself, or the op library inside a wheel (extracted to tmp)."""
    if not path.endswith(".whl"):
        return path
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if n.endswith("/libtf_metal_ops.so")]
        if len(names) != 1:
            raise SystemExit(f"{path}: expected one libtf_metal_ops.so, found {names}")
        return z.extract(names[0], tmp)


def check_image(img: macho.Image) -> list:
    """Problems of the library's own shape (everything but the binds)."""
    problems = []
    if img.cputype != macho.CPU_TYPE_ARM64:
        problems.append(f"CPU type 0x{img.cputype:x}, expected arm64")
    if img.filetype != MH_DYLIB:
        problems.append(f"Mach-O file type {img.filetype}, expected a dylib ({MH_DYLIB})")
    if img.minos != MINOS:
        problems.append(f"minimum macOS {img.minos}, expected {MINOS}")
    if not img.has_code_signature:
        problems.append("no LC_CODE_SIGNATURE (arm64 macOS refuses to load unsigned code)")
    if img.install_name != INSTALL_NAME:
        problems.append(f"install name {img.install_name!r}, expected {INSTALL_NAME!r}")
    if img.rpaths != RPATHS:
        problems.append(f"rpaths {img.rpaths}, expected {RPATHS}")
    foreign = sorted(n for n in img.exports if not n.startswith(EXPORT_PREFIX))
    if foreign:
        problems.append(f"exports {len(foreign)} symbols other than tfmo_*: {', '.join(foreign[:8])}")
    if not any(n.startswith(EXPORT_PREFIX) for n in img.exports):
        problems.append("exports no tfmo_* entry point")
    return problems


def check_binds(img: macho.Image, libs: Libraries):
    """(problems, {library: number of binds resolved there}) of the library's binds."""
    problems, per_library = [], collections.Counter()
    bound = {b.symbol for b in img.binds if b.table != "weak_bind"}
    unique = {(b.ordinal, b.symbol, b.table == "weak_bind"): b for b in img.binds}  # a symbol may be in two tables
    for b in sorted(unique.values(), key=lambda b: (b.ordinal, b.symbol)):
        if b.table == "weak_bind":
            # Weak-definition coalescing by name: fine when this image defines it or also binds it to a library.
            if b.symbol in img.exports or b.symbol in bound:
                per_library["(weak coalescing)"] += 1
            else:
                problems.append(f"{b.symbol}: weak coalescing entry with no definition here and no library bind")
            continue
        if b.ordinal < 1 or b.ordinal > len(img.dylibs):
            problems.append(f"{b.symbol}: bound to {SPECIAL.get(b.ordinal, 'ordinal %d' % b.ordinal)}, "
                            "not to a library: it would fail tf.load_op_library (RTLD_NOW) on a Mac")
            continue
        lib = img.dylibs[b.ordinal - 1]
        if lib not in libs.exports:
            problems.append(f"{b.symbol}: bound to {lib}, which is neither a TF dylib nor a stub the check has")
            continue
        where = libs.resolve(lib, b.symbol)
        if where is None:
            problems.append(f"{b.symbol}: bound to {lib}, which does not export it")
        else:
            per_library[os.path.basename(lib)] += 1
    return problems, per_library


def check(lib_path: str, tf_dirs: dict, show=print) -> bool:
    """Checks the library against each {label: directory holding a TF's libtensorflow_framework.2.dylib}."""
    img = macho.read_macho(lib_path)
    stubs = macos_cross.sdk_stubs()
    problems = check_image(img)
    show(f"{lib_path}: arm64 dylib, minos {img.minos}, sdk {img.sdk}, install name {img.install_name}, "
         f"rpaths {img.rpaths}, code signature {'yes' if img.has_code_signature else 'NO'}, "
         f"exports {sorted(n[1:] for n in img.exports)}")
    for version, tf_dir in tf_dirs.items():
        libs = Libraries(tf_dir, stubs)
        bind_problems, per_library = check_binds(img, libs)
        problems += [f"TF {version}: {p}" for p in bind_problems]
        summary = ", ".join(f"{n} {lib}" for lib, n in sorted(per_library.items(), key=lambda kv: -kv[1]))
        show(f"TF {version}: {sum(per_library.values())} binds resolved ({summary}); "
             f"{len(bind_problems)} unresolved")
    for p in problems:
        show("FAIL " + p)
    show("mac symbols: " + ("ok" if not problems else f"{len(problems)} problems"))
    return not problems


# ---- Negative controls: two libraries that must fail --------------------------------------------------------------
CONTROL_AVAILABLE = r"""
#include <tensorflow/c/kernels.h>
extern "C" __attribute__((visibility("default"))) int tfmo_control(TF_OpKernelContext* ctx) {
  if (__builtin_available(macOS 13.0, *)) return TF_GetStream(ctx, nullptr) != nullptr;
  return 0;
}
"""
CONTROL_MISSING_TF = r"""
#include <tensorflow/c/kernels.h>
extern "C" void TF_NoSuchFunction(TF_OpKernelContext*);
extern "C" __attribute__((visibility("default"))) void tfmo_control(TF_OpKernelContext* ctx) {
  TF_NoSuchFunction(ctx);
  TF_GetStream(ctx, nullptr);
}
"""
# A stub of a TensorFlow that has TF_NoSuchFunction (as a newer TF might): the library links against it and is then
# checked against the real framework dylibs. Written here, from nothing of Apple's.
FAKE_TF_TBD = """--- !tapi-tbd
tbd-version:     4
targets:         [ arm64-macos ]
install-name:    '@rpath/libtensorflow_framework.2.dylib'
exports:
  - targets:         [ arm64-macos ]
    symbols:         [ _TF_GetStream, _TF_NoSuchFunction ]
...
"""


def build_control(name: str, source: str, work: str, headers_dir: str, extra_link=(), link_dir=None,
                  extra_sources=()) -> str:
    """A small library built like the op library (build_spec's flags and link arguments) from source (and
    extra_sources, e.g. csrc/metal/platform_version.mm), linked against link_dir's libtensorflow_framework.2."""
    setup = macos_cross.load_setup()
    spec = setup.build_spec("macos", os.path.join(headers_dir, "include"), link_dir, "control",
                            os.path.join(work, "generated"))
    src, out = os.path.join(work, name + ".cc"), os.path.join(work, name + ".dylib")
    with open(src, "w") as f:
        f.write(source)
    objs = []
    for i, path in enumerate([src, *extra_sources]):
        objs.append(os.path.join(work, f"{name}.{i}.o"))
        _run(name, macos_cross.compile_command(path, objs[-1], spec, macos_cross.sdk_headers()))
    link_spec = dict(spec, link_args=spec["link_args"] + list(extra_link))
    _run(name, macos_cross.link_command(objs, out, link_spec, macos_cross.sdk_stubs()))
    return out


def _run(name, cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"control library {name}: build failed: {' '.join(cmd)}\n{r.stderr}")


def tf_dirs(versions) -> dict:
    return {v: macos_cross.tensorflow(v) for v in versions}


def negative_controls(label: str, tf_dir: str, headers_dir: str, show=print) -> bool:
    """True when both broken libraries fail the check against tf_dir's framework dylib, each for its own reason and
    only for it. headers_dir holds the TF C API headers (include/)."""
    ok = True
    with tempfile.TemporaryDirectory(prefix="tfmo-mac-controls-") as work:
        fake = os.path.join(work, "fake-tf")
        os.makedirs(fake)
        with open(os.path.join(fake, "libtensorflow_framework.2.tbd"), "w") as f:
            f.write(FAKE_TF_TBD)
        controls = [
            ("without_shim", CONTROL_AVAILABLE, ["-undefined", "dynamic_lookup"], None, "___isPlatformVersionAtLeast"),
            ("missing_tf_function", CONTROL_MISSING_TF, [], fake, "_TF_NoSuchFunction"),
        ]
        for name, source, extra, link_dir, expected in controls:
            lib = build_control(name, source, work, headers_dir, extra, link_dir or tf_dir)
            lines = []
            passed = check(lib, {label: tf_dir}, show=lines.append)
            fails = [line for line in lines if line.startswith("FAIL ")]
            right = fails and all(expected in line for line in fails)
            show(f"negative control {name}: " + ("fails as it must: " + fails[0][5:] if not passed and right else
                                                 "NOT caught as expected: " + "; ".join(lines[-3:])))
            ok &= bool(not passed and right)
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("library", nargs="?", help="libtf_metal_ops.so (Mach-O) or a macOS wheel")
    ap.add_argument("--tf", action="append", help="TensorFlow versions to check against (repeatable)")
    ap.add_argument("--negative-controls", action="store_true", help="also build two broken libraries: both must fail")
    args = ap.parse_args(argv)
    if not args.library and not args.negative_controls:
        ap.error("give a library or wheel, or --negative-controls")
    try:
        ok = True
        with tempfile.TemporaryDirectory(prefix="tfmo-mac-check-") as tmp:
            if args.library:
                ok = check(library_of(args.library, tmp), tf_dirs(args.tf or macos_cross.CHECK_TFS))
            if args.negative_controls:
                tf_dir = macos_cross.tensorflow(macos_cross.BUILD_TF, headers=True)
                ok &= negative_controls(macos_cross.BUILD_TF, tf_dir, tf_dir)
    except macos_cross.Missing as e:
        print(f"check_mac_symbols: {e}", file=sys.stderr)
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
