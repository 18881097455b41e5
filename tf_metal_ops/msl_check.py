"""A strict Metal Shading Language check without Apple's compiler.

The source is compiled once by clang++ (>= 16) as C++14 (MSL 2.x/3.x are based on C++14; C++17 from MSL 4.0)
with ``-fsyntax-only -Xclang -ast-dump=json``, against msl_check's own ``<metal_stdlib>`` and keyword prelude
(``tools/msl_check/include``; their conventions are documented there). MSL's address spaces are distinct clang address
spaces there, so clang itself rejects what MSL rejects about them (binding a ``device`` pointer to a ``thread`` one,
writing through ``constant``). Then the JSON AST is searched for what clang accepts but Apple's compiler rejects.

Every finding has a rule name. ``compile`` is clang's own error (syntax, types, address-space mismatches); the
others, with the section of Apple's Metal Shading Language Specification ("MSL spec", 3.x) behind each:

- ``pointer-address-space``: a pointer or reference type written without an address space (``float* p``), in a
  parameter, variable, field, return type, typedef or cast. MSL requires one on every pointer and reference
  ("Address Spaces"; Apple's compiler: "pointer type must have explicit address space qualifier"); ``thread`` is
  the one for local memory. Not checked: types deduced by ``auto``/``decltype`` (they carry the initialiser's
  address space), compiler-generated declarations (implicit copy constructors, ``this``), and template
  instantiations (their pattern is checked).
- ``kernel-argument-address-space``: a kernel's pointer/reference argument in ``thread`` memory ("Address Spaces":
  kernel arguments point to device, constant, threadgroup or threadgroup_imageblock memory).
- ``program-scope-variable``: a variable at program scope, a static data member, or a function-scope ``static``
  variable, outside the ``constant`` address space ("constant Address Space"; Apple's compiler: "program scope
  variable must reside in constant address space").
- ``threadgroup-variable``: a ``threadgroup`` variable outside a kernel function's scope ("threadgroup Address
  Space").
- ``address-space-cast``: an explicit cast that changes the address space a pointer or reference refers to
  ("Address Spaces": no conversions between address spaces).
- ``recursion``: a call in a cycle of the call graph, direct or mutual ("Metal Restrictions" lists recursive
  function calls; later versions allow some in limited cases only, so it is rejected here at every version).
- ``lambda``, ``goto``, ``new-delete``, ``exception`` (``throw``/``try``), ``virtual-function``, ``dynamic-cast``,
  ``typeid``, ``thread-local``: C++ features MSL does not support ("Metal Restrictions").
- ``double``: the type ``double`` written in a declaration, cast or ``sizeof`` ("Scalar Data Types": no double).
  Floating literals such as ``0.5`` are not findings: MSL gives them type float.
- ``memory-order``: a memory order other than ``memory_order_relaxed`` ("Atomic Functions": the only one in MSL 2.4
  and 3.0).
- ``atomic-float``: ``atomic_float`` / ``atomic<float>`` below MSL 3.0 ("Atomic Data Types").
- ``as-type-size``: ``as_type<T>(x)`` with ``sizeof(T) != sizeof(x)`` ("Reinterpreting Data").
- ``implicit-vector-conversion``: an implicit conversion between vector types of different element types, e.g.
  ``half4``↔``float4`` or ``int4``↔``uint4`` ("Implicit Type Conversions": only explicit conversions between vector
  types). Scalar conversions such as ``half``→``float`` are implicit in MSL too and not findings.
- kernel signatures ("Function and Variable Attributes"): ``buffer-index-duplicate`` (two ``[[buffer(n)]]`` with the
  same n in one kernel), ``buffer-index-range`` (n > 30: the buffer argument table has 31 entries),
  ``position-attribute-type`` (``thread_position_in_grid`` and the other position/size attributes must be
  ``uint``/``ushort`` or their 2- and 3-vectors; index attributes such as ``thread_index_in_simdgroup`` a
  ``uint``/``ushort`` scalar), ``kernel-return-type`` (a kernel returns void).

Source positions: findings report clang's presumed location, so ``#line N "name"`` in the source is honoured.
MSL attributes (``[[buffer(0)]]``, ``[[thread_position_in_grid]]``, ...) and variable definitions in threadgroup or
constant memory are rewritten in the checked source (same length: lines and columns hold) before compiling;
headers it includes are compiled as they are (their ``[[...]]`` attributes are ignored by clang, except
``[[threadgroup(n)]]``, a syntax error there), so kernels should be in the checked source itself.

Importable without TensorFlow; needs only the standard library and clang++ >= 16.
"""

