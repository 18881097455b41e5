"""``metal_kernel`` and ``compile_shader``: Metal kernels written inline from Python, run by one generic op
(TfmoMetalKernel) on the Mac GPU, the emulated GPU and any CPU. Guide: docs/metal_kernels.md.

    kernel = tf_metal_ops.metal_kernel(
        name="myexp", input_names=["inp"], output_names=["out"],
        source='''
            uint elem = thread_position_in_grid.x;
            out[elem] = metal::exp(inp[elem]);
        ''')
    (y,) = kernel(inputs=[x], grid=(tf.size(x), 1, 1), threadgroup=(256, 1, 1),
                  output_shapes=[tf.shape(x)], output_dtypes=[x.dtype])

Everything that depends only on the kernel and its template (the generated source, its bindings, the op's attrs)
is made once per (template, input dtypes and ranks, output dtypes, init_value) and kept on the kernel object; a call
then converts its launch description and runs the op.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import numbers
from typing import Any, Sequence

from tf_metal_ops import _library
from tf_metal_ops.inline_kernels import build, trust
from tf_metal_ops.inline_kernels import source as gen

_MAX_GROUP = 1024
_MAX_DIM = 2**32 - 1


_TF = None


def _tf():
    """The tensorflow module, with the eager internals _run uses as attributes of this function (loaded on first use:
    the package imports without TensorFlow)."""
    global _TF
    if _TF is None:
        import tensorflow as tf
        from tensorflow.python import pywrap_tfe
        from tensorflow.python.eager import context, core
        from tensorflow.python.framework import ops as tf_ops

        _tf.pywrap_tfe, _tf.context, _tf.core, _tf.ops = pywrap_tfe, context, core, tf_ops
        _TF = tf
    return _TF


def _dtype_name(dtype) -> str:
    tf = _tf()
    name = tf.as_dtype(dtype).name
    if name not in gen.MSL_TYPES:
        raise ValueError(f"tf_metal_ops.metal_kernel: dtype {name} is not supported (use one of "
                         f"{', '.join(gen.MSL_TYPES)})")
    return name


def _template_key(template) -> tuple:
    out = []
    for item in template or ():
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ValueError(f"tf_metal_ops.metal_kernel: template entries are (name, value) pairs, got {item!r}")
        name, value = item
        if isinstance(value, bool):
            out.append((name, value))
        elif isinstance(value, numbers.Integral):
            out.append((name, int(value)))
        else:
            try:
                out.append((name, _dtype_name(value)))
            except TypeError:
                raise ValueError(f"tf_metal_ops.metal_kernel: template argument {name} = {value!r}: expected a "
                                 "TF dtype, an int or a bool") from None
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class _Launch:
    static: list[int] | None  # the whole launch description when every part is a Python int
    dynamic: Any              # else: a 1-D int64 tensor
    shapes: list[list]        # per output: per dimension int or None (the static shapes set in graphs)


def _ints(value):
    """`value` as a list of Python ints when it is an int or a tuple/list of ints (the common case, no TF call)."""
    if type(value) is int:
        return [value]
    if type(value) in (tuple, list) and all(type(v) is int for v in value):
        return list(value)
    return None


def _parts(value, what: str, length: int | None) -> list:
    """`value` as a list of per-dimension ints or scalar int tensors (a 1-D tensor is split)."""
    out = _ints(value)
    if out is None:
        out = _slow_parts(value, what)
    if length is not None:
        if not 1 <= len(out) <= length:
            raise ValueError(f"tf_metal_ops.metal_kernel: {what} has {len(out)} dimensions (1 to {length})")
        out += [1] * (length - len(out))
    return out


def _slow_parts(value, what: str) -> list:
    tf = _tf()
    if isinstance(value, tf.TensorShape):
        if not value.is_fully_defined():
            raise ValueError(f"tf_metal_ops.metal_kernel: {what} {value} is not fully defined; pass tf.shape(x)")
        return value.as_list()
    if isinstance(value, numbers.Integral):
        return [int(value)]
    if tf.is_tensor(value):
        static = tf.get_static_value(value)
        if static is not None:
            return [int(v) for v in static.reshape(-1)] if static.ndim else [int(static)]
        if value.shape.rank == 0:
            value = [value]
        elif value.shape.rank == 1 and value.shape[0] is not None:
            value = [value[i] for i in range(value.shape[0])]
        else:
            raise ValueError(f"tf_metal_ops.metal_kernel: {what} must be a scalar or a 1-D tensor of known length")
    out = []
    for v in value:
        if isinstance(v, numbers.Integral):
            out.append(int(v))
        elif tf.is_tensor(v):
            static = tf.get_static_value(v)
            if static is not None and static.ndim == 0:
                out.append(int(static))
            elif v.shape.rank == 0 and v.dtype.is_integer:
                out.append(v)
            else:
                raise ValueError(f"tf_metal_ops.metal_kernel: {what}: each dimension must be an int or a scalar int "
                                 f"tensor, got {v!r}")
        else:
            raise ValueError(f"tf_metal_ops.metal_kernel: {what}: each dimension must be an int or a scalar int "
                             f"tensor, got {v!r}")
    return out


def _launch(grid, threadgroup, output_shapes, n_outputs: int) -> _Launch:
    tf = _tf()
    g = _parts(grid, "grid", 3)
    t = _parts(threadgroup, "threadgroup", 3)
    if len(output_shapes) != n_outputs:
        raise ValueError(f"tf_metal_ops.metal_kernel: {len(output_shapes)} output shapes for {n_outputs} outputs")
    shapes = [_parts(s, f"output_shapes[{j}]", None) if not (isinstance(s, (list, tuple)) and len(s) == 0) else []
              for j, s in enumerate(output_shapes)]
    for v in g:
        if isinstance(v, int) and not 0 <= v <= _MAX_DIM:
            raise ValueError(f"tf_metal_ops.metal_kernel: grid {g}: each dimension must be in 0 .. {_MAX_DIM} "
                             "(Metal grids are 32-bit per dimension)")
    for v in t:
        if isinstance(v, int) and not 1 <= v <= _MAX_GROUP:
            raise ValueError(f"tf_metal_ops.metal_kernel: threadgroup {t}: each dimension must be in 1 .. {_MAX_GROUP}")
    if all(isinstance(v, int) for v in t) and t[0] * t[1] * t[2] > _MAX_GROUP:
        raise ValueError(f"tf_metal_ops.metal_kernel: threadgroup {t} is {t[0] * t[1] * t[2]} threads, over the "
                         f"limit of {_MAX_GROUP} threads per threadgroup")
    for j, s in enumerate(shapes):
        for v in s:
            if isinstance(v, int) and v < 0:
                raise ValueError(f"tf_metal_ops.metal_kernel: output_shapes[{j}] = {s} has a negative dimension")
    flat = [*g, *t, *[v for s in shapes for v in s]]
    known = lambda vs: tuple(v if isinstance(v, int) else None for v in vs)  # noqa: E731
    if all(isinstance(v, int) for v in flat):
        return _Launch(flat, None, [list(known(s)) for s in shapes])
    dynamic = tf.stack([tf.cast(v, tf.int64) for v in flat])
    return _Launch(None, dynamic, [list(known(s)) for s in shapes])


@dataclasses.dataclass(frozen=True)
class _Instance:
    """Everything of one instantiation that does not change between calls."""

    source: gen.KernelSource
    attrs: dict
    tin: tuple | None = None  # the input dtypes of a call kept for reuse (MetalKernel's); None: not registered

    @functools.cached_property
    def flat_attrs(self) -> tuple:
        """The attrs as TFE_Py_FastPathExecute takes them: name, value, name, value, ..."""
        return tuple(v for item in self.attrs.items() for v in item)

    @functools.cached_property
    def call_attrs(self) -> tuple:
        """TfmoMetalKernelCall's attrs (Tout and the registered call) for a static launch, registered on first use."""
        return ("Tout", self.attrs["Tout"], "call", _register_call(self.attrs, self.tin))


