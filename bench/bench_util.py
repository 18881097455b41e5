"""Helpers shared by the bench/ scripts (each run as `python bench/<script>.py`, so this folder is on sys.path)."""

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
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


def interleaved_ms(fns, rounds, warmup=2):
    """{key: (median, min)} wall time in ms of each fns[key]() over `rounds` rounds, each round calling every
    function once in turn (interleaved: load from elsewhere on the machine spreads over all of them), after `warmup`
    calls of each. Every tensor a function returns is fetched (.numpy()), as in median_ms."""
    import tensorflow as tf

    def run(fn):
        for v in tf.nest.flatten(fn()):
            v.numpy()

    for fn in fns.values():
        for _ in range(warmup):
            run(fn)
    times = {key: [] for key in fns}
    for _ in range(rounds):
        for key, fn in fns.items():
            t0 = time.perf_counter()
            run(fn)
            times[key].append((time.perf_counter() - t0) * 1e3)
    return {key: (statistics.median(t), min(t)) for key, t in times.items()}


def rays_toward(origins, targets):
    """(origins, unit directions from them towards targets), float32 tensors: [R, 3] each."""
    import numpy as np
    import tensorflow as tf

    d = np.asarray(targets, np.float64) - origins
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    return tf.constant(origins, tf.float32), tf.constant(d, tf.float32)


def time_emulated_call(device, fn, repeats):
    """(the outputs of a warm-up call, {"median_s", "min_s", "max_s"} of `repeats` calls) of fn() under
    tf.device(device), in a process running the emulated GPU: each call waits for it (its ops return before their
    kernels ran) and fetches every output (on the GPU the copy back is part of a call's cost in practice)."""
    import tensorflow as tf

    from tf_metal_ops import emulated_gpu

    def once():
        with tf.device(device):
            out = fn()
        emulated_gpu.synchronize()
        for x in tf.nest.flatten(out):
            x.numpy()
        return out

    out = once()  # warm-up: tracing, pipelines, scratch
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    return out, {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}


def seconds_cell(stats):
    """"median (min..max)" of time_emulated_call's statistics, for a table cell."""
    return f"{stats['median_s']:.4f} ({stats['min_s']:.4f}..{stats['max_s']:.4f})"


def run_emulated_worker(script, args, prefix):
    """Runs `script --worker OUT *args` in a subprocess with the emulated GPU switched on (TensorFlow must see the
    switch before it initialises its devices): (its JSON result, or None when it failed, and the CompletedProcess)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        out = os.path.join(tmp, "worker.json")
        env = dict(os.environ, TF_METAL_OPS_EMULATED_GPU="1")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        res = subprocess.run([sys.executable, os.path.abspath(script), "--worker", out, *args], env=env, cwd=tmp,
                             capture_output=True, text=True)
        if res.returncode != 0:
            return None, res
        with open(out) as f:
            return json.load(f), res


def markdown_table(columns, rows):
    """A Markdown table: a header of `columns`, then one line per row (cells formatted with str)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def require_emulated_gpu():
    """tf_metal_ops.emulated_gpu, in a worker process that runs it (run_emulated_worker), else SystemExit."""
    from tf_metal_ops import emulated_gpu

    if not emulated_gpu.enabled():
        raise SystemExit("the emulated GPU is not enabled (TF_METAL_OPS_EMULATED_GPU=1 must be set before TF starts)")
    return emulated_gpu


def emulated_workers(default):
    """The emulated GPU's worker-thread setting of this process, or `default` when unset."""
    return os.environ.get("TF_METAL_OPS_EMULATED_GPU_WORKERS") or os.environ.get("MSL_EMU_WORKERS") or default


def write_json(path, report):
    """Writes `report` to `path` (indented JSON) when a path is given (the scripts' --json)."""
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
