"""examples/sdf/train.py (neural SDF with an eikonal loss through the hash grid's second derivatives), run briefly
as its one command in a subprocess: it trains, writes metrics.json, mesh.ply and render.png, and what it learns in
300 steps (about 5 s on an idle 2-core machine) is far better than the untrained model. A step count, not a time
budget: a loaded machine (CI runs tests two at a time) gets the same training, only later (at most 120 s)."""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "sdf", "train.py")


def test_sdf_example_runs_briefly(tmp_path):
    pytest.importorskip("skimage")
    pytest.importorskip("tqdm")
    pytest.importorskip("imageio")
    out = tmp_path / "sdf"
    cmd = [sys.executable, EXAMPLE, "--steps", "300", "--seconds", "120", "--batch", "4096", "--mesh-res", "48",
           "--render-res", "48", "--eval-points", "5000", "--out", str(out), "--no-progress"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    m = json.loads((out / "metrics.json").read_text())
    assert m["steps"] == 300, m  # fewer: the 120 s ran out first
    for key in ("mean_abs_sdf_error_heldout_uniform", "mean_abs_sdf_error_near_surface",
                "eikonal_residual_heldout_uniform", "eikonal_residual_near_surface", "chamfer_l1"):
        assert np.isfinite(m[key]), (key, m[key])
    # The untrained model predicts ~0 everywhere: mean |sdf| over the domain is ~0.15 and its gradient norm ~0
    # (eikonal residual ~1). After 300 steps the fit must be far better than that.
    assert m["mean_abs_sdf_error_heldout_uniform"] < 0.03, m
    assert m["eikonal_residual_heldout_uniform"] < 0.6, m
    assert m["chamfer_l1"] < 0.03, m
    # mesh.ply: a binary PLY whose header counts match the body size
    data = (out / "mesh.ply").read_bytes()
    header, body = data.split(b"end_header\n", 1)
    nv = int(header.split(b"element vertex ")[1].split(b"\n")[0])
    nf = int(header.split(b"element face ")[1].split(b"\n")[0])
    assert nv == m["mesh_vertices"] > 100 and nf == m["mesh_faces"] > 100
    assert len(body) == nv * 12 + nf * 13
    assert struct.unpack("<B", body[nv * 12:nv * 12 + 1])[0] == 3
    # render.png: an image with the shape in it (not all background)
    import imageio.v3 as iio

    img = iio.imread(out / "render.png")
    assert img.shape == (48, 48, 3)
    assert 0.02 < m["render_hit_fraction"] < 0.9 and (img != 255).any()
