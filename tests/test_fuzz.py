"""Hypothesis fuzzing of every public op (zero_out, hash_grid_encode, volume_render, distortion_loss, their packed
forms, ray_march, fused_mlp and inline metal_kernel launches), 1000 generated calls per op, each op in its own
subprocess so a hard crash (segfault, abort) fails the test instead of killing the test run.

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
    env = None
    if op == "metal_kernel":  # inline kernels compile with clang++-16 (skips without it, as tests/test_metal_kernel.py)
        import shutil

        from support.native import skip_or_fail

        clang = os.environ.get("TF_METAL_OPS_CLANGXX") or shutil.which("clang++-16")
        if clang is None:
            skip_or_fail("clang++-16 not found: the metal_kernel fuzzer compiles inline kernels with it")
        env = dict(os.environ, TF_METAL_OPS_CLANGXX=clang)
    return scripts.run("fuzz_ops", op, "--examples", examples, *extra, env=env, timeout=900)


def test_every_public_op_has_a_fuzzer():
    """The fuzzers cover the ops that take tensors: a new public op needs one here (or a reason in SKIPPED)."""
    import tf_metal_ops

    covered = {"zero_out", "hash_grid_encode", "volume_render", "distortion_loss", "volume_render_packed",
               "distortion_loss_packed", "ray_march", "metal_kernel", "fused_mlp"}
    assert covered <= set(tf_metal_ops.__all__)
    assert {"hash_grid" if n == "hash_grid_encode" else n for n in covered} == set(FUZZERS)
    # what has no fuzzer: the pure-TF versions (the same checks as the ops, in TF), classes and diagnostics, the
    # scene contraction (plain TF over one tensor; its bad input: tests/test_contraction.py), the sample culling
    # (plain TF over the packed samples; its bad input: tests/test_cull_samples.py), and the kernel-consent
    # switches, which take no tensor (their bad input: tests/test_kernel_trust.py)
    ops = {n for n in tf_metal_ops.__all__ if callable(getattr(tf_metal_ops, n)) and n[0].islower()
           and not n.endswith("_tf")}
    assert ops - covered == SKIPPED, ops - covered


SKIPPED = {"backend_info", "compile_shader", "contract", "contract_to_unit", "cull_samples_packed",
           "enable_unsafe_kernel_loading",
           "fused_mlp_layout", "get_num_threads", "hash_grid_table_layout", "library_path", "num_threads",
           "set_num_threads", "trust_kernel"}


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