_OP = "TfmoMetalKernel"  # csrc/common/op_names.h
_CALL_OP = "TfmoMetalKernelCall"


@functools.cache
def _register_call_fn():
    """The op library's tfmo_metal_kernel_register_call (csrc/ops/metal_kernel_op.cc), typed once."""
    fn = _library.native().tfmo_metal_kernel_register_call
    c_int_p, c_ll_p = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_longlong)
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, c_int_p, ctypes.c_int, c_int_p, ctypes.c_int,
                   ctypes.POINTER(ctypes.c_char_p), ctypes.c_int, c_ll_p, ctypes.c_int, c_ll_p, ctypes.c_int,
                   ctypes.c_int, ctypes.c_float, ctypes.c_char_p, ctypes.c_int]
    fn.restype = ctypes.c_longlong
    return fn


def _register_call(attrs: dict, tin: Sequence[str]) -> int:
    """Registers a static launch of TfmoMetalKernel as an eager call in the op library; returns its token."""
    fn = _register_call_fn()

    def ints(values, ctype):
        return (ctype * max(1, len(values)))(*values), len(values)

    tout, n_tout = ints([d.as_datatype_enum for d in attrs["Tout"]], ctypes.c_int)
    tin, n_tin = ints([_tf().as_dtype(d).as_datatype_enum for d in tin], ctypes.c_int)
    bindings = [b.encode() for b in attrs["bindings"]]
    c_bindings = (ctypes.c_char_p * max(1, len(bindings)))(*bindings)
    ranks, n_ranks = ints(attrs["output_ranks"], ctypes.c_longlong)
    launch, n_launch = ints(attrs["launch"], ctypes.c_longlong)
    init = attrs.get("init_value") or []
    error = ctypes.create_string_buffer(1024)
    token = fn(attrs["source"].encode(), attrs["kernel"].encode(), tin, n_tin, tout, n_tout, c_bindings,
               len(bindings), ranks, n_ranks, launch, n_launch, 1 if init else 0, float(init[0]) if init else 0.0,
               error, len(error))
    if token <= 0:
        raise ValueError(f"tf_metal_ops.metal_kernel: {error.value.decode(errors='replace')}")
    return int(token)


