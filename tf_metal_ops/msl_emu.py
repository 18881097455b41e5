"""Glue between Metal kernel files and the emulated GPU: parse `kernel void NAME(...)` signatures and function
constants of a `.metal` file and generate one C++ translation unit per file that registers every kernel in the
kernel table (csrc/emulated_gpu/kernel_table.h), so that csrc/emulated_gpu/kernel_launch.cc can run it by name.

    units = generate(["metal_kernels/hash_grid.metal"], out_dir)
    for u in units:  # compile each with the base flags plus its own flags, link with kernel_launch.cc
        clang++-16 -x c++ *base_flags() *u.flags -c u.source

Conventions:
  - kernels are written in the plain style of metal_kernels/*.metal: `kernel void name(params) {`, each parameter
    `[address space] [const] Type [*|&] name [[attribute]]`, no templates, no macros in signatures; preprocessor
    conditionals are not evaluated (a kernel inside `#if 0` is still parsed);
  - every .metal file is staged (copied with `#line 1 "<original>"`, `threadgroup` in pointer/reference types
    rewritten to MSL_EMU_TGP, see rewrite_threadgroup_pointers) into out_dir/stage/, which comes first on the
    include path, so a .metal file that includes another one gets the staged copy;
  - a kernel "needs fibers" when it reaches threadgroup_barrier or a SIMD-group function (simd_*, quad_*,
    simdgroup_barrier): in its own body, or through the functions, types and macros it names, transitively, in
    the file and the headers it includes with `#include "..."` (found next to it or on the include path); see
    _kernels_needing_fibers for what the analysis follows and where it gives up (then every kernel of the file
    needs fibers). Other kernels run on msl_emu's fiber-free fast path, where a barrier or a SIMD-group call is a
    fatal error (so a wrong detection cannot pass silently). MetalFile.needs_fibers: some kernel of the file does;
  - a kernel "uses barriers" when its own body calls threadgroup_barrier, or when the file calls it outside every
    kernel body (in a helper or an included header: any kernel may reach it); a kernel cannot call another kernel,
    so that is conservative. Targets that launch whole threadgroups only where a barrier needs them use this
    (dev/gpu_proxy.py);
  - function constants (`constant T name [[function_constant(n)]];`, T = bool/int/uint/float, file scope) need
    -DMSL_EMU_FUNCTION_CONSTANTS, which is in the unit's flags only for files that declare them;
  - a parameter that cannot be classified is a GlueError naming file:line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from pathlib import Path
from typing import Iterable

# `threadgroup` followed by a type and then * or &: a pointer/reference to threadgroup memory.
_TG_POINTER = re.compile(
    r"\bthreadgroup\b(?=(?:\s+(?:const|volatile)\b)*\s+[A-Za-z_][\w:]*(?:\s*<[^<>;{}()]*>)?"
    r"(?:\s+(?:const|volatile)\b)*\s*[*&])"
)
# The [[threadgroup(n)]] attribute: the macro would turn it into [[static thread_local(n)]].
_TG_ATTRIBUTE = re.compile(r"\[\[(\s*)threadgroup(\s*\()")


def rewrite_threadgroup_pointers(text: str) -> str:
    """`threadgroup T* p` / `threadgroup T& r` -> `MSL_EMU_TGP T* p` (storage declarations are left alone), and
    the attribute `[[threadgroup(n)]]` -> `[[msl_emu_threadgroup(n)]]` (an unknown, ignored attribute).

    msl_emu's <metal_stdlib> expands `threadgroup` to `static thread_local`, which is right for kernel-scope
    threadgroup variables and wrong (illegal or shared) for pointers/references to threadgroup memory and inside
    the attribute. Line structure is kept, so #line mappings stay exact.
    """
    return _TG_ATTRIBUTE.sub(r"[[\1msl_emu_threadgroup\2", _TG_POINTER.sub("MSL_EMU_TGP", text))


class GlueError(ValueError):
    """A .metal file the glue cannot handle; the message starts with file:line."""


# ThreadCtx fields (csrc/msl_emu/include/msl_emu/runtime.h): attribute -> is the field a uint3 (else uint).
THREAD_ATTRIBUTES = {
    "thread_position_in_grid": True,
    "thread_position_in_threadgroup": True,
    "threadgroup_position_in_grid": True,
    "threads_per_threadgroup": True,
    "dispatch_threads_per_threadgroup": True,
    "threadgroups_per_grid": True,
    "threads_per_grid": True,
    "thread_index_in_threadgroup": False,
    "threads_per_simdgroup": False,
    "simdgroup_index_in_threadgroup": False,
    "thread_index_in_simdgroup": False,
    "thread_execution_width": False,
    "simdgroups_per_threadgroup": False,
    "dispatch_simdgroups_per_threadgroup": False,
    "quadgroup_index_in_threadgroup": False,
    "thread_index_in_quadgroup": False,
    "quadgroups_per_threadgroup": False,
    "dispatch_quadgroups_per_threadgroup": False,
}
_SCALAR_ATTR_TYPES = ("uint", "ushort")
_VECTOR_ATTR_TYPES = ("uint", "uint2", "uint3", "ushort", "ushort2", "ushort3")
CONSTANT_TYPES = {"bool": "b", "int": "i", "uint": "u", "float": "f"}  # -> ConstantValue::type
ADDRESS_SPACES = ("device", "constant", "threadgroup")


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "buffer" | "threadgroup" | "attribute"
    index: int  # n of [[buffer(n)]] / [[threadgroup(n)]]; 0 for attributes
    address_space: str | None  # "device" | "constant" | "threadgroup"; None for attributes
    const: bool
    pointer: bool  # T* (else T& for buffer/threadgroup, by value for attributes)
    type: str  # pointee type as written (attributes: the value type)
    attribute: str | None  # attributes: "thread_position_in_grid", ...
    line: int

    @property
    def decl(self) -> str:
        """MSL spelling used in messages: 'device const half*'."""
        if self.kind == "attribute":
            return self.type
        return f"{self.address_space} {'const ' if self.const else ''}{self.type}{'*' if self.pointer else '&'}"


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    params: tuple[Param, ...]
    line: int
    uses_barriers: bool = False  # see the module docstring
    needs_fibers: bool = False  # runs as fibers on msl_emu (see the module docstring); False: the fast path


@dataclasses.dataclass(frozen=True)
class FunctionConstant:
    name: str
    index: int
    type: str  # bool | int | uint | float
    line: int


@dataclasses.dataclass(frozen=True)
class MetalFile:
    path: Path
    kernels: tuple[Kernel, ...]
    constants: tuple[FunctionConstant, ...]
    needs_fibers: bool  # some kernel of the file needs fibers


@dataclasses.dataclass(frozen=True)
class GeneratedUnit:
    """One generated translation unit. Compile `source` with base_flags() + flags (in that order)."""

    metal_file: Path  # the original .metal file
    staged: Path  # its staged copy (out_dir/stage/NAME.metal), included by `source`
    source: Path  # out_dir/NAME_glue.cc
    kernels: tuple[Kernel, ...]
    constants: tuple[FunctionConstant, ...]
    needs_fibers: bool  # some kernel of the file needs fibers (each Kernel says which)
    flags: tuple[str, ...]  # -D... and -I... this unit needs (include dirs in search order)


# ---- repository layout ---------------------------------------------------------------------------------------
def source_root() -> Path:
    """The directory holding csrc/msl_emu, csrc and metal_kernels: $TFMO_SOURCE_ROOT, else the installed package's
    data (tf_metal_ops/_sources), else the source checkout this file is in."""
    env = os.environ.get("TFMO_SOURCE_ROOT")
    candidates = [Path(env)] if env else []
    pkg = Path(__file__).resolve().parent  # tf_metal_ops
    candidates += [pkg / "_sources", pkg.parent]
    for c in candidates:
        if (c / "csrc" / "msl_emu" / "include" / "metal_stdlib").is_file() and (c / "csrc" / "emulated_gpu").is_dir():
            return c
    raise GlueError(f"no source tree with csrc/msl_emu and csrc/emulated_gpu found (tried {', '.join(map(str, candidates))}; "
                    "set TFMO_SOURCE_ROOT)")


def include_dirs(stage_dir: Path | None = None, root: Path | None = None) -> list[Path]:
    """Include path of generated units and kernel_launch.cc, in search order (stage dir first when given)."""
    root = root or source_root()
    dirs = [stage_dir] if stage_dir is not None else []
    dirs += [root / "csrc" / "msl_emu" / "include", root / "csrc" / "msl_emu", root / "csrc" / "shared",
             root / "metal_kernels", root / "csrc" / "emulated_gpu"]
    return dirs


def base_flags() -> list[str]:
    """Flags every glue unit and kernel_launch.cc are compiled with (clang++-16); add -O2 or sanitizers as wanted."""
    return ["-std=c++20", "-fPIC", "-Wall", "-Wextra", "-Wno-unknown-attributes"]


def launch_source(root: Path | None = None) -> Path:
    """csrc/emulated_gpu/kernel_launch.cc (compile with base_flags() + -I for each include_dirs())."""
    return (root or source_root()) / "csrc" / "emulated_gpu" / "kernel_launch.cc"


# ---- parsing --------------------------------------------------------------------------------------------------
def _strip_comments(text: str, blank_strings: bool = True) -> str:
    """Comments (and, if blank_strings, string/char literal contents) -> spaces, keeping every newline, so offsets
    map to lines."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            body = text[i + 1:j - 1]
            out.append(c + (re.sub(r"[^\n]", " ", body) if blank_strings else body) + (text[j - 1] if j - 1 > i else ""))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


