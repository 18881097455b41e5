"""The entry points: ``check_source`` and ``check_file`` (one clang run each: rewrite, compile with the AST dump,
read the diagnostics, run the AST rules), ``compile_ast`` (that clang run alone, for the kernel signatures) and
``include_dir``, where the stub headers are.

A source is never reported clean unless clang compiled it and gave an AST: a failed or empty clang run is a
``compile`` finding.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Sequence

from tf_metal_ops import _env
from tf_metal_ops._builder import find_clangxx
from tf_metal_ops.msl_check import diagnostics
from tf_metal_ops.msl_check.context import PRELUDE, Context
from tf_metal_ops.msl_check.findings import Finding
from tf_metal_ops.msl_check.rewrite import rewrite
from tf_metal_ops.msl_check.rules import AstChecker
from tf_metal_ops.msl_check.type_strings import SPACE_NAMES

STUB_DIR = ("csrc", "msl_check", "include")  # under a source root (_env.source_roots())


def include_dir() -> Path:
    """The directory of msl_check's <metal_stdlib> and prelude: the wheel's package data
    (tf_metal_ops/_sources/csrc/msl_check/include) or the source checkout's csrc/msl_check/include."""
    roots = _env.source_roots()
    for root in roots:
        d = root.joinpath(*STUB_DIR)
        if (d / "metal_stdlib").is_file() and (d / PRELUDE).is_file():
            return d
    raise FileNotFoundError(
        f"tf_metal_ops.msl_check: its <metal_stdlib> is missing (looked in {roots[0]} and {roots[1]}); "
        "reinstall tf-metal-ops from a wheel or source tree built by this version's setup.py"
    )


def check_source(
    source: str,
    *,
    filename: str = "<source>",
    msl_version: str = "3.0",
    include_dirs: Sequence[str] = (),
    compiler: str | None = None,
) -> list[Finding]:
    """What Apple's compiler would reject in ``source`` (compiled as if it were the file ``filename``), at MSL
    ``msl_version`` ("2.4", "3.0", ...); empty when clean. One clang run."""
    ctx, ast, findings = compile_ast(source, filename=filename, msl_version=msl_version, include_dirs=include_dirs,
                                     compiler=compiler)
    if ast is not None:
        findings += AstChecker(ctx).run(ast)
    return _sorted(findings)


def compile_ast(
    source: str,
    *,
    filename: str = "<source>",
    msl_version: str = "3.0",
    include_dirs: Sequence[str] = (),
    compiler: str | None = None,
):
    """(Context, clang's JSON AST or None, clang's errors as findings) of ``source``: the one clang run behind the
    check and the kernel signatures (signatures.py). The AST is None when clang gave none; then the findings say
    why."""
    version = _metal_version(msl_version)
    cxx = compiler or find_clangxx()
    stub = include_dir()
    rewritten, attrs = rewrite(source)
    cmd = [
        cxx, "-x", "c++", "-std=c++17" if version >= 400 else "-std=c++14", "-fsyntax-only", "-w",
        "-fno-crash-diagnostics", "-ferror-limit=0", "-fno-color-diagnostics", "-fno-caret-diagnostics",
        "-fno-diagnostics-fixit-info", "-fcxx-exceptions", "-nostdinc", "-nostdinc++",
        "-isystem", str(stub), "-include", str(stub / PRELUDE), f"-D__METAL_VERSION__={version}",
    ]
    src_dir = os.path.dirname(os.path.abspath(filename)) if filename and not filename.startswith("<") else None
    if src_dir and os.path.isdir(src_dir):
        cmd += ["-iquote", src_dir]
    for d in include_dirs:
        cmd += ["-I", os.fspath(d)]
    cmd += ["-Xclang", "-ast-dump=json", "-"]
    r = subprocess.run(cmd, input=rewritten.encode(), capture_output=True, check=False)
    stderr = r.stderr.decode(errors="replace")
    ctx = Context(filename, rewritten, attrs, str(stub), version)
    findings, errors = diagnostics.from_stderr(stderr, ctx)
    if r.returncode not in (0, 1):
        findings.append(Finding(filename, 1, 1, "compile",
                                f"clang++ failed (exit status {r.returncode}); nothing was checked: {stderr[-500:]}"))
        return ctx, None, findings
    if r.returncode != 0 and not errors:
        findings.append(Finding(filename, 1, 1, "compile", f"clang++ failed without a diagnostic: {stderr[-500:]}"))
    try:
        ast = json.loads(r.stdout)
    except ValueError:
        ast = None
    if ast is None and not findings:  # never report a source as clean that was not checked
        findings.append(Finding(filename, 1, 1, "compile", "clang++ gave no AST; the source was not checked"))
    return ctx, ast, findings


def check_file(path, *, msl_version: str = "3.0", include_dirs: Sequence[str] = (), compiler: str | None = None
               ) -> list[Finding]:
    """check_source on the file at ``path`` (its directory is searched for "quoted" includes)."""
    path = os.fspath(path)
    with open(path, encoding="utf-8") as f:
        source = f.read()
    return check_source(source, filename=path, msl_version=msl_version, include_dirs=include_dirs, compiler=compiler)


def _metal_version(v: str) -> int:
    m = re.fullmatch(r"(\d)\.(\d)", str(v).strip())
    if not m or not (2 <= int(m.group(1)) <= 4):
        raise ValueError(f"msl_version must look like '2.4' or '3.0', not {v!r}")
    return int(m.group(1)) * 100 + int(m.group(2)) * 10


def _sorted(findings):
    return sorted({Finding(f.file, f.line, f.column, f.rule, _pretty(f.message)) for f in findings},
                  key=lambda f: (f.file, f.line, f.column, f.rule, f.message))


def _pretty(msg: str) -> str:
    """Messages in MSL's spelling: address-space attributes as the keywords, _Float16 as half."""
    msg = re.sub(r"__attribute__\(\(address_space\((\d+)\)\)\)",
                 lambda m: SPACE_NAMES.get(m.group(1), m.group(0)), msg)
    # clang prints the thread marker of a pointee after the `*`: 'float * __attribute__((noderef))'.
    msg = re.sub(r"'([^']*?) ?([*&]+) ?__attribute__\(\(noderef\)\)'", r"'thread \1 \2'", msg)
    msg = msg.replace("__attribute__((noderef))", "thread").replace("__attribute__(()) ", "")
    return msg.replace("_Float16", "half")
