"""Inline Metal kernels (tf_metal_ops.metal_kernel, compile_shader; docs/metal_kernels.md): every check of
tests/support/metal_kernel_checks.py on /CPU:0 (here) and on the emulated /GPU:0 (one subprocess), the errors, bounds
checks, a SavedModel reloaded in a new process, and the disk cache shared between processes.

The CPU path compiles kernels with clang++ >= 16 like the other native checks: skips without it, fails under
TFMO_REQUIRE_MAC_CHECKS=1 (CI).
"""

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from support import metal_kernel_checks as checks
from support import scripts

HERE = os.path.dirname(os.path.abspath(__file__))
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONWARNINGS": "ignore"}


@pytest.fixture(scope="module", autouse=True)
def compiler(clang16):
    os.environ.setdefault("TF_METAL_OPS_CLANGXX", clang16)
    return clang16


def run_python(code, env=None, timeout=900):
    full = dict(os.environ, **QUIET, **(env or {}))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full,
                          timeout=timeout, cwd=HERE)


@pytest.mark.parametrize("name", list(checks.CHECKS))
def test_on_cpu(name):
    checks.CHECKS[name]("/CPU:0")


def test_on_the_emulated_gpu(gpu_backend):
    """Under both GPU backends (conftest.gpu_backend): inline kernels compile through msl_emu in the emulated
    backend, and through the Apple doubles' newLibraryWithSource: under csrc/metal/*.mm."""
    env = {**os.environ, **QUIET, **gpu_backend[1]}
    r = scripts.run("metal_kernel_checks", "/GPU:0", env=env, timeout=1800)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    lines = r.stdout.splitlines()
    assert lines[-1] == "ok all" and all(f"ok {n}" in lines for n in checks.CHECKS), r.stdout


# ---- errors: clear exceptions, and the process goes on -----------------------------------------------------------
def _exp():
    import tf_metal_ops as t

    return t.metal_kernel("myexp", ["inp"], ["out"], checks.EXP)


def _call(k, x, **kw):
    import tensorflow as tf

    args = dict(inputs=[x], template=[("T", tf.float32)], grid=(4, 1, 1), threadgroup=(4, 1, 1),
                output_shapes=[(4,)], output_dtypes=[tf.float32])
    args.update(kw)
    return k(**args)


def test_argument_errors_are_value_errors():
    import tensorflow as tf

    import tf_metal_ops as t

    k, x = _exp(), tf.ones([4])
    with pytest.raises(ValueError, match="2 inputs given for the 1 input names"):
        _call(k, x, inputs=[x, x])
    with pytest.raises(ValueError, match="dtype complex64 is not supported"):
        _call(k, tf.ones([4], tf.complex64))
    with pytest.raises(ValueError, match="2 output shapes for 1 outputs"):
        _call(k, x, output_shapes=[(4,), (4,)])
    with pytest.raises(ValueError, match="2 output dtypes for the 1 output names"):
        _call(k, x, output_dtypes=[tf.float32, tf.float32])
    with pytest.raises(ValueError, match="over the limit of 1024 threads per threadgroup"):
        _call(k, x, threadgroup=(64, 32, 1))
    with pytest.raises(ValueError, match="each dimension must be in 0 .. 4294967295"):
        _call(k, x, grid=(2**32, 1, 1))
    with pytest.raises(ValueError, match="negative dimension"):
        _call(k, x, output_shapes=[(-1,)])
    with pytest.raises(ValueError, match="template argument T = 'x'"):
        _call(k, x, template=[("T", "x")])
    names = [f"x{i}" for i in range(31)]
    wide = t.metal_kernel("wide", names, ["out"], "out[0] = 1;")
    with pytest.raises(ValueError, match="32 buffers .* more than Metal's 31"):
        wide(inputs=[x] * 31, grid=(1, 1, 1), threadgroup=(1, 1, 1), output_shapes=[(1,)],
             output_dtypes=[tf.float32])
    with pytest.raises(ValueError, match="must be an identifier"):
        t.metal_kernel("not a name", ["x"], ["y"], "y[0] = x[0];")
    with pytest.raises(ValueError, match="atomic output y is float16"):
        t.metal_kernel("at", ["x"], ["y"], "y[0] = x[0];", atomic_outputs=True)(
            inputs=[x], grid=(1, 1, 1), threadgroup=(1, 1, 1), output_shapes=[(1,)], output_dtypes=[tf.float16])
    (y,) = _call(k, x)  # the process goes on
    np.testing.assert_allclose(y.numpy(), np.e, rtol=2e-6)


