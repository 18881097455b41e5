"""A strict Metal Shading Language check without Apple's compiler.

The source is compiled once by clang++ (>= 16) as C++14 (MSL 2.x/3.x are based on C++14; C++17 from MSL 4.0)
with ``-fsyntax-only -Xclang -ast-dump=json``, against msl_check's own ``<metal_stdlib>`` and keyword prelude
(``csrc/msl_check/include``; their conventions are documented there). MSL's address spaces are distinct clang address
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
- ``simdgroup-matrix``: a ``simdgroup_matrix`` (``simdgroup_float8x8``, ...) or a SIMD-group matrix function
  (``simdgroup_load``, ``simdgroup_store``, ``simdgroup_multiply(_accumulate)``, ``make_filled_simdgroup_matrix``)
  below MSL 2.3 ("SIMD-Group Matrix Data Types", "SIMD-Group Matrix Functions": MSL 2.3 and later).
- ``as-type-size``: ``as_type<T>(x)`` with ``sizeof(T) != sizeof(x)`` ("Reinterpreting Data").
- ``implicit-vector-conversion``: an implicit conversion between vector types of different element types, e.g.
  ``half4``↔``float4`` or ``int4``↔``uint4`` ("Implicit Type Conversions": only explicit conversions between vector
  types). Scalar conversions such as ``half``→``float`` are implicit in MSL too and not findings.
- ``asm``, ``linkage``, ``external-function``, ``builtin``, ``gnu-attribute``, ``variadic``: what is not Metal at
  all and would reach outside the kernel compiled as C++ (inline assembly; ``extern "C"``; a call to a function
  declared but not defined that is not in the Metal standard library; compiler builtins other than pure ones;
  ``constructor``, ``section``, ``alias``, ``weak``, ``used``, ``visibility``, ``init_priority``, ... attributes;
  C variadic functions). MSL has no inline assembly, links a call outside the source only against the functions a
  pipeline is given, defines its own attributes, and has no ``va_list`` for C variadic functions; the rules
  and the attribute list are forbidden.py's. A program-scope variable that needs code to initialize or destroy it
  is a ``program-scope-variable`` finding too (MSL runs no code when a library loads).
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

The modules: ``api`` (check_source, check_file, include_dir), ``clang_ast`` (the one clang run: its JSON AST and
diagnostics), ``rewrite`` (the source rewrite), ``diagnostics`` (clang's errors as findings), ``rules`` (the AST
rules), ``forbidden`` (the rules on what is not Metal at all), ``type_strings`` (address spaces in clang's type strings),
``context`` (the state of one check), ``findings`` (Finding, MSLCheckError, RULES). The compiler is
``_builder.find_clangxx`` (``find_compiler`` here).

Importable without TensorFlow: it needs the standard library, clang++ >= 16, and of this package only ``_builder`` and
``_env``, so it also runs without the package's ``__init__`` (dev/check_msl.py). Nothing imports it at
``import tf_metal_ops``.
"""

from tf_metal_ops._builder import CompilerNotFound as MSLCompilerNotFound
from tf_metal_ops._builder import find_clangxx as find_compiler
from tf_metal_ops.msl_check.api import check_file, check_source, include_dir
from tf_metal_ops.msl_check.findings import RULES, Finding, MSLCheckError

__all__ = ["Finding", "MSLCheckError", "MSLCompilerNotFound", "RULES", "check_source", "check_file", "find_compiler",
           "include_dir"]
