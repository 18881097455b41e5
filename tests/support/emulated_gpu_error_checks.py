"""Error paths of the GPU host code on the Metal-emulating device, run in a subprocess by
tests/test_emulated_gpu_errors.py:

    cd tests && TF_METAL_OPS_EMULATED_GPU=1 python -m support.emulated_gpu_error_checks CHECK

Invalid shapes and attrs reach the GPU kernels through the raw ops (tf_metal_ops._library.ops(), which skip the
Python wrappers' checks; eager execution runs no shape functions), with soft placement off so an op that cannot
run on /GPU:0 fails instead of falling back to the CPU kernel. Every case asserts the exact error class and the
kernel's exact message (TF appends " [Op:<name>]..." to it, which is not compared), and each op is shown to
dispatch on the emulated GPU with valid inputs in the same process. The out-of-memory checks run with a small
device (TF_METAL_OPS_EMULATED_GPU_MEMORY_MB, set by the test before TensorFlow starts).
Exit status 0 and a last line "ok CHECK ..." on success; an AssertionError otherwise.
"""

from __future__ import annotations

import os
import re
import sys

os.environ.setdefault("TF_METAL_OPS_EMULATED_GPU", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_metal_ops  # noqa: E402,F401  (enables the emulated GPU)
from tf_metal_ops import emulated_gpu  # noqa: E402

from tf_metal_ops._library import ops  # noqa: E402
from tf_metal_ops.hash_grid import HashGridConfig  # noqa: E402

from support.gpu_check_runner import collect, main  # noqa: E402

GPU, CPU = "/GPU:0", "/CPU:0"
InvalidArgument = tf.errors.InvalidArgumentError
ResourceExhausted = tf.errors.ResourceExhaustedError

tf.config.set_soft_device_placement(False)


WRAPPED = re.compile(r"^\{\{function_node __wrapped__\S+?_device_(\S+)\}\} (.*?) \[Op:\w+\]", re.S)


def kernel_message(e: tf.errors.OpError) -> tuple[str, str]:
    """(device, message) of an eager op error: TF reports '{{function_node __wrapped__<op>_device_<device>}}
    <kernel's message>[\\n\\t [[{{node <op>}}]]] [Op:<op>] name: ...'."""
    m = WRAPPED.match(e.message)
    assert m, f"unexpected error text: {e.message!r}"
    return m.group(1), re.sub(r"\n\t \[\[\{\{node \w+\}\}\]\]$", "", m.group(2))


def expect(cls, message, fn):
    """fn() on /GPU:0 fails in the GPU kernel with exactly `cls` and exactly `message`."""
    try:
        with tf.device(GPU):
            out = fn()
            tf.nest.map_structure(lambda v: v.numpy(), out)
    except tf.errors.OpError as e:
        assert type(e) is cls, f"expected {cls.__name__}({message!r}), got {type(e).__name__}: {e.message}"
        device, got = kernel_message(e)
        assert device.endswith("/device:GPU:0"), f"{message!r}: raised on {device}, not by the GPU kernel"
        assert got == message, f"expected the message\n  {message!r}\ngot\n  {got!r}"
        return 1
    raise AssertionError(f"no error; expected {cls.__name__}: {message}")


def dispatched(kernel, fn):
    """fn() on /GPU:0 runs `kernel` on the emulated GPU (the same ops really run there when the inputs are valid)."""
    before = emulated_gpu.dispatch_counts().get(kernel, 0)
    with tf.device(GPU):
        out = fn()
    after = emulated_gpu.dispatch_counts().get(kernel, 0)
    assert after > before, f"{kernel} did not run on the emulated GPU"
    for v in tf.nest.flatten(out):
        assert v.device.endswith("GPU:0"), f"result on {v.device}"
    return out


# ---- hash grid -----------------------------------------------------------------------------------------------
CFG = HashGridConfig(3, n_levels=2, n_features_per_level=2, log2_hashmap_size=8, base_resolution=4,
                     per_level_scale=1.5)
FWD = "hash_grid_encode"
GRAD_PARAMS = "hash_grid_encode (gradient w.r.t. params)"
GRAD_POSITIONS = "hash_grid_encode (gradient w.r.t. positions)"


def hash_grid_ops(dtype=np.float32):
    """(op name in messages, call(positions, params, max_level, grad, **attrs)) for the three hash-grid ops."""
    o = ops()
    return [
        (FWD, lambda x, p, m, g, **a: o.hash_grid_encode(x, p, m, **a)),
        (GRAD_PARAMS, lambda x, p, m, g, **a: o.hash_grid_encode_grad_params(g, x, p, m, **a)),
        (GRAD_POSITIONS, lambda x, p, m, g, **a: o.hash_grid_encode_grad_positions(g, x, p, m, **a)),
    ]


def check_hash_grid_errors(seed):
    rng = np.random.default_rng(seed)
    rows, f = CFG.params_shape
    cols = CFG.n_output_dims
    x = rng.random((5, 3), dtype=np.float32)
    p = rng.uniform(-1, 1, (rows, f)).astype(np.float32)
    g = rng.standard_normal((5, cols)).astype(np.float32)
    attrs = CFG.op_kwargs()
    level = tf.constant(2)
    n = 0
    for kernel, call in zip(("hash_grid_encode_d3f2_float32", "hash_grid_grad_params_d3f2_float32",
                             "hash_grid_grad_positions_d3f2_float32"), hash_grid_ops()):
        dispatched(kernel, lambda: call[1](x, p, level, g, **attrs))
    for op, call in hash_grid_ops():
        n += expect(InvalidArgument, f"{op}: positions must have rank 2 [N, D], got shape [15]",
                    lambda: call(x.reshape(-1), p, level, g, **attrs))
        n += expect(InvalidArgument, f"{op}: positions must have 1 to 4 columns (D), got shape [3, 5]",
                    lambda: call(x[:3].repeat(2, axis=1)[:, :5], p, level, g[:3], **attrs))
        n += expect(InvalidArgument, f"{op}: positions must have 1 to 4 columns (D), got shape [5, 0]",
                    lambda: call(x[:, :0], p, level, g, **attrs))
        n += expect(InvalidArgument, f"{op}: params must have shape [table_rows, n_features_per_level=2], got "
                    f"[{rows}, 1]", lambda: call(x, p[:, :1], level, g, **attrs))
        n += expect(InvalidArgument, f"{op}: params must have shape [table_rows, n_features_per_level=2], got "
                    f"[{rows * f}]", lambda: call(x, p.reshape(-1), level, g, **attrs))
        n += expect(InvalidArgument, f"{op}: params has {rows - 8} rows, but the config needs {rows} (D=3, n_levels=2, "
                    "log2_hashmap_size=8, base_resolution=4, per_level_scale=1.5, grid_type=hash)",
                    lambda: call(x, p[:-8], level, g, **attrs))
        n += expect(InvalidArgument, f"{op}: max_level must be a scalar, got shape [1]",
                    lambda: call(x, p, tf.constant([2]), g, **attrs))
        n += expect(InvalidArgument, f"{op}: a float max_level must not be NaN",
                    lambda: call(x, p, tf.constant(np.nan, tf.float32), g, **attrs))
        # A dense D=4 table of 300^4 entries overflows int32 (checked before the row count).
        dense = dict(attrs, n_levels=1, grid_type="dense", base_resolution=300)
        n += expect(InvalidArgument, f"{op}: the table for D=4, n_levels=1, n_features_per_level=2, grid_type=dense, "
                    "base_resolution=300, per_level_scale=1.5 needs more than 2^31-1 values; use grid_type=\"hash\" "
                    "or fewer/coarser levels",
                    lambda: call(rng.random((2, 4), dtype=np.float32), p, level, g[:2, :2], **dense))
        bad_attrs = [
            (dict(attrs, n_levels=0), "n_levels must be in 1..32, got 0"),
            (dict(attrs, n_levels=33), "n_levels must be in 1..32, got 33"),
            (dict(attrs, n_features_per_level=3), "n_features_per_level must be 1, 2, 4 or 8, got 3"),
            (dict(attrs, log2_hashmap_size=25), "log2_hashmap_size must be in 1..24, got 25"),
            (dict(attrs, base_resolution=0), "base_resolution must be in 1..2^24, got 0"),
            (dict(attrs, per_level_scale=0.5), "per_level_scale must be a finite number >= 1, got 0.5"),
            (dict(attrs, per_level_scale=float("inf")), "per_level_scale must be a finite number >= 1, got inf"),
            (dict(attrs, n_levels=32, per_level_scale=2.0),
             "the finest level's scale base_resolution * per_level_scale^(n_levels-1) - 1 = 8.58993e+09 exceeds 2^24 "
             "(float32 positions cannot resolve it); lower per_level_scale or n_levels"),
            (dict(attrs, grid_type="sparse"), "grid_type must be \"hash\", \"dense\" or \"tiled\", got \"sparse\""),
            (dict(attrs, interpolation="cubic"),
             "interpolation must be \"linear\", \"smoothstep\" or \"nearest\", got \"cubic\""),
        ]
        for bad, msg in bad_attrs:  # kernel construction (CreateConfig of the GPU kernel) fails; op name fixed
            n += expect(InvalidArgument, f"{FWD}: {msg}", lambda: call(x, p, level, g, **bad))
    for op, call in hash_grid_ops()[1:]:
        n += expect(InvalidArgument, f"{op}: grad must have shape [5, {cols}] ([N, L*F]), got [4, {cols}]",
                    lambda: call(x, p, level, g[:4], **attrs))
        n += expect(InvalidArgument, f"{op}: grad must have shape [5, {cols}] ([N, L*F]), got [5, {cols - 1}]",
                    lambda: call(x, p, level, g[:, 1:], **attrs))
        n += expect(InvalidArgument, f"{op}: grad must have shape [5, {cols}] ([N, L*F]), got [{5 * cols}]",
                    lambda: call(x, p, level, g.reshape(-1), **attrs))
        # feature_major: grad [L*F, N]; the point-major shape is refused
        n += expect(InvalidArgument,
                    f"{op}: grad must have shape [{cols}, 5] ([L*F, N]: feature_major), got [5, {cols}]",
                    lambda: call(x, p, level, g, feature_major=True, **attrs))
    return f"{n} errors"


def check_hash_grid_empty_work(seed):
    """No active level (int max_level 0), only level 0 (float max_level 0.0), no points: the passes without work
    are skipped, the results match the CPU's."""
    rng = np.random.default_rng(seed)
    o = ops()
    attrs = CFG.op_kwargs()
    rows, f = CFG.params_shape
    for dtype in (np.float32, np.float16):
        p = rng.uniform(-1, 1, (rows, f)).astype(dtype)
        for npts, level in ((7, tf.constant(0)), (7, tf.constant(0.0)), (0, tf.constant(2))):
            x = rng.random((npts, 3), dtype=np.float32)
            g = rng.standard_normal((npts, CFG.n_output_dims)).astype(dtype)
            res = {}
            for device in (GPU, CPU):
                with tf.device(device):
                    res[device] = [o.hash_grid_encode(x, p, level, **attrs),
                                   o.hash_grid_encode_grad_params(g, x, p, level, **attrs),
                                   o.hash_grid_encode_grad_positions(g, x, p, level, **attrs)]
            for a, b in zip(res[GPU], res[CPU]):
                assert a.device.endswith("GPU:0"), a.device
                np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-5, atol=1e-6)
            if npts == 0 or level.dtype == tf.int32 and int(level) == 0:  # (a float 0 keeps level 0 active)
                assert not np.asarray(res[GPU][1]).any(), "no point or no active level: the table gradient is zero"
    return "max_level 0 (int, float), N=0; float32 and float16"


