"""clang's JSON AST of one source: the one place the package runs ``clang++ -Xclang -ast-dump=json``.

    returncode, ast, stderr = clang_ast.dump(source, ["-std=c++14", "-nostdinc", ...], compiler="clang++-16")

The source is read from stdin (clang names it ``<stdin>`` in locations and diagnostics); ``args`` are the language
and include flags. Only ``-fsyntax-only`` runs: nothing is compiled to code, nothing is linked, nothing runs.
``ast`` is None when clang gave no AST (a fatal error, a crash); ``stderr`` holds its diagnostics.
"""

from __future__ import annotations

import json
import subprocess
from typing import Sequence


def dump(source: str, args: Sequence[str], *, compiler: str) -> tuple[int, dict | None, str]:
    """(clang's exit status, the AST as parsed JSON or None, clang's diagnostics) for `source` compiled with `args`."""
    cmd = [compiler, "-fsyntax-only", "-fno-crash-diagnostics", "-fno-color-diagnostics", *args,
           "-Xclang", "-ast-dump=json", "-"]
    r = subprocess.run(cmd, input=source.encode(), capture_output=True, check=False)
    try:
        ast = json.loads(r.stdout) if r.stdout else None
    except ValueError:
        ast = None
    return r.returncode, ast if isinstance(ast, dict) else None, r.stderr.decode(errors="replace")