def _run(inst: _Instance, inputs: list, launch: _Launch):
    """Runs the op. Eagerly with a static launch: TfmoMetalKernelCall through TFE_Py_FastPathExecute, with the
    instance's call registered once (three attrs a call instead of nine); else the generated wrapper of
    TfmoMetalKernel, which graphs and SavedModels hold."""
    tf = _tf()
    build.ensure_registered()
    ctx = _tf.context.context()
    if launch.dynamic is None and ctx.executing_eagerly():
        try:
            if inst.tin is None:
                return list(_tf.pywrap_tfe.TFE_Py_FastPathExecute(ctx, _OP, None, inputs, [], *inst.flat_attrs))
            return list(_tf.pywrap_tfe.TFE_Py_FastPathExecute(ctx, _CALL_OP, None, inputs, *inst.call_attrs))
        except _tf.core._NotOkStatusException as e:
            _tf.ops.raise_from_not_ok_status(e, None)
        except _tf.core._FallbackException:
            pass
    outs = list(_library.ops().tfmo_metal_kernel(inputs, [] if launch.dynamic is None else [launch.dynamic],
                                                 **inst.attrs))
    if not tf.executing_eagerly():
        for y, s in zip(outs, launch.shapes):
            y.set_shape(s)
    return outs


def _as_tensor(x):
    return _tf().convert_to_tensor(x)