# ---- rendering -------------------------------------------------------------------------------------------------
def render_inputs(rng, r=4, s=8, c=3):
    sigma = rng.gamma(1.0, 2.0, (r, s)).astype(np.float32)
    rgb = rng.random((r, s, c), dtype=np.float32)
    t = np.sort(rng.uniform(2.0, 6.0, (r, s + 1)), axis=1).astype(np.float32)
    return sigma, rgb, t


def check_render_errors(seed):
    rng = np.random.default_rng(seed)
    o = ops()
    sigma, rgb, t = render_inputs(rng)
    none = np.zeros(0, np.float32)
    up = [rng.standard_normal(s).astype(np.float32) for s in ((4, 3), (4,), (4,), (4, 8))]
    dispatched("volume_render_forward", lambda: o.volume_render(sigma, rgb, t, none))
    dispatched("volume_render_backward", lambda: o.volume_render_grad(sigma, rgb, t, none, *up))
    dispatched("distortion_loss_forward", lambda: o.distortion_loss(sigma, t))
    dispatched("distortion_loss_backward", lambda: o.distortion_loss_grad(sigma, t, np.ones(4, np.float32)))
    n = 0
    for op, call in (("volume_render", lambda *a, **k: o.volume_render(*a, **k)),
                     ("volume_render_grad", lambda *a, **k: o.volume_render_grad(*a, *up, **k))):
        n += expect(InvalidArgument, f"{op}: densities must have rank 2 [rays, samples], got shape [32]",
                    lambda: call(sigma.reshape(-1), rgb, t, none))
        n += expect(InvalidArgument, f"{op}: colors must have shape [rays, samples, channels] = [4, 8, C] with C >= 1 "
                    "(matching densities), got [4, 7, 3]", lambda: call(sigma, rgb[:, :7], t, none))
        n += expect(InvalidArgument, f"{op}: colors must have shape [rays, samples, channels] = [4, 8, C] with C >= 1 "
                    "(matching densities), got [4, 8, 0]", lambda: call(sigma, rgb[:, :, :0], t, none))
        n += expect(InvalidArgument, f"{op}: colors must have shape [rays, samples, channels] = [4, 8, C] with C >= 1 "
                    "(matching densities), got [4, 24]", lambda: call(sigma, rgb.reshape(4, 24), t, none))
        n += expect(InvalidArgument, f"{op}: t (interval edges, one more than samples) must have shape [4, 9], got "
                    "[4, 8]", lambda: call(sigma, rgb, t[:, :8], none))
        n += expect(InvalidArgument, f"{op}: t (interval edges, one more than samples) must have shape [4, 9], got "
                    "[36]", lambda: call(sigma, rgb, t.reshape(-1), none))
        n += expect(InvalidArgument, f"{op}: background must have shape [C] = [3], [rays, C] = [4, 3], or [0] for "
                    "none; got [2]", lambda: call(sigma, rgb, t, np.ones(2, np.float32)))
        n += expect(InvalidArgument, f"{op}: background must have shape [C] = [3], [rays, C] = [4, 3], or [0] for "
                    "none; got [3, 3]", lambda: call(sigma, rgb, t, np.ones((3, 3), np.float32)))
        for thr in (1.5, -0.25, float("nan")):  # kernel construction; the message names volume_render for both ops
            n += expect(InvalidArgument, f"volume_render: termination_threshold must be in [0, 1], got {thr:g}",
                        lambda: call(sigma, rgb, t, none, termination_threshold=thr))
    good = (sigma, rgb, t, none)
    for i, (name, want) in enumerate((("grad_color", "[4, 3]"), ("grad_depth", "[4]"), ("grad_opacity", "[4]"),
                                      ("grad_weights", "[4, 8]"))):
        for bad in (up[i][:3], up[i].reshape(1, -1) if up[i].ndim == 1 else up[i].reshape(-1)):
            args = list(up)
            args[i] = bad
            got = "[" + ", ".join(str(d) for d in bad.shape) + "]"
            n += expect(InvalidArgument, f"volume_render_grad: {name} must have shape {want}, got {got}",
                        lambda: o.volume_render_grad(*good, *args))
    for op, call in (("distortion_loss", lambda w, tt: o.distortion_loss(w, tt)),
                     ("distortion_loss_grad", lambda w, tt: o.distortion_loss_grad(w, tt, np.ones(4, np.float32)))):
        n += expect(InvalidArgument, f"{op}: weights must have rank 2 [rays, samples], got shape [32]",
                    lambda: call(sigma.reshape(-1), t))
        n += expect(InvalidArgument, f"{op}: weights must have rank 2 [rays, samples], got shape [4, 8, 1]",
                    lambda: call(sigma[..., None], t))
        n += expect(InvalidArgument, f"{op}: t (interval edges, one more than samples) must have shape [4, 9], got "
                    "[4, 8]", lambda: call(sigma, t[:, :8]))
        n += expect(InvalidArgument, f"{op}: t (interval edges, one more than samples) must have shape [4, 9], got "
                    "[3, 9]", lambda: call(sigma, t[:3]))
    for bad in (np.ones(3, np.float32), np.ones((4, 1), np.float32)):
        got = "[" + ", ".join(str(d) for d in bad.shape) + "]"
        n += expect(InvalidArgument, f"distortion_loss_grad: grad_loss must have shape [4], got {got}",
                    lambda: o.distortion_loss_grad(sigma, t, bad))
    return f"{n} errors"


