"""clang's JSON AST of one source: the one place the package runs ``clang++ -Xclang -ast-dump=json``.

    returncode, ast, stderr = clang_ast.dump(source, ["-std=c++14", "-nostdinc", ...], compiler="clang++-16")

The source is read from stdin (clang names it ``<stdin>`` in locations and diagnostics); ``args`` are the language
and include flags. Only ``-fsyntax-only`` runs: nothing is compiled to code, nothing is linked, nothing runs.
``ast`` is None when clang gave no AST (a fatal error, a crash); ``stderr`` holds its diagnostics.

Every location in ``ast`` carries its full file and line as ``"_file"`` / ``"_line"`` (clang writes them only where
they change). In locations in the source itself (``"_file" == "<stdin>"``), ``"offset"`` and ``"tokLen"`` count
characters of ``source`` (Python string indices), not the UTF-8 bytes clang counts.
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
    if not isinstance(ast, dict):
        ast = None
    else:
        _annotate_locations(ast, source)
    return r.returncode, ast, r.stderr.decode(errors="replace")


def _annotate_locations(ast: dict, source: str) -> None:
    """Walk the dump in its order, storing each location's (file, line) as "_file" / "_line", and turn the byte
    offsets of locations in `source` into string indices."""
    char_at = None  # byte offset -> string index; None while the source is ASCII (they are equal)
    if not source.isascii():
        char_at = [0] * (len(source.encode()) + 1)
        b = 0
        for i, ch in enumerate(source):
            n = len(ch.encode())
            for k in range(n):
                char_at[b + k] = i
            b += n
        char_at[b] = len(source)
    file, line = "", 0
    stack: list = [ast]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "offset" in node and "col" in node:
                file = node.get("file", file)
                line = node.get("line", line)
                node["_file"], node["_line"] = file, line
                if char_at is not None and file == "<stdin>" and 0 <= node["offset"] < len(char_at):
                    start = node["offset"]
                    end = min(start + node.get("tokLen", 0), len(char_at) - 1)
                    node["offset"] = char_at[start]
                    if "tokLen" in node:
                        node["tokLen"] = char_at[end] - char_at[start]
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, list):
            stack.extend(reversed(node))
