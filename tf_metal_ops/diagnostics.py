"""What this installation can run: ``backend_info()``, and which CPU builds run: ``cpu_paths()``. Its former name
``tf_metal_ops.backend`` still imports this module, with a DeprecationWarning."""

from __future__ import annotations

import ctypes
import json
import platform
import sys

from tf_metal_ops import _env, _library
from tf_metal_ops._env import COMMUNITY_METAL_PLUGINS, community_metal_plugin  # noqa: F401 (part of this API)

# TensorFlow, and zero_out (which imports it), are imported in the functions that run a diagnostic.

# tensorflow-metal release -> TensorFlow versions it loads in (from its own PyPI description).
TENSORFLOW_METAL_SUPPORT = {
    "1.0": ((2, 13), (2, 13)),
    "1.1": ((2, 14), (2, 17)),
    "1.2": ((2, 18), (2, 19)),
}


def _tf_minor(v: str):
    parts = v.split(".")
    return int(parts[0]), int(parts[1])


def op_types(ops_module) -> list[str]:
    """Op type names in the library. TF generates the snake_case Python function of each CamelCase op type
    (``HashGridEncodeGradParams`` -> ``hash_grid_encode_grad_params``); this maps back, underscores dropped."""
    names = [n[len("_dispatcher_for_"):] for n in dir(ops_module) if n.startswith("_dispatcher_for_")]
    return sorted("".join(w[:1].upper() + w[1:] for w in n.split("_")) for n in names)


def _registered_kernels(op_type: str):
    try:
        from tensorflow.python.framework import kernels  # TF-internal, but stable since 1.x
    except ImportError:
        return None
    found = {}
    for k in kernels.get_registered_kernels_for_op(op_type).kernel:
        types = sorted(
            {__import__("tensorflow").dtypes.as_dtype(t).name
             for c in k.constraint for t in c.allowed_values.list.type}
        )
        found.setdefault(k.device_type, set()).update(types)
    return {dev: sorted(types) for dev, types in sorted(found.items())}


# ---- the TF >= 2.20 community Metal plugin (detected by _env.community_metal_plugin) ---------------------------
def community_plugin_reason(plugin) -> str:
    dist, version = plugin
    return (
        f"{dist} {version} is installed: its GPU stream is not tensorflow-metal's Objective-C stream protocol "
        "(a C++ struct and CPU-visible buffer addresses), which the Metal kernels need: ops placed on its GPU "
        "(TF's default when a GPU exists) fail with an op error; run them on their CPU kernels under "
        "tf.device('/CPU:0') (for Metal kernels use TensorFlow 2.18-2.19 with tensorflow-metal 1.2.0)"
    )


# ---- the GPU probe --------------------------------------------------------------------------------------------
PROBE_SIZE = 4096  # float32 elements: large enough that TF's eager placer keeps the op on the GPU


def probe_gpu(tf, zero_out, device: str = "/GPU:0"):
    """(ok, reason): runs ZeroOut on ``device`` with float32 data and checks where it ran and what it returned.
    TF's eager runtime keeps small int32 tensors (and ops that only consume them) on the CPU even under
    tf.device('/GPU:0'), so the probe uses float data and checks ``result.device``."""
    import numpy as np

    x = np.arange(1, PROBE_SIZE + 1, dtype=np.float32)
    try:
        with tf.device(device):
            y = zero_out(tf.constant(x))
            ran_on = y.device
        values = np.asarray(y.numpy())
    except Exception as e:  # the op reports why (stream protocol, library, pipeline)
        return False, f"a ZeroOut probe on {device} failed: {e}"
    if "device:GPU:" not in (ran_on or ""):  # e.g. /job:localhost/replica:0/task:0/device:GPU:0
        return False, f"a ZeroOut probe under tf.device('{device}') ran on {ran_on or 'an unknown device'}, not the GPU"
    expected = np.zeros_like(x)
    expected[0] = x[0]
    if values.shape != x.shape or not np.array_equal(values, expected):
        return False, (f"a ZeroOut probe on {ran_on} returned wrong values (first elements "
                       f"{values.ravel()[:4].tolist()}, expected {expected[:4].tolist()})")
    return True, f"a ZeroOut probe ran on {ran_on}"


