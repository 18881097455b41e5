"""Inline Metal kernels: ``metal_kernel`` (MLX's API: the body, the signature generated) and ``compile_shader``
(whole sources, like ``torch.mps.compile_shader``), on every device through the generic TfmoMetalKernel op.

Layers: source.py (the MSL: signature generation) -> trust.py (consent to compile a source from a graph) ->
build.py (compiling for the CPU and the emulated GPU) -> api.py / shader.py (the Python API). Guide: docs/metal_kernels.md.
"""

from tf_metal_ops.inline_kernels.api import MetalKernel, metal_kernel
from tf_metal_ops.inline_kernels.build import KernelCompileError
from tf_metal_ops.inline_kernels.shader import ShaderLibrary, compile_shader

__all__ = ["KernelCompileError", "MetalKernel", "ShaderLibrary", "compile_shader", "metal_kernel"]
