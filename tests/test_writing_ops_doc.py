"""docs/writing_ops.md is executable: every block after `<!-- file: NAME -->` is written to a fresh directory
outside the repository and every block after `<!-- run -->` runs there, in order, as a new user would. The GPU
part needs clang++-16 (the emulated GPU): it skips without it, and fails under TFMO_REQUIRE_MAC_CHECKS=1."""

import os
import re
import subprocess
import sys

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "writing_ops.md")
BLOCK = re.compile(r"<!-- (file: (?P<name>\S+)|run) -->\n```[a-z+]*\n(?P<body>.*?)```", re.S)


def steps():
    text = open(DOC, encoding="utf-8").read()
    return [(m.group("name"), m.group("body")) for m in BLOCK.finditer(text)]


def test_doc_has_files_and_runs():
    names = [n for n, _ in steps()]
    assert {"my_zero_out.cc", "my_zero_out.metal", "my_zero_out_gpu.cc", "gpu_demo.py", "my_pkg/setup.py"} <= set(names)
    assert names.count(None) == 3


def test_tutorial_runs_from_an_empty_directory(tmp_path, clang16):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_METAL_OPS_CLANGXX=clang16)
    for i, (name, body) in enumerate(steps()):
        if name is not None:
            path = tmp_path / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
            continue
        r = subprocess.run([sys.executable, "-c", body], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=900)
        assert r.returncode == 0, f"run block {i} failed:\n{body}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr[-5000:]}"
