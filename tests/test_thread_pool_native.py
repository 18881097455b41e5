"""The CPU thread pool under ThreadSanitizer and ASan/UBSan: coverage, concurrent and nested calls, thread-count
changes, fork (tests/native/thread_pool_test.cc)."""

import os
import subprocess

import pytest

from support.paths import REPO_ROOT

SOURCES = [
    os.path.join(REPO_ROOT, "tests", "native", "thread_pool_test.cc"),
    os.path.join(REPO_ROOT, "csrc", "common", "thread_pool.cc"),
]


@pytest.mark.parametrize(
    "sanitizer,args",
    [("thread", ["--no-fork"]), ("address,undefined", [])],  # TSan does not support fork in threaded programs
    ids=["tsan", "asan-ubsan"],
)
def test_thread_pool_under_sanitizer(clang16, tmp_path, sanitizer, args):
    exe = tmp_path / "thread_pool_test"
    subprocess.run(
        [clang16, "-std=c++17", "-O1", "-g", f"-fsanitize={sanitizer}", "-fno-sanitize-recover=all",
         "-I", os.path.join(REPO_ROOT, "csrc"), *SOURCES, "-o", str(exe), "-lpthread"],
        check=True,
    )
    run = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "all checks passed" in run.stdout
    assert "WARNING: ThreadSanitizer" not in run.stderr and "ERROR: AddressSanitizer" not in run.stderr