def _metal_status(tf, build, system=None):
    """(usable, reason) for the Metal path of this process."""
    system = system or sys.platform
    if system != "darwin":
        return False, f"unusable: Metal needs macOS; this is {platform.system()} ({platform.machine()})"
    if not build.get("metal"):
        return False, "the op library was built without Metal kernels (build it on macOS with `pip install .`)"
    plugin = community_metal_plugin()
    if plugin is not None:
        return False, community_plugin_reason(plugin)
    tfm = _env.distribution_version("tensorflow-metal")
    if tfm is None:
        return False, "tensorflow-metal is not installed (pip install 'tf-metal-ops[metal]')"
    supported = TENSORFLOW_METAL_SUPPORT.get(".".join(tfm.split(".")[:2]))
    tfv = _tf_minor(tf.__version__)
    if supported and not (supported[0] <= tfv <= supported[1]):
        lo, hi = supported
        return False, (
            f"tensorflow-metal {tfm} supports TensorFlow {lo[0]}.{lo[1]}-{hi[0]}.{hi[1]}, "
            f"this is {tf.__version__}"
        )
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return False, "tensorflow-metal is installed but TensorFlow lists no GPU device"
    from tf_metal_ops.zero_out import zero_out

    ok, reason = probe_gpu(tf, zero_out)
    if not ok:
        return False, reason
    return True, f"Metal kernels run on {gpus[0].name} ({reason})"


# The CPU kernels built for several ISAs, and their builds in index order (csrc/common/isa_choice.h): name ->
# (the op library's diagnostics function tfmo_<family>_cpu_paths, the environment variable that picks a build,
# build names). "volume_render" is the render family's builds, which the render_packed kernels run too; its variable
# TF_METAL_OPS_RENDER_ISA is also read as TF_METAL_OPS_VOLUME_RENDER_ISA.
CPU_ISA_FAMILIES = {
    "hash_grid": ("tfmo_hash_grid_cpu_paths", "TF_METAL_OPS_HASH_GRID_ISA", ("default", "avx2")),
    "volume_render": ("tfmo_render_cpu_paths", "TF_METAL_OPS_RENDER_ISA", ("default", "avx2", "avx512")),
    "ray_march": ("tfmo_ray_march_cpu_paths", "TF_METAL_OPS_RAY_MARCH_ISA", ("default", "avx2")),
    "fused_mlp": ("tfmo_fused_mlp_cpu_paths", "TF_METAL_OPS_FUSED_MLP_ISA",
                  ("default", "avx2", "avx512", "avx512bf16", "amx")),
}
VOLUME_RENDER_ISAS = CPU_ISA_FAMILIES["volume_render"][2]


def cpu_paths(family: str | None = None) -> dict:
    """Which build of each CPU kernel family's loops runs in this process (one diagnostic for every op built per
    ISA): ``{family: paths}`` for the families of ``CPU_ISA_FAMILIES``, or the paths of one ``family``.

    A family's loops are compiled for the baseline ISA (``default``) and, on x86-64, for AVX2 (and AVX-512 for the
    volume render and the fused MLP, whose ``avx512bf16`` build runs its bfloat16 products with AVX512-BF16 and
    ``amx`` build with AMX-BF16 tiles); one
    build is chosen once per process: the best the CPU supports, or the one named by the family's
    variable (``TF_METAL_OPS_HASH_GRID_ISA``, ``TF_METAL_OPS_RENDER_ISA`` or ``TF_METAL_OPS_VOLUME_RENDER_ISA``,
    ``TF_METAL_OPS_RAY_MARCH_ISA``, ``TF_METAL_OPS_FUSED_MLP_ISA``: a build name or ``auto``; a build the CPU cannot run falls back to the best lower one, with a message on stderr;
    ``TF_METAL_OPS_NO_AVX2`` is an alias of ``TF_METAL_OPS_HASH_GRID_ISA=default``). ``paths`` holds ``built`` and
    ``supported`` (lists of build names), ``selected``, ``requested`` (None when unset or ``auto``, ``"?"`` for an
    unknown name), ``fell_back`` (the request could not be honoured), ``variable`` and ``calls`` (loop calls so far
    per build: a diagnostic that proves which build produced a result). The builds give bitwise identical results,
    but for the fused MLP's ``amx`` build with ``products="bfloat16"`` (docs/fused_mlp.md)."""
    if family is None:
        return {f: cpu_paths(f) for f in CPU_ISA_FAMILIES if hasattr(_library.native(), CPU_ISA_FAMILIES[f][0])}
    symbol, variable, names = CPU_ISA_FAMILIES[family]
    fn = getattr(_library.native(), symbol)  # TFMO_ISA_DIAGNOSTICS (csrc/common/isa_choice.h)
    p_int = ctypes.POINTER(ctypes.c_int)
    fn.argtypes, fn.restype = [ctypes.POINTER(ctypes.c_longlong), p_int, p_int, p_int, p_int, p_int], None
    calls = (ctypes.c_longlong * len(names))()
    built, supported, selected, requested, fell_back = (ctypes.c_int() for _ in range(5))
    fn(calls, ctypes.byref(built), ctypes.byref(supported), ctypes.byref(selected), ctypes.byref(requested),
       ctypes.byref(fell_back))
    req = requested.value
    return {"built": [n for i, n in enumerate(names) if built.value >> i & 1],
            "supported": [n for i, n in enumerate(names) if supported.value >> i & 1],
            "selected": names[selected.value],
            "requested": None if req == -1 else ("?" if req == -2 else names[req]),
            "fell_back": bool(fell_back.value),
            "variable": variable,
            "calls": {n: int(calls[i]) for i, n in enumerate(names)}}


