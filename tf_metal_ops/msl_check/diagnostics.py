"""clang's diagnostics as findings: each error (with its notes) becomes a finding at the first position in the
user's source. Its rule is ``compile``, except for a stub's static_assert whose message starts with
``msl_check[RULE]:`` (rule RULE) and a conversion between vector types of different elements
(``implicit-vector-conversion``), and a program-scope variable that needs code to initialize or destroy it
(clang's -Wglobal-constructors / -Wexit-time-destructors, made errors: ``program-scope-variable``). Errors that only show where C++ and MSL differ on purpose (struct copies across
address spaces) are not findings."""

from __future__ import annotations

import re

from tf_metal_ops.msl_check.context import Context
from tf_metal_ops.msl_check.findings import Finding

_DIAG = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): (?P<sev>fatal error|error|warning|note): (?P<msg>.*)$")
_MARKER = re.compile(r"msl_check\[(?P<rule>[\w-]+)\]: (?P<msg>[^\"]*)")
_GLOBAL_INIT = re.compile(r"declaration requires (a global constructor|an exit-time destructor)")
_VECTOR = re.compile(r"\(vector of \d+ '([^']+)' values\)")
_IMPLICIT_MEMBER = re.compile(r"candidate (?:constructor|function)(?: template)? \(the implicit (?:copy|move|default) ")


def from_stderr(stderr: str, ctx: Context):
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
        if _GLOBAL_INIT.search(msg):
            rule = "program-scope-variable"
            msg = ("a program-scope variable must be initialized by a constant expression (MSL runs no constructor, "
                   "destructor or initializing function when a library loads)")
        elif mk:
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
