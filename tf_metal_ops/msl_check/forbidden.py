"""The rules on what is not Metal at all and would reach outside the kernel once the source is compiled as C++ (the
CPU and the emulated GPU compile it so): code the kernel does not contain, or code that runs when its library
loads. Apple's compiler rejects each of them (MSL spec: "Metal Restrictions" lists the C++ features MSL does not
support; MSL has no inline assembly; "Attributes" defines MSL's own attributes; a call to a function outside the
source links only against the functions a pipeline is given, MTLLinkedFunctions). The rules:

- ``asm``: an ``asm``/``__asm__`` statement, a file-scope ``asm(...)``, and an asm label (``f() __asm__("name")``,
  which renames a symbol);
- ``linkage``: ``extern "C"`` / ``extern "C++"`` (a linkage specification);
- ``external-function``: a function (or method) the source uses, declares and never defines,
  that is not part of the Metal standard library (declared in msl_check's stub ``<metal_stdlib>``);
- ``builtin``: a compiler builtin (``__builtin_trap``, ``__builtin_alloca``, ``__sync_*``, ...) other than the pure
  ones MSL code spells (``__builtin_nanf``, ``__builtin_inff``, ``__builtin_expect``, ...);
- ``gnu-attribute``: an attribute MSL does not define that places or keeps code or data, or runs it at load:
  ``constructor``, ``destructor``, ``section``, ``alias``, ``ifunc``, ``weak``, ``weakref``, ``used``,
  ``retain``, ``visibility``, ``init_priority``, ``cleanup``, ``naked``, ... in every spelling (``__attribute__``,
  ``[[gnu::...]]``, ``[[clang::...]]``, ``#pragma clang attribute``; ``#pragma weak`` and
  ``#pragma redefine_extname`` apply to C names only, and ``linkage`` refuses those);
- ``variadic``: a C variadic function (``...``) or ``va_arg`` (MSL has no ``va_list``).

(``goto``, ``new``/``delete``, exceptions, ``virtual``, ``thread_local``, static locals and program-scope variables
outside the constant address space are rules.py's, and so are the node kinds that are a finding by themselves:
asm statements and labels, ``va_arg``.) Every finding is at the user's line; nothing in the stub
headers is checked.
"""

from __future__ import annotations

_FUNCTIONS = ("FunctionDecl", "CXXMethodDecl", "CXXConstructorDecl", "CXXDestructorDecl", "CXXConversionDecl")

# Attributes (clang's Attr kinds) MSL does not define and that place code or data, keep or rename symbols, or run
# code when a library loads or unloads: kind -> the name in the message.
_ATTRIBUTES = {
    "ConstructorAttr": "constructor", "DestructorAttr": "destructor", "InitPriorityAttr": "init_priority",
    "InitSegAttr": "init_seg", "SectionAttr": "section", "CodeSegAttr": "code_seg", "AliasAttr": "alias",
    "IFuncAttr": "ifunc", "WeakAttr": "weak", "WeakRefAttr": "weakref", "WeakImportAttr": "weak_import",
    "UsedAttr": "used", "RetainAttr": "retain", "VisibilityAttr": "visibility",
    "TypeVisibilityAttr": "type_visibility", "CleanupAttr": "cleanup", "NakedAttr": "naked",
    "DLLExportAttr": "dllexport", "DLLImportAttr": "dllimport", "PatchableFunctionEntryAttr":
    "patchable_function_entry", "SelectAnyAttr": "selectany",
}

# Builtins that only compute a value or give the optimiser a hint (no memory, no control flow out of the kernel).
PURE_BUILTINS = frozenset(
    f"__builtin_{n}" for n in ("nan", "nanf", "nanl", "inf", "inff", "infl", "huge_val", "huge_valf", "expect",
                               "isnan", "isinf", "isfinite", "signbit", "copysign", "copysignf", "fabsf", "fabs",
                               "popcount", "clz", "ctz", "bit_cast"))


def _has_body(node) -> bool:
    return node.get("explicitlyDefaulted") is not None or node.get("explicitlyDeleted") is not None or any(
        c.get("kind") in ("CompoundStmt", "CXXTryStmt") for c in node.get("inner", ()) if isinstance(c, dict))


