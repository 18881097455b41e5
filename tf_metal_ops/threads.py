"""The CPU kernels' thread pool (the project's own: TF's intra-op pool is not reachable from the C API)."""

from __future__ import annotations

import contextlib
import ctypes

from tf_metal_ops._library import native


def get_num_threads() -> int:
    """Threads the CPU kernels use (default: TF_METAL_OPS_NUM_THREADS, else the CPUs this process may use)."""
    return int(native().tfmo_get_num_threads())


def set_num_threads(n: int) -> None:
    """Sets the CPU kernels' thread count; ``n <= 0`` restores the default."""
    if not isinstance(n, int) or isinstance(n, bool):
        raise ValueError(f"set_num_threads: n must be an int, got {n!r}")
    native().tfmo_set_num_threads(n)


@contextlib.contextmanager
def num_threads(n: int):
    """Context manager that sets the thread count and restores the previous one."""
    previous = get_num_threads()
    set_num_threads(n)
    try:
        yield
    finally:
        set_num_threads(previous)


def parallel_for_stats() -> dict:
    """Totals since the op library loaded, for tests and profiling: ``ranges`` (how many ranges the CPU kernels'
    parallel loops have run) and ``items`` (the items those ranges covered together; bytes for zero_out)."""
    ranges, items = ctypes.c_longlong(), ctypes.c_longlong()
    native().tfmo_parallel_for_stats(ctypes.byref(ranges), ctypes.byref(items))
    return {"ranges": int(ranges.value), "items": int(items.value)}
