"""One runner for the GPU check scripts (support/emulated_gpu_checks.py, emulated_gpu_error_checks.py,
metal_backend_checks.py). A script is run as `python -m support.SCRIPT CHECK [SEED]` (support/scripts.py) in a fresh
process whose environment selects the GPU backend (TF_METAL_OPS_EMULATED_GPU=1, or the metal backend's directory); its last line is
"ok CHECK <summary>".

Script side: `CHECKS = collect(globals())` and `main(CHECKS)`. Test side: `run_check(script, check, seed, env)`.
"""

from __future__ import annotations

import inspect
import os
import sys

from support import scripts
from support.paths import EXAMPLES

QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONWARNINGS": "ignore"}


def collect(namespace: dict) -> dict:
    """name -> function for every check_<name> of a script's module namespace."""
    return {name[len("check_"):]: fn for name, fn in dict(namespace).items() if name.startswith("check_")}


def main(checks: dict, argv: list[str] | None = None) -> None:
    from tf_metal_ops import emulated_gpu

    argv = sys.argv[1:] if argv is None else argv
    names, seed = argv[0], int(argv[1]) if len(argv) > 1 else 0
    emulated_gpu.enable(verbose=False)
    assert emulated_gpu.enabled(), "the emulated GPU is not enabled"
    for name in names.split(","):  # "a,b": several checks in one process, in order
        fn = checks[name]
        summary = fn(seed) if inspect.signature(fn).parameters else fn()
        print(f"ok {name} {summary}", flush=True)
    if "," in names:
        print(f"ok {names}")


def run_check(script: str, check: str, seed: int | None = None, env: dict | None = None, timeout: int = 900):
    """Runs one check of support/<script>.py in a fresh process and asserts it passed (exit 0, last line
    "ok CHECK"). `check` may name several, "a,b,c": they run in that order in the one process."""
    args = [check] + ([] if seed is None else [str(seed)])
    r = scripts.run(script, *args, env={**os.environ, **QUIET, **(env or {})}, timeout=timeout,
                    pythonpath=[EXAMPLES])  # the NeRF check imports nerf
    assert r.returncode == 0, f"{check} failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    assert f"ok {check}" in r.stdout.splitlines()[-1], r.stdout
    return r