def test_dynamic_launch_errors_come_from_the_kernel():
    import tensorflow as tf

    k = _exp()

    @tf.function
    def f(x, g, tg):
        return _call(k, x, grid=(g, 1, 1), threadgroup=(tg, 1, 1))[0]

    x = tf.ones([4])
    with pytest.raises(tf.errors.InvalidArgumentError, match="each dimension must be in 0 .. 4294967295"):
        f(x, tf.constant(2**32, tf.int64), tf.constant(4, tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="is 2048 threads, over the limit of 1024"):
        f(x, tf.constant(4, tf.int64), tf.constant(2048, tf.int64))
    np.testing.assert_allclose(f(x, tf.constant(4, tf.int64), tf.constant(4, tf.int64)).numpy(), np.e, rtol=2e-6)


def test_eager_calls_run_a_registered_call_and_graphs_hold_the_full_op():
    """An eager call with a static launch runs TfmoMetalKernelCall (its attrs registered once in this process); a
    tf.function's graph (what a SavedModel stores) holds TfmoMetalKernel with every attr."""
    import tensorflow as tf

    k, x = _exp(), tf.ones([4])
    (y,) = _call(k, x)
    np.testing.assert_allclose(y.numpy(), np.e, rtol=2e-6)
    (inst, _), = k._calls.values()
    token = inst.call_attrs[-1]
    assert inst.tin == ("float32",) and token > 0
    _call(k, 2 * x)
    assert inst.call_attrs[-1] == token and len(k._calls) == 1  # the same registered call
    graph = tf.function(lambda v: _call(k, v)[0]).get_concrete_function(tf.TensorSpec([4])).graph
    types = {op.type for op in graph.get_operations()}
    assert "TfmoMetalKernel" in types and "TfmoMetalKernelCall" not in types, types


def test_a_call_not_registered_in_this_process_is_refused():
    """TfmoMetalKernelCall names its attrs by a random token of this process: any other token (a graph written
    elsewhere, a guess) is an InvalidArgumentError, and so are dtypes other than those registered."""
    import tensorflow as tf

    from tf_metal_ops import _library

    raw, x = _library.ops(), tf.ones([4])
    with pytest.raises(tf.errors.InvalidArgumentError, match="call 12345 is not registered in this process"):
        raw.tfmo_metal_kernel_call(inputs=[x], Tout=[tf.float32], call=12345)
    k = _exp()
    _call(k, x)
    (inst, _), = k._calls.values()
    token = inst.call_attrs[-1]
    with pytest.raises(tf.errors.InvalidArgumentError, match="other dtypes than Tin / Tout"):
        raw.tfmo_metal_kernel_call(inputs=[tf.ones([4], tf.int32)], Tout=[tf.float32], call=token)
    (y,) = raw.tfmo_metal_kernel_call(inputs=[x], Tout=[tf.float32], call=token)
    np.testing.assert_allclose(y.numpy(), np.e, rtol=2e-6)


def test_compile_errors_quote_the_users_lines():
    import tensorflow as tf

    import tf_metal_ops as t

    k = t.metal_kernel("broken", ["x"], ["y"], header="float twice(float v) { return 2 * v }\n", source="""
        uint i = thread_position_in_grid.x;
        y[i] = twice(undefined_name);
    """)
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        k(inputs=[tf.ones([4])], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
          output_dtypes=[tf.float32])
    msg = e.value.message
    assert "broken:header:1:" in msg and "expected ';'" in msg, msg
    assert "broken:source:3:" in msg and "undefined_name" in msg, msg
    assert "kernel.metal" not in msg and ".build-" not in msg, msg  # no generated-file paths
    assert msg.count("undefined_name'") == 1, msg  # reported once
    (y,) = _call(_exp(), tf.ones([4]))
    np.testing.assert_allclose(y.numpy(), np.e, rtol=2e-6)


# (name, body, what the message must hold): sources msl_emu alone would run (valid C++), which Apple's compiler
# rejects: MSL has no double; the SIMD-group and/or/xor take integers only.
STRICT_REJECTS = [
    ("strict", "double d = x[i];\n        y[i] = float(d);",
     ["strict Metal-language check", "strict:source:2:", "[double]"]),
    ("simd_types", "float v = x[i];\n        y[i] = simd_and(v);",
     ["simd_types:source:3:", "no matching function for call to 'simd_and'"]),
]


@pytest.mark.parametrize("name,body,expected", STRICT_REJECTS, ids=[c[0] for c in STRICT_REJECTS])
def test_what_apples_compiler_rejects_fails_here_too(name, body, expected):
    import tensorflow as tf

    import tf_metal_ops as t

    k = t.metal_kernel(name, ["x"], ["y"], "uint i = thread_position_in_grid.x;\n        " + body)
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        k(inputs=[tf.ones([4])], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
          output_dtypes=[tf.float32])
    for needle in expected:
        assert needle in e.value.message, e.value.message


def test_divergent_simd_group_calls_end_the_process_naming_kernel_and_thread():
    r = run_python("""
        import tensorflow as tf, tf_metal_ops as t
        k = t.metal_kernel("simd_split", ["x"], ["y"], '''
            uint i = thread_position_in_grid.x;
            y[i] = i == 5 ? simd_sum(x[i]) : simd_max(x[i]);
        ''')
        k(inputs=[tf.ones([64])], grid=(64, 1, 1), threadgroup=(64, 1, 1), output_shapes=[(64,)],
          output_dtypes=[tf.float32])
        print("not reached")
    """)
    assert r.returncode == 70 and "not reached" not in r.stdout, (r.returncode, r.stderr[-3000:])
    assert "kernel custom_kernel_simd_split: divergent SIMD-group function: in threadgroup (0,0,0), SIMD group 0, " \
           "thread 0 (index in group) is in simd_max at simd_split:source:3:" in r.stderr, r.stderr[-3000:]
    assert "while thread 5 is in simd_sum at simd_split:source:3:" in r.stderr, r.stderr[-3000:]


# Three kernels in one source: `total` reaches simd_sum through a helper (fibers), `scale` calls nothing of the kind
# (the fast path's loop), `pasted` calls a barrier whose name the analysis cannot see (pasted from pieces), so it runs
# on the fast path and must end the process there with the fast path's error.
FIBER_SHADER = """
#include <metal_stdlib>
using namespace metal;
#define TFMO_PASTE(a, b) a##b
inline float group_total(float v) { return simd_sum(v); }
kernel void total(const device float* x [[buffer(0)]], device float* y [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  y[i] = group_total(x[i]);
}
kernel void scale(const device float* x [[buffer(0)]], device float* y [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  y[i] = 2.0f * x[i];
}
kernel void pasted(const device float* x [[buffer(0)]], device float* y [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  y[i] = x[i];
  TFMO_PASTE(threadgroup_bar, rier)(mem_flags::mem_device);
}
"""


def test_fiber_use_is_per_kernel_in_an_inline_source():
    import ctypes

    from tf_metal_ops.inline_kernels import build

    class Entry(ctypes.Structure):  # TfmoInlineKernel (csrc/common/inline_kernel_abi.h), up to needs_fibers
        _fields_ = [("abi_version", ctypes.c_uint32), ("kernel", ctypes.c_char_p), ("needs_fibers", ctypes.c_int)]

    lib = ctypes.CDLL(str(build.compile(FIBER_SHADER, checked=False)))
    lib.tfmo_inline_kernel.restype = ctypes.POINTER(Entry)
    flags = {n: lib.tfmo_inline_kernel(n.encode()).contents.needs_fibers for n in ("total", "scale", "pasted")}
    assert flags == {"total": 1, "scale": 0, "pasted": 0}
    r = run_python(f"""
        import numpy as np, tensorflow as tf, tf_metal_ops as t
        lib = t.compile_shader({FIBER_SHADER!r})
        x = tf.range(64, dtype=tf.float32)
        (y,) = lib.total(x, threads=64, group_size=(64, 1, 1), output_shapes=[(64,)])
        want = np.repeat([np.arange(32).sum(), np.arange(32, 64).sum()], 32)
        np.testing.assert_array_equal(y.numpy(), want)
        (y,) = lib.scale(x, threads=64, group_size=(64, 1, 1), output_shapes=[(64,)])
        np.testing.assert_array_equal(y.numpy(), 2 * np.arange(64))
        print("values ok", flush=True)
        lib.pasted(x, threads=64, group_size=(64, 1, 1), output_shapes=[(64,)])[0].numpy()
        print("not reached")
    """)
    assert r.returncode == 70 and "values ok" in r.stdout and "not reached" not in r.stdout, (r.returncode, r.stderr[-3000:])
    assert re.search(r"kernel pasted: threadgroup_barrier at \S+:\d+:\d+ reached on the fiber-free fast path: the "
                     r"kernel was launched on the fast path because the analysis of its source found no call", r.stderr), \
        r.stderr[-3000:]


def test_out_of_bounds_accesses_are_caught_in_checked_builds(monkeypatch):
    import tensorflow as tf

    import tf_metal_ops as t

    monkeypatch.setenv("TF_METAL_OPS_BOUNDS_CHECK", "1")  # read when the op's kernel is created
    write = t.metal_kernel("oob_write", ["x"], ["y"], "uint i = thread_position_in_grid.x; y[i + 1] = x[i];")
    read = t.metal_kernel("oob_read", ["x"], ["y"], "uint i = thread_position_in_grid.x; y[i] = x[i + 2];")
    x = tf.ones([100])
    launch = dict(grid=(100, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(100,)], output_dtypes=[tf.float32])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"out-of-bounds access to 'y' at element 100 of 100 by the thread at "
                             r"thread_position_in_grid \(99, 0, 0\)"):
        write(inputs=[x], **launch)
    with pytest.raises(tf.errors.InvalidArgumentError, match="out-of-bounds access to 'x' at element 10[01] of 100"):
        read(inputs=[x], **launch)
    ok = t.metal_kernel("in_bounds", ["x"], ["y"], "uint i = thread_position_in_grid.x; y[i] = 2 * x[i];")
    np.testing.assert_array_equal(ok(inputs=[x], **launch)[0].numpy(), np.full(100, 2.0))