from __future__ import annotations

import bisect
import functools
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

__all__ = ["Finding", "MSLCheckError", "MSLCompilerNotFound", "RULES", "check_source", "check_file", "find_compiler",
           "include_dir"]

# Every rule a finding can have (the module docstring gives the MSL rule behind each).
RULES = (
    "compile", "pointer-address-space", "kernel-argument-address-space", "program-scope-variable",
    "threadgroup-variable", "address-space-cast", "recursion", "lambda", "goto", "new-delete", "exception",
    "virtual-function", "dynamic-cast", "typeid", "thread-local", "double", "memory-order", "atomic-float",
    "as-type-size", "implicit-vector-conversion", "buffer-index-duplicate", "buffer-index-range",
    "position-attribute-type", "kernel-return-type",
)


# ---- public API ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Finding:
    file: str
    line: int
    column: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: error: {self.message} [{self.rule}]"


class MSLCheckError(ValueError):
    """Raised by callers that require a clean source; ``findings`` are what was found."""

    def __init__(self, findings: Sequence[Finding]):
        self.findings = list(findings)
        super().__init__("\n".join(str(f) for f in self.findings))


class MSLCompilerNotFound(RuntimeError):
    """No clang++ >= 16 was found."""


def find_compiler() -> str:
    """clang++ >= 16: TF_METAL_OPS_CLANGXX if set, else the first of clang++-16..19, clang++ on PATH."""
    override = os.environ.get("TF_METAL_OPS_CLANGXX")
    names = [override] if override else ["clang++-16", "clang++-17", "clang++-18", "clang++-19", "clang++"]
    for name in names:
        path = shutil.which(name) or (name if os.path.isfile(name) else None)
        if path is None:
            continue
        major = _clang_major(path)
        if major is not None and major >= 16:
            return path
        if override:
            raise MSLCompilerNotFound(f"tf_metal_ops.msl_check: TF_METAL_OPS_CLANGXX={override} is not clang++ >= 16")
    raise MSLCompilerNotFound(
        "tf_metal_ops.msl_check needs clang++ >= 16 to check Metal sources (Debian/Ubuntu: `apt-get install clang-16`; "
        "or point TF_METAL_OPS_CLANGXX at a clang++ >= 16)"
    )


