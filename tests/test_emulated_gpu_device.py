"""The emulated Metal GPU PluggableDevice (csrc/emulated_gpu/, entry point se_plugin.cc): built warning-free, registered in
TensorFlow as /GPU:0, exact host<->device round trips, stream-ordered frees, trapping device memory, and the emulated
stream protocol (csrc/emulated_gpu/emu_stream.h) checked natively (tests/native/emulated_device_test.cc).

Every scenario runs in its own process (a PluggableDevice is loaded once per process, before the first op), with a
timeout. Helpers: tests/support/emulated_gpu_device_build.py.
"""

import json
import shutil
import subprocess

import pytest

from support import emulated_gpu_device_build as edb

TIMEOUT = 60


@pytest.fixture(scope="session")
def plugin():
    return edb.build_plugin()


@pytest.fixture(scope="session")
def native_test():
    return edb.build_native_test()


def _check(run: subprocess.CompletedProcess, marker: str = "OK"):
    assert run.returncode == 0, f"exit {run.returncode}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr[-6000:]}"
    assert marker in run.stdout, run.stdout + run.stderr[-3000:]


# --- build -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("compiler", ["g++", "clang++-16"])
def test_plugin_builds_warning_free(compiler, tmp_path):
    path = shutil.which(compiler)
    if path is None:
        pytest.skip(f"{compiler} not on PATH")
    so = edb.build_plugin(path, out_dir=tmp_path)  # -Wall -Wextra -Werror; any compiler output is a failure
    syms = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True, check=True).stdout
    for name in ("SE_InitPlugin", "tfmo_emu_device_stats", "tfmo_emu_device_check_leaks"):
        assert f" T {name}\n" in syms, f"{name} not exported with default visibility"


def test_plugin_sources_match_the_package_build():
    """The helper builds what tf_metal_ops.emulated_gpu builds (read from its source: no package import here)."""
    import ast

    tree = ast.parse((edb.REPO / "tf_metal_ops" / "emulated_gpu" / "__init__.py").read_text())
    listed = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                  and any(getattr(t, "id", None) == "DEVICE_SOURCES" for t in n.targets))
    assert [p.name for p in edb.PLUGIN_SOURCES] == list(listed)
    assert all(p.is_file() for p in edb.PLUGIN_SOURCES)


# --- native: the StreamExecutor C API and the emulated stream protocol ---------------------------------------------
@pytest.mark.parametrize("scenario", ["memory", "fault", "ordering", "failure", "deferred_free", "events"])
def test_native_scenario(plugin, native_test, scenario):
    run = subprocess.run([str(native_test), str(plugin), scenario], capture_output=True, text=True, timeout=TIMEOUT,
                         env={"TF_METAL_OPS_EMULATED_GPU_MEMORY_MB": "64", "TF_CPP_MIN_LOG_LEVEL": "2", "PATH": "/usr/bin:/bin"})
    _check(run, f"PASS {scenario}")


def test_native_scenarios_under_thread_sanitizer(clang16, tmp_path):
    flags = ("-g", "-fsanitize=thread")
    so = edb.build_plugin(clang16, extra_flags=flags)
    exe = edb.build_native_test(clang16, extra_flags=flags)
    for scenario in ["ordering", "failure", "deferred_free", "events"]:
        run = subprocess.run([str(exe), str(so), scenario], capture_output=True, text=True, timeout=TIMEOUT,
                             env={"TF_METAL_OPS_EMULATED_GPU_MEMORY_MB": "64", "TF_CPP_MIN_LOG_LEVEL": "2",
                                  "TSAN_OPTIONS": "halt_on_error=1", "PATH": "/usr/bin:/bin"})
        _check(run, f"PASS {scenario}")
        assert "WARNING: ThreadSanitizer" not in run.stderr, run.stderr[-6000:]


# --- inside TensorFlow -------------------------------------------------------------------------------------------------
STATS = """
import ctypes, json
_lib = ctypes.CDLL(os.environ["TFMO_EMU_DEVICE_PLUGIN"])
_lib.tfmo_emu_device_stats.restype = ctypes.c_char_p
_lib.tfmo_emu_device_check_leaks.restype = ctypes.c_int64
def stats():
    return json.loads(_lib.tfmo_emu_device_stats())
"""


def test_gpu_device_listed(plugin):
    run = edb.run_with_plugin(plugin, """
import tensorflow as tf
gpus = tf.config.list_physical_devices("GPU")
assert [d.name for d in gpus] == ["/physical_device:GPU:0"], gpus
details = tf.config.experimental.get_device_details(gpus[0])
print("OK", details)
""", timeout=TIMEOUT)
    _check(run)


