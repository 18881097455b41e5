"""``compile_shader``: a whole MSL source with full kernel signatures, like ``torch.mps.compile_shader``, run by the
same op as ``metal_kernel``.

    lib = tf_metal_ops.compile_shader('''
        #include <metal_stdlib>
        using namespace metal;
        kernel void axpy(const device float* x [[buffer(0)]], const constant float& a [[buffer(1)]],
                         device float* y [[buffer(2)]], uint i [[thread_position_in_grid]]) {
            y[i] = a * x[i];
        }''')
    (y,) = lib.axpy(x, 2.0, threads=tf.size(x), output_shapes=[tf.shape(x)])

Arguments bind in ``[[buffer(n)]]`` order. A kernel's read-only buffers (``const device T*``, ``constant``) are its
inputs, given positionally (tensors, or numbers for ``constant T&`` parameters); its writable ``device T*``
buffers are its outputs, returned in buffer order, with the dtype of their element type (``float4`` -> float32) and
the shapes given in ``output_shapes``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Sequence

from tf_metal_ops.inline_kernels import api, build, trust
from tf_metal_ops.inline_kernels import source as gen

if TYPE_CHECKING:
    from tf_metal_ops.msl_emu import Kernel, Param


def _param_dtype(kernel: str, p: Param) -> str:
    base = re.sub(r"[234]$", "", p.type.removeprefix("atomic_"))
    if base not in gen.DTYPES_OF_MSL:
        raise ValueError(f"tf_metal_ops.compile_shader: kernel {kernel}: parameter {p.name} ({p.decl}) has element "
                         f"type {p.type}; buffers from Python take {', '.join(gen.DTYPES_OF_MSL)} or their vectors")
    return gen.DTYPES_OF_MSL[base]


class ShaderKernel:
    """One kernel of a ShaderLibrary: ``lib.name(*inputs, threads=..., group_size=..., output_shapes=[...])``."""

    def __init__(self, library: "ShaderLibrary", kernel: Kernel):
        self._source, self.name = library.source, kernel.name
        buffers = sorted((p for p in kernel.params if p.kind == "buffer"), key=lambda p: p.index)
        if any(p.kind == "threadgroup" for p in kernel.params):
            raise ValueError(f"tf_metal_ops.compile_shader: kernel {kernel.name}: [[threadgroup(n)]] parameters are "
                             "not supported; declare threadgroup arrays in the kernel body")
        self.inputs = [p for p in buffers if p.const or p.address_space == "constant"]
        self.outputs = [p for p in buffers if p not in self.inputs]
        if not self.outputs:
            raise ValueError(f"tf_metal_ops.compile_shader: kernel {kernel.name} has no writable `device T*` buffer "
                             "(TF tensors are immutable: a kernel's results are its outputs)")
        self.input_dtypes = [_param_dtype(kernel.name, p) for p in self.inputs]
        self.output_dtypes = [_param_dtype(kernel.name, p) for p in self.outputs]
        bindings = [""] * (buffers[-1].index + 1)
        for i, p in enumerate(self.inputs):
            bindings[p.index] = f"in:{i}"
        for j, p in enumerate(self.outputs):
            bindings[p.index] = f"out:{j}"
        self._bindings = tuple(bindings)
        self._instances: dict = {}

    def _instance(self, ranks: tuple, init: bool) -> api._Instance:
        inst = self._instances.get((ranks, init))
        if inst is None:
            msl = self._source
            if init:
                msl += "\n" + "\n".join(gen.init_kernels(self.name, self.output_dtypes)) + "\n"
            src = gen.KernelSource(msl, self.name, self._bindings, tuple(self.output_dtypes))
            inst = api._Instance(src, api._attrs(src, self.output_dtypes, ranks))
            trust.note_created(msl)
            self._instances[(ranks, init)] = inst
        return inst

    def __call__(self, *inputs: Any, threads, group_size=None, output_shapes: Sequence[Any],
                 init_value: float | None = None) -> list:
        tf = api._tf()
        if len(inputs) != len(self.inputs):
            raise ValueError(f"tf_metal_ops.compile_shader: kernel {self.name} takes {len(self.inputs)} inputs "
                             f"({', '.join(p.name for p in self.inputs)}), got {len(inputs)}")
        tensors = []
        for x, p, dt in zip(inputs, self.inputs, self.input_dtypes):
            t = x if isinstance(x, tf.Tensor) else tf.convert_to_tensor(x, dtype=dt)
            if t.dtype.name != dt:
                raise ValueError(f"tf_metal_ops.compile_shader: kernel {self.name}: input {p.name} is {p.decl}, "
                                 f"got a {t.dtype.name} tensor")
            if not p.pointer and t.shape.rank != 0:
                raise ValueError(f"tf_metal_ops.compile_shader: kernel {self.name}: input {p.name} is {p.decl}, "
                                 f"which takes a scalar, got shape {t.shape}")
            tensors.append(t)
        if group_size is None:
            group_size = (256, 1, 1)
        launch = api._launch(threads, group_size, list(output_shapes), len(self.outputs))
        inst = self._instance(tuple(len(s) for s in launch.shapes), init_value is not None)
        attrs = dict(inst.attrs)
        if init_value is not None:
            attrs["init_value"] = [float(init_value)]
        attrs["launch"] = launch.static if launch.static is not None else []
        return api._run(api._Instance(inst.source, attrs), tensors, launch)


class ShaderLibrary:
    """The kernels of one MSL source, as attributes (see compile_shader)."""

    def __init__(self, source: str):
        if not isinstance(source, str) or not source.strip():
            raise ValueError("tf_metal_ops.compile_shader: the source is empty")
        parsed = build.parse_source(source)  # KernelCompileError is a ValueError
        self.source = source
        self._kernels = {k.name: ShaderKernel(self, k) for k in parsed.kernels}

    @property
    def kernel_names(self) -> list[str]:
        return list(self._kernels)

    def __getattr__(self, name: str) -> ShaderKernel:
        kernels = self.__dict__.get("_kernels", {})
        if name in kernels:
            return kernels[name]
        raise AttributeError(f"tf_metal_ops.compile_shader: the source defines no kernel {name!r} "
                             f"(kernels: {', '.join(kernels)})")


def compile_shader(source: str) -> ShaderLibrary:
    """The kernels of a whole Metal source, callable from TensorFlow on every device (see the module docstring).
    The source is compiled for a device at its first use there.

    Example:
      >>> import tensorflow as tf, tf_metal_ops
      >>> lib = tf_metal_ops.compile_shader('''
      ... #include <metal_stdlib>
      ... using namespace metal;
      ... kernel void axpy(const device float* x [[buffer(0)]], const constant float& a [[buffer(1)]],
      ...                  device float* y [[buffer(2)]], uint i [[thread_position_in_grid]]) { y[i] = a * x[i]; }
      ... ''')
      >>> (y,) = lib.axpy(tf.constant([1.0, 2.0]), 3.0, threads=2, output_shapes=[(2,)])
      >>> y.numpy()
      array([3., 6.], dtype=float32)
    """
    return ShaderLibrary(source)
