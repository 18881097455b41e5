"""The AST rules: what clang accepts but Apple's compiler rejects, found in clang's JSON AST of the rewritten source
(the package docstring lists the rules and the MSL spec section behind each).

``AstChecker(ctx).run(ast)`` walks the AST once: declarations, casts, expressions and kernel signatures are checked
as they are met, calls are recorded, and recursion is found at the end as the cycles of the call graph. Nothing in
the stub headers is checked, and the rules on written types (address spaces, double) skip template instantiations:
their pattern is checked. Some rules are the stub's instead (static_asserts, read by diagnostics.py); the rules on
what is not Metal at all (asm, linkage, external functions, builtins, GNU attributes, variadic functions) are
forbidden.py's, called on every node.
"""

from __future__ import annotations

import os
import re

from tf_metal_ops.msl_check.context import PRELUDE, Context
from tf_metal_ops.msl_check.findings import Finding
from tf_metal_ops.msl_check.forbidden import ForbiddenRules
from tf_metal_ops.msl_check.type_strings import object_space, pointee_space, return_type, sugar, type_of, types_of

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
    # forbidden.py's rules: what is not Metal and reaches outside the kernel compiled as C++
    "GCCAsmStmt": ("asm", "inline assembly (asm) is not supported in MSL"),
    "MSAsmStmt": ("asm", "inline assembly (asm) is not supported in MSL"),
    "FileScopeAsmDecl": ("asm", "file-scope assembly (asm) is not supported in MSL"),
    "AsmLabelAttr": ("asm", "an asm label (renaming a symbol) is not supported in MSL"),
    "VAArgExpr": ("variadic", "va_arg is not supported in MSL (no variadic functions)"),
}
_DOUBLE = re.compile(r"\bdouble\b")
_ATOMIC_FLOAT = re.compile(r"\batomic_float\b|\batomic<float>")
_SIMDGROUP_MATRIX = re.compile(r"\bsimdgroup_(?:matrix|float8x8|half8x8|bfloat8x8)\b")


# ---- the JSON AST ----------------------------------------------------------------------------------------------------
def _bare(loc):
    if not loc:
        return None
    if "expansionLoc" in loc:
        return loc["expansionLoc"]
    return loc if "_file" in loc else loc.get("spellingLoc")


class AstChecker:
    def __init__(self, ctx: Context):
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
        self.forbidden = ForbiddenRules(self, ast)
        self._find_stage_lines()
        try:
            self.visit(ast, fn=None, kernel=False, scope="program", inst=False)
            self._recursion()
        except RecursionError:  # an AST deeper than Python's recursion limit: never report it clean
            return list(self.findings.values()) + [
                Finding(self.ctx.filename, 1, 1, "compile", "the source nests too deeply to be checked")]
        return list(self.findings.values())

    def _find_stage_lines(self):
        text = (self.ctx.source_of(os.path.join(self.ctx.stub, PRELUDE)) or "").split("\n")
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
        self.forbidden.visit(node, kind)

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
            ret = return_type(node.get("type", {}).get("qualType", ""))
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
            a, b = type_of(node), type_of(children[0])
            if "ext_vector_type" in a and "ext_vector_type" in b and a != b:
                self.add(node, "implicit-vector-conversion",
                         f"implicit conversion from '{sugar(children[0])}' to '{sugar(node)}' (MSL converts "
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
            if any(_ATOMIC_FLOAT.search(t) for t in types_of(node)):
                self.add(node, "atomic-float", "atomic_float needs MSL 3.0 or later",
                         loc=self.where(node, "range") if "Expr" in kind else None)
        if self.ctx.version < 230 and not kind.endswith("Attr"):
            if any(_SIMDGROUP_MATRIX.search(t) for t in types_of(node)):
                self.add(node, "simdgroup-matrix",
                         "simdgroup_matrix and the SIMD-group matrix functions (simdgroup_load, simdgroup_store, "
                         "simdgroup_multiply, ...) need MSL 2.3 or later",
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
        sp = pointee_space(t)
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
        t = type_of(node)
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
        space = object_space(t)
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
        t = type_of(node)
        children = node.get("inner") or []
        if not inst:
            self._check_pointer(node, t, "cast")
            if _DOUBLE.search(node.get("type", {}).get("qualType", "")):
                self.add(node, "double", "double is not supported in MSL (cast)", loc=self.where(node, "range"))
        src = type_of(children[0]) if children else ""
        a, b = pointee_space(t), pointee_space(src)
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
            t = type_of(p)
            sp = pointee_space(t)
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
