#!/usr/bin/env python
"""Time of one MultiWorkerMirroredStrategy all-reduce (RING, as examples/nerf/train.py) of the NeRF hash model's
gradient size between N local workers pinned to one core each, and of a Keras Adam update of that many
parameters on one thread (both repeated by every worker each step; neither is split between workers).

    python bench/allreduce_local.py                  # 2 workers, 3,164,819 float32 (the default hash model)

Prints the CPU model and, from the chief, the median over --repeats of each.
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


def worker(n, repeats):
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

    times = []
    for i in range(repeats + 2):
        t = time.perf_counter()
        allreduce(tf.constant(i)).numpy()
        if i >= 2:
            times.append(time.perf_counter() - t)
    local = tf.Variable(tf.zeros([n]))  # Adam on a plain variable, outside the strategy (this worker alone)
    opt_local = keras.optimizers.Adam(1e-2, beta_2=0.99, epsilon=1e-15)
    opt_local.build([local])

    @tf.function
    def adam(g):
        opt_local.apply_gradients([(g, local)])

    adam_times = []
    for i in range(repeats + 2):
        t = time.perf_counter()
        adam(x)
        local.numpy()
        if i >= 2:
            adam_times.append(time.perf_counter() - t)
    return times, adam_times


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--params", type=int, default=3_164_819)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--role", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.role is not None:
        times, adam_times = worker(a.params, a.repeats)
        print("RESULT " + json.dumps(dict(allreduce=times, adam=adam_times)), flush=True)
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
             str(a.repeats)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=(lambda c=i: os.sched_setaffinity(0, {c % os.cpu_count()}))))
    outs = [pr.communicate(timeout=600)[0] for pr in procs]
    if "RESULT " not in outs[0]:
        sys.exit("the chief failed:\n" + outs[0][-3000:])
    res = json.loads(outs[0].split("RESULT ", 1)[1])
    mb = 4 * a.params
    print(f"CPU: {cpu_model()}; {a.workers} workers x 1 core; {a.params:,} float32 = {mb:,} bytes")
    print(f"all-reduce (RING, loopback): median {1000 * statistics.median(res['allreduce']):.1f} ms over "
          f"{len(res['allreduce'])}; Adam update on one thread: median {1000 * statistics.median(res['adam']):.1f} ms")


if __name__ == "__main__":
    main()
