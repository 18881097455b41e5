"""ZeroOut: values for every dtype and rank, graph mode and shape inference, gradient, errors, raw loading."""

import zlib

import numpy as np
import pytest
import tensorflow as tf

import tf_metal_ops

DTYPES = [np.int32, np.int64, np.float32, np.float16]
SHAPES = [(), (0,), (1,), (7,), (2, 3), (3, 0, 2), (2, 3, 4), (1, 1, 1, 5), (2, 1, 3, 1, 2)]


def reference(x):
    x = np.asarray(x)
    out = np.zeros_like(x)
    if x.size:
        out.reshape(-1)[0] = x.reshape(-1)[0]
    return out


def random_array(shape, dtype, rng):
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-1000, 1000, size=shape).astype(dtype)
    return (rng.standard_normal(shape) * 10).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_values(dtype, shape):
    rng = np.random.default_rng(zlib.crc32(f"{np.dtype(dtype).name}{shape}".encode()))
    x = random_array(shape, dtype, rng)
    if x.size:
        x.reshape(-1)[0] = 7  # a non-zero first element, so "everything zero" cannot pass
    y = tf_metal_ops.zero_out(x)
    assert y.dtype == tf.as_dtype(dtype)
    assert y.shape == shape
    np.testing.assert_array_equal(y.numpy(), reference(x))


def test_seed_usage():
    y = tf_metal_ops.zero_out([[1, 2], [3, 4]])
    assert y.dtype == tf.int32
    np.testing.assert_array_equal(y.numpy(), [[1, 0], [0, 0]])


def test_load_op_library_path():
    """The seed's exact usage: tf.load_op_library(path) gives a module with zero_out."""
    module = tf.load_op_library(tf_metal_ops.library_path())
    np.testing.assert_array_equal(module.zero_out([[1, 2], [3, 4]]).numpy(), [[1, 0], [0, 0]])


@pytest.mark.parametrize("threads,chunks", [(1, 1), (2, 8), (3, 12), (4, 12)])
def test_large_tensor_uses_all_chunks(threads, chunks):
    """12 MiB of float32: ParallelFor splits the zeroing into 1 MiB grains, at most 4 chunks per thread
    (csrc/common/thread_pool.cc). The pool's counters show how many ranges ran and that together they covered
    every byte; the values show that each byte after the first element was zeroed."""
    from tf_metal_ops.threads import parallel_for_stats

    x = np.arange(1, 3 * 2**20 + 1, dtype=np.float32)
    with tf_metal_ops.num_threads(threads):
        before = parallel_for_stats()
        y = tf_metal_ops.zero_out(x).numpy()
        after = parallel_for_stats()
    assert after["ranges"] - before["ranges"] == chunks, (before, after)
    assert after["items"] - before["items"] == x.nbytes, (before, after)
    assert y[0] == 1 and not y[1:].any()


def test_small_tensor_runs_as_one_range():
    """Below one grain (1 MiB) the zeroing is not split, whatever the thread count."""
    from tf_metal_ops.threads import parallel_for_stats

    with tf_metal_ops.num_threads(4):
        before = parallel_for_stats()
        y = tf_metal_ops.zero_out(np.full(1000, 3, np.int32)).numpy()
        after = parallel_for_stats()
    assert after["ranges"] - before["ranges"] == 1 and after["items"] - before["items"] == 4000
    np.testing.assert_array_equal(y, reference(np.full(1000, 3, np.int32)))


def test_graph_mode_shape_inference():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, shape=[None, 3, 5])
        y = tf_metal_ops.zero_out(x)
        assert y.shape.as_list() == [None, 3, 5]
        u = tf.compat.v1.placeholder(tf.int64, shape=None)
        assert tf_metal_ops.zero_out(u).shape.rank is None
        with tf.compat.v1.Session(graph=g) as sess:
            out = sess.run(y, {x: np.full((2, 3, 5), 4.0, np.float32)})
    assert out.shape == (2, 3, 5) and out.flat[0] == 4.0 and out.sum() == 4.0


def test_tf_function_retraces_per_shape():
    f = tf.function(tf_metal_ops.zero_out)
    for shape in [(3,), (2, 2), ()]:
        x = np.full(shape, 5, np.int32)
        np.testing.assert_array_equal(f(x).numpy(), reference(x))
    sig = f.get_concrete_function(tf.TensorSpec([None, 4], tf.float32))
    assert sig.outputs[0].shape.as_list() == [None, 4]


def test_gradient():
    x = tf.constant([[1.5, 2.0], [3.0, 4.0]])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(tf_metal_ops.zero_out(x) * tf.constant([[2.0, 3.0], [4.0, 5.0]]))
    np.testing.assert_array_equal(tape.gradient(y, x).numpy(), [[2.0, 0.0], [0.0, 0.0]])
    theoretical, numerical = tf.test.compute_gradient(tf_metal_ops.zero_out, [tf.constant([1.0, 2.0, 3.0])])
    np.testing.assert_allclose(theoretical[0], numerical[0], atol=1e-3)


def test_wrapper_rejects_bad_dtype():
    with pytest.raises(ValueError, match="zero_out: x must be one of .*got float64"):
        tf_metal_ops.zero_out(np.ones(3, np.float64))
    with pytest.raises(ValueError, match="got string"):
        tf_metal_ops.zero_out(["a", "b"])


def test_raw_op_rejects_bad_dtype():
    module = tf.load_op_library(tf_metal_ops.library_path())
    with pytest.raises(tf.errors.InvalidArgumentError, match="allowed values"):
        module.zero_out(tf.constant([1.0], tf.float64))


def test_threads_api():
    n = tf_metal_ops.get_num_threads()
    assert n >= 1
    with tf_metal_ops.num_threads(1):
        assert tf_metal_ops.get_num_threads() == 1
        x = np.arange(1, 2_000_001, dtype=np.int32)
        assert tf_metal_ops.zero_out(x).numpy()[1:].sum() == 0
    assert tf_metal_ops.get_num_threads() == n
    with pytest.raises(ValueError):
        tf_metal_ops.set_num_threads(1.5)


def test_backend_info_reports_kernels_and_metal_reason():
    info = tf_metal_ops.backend_info()
    assert info["tensorflow"] == tf.__version__
    assert info["library_loaded"] and info["library_path"] == tf_metal_ops.library_path()
    assert info["kernels"]["ZeroOut"]["CPU"] == ["float16", "float32", "int32", "int64"]
    assert info["build"]["version"] == tf_metal_ops.__version__
    assert isinstance(info["metal_usable"], bool) and info["metal_reason"]
    if not info["build"]["metal"]:
        assert info["metal_usable"] is False
