"""Glue between Metal kernel files and the emulated GPU: read the kernel signatures and function constants of a
`.metal` file and generate one C++ translation unit per file that registers every kernel in the
kernel table (csrc/emulated_gpu/kernel_table.h), so that csrc/emulated_gpu/kernel_launch.cc can run it by name.

    units = generate(["metal_kernels/hash_grid.metal"], out_dir)
    for u in units:  # compile each with the base flags plus its own flags, link with kernel_launch.cc
        clang++-16 -x c++ *base_flags() *u.flags -c u.source

Conventions:
  - kernel signatures and function constants come from clang's AST (tf_metal_ops.msl_check.signatures): plain
    `kernel void name(params)` kernels, and kernel templates instantiated by name, `template [[host_name("name")]]
    [[kernel]] decltype(f<A>) f<A>;` (MLX's form), written out or through macros. The file and the headers it
    includes must compile against msl_check's <metal_stdlib>;
  - every .metal file is staged (copied with `#line 1 "<original>"`, `threadgroup` in pointer/reference types
    rewritten to MSL_EMU_TGP and an instantiation's attribute lists blanked, see rewrite_threadgroup_pointers)
    into out_dir/stage/, which comes first on the include path, so a .metal file that includes another one gets
    the staged copy;
  - a kernel "needs fibers" when it reaches threadgroup_barrier or a SIMD-group function (simd_*, quad_*,
    simdgroup_barrier, and the SIMD-group matrices: simdgroup_matrix and its typedefs, simdgroup_load/store/
    multiply(_accumulate), make_filled_simdgroup_matrix, named anywhere): in its own body, or through the functions, types and macros it names, transitively, in
    the file and the headers it includes with `#include "..."` (found next to it or on the include path); see
    _kernels_needing_fibers for what the analysis follows and where it gives up (then every kernel of the file
    needs fibers). Other kernels run on msl_emu's fiber-free fast path, where a barrier or a SIMD-group call is a
    fatal error (so a wrong detection cannot pass silently). MetalFile.needs_fibers: some kernel of the file does;
  - a kernel "uses barriers" when its own body calls threadgroup_barrier, or when the file calls it outside every
    kernel body (in a helper or an included header: any kernel may reach it); a kernel cannot call another kernel,
    so that is conservative. Targets that launch whole threadgroups only where a barrier needs them use this
    (dev/gpu_proxy/build.py);
  - function constants (`constant T name [[function_constant(n)]];`, T = bool/int/uint/float, file scope) need
    -DMSL_EMU_FUNCTION_CONSTANTS, which is in the unit's flags only for files that declare them;
  - a parameter that cannot be classified, or a source whose signatures clang cannot read, is a GlueError naming
    file:line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from tf_metal_ops.msl_check.signatures import FunctionConstant, Kernel

# The signature types (msl_check.signatures: Kernel, Param, FunctionConstant, ...), re-exported on first use: msl_emu
# loads msl_check only when it reads a file, so that loading msl_emu (the emulated GPU does, where it is asked for)
# stays cheap.
_SIGNATURE_NAMES = ("ADDRESS_SPACES", "CONSTANT_TYPES", "THREAD_ATTRIBUTES", "FunctionConstant", "Kernel", "Param",
                    "SignatureError")


def __getattr__(name: str):
    if name in _SIGNATURE_NAMES:
        from tf_metal_ops.msl_check import signatures

        return getattr(signatures, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# `threadgroup` followed by a type and then * or &: a pointer/reference to threadgroup memory.
_TG_POINTER = re.compile(
    r"\bthreadgroup\b(?=(?:\s+(?:const|volatile)\b)*\s+[A-Za-z_][\w:]*(?:\s*<[^<>;{}()]*>)?"
    r"(?:\s+(?:const|volatile)\b)*\s*[*&])"
)
# The [[threadgroup(n)]] attribute: the macro would turn it into [[static thread_local(n)]].
_TG_ATTRIBUTE = re.compile(r"\[\[(\s*)threadgroup(\s*\()")
# The attribute lists of an explicit instantiation, `template [[host_name("k_float")]] [[kernel]] ...`: C++ allows
# none there (MSL does).
_INSTANTIATION_ATTRIBUTES = re.compile(r"(?<=\btemplate)(\s*\[\[.*?\]\])+(?=\s*[A-Za-z_])", re.S)


def rewrite_threadgroup_pointers(text: str) -> str:
    """`threadgroup T* p` / `threadgroup T& r` -> `MSL_EMU_TGP T* p` (storage declarations are left alone),
    the attribute `[[threadgroup(n)]]` -> `[[msl_emu_threadgroup(n)]]` (an unknown, ignored attribute), and the
    attribute lists of an explicit instantiation (`template [[host_name("k_f")]] [[kernel]] ...`) blanked.

    msl_emu's <metal_stdlib> expands `threadgroup` to `static thread_local`, which is right for kernel-scope
    threadgroup variables and wrong (illegal or shared) for pointers/references to threadgroup memory and inside
    the attribute. Line structure is kept, so #line mappings stay exact.
    """
    text = _INSTANTIATION_ATTRIBUTES.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    return _TG_ATTRIBUTE.sub(r"[[\1msl_emu_threadgroup\2", _TG_POINTER.sub("MSL_EMU_TGP", text))


class GlueError(ValueError):
    """A .metal file the glue cannot handle; the message starts with file:line."""


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


_FUNCTION_CONSTANT = re.compile(
    r"\bconstant\s+([A-Za-z_]\w*)\s+([A-Za-z_]\w*)\s*\[\[\s*function_constant\s*\(\s*(\d+)\s*\)\s*\]\]\s*;")
# A call that needs the fibers of msl_emu's runtime: a barrier or a SIMD-group function.
_BARRIER = re.compile(r"\bthreadgroup_barrier\s*\(")
# SIMD-group matrices: every use of their types or functions counts (their constructors are SIMD-group functions).
_SIMDGROUP_MATRIX = (r"simdgroup_(?:matrix|load|store|multiply|multiply_accumulate|float8x8|half8x8|bfloat8x8)\b|"
                     r"make_filled_simdgroup_matrix\b")
_FIBER_CALL = re.compile(r"\b(?:(?:threadgroup_barrier|simdgroup_barrier|simd_\w+|quad_\w+)\s*(?:<[^<>;{}()]*>\s*)?\(|"
                         + _SIMDGROUP_MATRIX + ")")
_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


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
    contents, when it is not read from `path` (which then only names it in messages). Signatures come from clang's
    AST (tf_metal_ops.msl_check.signatures): the file and the headers it includes must compile."""
    from tf_metal_ops.msl_check.signatures import SignatureError, read_source

    path = Path(path).resolve()
    from_file = text is None
    raw = path.read_text() if from_file else text
    search_dirs = list(search) if search is not None else []
    try:
        sigs = read_source(raw, filename=str(path), include_dirs=[str(d) for d in search_dirs])
    except SignatureError as e:
        raise GlueError(str(e)) from None
    text = _strip_comments(raw)
    spans = {name: (a, b) for name, a, b in sigs.bodies}
    kernels = [dataclasses.replace(k, uses_barriers=k.function in spans and bool(_BARRIER.search(text, *spans[k.function])))
               for k in sigs.kernels]
    bodies = sorted(spans.values())
    outside = "".join(text[a:b] for a, b in zip([0] + [e for _, e in bodies], [s for s, _ in bodies] + [len(text)]))
    if _BARRIER.search(outside) or (from_file and _headers_barrier(path, raw, search_dirs)):
        kernels = [dataclasses.replace(k, uses_barriers=True) for k in kernels]  # a helper or a header has one
    sources, complete = _translation_unit(path, raw, search_dirs, from_file)
    fibers = _kernels_needing_fibers(sorted({k.function for k in kernels}), sources, complete)
    kernels = [dataclasses.replace(k, needs_fibers=k.function in fibers) for k in kernels]
    return MetalFile(path, tuple(kernels), sigs.constants, any(k.needs_fibers for k in kernels))