_KERNEL = re.compile(r"\bkernel\s+void\s+([A-Za-z_]\w*)\s*\(")
_ATTR = re.compile(r"\[\[\s*([A-Za-z_]\w*)\s*(?:\(\s*([^()\]]*?)\s*\))?\s*\]\]")
_FUNCTION_CONSTANT = re.compile(
    r"\bconstant\s+([A-Za-z_]\w*)\s+([A-Za-z_]\w*)\s*\[\[\s*function_constant\s*\(\s*(\d+)\s*\)\s*\]\]\s*;")
# A call that needs the fibers of msl_emu's runtime: a barrier or a SIMD-group function.
_BARRIER = re.compile(r"\bthreadgroup_barrier\s*\(")
_FIBER_CALL = re.compile(r"\b(?:threadgroup_barrier|simdgroup_barrier|simd_\w+|quad_\w+)\s*(?:<[^<>;{}()]*>\s*)?\(")
_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
_DECL = re.compile(
    r"^(?P<quals>(?:(?:device|constant|threadgroup|thread|const|volatile)\s+)*)"
    r"(?P<type>(?:metal::)?[A-Za-z_]\w*)"
    r"(?P<post>(?:\s+(?:const|volatile)\b)*)\s*(?P<ref>[*&]?)\s*"
    r"(?P<cv2>(?:const\s+)?)(?P<name>[A-Za-z_]\w*)$")


