"""Consent to compile a kernel source for the CPU: which TfmoMetalKernel sources this process may compile as C++ and
run (on the CPU and the emulated GPU).

A source is allowed when this process created it through ``metal_kernel(...)`` or ``compile_shader(...)``; when the
user trusted its SHA-256 (``trust_kernel``); or when the user allowed every source (``enable_unsafe_kernel_loading()``
or ``TF_METAL_OPS_UNSAFE_KERNEL_LOADING=1``). Anything else, a kernel from a SavedModel, a GraphDef or a restored
``tf.function``, is refused with ``KernelNotAllowed`` before it is compiled. The op library asks through the
inline compiler (build.py) on the first use of a source only, so a call pays nothing for it. Guide:
docs/security.md.
"""

from __future__ import annotations

import hashlib
import re
import threading

from tf_metal_ops import _env

_lock = threading.Lock()
_created: set[str] = set()  # SHA-256 of sources metal_kernel / compile_shader made in this process
_trusted: set[str] = set()  # SHA-256 the user trusted
_unsafe = [False]

_KERNEL_NAMES = re.compile(r"\bkernel\s+void\s+([A-Za-z_]\w*)")


class KernelNotAllowed(ValueError):
    """A kernel source from a graph that the user has not allowed this process to compile and run."""


def digest(source: str) -> str:
    """The SHA-256 of a kernel source (its UTF-8 bytes), in hex: what trust_kernel takes."""
    return hashlib.sha256(source.encode()).hexdigest()


def note_created(source: str) -> None:
    """Records a source this process made through metal_kernel / compile_shader (allowed from now on)."""
    d = digest(source)
    with _lock:
        _created.add(d)


def enable_unsafe_kernel_loading() -> None:
    """Lets this process compile and run every inline-kernel source, including those in a SavedModel, GraphDef or
    restored tf.function it did not create (``TF_METAL_OPS_UNSAFE_KERNEL_LOADING=1`` does the same). Such a kernel
    runs as native code in this process on the CPU and the emulated GPU: allow only models you trust as you trust
    Python code. Sources still pass the strict Metal-language check. See docs/security.md.

    Example:
      >>> import tf_metal_ops
      >>> tf_metal_ops.enable_unsafe_kernel_loading()  # every model's kernels may run from now on
    """
    _unsafe[0] = True


def trust_kernel(sha256: str) -> None:
    """Allows the one kernel source whose SHA-256 is ``sha256`` (64 hex digits, as the refusal of an untrusted kernel
    quotes it), in this process. Raises ValueError for anything that is not a SHA-256.

    Example:
      >>> import hashlib, tf_metal_ops
      >>> source = "kernel void k(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) { y[i] = 1; }"
      >>> tf_metal_ops.trust_kernel(hashlib.sha256(source.encode()).hexdigest())
    """
    if not isinstance(sha256, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", sha256.strip()):
        raise ValueError(f"tf_metal_ops.trust_kernel: expected the SHA-256 of a kernel source (64 hex digits), got "
                         f"{sha256!r}")
    with _lock:
        _trusted.add(sha256.strip().lower())


def unsafe_loading() -> bool:
    return _unsafe[0] or _env.unsafe_kernel_loading()


def check(source: str) -> None:
    """Raises KernelNotAllowed unless this process may compile `source` for the CPU."""
    if unsafe_loading():
        return
    d = digest(source)
    with _lock:
        if d in _created or d in _trusted:
            return
    names = ", ".join(dict.fromkeys(_KERNEL_NAMES.findall(source))) or "(none found)"
    raise KernelNotAllowed(
        f"refusing to compile a Metal kernel source this process did not create (kernels: {names}; source "
        f"SHA-256 {d}): it comes from a graph (a SavedModel, a GraphDef or a restored tf.function) and would run "
        "as native code in this process. If you trust the model, allow it with "
        f"tf_metal_ops.trust_kernel(\"{d}\") for this source, or with tf_metal_ops.enable_unsafe_kernel_loading() "
        f"(or {_env.UNSAFE_KERNEL_LOADING}=1) for every source in this process; see docs/security.md")