def test_round_trips_exact(plugin):
    run = edb.run_with_plugin(plugin, STATS + """
import numpy as np, tensorflow as tf
rng = np.random.default_rng(0)
dtypes = [np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8, np.int8, np.uint16, np.bool_,
          np.complex64]
count = 0
for dt in dtypes:
    for shape in [(0,), (1,), (7,), (3, 5), (1 << 20,), (0, 4)]:
        n = int(np.prod(shape))
        if dt is np.bool_:
            x = rng.integers(0, 2, n).astype(bool).reshape(shape)
        elif np.issubdtype(dt, np.complexfloating):
            x = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt).reshape(shape)
        elif np.issubdtype(dt, np.floating):
            x = rng.standard_normal(n).astype(dt).reshape(shape)
            if n > 3:
                x.flat[:3] = [np.nan, np.inf, -0.0]
        else:
            info = np.iinfo(dt)
            x = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True).reshape(shape)
        with tf.device("/GPU:0"):
            y = tf.identity(tf.constant(x))
            z = tf.identity(y)
        assert y.device.endswith("GPU:0"), (dt, shape, y.device)
        for t in (y, z):
            got = t.numpy()
            assert got.dtype == x.dtype and got.shape == x.shape, (dt, shape)
            assert got.tobytes() == x.tobytes(), (dt, shape)  # bit-exact (NaN payloads, -0.0)
        count += 1
# float data on the device is really in device memory: the plugin allocated it
s = stats()
assert s["total_allocations"] > 0 and s["failed_allocations"] == 0 and s["bad_frees"] == 0, s
assert all(st["error"] is None for st in s["streams"]), s
assert sum(st["items_run"] for st in s["streams"]) > 0, s
print("OK", count)
""", timeout=TIMEOUT)
    _check(run)


def test_variables_on_device(plugin):
    run = edb.run_with_plugin(plugin, STATS + """
import numpy as np, tensorflow as tf
with tf.device("/GPU:0"):
    v = tf.Variable(np.arange(1000, dtype=np.float32))
    w = tf.Variable(np.full((17, 3), -2.5, np.float64))
assert v.device.endswith("GPU:0") and w.device.endswith("GPU:0"), (v.device, w.device)
assert np.array_equal(v.numpy(), np.arange(1000, dtype=np.float32))
assert np.array_equal(w.read_value().numpy(), np.full((17, 3), -2.5))
with tf.device("/GPU:0"):
    v.assign(np.linspace(0, 1, 1000, dtype=np.float32))
assert np.array_equal(v.numpy(), np.linspace(0, 1, 1000, dtype=np.float32))
@tf.function
def read_twice():
    return tf.identity(v) , tf.identity(v.read_value())
a, b = read_twice()
assert np.array_equal(a.numpy(), b.numpy())
print("OK")
""", timeout=TIMEOUT)
    _check(run)


def test_many_allocations_are_freed(plugin):
    run = edb.run_with_plugin(plugin, STATS + """
import gc, numpy as np, tensorflow as tf
x = np.arange(4096, dtype=np.float32)
with tf.device("/GPU:0"):
    warm = tf.identity(x)
del warm
gc.collect()
base = stats()
for i in range(400):
    n = 1 + (i * 97) % 5000
    with tf.device("/GPU:0"):
        t = tf.identity(x[:n])
        u = tf.identity(t)
    if i % 50 == 0:
        assert np.array_equal(u.numpy(), x[:n])
    del t, u
gc.collect()
leaked = _lib.tfmo_emu_device_check_leaks()  # waits for every stream, then counts what is still held
s = stats()
assert s["total_allocations"] - base["total_allocations"] >= 400, (base, s)
assert s["live_allocations"] <= base["live_allocations"], (base, s)
assert s["deferred_frees_pending"] == 0 and s["held_bytes"] == s["live_bytes"], s
assert leaked == s["live_allocations"], (leaked, s)
assert s["bad_frees"] == 0 and s["failed_allocations"] == 0, s
print("OK", s["total_allocations"], s["live_allocations"])
""", timeout=TIMEOUT)
    _check(run)


def test_allocation_beyond_limit_fails_cleanly(plugin):
    run = edb.run_with_plugin(plugin, STATS + """
import numpy as np, tensorflow as tf
big = np.ones((32 << 20) // 4, np.float32)  # 32 MiB > the 16 MiB device
try:
    with tf.device("/GPU:0"):
        tf.identity(big).numpy()
    raise SystemExit("allocation beyond the limit succeeded")
except tf.errors.OpError as e:
    print("refused:", type(e).__name__)
assert stats()["failed_allocations"] >= 1
assert stats()["memory_limit_bytes"] == 16 << 20
with tf.device("/GPU:0"):
    small = tf.identity(np.arange(10, dtype=np.float32))
assert np.array_equal(small.numpy(), np.arange(10, dtype=np.float32))
print("OK")
""", env={"TF_METAL_OPS_EMULATED_GPU_MEMORY_MB": "16"}, timeout=TIMEOUT)
    _check(run)


def test_stats_json_is_valid(plugin):
    run = edb.run_with_plugin(plugin, STATS + """
import tensorflow as tf
with tf.device("/GPU:0"):
    tf.identity([1.0, 2.0]).numpy()
s = stats()
for key in ("live_allocations", "live_bytes", "total_allocations", "deferred_frees_pending", "streams"):
    assert key in s, key
assert s["reserved_address_bytes"] >= 16 << 30, s
print("OK", len(s["streams"]))
""", timeout=TIMEOUT)
    _check(run)
