"""Metal sources at build time: inline shared headers, embed sources in the op library, build metallibs.

Pure Python, no third-party imports; setup.py loads it by path. Functions:

- ``inline_includes(path, include_dirs) -> str``: the .metal file with every quoted ``#include "..."`` replaced by
  the header's text, recursively (a ``#pragma once`` header only once; ``<...>`` includes left alone).
- ``write_embedded_source(out_cc_path, metal_files, include_dirs) -> str``: writes the C++ file that defines
  ``tfmo::metal::kEmbeddedMetalSources`` (csrc/metal/embedded_sources.h): one inlined source per .metal file,
  compiled at run time as one MTLLibrary each when no metallib ships with the op library.
- ``build_metallib(metal_files, include_dirs, out_path) -> bool``: with Xcode's Metal toolchain, builds
  ``out_path`` (MSL 2.4, macOS 12+) and ``tf_metal_ops.metal3.metallib`` beside it (MSL 3.0, macOS 13+, used on
  Metal 3 GPUs); False, with the reason printed, when the toolchain is missing or the baseline build fails.
  Compiled with ``-fno-fast-math`` (``METAL_COMPILE_FLAGS``): the kernels rely on IEEE NaN/inf behaviour.

Inlining is textual, like the preprocessor's: headers are searched next to the including file, then in
``include_dirs``; ``#line`` markers keep run-time compiler messages pointing at the original files. It does not
evaluate ``#if`` (a ``#pragma once`` header first included under a false ``#if`` would be lost) and does not
skip ``#include`` lines inside block comments: keep shared-header includes plain.

CLI (debugging): ``python tf_metal_ops/metal_sources.py inline FILE.metal`` / ``embed OUT.cc FILE.metal...`` /
``metallib OUT.metallib FILE.metal...`` (include dirs: metal_kernels/ and csrc/shared/ of this repo).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

METALLIB_NAME = "tf_metal_ops.metallib"  # MSL 2.4, loads on macOS 12+
METAL3_METALLIB_NAME = "tf_metal_ops.metal3.metallib"  # MSL 3.0 (native atomic_float), macOS 13+ Metal 3 GPUs

_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
_PRAGMA_ONCE_RE = re.compile(r"^\s*#\s*pragma\s+once\b")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class MetalSourceError(Exception):
    """A quoted #include that cannot be resolved, or an include cycle."""


def _resolve(name, including_file, include_dirs):
    for d in [os.path.dirname(os.path.abspath(including_file))] + [os.path.abspath(d) for d in include_dirs]:
        candidate = os.path.join(d, name)
        if os.path.isfile(candidate):
            return os.path.realpath(candidate)
    return None


def _line_marker(line_number, display_name):
    return '#line %d "%s"' % (line_number, display_name.replace("\\", "/").replace('"', ""))


