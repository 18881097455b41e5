"""What this installation can run: ``backend_info()``."""

from __future__ import annotations

import importlib.metadata
import json
import platform
import sys

# tensorflow-metal release -> TensorFlow versions it loads in (from its own PyPI description).
TENSORFLOW_METAL_SUPPORT = {
    "1.0": ((2, 13), (2, 13)),
    "1.1": ((2, 14), (2, 17)),
    "1.2": ((2, 18), (2, 19)),
}


def _version(dist: str):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _tf_minor(v: str):
    parts = v.split(".")
    return int(parts[0]), int(parts[1])


def op_types(ops_module) -> list[str]:
    """Op type names in the library (convention: Python name with a capital first letter)."""
    names = [n[len("_dispatcher_for_"):] for n in dir(ops_module) if n.startswith("_dispatcher_for_")]
    return sorted(n[0].upper() + n[1:] for n in names)


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


def _metal_status(tf, build):
    """(usable, reason) for the Metal path of this process."""
    if sys.platform != "darwin":
        return False, f"Metal needs macOS; this is {platform.system()} ({platform.machine()})"
    if not build.get("metal"):
        return False, "the op library was built without Metal kernels (build it on macOS with `pip install .`)"
    tfm = _version("tensorflow-metal")
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

    try:
        with tf.device("/GPU:0"):
            y = zero_out(tf.constant([3, 4], tf.int32))
        if y.numpy().tolist() != [3, 0] or "GPU" not in y.device:
            return False, f"a ZeroOut probe on the GPU returned {y.numpy().tolist()} on {y.device}"
    except Exception as e:  # the op reports why (stream protocol, library, pipeline)
        return False, f"a ZeroOut probe on the GPU failed: {e}"
    return True, "Metal kernels run on " + gpus[0].name


def hash_grid_cpu_paths() -> dict:
    """Which build of the hash-grid CPU loops runs in this process: ``avx2_built`` (an AVX2+FMA build is compiled
    in), ``avx2_selected`` (the CPU has AVX2+FMA and ``TF_METAL_OPS_NO_AVX2`` is unset), and the number of loop
    calls so far that ran the ``baseline_calls`` / ``avx2_calls`` build (a diagnostic: tests use it to prove
    which path produced a result). Both builds give bitwise identical results."""
    import ctypes

    from tf_metal_ops import _library

    base, avx2 = ctypes.c_longlong(), ctypes.c_longlong()
    built, selected = ctypes.c_int(), ctypes.c_int()
    _library.native().tfmo_hash_grid_cpu_paths(ctypes.byref(base), ctypes.byref(avx2), ctypes.byref(built),
                                               ctypes.byref(selected))
    return {"avx2_built": bool(built.value), "avx2_selected": bool(selected.value),
            "baseline_calls": int(base.value), "avx2_calls": int(avx2.value)}


def backend_info() -> dict:
    """TF version, library path and build, registered kernels per op and device, and whether Metal is usable
    (with the reason when it is not). Never raises: problems are reported in the result."""
    import tensorflow as tf

    from tf_metal_ops import _library

    info = {
        "tensorflow": tf.__version__,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "tensorflow_metal": _version("tensorflow-metal"),
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
    if hasattr(_library.native(), "tfmo_hash_grid_cpu_paths"):
        info["hash_grid_cpu_path"] = "avx2" if hash_grid_cpu_paths()["avx2_selected"] else "baseline"
    info["kernels"] = {op: _registered_kernels(op) for op in op_types(module)}
    info["metal_usable"], info["metal_reason"] = _metal_status(tf, build)
    return info
