"""Multi-worker NeRF training (examples/nerf/train.py --strategy multiworker, launch_local.py): loopback only.

Every process is started as the leader of a new process group and killed (the whole group) when its test ends, whatever happens;
every wait is bounded. The runs are tiny (24×24 scene, 256 rays/step, 2^12 table) to fit 2 CPU cores.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from nerf import distributed

from support import scripts
from support.paths import EXAMPLES

pytestmark = pytest.mark.nerf  # the NeRF example's tests: `pytest tests -m nerf` (README)

TRAIN = os.path.join(EXAMPLES, "nerf", "train.py")
LAUNCH = os.path.join(EXAMPLES, "nerf", "launch_local.py")

# the uniform sampler (fixed batches: a 2-worker run matches one process step for step)
TINY = ["--scene-res", "24", "--batch-rays", "256", "--samples", "16", "--log2-table", "12", "--eval-views", "1",
        "--final-views", "1", "--no-progress", "--sampler", "uniform"]
# the occupancy sampler (the default), small grid warm-up and frequent updates: many grid updates in a short run
TINY_OCC = ["--scene-res", "24", "--log2-table", "12", "--eval-views", "1", "--final-views", "1", "--no-progress",
            "--sample-budget", "4096", "--grid-warmup", "16", "--grid-every", "4"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("scene_cache")
    return dict(os.environ, TF_METAL_OPS_CACHE=str(cache), TF_CPP_MIN_LOG_LEVEL="3")


class Procs:
    """Started processes, each leading a new process group; killed (whole group) at teardown."""

    def __init__(self):
        self.procs = []

    def start(self, cmd, env, out_path):
        out = open(out_path, "w")
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, text=True)
        out.close()
        self.procs.append(p)
        return p

    def kill_all(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)


@pytest.fixture
def procs():
    ps = Procs()
    yield ps
    ps.kill_all()


def run_launcher(procs, env, tmp_path, name, *train_args, workers=2, timeout=150):
    log = tmp_path / f"{name}.log"
    p = procs.start([sys.executable, LAUNCH, "--workers", str(workers), "--cores-per-worker", "1",
                     "--timeout", str(timeout - 10), "--", *train_args], env, log)
    rc = p.wait(timeout=timeout)
    return rc, log.read_text()


def weights(path):
    with np.load(path) as z:
        return [z[k] for k in sorted(z.files, key=lambda k: int(k.split("_")[1]))]


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_two_workers_stay_bitwise_in_sync_and_match_one_process(tmp_path, env, procs):
    """2 workers × 30 steps: identical weights on both (all-reduced gradients, the ops' deterministic CPU
    gradients); the same as one process with the same global batch and seed up to float rounding (the global
    loss is a sum of the two halves' means instead of one mean)."""
    common = [*TINY, "--steps", "30", "--no-jitter", "--save-worker-weights", "--checkpoint-every", "10"]
    rc, log = run_launcher(procs, env, tmp_path, "mw", *common, "--out", str(tmp_path / "mw"))
    assert rc == 0, log[-4000:]
    assert "launch_local: all 2 worker(s) finished" in log and "replicas: 2" in log
    w0, w1 = weights(tmp_path / "mw" / "workers" / "rank-0.npz"), weights(tmp_path / "mw" / "workers" / "rank-1.npz")
    assert len(w0) == len(w1) >= 3  # the table and the two fused MLPs' parameters at least
    for a, b in zip(w0, w1):
        np.testing.assert_array_equal(a, b)

    with open(tmp_path / "mw" / "metrics.json") as f:
        mw = json.load(f)
    assert mw["cluster"]["workers"] == 2 and all(a.startswith("127.0.0.1:") for a in mw["cluster"]["addresses"])
    assert mw["cluster"]["allreduce_bytes_per_step"] == 4 * mw["n_params"] == 4 * sum(a.size for a in w0)
    assert mw["final"]["steps"] == 30 and len(mw["train_losses"]) == 30
    # outputs from the chief only; the other worker's temporary checkpoint directory is gone
    ckpt_dir = tmp_path / "mw" / "checkpoints"
    assert sorted(os.listdir(ckpt_dir)) == ["checkpoint", "ckpt-20.data-00000-of-00001", "ckpt-20.index",
                                            "ckpt-30.data-00000-of-00001", "ckpt-30.index", "run_config.json"]
    assert (tmp_path / "mw" / "model" / "model.weights.h5").exists()

    single_out = tmp_path / "single"
    p = procs.start([sys.executable, TRAIN, *common, "--out", str(single_out)], env, tmp_path / "single.log")
    assert p.wait(timeout=120) == 0, (tmp_path / "single.log").read_text()[-3000:]
    ws = weights(single_out / "workers" / "rank-0.npz")
    # The all-reduce sums the two half-batch gradients, the single process the whole batch at once: float rounding
    # differs, and Adam's normalisation (g / sqrt(v)) turns that into visible steps on the few table entries whose
    # gradients are tiny. So: the mean difference below 1e-5, and no weight further than 1e-3 (an error in the
    # sharding or the all-reduce moves whole layers by far more).
    for a, b in zip(w0, ws):
        diff = np.abs(a - b)
        assert diff.max() < 1e-3, diff.max()
        assert diff.mean() < 1e-5, diff.mean()
    with open(single_out / "metrics.json") as f:
        single = json.load(f)
    np.testing.assert_allclose(mw["train_losses"], single["train_losses"], rtol=1e-4)


def grid_updates(path):
    with open(path) as f:
        return json.load(f)


def test_occupancy_gradient_equals_one_process(tmp_path, env):
    """Two replicas (MirroredStrategy on 2 logical CPUs) each march their half of a global ray batch with the
    occupancy sampler (different sample counts); the all-reduced gradient of that batch equals the single-process
    gradient up to float32 summation order, at several steps (weights trained in between, grid updated)."""
    p = scripts.run("nerf_gradient_check", *TINY_OCC, "--grid-warmup", "1", "--grid-every", "2", "--no-jitter",
                    "--steps", "4", "--out", tmp_path / "g", env=dict(env, GRAD_CHECK_STEPS="4"),
                    pythonpath=[EXAMPLES], timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    result = json.loads(p.stdout.split("RESULT ", 1)[1])
    # the step's collectives (nerf.collectives) against NumPy, on both replicas
    assert result["collectives"] == [dict(rows=True, sums=True, evaluations=True)] * 2, result["collectives"]
    steps = result["steps"]
    assert len(steps) == 4
    assert any(s["samples_per_replica"][0] != s["samples_per_replica"][1] for s in steps)
    for s in steps:
        assert sorted(s["modes"]) == ["allreduce", "gather"], s
        for mode in s["modes"].values():
            # float32 gradients summed in two halves vs at once: differences of a few ulps of the largest entry
            for diff, mag in zip(mode["max_abs_diff"], s["max_abs"]):
                assert mag > 0 and diff <= 1e-5 * mag, s
            assert abs(mode["projection"] - 1.0) < 1e-5, s  # a wrong normalisation scales it (e.g. 2 or 0.5)


def test_two_workers_occupancy_grids_stay_bitwise_equal(tmp_path, env, procs):
    """2 workers × 120 steps with the occupancy sampler: every one of the 30 grid updates gives both workers the
    same grid (digests of density, bitfield and step), no grid communication; the weights stay bitwise equal; the
    grid changes; during the warm-up (all cells occupied) the run matches one process step for step."""
    common = [*TINY_OCC, "--steps", "120", "--no-jitter", "--save-worker-weights", "--checkpoint-every", "0",
              "--table-grad", "gather"]  # the default for real tables; auto picks allreduce for this tiny one
    rc, log = run_launcher(procs, env, tmp_path, "mw", *common, "--out", str(tmp_path / "mw"))
    assert rc == 0, log[-4000:]
    assert "occupancy sampler" in log and "replicas: 2" in log
    workers = tmp_path / "mw" / "workers"
    u0, u1 = grid_updates(workers / "rank-0-grid-updates.json"), grid_updates(workers / "rank-1-grid-updates.json")
    assert [u["step"] for u in u0] == [u["step"] for u in u1] == list(range(0, 120, 4))
    assert [u["digest"] for u in u0] == [u["digest"] for u in u1]
    assert len({u["digest"] for u in u0}) == 30
    g0, g1 = np.load(workers / "rank-0-grid.npz"), np.load(workers / "rank-1-grid.npz")
    for k in ("density", "bits", "step"):
        np.testing.assert_array_equal(g0[k], g1[k])
    assert 0 < np.unpackbits(g0["bits"]).mean() < 0.9  # past the warm-up the grid has empty cells
    for a, b in zip(weights(workers / "rank-0.npz"), weights(workers / "rank-1.npz")):
        np.testing.assert_array_equal(a, b)
    with open(tmp_path / "mw" / "metrics.json") as f:
        mw = json.load(f)
    assert mw["final"]["trace_count"] <= 3  # varying batch sizes: no retrace per step
    table = max(weights(workers / "rank-0.npz"), key=lambda a: a.size)
    assert mw["cluster"]["table_gradient"] == "gather"
    assert mw["cluster"]["allreduce_bytes_per_step"] == 4 * (mw["n_params"] - table.size)  # the MLPs only
    assert mw["cluster"]["allgather_bytes_per_step"] == mw["config"]["sample_budget"] * (3 + 16 * 2) * 4

    single_out = tmp_path / "single"
    p = procs.start([sys.executable, TRAIN, *common, "--out", str(single_out)], env,
                    tmp_path / "single.log")
    assert p.wait(timeout=120) == 0, (tmp_path / "single.log").read_text()[-3000:]
    with open(single_out / "metrics.json") as f:
        single = json.load(f)
    assert single["rays_per_step"][:16] == mw["rays_per_step"][:16]
    np.testing.assert_allclose(mw["train_losses"][:16], single["train_losses"][:16], rtol=1e-4)


def test_grid_sync_modes_give_the_replicated_grids(tmp_path, env, procs):
    """--grid-sync broadcast (the chief's grid all-gathered to the others) gives both workers the grid the
    replicated updates give: the same digest after every update, and the same final weights, bitwise. shard (each
    worker evaluates half of the cells, one all-gather): both workers' grids are bitwise equal after every update,
    and the grid and weights are those of replicate up to float32 rounding."""
    common = [*TINY_OCC, "--steps", "40", "--no-jitter", "--save-worker-weights", "--checkpoint-every", "0"]
    runs = {}
    for mode in ("replicate", "broadcast", "shard"):
        rc, log = run_launcher(procs, env, tmp_path, mode, *common, "--grid-sync", mode, "--out", str(tmp_path / mode))
        assert rc == 0, log[-4000:]
        workers = tmp_path / mode / "workers"
        runs[mode] = [[u["digest"] for u in grid_updates(workers / f"rank-{r}-grid-updates.json")] for r in (0, 1)]
        runs[mode + "-weights"] = weights(workers / "rank-1.npz")
    assert len(runs["replicate"][0]) == 10
    assert runs["broadcast"][0] == runs["broadcast"][1] == runs["replicate"][0] == runs["replicate"][1]
    for a, b in zip(runs["replicate-weights"], runs["broadcast-weights"]):
        np.testing.assert_array_equal(a, b)
    # shard: the workers' grids are bitwise equal after every update; the densities come from the MLP on half
    # the cells, whose matrix products may round differently from the whole batch's
    assert runs["shard"][0] == runs["shard"][1]
    for a, b in zip(runs["replicate-weights"], runs["shard-weights"]):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-4 * np.abs(a).max())
    for mode in ("replicate", "shard"):
        with np.load(tmp_path / mode / "workers" / "rank-0-grid.npz") as z:
            runs[mode + "-grid"] = z["density"], z["bits"]
    (d_rep, bits_rep), (d_shard, bits_shard) = runs["replicate-grid"], runs["shard-grid"]
    np.testing.assert_allclose(d_shard, d_rep, rtol=0, atol=1e-4 * d_rep.max())
    assert np.mean(bits_shard != bits_rep) <= 0.01


def test_killed_worker_stops_the_job_and_a_restart_resumes(tmp_path, env, procs):
    """SIGKILL worker 1 after the first checkpoint: the launcher names it, stops the chief and exits non-zero
    within a bounded time; every checkpoint it left is complete; the same command resumes from the last one and
    ends with exactly the weights and the occupancy grid of an uninterrupted run (batches, sample jitter and grid
    updates are functions of the step; the grid and the ray-stream position are checkpointed)."""
    steps = 240
    common = [*TINY_OCC, "--steps", str(steps), "--checkpoint-every", "20", "--save-worker-weights",
              "--table-grad", "gather"]
    rc, log = run_launcher(procs, env, tmp_path, "ref", *common, "--out", str(tmp_path / "ref"))
    assert rc == 0, log[-4000:]
    reference = weights(tmp_path / "ref" / "workers" / "rank-0.npz")
    reference_grid = np.load(tmp_path / "ref" / "workers" / "rank-0-grid.npz")

    out = tmp_path / "job"
    cmd = [sys.executable, LAUNCH, "--workers", "2", "--cores-per-worker", "1", "--timeout", "140", "--",
           *common, "--out", str(out)]
    launcher = procs.start(cmd, env, tmp_path / "job1.log")
    ckpt_state, pids_file = out / "checkpoints" / "checkpoint", out / "logs" / "pids.json"
    deadline = time.monotonic() + 120
    while not (ckpt_state.exists() and pids_file.exists()):
        assert launcher.poll() is None, (tmp_path / "job1.log").read_text()[-4000:]
        assert time.monotonic() < deadline, "no checkpoint within 120 s"
        time.sleep(0.05)
    with open(pids_file) as f:
        pids = json.load(f)["workers"]
    os.kill(pids[1], signal.SIGKILL)
    t_kill = time.monotonic()
    rc = launcher.wait(timeout=60)
    stopped_in = time.monotonic() - t_kill
    log1 = (tmp_path / "job1.log").read_text()
    assert rc != 0, log1[-4000:]
    assert stopped_in < 20, stopped_in
    assert f"worker 1 (pid {pids[1]}) was killed by SIGKILL" in log1, log1[-4000:]
    assert "  | worker 1 (rank 1 of 2) at 127.0.0.1:" in log1  # its last log lines
    assert not any(alive(pid) for pid in pids), "a worker outlived the launcher"
    assert not (out / "metrics.json").exists() or json.loads((out / "metrics.json").read_text()).get("final") is None

    # every checkpoint the state file names is complete (TF writes to temporary names, then renames)
    import tensorflow as tf

    state = tf.train.get_checkpoint_state(str(out / "checkpoints"))
    assert state is not None and state.all_model_checkpoint_paths
    for path in state.all_model_checkpoint_paths:
        reader = tf.train.load_checkpoint(path)
        names = reader.get_variable_to_shape_map()
        for name in names:
            reader.get_tensor(name)  # raises on a truncated file
        step_key = next(n for n in names if n.startswith("step/"))
        assert int(reader.get_tensor(step_key)) == int(path.rsplit("-", 1)[1])
    last = int(state.model_checkpoint_path.rsplit("-", 1)[1])
    assert 0 < last < steps

    launcher = procs.start(cmd, env, tmp_path / "job2.log")
    rc = launcher.wait(timeout=150)
    log2 = (tmp_path / "job2.log").read_text()
    assert rc == 0, log2[-4000:]
    assert f"resumed from {out / 'checkpoints' / f'ckpt-{last}'}: step {last}" in log2
    # the other worker got the chief's restored state by broadcast, without reading checkpoint files
    assert f"resumed from the chief's checkpoint: step {last}" in (out / "logs" / "worker-1.log").read_text()
    with open(out / "metrics.json") as f:
        m = json.load(f)
    assert m["final"]["steps"] == steps and m["resumed"][-1]["step"] == last and len(m["train_losses"]) == steps
    w0, w1 = weights(out / "workers" / "rank-0.npz"), weights(out / "workers" / "rank-1.npz")
    for a, b, r in zip(w0, w1, reference):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, r)
    for rank in (0, 1):
        grid = np.load(out / "workers" / f"rank-{rank}-grid.npz")
        for k in ("density", "bits", "step"):
            np.testing.assert_array_equal(grid[k], reference_grid[k])
    assert not [n for n in os.listdir(out / "checkpoints") if "temp" in n or ".tmp" in n]