def include_dir() -> Path:
    """The directory of msl_check's <metal_stdlib> and prelude: the wheel's package data
    (tf_metal_ops/_sources/tools/msl_check/include) or the source checkout's tools/msl_check/include."""
    pkg = Path(__file__).resolve().parent
    for root in (pkg / "_sources", pkg.parent):
        d = root / "tools" / "msl_check" / "include"
        if (d / "metal_stdlib").is_file() and (d / _PRELUDE).is_file():
            return d
    raise FileNotFoundError(
        f"tf_metal_ops.msl_check: its <metal_stdlib> is missing (looked in {pkg / '_sources'} and {pkg.parent}); "
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
    version = _metal_version(msl_version)
    cxx = compiler or find_compiler()
    stub = include_dir()
    rewritten, attrs = _rewrite(source)
    cmd = [
        cxx, "-x", "c++", "-std=c++17" if version >= 400 else "-std=c++14", "-fsyntax-only", "-w",
        "-fno-crash-diagnostics", "-ferror-limit=0", "-fno-color-diagnostics", "-fno-caret-diagnostics",
        "-fno-diagnostics-fixit-info", "-fcxx-exceptions", "-nostdinc", "-nostdinc++",
        "-isystem", str(stub), "-include", str(stub / _PRELUDE), f"-D__METAL_VERSION__={version}",
    ]
    src_dir = os.path.dirname(os.path.abspath(filename)) if filename and not filename.startswith("<") else None
    if src_dir and os.path.isdir(src_dir):
        cmd += ["-iquote", src_dir]
    for d in include_dirs:
        cmd += ["-I", os.fspath(d)]
    cmd += ["-Xclang", "-ast-dump=json", "-"]
    r = subprocess.run(cmd, input=rewritten.encode(), capture_output=True, check=False)
    stderr = r.stderr.decode(errors="replace")
    ctx = _Context(filename, rewritten, attrs, str(stub), version)
    findings, errors = _diagnostics(stderr, ctx)
    if r.returncode not in (0, 1):
        findings.append(Finding(filename, 1, 1, "compile",
                                f"clang++ failed (exit status {r.returncode}); nothing was checked: {stderr[-500:]}"))
        return _sorted(findings)
    if r.returncode != 0 and not errors:
        findings.append(Finding(filename, 1, 1, "compile", f"clang++ failed without a diagnostic: {stderr[-500:]}"))
    try:
        ast = json.loads(r.stdout)
    except ValueError:
        ast = None
    if ast is None:
        if not findings:  # never report a source as clean that was not checked
            findings.append(Finding(filename, 1, 1, "compile", "clang++ gave no AST; the source was not checked"))
    else:
        findings += _AstChecker(ctx).run(ast)
    return _sorted(findings)


def check_file(path, *, msl_version: str = "3.0", include_dirs: Sequence[str] = (), compiler: str | None = None
               ) -> list[Finding]:
    """check_source on the file at ``path`` (its directory is searched for "quoted" includes)."""
    path = os.fspath(path)
    with open(path, encoding="utf-8") as f:
        source = f.read()
    return check_source(source, filename=path, msl_version=msl_version, include_dirs=include_dirs, compiler=compiler)


# ---- toolchain --------------------------------------------------------------------------------------------------
_PRELUDE = "msl_check_prelude.h"


@functools.lru_cache(maxsize=16)
def _clang_major(path: str):
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"clang version (\d+)", out)
    return int(m.group(1)) if m else None


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
                 lambda m: _SPACE_NAMES.get(m.group(1), m.group(0)), msg)
    # clang prints the thread marker of a pointee after the `*`: 'float * __attribute__((noderef))'.
    msg = re.sub(r"'([^']*?) ?([*&]+) ?__attribute__\(\(noderef\)\)'", r"'thread \1 \2'", msg)
    msg = msg.replace("__attribute__((noderef))", "thread").replace("__attribute__(()) ", "")
    return msg.replace("_Float16", "half")


# ---- source rewrite (length-preserving, so offsets, lines and columns are unchanged) ---------------------------------
@dataclass(frozen=True)
class _Attr:
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


def _rewrite(src: str):
    """Returns (rewritten source, MSL attributes). See the module docstring and msl_check_prelude.h."""
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
                else:
                    blank(i, k + 1)
                    ln, col = linecol(i)
                    attrs.append(_Attr(i, k + 1, items, ln, col))
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


def _line_map(text: str):
    """Presumed (file or None, line) of each actual line, from `#line N "file"` and `# N "file"` directives."""
    marks = []  # (actual line of the directive, presumed line of the next line, file or None)
    for idx, ln in enumerate(text.split("\n"), start=1):
        m = re.match(r'\s*#\s*(?:line\s+)?(\d+)(?:\s+"((?:[^"\\]|\\.)*)")?', ln)
        if m and re.match(r"\s*#\s*(line\b|\d)", ln):
            marks.append((idx, int(m.group(1)), m.group(2)))
    return marks


# ---- shared state of one check -----------------------------------------------------------------------------------
class _Context:
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


# ---- clang's diagnostics -------------------------------------------------------------------------------------------
_DIAG = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): (?P<sev>fatal error|error|warning|note): (?P<msg>.*)$")
_MARKER = re.compile(r"msl_check\[(?P<rule>[\w-]+)\]: (?P<msg>[^\"]*)")
_VECTOR = re.compile(r"\(vector of \d+ '([^']+)' values\)")
_IMPLICIT_MEMBER = re.compile(r"candidate (?:constructor|function)(?: template)? \(the implicit (?:copy|move|default) ")