# ---- which kernels need fibers ---------------------------------------------------------------------------------
# A name that needs fibers when a macro's replacement text holds it (the call's parentheses may come from the
# place the macro is used).
_FIBER_NAME = re.compile(r"\b(?:threadgroup_barrier|simdgroup_barrier|simd_\w+|quad_\w+)\b|\b(?:" + _SIMDGROUP_MATRIX + ")")
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
    threadgroup_barrier or a SIMD-group function (a SIMD-group matrix type or function named anywhere counts as a call:
    _SIMDGROUP_MATRIX).

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


def replace_function_constants(text: str, new) -> str:
    """`text` (a .metal file) with each function-constant declaration `constant T name [[function_constant(n)]];`
    replaced by new(FunctionConstant): a string of the same line count (comments are not searched). For targets that
    declare function constants in their own way (dev/gpu_proxy/build.py)."""
    stripped, out, last = _strip_comments(text), [], 0
    for m in _FUNCTION_CONSTANT.finditer(stripped):
        c = _signatures().FunctionConstant(m.group(2), int(m.group(3)), m.group(1), _line_of(stripped, m.start()))
        out += [text[last:m.start()], new(c) + "\n" * text.count("\n", m.start(), m.end())]
        last = m.end()
    return "".join(out) + text[last:]


# ---- code generation ------------------------------------------------------------------------------------------
def _cstr(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


_SPACE_ENUM = {None: "kNone", "device": "kDevice", "constant": "kConstant", "threadgroup": "kThreadgroup"}
_KIND_ENUM = {"buffer": "kBuffer", "threadgroup": "kThreadgroup", "attribute": "kAttribute"}


def _signatures():
    from tf_metal_ops.msl_check import signatures

    return signatures


def _ident(name: str) -> str:
    """A C++ identifier for a kernel's generated names (a host_name may hold any character)."""
    return re.sub(r"\W", "_", name) + ("_" + hashlib.sha256(name.encode()).hexdigest()[:8] if re.search(r"\W", name) else "")


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
        out.append(f"    {{{c.index}u, '{_signatures().CONSTANT_TYPES[c.type]}', {_cstr(c.name)}}},")
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
        ref = k.call if k.call.startswith("::") else "::" + k.call
        fn = f"decltype(&{ref})"
        kid = _ident(k.name)
        out.append(f"// {k.name} ({mf.path.name}:{k.line}): {k.call}")
        out.append(f"const {T}::ParamDesc kParams_{kid}[] = {{")
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
        out.append(f"void Thunk_{kid}(void* const* slots, const ::msl_emu::ThreadCtx& t) {{")
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
        out.append(f"  {ref}(" + ",\n      ".join(args) + ");")
        out.append("}")
        out.append(f"const {T}::KernelDesc kKernel_{kid} = {{{_cstr(k.name)}, &kFile, kParams_{kid}, "
                   f"{len(k.params)}u, &Thunk_{kid}, {'true' if k.needs_fibers else 'false'}}};")
        out.append("")
    out.append("struct Registrar {")
    out.append("  Registrar() {")
    for k in mf.kernels:
        out.append(f"    {T}::Register(&kKernel_{_ident(k.name)});")
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
