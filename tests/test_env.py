"""The process switches read in tf_metal_ops._env: what TF_METAL_OPS_EMULATED_GPU asks for, and the deprecated
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