def _diagnostics(stderr: str, ctx: _Context):
    """(findings, number of clang errors read): clang's errors as findings, except those _is_cross_space_copy
    explains."""
    groups = []  # [error line match, [note matches]]
    for raw in stderr.splitlines():
        m = _DIAG.match(raw)
        if m is None:
            if raw.startswith(("clang: error:", "clang++: error:", "error:")):
                groups.append([None, [], raw])
            continue
        if m.group("sev") in ("error", "fatal error"):
            groups.append([m, [], raw])
        elif m.group("sev") == "note" and groups:
            groups[-1][1].append(m)
    findings = []
    for m, notes, raw in groups:
        if m is None:
            findings.append(Finding(ctx.filename, 1, 1, "compile", raw.split("error:", 1)[1].strip()))
            continue
        msg = m.group("msg")
        if _is_cross_space_copy(msg, notes):
            continue
        where = m
        if ctx.is_stub(m.group("file")):
            user = [nt for nt in notes if not ctx.is_stub(nt.group("file"))]
            if user:
                where = user[0]
        file = where.group("file")
        file = ctx.filename if file == "<stdin>" else file
        rule = "compile"
        if msg.startswith("no viable overloaded '='") and any(_INTO_CONSTANT in nt.group("msg") for nt in notes):
            msg = "cannot assign to an object in constant memory (read-only): " + msg
        mk = _MARKER.search(msg)
        if mk:
            rule, msg = mk.group("rule"), mk.group("msg").strip()
        else:
            # A call's only candidate refused for a vector conversion is that conversion too.
            cands = [nt.group("msg") for nt in notes if nt.group("msg").startswith("candidate")]
            text = msg if not msg.startswith("no matching function") or len(cands) != 1 else cands[0]
            elems = _VECTOR.findall(text)
            if len(elems) >= 2 and len(set(elems)) > 1:
                rule = "implicit-vector-conversion"
                if text is not msg:
                    msg = f"{msg}: {text}"
        findings.append(Finding(file, int(where.group("line")), int(where.group("col")), rule, msg))
    return findings, len(groups)


_OTHER_SPACE_CTOR = "candidate constructor ignored: cannot be used to construct an object in address space"
_INTO_CONSTANT = "'this' object is in address space '2'"


def _is_cross_space_copy(msg: str, notes) -> bool:
    """MSL copies structs between address spaces with the implicit copy/move constructor and assignment
    (`HgLevel lv = levels[i];` from constant memory), and default-initialises `threadgroup` structs and atomics.
    C++'s implicit members take generic references and construct generic objects, so clang rejects these; such an
    error (every candidate an implicit member or a constructor refused for the address space, at least one refused
    for the address space) is not a finding. Not seen as a consequence: a user-declared default constructor of a
    type declared in threadgroup memory."""
    if not re.match(r"(no matching constructor for initialization of|no viable overloaded '=')", msg):
        return False
    cands = [nt.group("msg") for nt in notes if nt.group("msg").startswith("candidate")]
    if not cands or not all(_IMPLICIT_MEMBER.match(c) or c.startswith(_OTHER_SPACE_CTOR) for c in cands):
        return False
    if any(_INTO_CONSTANT in c for c in cands):
        return False  # an assignment to constant memory, which is read-only
    return any("address space" in c for c in cands)


# ---- type strings of the JSON AST --------------------------------------------------------------------------------
_SPACE_NAMES = {"1": "device", "2": "constant", "3": "threadgroup", "4": "threadgroup_imageblock"}


def _normalise(t: str) -> str:
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
               lambda m: " " + _SPACE_NAMES.get(m.group(1), "as" + m.group(1)) + " ", s)
    # noderef (= thread) qualifies the pointee, but clang prints a pointee's attribute after the `*`/`&`.
    s = re.sub(r"([*&]+)\s*__attribute__\(\(noderef\)\)", r" thread \1", s)
    s = s.replace("__attribute__((noderef))", " thread ")
    s = re.sub(r"__attribute__\(\(.*?\)\)\)?", " ", s)
    return s


_SPACE_WORD = re.compile(r"\b(device|constant|threadgroup_imageblock|threadgroup|thread|as\d+)\b")


