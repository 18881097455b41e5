"""Consent to run inline kernels from a graph (tf_metal_ops/inline_kernels/trust.py, docs/security.md): a SavedModel
or GraphDef holding a TfmoMetalKernel, loaded in a fresh process, is refused until the user allows its source; each
form of consent lets it run; with consent, a source that is not Metal is still refused by the strict check, before
anything is compiled. One subprocess makes every fresh-process check."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONWARNINGS": "ignore"}
BODY = "uint i = thread_position_in_grid.x; y[i] = x[i] * {factor};"


@pytest.fixture(scope="module", autouse=True)
def compiler(clang16):
    os.environ.setdefault("TF_METAL_OPS_CLANGXX", clang16)
    return clang16


def _save_model(path, kernel):
    import tensorflow as tf

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([4], tf.float32)])
        def __call__(self, x):
            return kernel(inputs=[x], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
                          output_dtypes=[tf.float32])[0]

    tf.saved_model.save(M(), path)
    return kernel.instance(["float32"], [1], ["float32"], [1]).source.msl


def _graph_def(path, kernel):
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([4], tf.float32)])
    def f(x):
        return kernel(inputs=[x], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
                      output_dtypes=[tf.float32])[0]

    graph = f.get_concrete_function().graph.as_graph_def()
    with open(path, "wb") as fh:
        fh.write(graph.SerializeToString())
    return kernel.instance(["float32"], [1], ["float32"], [1]).source.msl


def test_kernels_from_a_graph_need_consent_in_a_fresh_process(tmp_path):
    import tf_metal_ops

    marker = tmp_path / "written_by_the_kernel"
    models, digests = {}, {}
    for name, factor in (("trusted", 2), ("by_env", 3), ("unsafe", 4)):
        k = tf_metal_ops.metal_kernel(f"k_{name}", ["x"], ["y"], BODY.format(factor=factor))
        models[name] = str(tmp_path / name)
        digests[name] = hashlib.sha256(_save_model(models[name], k).encode()).hexdigest()
    k = tf_metal_ops.metal_kernel("k_graphdef", ["x"], ["y"], BODY.format(factor=5))
    models["graphdef"] = str(tmp_path / "graph.pb")
    digests["graphdef"] = hashlib.sha256(_graph_def(models["graphdef"], k).encode()).hexdigest()
    # Not Metal: a call to the C library's system() through extern "C" (saving traces the kernel, nothing runs).
    hostile = tf_metal_ops.metal_kernel(
        "k_hostile", ["x"], ["y"], f'system("touch {marker}"); uint i = thread_position_in_grid.x; y[i] = x[i];',
        header='extern "C" int system(thread const char* command);')
    models["hostile"] = str(tmp_path / "hostile")
    _save_model(models["hostile"], hostile)

    code = textwrap.dedent(f"""
        import json, os, numpy as np, tensorflow as tf, tf_metal_ops
        models, out = {models!r}, {{}}
        x = tf.constant([1.0, 2.0, 3.0, 4.0])

        def call(name):
            try:
                if name == "graphdef":
                    g = tf.compat.v1.GraphDef()
                    g.ParseFromString(open(models[name], "rb").read())
                    f = tf.compat.v1.wrap_function(lambda v: tf.graph_util.import_graph_def(
                        g, input_map={{"x:0": v}}, return_elements=["Identity:0"])[0],
                        [tf.TensorSpec([4], tf.float32)])
                    y = f(x)
                else:
                    y = tf.saved_model.load(models[name])(x)
                return ["ok", (y.numpy() / x.numpy()).tolist()]
            except tf.errors.InvalidArgumentError as e:
                return ["refused", e.message]

        out["trusted_before"] = call("trusted")
        tf_metal_ops.trust_kernel({digests["trusted"]!r})
        out["trusted_after"] = call("trusted")
        out["by_env_before"] = call("by_env")  # trust is per source
        os.environ["TF_METAL_OPS_UNSAFE_KERNEL_LOADING"] = "1"
        out["by_env_after"] = call("by_env")
        del os.environ["TF_METAL_OPS_UNSAFE_KERNEL_LOADING"]
        out["graphdef_before"] = call("graphdef")
        out["unsafe_before"] = call("unsafe")
        tf_metal_ops.enable_unsafe_kernel_loading()
        out["unsafe_after"] = call("unsafe")
        out["graphdef_after"] = call("graphdef")
        out["hostile"] = call("hostile")
        print("RESULT", json.dumps(out))
    """)
    env = dict(os.environ, **QUIET, TF_METAL_OPS_CACHE=str(tmp_path / "cache"))
    env.pop("TF_METAL_OPS_UNSAFE_KERNEL_LOADING", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900, cwd=HERE)
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.split("RESULT ", 1)[1])

    for name, key in (("trusted", "trusted_before"), ("by_env", "by_env_before"), ("unsafe", "unsafe_before"),
                      ("graphdef", "graphdef_before")):
        status, message = out[key]
        assert status == "refused", (key, out[key])
        assert f"custom_kernel_k_{name}" in message and digests[name] in message, message
        assert "tf_metal_ops.enable_unsafe_kernel_loading()" in message, message
        assert "TF_METAL_OPS_UNSAFE_KERNEL_LOADING=1" in message, message
        assert f'tf_metal_ops.trust_kernel("{digests[name]}")' in message, message
    assert out["trusted_after"] == ["ok", [2.0] * 4], out["trusted_after"]
    assert out["by_env_after"] == ["ok", [3.0] * 4], out["by_env_after"]
    assert out["unsafe_after"] == ["ok", [4.0] * 4], out["unsafe_after"]
    assert out["graphdef_after"] == ["ok", [5.0] * 4], out["graphdef_after"]
    status, message = out["hostile"]
    assert status == "refused" and "[linkage]" in message and "[external-function]" in message, out["hostile"]
    assert "k_hostile:header:1" in message and "k_hostile:source:1" in message, message
    assert not marker.exists()


def test_kernels_this_process_created_need_no_consent_and_trust_kernel_takes_only_a_sha256(monkeypatch):
    import tensorflow as tf

    import tf_metal_ops
    from tf_metal_ops.inline_kernels import trust

    k = tf_metal_ops.metal_kernel("k_local", ["x"], ["y"], BODY.format(factor=7))
    (y,) = k(inputs=[tf.ones([4])], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
             output_dtypes=[tf.float32])
    assert y.numpy().tolist() == [7.0] * 4
    lib = tf_metal_ops.compile_shader(
        "kernel void s(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) { y[i] = 8.0f; }")
    (y,) = lib.s(threads=4, output_shapes=[(4,)])
    assert y.numpy().tolist() == [8.0] * 4
    for bad in ("", "abc", "z" * 64, 42, "a" * 63):
        with pytest.raises(ValueError, match="SHA-256"):
            tf_metal_ops.trust_kernel(bad)
    monkeypatch.delenv("TF_METAL_OPS_UNSAFE_KERNEL_LOADING", raising=False)
    monkeypatch.setattr(trust, "_unsafe", [False])
    with pytest.raises(trust.KernelNotAllowed, match="kernels: other"):
        trust.check("kernel void other(device float* y [[buffer(0)]]) {}")


def test_the_emulated_gpu_asks_for_the_same_consent(gpu_backend, tmp_path):
    """Both GPU backends compile an inline kernel for the CPU (the direct backend, and the Apple doubles'
    newLibraryWithSource: under the metal backend): a kernel from a SavedModel is refused there too, and runs once
    trusted. The direct backend asks again after a refusal; the Metal host, as on a Mac where Apple's compiler fails
    the same way every time, keeps a failed library for the process, so under the metal backend consent is given
    before the first call (a second process)."""
    import tf_metal_ops

    k = tf_metal_ops.metal_kernel("k_gpu", ["x"], ["y"], BODY.format(factor=6))
    path = str(tmp_path / "model")
    digest = hashlib.sha256(_save_model(path, k).encode()).hexdigest()
    code = textwrap.dedent(f"""
        import json, sys, tensorflow as tf, tf_metal_ops
        m = tf.saved_model.load({path!r})
        x = tf.constant([1.0, 2.0, 3.0, 4.0])
        out = []
        for trust_first in sys.argv[1:]:
            if trust_first == "1":
                tf_metal_ops.trust_kernel({digest!r})
            try:
                with tf.device("/GPU:0"):
                    y = m(x)
                out.append(["ok", y.device, (y.numpy() / x.numpy()).tolist()])
            except tf.errors.InvalidArgumentError as e:
                out.append(["refused", e.message])
        print("RESULT", json.dumps(out))
    """)
    env = dict(os.environ, **QUIET, **gpu_backend[1])  # the cache that holds the backends
    env.pop("TF_METAL_OPS_UNSAFE_KERNEL_LOADING", None)

    def run(*trust_first):
        r = subprocess.run([sys.executable, "-c", code, *trust_first], capture_output=True, text=True, env=env,
                           timeout=1800, cwd=HERE)
        assert r.returncode == 0, r.stderr[-4000:]
        return json.loads(r.stdout.split("RESULT ", 1)[1])

    runs = run("0", "1") if gpu_backend[0] == "direct" else run("0") + run("1")
    refused, ran = runs
    assert refused[0] == "refused" and digest in refused[1] and "trust_kernel" in refused[1], refused
    assert ran[0] == "ok" and "GPU:0" in ran[1] and ran[2] == [6.0] * 4, ran
