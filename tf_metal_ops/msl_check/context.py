"""The state of one check, shared by the reading of clang's diagnostics and the AST rules: the checked (rewritten)
source and its MSL attributes, the MSL version, where the stub headers are, and clang's presumed positions
(``#line``)."""

from __future__ import annotations

import bisect
import os
import re

PRELUDE = "msl_check_prelude.h"  # force-included from the stub directory before every checked source


def _line_map(text: str):
    """Presumed (file or None, line) of each actual line, from `#line N "file"` and `# N "file"` directives."""
    marks = []  # (actual line of the directive, presumed line of the next line, file or None)
    for idx, ln in enumerate(text.split("\n"), start=1):
        m = re.match(r'\s*#\s*(?:line\s+)?(\d+)(?:\s+"((?:[^"\\]|\\.)*)")?', ln)
        if m and re.match(r"\s*#\s*(line\b|\d)", ln):
            marks.append((idx, int(m.group(1)), m.group(2)))
    return marks


class Context:
    """One check. `text` is the rewritten source (clang reads it as <stdin>), `stub` the stub header directory,
    `version` __METAL_VERSION__ (240, 300, ...)."""

    def __init__(self, filename, text, attrs, stub, version):
        self.filename = filename
        self.text = text
        self.attrs = attrs
        self.stub = os.path.realpath(stub)
        self.version = version
        self._marks = _line_map(text)
        self._files = {}
        self._stub_files = {}

    def is_stub(self, file: str) -> bool:
        hit = self._stub_files.get(file)
        if hit is None:
            hit = bool(file) and not file.startswith("<") and os.path.realpath(file).startswith(self.stub + os.sep)
            self._stub_files[file] = hit
        return hit

    def presumed(self, file: str, line: int):
        """(file, line) as clang's presumed location for the actual position in `file` (<stdin> = the source)."""
        if file != "<stdin>":
            return file, line
        name, cur = self.filename, line
        k = bisect.bisect_left([m[0] for m in self._marks], line) - 1
        if k >= 0:
            at, start, fname = self._marks[k]
            cur = start + (line - at - 1)
            for j in range(k, -1, -1):  # the latest directive that named a file
                if self._marks[j][2] is not None:
                    name = self._marks[j][2]
                    break
        return name, cur

    def source_of(self, file: str):
        if file == "<stdin>":
            return self.text
        if file not in self._files:
            try:
                with open(file, encoding="utf-8", errors="replace") as f:
                    self._files[file] = f.read()
            except OSError:
                self._files[file] = None
        return self._files[file]
