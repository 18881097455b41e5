"""The process switches read in tf_metal_ops._env: what TF_METAL_OPS_EMULATED_GPU asks for, the MSL version
the emulated GPU compiles the kernels at (TF_METAL_OPS_EMULATED_GPU_MSL), and the deprecated
names of the emulated GPU's variables."""

import pytest

from tf_metal_ops import _env


@pytest.mark.parametrize("value,want", [("", None), ("0", None), ("1", "direct"), ("direct", "direct"),
                                        ("metal", "metal"), (" 1 ", "direct"), ("/some/backend", "/some/backend")])
def test_emulated_gpu_request(monkeypatch, value, want):
    monkeypatch.setenv("TF_METAL_OPS_EMULATED_GPU", value)
    assert _env.emulated_gpu_request() == want


def test_emulated_gpu_request_unset(monkeypatch):
    monkeypatch.delenv("TF_METAL_OPS_EMULATED_GPU", raising=False)
    assert _env.emulated_gpu_request() is None


@pytest.mark.parametrize("old,new", sorted(_env.DEPRECATED.items()))
def test_deprecated_name_warns_and_sets_the_new_one(monkeypatch, old, new):
    monkeypatch.delenv(new, raising=False)
    monkeypatch.setenv(old, "7")
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated: use {new}"):
        _env.adopt_deprecated_names()
    import os

    assert os.environ[new] == "7"


def test_the_new_name_wins(monkeypatch, recwarn):
    old, new = "TF_METAL_OPS_EMU_WORKERS", "TF_METAL_OPS_EMULATED_GPU_WORKERS"
    monkeypatch.setenv(old, "7")
    monkeypatch.setenv(new, "3")
    _env.adopt_deprecated_names()
    import os

    assert os.environ[new] == "3"
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning) and old in str(w.message)]


def test_a_missing_backend_directory_is_a_clear_error(monkeypatch, tmp_path):
    from tf_metal_ops import emulated_gpu

    with pytest.raises(emulated_gpu.EmulatedGPUError, match="not an emulated GPU backend directory"):
        emulated_gpu.prebuilt(tmp_path)
    (tmp_path / "backend.json").write_text('{"name": "x", "device": "libd.so", "kernels": "libk.so"}')
    with pytest.raises(emulated_gpu.EmulatedGPUError, match=r"names libd\.so \(device\), which is missing"):
        emulated_gpu.prebuilt(tmp_path)
    monkeypatch.setenv("TF_METAL_OPS_EMULATED_GPU", "metal")
    with pytest.raises(emulated_gpu.EmulatedGPUError, match="dev/apple_doubles/build.py"):
        emulated_gpu.build()


@pytest.mark.parametrize("value,want", [(None, "3.0"), ("", "3.0"), ("3.0", "3.0"), ("2.4", "2.4"), (" 2.4 ", "2.4")])
def test_emulated_gpu_msl_version(monkeypatch, value, want):
    if value is None:
        monkeypatch.delenv("TF_METAL_OPS_EMULATED_GPU_MSL", raising=False)
    else:
        monkeypatch.setenv("TF_METAL_OPS_EMULATED_GPU_MSL", value)
    assert _env.emulated_gpu_msl() == want


@pytest.mark.parametrize("value", ["2.3", "3", "240", "3.1"])
def test_emulated_gpu_msl_version_rejects_others(monkeypatch, value):
    monkeypatch.setenv("TF_METAL_OPS_EMULATED_GPU_MSL", value)
    with pytest.raises(ValueError, match="expected 2.4 or 3.0"):
        _env.emulated_gpu_msl()
