"""The one way the tests start a check script of this package in a fresh process: ``python -m support.<name> ARGS``
with tests/ as the working directory (so ``support`` imports, and the installed tf_metal_ops, not the checkout);
directories a script imports from besides (examples/, a user's op) go first on its PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Iterable, Mapping

from support.paths import EXAMPLES, TESTS


def run(name: str, *args, env: Mapping[str, str] | None = None, pythonpath: Iterable[str] = (),
        **kwargs) -> subprocess.CompletedProcess:
    """Runs support/<name>.py with `args`; env: the whole environment (default os.environ); the remaining keyword
    arguments go to subprocess.run (default capture_output=True, text=True)."""
    env = dict(os.environ if env is None else env)
    path = [str(p) for p in pythonpath] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    return subprocess.run([sys.executable, "-m", f"support.{name}", *map(str, args)], env=env, cwd=TESTS, **kwargs)


def run_nerf_main(module: str, argv: Iterable[str]) -> subprocess.CompletedProcess:
    """examples/nerf/<module>.py's main(argv) in a fresh interpreter, which prints at its end whether TensorFlow was
    imported (a command whose arguments are refused must refuse them before importing it)."""
    code = (f"import sys; sys.path.insert(0, sys.argv[1]); from nerf import {module}\n"
            f"try:\n    {module}.main(sys.argv[2:])\n"
            "finally:\n    print('tensorflow imported:', 'tensorflow' in sys.modules)\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-c", code, EXAMPLES, *argv], capture_output=True, text=True, env=env,
                          timeout=120)
