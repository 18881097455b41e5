"""The source rewrite before clang compiles a Metal source as C++: same length, so every offset, line and column of
the rewritten text is the original's.

- ``[[kernel]]`` (and ``[[vertex]]``/``[[fragment]]``) becomes the word, which the prelude defines as an annotate
  attribute; ``[[host_name("k")]]`` becomes ``host_name("k")``, likewise (C++ allows a GNU attribute, and no
  ``[[...]]`` list, on an explicit instantiation);
- every other MSL attribute (``[[buffer(0)]]``, ``[[thread_position_in_grid]]``, ...) is blanked and returned as an
  ``Attr`` (the rules read kernel signatures from them); C++'s own attributes stay;
- ``threadgroup``/``constant`` starting a variable definition (no pointer, reference or function) becomes
  ``_MSL_TG_VAR``/``_MSL_CV_``/``_MSL_FC_`` (a function constant): C++ allows no automatic variable in an address
  space, and the prelude defines these as static storage in it;
- the ``h`` of a half literal (``1.0h``) is blanked.

Comments, string and character literals are never rewritten. The prelude
(csrc/msl_check/include/msl_check_prelude.h) states the same conventions from its side: keep both in step.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Attr:
    start: int  # offset of "[["
    end: int  # offset after "]]"
    items: tuple  # ((name, args or None), ...)
    line: int
    col: int


# C++ attributes clang understands; every other [[...]] is an MSL attribute.
_CXX_ATTRS = {"maybe_unused", "nodiscard", "noreturn", "fallthrough", "likely", "unlikely", "deprecated",
              "carries_dependency", "no_unique_address"}
_STAGE_WORDS = {"kernel", "vertex", "fragment"}
_IDENT = re.compile(r"[A-Za-z_]\w*")
_NUMBER = re.compile(r"\.?\d(?:[eE][+-]|[\w.])*")  # a preprocessing number


def _skip_literal(s: str, i: int) -> int:
    """End offset of the comment or string/char literal starting at s[i], or i when there is none there."""
    if s.startswith("//", i):
        j = s.find("\n", i)
        return len(s) if j < 0 else j
    if s.startswith("/*", i):
        j = s.find("*/", i + 2)
        return len(s) if j < 0 else j + 2
    if s[i] in "\"'":
        q, j = s[i], i + 1
        while j < len(s) and s[j] != q and s[j] != "\n":
            j += 2 if s[j] == "\\" else 1
        return min(j + 1, len(s))
    return i


def _split_attr_items(body: str):
    items, depth, cur = [], 0, ""
    for ch in body:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    out = []
    for it in items:
        m = re.fullmatch(r"\s*([A-Za-z_][\w:]*)\s*(?:\((.*)\))?\s*", it, flags=re.S)
        if m:
            out.append((m.group(1), m.group(2)))
    return tuple(out)


def rewrite(src: str):
    """(rewritten source, MSL attributes in source order)."""
    out = list(src)
    attrs = []
    line_starts = [0] + [m.end() for m in re.finditer("\n", src)]

    def linecol(off):
        ln = bisect.bisect_right(line_starts, off)
        return ln, off - line_starts[ln - 1] + 1

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    i, n = 0, len(src)
    keywords = []  # offsets of `threadgroup` / `constant` identifiers
    while i < n:
        j = _skip_literal(src, i)
        if j != i:
            i = j
            continue
        if src.startswith("[[", i):
            depth, k = 0, i
            while k < n:
                if src[k] == "[":
                    depth += 1
                elif src[k] == "]":
                    depth -= 1
                    if depth == 0:
                        break
                k += 1
            if k < n and src[k - 1] == "]" and k > i + 2:
                body = src[i + 2:k - 1]
                items = _split_attr_items(body)
                names = [nm for nm, _ in items]
                if names and all(nm in _CXX_ATTRS or "::" in nm for nm in names):
                    i = k + 1
                    continue
                if len(names) == 1 and names[0] in _STAGE_WORDS and items[0][1] is None:
                    blank(i, k + 1)
                    out[i:i + len(names[0])] = list(names[0])
                elif len(names) == 1 and names[0] == "host_name" and items[0][1] is not None:
                    for q in (i, i + 1, k - 1, k):  # the brackets only: the prelude's host_name() macro remains
                        out[q] = " "
                else:
                    blank(i, k + 1)
                    ln, col = linecol(i)
                    attrs.append(Attr(i, k + 1, items, ln, col))
                i = k + 1
                continue
        m = _NUMBER.match(src, i) if (src[i].isdigit() or src[i] == ".") and (
            i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")) else None
        if m:
            # A half literal (1.0h, MSL spec "Scalar Data Types"): the suffix is blanked, leaving a floating
            # literal, which converts to half where one is expected.
            if m.group(0)[-1] in "hH" and not m.group(0).lower().startswith("0x"):
                out[m.end() - 1] = " "
            i = m.end()
            continue
        m = _IDENT.match(src, i)
        if m:
            if m.group(0) in ("threadgroup", "constant"):
                keywords.append(i)
            i = m.end()
            continue
        i += 1

    text = "".join(out)
    for off in keywords:
        word = "threadgroup" if text.startswith("threadgroup", off) else "constant"
        if text[line_starts[linecol(off)[0] - 1]:off].lstrip().startswith("#"):
            continue  # in a preprocessor directive (#define X constant)
        # The declaration up to its first `;`, `=`, `{`, `(`, `)` or `,`: a variable definition when it ends at
        # `;`, `=` or `{` and declares no pointer, reference or function.
        k = off + len(word)
        while k < len(text) and text[k] not in ";={}(),*&":
            k += 1
        if k >= len(text) or text[k] not in ";={":
            continue
        if word == "threadgroup":
            repl = "_MSL_TG_VAR"
        else:
            fc = any(off < a.start < k and any(nm == "function_constant" for nm, _ in a.items) for a in attrs)
            repl = "_MSL_FC_" if fc else "_MSL_CV_"
        out[off:off + len(word)] = list(repl)  # same length as the keyword
    return "".join(out), attrs
