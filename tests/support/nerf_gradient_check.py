"""Run by tests/test_nerf_multiworker.py in a fresh process, `python -m support.nerf_gradient_check` with examples/
on PYTHONPATH (two logical CPU devices must be set up before TensorFlow starts): the all-reduced gradient of one
global batch under MirroredStrategy (2 replicas, each marching its own half of the rays with the occupancy sampler:
ragged sample counts) against the single-process gradient of the same batch, for each way of aggregating the
table's gradient (--table-grad allreduce and gather). Prints one JSON line: per step and mode, per variable the
largest absolute difference and the largest gradient magnitude, the projection <g_2, g_1> / <g_1, g_1>; per step
the samples each replica marched; and, per replica, whether nerf.collectives' helpers gave what NumPy gives."""

import json
import os
import sys

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

from nerf import train  # noqa: E402
from nerf.collectives import gather_evaluations, gather_rows_and_sum  # noqa: E402
from nerf.data import load_dataset  # noqa: E402

argv = sys.argv[1:]
args_1 = train.parse_args(argv)
args_2 = train.parse_args([*argv, "--strategy", "mirrored", "--replicas", "2"])
assert args_1.sampler == args_2.sampler == "occupancy"
ds = load_dataset("builtin", background=args_1.background_rgb, seed=args_1.scene_seed, H=args_1.scene_res,
                  W=args_1.scene_res)
one = train.Trainer(args_1, ds)
MODES = ("allreduce", "gather")
two = {}
mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])  # one for both: separate strategies in one process
for mode in MODES:                                             # would allocate clashing collective keys
    args_2 = train.parse_args([*argv, "--strategy", "mirrored", "--replicas", "2", "--table-grad", mode])
    two[mode] = train.Trainer(args_2, ds, strategy=mirrored)
    assert two[mode].strategy.num_replicas_in_sync == 2 and two[mode].gather_table_grad == (mode == "gather")
    for a, b in zip(one.model.get_weights(), two[mode].model.get_weights()):
        np.testing.assert_array_equal(a, b)  # the same seeded initialisation

result = {"steps": []}
for step_no in range(int(os.environ.get("GRAD_CHECK_STEPS", "3"))):
    if step_no % args_1.grid_every == 0:
        for t in (one, *two.values()):
            t.update_grid(step_no)
    idx = one.next_rays()
    for t in two.values():
        np.testing.assert_array_equal(one.model.grid.bits.numpy(), t.model.grid.bits.numpy())
        assert np.array_equal(idx, t.next_rays())
    g1 = one.gradients(idx, step_no)
    flat1 = np.concatenate([g.ravel() for g in g1]).astype(np.float64)
    half = len(idx) // 2
    o, d = one.batch(tf.constant(one.ray_rows(idx)))[:2]
    m = [one.model.march(o[i * half:(i + 1) * half], d[i * half:(i + 1) * half]) for i in range(2)]
    entry = dict(rays=len(idx), samples_per_replica=[int(x.t_starts.shape[0]) for x in m],
                 max_abs=[float(np.abs(a).max()) for a in g1], modes={})
    for mode, t in two.items():
        g2 = t.gradients(idx, step_no)
        flat2 = np.concatenate([g.ravel() for g in g2]).astype(np.float64)
        entry["modes"][mode] = dict(max_abs_diff=[float(np.abs(a - b).max()) for a, b in zip(g1, g2)],
                                    projection=float(flat2 @ flat1 / (flat1 @ flat1)))
    result["steps"].append(entry)
    # train the single process one step on that batch (its own step), so the next check starts from trained
    # weights (copied: the comparison is of one step's gradients, not of accumulated rounding)
    one._step_fn(one.distribute_rays(one.ray_rows(idx)), tf.constant(step_no, tf.int64), tf.constant([0.0]),
                 tf.constant(len(idx), tf.float32))
    for t in two.values():
        for v2, v1 in zip(t.model.weights, one.model.weights):
            v2.assign(v1.numpy())


def check_collectives(strategy):
    """gather_rows_and_sum (replicas with 3 and 5 rows) and gather_evaluations (7 points over 2 replicas) against
    NumPy: per replica, whether every output is exactly the expected one."""
    rows_np = [np.arange(n * 4, dtype=np.float32).reshape(n, 4) + 100 * r for r, n in enumerate((3, 5))]
    points = np.random.default_rng(0).uniform(-1, 1, [7, 2]).astype(np.float32)
    rows_in = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(rows_np[ctx.replica_id_in_sync_group]))

    @tf.function
    def run(rows):
        def per_replica(rows):
            rid = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32)
            got_rows, sums = gather_rows_and_sum(rows, [tf.fill([2, 3], rid + 0.25), tf.stack([rid * 1e8, 1.0])])
            return got_rows, sums, gather_evaluations(lambda p: p[:, :1] * 2.0 + p[:, 1:], tf.constant(points))

        return strategy.run(per_replica, args=(rows,))

    got_rows, sums, evals = run(rows_in)
    want_evals = (points[:, 0] * np.float32(2.0) + points[:, 1]).astype(np.float32)
    local = strategy.experimental_local_results
    return [dict(rows=bool(np.array_equal(r.numpy(), np.concatenate(rows_np)))
                 and r.dtype == tf.float32,
                 sums=bool(np.array_equal(a.numpy(), np.full([2, 3], 1.5, np.float32))
                           and np.array_equal(b.numpy(), np.float32([1e8, 2.0]))),
                 evaluations=bool(np.array_equal(e.numpy(), want_evals)))
            for r, a, b, e in zip(local(got_rows), local(sums[0]), local(sums[1]), local(evals))]


result["collectives"] = check_collectives(mirrored)
print("RESULT " + json.dumps(result))