def volume_render_cpu_paths() -> dict:
    """``cpu_paths("volume_render")`` (the ray loops of volume_render and volume_render_packed, forward and gradient)
    without its ``variable`` entry."""
    p = cpu_paths("volume_render")
    del p["variable"]
    return p


def backend_info() -> dict:
    """TF version, library path and build, registered kernels per op and device, and whether Metal is usable
    (with the reason when it is not). Never raises: problems are reported in the result."""
    import tensorflow as tf

    info = {
        "tensorflow": tf.__version__,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "tensorflow_metal": _env.distribution_version("tensorflow-metal"),
        "community_metal_plugin": (lambda p: f"{p[0]} {p[1]}" if p else None)(community_metal_plugin()),
        "devices": [d.name for d in tf.config.list_physical_devices()],
    }
    try:
        info["library_path"] = _library.library_path()
        module = _library.ops()
        build = json.loads(_library.native().tfmo_build_info().decode())
        info["library_loaded"], info["library_error"] = True, None
    except Exception as e:
        info["library_loaded"], info["library_error"] = False, str(e)
        info["metal_usable"], info["metal_reason"] = False, "the op library did not load"
        return info
    info["build"] = build
    if hasattr(_library.native(), "tfmo_metal_info"):  # Metal device, GPU family, metallib location
        info["metal_device"] = json.loads(_library.native().tfmo_metal_info().decode())
    info["num_threads"] = int(_library.native().tfmo_get_num_threads())
    info["cpu_paths"] = {family: p["selected"] for family, p in cpu_paths().items()}
    info["kernels"] = {op: _registered_kernels(op) for op in op_types(module)}
    info["metal_usable"], info["metal_reason"] = _metal_status(tf, build)
    info["emulated_gpu"] = _emulated_gpu_status(tf)
    info["gpu_backend"] = _gpu_backend(info)
    return info


def _gpu_backend(info: dict) -> str | None:
    """Which backend executes the GPU kernels in this process: "metal" (csrc/metal: on a Mac, or on the emulated GPU
    over the Apple doubles of dev/apple_doubles), "direct" (the emulated GPU's own backend, TF_METAL_OPS_EMULATED_GPU=1),
    or None (no GPU kernels run)."""
    emulated = info.get("emulated_gpu", {})
    if emulated.get("enabled"):
        return emulated.get("backend")
    return "metal" if info.get("metal_usable") else None


def _emulated_gpu_status(tf) -> dict:
    """tf_metal_ops.emulated_gpu.info(), plus a GPU probe when the emulated GPU is enabled in this process. The
    emulated GPU's module is imported only when this process asked for it."""
    not_enabled = ("not enabled (set TF_METAL_OPS_EMULATED_GPU=1 before importing tf_metal_ops; "
                   "Linux development and tests only)")
    if "tf_metal_ops.emulated_gpu" not in sys.modules and _env.emulated_gpu_request() is None:
        return {"requested": False, "enabled": False, "backend": None, "usable": False, "reason": not_enabled}
    try:
        from tf_metal_ops import emulated_gpu

        out = emulated_gpu.info()
        if out.get("enabled"):
            from tf_metal_ops.zero_out import zero_out

            out["usable"], out["reason"] = probe_gpu(tf, zero_out)
        else:
            out["usable"] = False
            out["reason"] = not_enabled
        return out
    except Exception as e:  # never raise
        return {"usable": False, "reason": f"emulated GPU status failed: {e}"}
