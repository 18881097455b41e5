"""The one way the tests start a check script of this package in a fresh process: ``python -m support.<name> ARGS``
with tests/ as the working directory (so ``support`` imports, and the installed tf_metal_ops, not the checkout);
directories a script imports from besides (examples/, a user's op) go first on its PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Iterable, Mapping

from support.paths import TESTS


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
