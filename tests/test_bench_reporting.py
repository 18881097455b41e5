"""bench/: what the reports say about how they were measured. run_all.py marks NeRF rows it did not measure (an
earlier compare.json given with --nerf-json, or variants compare.py --reuse took from earlier runs) with their date
and command instead of claiming they come from the same run; bench/hash_grid.py compares dense table gradients in
every variant and says so."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run_all = _load("tfmo_bench_run_all", os.path.join(ROOT, "bench", "run_all.py"))

MACHINE = dict(date="2026-12-01", cpu="Test CPU", cores=2, platform="Linux", python="3.11", tensorflow="2.21",
               tf_metal_ops="0.1.0", op_threads=2)


def variant(**extra):
    return dict(dict(n_params=1, steps=100, epochs=1.0, seconds_per_epoch=10.0, ms_per_step=100.0,
                     final_test_psnr=30.0, final_eval_views=16, psnr_at={"0.2": 20.0, "0.5": 25.0, "1": 30.0}),
                **extra)


def test_nerf_measured_in_this_run_claims_the_same_run():
    nerf = {"minutes": 10.0, "variants": {"mlp": variant(reused=False, measured="2026-12-01T10:00:00+00:00",
                                                        command="python examples/nerf/train.py --model mlp")}}
    md = run_all.markdown({"machine": MACHINE, "nerf": nerf})
    assert "ratios against baselines measured in the same run.\n" in md and "reused" not in md
    assert "| mlp | 100 | 10.0 | 100 | 20.00 | 25.00 | 30.00 | this run |" in md


def test_nerf_json_rows_are_marked_reused_with_date_and_command(tmp_path):
    path = tmp_path / "compare.json"
    path.write_text(json.dumps({"minutes": 10.0, "date": "2026-11-29T12:00:00+00:00",
                                "command": "python examples/nerf/compare.py --minutes 10 --out runs/c",
                                "variants": {"mlp": variant(reused=False, measured="2026-11-29T12:00:00+00:00",
                                                            command="python examples/nerf/train.py --model mlp"),
                                             "hash-op": variant(reused=True, measured="2026-11-20T08:00:00+00:00",
                                                                command="reused runs/c/hash-op/metrics.json")}}))
    md = run_all.markdown({"machine": MACHINE, "nerf": run_all.load_reused_nerf(str(path))})
    assert "ratios against baselines measured in the same run, except the NeRF rows marked *reused*" in md
    assert ("| mlp | 100 | 10.0 | 100 | 20.00 | 25.00 | 30.00 | *reused*: 2026-11-29T12:00:00+00:00, "
            "`python examples/nerf/compare.py --minutes 10 --out runs/c` |") in md
    # a variant compare.py itself reused keeps its own, older date
    assert "| hash-op | 100 | 10.0 | 100 | 20.00 | 25.00 | 30.00 | *reused*: 2026-11-20T08:00:00+00:00, " in md
    assert "this run" not in md


def test_old_compare_json_without_provenance_gets_its_file_date(tmp_path):
    path = tmp_path / "compare.json"
    path.write_text(json.dumps({"minutes": 10.0, "variants": {"mlp": variant()}}))
    os.utime(path, (1700000000, 1700000000))
    nerf = run_all.load_reused_nerf(str(path))
    assert nerf["reused"]["date"].startswith("2023-11-14T22:13:20+00:00 (date of ")
    md = run_all.markdown({"machine": MACHINE, "nerf": nerf})
    assert "| mlp | 100 | 10.0 | 100 | 20.00 | 25.00 | 30.00 | *reused*: 2023-11-14T22:13:20+00:00 (date of " in md
    assert "(arguments not recorded)" in md


def test_hash_grid_bench_compares_dense_table_gradients(tmp_path):
    """A tiny run of bench/hash_grid.py: every fwd+bwd variant is timed with a dense table gradient, and the JSON
    says which kind each tape returned before densifying (float32 pure-TF: IndexedSlices, so the densification was
    needed there; float16 pure-TF: already dense; the op, in either layout: dense)."""
    out = tmp_path / "hg.json"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "hash_grid.py"), "--points", "1024",
                          "--repeats", "1", "--threads", "1", "--json", str(out)], capture_output=True, text=True,
                         cwd=str(tmp_path))
    assert run.returncode == 0, run.stderr[-4000:]
    r = json.loads(out.read_text())
    assert r["table_gradient"].startswith("dense in every variant")
    assert r["raw_table_gradient"] == {
        "float32": {"op": "dense", "op feature-major": "dense", "pure-TF": "IndexedSlices",
                    "pure-TF XLA": "IndexedSlices"},
        "float16": {"op": "dense", "op feature-major": "dense", "pure-TF": "dense", "pure-TF XLA": "dense"}}
    assert {"op fwd feature-major (1 thr)", "op fwd+bwd feature-major (1 thr)"} <= set(r["median_ms"]["float32"])
    assert run.stdout.count("table gradient: dense in every fwd+bwd variant") == 2
    md = run_all.markdown({"machine": MACHINE, "hash_grid": r})
    assert "fwd+bwd table gradient: dense in every variant" in md


def test_op_tables_show_ratios_and_ops_that_do_not_compile():
    rows = [dict(op="volume_render_packed", mode="fwd+bwd", median_ms={"op": 2.0, "tf": 10.0, "tf+xla": 5.0}),
            dict(op="distortion_loss_packed", mode="fwd", median_ms={"op": 1.0, "tf": 3.0})]
    md = run_all.markdown({"machine": MACHINE, "render_packed": {
        "config": dict(samples=100, rays=10, min_per_ray=1, max_per_ray=30, channels=3), "rows": rows}})
    assert "| volume_render_packed | fwd+bwd | 2.0 | 10.0 | 5.0 | 5.00x | 2.50x |" in md
    assert "| distortion_loss_packed | fwd | 1.0 | 3.0 | does not compile | 3.00x | - |" in md
    assert "| op | mode | op (ms) | segment-op graph (ms) | XLA (ms) | graph / op | XLA / op |\n|---|---|---|---|---|---|---|" in md


def _atomics_bench():
    sys.path.insert(0, os.path.join(ROOT, "bench"))  # bench scripts import bench_util as a sibling
    try:
        return _load("tfmo_bench_hash_grid_atomics", os.path.join(ROOT, "bench", "hash_grid_atomics.py"))
    finally:
        sys.path.pop(0)


def test_hash_grid_atomics_reference_counts_match_a_direct_count():
    """bench/hash_grid_atomics.py's reference columns against a loop over SIMD groups, corners and lanes."""
    import numpy as np

    from tf_metal_ops.hash_grid import HashGridConfig, reference

    bench = _atomics_bench()
    cfg = HashGridConfig(3, n_levels=3, n_features_per_level=2, log2_hashmap_size=8, base_resolution=2,
                         per_level_scale=2.0)
    rng = np.random.default_rng(3)
    x = rng.random((75, 3), dtype=np.float32)  # 3 SIMD groups, the last one partial
    x[32:64] = x[32]  # one group of identical points
    got = bench.reference_counts(x, cfg)
    for level, g in enumerate(got):
        rows = np.stack([r for r, _, _ in reference.level_corners(x, cfg, level)], 1)
        per_corner = pooled = 0
        for start in range(0, len(x), 32):
            grp = rows[start:start + 32]
            per_corner += sum(len(set(grp[:, c].tolist())) for c in range(8))
            pooled += len(set(grp.ravel().tolist()))
        assert g == {"scatter": 75 * 8 * 2, "simd_per_corner": per_corner * 2, "simd": pooled * 2}
    assert got[0]["simd"] < got[0]["scatter"]