def _pointee_space(t: str):
    """None when `t` is not a pointer or reference type; else the address space of what it refers to, or "" for
    none written."""
    s = _normalise(t)
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


def _object_space(t: str) -> str:
    """Address space of an object of type `t` ("" = thread/default)."""
    s = _normalise(t)
    k = max(s.rfind("*"), s.rfind("&"))
    seg = s[k + 1:] if k >= 0 else s
    m = _SPACE_WORD.search(seg)
    return m.group(1) if m and m.group(1) != "thread" else ""


def _types(node) -> list[str]:
    t = node.get("type") or {}
    return [x for x in (t.get("qualType"), t.get("desugaredQualType")) if x]


def _type(node) -> str:
    t = node.get("type") or {}
    return t.get("desugaredQualType") or t.get("qualType") or ""


def _sugar(node) -> str:
    return (node.get("type") or {}).get("qualType", "")


def _return_type(fn_type: str) -> str:
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


_POSITION_ATTRS = {"thread_position_in_grid", "thread_position_in_threadgroup", "threadgroup_position_in_grid",
                   "threads_per_grid", "threads_per_threadgroup", "threadgroups_per_grid",
                   "dispatch_threads_per_threadgroup", "grid_origin", "grid_size"}
_INDEX_ATTRS = {"thread_index_in_threadgroup", "thread_index_in_simdgroup", "thread_index_in_quadgroup",
                "simdgroup_index_in_threadgroup", "quadgroup_index_in_threadgroup", "threads_per_simdgroup",
                "simdgroups_per_threadgroup", "quadgroups_per_threadgroup", "thread_execution_width",
                "dispatch_simdgroups_per_threadgroup", "dispatch_quadgroups_per_threadgroup"}
_UNSIGNED = r"(?:const\s+)?(?:unsigned int|unsigned short|uint|ushort)(?:\s+const)?"
_POSITION_TYPE = re.compile(_UNSIGNED + r"(?:\s*__attribute__\(\(ext_vector_type\([23]\)\)\))?(?:\s+const)?")
_INDEX_TYPE = re.compile(_UNSIGNED)
_OTHER_MEMORY_ORDERS = {"memory_order_consume", "memory_order_acquire", "memory_order_release",
                        "memory_order_acq_rel", "memory_order_seq_cst"}
_EXPLICIT_CASTS = {"CStyleCastExpr", "CXXStaticCastExpr", "CXXReinterpretCastExpr", "CXXConstCastExpr",
                   "CXXFunctionalCastExpr"}
_SIMPLE_RULES = {
    "LambdaExpr": ("lambda", "lambda expressions are not supported in MSL"),
    "GotoStmt": ("goto", "goto is not supported in MSL"),
    "IndirectGotoStmt": ("goto", "goto is not supported in MSL"),
    "CXXNewExpr": ("new-delete", "new is not supported in MSL"),
    "CXXDeleteExpr": ("new-delete", "delete is not supported in MSL"),
    "CXXThrowExpr": ("exception", "exceptions (throw) are not supported in MSL"),
    "CXXTryStmt": ("exception", "exceptions (try) are not supported in MSL"),
    "CXXDynamicCastExpr": ("dynamic-cast", "dynamic_cast is not supported in MSL"),
    "CXXTypeidExpr": ("typeid", "typeid is not supported in MSL"),
}
_DOUBLE = re.compile(r"\bdouble\b")
_ATOMIC_FLOAT = re.compile(r"\batomic_float\b|\batomic<float>")


# ---- the JSON AST ----------------------------------------------------------------------------------------------------
def _annotate_locations(ast):
    """clang's JSON writes a location's file and line only when they change from the previous location written:
    walk the dump in its order and store the full (file, line) in each location as "_file" / "_line"."""
    file, line = "", 0
    stack = [ast]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "offset" in node and "col" in node:
                if "file" in node:
                    file = node["file"]
                if "line" in node:
                    line = node["line"]
                node["_file"], node["_line"] = file, line
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, list):
            stack.extend(reversed(node))


def _bare(loc):
    if not loc:
        return None
    if "expansionLoc" in loc:
        return loc["expansionLoc"]
    return loc if "_file" in loc else loc.get("spellingLoc")


