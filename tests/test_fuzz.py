"""Hypothesis fuzzing of every public op, 1000 generated calls per op, each op in its own subprocess so a hard
crash (segfault, abort) fails the test with the child's output instead of killing the test run."""

import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "fuzz"))
from fuzz_ops import FUZZERS  # noqa: E402

EXAMPLES = int(os.environ.get("TFMO_FUZZ_EXAMPLES", "1000"))


@pytest.mark.parametrize("op", sorted(FUZZERS))
def test_fuzz_op(op):
    script = os.path.join(REPO_ROOT, "tests", "fuzz", "fuzz_ops.py")
    run = subprocess.run([sys.executable, script, op, "--examples", str(EXAMPLES)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, (
        f"fuzzing {op} failed (exit {run.returncode}; negative = killed by that signal)\n"
        f"{run.stdout[-4000:]}\n{run.stderr[-8000:]}"
    )
    assert f"{EXAMPLES} examples passed" in run.stdout