def test_hash_grid_atomics_ray_points_are_ray_major_and_in_the_box():
    import numpy as np

    bench = _atomics_bench()
    x = bench.ray_points(16, 64, np.random.default_rng(0))
    assert x.shape == (16 * 64, 3) and x.dtype == np.float32
    assert (x >= 0).all() and (x <= 1).all()
    steps = np.linalg.norm(np.diff(x.reshape(16, 64, 3), axis=1), axis=-1)
    assert steps.max() < 0.1  # consecutive samples of one ray are close (<= 2 bins of the box's diagonal)


def test_hash_grid_atomics_before_after_table():
    bench = _atomics_bench()
    levels = lambda v: [{"rmw": v, "cas": 0, "cas_failed": 0, "load": 0, "store": 0}] * 2  # noqa: E731
    run = lambda v: {p: {"rays": {pn: {"levels": levels(v), "kernels": {}} for pn in bench.PASSES}}  # noqa: E731
                     for p in bench.MSL_VERSIONS}
    config = {"n_levels": 2, "F": 2, "log2_hashmap_size": 4, "base_resolution": 2, "per_level_scale": 2.0,
              "resolutions": [2, 4], "level_sizes": [8, 16]}
    ref = {"rays": [{"scatter": 100, "simd_per_corner": 50, "simd": 40}] * 2}
    report = dict(date="2026-12-05", cpu="Test CPU", cores=2, workers=2, commit="abc", command="python x", points=16,
                  config=config, runs=run(100), reference=ref,
                  baseline=dict(path=os.path.join(ROOT, "bench", "b.json"), date="2026-12-04", commit="old", workers=2,
                                runs=run(400)))
    md = bench.markdown(report)
    assert "## Before → after" in md and "kernels of commit old" in md
    assert "| 0 | 400 | 100 | 0.250 |" in md and "| all | 800 | 200 | 0.250 |" in md
    assert "## Before" not in bench.markdown(dict(report, baseline=None))
