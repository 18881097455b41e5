"""The op kit's promise, as a new user meets it: examples/custom_op copied into a fresh directory outside the
repository, built with tf_metal_ops.extension.load(), run on the CPU and (Linux) on the emulated GPU; a second
process only loads the cached build. The checks are in tests/support/custom_op_checks.py."""

import os
import re
import shutil

import pytest

from support import scripts
from support.paths import EXAMPLES

EXAMPLE = os.path.join(EXAMPLES, "custom_op")


def run_checks(tmp_path, env):
    work = tmp_path / "my_ops"
    if not work.exists():
        shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("__pycache__"))
    full = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_METAL_OPS_CACHE=str(tmp_path / "cache"), **env)
    r = scripts.run("custom_op_checks", env=full, pythonpath=[work], timeout=900)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r.stdout


def load_seconds(out):
    return float(re.search(r"load\(\) ([0-9.]+) s", out).group(1))


def test_user_op_on_cpu_cold_then_cached(tmp_path):
    cold = run_checks(tmp_path, {"TF_METAL_OPS_EMULATED_GPU": "0"})
    assert "ok /CPU:0" in cold and "robust loss" in cold
    warm = run_checks(tmp_path, {"TF_METAL_OPS_EMULATED_GPU": "0"})
    assert load_seconds(warm) < load_seconds(cold), (cold, warm)
    print(f"load(): cold {load_seconds(cold):.2f} s, cached {load_seconds(warm):.2f} s")


def test_user_op_on_the_emulated_gpu(tmp_path, clang16):
    out = run_checks(tmp_path, {"TF_METAL_OPS_EMULATED_GPU": "1", "TF_METAL_OPS_CLANGXX": clang16})
    assert "ok /CPU:0, /GPU:0" in out, out
    assert "robust_loss_forward" in out and "/GPU:0: robust loss" in out, out


def test_compiler_errors_name_the_users_file(tmp_path):
    import tensorflow as tf  # noqa: F401
    from tf_metal_ops import extension

    bad = tmp_path / "broken_op.cc"
    bad.write_text('#include "common/tfc.h"\nvoid f() { this_is_not_declared(); }\n')
    with pytest.raises(extension.BuildError) as e:
        extension.build("broken", [bad], build_directory=tmp_path / "cache")
    assert "broken_op.cc:2" in str(e.value) and "this_is_not_declared" in str(e.value)


def test_missing_source_and_unknown_kind_are_clear(tmp_path):
    from tf_metal_ops import extension

    with pytest.raises(extension.BuildError, match="does not exist"):
        extension.build("x", [tmp_path / "nope.cc"], build_directory=tmp_path)
    (tmp_path / "a.txt").write_text("")
    with pytest.raises(extension.BuildError, match="unknown source kind"):
        extension.build("x", [tmp_path / "a.txt"], build_directory=tmp_path)
    with pytest.raises(ValueError, match="identifier"):
        extension.build("not a name", [tmp_path / "a.txt"], build_directory=tmp_path)


def test_get_include_has_the_public_headers():
    from tf_metal_ops import extension

    inc = extension.get_include()
    for h in ("common/tfc.h", "common/thread_pool.h", "gpu/gpu_host.h", "shared/device_compat.h"):
        assert os.path.isfile(os.path.join(inc, h)), h