def check_render_packed_errors(seed):
    """Shape errors of the packed rendering ops, raised by the GPU host code (render_packed_gpu.cc). Value errors
    (row_splits, unsorted samples) are the kernels' NaN policy (emulated_gpu_checks.py render_packed_nan_policy)."""
    rng = np.random.default_rng(seed)
    o = ops()
    n_s, c = 9, 3
    d = rng.random(n_s, dtype=np.float32)
    cols = rng.random((n_s, c), dtype=np.float32)
    ts = np.arange(n_s, dtype=np.float32)
    te = ts + 0.5
    rs = np.array([0, 2, 5, 5, 9], np.int32)
    none = np.zeros(0, np.float32)
    up = [rng.standard_normal(sh).astype(np.float32) for sh in ((4, c), (4,), (4,), (n_s,))]
    dispatched("volume_render_packed_forward", lambda: o.volume_render_packed(d, cols, ts, te, rs, none))
    dispatched("volume_render_packed_backward", lambda: o.volume_render_packed_grad(d, cols, ts, te, rs, none, *up))
    dispatched("distortion_loss_packed_forward", lambda: o.distortion_loss_packed(d, ts, te, rs))
    dispatched("distortion_loss_packed_backward",
               lambda: o.distortion_loss_packed_grad(d, ts, te, rs, np.ones(4, np.float32)))
    n = 0
    for op, call in (("volume_render_packed", lambda *a: o.volume_render_packed(*a)),
                     ("volume_render_packed_grad", lambda *a: o.volume_render_packed_grad(*a, *up))):
        n += expect(InvalidArgument, f"{op}: densities must have rank 1 [samples], got shape [1, 9]",
                    lambda: call(d[None], cols, ts, te, rs, none))
        n += expect(InvalidArgument, f"{op}: colors must have shape [samples, channels] = [9, C] with C >= 1 "
                    "(matching densities), got [8, 3]", lambda: call(d, cols[:8], ts, te, rs, none))
        n += expect(InvalidArgument, f"{op}: t_starts must have shape [9], got [8]",
                    lambda: call(d, cols, ts[:8], te, rs, none))
        n += expect(InvalidArgument, f"{op}: t_ends must have shape [9], got [1, 9]",
                    lambda: call(d, cols, ts, te[None], rs, none))
        n += expect(InvalidArgument, f"{op}: row_splits must have shape [R + 1] (rank 1, at least one entry), got "
                    "[1, 5]", lambda: call(d, cols, ts, te, rs[None], none))
        n += expect(InvalidArgument, f"{op}: background must have shape [C] = [3], [rays, C] = [4, 3], or [0] for "
                    "none; got [3, 3]", lambda: call(d, cols, ts, te, rs, np.ones((3, 3), np.float32)))
    for thr in (1.5, float("nan")):  # kernel construction; both ops' messages name volume_render_packed
        n += expect(InvalidArgument, f"volume_render_packed: termination_threshold must be in [0, 1], got {thr:g}",
                    lambda: o.volume_render_packed(d, cols, ts, te, rs, none, termination_threshold=thr))
    n += expect(InvalidArgument, "volume_render_packed: row_splits has one entry (0 rays) but there are 9 samples; "
                "row_splits[R] must equal N", lambda: o.volume_render_packed(d, cols, ts, te, rs[:1], none))
    n += expect(InvalidArgument, "volume_render_packed_grad: grad_weights must have shape [9], got [8]",
                lambda: o.volume_render_packed_grad(d, cols, ts, te, rs, none, *up[:3], up[3][:8]))
    n += expect(InvalidArgument, "distortion_loss_packed: weights must have rank 1 [samples], got shape [9, 1]",
                lambda: o.distortion_loss_packed(d[:, None], ts, te, rs))
    n += expect(InvalidArgument, "distortion_loss_packed_grad: grad_loss must have shape [4], got [3]",
                lambda: o.distortion_loss_packed_grad(d, ts, te, rs, np.ones(3, np.float32)))
    return f"{n} errors"