class MetalKernel:
    """An inline Metal kernel (see metal_kernel). Call it with inputs and a launch description; returns a list of
    tensors, one per output name."""

    def __init__(self, name: str, input_names: Sequence[str], output_names: Sequence[str], source: str, header: str,
                 ensure_row_contiguous: bool, atomic_outputs: bool):
        gen.check_identifier("name", name)
        for n in [*input_names, *output_names]:
            gen.check_identifier("an input or output name", n)
        if len(set([*input_names, *output_names])) != len(input_names) + len(output_names):
            raise ValueError("tf_metal_ops.metal_kernel: input and output names must be distinct")
        if not output_names:
            raise ValueError("tf_metal_ops.metal_kernel: a kernel needs at least one output")
        if not isinstance(source, str) or not source.strip():
            raise ValueError("tf_metal_ops.metal_kernel: source (the kernel body) is empty")
        self.name, self.source, self.header = name, source, header or ""
        self.input_names, self.output_names = tuple(input_names), tuple(output_names)
        self.atomic_outputs = bool(atomic_outputs)
        self.ensure_row_contiguous = bool(ensure_row_contiguous)  # TF tensors are always dense and row-major
        self._instances: dict[tuple, _Instance] = {}
        self._calls: dict = {}  # static calls: key -> (instance with launch attrs, launch)

    def instance(self, input_dtypes: Sequence[str], input_ndims: Sequence[int], output_dtypes: Sequence[str],
                 output_ranks: Sequence[int], template=None, init: bool = False) -> _Instance:
        """The generated source and op attrs of one instantiation (cached)."""
        key = (tuple(input_dtypes), tuple(input_ndims), tuple(output_dtypes), tuple(output_ranks),
               _template_key(template), init)
        inst = self._instances.get(key)
        if inst is None:
            src = gen.generate(self.name, self.input_names, self.output_names, self.source, self.header,
                               self.atomic_outputs, key[0], key[1], key[2], key[4], init)
            inst = _Instance(src, _attrs(src, key[2], key[3]))
            trust.note_created(src.msl)
            self._instances[key] = inst
        return inst

    def __call__(self, inputs: Sequence[Any], *, grid, threadgroup, output_shapes: Sequence[Any],
                 output_dtypes: Sequence[Any], template=None, init_value: float | None = None,
                 verbose: bool = False) -> list:
        tensor = _tf().Tensor
        inputs = [x if isinstance(x, tensor) else _as_tensor(x) for x in inputs]
        # The key holds dtypes as their enum values: hashing a tf.DType costs as much as the rest of the key.
        key = (tuple((x.dtype._type_enum, x.shape.rank) for x in inputs), grid, threadgroup, tuple(output_shapes),
               tuple(getattr(d, "_type_enum", d) for d in output_dtypes), tuple(template) if template else (),
               init_value)
        try:
            prepared = self._calls.get(key)
        except TypeError:  # an unhashable argument (a list, a tensor): a dynamic launch is rebuilt on every call
            prepared, key = None, None
        if prepared is None:
            keep = key is not None and len(self._calls) < 4096
            prepared = self._prepare(inputs, grid, threadgroup, output_shapes, output_dtypes, template, init_value,
                                     keep)
            if keep:
                self._calls[key] = prepared
        inst, launch = prepared
        if verbose:
            print(inst.source.msl)
        return _run(inst, inputs, launch)

    def _prepare(self, inputs, grid, threadgroup, output_shapes, output_dtypes, template, init_value, keep):
        """Checks one call and builds its instance and launch description. A call kept for reuse (`keep`) with a
        static launch runs eagerly as a registered call (`_Instance.tin` set): one registration, then every call
        passes three attrs. The registry holds one entry per kept call, as TF's kernel cache holds one kernel."""
        if len(inputs) != len(self.input_names):
            raise ValueError(f"tf_metal_ops.metal_kernel {self.name}: {len(inputs)} inputs given for the "
                             f"{len(self.input_names)} input names {list(self.input_names)}")
        if len(output_dtypes) != len(self.output_names):
            raise ValueError(f"tf_metal_ops.metal_kernel {self.name}: {len(output_dtypes)} output dtypes for the "
                             f"{len(self.output_names)} output names {list(self.output_names)}")
        ndims = []
        for n, x in zip(self.input_names, inputs):
            if x.shape.rank is None:
                raise ValueError(f"tf_metal_ops.metal_kernel {self.name}: input {n} has unknown rank (the generated "
                                 "signature depends on it)")
            ndims.append(x.shape.rank)
        in_dtypes = [_dtype_name(x.dtype) for x in inputs]
        out_dtypes = [_dtype_name(d) for d in output_dtypes]
        launch = _launch(grid, threadgroup, list(output_shapes), len(self.output_names))
        inst = self.instance(in_dtypes, ndims, out_dtypes, [len(s) for s in launch.shapes], template,
                             init_value is not None)
        attrs = dict(inst.attrs)
        if init_value is not None:
            attrs["init_value"] = [float(init_value)]
        attrs["launch"] = launch.static if launch.static is not None else []
        registered = keep and launch.static is not None
        return _Instance(inst.source, attrs, tuple(in_dtypes) if registered else None), launch