def test_savedmodel_reloads_in_a_new_process_with_only_the_package_imported(tmp_path):
    import tensorflow as tf

    k = _exp()

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def __call__(self, x):
            return k(inputs=[x], template=[("T", tf.float32)], grid=(tf.size(x), 1, 1), threadgroup=(32, 1, 1),
                     output_shapes=[tf.shape(x)], output_dtypes=[tf.float32])[0]

    path = str(tmp_path / "model")
    tf.saved_model.save(M(), path)
    r = run_python(f"""
        import numpy as np, tensorflow as tf, tf_metal_ops
        m = tf.saved_model.load({path!r})
        x = tf.constant([0.0, 1.0, 2.0], tf.float32)
        print(np.abs(m(x).numpy() - np.exp([0.0, 1.0, 2.0])).max())
    """, env={"TF_METAL_OPS_CACHE": str(tmp_path / "cache"), "TF_METAL_OPS_UNSAFE_KERNEL_LOADING": "1"})
    assert r.returncode == 0, r.stderr[-4000:]  # consent given (without it: tests/test_kernel_trust.py)
    assert float(r.stdout.split()[-1]) < 1e-5, r.stdout


def test_the_disk_cache_serves_a_second_process(tmp_path):
    code = """
        import numpy as np, tensorflow as tf, tf_metal_ops as t
        from tf_metal_ops.inline_kernels import build
        k = t.metal_kernel("cached", ["x"], ["y"], "uint i = thread_position_in_grid.x; y[i] = x[i] + 1;")
        (y,) = k(inputs=[tf.zeros([3])], grid=(3, 1, 1), threadgroup=(3, 1, 1), output_shapes=[(3,)],
                 output_dtypes=[tf.float32])
        assert (y.numpy() == 1).all()
        print("compiled", build.stats["compiled"], "requested", build.stats["requested"])
    """
    env = {"TF_METAL_OPS_CACHE": str(tmp_path)}
    first, second = run_python(code, env), run_python(code, env)
    assert first.returncode == 0 and second.returncode == 0, first.stderr[-3000:] + second.stderr[-3000:]
    assert first.stdout.split()[-4:] == ["compiled", "1", "requested", "1"], first.stdout
    assert second.stdout.split()[-4:] == ["compiled", "0", "requested", "1"], second.stdout