def inline_includes(path, include_dirs):
    """Source of ``path`` with its quoted includes inlined (see the module docstring)."""
    once = set()  # real paths of #pragma once headers already inlined

    def expand(file_path, display_name, stack):
        real = os.path.realpath(file_path)
        if real in stack:
            chain = " -> ".join(os.path.basename(p) for p in stack + [real])
            raise MetalSourceError(f"include cycle without #pragma once: {chain}")
        with open(file_path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        is_header = bool(stack)
        if is_header and any(_PRAGMA_ONCE_RE.match(line) for line in lines):
            if real in once:
                return []
            once.add(real)
        out = [_line_marker(1, display_name)]
        for number, line in enumerate(lines, start=1):
            if _PRAGMA_ONCE_RE.match(line):
                out.append("")  # keeps line numbers; "#pragma once in main file" would warn
                continue
            m = _INCLUDE_RE.match(line)
            if not m:
                out.append(line)
                continue
            header = _resolve(m.group(1), file_path, include_dirs)
            if header is None:
                raise MetalSourceError(
                    f'{file_path}:{number}: #include "{m.group(1)}" not found next to the file or in '
                    f"{[str(d) for d in include_dirs]}"
                )
            body = expand(header, m.group(1), stack + [real])
            if not body:  # a #pragma once header inlined earlier; one line keeps the numbering
                out.append('// #include "%s": inlined above' % m.group(1))
                continue
            out.append('// begin #include "%s"' % m.group(1))
            out.extend(body)
            out.append('// end #include "%s"' % m.group(1))
            out.append(_line_marker(number + 1, display_name))
        return out

    return "\n".join(expand(path, os.path.basename(path), [])) + "\n"


def _c_string_lines(text):
    """C++ string-literal lines (adjacent literals concatenate) for ``text``; exact for any UTF-8 text."""
    out = []
    for line in text.encode("utf-8").splitlines(keepends=True):
        chunk = []
        for b in line:
            c = chr(b)
            if c == "\\":
                chunk.append("\\\\")
            elif c == '"':
                chunk.append('\\"')
            elif c == "?":
                chunk.append("\\?")  # no trigraphs, whatever the compiler mode
            elif c == "\n":
                chunk.append("\\n")
            elif c == "\t":
                chunk.append("\\t")
            elif 0x20 <= b < 0x7F:
                chunk.append(c)
            else:
                chunk.append("\\%03o" % b)  # 3-digit octal: never swallows a following digit
        out.append('    "%s"' % "".join(chunk))
    return out or ['    ""']


def embedded_source_text(metal_files, include_dirs):
    """The C++ text written by ``write_embedded_source``."""
    names = [os.path.basename(p) for p in metal_files]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise MetalSourceError(f"two .metal files share a name: {dupes}")
    parts = [
        "// Generated by tf_metal_ops/metal_sources.py (write_embedded_source): do not edit.",
        "// The .metal sources of the op library, shared headers inlined, for run-time compilation.",
        '#include "metal/embedded_sources.h"',
        "",
        "namespace tfmo::metal {",
        "",
        "const EmbeddedSource kEmbeddedMetalSources[] = {",
    ]
    for path, name in sorted(zip(metal_files, names), key=lambda pn: pn[1]):
        parts.append("  {\"%s\"," % name.replace("\\", "\\\\").replace('"', '\\"'))
        parts.extend(_c_string_lines(inline_includes(path, include_dirs)))
        parts[-1] += "},"
    parts += ["  {nullptr, nullptr},", "};", "", "}  // namespace tfmo::metal", ""]
    return "\n".join(parts)


def write_embedded_source(out_cc_path, metal_files, include_dirs):
    """Writes the embedded-source C++ file (only when its content changes, so rebuilds stay incremental).
    Returns ``out_cc_path``. Raises MetalSourceError for unresolvable includes or duplicate file names."""
    text = embedded_source_text(list(metal_files), include_dirs)
    try:
        with open(out_cc_path, encoding="utf-8") as f:
            if f.read() == text:
                return out_cc_path
    except OSError:
        pass
    os.makedirs(os.path.dirname(os.path.abspath(out_cc_path)), exist_ok=True)
    tmp = out_cc_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, out_cc_path)
    return out_cc_path


def _run(cmd):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _metal_toolchain():
    """None when usable, else the reason it is not."""
    if shutil.which("xcrun") is None:
        return "xcrun not found (the Metal compiler comes with Xcode on macOS)"
    for tool in ("metal", "metallib"):
        try:
            r = _run(["xcrun", "-sdk", "macosx", "-f", tool])
        except OSError as e:
            return f"xcrun failed: {e}"
        if r.returncode != 0:
            return f"`xcrun -sdk macosx -f {tool}` failed (install Xcode's Metal toolchain): {r.stdout.strip()}"
    return None