def bad_config_run(env, tf_config, tmp_path):
    env = dict(env)
    env.pop("TF_CONFIG", None)
    if tf_config is not None:
        env["TF_CONFIG"] = tf_config
    t = time.monotonic()
    p = subprocess.run([sys.executable, TRAIN, "--strategy", "multiworker", *TINY, "--steps", "2",
                        "--out", str(tmp_path / "bad")], env=env, capture_output=True, text=True, timeout=60)
    return p, time.monotonic() - t


def test_bad_tf_config_is_a_clear_error_before_training(tmp_path, env):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    port = held.getsockname()[1]
    try:
        cases = {
            "not valid JSON": '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": ',
            "has no chief": json.dumps({"cluster": {}, "task": {"type": "worker", "index": 0}}),
            "already in use": json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}", "127.0.0.1:1"]},
                                          "task": {"type": "worker", "index": 0}}),
            "TF_CONFIG is not set": None,
        }
        for expected, cfg in cases.items():
            p, seconds = bad_config_run(env, cfg, tmp_path)
            assert p.returncode == 2, (expected, p.stdout[-2000:], p.stderr[-2000:])
            assert f"error: " in p.stderr and expected in p.stderr, (expected, p.stderr)
            assert "Traceback" not in p.stderr and "model " not in p.stdout  # nothing built, nothing trained
            assert not (tmp_path / "bad").exists()
    finally:
        held.close()