def _attrs(src: gen.KernelSource, output_dtypes: Sequence[str], output_ranks: Sequence[int]) -> dict:
    tf = _tf()
    return {"Tout": [tf.as_dtype(d) for d in output_dtypes], "source": src.msl, "kernel": src.kernel,
            "bindings": list(src.bindings), "output_ranks": list(output_ranks)}


def metal_kernel(name: str, input_names: Sequence[str], output_names: Sequence[str], source: str, header: str = "",
                 ensure_row_contiguous: bool = True, atomic_outputs: bool = False) -> MetalKernel:
    """A Metal kernel from its body, with MLX's ``mx.fast.metal_kernel`` arguments and signature generation.

    Args:
      name: the kernel's name (an identifier; the function is ``custom_kernel_<name>``).
      input_names, output_names: the buffer parameters, in order.
      source: the body of the kernel function. It names the inputs and outputs, ``<input>_shape``,
        ``<input>_strides`` (row-major element strides) and ``<input>_ndim`` when it needs them, and any MSL thread
        attribute (``thread_position_in_grid``, ``threads_per_threadgroup``, ``thread_index_in_simdgroup``, ...).
      header: code placed before the kernel (helper functions, structs).
      ensure_row_contiguous: accepted for MLX compatibility; TF tensors are always dense and row-major, so every
        input is row-contiguous whatever the value.
      atomic_outputs: outputs become ``device atomic_T*`` (T = float, int, uint); use with ``init_value``.

    The returned kernel is called as ``kernel(inputs, grid=(x, y, z), threadgroup=(x, y, z), output_shapes=[...],
    output_dtypes=[...], template=[("T", tf.float32), ("N", 4), ("flag", True)], init_value=None, verbose=False)``
    and returns a list of tensors. ``grid`` counts threads (dispatchThreads); ``grid``, ``threadgroup`` and each
    output shape take Python ints or scalar/1-D int tensors, so in a ``tf.function`` they may follow ``tf.shape``.

    Example:
      >>> import tensorflow as tf, tf_metal_ops
      >>> twice = tf_metal_ops.metal_kernel("twice", ["x"], ["y"], "uint i = thread_position_in_grid.x; y[i] = 2 * x[i];")
      >>> (y,) = twice(inputs=[tf.constant([1.0, 2.0, 3.0])], grid=(3, 1, 1), threadgroup=(32, 1, 1),
      ...               output_shapes=[(3,)], output_dtypes=[tf.float32])
      >>> y.numpy()
      array([2., 4., 6.], dtype=float32)
    """
    return MetalKernel(name, input_names, output_names, source, header, ensure_row_contiguous, atomic_outputs)
