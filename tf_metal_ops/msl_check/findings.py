"""What a check reports: ``Finding`` (one rule broken at one source position), ``MSLCheckError`` for callers that
require a clean source, and ``RULES``, every rule a finding can have (the package docstring gives the MSL rule behind
each; tests/msl_check/ has a negative control per rule)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

RULES = (
    "compile", "pointer-address-space", "kernel-argument-address-space", "program-scope-variable",
    "threadgroup-variable", "address-space-cast", "recursion", "lambda", "goto", "new-delete", "exception",
    "virtual-function", "dynamic-cast", "typeid", "thread-local", "double", "memory-order", "atomic-float", "simdgroup-matrix",
    "as-type-size", "implicit-vector-conversion", "buffer-index-duplicate", "buffer-index-range",
    "position-attribute-type", "kernel-return-type", "asm", "linkage", "external-function", "builtin",
    "gnu-attribute", "variadic",
)


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

