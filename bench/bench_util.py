"""Helpers shared by the bench/ scripts (each run as `python bench/<script>.py`, so this folder is on sys.path)."""

import platform
import statistics
import time


def cpu_model():
    """The CPU's model name, for report headers (ratios differ between CPU models)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine() or "unknown CPU"


def median_ms(fn, repeats, warmup=2):
    """(median, min) wall time in ms of fn() over `repeats` calls after `warmup` calls. Every tensor fn returns is
    fetched (.numpy()), so the time includes the work TensorFlow may still be doing asynchronously."""
    import tensorflow as tf

    def run():
        for v in tf.nest.flatten(fn()):
            v.numpy()

    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)