@pytest.mark.parametrize("cfg, expected", [
    ("[1, 2]", 'must be a JSON object with "cluster"'),
    ({"cluster": {"chief": [], "worker": []}, "task": {"type": "worker", "index": 0}}, "has no chief"),
    ({"cluster": {"worker": ["127.0.0.1:5000"]}, "task": {"type": "chief", "index": 0}}, "task chief 0 is not in"),
    ({"cluster": {"worker": ["127.0.0.1:5000"]}, "task": {"type": "worker", "index": 1}}, "task worker 1 is not in"),
    ({"cluster": {"chief": ["a:1", "b:2"]}, "task": {"type": "chief", "index": 0}}, "2 chiefs"),
    ({"cluster": {"worker": ["127.0.0.1"]}, "task": {"type": "worker", "index": 0}}, "is not host:port"),
    ({"cluster": {"worker": ["127.0.0.1:99999"]}, "task": {"type": "worker", "index": 0}}, "port in 1..65535"),
    ({"cluster": {"worker": ["h:1", "h:1"]}, "task": {"type": "worker", "index": 0}}, "appears twice"),
    ({"cluster": {"worker": ["h:1"], "ps": ["h:2"]}, "task": {"type": "worker", "index": 0}}, "not supported"),
])
def test_tf_config_validation(cfg, expected):
    with pytest.raises(distributed.ClusterConfigError, match=expected.replace(".", r"\.")):
        distributed.parse_tf_config(cfg if isinstance(cfg, str) else json.dumps(cfg))