def _split_params(s: str, base: int) -> list[tuple[str, int]]:
    """Top-level comma split of a parameter list; each item with its offset into the file."""
    items, depth, start = [], 0, 0
    for i, c in enumerate(s):
        if c in "([<{":
            depth += 1
        elif c in ")]>}":
            depth -= 1
        elif c == "," and depth == 0:
            items.append((s[start:i], base + start))
            start = i + 1
    items.append((s[start:], base + start))
    return [(t, off + (len(t) - len(t.lstrip()))) for t, off in items if t.strip()]


def _parse_param(text: str, where: str, kernel: str, line: int) -> Param:
    def fail(why: str) -> GlueError:
        return GlueError(f"{where}:{line}: kernel {kernel}: cannot classify parameter `{' '.join(text.split())}`: {why}")

    attrs = _ATTR.findall(text)
    decl = " ".join(_ATTR.sub(" ", text).split())
    if len(attrs) != 1:
        raise fail("expected exactly one attribute ([[buffer(n)]], [[threadgroup(n)]] or a thread-position attribute)")
    attr, arg = attrs[0]
    m = _DECL.match(decl)
    if not m:
        raise fail("not of the form `[address space] [const] Type [*|&] name`")
    quals = m["quals"].split()
    spaces = [q for q in quals if q in ADDRESS_SPACES or q == "thread"]
    const = "const" in quals or "const" in m["post"].split()
    pointer, ref = m["ref"] == "*", m["ref"] == "&"
    typ = m["type"].removeprefix("metal::")
    name = m["name"]
    if len(spaces) > 1:
        raise fail("more than one address space")
    space = spaces[0] if spaces else None
    if attr in ("buffer", "threadgroup"):
        if not re.fullmatch(r"\d+", arg or ""):
            raise fail(f"[[{attr}(n)]] needs a literal index")
        index = int(arg)
        if index > 30:
            raise fail(f"[[{attr}({index})]]: indices are 0..30")
        if not (pointer or ref):
            raise fail(f"a [[{attr}(n)]] parameter must be a pointer or a reference")
        if attr == "buffer" and space not in ("device", "constant"):
            raise fail("a [[buffer(n)]] parameter needs the device or constant address space")
        if attr == "threadgroup" and space != "threadgroup":
            raise fail("a [[threadgroup(n)]] parameter needs the threadgroup address space")
        if m["cv2"]:
            raise fail("a const pointer (`T* const p`) is not supported; drop the second const")
        return Param(name, attr, index, space, const, pointer, typ, None, line)
    if attr in THREAD_ATTRIBUTES:
        if arg:
            raise fail(f"[[{attr}]] takes no argument")
        if space is not None or pointer or ref:
            raise fail(f"[[{attr}]] is passed by value, without address space")
        allowed = _VECTOR_ATTR_TYPES if THREAD_ATTRIBUTES[attr] else _SCALAR_ATTR_TYPES
        if typ not in allowed:
            raise fail(f"[[{attr}]] must have type {', '.join(allowed)}")
        return Param(name, "attribute", 0, None, const, False, typ, attr, line)
    raise fail(f"unsupported attribute [[{attr}{'(' + arg + ')' if arg else ''}]]")


def _file_calls(path: Path, search: list[Path], seen: set[Path], pattern: re.Pattern) -> bool:
    """Whether `path` or a header it includes with `#include "..."` (recursively) matches `pattern`."""
    path = path.resolve()
    if path in seen:
        return False
    seen.add(path)
    text = _strip_comments(path.read_text(), blank_strings=False)
    if pattern.search(_strip_comments(text)):
        return True
    for inc in _INCLUDE.findall(text):
        for d in [path.parent, *search]:
            cand = d / inc
            if cand.is_file():
                if _file_calls(cand, search, seen, pattern):
                    return True
                break
    return False


