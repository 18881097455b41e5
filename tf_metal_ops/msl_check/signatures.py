"""Kernel signatures and function constants of a Metal source, read from clang's AST: the strict check's own compile
(``api.compile_ast``: the source rewritten without moving an offset, against msl_check's ``<metal_stdlib>``, where
MSL's address spaces are clang address spaces). msl_emu's kernel table, the emulated GPU, the Apple doubles, inline
kernels and the GPU proxy all take their signatures from here.

    sigs = read_source(open("metal_kernels/zero_out.metal").read(), filename="metal_kernels/zero_out.metal")
    [k.name for k in sigs.kernels]    # ['zero_out_float32', ...]

Conventions:
  - an entry point is a function marked ``kernel`` (or ``[[kernel]]``) that is not a template, named by its name; or
    an explicit instantiation of a kernel template, ``template [[host_name("NAME")]] [[kernel]] decltype(f<A>)
    f<A>;`` (MLX's form; ``... void f<A>(params);`` too), written out or through macros, at file scope or in a
    namespace, named NAME and called as ``f<A>`` (``Kernel.call``, spelled from the AST's template arguments). The
    name is read from the AST too: the rewrite leaves ``host_name("NAME")``, which the prelude makes an annotate
    attribute (C++ allows a GNU attribute, and no ``[[...]]`` list, on an explicit instantiation). A kernel template
    without instantiations is no entry point; an instantiation without ``host_name`` is an error (Apple's compiler
    would name it by its mangled name);
  - parameter types come from the AST (template arguments substituted), spelled as MSL spells them (``half``,
    ``uint``, ``float4``, ``atomic_uint``); their MSL attributes (``[[buffer(n)]]``, ``[[threadgroup(n)]]``, a
    thread-position attribute) from the source text right after the parameter's name, where the rewrite read them;
  - a function constant is a program-scope ``constant T name [[function_constant(n)]];``, T = bool, int, uint or
    float;
  - anything that cannot be classified is a SignatureError whose message starts with file:line.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Sequence

from tf_metal_ops.msl_check.api import compile_ast
from tf_metal_ops.msl_check.context import PRELUDE
from tf_metal_ops.msl_check.rules import _bare
from tf_metal_ops.msl_check.type_strings import normalise

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


class SignatureError(ValueError):
    """A source whose kernel signatures cannot be read; the message starts with file:line."""


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "buffer" | "threadgroup" | "attribute"
    index: int  # n of [[buffer(n)]] / [[threadgroup(n)]]; 0 for attributes
    address_space: str | None  # "device" | "constant" | "threadgroup"; None for attributes
    const: bool  # the pointee is const (written `const`; `constant` memory is read-only without it)
    pointer: bool  # T* (else T& for buffer/threadgroup, by value for attributes)
    type: str  # pointee type in MSL's spelling (attributes: the value type)
    attribute: str | None  # attributes: "thread_position_in_grid", ...
    line: int
    # (start, end) offsets in the source of the declaration before its attribute, `device const T* x `, as written
    # (a template's instances share their pattern's); None where clang gives none
    span: tuple[int, int] | None = dataclasses.field(default=None, compare=False)

    @property
    def decl(self) -> str:
        """MSL spelling used in messages: 'device const half*'."""
        if self.kind == "attribute":
            return self.type
        return f"{self.address_space} {'const ' if self.const else ''}{self.type}{'*' if self.pointer else '&'}"


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str  # the entry point's name: the function's, or the instantiation's host_name
    params: tuple[Param, ...]
    line: int  # of the function, or of the instantiation
    call: str = ""  # C++ spelling that names the function: `name`, or `f<A>` for an instantiation
    function: str = ""  # the function (template) it runs: its body is where its calls are
    uses_barriers: bool = False  # see msl_emu's module docstring
    needs_fibers: bool = False  # runs as fibers on msl_emu (see msl_emu's module docstring); False: the fast path

    def __post_init__(self):
        if not self.call:
            object.__setattr__(self, "call", self.name)
        if not self.function:
            object.__setattr__(self, "function", self.name)


@dataclasses.dataclass(frozen=True)
class FunctionConstant:
    name: str
    index: int
    type: str  # bool | int | uint | float
    line: int


@dataclasses.dataclass(frozen=True)
class Signatures:
    kernels: tuple[Kernel, ...]
    constants: tuple[FunctionConstant, ...]
    bodies: tuple[tuple[str, int, int], ...]  # (function, start offset, end offset) of each kernel's body


# Canonical C++ spellings clang gives substituted template arguments -> MSL's names.
_CANONICAL = {
    "_Float16": "half", "unsigned int": "uint", "unsigned short": "ushort", "unsigned char": "uchar",
    "unsigned long": "ulong", "signed char": "char", "__bf16": "bfloat",
}
_VECTOR = re.compile(r"^(.*?)\s*__attribute__\(\(ext_vector_type\((\d)\)\)\)$")
_ATOMIC = re.compile(r"^(?:metal::)?atomic<(.+)>$")


def msl_type(t: str) -> str:
    """A value type from clang (cv-qualifiers, address spaces and `struct` dropped) in MSL's spelling."""
    t = re.sub(r"\b(const|volatile|struct|class|union|device|constant|threadgroup_imageblock|threadgroup|thread)\b",
               " ", t)
    t = re.sub(r"__attribute__\(\(address_space\(\d+\)\)\)|__attribute__\(\(noderef\)\)|__attribute__\(\(\)\)", " ", t)
    t = " ".join(t.split()).removeprefix("metal::")
    m = _VECTOR.match(t)
    if m:
        return msl_type(m.group(1)) + m.group(2)
    m = _ATOMIC.match(t)
    if m:
        return "atomic_" + msl_type(m.group(1))
    return _CANONICAL.get(t, t)