def test_tf_config_chief_job_and_generated_configs():
    c = distributed.parse_tf_config(json.dumps({"cluster": {"chief": ["h0:1"], "worker": ["h1:1", "h2:1"]},
                                                "task": {"type": "worker", "index": 1}}))
    assert (c.rank, c.n_workers, c.is_chief, c.my_address) == (2, 3, False, "h2:1")
    configs = [distributed.parse_tf_config(t) for t in distributed.local_tf_configs(3)]
    assert [c.rank for c in configs] == [0, 1, 2] and configs[0].is_chief
    assert len({c.my_address for c in configs}) == 3 and all(c.my_address.startswith("127.0.0.1:") for c in configs)
    for c in configs:
        distributed.check_port_free(c.my_address)


def test_resume_refuses_different_settings(tmp_path, env):
    from nerf import train  # examples/nerf/train.py, in this process (no second TensorFlow start-up)

    os.environ["TF_METAL_OPS_CACHE"] = env["TF_METAL_OPS_CACHE"]
    try:
        args = [*TINY, "--steps", "4", "--checkpoint-every", "2", "--out", str(tmp_path / "run")]
        assert train.run(args)["final"]["steps"] == 4
        with pytest.raises(SystemExit) as e:
            train.run([*args, "--seed", "1"])
    finally:
        del os.environ["TF_METAL_OPS_CACHE"]
    assert "cannot resume" in str(e.value.code) and "seed 0 vs 1" in str(e.value.code), e.value.code