class Declarations:
    """Every function and variable declaration of the AST (stub headers included), by id, grouped by redeclaration:
    which have a definition, which the stub declares, which are the compiler's implicit builtins."""

    def __init__(self, ast, is_stub):
        self.first = {}  # id -> first declaration's id
        self.defined, self.stub, self.builtin, self.implicit = set(), set(), set(), set()
        stack = [ast]
        while stack:
            node = stack.pop()
            if not isinstance(node, dict):
                continue
            kind = node.get("kind")
            if kind in _FUNCTIONS or kind == "VarDecl":
                i = node.get("id")
                prev = node.get("previousDecl")
                self.first[i] = self.first.get(prev, prev) if prev else i
                root = self.first[i]
                # An extern variable is a function constant ([[function_constant(n)]], given by the pipeline) or
                # outside the constant address space (program-scope-variable refuses it): not this rule's.
                if kind == "VarDecl" or _has_body(node):
                    self.defined.add(root)
                loc = node.get("loc") or {}
                loc = loc.get("expansionLoc", loc.get("spellingLoc", loc))
                if node.get("isImplicit"):
                    (self.builtin if kind == "FunctionDecl" else self.implicit).add(root)
                elif is_stub(loc.get("_file", "")):
                    self.stub.add(root)
            stack.extend(node.get("inner", ()))

    def external(self, decl_id) -> bool:
        """A declaration the source uses without a definition: neither defined, nor the stub's, nor implicit."""
        root = self.first.get(decl_id)
        if root is None:
            return False  # not a function or variable of this AST (an instantiation clang did not write out)
        return not ({root} & (self.defined | self.stub | self.builtin | self.implicit))

    def is_builtin(self, decl_id) -> bool:
        return self.first.get(decl_id) in self.builtin


class ForbiddenRules:
    """Called by rules.AstChecker on every node outside the stub headers (after Declarations saw the whole AST)."""

    def __init__(self, checker, ast):
        self.checker = checker
        self.decls = Declarations(ast, checker.ctx.is_stub)

    def visit(self, node, kind) -> None:
        add, where = self.checker.add, self.checker.where
        if kind in _ATTRIBUTES:
            self._attribute(node, where(node, "range"))
        elif kind == "LinkageSpecDecl":
            add(node, "linkage", f'extern "{node.get("language", "C")}" (a linkage specification) is not supported '
                "in MSL: a kernel links only against the Metal standard library")
        elif kind in _FUNCTIONS or kind == "VarDecl":
            if node.get("variadic"):
                add(node, "variadic", f"variadic function '{node.get('name', '')}' is not supported in MSL")
            for a in node.get("inner", ()):  # attributes without a position of their own (#pragma weak)
                if a.get("kind") in _ATTRIBUTES and where(a, "range") is None:
                    self._attribute(a, where(node))
        elif kind in ("DeclRefExpr", "MemberExpr"):
            ref = node.get("referencedDecl") or {}
            ref_id = ref.get("id") if kind == "DeclRefExpr" else node.get("referencedMemberDecl")
            name = ref.get("name") or node.get("name", "")
            if ref_id is None:
                return
            if self.decls.is_builtin(ref_id):
                if name.startswith("operator "):
                    add(node, "new-delete", f"{name} is not supported in MSL", loc=where(node, "range"))
                elif name not in PURE_BUILTINS:
                    add(node, "builtin", f"the compiler builtin '{name}' is not part of MSL",
                        loc=where(node, "range"))
            elif self.decls.external(ref_id):
                add(node, "external-function",
                    f"'{name}' is declared but not defined in the source, and is not part of the Metal standard "
                    "library: a Metal kernel cannot call or use code from outside its source",
                    loc=where(node, "range"))

    def _attribute(self, node, loc) -> None:
        self.checker.add(node, "gnu-attribute", f"the attribute '{_ATTRIBUTES[node['kind']]}' is not an MSL attribute "
                         "(it places code or symbols, or runs code when a library loads)", loc=loc)