# ---- out of device memory ------------------------------------------------------------------------------------------
MEMORY_MB = 12  # the device size the test runs check_out_of_memory with (TF_METAL_OPS_EMULATED_GPU_MEMORY_MB)


def oom(shape):
    """TensorFlow's message when the emulated GPU cannot allocate a float32 tensor of this shape."""
    return (f"OOM when allocating tensor with shape[{','.join(str(d) for d in shape)}] and type float on "
            "/job:localhost/replica:0/task:0/device:GPU:0 by allocator Simple allocator")


def check_out_of_memory(seed):
    """Allocation failures on a 12 MiB device (TF_METAL_OPS_EMULATED_GPU_MEMORY_MB=12): an output that does not fit, and the
    float32 scratch accumulator of a float16 table's gradient, fail the op with ResourceExhausted naming the
    allocation; the device stays usable."""
    assert os.environ.get("TF_METAL_OPS_EMULATED_GPU_MEMORY_MB") == str(MEMORY_MB), "run with TF_METAL_OPS_EMULATED_GPU_MEMORY_MB=12"
    rng = np.random.default_rng(seed)
    o = ops()
    # float16 table of 2^18 x 8: params 4 MiB + output 4 MiB fit, the 8 MiB float32 accumulator does not.
    cfg = HashGridConfig(1, n_levels=1, n_features_per_level=8, log2_hashmap_size=18, base_resolution=1 << 20,
                         per_level_scale=1.0)
    rows, f = cfg.params_shape
    assert rows * f == 1 << 21, cfg.params_shape
    p16 = np.zeros((rows, f), np.float16)
    x = rng.random((16, 1), dtype=np.float32)
    g16 = np.ones((16, f), np.float16)
    n = expect(ResourceExhausted,
               f"{GRAD_PARAMS}: allocating a scratch buffer of {rows * f} float32 values failed: " + oom([rows * f]),
               lambda: o.hash_grid_encode_grad_params(g16, x, p16, tf.constant(1), **cfg.op_kwargs()))
    # The encoded output: 2^17 points x 64 float32 columns = 32 MiB.
    big = HashGridConfig(1, n_levels=8, n_features_per_level=8, log2_hashmap_size=10, base_resolution=4,
                         per_level_scale=1.5)
    n += expect(ResourceExhausted, oom([1 << 17, 64]),
                lambda: o.hash_grid_encode(rng.random((1 << 17, 1), dtype=np.float32),
                                           np.zeros(big.params_shape, np.float32), tf.constant(8), **big.op_kwargs()))
    # volume_render with no samples: the inputs are tiny, color [1, 2^22] is 16 MiB.
    c = 1 << 22
    empty_cols = np.zeros((1, 0, c), np.float32)
    t1 = np.ones((1, 1), np.float32)
    none = np.zeros(0, np.float32)
    n += expect(ResourceExhausted, oom([1, c]),
                lambda: o.volume_render(np.zeros((1, 0), np.float32), empty_cols, t1, none))
    # volume_render_grad: grad_color [1, 2^21] (8 MiB) fits, grad_background [1, 2^21] does not.
    c = 1 << 21
    n += expect(ResourceExhausted, oom([1, c]),
                lambda: o.volume_render_grad(np.zeros((1, 0), np.float32), np.zeros((1, 0, c), np.float32),
                                             t1, none, np.ones((1, c), np.float32), np.ones(1, np.float32),
                                             np.ones(1, np.float32), np.zeros((1, 0), np.float32)))
    # The device still works: a float16 table gradient (scratch accumulator and conversion pass) on the GPU.
    cfg_small = CFG
    ps = rng.uniform(-1, 1, cfg_small.params_shape).astype(np.float16)
    xs = rng.random((9, 3), dtype=np.float32)
    gs = rng.standard_normal((9, cfg_small.n_output_dims)).astype(np.float16)
    got = dispatched("hash_grid_float_to_half", lambda: o.hash_grid_encode_grad_params(
        gs, xs, ps, tf.constant(2), **cfg_small.op_kwargs()))
    with tf.device(CPU):
        want = o.hash_grid_encode_grad_params(gs, xs, ps, tf.constant(2), **cfg_small.op_kwargs())
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=2e-3, atol=2e-3)
    return f"{n} allocation failures on a {MEMORY_MB} MiB device, then a good call"


CHECKS = collect(globals())

if __name__ == "__main__":
    main(CHECKS)
