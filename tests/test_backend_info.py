"""backend_info(): the GPU probe, the Metal status logic (with a fake TensorFlow, so the macOS branches run here),
the community-plugin detection, and the emulated GPU entry."""

import contextlib
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_metal_ops
from tf_metal_ops import _env, diagnostics

GPU = "/job:localhost/replica:0/task:0/device:GPU:0"
CPU = "/job:localhost/replica:0/task:0/device:CPU:0"


class FakeTensor:
    def __init__(self, values, device):
        self._values, self.device = values, device

    def numpy(self):
        return self._values


class FakeTF:
    """Just what _metal_status/probe_gpu use. `placed(x)` says where the fake runtime puts an op on `x`."""

    __version__ = "2.19.0"

    def __init__(self, placed=lambda x: GPU, gpus=("/physical_device:GPU:0",)):
        self.placed, self.seen = placed, []
        self.config = type("config", (), {})()
        self.config.list_physical_devices = lambda kind=None: [type("D", (), {"name": n})() for n in gpus]

    @contextlib.contextmanager
    def device(self, name):
        yield

    def constant(self, x):
        return np.asarray(x)

    def zero_out(self, x):
        self.seen.append(x)
        y = np.zeros_like(x)
        y[0] = x[0]
        return FakeTensor(y, self.placed(x))


def _like_tf_eager(x):
    """TF's eager placer: small int32 inputs keep the op on the CPU even under tf.device('/GPU:0')."""
    return CPU if (x.dtype == np.int32 and x.size <= 64) else GPU


def test_probe_uses_float_data_large_enough_for_the_gpu():
    fake = FakeTF(placed=_like_tf_eager)
    ok, reason = diagnostics.probe_gpu(fake, fake.zero_out)
    assert ok, reason
    (x,) = fake.seen
    assert x.dtype == np.float32 and x.size >= 4096
    assert GPU in reason


def test_probe_reports_an_op_that_ran_on_the_cpu():
    fake = FakeTF(placed=lambda x: CPU)
    ok, reason = diagnostics.probe_gpu(fake, fake.zero_out)
    assert not ok and "ran on " + CPU in reason and "not the GPU" in reason


def test_probe_reports_wrong_values_and_errors():
    fake = FakeTF()
    ok, reason = diagnostics.probe_gpu(fake, lambda x: FakeTensor(np.ones_like(x), GPU))
    assert not ok and "wrong values" in reason

    def boom(x):
        raise RuntimeError("stream does not answer -queue")

    ok, reason = diagnostics.probe_gpu(fake, boom)
    assert not ok and "failed: stream does not answer -queue" in reason


def test_real_probe_on_a_cpu_only_tensorflow_says_where_it_ran():
    if tf.config.list_logical_devices("GPU"):
        pytest.skip("this TensorFlow has a GPU")
    ok, reason = diagnostics.probe_gpu(tf, tf_metal_ops.zero_out)
    assert not ok and "device:CPU:0" in reason


@pytest.fixture
def mac(monkeypatch):
    """A macOS process with tensorflow-metal 1.2.0 and no community plugin; the probe runs on a fake TF."""
    versions = {"tensorflow-metal": "1.2.0"}
    monkeypatch.setattr(_env, "distribution_version", lambda dist: versions.get(dist))
    fake = FakeTF(placed=_like_tf_eager)
    monkeypatch.setattr(sys.modules["tf_metal_ops.zero_out"], "zero_out", fake.zero_out)
    return versions, fake


def test_metal_status_usable_on_a_working_mac(mac):
    versions, fake = mac
    ok, reason = diagnostics._metal_status(fake, {"metal": True}, system="darwin")
    assert ok, reason
    assert "Metal kernels run on /physical_device:GPU:0" in reason


def test_metal_status_reasons(mac):
    versions, fake = mac
    assert diagnostics._metal_status(fake, {"metal": False}, system="darwin") == (
        False, "the op library was built without Metal kernels (build it on macOS with `pip install .`)")
    fake.__version__ = "2.20.0"
    ok, reason = diagnostics._metal_status(fake, {"metal": True}, system="darwin")
    assert not ok and "supports TensorFlow 2.18-2.19, this is 2.20.0" in reason
    fake.__version__ = "2.19.0"
    del versions["tensorflow-metal"]
    ok, reason = diagnostics._metal_status(fake, {"metal": True}, system="darwin")
    assert not ok and "tensorflow-metal is not installed" in reason


def test_metal_status_gpu_probe_that_ran_on_the_cpu_is_unusable(mac):
    versions, fake = mac
    fake.placed = lambda x: CPU
    ok, reason = diagnostics._metal_status(fake, {"metal": True}, system="darwin")
    assert not ok and "not the GPU" in reason