def _headers_barrier(path: Path, raw: str, search: list[Path]) -> bool:
    """Whether a header that `path` includes with `#include "..."` (recursively) calls threadgroup_barrier."""
    seen = {path}
    for inc in _INCLUDE.findall(_strip_comments(raw, blank_strings=False)):
        for d in [path.parent, *search]:
            if (d / inc).is_file():
                if _file_calls(d / inc, search, seen, _BARRIER):
                    return True
                break
    return False


def parse_metal(path: str | Path, search: Iterable[Path] | None = None, *, text: str | None = None) -> MetalFile:
    """Kernels, function constants and fiber use of one .metal file (see the module docstring); `text`: its
    contents, when it is not read from `path` (which then only names it in messages)."""
    path = Path(path).resolve()
    from_file = text is None
    raw = path.read_text() if from_file else text
    text = _strip_comments(raw)
    kernels, names, bodies = [], set(), []
    for m in _KERNEL.finditer(text):
        name, line = m.group(1), _line_of(text, m.start())
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        if depth:
            raise GlueError(f"{path}:{line}: kernel {name}: unbalanced parentheses in the parameter list")
        params, slots = [], {}
        for ptext, off in _split_params(text[m.end():i - 1], m.end()):
            p = _parse_param(ptext, str(path), name, _line_of(text, off))
            key = (p.kind, p.index) if p.kind != "attribute" else None
            if key is not None and key in slots:
                raise GlueError(f"{path}:{p.line}: kernel {name}: parameters '{slots[key]}' and '{p.name}' both use "
                                f"[[{p.kind}({p.index})]]")
            if key is not None:
                slots[key] = p.name
            params.append(p)
        if name in names:
            raise GlueError(f"{path}:{line}: kernel {name} is defined twice")
        names.add(name)
        body = _body_span(text, i)
        if body is None:
            raise GlueError(f"{path}:{line}: kernel {name}: no balanced {{ ... }} body after the parameter list")
        bodies.append(body)
        kernels.append(Kernel(name, tuple(params), line, bool(_BARRIER.search(text, *body))))

    constants, by_index = [], {}
    for m in _FUNCTION_CONSTANT.finditer(text):
        typ, name, index, line = m.group(1), m.group(2), int(m.group(3)), _line_of(text, m.start())
        if typ not in CONSTANT_TYPES:
            raise GlueError(f"{path}:{line}: function constant {name}: type {typ} is not supported "
                            f"(use {', '.join(CONSTANT_TYPES)})")
        if index in by_index:
            raise GlueError(f"{path}:{line}: function constants {by_index[index]} and {name} share index {index}")
        by_index[index] = name
        constants.append(FunctionConstant(name, index, typ, line))
    spans = [m.span() for m in _FUNCTION_CONSTANT.finditer(text)]
    for m in re.finditer(r"\[\[\s*function_constant\b", text):
        if not any(a <= m.start() < b for a, b in spans):
            raise GlueError(f"{path}:{_line_of(text, m.start())}: function constant not of the supported form "
                            "`constant T name [[function_constant(n)]];` at file scope (T = bool, int, uint, float)")
    search_dirs = list(search) if search is not None else []
    outside = "".join(text[a:b] for a, b in zip([0] + [e for _, e in bodies], [s for s, _ in bodies] + [len(text)]))
    if _BARRIER.search(outside) or (from_file and _headers_barrier(path, raw, search_dirs)):
        kernels = [dataclasses.replace(k, uses_barriers=True) for k in kernels]  # a helper or a header has one
    sources, complete = _translation_unit(path, raw, search_dirs, from_file)
    fibers = _kernels_needing_fibers([k.name for k in kernels], sources, complete)
    kernels = [dataclasses.replace(k, needs_fibers=k.name in fibers) for k in kernels]
    return MetalFile(path, tuple(kernels), tuple(sorted(constants, key=lambda c: c.index)),
                     any(k.needs_fibers for k in kernels))


# ---- which kernels need fibers ---------------------------------------------------------------------------------
# A name that needs fibers when a macro's replacement text holds it (the call's parentheses may come from the
# place the macro is used).
_FIBER_NAME = re.compile(r"\b(?:threadgroup_barrier|simdgroup_barrier|simd_\w+|quad_\w+)\b")
# Text that a name pasted together with ## needs to contain to become one of those names.
_PASTE_FRAGMENT = re.compile(r"simd|quad|barrier")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_DIRECTIVE = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)
_DEFINE = re.compile(r"[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)(\([^)]*\))?")
_ATTRIBUTE_SPAN = re.compile(r"\[\[.*?\]\]", re.S)
# The end of a function definition's head: `)`, then qualifiers (MSL member functions may name an address space),
# and a trailing return type.
_FUNCTION_HEAD_END = re.compile(r"\)\s*(?:(?:const|volatile|noexcept|override|final|mutable|thread|device|constant|"
                                r"threadgroup)\b\s*)*(?:->[^{;]*)?$")