class _AstChecker:
    def __init__(self, ctx: _Context):
        self.ctx = ctx
        self.findings = {}
        self.calls = []  # (caller id, callee id, location)
        self.canon = {}  # decl id -> first declaration's id
        self.kernel_line = None

    # -- helpers
    def where(self, node, key="loc"):
        loc = _bare(node.get(key)) if key == "loc" else None
        if loc is None:
            loc = _bare((node.get("range") or {}).get("begin"))
        if loc is None or "_file" not in loc:
            return None
        return loc

    def add(self, node, rule, message, loc=None):
        loc = loc or self.where(node)
        if loc is None or self.ctx.is_stub(loc["_file"]):
            return
        file, line = self.ctx.presumed(loc["_file"], loc["_line"])
        if file == "<stdin>":
            file = self.ctx.filename
        key = (file, line, rule)
        f = Finding(file, line, loc.get("col", 1), rule, message)
        if key not in self.findings or self.findings[key].column > f.column:
            self.findings[key] = f

    def root(self, i):
        while i in self.canon and self.canon[i] != i:
            i = self.canon[i]
        return i

    # -- traversal
    def run(self, ast) -> list[Finding]:
        _annotate_locations(ast)
        self._find_stage_lines()
        try:
            self.visit(ast, fn=None, kernel=False, scope="program", inst=False)
            self._recursion()
        except RecursionError:  # an AST deeper than Python's recursion limit: never report it clean
            return list(self.findings.values()) + [
                Finding(self.ctx.filename, 1, 1, "compile", "the source nests too deeply to be checked")]
        return list(self.findings.values())

    def _find_stage_lines(self):
        text = (self.ctx.source_of(os.path.join(self.ctx.stub, _PRELUDE)) or "").split("\n")
        self.kernel_line = next((k + 1 for k, ln in enumerate(text) if ln.startswith("#define kernel ")), None)

    def _is_kernel(self, fn) -> bool:
        for a in fn.get("inner", []):
            if a.get("kind") == "AnnotateAttr":
                sp = ((a.get("range") or {}).get("begin") or {}).get("spellingLoc") or {}
                if sp.get("_line") == self.kernel_line and self.ctx.is_stub(sp.get("_file", "")):
                    return True
        return False

    def visit(self, node, fn, kernel, scope, inst):
        if not isinstance(node, dict):
            return
        kind = node.get("kind", "")
        if node.get("isImplicit"):
            return
        loc = self.where(node)
        if loc is not None and self.ctx.is_stub(loc["_file"]):
            return
        children = node.get("inner", [])

        if kind in ("FunctionTemplateDecl", "ClassTemplateDecl"):
            first = True
            for c in children:
                if c.get("kind") in ("FunctionDecl", "CXXMethodDecl", "CXXConstructorDecl", "CXXRecordDecl",
                                     "CXXConversionDecl", "CXXDestructorDecl"):
                    self.visit(c, fn, kernel, scope, inst or not first)
                    first = False
                else:
                    self.visit(c, fn, kernel, scope, inst)
            return
        if kind == "ClassTemplateSpecializationDecl":
            inst = True

        if kind in _SIMPLE_RULES:
            rule, msg = _SIMPLE_RULES[kind]
            self.add(node, rule, msg, loc=self.where(node, "range"))
            if kind == "LambdaExpr":
                return

        if kind in ("FunctionDecl", "CXXMethodDecl", "CXXConstructorDecl", "CXXDestructorDecl", "CXXConversionDecl"):
            self.canon.setdefault(node["id"], node.get("previousDecl", node["id"]))
            is_kernel = self._is_kernel(node)
            ret = _return_type(node.get("type", {}).get("qualType", ""))
            if not inst:
                self._check_pointer(node, ret, "return type")
                if _DOUBLE.search(ret):
                    self.add(node, "double", "double is not supported in MSL (return type)")
            if node.get("virtual"):
                self.add(node, "virtual-function", "virtual functions are not supported in MSL")
            if is_kernel:
                if ret != "void":
                    self.add(node, "kernel-return-type", f"a kernel function must return void, not {ret}")
                self._kernel_signature(node)
            for c in children:
                self.visit(c, node, is_kernel, "function", inst)
            return

        if kind in ("CXXRecordDecl",):
            for c in children:
                self.visit(c, fn, kernel, "record", inst)
            return

        if kind in ("ParmVarDecl", "VarDecl", "FieldDecl", "TypedefDecl", "TypeAliasDecl"):
            self._declaration(node, kind, fn, kernel, scope, inst)

        if kind in _EXPLICIT_CASTS:
            self._cast(node, inst)
        elif kind == "ImplicitCastExpr" and node.get("castKind") == "BitCast" and children:
            a, b = _type(node), _type(children[0])
            if "ext_vector_type" in a and "ext_vector_type" in b and a != b:
                self.add(node, "implicit-vector-conversion",
                         f"implicit conversion from '{_sugar(children[0])}' to '{_sugar(node)}' (MSL converts "
                         "between vector types only explicitly)", loc=self.where(node, "range"))
        elif kind == "DeclRefExpr":
            ref = node.get("referencedDecl") or {}
            if ref.get("kind") == "EnumConstantDecl" and ref.get("name") in _OTHER_MEMORY_ORDERS:
                self.add(node, "memory-order",
                         f"{ref['name']} is not supported: MSL 2.4/3.0 atomics take memory_order_relaxed only",
                         loc=self.where(node, "range"))
        elif kind == "UnaryExprOrTypeTraitExpr" and not inst:
            if _DOUBLE.search((node.get("argType") or {}).get("qualType", "")):
                self.add(node, "double", "double is not supported in MSL", loc=self.where(node, "range"))
        elif kind in ("CallExpr", "CXXMemberCallExpr", "CXXOperatorCallExpr") and fn is not None:
            callee = self._callee(children[0] if children else None)
            if callee:
                self.calls.append((fn["id"], callee, self.where(node, "range")))

        if self.ctx.version < 300 and not kind.endswith("Attr"):
            if any(_ATOMIC_FLOAT.search(t) for t in _types(node)):
                self.add(node, "atomic-float", "atomic_float needs MSL 3.0 or later",
                         loc=self.where(node, "range") if "Expr" in kind else None)

        for c in children:
            self.visit(c, fn, kernel, scope, inst)

    def _callee(self, e):
        while isinstance(e, dict):
            k = e.get("kind")
            if k == "DeclRefExpr":
                ref = e.get("referencedDecl") or {}
                return ref.get("id") if "Function" in ref.get("kind", "") or "CXX" in ref.get("kind", "") else None
            if k == "MemberExpr":
                return e.get("referencedMemberDecl")
            inner = e.get("inner") or []
            e = inner[0] if inner else None
        return None

    # -- rules on declarations
    def _check_pointer(self, node, t, what):
        sp = _pointee_space(t)
        if sp == "":
            self.add(node, "pointer-address-space",
                     f"pointer or reference type '{t}' needs an explicit address space (device, constant, "
                     f"threadgroup or thread) ({what})")
        return sp

    def _written_auto(self, node) -> bool:
        b = _bare((node.get("range") or {}).get("begin"))
        e = _bare(node.get("loc"))
        if not b or not e or b.get("_file") != e.get("_file"):
            return False
        src = self.ctx.source_of(b["_file"])
        if src is None:
            return False
        return re.search(r"\b(auto|decltype)\b", src[b["offset"]:e["offset"]]) is not None

    def _declaration(self, node, kind, fn, kernel, scope, inst):
        t = _type(node)
        written = node.get("type", {}).get("qualType", "")
        if not inst and not (kind == "VarDecl" and self._written_auto(node)):
            self._check_pointer(node, t, {"ParmVarDecl": "parameter", "VarDecl": "variable", "FieldDecl": "field"}
                                .get(kind, "type alias"))
            if _DOUBLE.search(written) or _DOUBLE.search(t):
                self.add(node, "double", "double is not supported in MSL")
        if kind != "VarDecl":
            return
        if node.get("tls"):
            self.add(node, "thread-local", "thread_local is not supported in MSL")
        space = _object_space(t)
        static = node.get("storageClass") in ("static", "extern")
        program = scope in ("program", "record") or (scope == "function" and static)
        if space == "threadgroup":
            if not (scope == "function" and kernel):
                self.add(node, "threadgroup-variable",
                         "threadgroup variables may be declared only in a kernel function's scope")
        elif program and space != "constant" and not node.get("isParameterPack"):
            where = {"program": "program-scope", "record": "static data member",
                     "function": "function-scope static"}[scope]
            self.add(node, "program-scope-variable",
                     f"{where} variable '{node.get('name', '')}' must be in the constant address space")

    def _cast(self, node, inst):
        t = _type(node)
        children = node.get("inner") or []
        if not inst:
            self._check_pointer(node, t, "cast")
            if _DOUBLE.search(node.get("type", {}).get("qualType", "")):
                self.add(node, "double", "double is not supported in MSL (cast)", loc=self.where(node, "range"))
        src = _type(children[0]) if children else ""
        a, b = _pointee_space(t), _pointee_space(src)
        changes = node.get("castKind") == "AddressSpaceConversion" or (
            a is not None and b is not None and (a or "thread") != (b or "thread"))
        if changes:
            self.add(node, "address-space-cast",
                     f"cast from '{src}' to '{t}' changes the address space (MSL has no address-space casts)",
                     loc=self.where(node, "range"))

    def _kernel_signature(self, fn):
        seen = {}
        for p in fn.get("inner", []):
            if p.get("kind") != "ParmVarDecl":
                continue
            t = _type(p)
            sp = _pointee_space(t)
            if sp == "thread":
                self.add(p, "kernel-argument-address-space",
                         f"kernel argument '{p.get('name', '')}' points to thread memory; kernel arguments point to "
                         "device, constant or threadgroup memory")
            for name, args in self._param_attrs(p):
                if name == "buffer" and args is not None:
                    m = re.fullmatch(r"\s*(\d+)[uU]?\s*", args)
                    if not m:
                        continue
                    idx = int(m.group(1))
                    if idx > 30:
                        self.add(p, "buffer-index-range", f"[[buffer({idx})]]: buffer indices are 0 to 30")
                    if idx in seen:
                        self.add(p, "buffer-index-duplicate",
                                 f"[[buffer({idx})]] is also the index of '{seen[idx]}'")
                    else:
                        seen[idx] = p.get("name", "")
                elif name in _POSITION_ATTRS and not _POSITION_TYPE.fullmatch(t.strip()):
                    self.add(p, "position-attribute-type",
                             f"[[{name}]] must be uint, ushort or a 2- or 3-vector of them, not "
                             f"{p.get('type', {}).get('qualType', t)}")
                elif name in _INDEX_ATTRS and not _INDEX_TYPE.fullmatch(t.strip()):
                    self.add(p, "position-attribute-type",
                             f"[[{name}]] must be a uint or ushort scalar, not {p.get('type', {}).get('qualType', t)}")

    def _param_attrs(self, p):
        loc = _bare(p.get("loc"))
        if not loc or loc.get("_file") != "<stdin>" or "expansionLoc" in (p.get("loc") or {}):
            return []
        pos = loc["offset"] + loc.get("tokLen", 0)
        out = []
        for a in self.ctx.attrs:
            if a.start >= pos and not self.ctx.text[pos:a.start].strip():
                out.extend(a.items)
                pos = a.end
        return out

    # -- recursion: cycles of the call graph (Tarjan's strongly connected components)
    def _recursion(self):
        graph = {}
        for caller, callee, _ in self.calls:
            graph.setdefault(self.root(caller), set()).add(self.root(callee))
        index, low, on, stack, comp, counter = {}, {}, set(), [], {}, [0]

        def strong(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in graph.get(v, ()):
                if w not in index:
                    strong(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                members = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    members.append(w)
                    if w == v:
                        break
                for w in members:
                    comp[w] = (v, len(members))

        for v in list(graph):
            if v not in index:
                strong(v)
        for caller, callee, loc in self.calls:
            a, b = self.root(caller), self.root(callee)
            ca, cb = comp.get(a), comp.get(b)
            if ca and cb and ca[0] == cb[0] and (ca[1] > 1 or a == b) and loc is not None:
                self.add({}, "recursion", "recursive call: MSL does not support recursion", loc=loc)