@pytest.mark.parametrize("dist", diagnostics.COMMUNITY_METAL_PLUGINS)
def test_community_plugin_keeps_the_ops_on_the_cpu_and_says_why(mac, dist):
    versions, fake = mac
    del versions["tensorflow-metal"]
    versions[dist] = "0.4.1"
    fake.__version__ = "2.21.0"
    assert diagnostics.community_metal_plugin() == (dist, "0.4.1")
    ok, reason = diagnostics._metal_status(fake, {"metal": True}, system="darwin")
    assert not ok
    assert f"{dist} 0.4.1 is installed" in reason and "stream protocol" in reason and "CPU kernels" in reason
    assert fake.seen == []  # the probe never ran: nothing is sent to that plugin's stream


def test_metal_is_unusable_off_macos():
    ok, reason = diagnostics._metal_status(tf, {"metal": False}, system="linux")
    assert not ok and reason.startswith("unusable: Metal needs macOS")


def test_op_types_are_camel_case_from_snake_case_functions():
    module = type("m", (), {"_dispatcher_for_hash_grid_encode_grad_params": 1, "_dispatcher_for_zero_out": 1})
    assert diagnostics.op_types(module) == ["HashGridEncodeGradParams", "ZeroOut"]


def test_backend_info_on_this_machine():
    info = tf_metal_ops.backend_info()
    if sys.platform != "darwin":
        assert info["metal_usable"] is False and info["metal_reason"].startswith("unusable: Metal needs macOS")
    assert info["community_metal_plugin"] is None
    emu = info["emulated_gpu"]
    assert emu["requested"] == (tf_metal_ops.emulated_gpu.requested())
    if not emu["enabled"]:
        assert emu["usable"] is False and "TF_METAL_OPS_EMULATED_GPU=1" in emu["reason"]
        if sys.platform != "darwin":
            assert info["gpu_backend"] is None  # no GPU kernels run in this process


def test_community_plugin_warning_before_the_library_loads(monkeypatch, caplog):
    from tf_metal_ops import _library

    monkeypatch.setattr(_env, "distribution_version",
                        lambda dist: "0.4.1" if dist == "tensorflow-metal-plugin" else None)
    monkeypatch.setattr(_library.sys, "platform", "darwin")
    monkeypatch.setenv("TF_METAL_OPS_NO_GPU_KERNELS", "0")  # so monkeypatch removes it again: it is process-wide
    with caplog.at_level("WARNING", logger="tf_metal_ops"):
        _library._warn_about_community_metal_plugin()
    assert "tensorflow-metal-plugin 0.4.1 is installed" in caplog.text
    assert os.environ.get("TF_METAL_OPS_NO_GPU_KERNELS") == "1"  # the library will register no GPU kernel
    caplog.clear()
    monkeypatch.setattr(_library.sys, "platform", "linux")
    _library._warn_about_community_metal_plugin()
    assert caplog.text == ""


def test_no_gpu_kernels_switch_leaves_only_cpu_kernels(clang16):
    """TF_METAL_OPS_NO_GPU_KERNELS=1 (set on macOS when the community plugin is installed): the library registers
    no GPU kernel, so nothing can be placed on a GPU whose stream the Metal backend cannot drive. Checked on the
    emulated GPU's kernel library, the one Linux build that has GPU kernels; without the switch it registers them."""
    import os
    import subprocess
    import sys

    code = """
import json
import tensorflow as tf
from tensorflow.python.framework import kernels
import tf_metal_ops
from tf_metal_ops import emulated_gpu
tf.load_op_library(str(emulated_gpu.build()["kernels"]))
print(json.dumps(sorted({k.device_type for k in kernels.get_registered_kernels_for_op("ZeroOut").kernel})))
"""
    for switch, want in (("1", '["CPU"]'), ("0", '["CPU", "GPU"]')):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_METAL_OPS_NO_GPU_KERNELS=switch,
                   TF_METAL_OPS_CLANGXX=clang16, TF_METAL_OPS_EMULATED_GPU="0")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env,
                           cwd=os.path.dirname(os.path.abspath(__file__)))  # not the checkout: the installed package
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.strip().splitlines()[-1] == want, (switch, r.stdout)


def test_the_former_module_name_still_works_with_a_deprecation_warning(monkeypatch):
    import importlib

    if "backend" in vars(tf_metal_ops):  # bound by an earlier import of tf_metal_ops.backend: as in a fresh process
        monkeypatch.delattr(tf_metal_ops, "backend")
    monkeypatch.delitem(sys.modules, "tf_metal_ops.backend", raising=False)
    with pytest.warns(DeprecationWarning, match="tf_metal_ops.diagnostics"):
        assert tf_metal_ops.backend is diagnostics
    with pytest.warns(DeprecationWarning, match="tf_metal_ops.diagnostics"):
        assert importlib.import_module("tf_metal_ops.backend") is diagnostics
    from tf_metal_ops.backend import cpu_paths  # the names of the module, through the old name

    assert cpu_paths is diagnostics.cpu_paths
