"""Hypothesis fuzzing of every public op, 1000 generated calls per op, each op in its own subprocess so a hard
crash (segfault, abort) fails the test instead of killing the test run.

The fuzzer fails its run when a call known to be valid is rejected; its last output line holds the outcome counts,
asserted here (not just the example count that was asked for): every call returned a checked result or was
rejected cleanly, a good share of the calls were valid (so results are really checked) and some error paths
were exercised. A negative control shows that a wrongly rejected valid call does fail the run."""

import json
import os

import pytest

from support import scripts
from support.fuzz_ops import FUZZERS

EXAMPLES = int(os.environ.get("TFMO_FUZZ_EXAMPLES", "1000"))


def run_fuzzer(op, examples, *extra):
    return scripts.run("fuzz_ops", op, "--examples", examples, *extra, timeout=900)


@pytest.mark.parametrize("op", sorted(FUZZERS))
def test_fuzz_op(op):
    run = run_fuzzer(op, EXAMPLES)
    assert run.returncode == 0, (
        f"fuzzing {op} failed (exit {run.returncode}; negative = killed by that signal)\n"
        f"{run.stdout[-4000:]}\n{run.stderr[-8000:]}"
    )
    counts = json.loads(run.stdout.strip().splitlines()[-1])
    calls = counts["calls"]
    # Hypothesis runs up to the requested number (it may skip a few duplicates of small search spaces)
    assert 0.9 * EXAMPLES <= calls <= EXAMPLES, counts
    assert counts["returned"] + counts["rejected"] == calls, counts
    # every known-valid call returned (the fuzzer fails otherwise); here: they are a real share of the calls
    assert counts["valid_calls"] >= 0.2 * calls and counts["returned"] >= counts["valid_calls"], counts
    # faults were injected and some were rejected (the error paths ran)
    assert counts["faulty_calls"] >= 0.05 * calls and counts["rejected"] >= 0.03 * calls, counts


@pytest.mark.parametrize("op", sorted(FUZZERS))
def test_rejected_valid_call_fails_the_run(op):
    """Negative control: with every op call replaced by a clean-looking ValueError, the fuzzer must fail."""
    run = run_fuzzer(op, 20, "--inject-rejection")
    assert run.returncode != 0, run.stdout[-2000:]
    assert "a valid call was rejected" in run.stdout + run.stderr
