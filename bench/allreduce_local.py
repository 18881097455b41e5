#!/usr/bin/env python
"""The per-step costs of the NeRF trainer's two ways to aggregate the hash table's gradient (--table-grad), between
N local workers pinned to one core each (MultiWorkerMirroredStrategy, RING, as examples/nerf/train.py):

* allreduce: the all-reduce of the default hash model's dense gradient (3,164,819 float32), and the table-gradient
  kernel over the worker's share of the samples;
* gather: the all-gather of every worker's share of 2^15 samples x (3 + 32) float32, and the table-gradient kernel
  over all of them;

and the Adam update of that many parameters on one thread, by Keras's apply_gradients and by nerf/fused_adam.py
(every worker repeats it).

    python bench/allreduce_local.py                  # 2 workers, the default hash model and sample budget

Prints the CPU model and, from the chief, the median over --repeats of each, each mode's sum and their ratio.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "examples"))


def worker(n, repeats, samples, n_workers):
    import tensorflow as tf

    comm = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=comm)
    import keras

    with strategy.scope():
        v = tf.Variable(tf.zeros([n]))
        opt = keras.optimizers.Adam(1e-2, beta_2=0.99, epsilon=1e-15)
        opt.build([v])

    x = tf.random.stateless_uniform([n], [1, 2])

    @tf.function
    def allreduce(i):  # as nerf/trainer.py's step: a per-replica value reduced with SUM (an all-reduce under MWMS)
        per = strategy.run(lambda: x + tf.cast(i, tf.float32))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per, axis=None)

    times = timed(lambda i: allreduce(tf.constant(i)).numpy(), repeats)
    # --table-grad gather: each worker all-gathers its share of the samples' positions and feature gradients
    share = tf.random.stateless_uniform([samples // n_workers, 35], [3, 4])

    @tf.function
    def allgather(i):
        per = strategy.run(lambda: tf.distribute.get_replica_context().all_gather(share + tf.cast(i, tf.float32), 0))
        return strategy.experimental_local_results(per)[0]

    res = dict(allreduce=times, allgather=timed(lambda i: allgather(tf.constant(i)).numpy(), repeats))
    # the latency of one collective: the step's 16-byte all-reduce (loss, clock, sample counts), and an all-gather
    # of one 35-float row per worker
    tiny = tf.zeros([4])

    @tf.function
    def allreduce_tiny(i):
        per = strategy.run(lambda: tiny + tf.cast(i, tf.float32))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per, axis=None)

    @tf.function
    def allgather_tiny(i):
        ctx = tf.distribute.get_replica_context
        per = strategy.run(lambda: ctx().all_gather(share[:1] + tf.cast(i, tf.float32), 0))
        return strategy.experimental_local_results(per)[0]

    res["allreduce_16_bytes"] = timed(lambda i: allreduce_tiny(tf.constant(i)).numpy(), repeats)
    res["allgather_1_row"] = timed(lambda i: allgather_tiny(tf.constant(i)).numpy(), repeats)
    # the rest on this worker alone (plain variables, outside the strategy)
    import tf_metal_ops
    from nerf import fused_adam

    for kind in ("adam", "fused_adam"):
        local = tf.Variable(tf.zeros([n]))
        opt = keras.optimizers.Adam(1e-2, beta_2=0.99, epsilon=1e-15)
        opt.build([local])
        fn = (tf.function(lambda g: opt.apply_gradients([(g, local)])) if kind == "adam" else
              tf.function(lambda g: fused_adam.apply(opt, [g], [local])))
        res[kind] = timed(lambda i: (fn(x), local.numpy()), repeats)
    enc = tf_metal_ops.HashGridEncoding(n_levels=16, n_features_per_level=2, log2_hashmap_size=17,
                                        base_resolution=16, per_level_scale=(512 / 16) ** (1 / 15),
                                        implementation="op")
    for name, m in (("table_grad_share", samples // n_workers), ("table_grad_all", samples)):
        pos, dy = tf.random.stateless_uniform([m, 3], [5, 6]), tf.random.stateless_normal([m, 32], [7, 8])
        enc(pos)
        fn = tf.function(lambda: enc.table_gradient(pos, dy))
        res[name] = timed(lambda i: fn().numpy(), repeats)
    return res


def timed(fn, repeats):
    """Seconds of each of ``repeats`` calls ``fn(i)`` after two warm-up calls."""
    out = []
    for i in range(repeats + 2):
        t = time.perf_counter()
        fn(i)
        if i >= 2:
            out.append(time.perf_counter() - t)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--params", type=int, default=3_164_819)
    p.add_argument("--samples", type=int, default=2 ** 15, help="samples per step (the sample budget)")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--role", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.role is not None:
        res = worker(a.params, a.repeats, a.samples, a.workers)
        print("RESULT " + json.dumps(res), flush=True)
        return
    from bench_util import cpu_model
    from nerf.distributed import local_tf_configs

    configs = local_tf_configs(a.workers)
    procs = []
    for i, cfg in enumerate(configs):
        env = dict(os.environ, TF_CONFIG=cfg, TF_CPP_MIN_LOG_LEVEL="3", TF_NUM_INTRAOP_THREADS="1",
                   TF_NUM_INTEROP_THREADS="1")
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--role", str(i), "--params", str(a.params), "--repeats",
             str(a.repeats), "--samples", str(a.samples), "--workers", str(a.workers)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=(lambda c=i: os.sched_setaffinity(0, {c % os.cpu_count()}))))
    outs = [pr.communicate(timeout=600)[0] for pr in procs]
    if "RESULT " not in outs[0]:
        sys.exit("the chief failed:\n" + outs[0][-3000:])
    res = json.loads(outs[0].split("RESULT ", 1)[1])
    med = {k: 1000 * statistics.median(v) for k, v in res.items()}
    print(f"CPU: {cpu_model()}; {a.workers} workers x 1 core; {a.params:,} float32 = {4 * a.params:,} bytes; "
          f"{a.samples:,} samples per step; medians over {a.repeats} (ms):")
    for k, v in med.items():
        print(f"  {k:17s} {v:7.1f}")
    allreduce = med["allreduce"] + med["table_grad_share"] + med["fused_adam"]
    gather = med["allgather"] + med["table_grad_all"] + med["fused_adam"]
    print(f"--table-grad allreduce: {allreduce:.1f} ms per step (all-reduce + kernel on the share + fused Adam)")
    print(f"--table-grad gather:    {gather:.1f} ms per step (all-gather + kernel on all samples + fused Adam); "
          f"gather / allreduce = {gather / allreduce:.2f}")
    print(f"fused Adam / Keras Adam = {med['fused_adam'] / med['adam']:.2f}")

if __name__ == "__main__":
    main()
