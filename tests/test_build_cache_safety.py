"""The build cache cannot be planted (tf_metal_ops/_builder.py): directories are created 0700; an entry or cache
root that another user owns, or that group or others may write, is not loaded (one warning, then a build in a
private directory); a library is loaded only when it is the one built for its key (the entry's manifest)."""

import os
import stat
import warnings
from pathlib import Path

import pytest

from tf_metal_ops import _builder

SOURCE = """#include <metal_stdlib>
using namespace metal;
kernel void plus_one(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) { y[i] = y[i] + 1.0f; }
"""


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path, clang16):
    monkeypatch.setenv("TF_METAL_OPS_CLANGXX", clang16)
    monkeypatch.setenv("TF_METAL_OPS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_builder, "_warned", set())
    monkeypatch.setattr(_builder, "_private", [])  # a private directory per test (it lives for the process)
    return tmp_path / "cache"


def _compile(source=SOURCE):
    from tf_metal_ops.inline_kernels import build

    before = build.stats["compiled"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = build.compile(source, checked=False)
    unsafe = [w for w in caught if issubclass(w.category, _builder.UnsafeCacheWarning)]
    return Path(path), build.stats["compiled"] - before, unsafe


def _private(path):
    return any(p.name.startswith("tf-metal-ops-private-cache-") for p in path.parents)


def test_entries_are_private_and_a_second_use_is_a_hit(fresh):
    path, built, unsafe = _compile()
    assert built == 1 and not unsafe and fresh in path.parents
    for d in (fresh, fresh / "inline-kernels", path.parent):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
    assert stat.S_IMODE(os.stat(path).st_mode) & 0o022 == 0
    again, built, unsafe = _compile()
    assert again == path and built == 0 and not unsafe


def test_an_entry_writable_by_others_is_not_loaded(fresh):
    path, _, _ = _compile()
    os.chmod(path.parent, 0o777)
    again, built, unsafe = _compile()
    assert built == 1 and again != path and _private(again), again
    assert len(unsafe) == 1 and "writable by group or others" in str(unsafe[0].message), unsafe
    assert str(path.parent) in str(unsafe[0].message)
    _, _, unsafe = _compile()  # warned once
    assert not unsafe
    os.chmod(path.parent, 0o700)
    os.chmod(path, 0o666)  # the library itself writable by others
    _builder._warned.clear()
    again, _, unsafe = _compile()
    assert again != path and len(unsafe) == 1 and "kernel.so" in str(unsafe[0].message)


def test_a_library_that_is_not_the_one_built_for_the_key_is_not_loaded(fresh):
    path, _, _ = _compile()
    other, _, _ = _compile(SOURCE.replace("1.0f", "2.0f"))
    path.write_bytes(other.read_bytes())  # same owner and mode: another source's library in this entry
    again, built, unsafe = _compile()
    assert built == 1 and again != path and len(unsafe) == 1
    assert "not the file built for it" in str(unsafe[0].message)


def test_a_cache_root_another_user_owns_or_others_can_write_is_not_used(fresh, monkeypatch):
    _compile()
    os.chmod(fresh, 0o775)
    path, built, unsafe = _compile()
    assert built == 1 and _private(path) and len(unsafe) == 1 and str(fresh) in str(unsafe[0].message)
    os.chmod(fresh, 0o700)
    _builder._warned.clear()
    real_lstat = os.lstat

    def lstat(path):  # the cache root as another user's (chown needs privileges a test may not have)
        st = real_lstat(path)
        if Path(path) == fresh:
            return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, os.getuid() + 1, *st[5:10]))
        return st

    monkeypatch.setattr(_builder.os, "lstat", lstat)
    path, _, unsafe = _compile()
    assert _private(path) and len(unsafe) == 1 and "owned by another user" in str(unsafe[0].message)


def test_an_entry_of_an_older_version_without_a_manifest_is_rebuilt(fresh):
    path, _, _ = _compile()
    os.remove(path.parent / _builder.MANIFEST)
    again, built, unsafe = _compile()
    assert again == path and built == 1 and not unsafe