# Fast math off: `xcrun metal` compiles with fast math by default, which lets the compiler assume no NaN/inf and
# reassociate. The kernels rely on IEEE behaviour (NaN positions -> 0 with zero gradient, NaN outputs for invalid
# rays, exp of large arguments -> inf), and the run-time path (csrc/metal/device.mm) sets fastMathEnabled = NO too, so
# both library variants and the embedded sources compute the same thing. -ffp-contract=off: fast math off does not
# stop GPU compilers from fusing a*b + c; the CPU build does not fuse either (fused multiply-adds only via tfmo_fma),
# and csrc/shared/device_compat.h says the same to the run-time compiler with #pragma clang fp contract(off).
METAL_COMPILE_FLAGS = ["-fno-fast-math", "-ffp-contract=off"]


def metal_compile_command(src, air, include_dirs, std, min_macos):
    """The `xcrun metal` command that compiles one .metal file to ``air`` (pure; tested on Linux)."""
    cmd = ["xcrun", "-sdk", "macosx", "metal", "-std=" + std, "-mmacosx-version-min=" + min_macos]
    cmd += METAL_COMPILE_FLAGS + ["-c", src, "-o", air]
    for d in include_dirs:
        cmd += ["-I", d]
    return cmd


def _build_one(metal_files, include_dirs, out_path, std, min_macos, tmp_dir):
    """None on success, else the error text."""
    airs = []
    for i, src in enumerate(metal_files):
        air = os.path.join(tmp_dir, "%d_%s.air" % (i, os.path.splitext(os.path.basename(src))[0]))
        cmd = metal_compile_command(src, air, include_dirs, std, min_macos)
        r = _run(cmd)
        if r.returncode != 0:
            return "%s\n%s" % (" ".join(cmd), r.stdout)
        airs.append(air)
    cmd = ["xcrun", "-sdk", "macosx", "metallib"] + airs + ["-o", out_path]
    r = _run(cmd)
    if r.returncode != 0:
        return "%s\n%s" % (" ".join(cmd), r.stdout)
    return None


def build_metallib(metal_files, include_dirs, out_path):
    """Builds the metallibs (see the module docstring). Stale outputs are removed first, so a failed build never
    leaves an old library that would shadow the embedded sources. Returns True when ``out_path`` was built."""
    metal_files = list(metal_files)
    metal3_path = os.path.join(os.path.dirname(os.path.abspath(out_path)), METAL3_METALLIB_NAME)
    for p in (out_path, metal3_path):
        if os.path.exists(p):
            os.remove(p)
    if not metal_files:
        print("tf-metal-ops: no .metal files: no metallib built")
        return False
    reason = _metal_toolchain()
    if reason:
        print(f"tf-metal-ops: no metallib built ({reason}); the Metal sources are embedded and compiled at first use")
        return False
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:

        def build(path, std, min_os, fallback):
            """Builds one metallib; on failure says what is used instead and leaves no partial file."""
            error = _build_one(metal_files, include_dirs, path, std, min_os, tmp)
            if error:
                print(f"tf-metal-ops: building {path} failed; {fallback}:\n{error}")
                if os.path.exists(path):
                    os.remove(path)
            return not error

        if not build(out_path, "macos-metal2.4", "12.0", "the embedded sources will be compiled at first use"):
            return False
        build(metal3_path, "metal3.0", "13.0", "Metal 3 GPUs will use the MSL 2.4 library")
    print(f"tf-metal-ops: built {out_path}" + (f" and {metal3_path}" if os.path.exists(metal3_path) else ""))
    return True


def _main(argv):
    import argparse

    include_dirs = [os.path.join(_ROOT, "metal_kernels"), os.path.join(_ROOT, "csrc", "shared")]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("inline").add_argument("file")
    e = sub.add_parser("embed")
    e.add_argument("out")
    e.add_argument("files", nargs="*")
    m = sub.add_parser("metallib")
    m.add_argument("out")
    m.add_argument("files", nargs="+")
    a = p.parse_args(argv)
    if a.cmd == "inline":
        sys.stdout.write(inline_includes(a.file, include_dirs))
        return 0
    if a.cmd == "embed":
        print(write_embedded_source(a.out, a.files, include_dirs))
        return 0
    return 0 if build_metallib(a.files, include_dirs, a.out) else 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
