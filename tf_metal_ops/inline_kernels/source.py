"""The MSL source of an inline kernel: MLX's ``mx.fast.metal_kernel`` signature generation, plus what a whole
source (``compile_shader``) declares. Pure Python (no TensorFlow).

Generated source, in order (``#line`` directives map compiler messages to the user's ``header`` and ``source``):

    #include <metal_stdlib>; using namespace metal;
    #pragma clang fp contract(off)                 // no FMA contraction: the same rounding as the CPU path
    typedef float T; constant constexpr int N = 4; // template arguments, in the given order
    <header>
    kernel void custom_kernel_<name>(<signature>) { <source> }
    kernel void custom_kernel_<name>_init<j>(...) // with init_value: fills output j before the kernel

Signature (MLX's rules), buffer indices in this order:
  - each input: ``const device T* x`` (``const constant T& x`` when 0-d), then ``const constant int* x_shape``,
    ``const constant int* x_strides`` (row-major element strides) and ``const constant int& x_ndim`` when the body
    names them (a 0-d input has none of the three);
  - each output: ``device T* y``, or ``device atomic_T* y`` with atomic_outputs (T: float, int, uint);
  - then every thread attribute the body names, by value (``uint3 thread_position_in_grid``, ...).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

# TF dtype name -> MSL scalar (the op's type list: csrc/ops/metal_kernel_args.h kTypeList).
MSL_TYPES = {
    "float32": "float", "float16": "half", "int32": "int", "uint32": "uint", "int64": "long", "uint64": "ulong",
    "int16": "short", "uint16": "ushort", "int8": "char", "uint8": "uchar", "bool": "bool",
}
DTYPES_OF_MSL = {v: k for k, v in MSL_TYPES.items()}
ATOMIC_TYPES = {"float32": "atomic_float", "int32": "atomic_int", "uint32": "atomic_uint"}

# MSL thread attributes a body may name, with their parameter types (those msl_emu runs).
THREAD_ATTRIBUTES = {
    "thread_position_in_grid": "uint3",
    "thread_position_in_threadgroup": "uint3",
    "threadgroup_position_in_grid": "uint3",
    "threads_per_threadgroup": "uint3",
    "dispatch_threads_per_threadgroup": "uint3",
    "threadgroups_per_grid": "uint3",
    "threads_per_grid": "uint3",
    "thread_index_in_threadgroup": "uint",
    "threads_per_simdgroup": "uint",
    "simdgroup_index_in_threadgroup": "uint",
    "thread_index_in_simdgroup": "uint",
    "thread_execution_width": "uint",
    "simdgroups_per_threadgroup": "uint",
    "dispatch_simdgroups_per_threadgroup": "uint",
    "quadgroup_index_in_threadgroup": "uint",
    "thread_index_in_quadgroup": "uint",
    "quadgroups_per_threadgroup": "uint",
    "dispatch_quadgroups_per_threadgroup": "uint",
}
MAX_BUFFERS = 31  # [[buffer(0..30)]]
KERNEL_PREFIX = "custom_kernel_"


@dataclasses.dataclass(frozen=True)
class KernelSource:
    """A complete MSL source and how the op binds it (attrs of TfmoMetalKernel)."""

    msl: str
    kernel: str                     # the function to dispatch
    bindings: tuple[str, ...]       # per buffer index: "in:i", "out:j", "shape:i", "strides:i", "ndim:i" or ""
    output_dtypes: tuple[str, ...]  # TF dtype names, by output


def _uses(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(word)}(?![\w])", text) is not None


def check_identifier(what: str, name: str) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"tf_metal_ops.metal_kernel: {what} must be an identifier, got {name!r}")


def template_lines(template: Sequence[tuple[str, object]]) -> list[str]:
    """`typedef float T;` / `constant constexpr int N = 4;` / `constant constexpr bool B = true;` per argument.
    Values: a TF dtype name (via dtype_name), a bool, or an int."""
    out = []
    for name, value in template:
        check_identifier("a template argument's name", name)
        if isinstance(value, bool):
            out.append(f"constant constexpr bool {name} = {'true' if value else 'false'};")
        elif isinstance(value, int):
            if not -(2**63) <= value < 2**63:
                raise ValueError(f"tf_metal_ops.metal_kernel: template argument {name} = {value} does not fit int64")
            typ = "int" if -(2**31) <= value < 2**31 else "long"
            out.append(f"constant constexpr {typ} {name} = {value};")
        elif isinstance(value, str) and value in MSL_TYPES:
            out.append(f"typedef {MSL_TYPES[value]} {name};")
        else:
            raise ValueError(f"tf_metal_ops.metal_kernel: template argument {name} = {value!r}: expected a dtype, "
                             "an int or a bool")
    return out


def prelude(template_text: Sequence[str]) -> list[str]:
    return ["#include <metal_stdlib>", "using namespace metal;",
            "#pragma clang fp contract(off)", *template_text]


def init_kernels(kernel: str, output_dtypes: Sequence[str]) -> list[str]:
    """`<kernel>_init<j>`: sets every element of output j to `value` (csrc/gpu/metal_kernel_gpu.cc runs them)."""
    out = []
    for j, dt in enumerate(output_dtypes):
        t = MSL_TYPES[dt]
        out.append(f"kernel void {kernel}_init{j}(device {t}* out [[buffer(0)]], "
                   f"const constant float& value [[buffer(1)]], const constant uint& n [[buffer(2)]], "
                   f"uint i [[thread_position_in_grid]]) {{\n  if (i < n) out[i] = {t}(value);\n}}")
    return out


def generate(name: str, input_names: Sequence[str], output_names: Sequence[str], source: str, header: str,
             atomic_outputs: bool, input_dtypes: Sequence[str], input_ndims: Sequence[int],
             output_dtypes: Sequence[str], template: Sequence[tuple[str, object]], init: bool) -> KernelSource:
    """The MSL source of one instantiation (see the module docstring)."""
    kernel = KERNEL_PREFIX + name
    params, bindings = [], []

    def add(decl: str, binding: str) -> None:
        params.append(f"{decl} [[buffer({len(bindings)})]]")
        bindings.append(binding)

    for i, (x, dt, nd) in enumerate(zip(input_names, input_dtypes, input_ndims)):
        t = MSL_TYPES[dt]
        if nd == 0:
            add(f"const constant {t}& {x}", f"in:{i}")
            continue
        add(f"const device {t}* {x}", f"in:{i}")
        for suffix, decl in (("shape", "const constant int*"), ("strides", "const constant int*"),
                             ("ndim", "const constant int&")):
            if _uses(source, f"{x}_{suffix}"):
                add(f"{decl} {x}_{suffix}", f"{suffix}:{i}")
    for j, (y, dt) in enumerate(zip(output_names, output_dtypes)):
        if atomic_outputs:
            if dt not in ATOMIC_TYPES:
                raise ValueError(f"tf_metal_ops.metal_kernel {name}: atomic output {y} is {dt}; Metal has atomics of "
                                 f"{', '.join(ATOMIC_TYPES)} only")
            add(f"device {ATOMIC_TYPES[dt]}* {y}", f"out:{j}")
        else:
            add(f"device {MSL_TYPES[dt]}* {y}", f"out:{j}")
    if len(bindings) > MAX_BUFFERS:
        raise ValueError(f"tf_metal_ops.metal_kernel {name}: {len(bindings)} buffers (inputs, their shape/strides/ndim "
                         f"and outputs), more than Metal's {MAX_BUFFERS}")
    for attr, typ in THREAD_ATTRIBUTES.items():
        if _uses(source, attr):
            params.append(f"{typ} {attr} [[{attr}]]")
    lines = prelude(template_lines(template))
    if header:
        lines += [f'#line 1 "{name}:header"', header]
    signature = ",\n    ".join(params)
    lines += [f"kernel void {kernel}(\n    {signature}) {{", f'#line 1 "{name}:source"', source, "}"]
    if init:
        lines += [f'#line 1 "{name}:init_value"', *init_kernels(kernel, output_dtypes)]
    return KernelSource("\n".join(lines) + "\n", kernel, tuple(bindings), tuple(output_dtypes))