_NOT_A_NAME = {"decltype", "alignas", "sizeof", "alignof", "if", "for", "while", "switch", "return", "static_assert"}
_STANDARD_HEADER = re.compile(r"metal_\w+")  # #include "metal_stdlib": MSL's own headers are not scanned


class _Undecided(Exception):
    """A source structure the fiber analysis does not follow: every kernel of the file then needs fibers."""


def _translation_unit(path: Path, raw: str, search: list[Path], from_file: bool) -> tuple[list[str], bool]:
    """(the file's text and that of every header it includes with `#include "..."`, recursively, each with comments
    and string contents blanked; whether every such header was found: next to the file (when read from a file),
    else on `search`). MSL's own headers (`metal_stdlib`, ...) are left out."""
    texts, complete, seen = [], True, set()

    def add(p: Path | None, content: str) -> None:
        nonlocal complete
        texts.append(_strip_comments(content))
        here = [p.parent] if p is not None else []
        for inc in _INCLUDE.findall(_strip_comments(content, blank_strings=False)):
            if _STANDARD_HEADER.fullmatch(inc):
                continue
            found = next((d / inc for d in [*here, *search] if (d / inc).is_file()), None)
            if found is None:
                complete = False
            elif found.resolve() not in seen:
                seen.add(found.resolve())
                add(found.resolve(), found.read_text())

    seen.add(path)
    add(path if from_file else None, raw)
    return texts, complete


