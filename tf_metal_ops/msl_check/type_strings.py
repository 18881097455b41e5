"""Type strings of clang's JSON AST (``qualType``), read in MSL's terms: which address space a pointer or reference
refers to, which one an object lives in. The prelude's address spaces: device = 1, constant = 2, threadgroup = 3,
threadgroup_imageblock = 4; thread is the default one, marked ``noderef``."""

from __future__ import annotations

import re

SPACE_NAMES = {"1": "device", "2": "constant", "3": "threadgroup", "4": "threadgroup_imageblock"}


def normalise(t: str) -> str:
    """Type string with template arguments emptied and address spaces as the words device/constant/threadgroup/
    threadgroup_imageblock/thread (clang prints macro names or __attribute__ spellings)."""
    out, depth = [], 0
    for ch in t:
        if ch == "<":
            depth += 1
            if depth == 1:
                out.append("<")
            continue
        if ch == ">" and depth:
            depth -= 1
            if depth == 0:
                out.append(">")
            continue
        if depth == 0:
            out.append(ch)
    s = "".join(out)
    s = re.sub(r"__attribute__\(\(address_space\((\d+)\)\)\)",
               lambda m: " " + SPACE_NAMES.get(m.group(1), "as" + m.group(1)) + " ", s)
    # noderef (= thread) qualifies the pointee, but clang prints a pointee's attribute after the `*`/`&`.
    s = re.sub(r"([*&]+)\s*__attribute__\(\(noderef\)\)", r" thread \1", s)
    s = s.replace("__attribute__((noderef))", " thread ")
    s = re.sub(r"__attribute__\(\(.*?\)\)\)?", " ", s)
    return s


_SPACE_WORD = re.compile(r"\b(device|constant|threadgroup_imageblock|threadgroup|thread|as\d+)\b")


def pointee_space(t: str):
    """None when `t` is not a pointer or reference type; else the address space of what it refers to, or "" for
    none written."""
    s = normalise(t)
    if "(" in s or "::*" in s:  # function pointers, references to arrays, member pointers: not checked
        return None
    k = max(s.rfind("*"), s.rfind("&"))
    if k < 0:
        return None
    pointee = s[:k].rstrip("&")
    j = max(pointee.rfind("*"), pointee.rfind("&"))
    seg = pointee[j + 1:] if j >= 0 else pointee
    m = _SPACE_WORD.search(seg)
    return m.group(1) if m else ""


def object_space(t: str) -> str:
    """Address space of an object of type `t` ("" = thread/default)."""
    s = normalise(t)
    k = max(s.rfind("*"), s.rfind("&"))
    seg = s[k + 1:] if k >= 0 else s
    m = _SPACE_WORD.search(seg)
    return m.group(1) if m and m.group(1) != "thread" else ""


def types_of(node) -> list[str]:
    t = node.get("type") or {}
    return [x for x in (t.get("qualType"), t.get("desugaredQualType")) if x]


def type_of(node) -> str:
    t = node.get("type") or {}
    return t.get("desugaredQualType") or t.get("qualType") or ""


def sugar(node) -> str:
    return (node.get("type") or {}).get("qualType", "")


def return_type(fn_type: str) -> str:
    """Return type of a function type string "R (A, B) const"."""
    s = fn_type.rstrip()
    s = re.sub(r"\)\s*(const|volatile|&|&&|noexcept|\s)*$", ")", s)
    depth = 0
    for k in range(len(s) - 1, -1, -1):
        if s[k] == ")":
            depth += 1
        elif s[k] == "(":
            depth -= 1
            if depth == 0:
                return s[:k].strip()
    return s
