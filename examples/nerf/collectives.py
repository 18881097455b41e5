"""The cross-replica exchanges of the NeRF trainer, in replica context (inside ``strategy.run``) unless stated.

Every function here returns the same bits on every replica: what is summed is summed in replica order, and the
all-gathers deliver every replica's slice unchanged. One collective costs 1.3–2.3 ms of latency between two local
workers on one core each (``bench/allreduce_local.py``), so a step sends what it must in as few of them as it can.
"""

from __future__ import annotations

import tensorflow as tf

# types the collectives do not carry travel as int32
_WIRE = {tf.uint8: tf.int32, tf.bool: tf.int32}


def make_broadcast(strategy, variables):
    """A function (cross-replica context) that gives every variable in ``variables`` the chief's value on every
    worker: an all-gather that keeps replica 0's slice (exact bits)."""

    def replica_values():
        ctx = tf.distribute.get_replica_context()
        out = []
        for v in variables:
            x = tf.convert_to_tensor(v)
            x = tf.cast(x, _WIRE[x.dtype]) if x.dtype in _WIRE else x
            out.append(tf.cast(ctx.all_gather(x[None], axis=0)[0], v.dtype))
        return out

    @tf.function
    def gather():
        return [strategy.experimental_local_results(x)[0] for x in strategy.run(replica_values)]

    def broadcast():
        for v, x in zip(variables, gather()):
            v.assign(x)

    return broadcast


def gather_rows_and_sum(rows, summands):
    """One all-gather of every replica's ``rows`` and ``summands``.

    Args:
      rows: float32 [n_r, W] with a static W; n_r may differ between replicas.
      summands: float32 tensors of static shapes, the same on every replica.
    Returns:
      (all replicas' rows concatenated in replica order [sum n_r, W], the summands summed over the replicas in
      replica order (r = 0 first), each in its shape).

    Each replica sends one block: a header of ceil((K + 1) / W) rows holding the K summand values and its row count
    (int32 bits in a float32 slot), then its rows.
    """
    ctx = tf.distribute.get_replica_context()
    n_rep = ctx.num_replicas_in_sync
    width = int(rows.shape[1])
    shapes = [s.shape for s in summands]
    count = tf.bitcast(tf.shape(rows, out_type=tf.int32)[:1], tf.float32)
    flat = tf.concat([tf.reshape(s, [-1]) for s in summands] + [count], 0)
    k = int(flat.shape[0])
    h = -(-k // width)
    header = tf.reshape(tf.pad(flat, [[0, h * width - k]]), [h, width])
    gathered = ctx.all_gather(tf.concat([header, rows], 0), axis=0)
    start, total, blocks = tf.constant(0, tf.int32), None, []
    for _ in range(n_rep):
        values = tf.reshape(gathered[start:start + h], [-1])
        n_r = tf.bitcast(values[k - 1:k], tf.int32)[0]
        total = values[:k - 1] if total is None else total + values[:k - 1]
        blocks.append(gathered[start + h:start + h + n_r])
        start = start + h + n_r
    sums, at = [], 0
    for shape in shapes:
        size = shape.num_elements()
        sums.append(tf.reshape(total[at:at + size], shape))
        at += size
    return tf.concat(blocks, 0), sums


def gather_evaluations(fn, points):
    """``fn`` of ``points`` [M, D] (the same on every replica), each replica evaluating one contiguous share
    (replica r: rows [r*M // n, (r+1)*M // n)) and one all-gather assembling the results in point order.
    ``fn`` maps [m, D] to a float32 [m] or [m, 1]; returns [M]."""
    ctx = tf.distribute.get_replica_context()
    n_rep = ctx.num_replicas_in_sync
    if n_rep == 1:
        return tf.reshape(fn(points), [-1])
    m = tf.shape(points)[0]
    rid = tf.cast(ctx.replica_id_in_sync_group, tf.int32)
    lo, hi = rid * m // n_rep, (rid + 1) * m // n_rep
    share = tf.reshape(tf.cast(fn(points[lo:hi]), tf.float32), [-1])
    return ctx.all_gather(share, axis=0)