def _split_directives(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(text with every preprocessor line blanked, [(macro name, replacement text)] of its #defines). Conditionals
    are not evaluated: the code of every branch stays."""
    macros = []

    def blank(m: re.Match) -> str:
        d = _DEFINE.match(m.group(0))
        if d:
            macros.append((d.group(1), m.group(0)[d.end():].replace("\\\n", " ")))
        return re.sub(r"[^\n]", " ", m.group(0))

    return _DIRECTIVE.sub(blank, text), macros


def _matching_brace(code: str, i: int, end: int) -> int:
    depth = 0
    for j in range(i, end):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    raise _Undecided("unbalanced braces")


def _skip_template_heads(head: str) -> str:
    """`head` without leading `template <...>` clauses."""
    while True:
        m = re.match(r"\s*template\s*<", head)
        if not m:
            return head
        depth, j = 1, m.end()
        while j < len(head) and depth:
            depth += {"<": 1, ">": -1}.get(head[j], 0)
            j += 1
        if depth:
            raise _Undecided("unbalanced template parameter list")
        head = head[j:]


def _function_names(head: str) -> tuple[str, ...]:
    """The names a function definition's head may declare: every name followed by `(` outside parentheses (the
    function's, and a macro's in front of it, `ALIGN(16) float f(...)`, or a constructor's member initialisers),
    "operator" for an operator; empty when there is none (a lambda)."""
    names, depth = [], 0
    for j, c in enumerate(head):
        if c == "(" and depth == 0:
            before = head[:j].rstrip()
            if re.search(r"\boperator\s*(?:\(\s*\)\s*)?$", before) or re.search(r"\boperator\b\s*\S+$", before):
                names.append("operator")
            m = re.search(r"(~?[A-Za-z_]\w*)$", before)
            if m is not None and m.group(1) not in _NOT_A_NAME:
                names.append(m.group(1).lstrip("~"))
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
    return tuple(dict.fromkeys(names))


def _scope_items(code: str, begin: int, end: int, out: list[tuple[str, tuple[str, ...], str]]) -> None:
    """The items of one scope code[begin:end] into `out`, as (kind, names, text): "function" (a definition, head and
    body; names: _function_names), "type" (a struct/class/union definition, names: its name or none; its member
    functions follow as items of their own, kind "member"), or "declaration" (anything else up to its `;`:
    variables, prototypes, aliases, enums; no names). Namespaces are opened."""
    start, depth, i = begin, 0, begin
    while i < end:
        c = code[i]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
            if depth < 0:
                raise _Undecided("unbalanced parentheses")
        elif c == "}" and depth == 0:
            raise _Undecided("unbalanced braces")
        elif c == ";" and depth == 0:
            if code[start:i].strip():
                out.append(("declaration", (), code[start:i + 1]))
            start = i + 1
        elif c == "{" and depth == 0:
            close = _matching_brace(code, i, end)
            head = _skip_template_heads(_ATTRIBUTE_SPAN.sub(" ", code[start:i]))
            struct = re.search(r"\b(?:struct|class|union)\b\s*([A-Za-z_]\w*)?", head)
            if re.search(r"\bnamespace\b", head):
                _scope_items(code, i + 1, close, out)
                start = close + 1
            elif re.search(r"=\s*$", head) or re.search(r"\benum\b", head):
                pass  # an initialiser or an enumeration: the declaration goes on to its `;`
            elif _FUNCTION_HEAD_END.search(head.rstrip()):
                out.append(("function", _function_names(head), code[start:close + 1]))
                start = close + 1
            elif struct:
                out.append(("type", (struct.group(1),) if struct.group(1) else (), code[start:close + 1]))
                members: list[tuple[str, tuple[str, ...], str]] = []
                _scope_items(code, i + 1, close, members)
                out += [("member", name, text) for kind, name, text in members if kind in ("function", "member")]
                start = close + 1  # declarators up to the `;` follow as a declaration
            i = close
        i += 1
    if depth:
        raise _Undecided("unbalanced parentheses")
    if code[start:end].strip():
        out.append(("declaration", (), code[start:end]))


def _is_prototype(text: str) -> bool:
    """A function declaration without a body, or an explicit template instantiation (`template [[host_name("k_f")]]
    kernel decltype(k<float>) k<float>;`, as MLX-style sources write): it runs nothing of its own."""
    head = _ATTRIBUTE_SPAN.sub(" ", text.strip().removesuffix(";"))
    if re.match(r"\s*template\b(?!\s*<)", head):
        return True
    return "=" not in head and bool(_FUNCTION_HEAD_END.search(head.rstrip()))


def _kernels_needing_fibers(kernels: list[str], sources: list[str], complete: bool) -> set[str]:
    """The kernels of `sources` (a file and its headers, comments blanked: _translation_unit) that reach
    threadgroup_barrier or a SIMD-group function.

    The analysis works on names, so it errs only towards fibers. Each function definition, struct/class/union (with
    its member functions, constructors and operators) and macro is a node under its name (definitions sharing a name,
    overloads or branches of an #if, are one node). A node needs fibers when its text calls one of those functions
    (a macro: names one), or names a node that needs fibers; a name pasted with ## counts as such a call where the
    macro that pastes or the text that uses it contains "simd", "quad" or "barrier". Templates are followed by
    name: `f<T>(x)` names f, and a functor or type argument is named where the template is used. Every kernel needs
    fibers when the analysis cannot tell: a header that is not found, braces or parentheses that do not balance
    (an #if whose branches open a block differently), or a barrier or SIMD-group call reached from code that has no
    name to follow (a free operator, a lambda or initialiser at file scope, a macro that needs fibers used outside
    every body, which may define functions). Blind spot, caught at run time by the
    fast path's fatal error: a name pasted from pieces that split those words (`threadgroup_bar ## rier`).
    """
    everything = "".join(sources)
    if complete and not _FIBER_NAME.search(everything) and not ("##" in everything and
                                                               _PASTE_FRAGMENT.search(everything)):
        return set()  # nothing to reach
    if not complete:
        return set(kernels)
    texts: dict[str, list[str]] = {}
    unnamed: list[str] = []  # reached from code with no name to follow
    heads: list[str] = []  # what precedes the body of each function and type definition
    macros: dict[str, str] = {}
    codes = []
    for source in sources:
        code, defines = _split_directives(source)
        codes.append(code)
        for name, replacement in defines:
            macros[name] = macros.get(name, "") + " " + replacement
    try:
        for code in codes:
            items: list[tuple[str, tuple[str, ...], str]] = []
            _scope_items(code, 0, len(code), items)
            for kind, names, text in items:
                names = tuple(n for n in names if n not in macros)  # `ALIGN(16) float f(...)` defines f
                if kind == "declaration" and _is_prototype(text):
                    continue
                if kind == "member" and (not names or "operator" in names):
                    continue  # part of its type's node, which every use of the type names
                if kind in ("function", "type"):
                    heads.append(text.split("{", 1)[0])
                if not names or "operator" in names:
                    unnamed.append(text)
                for name in names:
                    texts.setdefault(name, []).append(text)
    except _Undecided:
        return set(kernels)
    pasting = {name for name, r in macros.items() if "##" in r}
    nodes: dict[str, tuple[bool, set[str]]] = {}  # name -> (calls a fiber function itself, names it refers to)

    def node(text: str, is_macro: bool) -> tuple[bool, set[str]]:
        refs = set(_IDENT.findall(text))
        direct = bool((_FIBER_NAME if is_macro else _FIBER_CALL).search(text))
        direct = direct or bool(refs & pasting and _PASTE_FRAGMENT.search(text))
        return direct, refs

    for name, ts in texts.items():
        nodes[name] = node(" ".join(ts), False)
    for name, r in macros.items():
        d, refs = node(r, True)
        old = nodes.get(name, (False, set()))
        nodes[name] = (old[0] or d, old[1] | refs)
    users: dict[str, set[str]] = {}
    for name, (_, refs) in nodes.items():
        for r in refs - {name}:
            users.setdefault(r, set()).add(name)
    needing = {name for name, (d, _) in nodes.items() if d}
    todo = list(needing)
    while todo:
        for u in users.get(todo.pop(), ()):
            if u not in needing:
                needing.add(u)
                todo.append(u)
    for text in unnamed:
        d, refs = node(text, False)
        if d or refs & needing:
            return set(kernels)
    # A macro that needs fibers used outside a body may define functions under names it builds (`DEF(total)`).
    if any(set(_IDENT.findall(h)) & needing & macros.keys() for h in heads):
        return set(kernels)
    return {k for k in kernels if k in needing or k not in texts}


def _body_span(text: str, i: int) -> tuple[int, int] | None:
    """(start, end) of the `{ ... }` that follows offset i (after a parameter list), braces balanced."""
    m = re.compile(r"(?:\s|\[\[[^\]]*\]\])*\{").match(text, i)
    if not m:
        return None
    depth, j = 1, m.end()
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return (m.end() - 1, j) if depth == 0 else None


def replace_function_constants(text: str, new) -> str:
    """`text` (a .metal file) with each function-constant declaration `constant T name [[function_constant(n)]];`
    replaced by new(FunctionConstant): a string of the same line count (comments are not searched). For targets that
    declare function constants in their own way (dev/gpu_proxy.py)."""
    stripped, out, last = _strip_comments(text), [], 0
    for m in _FUNCTION_CONSTANT.finditer(stripped):
        c = FunctionConstant(m.group(2), int(m.group(3)), m.group(1), _line_of(stripped, m.start()))
        out += [text[last:m.start()], new(c) + "\n" * text.count("\n", m.start(), m.end())]
        last = m.end()
    return "".join(out) + text[last:]


# ---- code generation ------------------------------------------------------------------------------------------
def _cstr(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


_SPACE_ENUM = {None: "kNone", "device": "kDevice", "constant": "kConstant", "threadgroup": "kThreadgroup"}
_KIND_ENUM = {"buffer": "kBuffer", "threadgroup": "kThreadgroup", "attribute": "kAttribute"}


def _unit_source(mf: MetalFile, staged_name: str) -> str:
    T = "::tfmo::emu::table"
    ident = re.sub(r"\W", "_", mf.path.stem)
    out = [
        f"// Generated by tf_metal_ops/msl_emu.py from {mf.path}. Do not edit.",
        "// Registers the file's kernels in the emulated kernel table (csrc/emulated_gpu/kernel_table.h).",
        '#include "kernel_table.h"  // first: standard headers before <metal_stdlib>\'s keyword macros',
        "",
        f'#include "{staged_name}"',
        "",
        f"namespace tfmo_glue_{ident} {{",
        "// No MSL keywords below this point: device/constant/thread/threadgroup/kernel are macros now.",
    ]
    # function constants
    out.append(f"const {T}::ConstantDesc kConstants[] = {{")
    for c in mf.constants:
        out.append(f"    {{{c.index}u, '{CONSTANT_TYPES[c.type]}', {_cstr(c.name)}}},")
    if not mf.constants:
        out.append("    {0u, 'u', nullptr},  // none (num_constants = 0)")
    out.append("};")
    out.append("void SetConstant(uint32_t index, uint32_t bits) {")
    out.append("  switch (index) {")
    for c in mf.constants:
        if c.type == "bool":
            conv = "bits != 0"
        else:
            conv = f"__builtin_bit_cast({c.type}, bits)"
        out.append(f"    case {c.index}u: ::{c.name} = {conv}; break;")
    out.append("    default: (void)bits; break;")
    out.append("  }")
    out.append("}")
    out.append("std::mutex g_mutex;")
    out.append(f"const {T}::FileDesc kFile = {{{_cstr(str(mf.path))}, kConstants, {len(mf.constants)}u, "
               f"&g_mutex, &SetConstant}};")
    out.append("")
    for k in mf.kernels:
        fn = f"decltype(&::{k.name})"
        out.append(f"// {k.name} ({mf.path.name}:{k.line})")
        out.append(f"const {T}::ParamDesc kParams_{k.name}[] = {{")
        for i, p in enumerate(k.params):
            pointee = f"{T}::PointeeT<{fn}, {i}>"
            if p.kind == "attribute":
                scalar, size, align = "nullptr", f"sizeof({T}::ParamT<{fn}, {i}>)", f"alignof({T}::ParamT<{fn}, {i}>)"
            else:
                scalar, size, align = f"{T}::ScalarName<{pointee}>()", f"sizeof({pointee})", f"alignof({pointee})"
            out.append(f"    {{{_cstr(p.name)}, {T}::ParamKind::{_KIND_ENUM[p.kind]}, {p.index}u, "
                       f"{T}::AddressSpace::{_SPACE_ENUM[p.address_space]}, {'true' if p.const else 'false'}, "
                       f"{'true' if p.pointer else 'false'}, {_cstr(p.type)}, {scalar}, {size}, {align}, "
                       f"{_cstr(p.decl)}, {_cstr(p.attribute) if p.attribute else 'nullptr'}}},")
        if not k.params:
            out.append("    {}")
        out.append("};")
        out.append(f"void Thunk_{k.name}(void* const* slots, const ::msl_emu::ThreadCtx& t) {{")
        args = []
        for i, p in enumerate(k.params):
            pt = f"{T}::ParamT<{fn}, {i}>"
            if p.kind == "buffer":
                args.append(f"{T}::SlotArg<{pt}>(slots[{p.index}])")
            elif p.kind == "threadgroup":
                args.append(f"{T}::ThreadgroupArg<{pt}>({p.index}u)")
            else:
                args.append(f"{T}::AttrArg<{pt}>(t.{p.attribute})")
        if not any(p.kind == "buffer" for p in k.params):
            out.append("  (void)slots;")
        if not any(p.kind == "attribute" for p in k.params):
            out.append("  (void)t;")
        out.append(f"  ::{k.name}(" + ",\n      ".join(args) + ");")
        out.append("}")
        out.append(f"const {T}::KernelDesc kKernel_{k.name} = {{{_cstr(k.name)}, &kFile, kParams_{k.name}, "
                   f"{len(k.params)}u, &Thunk_{k.name}, {'true' if k.needs_fibers else 'false'}}};")
        out.append("")
    out.append("struct Registrar {")
    out.append("  Registrar() {")
    for k in mf.kernels:
        out.append(f"    {T}::Register(&kKernel_{k.name});")
    out.append("  }")
    out.append("} g_registrar;")
    out.append(f"}}  // namespace tfmo_glue_{ident}")
    return "\n".join(out) + "\n"


def _write_if_changed(path: Path, text: str) -> None:
    """Leaves an identical file untouched (keeps mtimes stable for build caches)."""
    if path.is_file() and path.read_text() == text:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def stage(metal_files: Iterable[str | Path], stage_dir: str | Path) -> list[Path]:
    """Copies each .metal file into stage_dir with `#line` back to the original and threadgroup pointers rewritten."""
    stage_dir = Path(stage_dir)
    stage_dir.mkdir(parents=True, exist_ok=True)
    staged = []
    for src in metal_files:
        src = Path(src).resolve()
        dst = stage_dir / src.name
        _write_if_changed(dst, f'#line 1 {_cstr(str(src))}\n{rewrite_threadgroup_pointers(src.read_text())}')
        staged.append(dst)
    return staged


def generate(metal_files: Iterable[str | Path], out_dir: str | Path, *, root: Path | None = None) -> list[GeneratedUnit]:
    """Parses each .metal file and writes out_dir/NAME_glue.cc (+ out_dir/stage/NAME.metal); returns the units.

    Compile each unit with base_flags() + unit.flags and link them with kernel_launch.cc (launch_source()),
    compiled with base_flags() + ['-I' + d for d in include_dirs()]. Raises GlueError for unsupported source.
    """
    root = root or source_root()
    out_dir = Path(out_dir).resolve()
    files = [Path(f).resolve() for f in metal_files]
    if len({f.name for f in files}) != len(files):
        raise GlueError(f"two .metal files share a file name: {', '.join(map(str, files))}")
    stage_dir = out_dir / "stage"
    staged = stage(files, stage_dir)
    units = []
    for src, st in zip(files, staged):
        dirs = [stage_dir, src.parent] + [d for d in include_dirs(None, root) if d != src.parent]
        mf = parse_metal(src, search=dirs[1:])
        flags = [f"-I{d}" for d in dirs]
        if mf.constants:
            flags.insert(0, "-DMSL_EMU_FUNCTION_CONSTANTS")
        cc = out_dir / f"{src.stem}_glue.cc"
        _write_if_changed(cc, _unit_source(mf, st.name))
        units.append(GeneratedUnit(src, st, cc, mf.kernels, mf.constants, mf.needs_fibers, tuple(flags)))
    return units


def content_hash(units: Iterable[GeneratedUnit], extra: Iterable[str | Path] = (), *, root: Path | None = None) -> str:
    """Hash of the generated sources, staged files and every file their build can read (for build caches)."""
    h = hashlib.sha256()
    root = root or source_root()
    files: set[Path] = set()
    for u in units:
        files.update((u.source, u.staged, u.metal_file))
        h.update("\0".join(u.flags).encode())
    for d in (root / "csrc" / "msl_emu", root / "csrc" / "shared", root / "csrc" / "emulated_gpu",
              root / "metal_kernels"):
        files.update(p for p in d.rglob("*") if p.is_file() and not p.name.startswith("."))
    files.add(Path(__file__).resolve())
    files.update(Path(e) for e in extra)
    for f in sorted(files):
        h.update(str(f).encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:24]
