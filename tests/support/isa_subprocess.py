"""Runs a script in a fresh process with a CPU-kernel build chosen by its environment variable (the build choice is
read once per process), for the ISA tests (test_volume_render_isa.py, test_ray_march_isa.py)."""

import json
import os
import subprocess
import sys

import numpy as np


def run_with_isa(tmp_path, var, isa, script, *args):
    """Runs ``script`` (``python -c``; argv: an .npz path to write, then ``args``) with ``var=isa`` (None: unset).
    The script prints the kernel's path diagnostics as JSON on its last stdout line. Returns (arrays, paths,
    stderr)."""
    env = dict(os.environ)
    env.pop(var, None)
    if isa is not None:
        env[var] = isa
    path = str(tmp_path / f"out_{isa}.npz")
    run = subprocess.run([sys.executable, "-c", script, path, *args], env=env, cwd=str(tmp_path), capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr[-4000:]
    return dict(np.load(path)), json.loads(run.stdout.strip().splitlines()[-1]), run.stderr


def only_ran(paths, isa):
    """The diagnostics ``paths`` show calls of build ``isa`` and of no other."""
    return paths["calls"][isa] > 0 and all(n == 0 for k, n in paths["calls"].items() if k != isa)


def run_each_build(tmp_path, var, builds, script, *args):
    """Runs ``script`` once per name in ``builds`` (lowest first) and checks the choice: a build this CPU runs is the
    only one that ran and nothing is reported; any other falls back to a lower build, said on stderr. Returns
    ({build: arrays} of the builds that ran as requested, the supported builds)."""
    results, supported = {}, None
    for isa in builds:
        arrays, paths, err = run_with_isa(tmp_path, var, isa, script, *args)
        supported = paths["supported"]
        assert paths["requested"] == isa, paths
        if isa in supported:
            assert paths["selected"] == isa and not paths["fell_back"], paths
            assert only_ran(paths, isa), paths
            assert var not in err
            results[isa] = arrays
        else:  # the CPU (or this build of the library) cannot run it
            assert paths["fell_back"], paths
            assert builds.index(paths["selected"]) < builds.index(isa), paths
            assert only_ran(paths, paths["selected"]), paths
            assert f"{var}={isa}" in err and paths["selected"] in err, err[-2000:]
    assert "default" in results
    return results, supported