def _offset(loc) -> int | None:
    b = _bare(loc)
    return b.get("offset") if b and b.get("_file") == "<stdin>" else None


class _Reader:
    def __init__(self, ctx, filename: str):
        self.ctx = ctx
        self.text = ctx.text
        self.filename = filename
        prelude = (ctx.source_of(os.path.join(ctx.stub, PRELUDE)) or "").split("\n")
        self.kernel_line = next((k + 1 for k, ln in enumerate(prelude) if ln.startswith("#define kernel ")), None)
        self.host_line = next((k + 1 for k, ln in enumerate(prelude) if ln.startswith("#define host_name(")), None)

    def error(self, line: int, msg: str) -> SignatureError:
        file, line = self.ctx.presumed("<stdin>", line)
        return SignatureError(f"{self.filename if file == '<stdin>' else file}:{line}: {msg}")

    def line_of(self, offset: int) -> int:
        return self.text.count("\n", 0, offset) + 1

    def _annotations(self, fn, macro_line):
        """[(expansion offset in the source, attribute node)] of the prelude macro on `macro_line` on this decl."""
        out = []
        for a in fn.get("inner", []):
            if a.get("kind") != "AnnotateAttr":
                continue
            rng = (a.get("range") or {}).get("begin") or {}
            sp = rng.get("spellingLoc") or {}
            if sp.get("_line") == macro_line and self.ctx.is_stub(sp.get("_file", "")):
                ex = rng.get("expansionLoc") or {}
                if ex.get("_file") == "<stdin>" and ex.get("offset") is not None:
                    out.append((ex["offset"], a))
        return out

    def kernel_annotations(self, fn) -> list[int]:
        """Offsets (in the source) where `kernel` marks this declaration."""
        return [off for off, _ in self._annotations(fn, self.kernel_line)]

    def host_names(self, fn) -> list[tuple[int, str]]:
        """[(offset, name)] of the [[host_name("name")]] attributes on this declaration."""
        out = []
        for off, a in self._annotations(fn, self.host_line):
            lits = []
            stack = list(a.get("inner", []))
            while stack:
                n = stack.pop()
                if n.get("kind") == "StringLiteral":
                    lits.append(n.get("value", ""))
                stack.extend(n.get("inner", []))
            m = re.fullmatch(r'"([^"\\]+)"', lits[0]) if len(lits) == 1 else None
            if m is None:
                raise self.error(self.line_of(off), "[[host_name(...)]] takes the entry point's name as a string "
                                                    "literal")
            out.append((off, m.group(1)))
        return out

    # -- parameters
    def param_attrs(self, p):
        """(the MSL attributes after the parameter's name, the offset of the first one or None)."""
        off = _offset(p.get("loc"))
        if off is None:
            return [], None
        loc = _bare(p.get("loc"))
        pos = off + loc.get("tokLen", 0)
        out, first = [], None
        for a in self.ctx.attrs:
            if a.start >= pos and not self.text[pos:a.start].strip():
                out.extend(a.items)
                first = a.start if first is None else first
                pos = a.end
        return out, first

    def param(self, p, kernel: str) -> Param:
        name = p.get("name", "")
        t = (p.get("type") or {}).get("qualType", "")
        loc = _bare(p.get("loc")) or {}
        line = loc.get("_line", 1) if loc.get("_file") == "<stdin>" else 1
        written = " ".join(normalise(t).split())

        def fail(why: str) -> SignatureError:
            return self.error(line, f"kernel {kernel}: cannot classify parameter `{written} {name}`: {why}")

        attrs, attr_at = self.param_attrs(p)
        begin = _offset(((p.get("range") or {}).get("begin")))
        span = (begin, attr_at) if begin is not None and attr_at is not None else None
        if len(attrs) != 1:
            raise fail("expected exactly one attribute ([[buffer(n)]], [[threadgroup(n)]] or a thread-position "
                       "attribute)")
        attr, arg = attrs[0]
        arg = (arg or "").strip()
        s = normalise(t)
        k = max(s.rfind("*"), s.rfind("&"))
        pointer = k >= 0 and s[k] == "*"
        ref = k >= 0 and s[k] == "&"
        pointee = s[:k] if k >= 0 else s
        after = s[k + 1:] if k >= 0 else ""
        words = pointee.split()
        spaces = [w for w in words if w in ADDRESS_SPACES or w == "thread"]
        space = spaces[0] if spaces else None
        const = "const" in words and space != "constant"
        typ = msl_type(pointee)
        if attr in ("buffer", "threadgroup"):
            if not re.fullmatch(r"\d+", arg):
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
            if "const" in after.split():
                raise fail("a const pointer (`T* const p`) is not supported; drop the second const")
            return Param(name, attr, index, space, const, pointer, typ, None, line, span)
        if attr in THREAD_ATTRIBUTES:
            if arg:
                raise fail(f"[[{attr}]] takes no argument")
            if space is not None or pointer or ref:
                raise fail(f"[[{attr}]] is passed by value, without address space")
            allowed = _VECTOR_ATTR_TYPES if THREAD_ATTRIBUTES[attr] else _SCALAR_ATTR_TYPES
            if typ not in allowed:
                raise fail(f"[[{attr}]] must have type {', '.join(allowed)}")
            return Param(name, "attribute", 0, None, "const" in words, False, typ, attr, line, span)
        raise fail(f"unsupported attribute [[{attr}{'(' + arg + ')' if arg else ''}]]")

    def params(self, fn, kernel: str) -> tuple[Param, ...]:
        params, slots = [], {}
        for p in fn.get("inner", []):
            if p.get("kind") != "ParmVarDecl":
                continue
            prm = self.param(p, kernel)
            key = (prm.kind, prm.index) if prm.kind != "attribute" else None
            if key is not None and key in slots:
                raise self.error(prm.line, f"kernel {kernel}: parameters '{slots[key]}' and '{prm.name}' both use "
                                           f"[[{prm.kind}({prm.index})]]")
            if key is not None:
                slots[key] = prm.name
            params.append(prm)
        return tuple(params)

    # -- instantiations
    @staticmethod
    def spelling(template: str, params, spec) -> str:
        """`template<A, B>`: the specialization's template arguments as MSL spells them (bool as true/false)."""
        args = [c for c in spec.get("inner", []) if c.get("kind") == "TemplateArgument"]
        out = []
        for prm, arg in zip(params, args):
            if "value" in arg:
                v = arg["value"]
                ptype = msl_type((prm.get("type") or {}).get("qualType", ""))
                out.append(("true" if int(v) else "false") if ptype == "bool" else str(v))
            else:
                out.append(msl_type((arg.get("type") or {}).get("qualType", "")))
        return f"{template}<{', '.join(out)}>"

    def body(self, fn):
        for c in fn.get("inner", []):
            if c.get("kind") == "CompoundStmt":
                r = c.get("range") or {}
                a, b = _offset(r.get("begin")), _offset(r.get("end"))
                if a is not None and b is not None:
                    return a, b + 1
        return None

    def read(self, ast) -> Signatures:
        kernels, constants, bodies, names = [], [], [], {}

        def add(k: Kernel):
            if k.name in names:
                raise self.error(k.line, f"kernel {k.name} is defined twice (also at line {names[k.name]})")
            names[k.name] = k.line
            kernels.append(k)

        def visit(node, ns: str):
            for n in node.get("inner", []):
                kind = n.get("kind")
                if kind == "NamespaceDecl":
                    visit(n, ns + n.get("name", "") + "::")
                elif kind == "LinkageSpecDecl":
                    visit(n, ns)
                elif kind == "FunctionDecl" and self.kernel_annotations(n) and self.body(n) is not None:
                    off = _offset(n.get("loc"))
                    line = self.line_of(off) if off is not None else 1
                    fname = n.get("name", "")
                    hosts = self.host_names(n)
                    name = hosts[-1][1] if hosts else fname
                    add(Kernel(name, self.params(n, name), line, call=ns + fname, function=fname))
                    bodies.append((fname, *self.body(n)))
                elif kind == "FunctionTemplateDecl":
                    template = n.get("name", "")
                    inner = n.get("inner", [])
                    pattern = next((c for c in inner if c.get("kind") == "FunctionDecl"), None)
                    if pattern is None or not self.kernel_annotations(pattern):
                        continue
                    tparams = [c for c in inner if c.get("kind") in ("TemplateTypeParmDecl",
                                                                      "NonTypeTemplateParmDecl",
                                                                      "TemplateTemplateParmDecl")]
                    own = set(self.kernel_annotations(pattern))
                    span = self.body(pattern)
                    if span is not None:
                        bodies.append((template, *span))
                    for spec in inner:
                        if spec is pattern or spec.get("kind") != "FunctionDecl":
                            continue
                        marks = sorted(set(self.kernel_annotations(spec)) - own)
                        if not marks:
                            continue  # implicitly instantiated: no entry point
                        hosts = self.host_names(spec)
                        line = self.line_of(marks[0])
                        if not hosts:
                            raise self.error(line, f"an explicit instantiation of kernel template {template} needs "
                                                   "[[host_name(\"NAME\")]]")
                        call = self.spelling(ns + template, tparams, spec)
                        for _, name in hosts:
                            add(Kernel(name, self.params(spec, name), line, call=call, function=template))
                elif kind == "VarDecl":
                    c = self.function_constant(n)
                    if c is not None:
                        constants.append(c)

        visit(ast, "")
        by_index = {}
        for c in constants:
            if c.index in by_index:
                raise self.error(c.line, f"function constants {by_index[c.index]} and {c.name} share index {c.index}")
            by_index[c.index] = c.name
        for a in self.ctx.attrs:
            if any(nm == "function_constant" for nm, _ in a.items) and not any(c.line == a.line for c in constants):
                raise self.error(a.line, "function constant not of the supported form `constant T name "
                                         "[[function_constant(n)]];` at file scope (T = bool, int, uint, float)")
        return Signatures(tuple(kernels), tuple(sorted(constants, key=lambda c: c.index)), tuple(bodies))

    def function_constant(self, v):
        off = _offset(v.get("loc"))
        if off is None:
            return None
        pos = off + (_bare(v.get("loc")) or {}).get("tokLen", 0)
        for a in self.ctx.attrs:
            if a.start >= pos and not self.text[pos:a.start].strip():
                fc = [args for nm, args in a.items if nm == "function_constant"]
                if not fc:
                    return None
                line = self.line_of(off)
                typ = msl_type((v.get("type") or {}).get("qualType", ""))
                if typ not in CONSTANT_TYPES:
                    raise self.error(line, f"function constant {v.get('name')}: type {typ} is not supported "
                                           f"(use {', '.join(CONSTANT_TYPES)})")
                if not re.fullmatch(r"\s*\d+\s*", fc[0] or ""):
                    raise self.error(line, f"function constant {v.get('name')}: [[function_constant(n)]] needs a "
                                           "literal index")
                return FunctionConstant(v.get("name", ""), int(fc[0]), typ, line)
            if a.start > pos:
                return None
        return None


def read_source(source: str, *, filename: str = "<source>", include_dirs: Sequence[str] = (),
                msl_version: str = "3.0", compiler: str | None = None) -> Signatures:
    """The kernels and function constants of ``source`` (as if it were the file ``filename``: its directory is
    searched for quoted includes, and messages name it). Raises SignatureError when clang gives no AST (the
    message has clang's first error) or a signature cannot be classified."""
    # Another MSL emulation's headers (msl_emu's, the GPU proxy's) on the path would shadow msl_check's stub.
    dirs = [d for d in include_dirs if not os.path.isfile(os.path.join(d, "metal_stdlib"))]
    ctx, ast, findings = compile_ast(source, filename=filename, msl_version=msl_version, include_dirs=dirs,
                                     compiler=compiler)
    if ast is None:
        first = findings[0] if findings else None
        where = f"{first.file}:{first.line}" if first else f"{filename}:1"
        raise SignatureError(f"{where}: the kernel signatures cannot be read: {first.message if first else 'no AST'}")
    fatal = [f for f in findings if "file not found" in f.message]
    if fatal:
        raise SignatureError(f"{fatal[0].file}:{fatal[0].line}: {fatal[0].message}")
    return _Reader(ctx, filename).read(ast)
