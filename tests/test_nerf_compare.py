"""examples/nerf/compare.py: the report it builds from the runs' metrics.json (runs given with --reuse)."""

import json
import os

import pytest
from nerf import compare

pytestmark = pytest.mark.nerf  # the NeRF example's tests: `pytest tests -m nerf` (README)


def fake_run(minutes, ms_per_step, curve, samples_per_ray=None):
    """metrics.json of a finished train.py run: evaluations every 10 % of the budget, one step late."""
    budget = minutes * 60
    step_s = ms_per_step / 1000
    evals = [dict(step=round((k * budget / 10) / step_s), train_seconds=k * budget / 10 + 0.5 * step_s,
                  test_psnr=p) for k, p in enumerate(curve, start=1)]
    steps = round(budget / step_s)
    evals[-1].update(step=steps, train_seconds=budget)
    final = dict(evals[-1], steps=steps, epochs=steps / 100, seconds_per_epoch=100 * step_s,
                 seconds_per_step=step_s, eval_views=16)
    run = dict(config=dict(minutes=minutes), dataset="builtin: fake", n_params=123, evals=evals, final=final)
    if samples_per_ray is not None:  # per step, as train.py records them
        run["samples_per_ray"] = samples_per_ray(steps)
    return run


def test_report_from_reused_runs(tmp_path, capsys):
    curves = {"mlp": [10 + k for k in range(10)],
              "hash-op-occupancy": [22 + k for k in range(10)],
              "hash-op": [20 + k for k in range(10)],
              "hash-puretf": [20 + k / 2 for k in range(10)]}
    speed = {"mlp": 300, "hash-op-occupancy": 120, "hash-op": 100, "hash-puretf": 250}
    # occupancy run: 64 samples per ray while the grid warms up (first 900 steps), 8 afterwards
    spr = {"hash-op-occupancy": lambda n: [64.0] * 900 + [8.0] * (n - 900)}
    for name, curve in curves.items():
        os.makedirs(tmp_path / name)
        with open(tmp_path / name / "metrics.json", "w") as f:
            json.dump(fake_run(10, speed[name], curve, spr.get(name)), f)
    table = compare.main(["--minutes", "10", "--out", str(tmp_path), "--reuse"])
    out = capsys.readouterr().out
    assert "train.py" not in out and out.count("reusing") == 4  # nothing was run
    # PSNR at 2 and 5 minutes: the evaluations due then (half a step late), not the ones before
    assert table["hash-op"]["psnr_at"] == {"0.2": 21, "0.5": 24, "1": 29}
    assert table["hash-puretf"]["psnr_at"] == {"0.2": 20.5, "0.5": 22.0, "1": 24.5}
    # hash-op passes puretf's final 24.5 dB at its 6th evaluation (6 min)
    assert table["hash-op"]["seconds_to_puretf_final"] == pytest.approx(360.05)
    md = (tmp_path / "compare.md").read_text()
    assert "| hash-op | 123 | 6000 | 60.00 | 10.0 | 100 | - | 21.00 | 24.00 | 29.00 |" in md
    # samples per ray: the mean over the last 10 % of the steps (after the warm-up)
    assert table["hash-op-occupancy"]["samples_per_ray"] == 8.0 and table["hash-op"]["samples_per_ray"] is None
    assert "| hash-op-occupancy | 123 | 5000 | 50.00 | 12.0 | 120 | 8.0 | 23.00 | 26.00 | 31.00 |" in md
    assert "hash-op-occupancy vs hash-op (uniform sampler): +2.00 dB; ms/step 120 vs 100" in md
    # hash-op's final 29 dB: the occupancy run's 8th evaluation (22 + 7) at 8 min
    assert table["hash-op-occupancy"]["seconds_to_uniform_final"] == pytest.approx(480.06)
    assert "hash-op-occupancy reaches hash-op's final 29.00 dB after 8.0 min of training (1.2x sooner)" in md
    assert "hash-op vs mlp: +10.00 dB; time per epoch mlp / hash-op = 3.00x" in md
    assert "hash-op vs hash-puretf (XLA): +4.50 dB; time per epoch puretf / op = 2.50x" in md
    assert "after 6.0 min of training (1.7x sooner)" in md
    assert os.path.getsize(tmp_path / "compare.png") > 1000


def test_a_run_of_another_budget_is_not_reused(tmp_path, monkeypatch):
    os.makedirs(tmp_path / "mlp")
    with open(tmp_path / "mlp" / "metrics.json", "w") as f:
        json.dump(fake_run(5, 300, list(range(10))), f)
    calls = []

    class Done:
        returncode = 1

    monkeypatch.setattr(compare.subprocess, "run", lambda cmd: calls.append(cmd) or Done())
    with pytest.raises(SystemExit):
        compare.main(["--minutes", "10", "--out", str(tmp_path), "--reuse", "--variants", "mlp"])
    assert len(calls) == 1 and "--minutes" in calls[0]


def test_reused_and_measured_variants_are_marked(tmp_path, monkeypatch):
    """compare.json records its date and command, and per variant whether this comparison measured it (with the
    train.py command) or --reuse took it from an earlier run (with that file's date); compare.md names the reused."""
    for name in ("mlp", "hash-puretf"):
        os.makedirs(tmp_path / name)
        with open(tmp_path / name / "metrics.json", "w") as f:
            json.dump(fake_run(10, 300, list(range(10, 20))), f)
    os.utime(tmp_path / "mlp" / "metrics.json", (1700000000, 1700000000))  # 2023-11-14T22:13:20Z

    class Done:
        returncode = 0

    def fake_train(cmd):  # the hash-op run: writes its metrics.json as train.py would
        out = cmd[cmd.index("--out") + 1]
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "metrics.json"), "w") as f:
            json.dump(fake_run(10, 100, list(range(20, 30))), f)
        return Done()

    monkeypatch.setattr(compare.subprocess, "run", fake_train)
    table = compare.main(["--minutes", "10", "--out", str(tmp_path), "--reuse"])
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert saved["command"] == f"python examples/nerf/compare.py --minutes 10 --out {tmp_path} --reuse"
    assert saved["date"][:4].isdigit() and saved["variants"] == json.loads(json.dumps(table))
    assert table["mlp"]["reused"] and table["hash-puretf"]["reused"] and not table["hash-op"]["reused"]
    assert table["mlp"]["measured"] == "2023-11-14T22:13:20+00:00"
    assert table["mlp"]["command"].startswith("reused " + str(tmp_path / "mlp" / "metrics.json"))
    assert table["hash-op"]["measured"] == saved["date"]
    assert table["hash-op"]["command"].startswith("python examples/nerf/train.py ") and "--out" in table["hash-op"]["command"]
    md = (tmp_path / "compare.md").read_text()
    assert "mlp: reused from an earlier run (measured 2023-11-14T22:13:20+00:00" in md
    assert "hash-puretf: reused from an earlier run" in md and "hash-op: reused" not in md


def test_variants_sample_as_named():
    """hash-op and hash-puretf keep the uniform sampler (the earlier comparisons' protocol); hash-op-occupancy is the
    same model with the occupancy sampler."""
    from nerf import train

    args = {name: train.parse_args(argv) for name, argv in compare.VARIANTS.items()}
    assert args["hash-op-occupancy"].sampler == "occupancy" and args["hash-op"].sampler == "uniform"
    assert args["hash-puretf"].sampler == "uniform" and args["mlp"].sampler == "uniform"
    assert (args["hash-op-occupancy"].model, args["hash-op-occupancy"].impl) == (args["hash-op"].model, args["hash-op"].impl)
