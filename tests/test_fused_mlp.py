"""The compiled FusedMlp op (CPU kernels) and its gradient against the NumPy float64 reference, TF's numerical
Jacobian and the pure-TF form; bitwise reproducible parameter gradients across thread counts; argument errors; the
Keras layer's save/reload.

Tolerances (params tiny-cuda-nn-initialised (Xavier), biases U(-0.5, 0.5), x standard normal; relative to the
largest reference value of the compared tensor, `close` below):
  float32: 2e-5 forward, 1e-4 gradients (float32 sums of at most 128 products per value; the weight gradients sum
  over every row);
  float16 (x and params rounded to float16, the reference run on those values): 2e-3 forward (one rounding of
  a float32 result, 2^-11, plus float32 sums), 1e-2 gradients (the backward reads the float16-rounded y for the
  output activation's derivative, and dparams is rounded to float16);
  products="bfloat16": BF16_TOL below (the benchmark networks), and bitwise the NumPy model of its arithmetic.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tf_metal_ops
from tf_metal_ops import diagnostics
from tf_metal_ops._library import ops
from tf_metal_ops.fused_mlp import ACTIVATIONS, FusedMLP, fused_mlp, fused_mlp_layout, fused_mlp_tf, reference

WIDTHS = [16, 32, 64, 128]


def close(got, want, rel):
    want = np.asarray(want, np.float64)
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rel, atol=rel * scale)


def make_case(seed, n, n_in, n_out, width, layers, use_bias, dtype="float32", gain=1.0):
    rng = np.random.default_rng(seed)
    lay = fused_mlp_layout(n_in, n_out, width=width, n_hidden_layers=layers, use_bias=use_bias)
    params = lay.init_params(seed=seed).astype(np.float64) * gain
    for o, length in lay.biases:
        params[o:o + length] = rng.uniform(-0.5, 0.5, length)
    x = rng.standard_normal((n, n_in))
    opts = dict(n_hidden_layers=layers, width=width, n_output=n_out, use_bias=use_bias)
    return x.astype(dtype), params.astype(dtype), opts


def gain(activation):
    """Weights scaled down for exponential hidden layers, whose values otherwise grow layer by layer past float32."""
    return 0.3 if activation == "exponential" else 1.0


def widths_for(width, layers):
    """(n_input, n_output): the full width with one hidden layer, smaller (and not multiples of 16) otherwise."""
    return (width, width) if layers == 1 else (max(1, width // 2 - 3), max(1, width // 4 + 1))


# ---- forward ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_forward_matches_reference(activation, width, layers, use_bias):
    out_act = ACTIVATIONS[(ACTIVATIONS.index(activation) + 1) % len(ACTIVATIONS)]
    n_in, n_out = widths_for(width, layers)
    x, p, opts = make_case(width + layers, 150, n_in, n_out, width, layers, use_bias, gain=gain(activation))
    y = fused_mlp(x, p, activation=activation, output_activation=out_act, **opts)
    assert y.shape == (150, n_out) and y.dtype == tf.float32
    want, _, _ = reference.forward(x, p, activation=activation, output_activation=out_act, **opts)
    close(y.numpy(), want, 2e-5)


@pytest.mark.parametrize("output_activation", ACTIVATIONS)
def test_every_output_activation(output_activation):
    x, p, opts = make_case(7, 40, 5, 3, 32, 2, True)
    y = fused_mlp(x, p, activation="softplus", output_activation=output_activation, **opts)
    want, _, _ = reference.forward(x, p, activation="softplus", output_activation=output_activation, **opts)
    close(y.numpy(), want, 2e-5)


@pytest.mark.parametrize("width", [16, 64])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_forward_float16(activation, width):
    x, p, opts = make_case(3, 100, 13, 7, width, 2, True, "float16", gain=gain(activation))
    y = fused_mlp(x, p, activation=activation, output_activation="sigmoid", **opts)
    assert y.dtype == tf.float16
    want, _, _ = reference.forward(x, p, activation=activation, output_activation="sigmoid", **opts)
    close(y.numpy(), want, 2e-3)


def test_hidden_output_and_empty_batch():
    """The CPU kernel keeps the hidden activations when training at width 128 with float32 products only
    (KeepActivations in csrc/cpu/fused_mlp_cpu.cc): otherwise hidden is [0, N, width] and the gradient computes them
    again."""
    x, p, opts = make_case(1, 9, 4, 2, 128, 3, False)
    attrs = dict(opts, activation="sigmoid", output_activation="none")
    y, hidden = ops().fused_mlp(x, p, training=True, **attrs)
    _, pre, _ = reference.forward(x, p, **attrs)
    assert hidden.shape == (3, 9, 128) and hidden.dtype == tf.float32
    for layer in range(3):  # the post-activation values of the hidden layers
        close(hidden[layer].numpy(), reference.activate("sigmoid", pre[layer]), 2e-5)
    y2, none_kept = ops().fused_mlp(x, p, training=False, **attrs)
    assert none_kept.shape == (0, 9, 128)
    np.testing.assert_array_equal(y.numpy(), y2.numpy())
    x64, p64, opts64 = make_case(1, 9, 4, 2, 64, 3, False)
    _, not_kept = ops().fused_mlp(x64, p64, training=True,
                                  **dict(opts64, activation="sigmoid", output_activation="none"))
    assert not_kept.shape == (0, 9, 64)
    _, not_kept = ops().fused_mlp(x, p, training=True, products="bfloat16", **attrs)
    assert not_kept.shape == (0, 9, 128)
    empty = fused_mlp(np.zeros((0, 4), np.float32), p, **attrs)
    assert empty.shape == (0, 2)


# ---- gradients ----------------------------------------------------------------------------------------------
def op_grads(x, p, dy, **kwargs):
    x, p = tf.constant(x), tf.constant(p)
    with tf.GradientTape() as tape:
        tape.watch([x, p])
        y = fused_mlp(x, p, **kwargs)
    gx, gp = tape.gradient(y, [x, p], output_gradients=tf.constant(dy))
    return y.numpy(), gx.numpy(), gp.numpy()


@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize("width", [16, 128])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gradients_match_reference(activation, width, use_bias):
    out_act = ACTIVATIONS[(ACTIVATIONS.index(activation) + 2) % len(ACTIVATIONS)]
    n_in = 13 if width == 16 else 21  # not a multiple of 16: W_1 has padding columns
    x, p, opts = make_case(11 + width, 150, n_in, 5, width, 3, use_bias, gain=gain(activation))
    dy = np.random.default_rng(5).standard_normal((150, 5)).astype(np.float32)
    _, gx, gp = op_grads(x, p, dy, activation=activation, output_activation=out_act, **opts)
    want_x, want_p = reference.backward(dy, x, p, activation=activation, output_activation=out_act, **opts)
    close(gx, want_x, 1e-4)
    close(gp, want_p, 1e-4)
    weights, _ = fused_mlp_layout(n_in, 5, width=width, n_hidden_layers=3, use_bias=use_bias).unpack(gp)
    assert not weights[0][:, n_in:].any() and not weights[-1][5:].any()  # padding gets exactly 0
    assert weights[0][:, :n_in].any() and weights[-1][:5].any()


@pytest.mark.parametrize("activation", ["sigmoid", "softplus", "exponential", "none"])
def test_gradients_float16(activation):
    x, p, opts = make_case(2, 80, 9, 4, 32, 2, True, "float16", gain=gain(activation))
    dy = np.random.default_rng(6).standard_normal((80, 4)).astype(np.float16)
    _, gx, gp = op_grads(x, p, dy, activation=activation, output_activation="sigmoid", **opts)
    assert gx.dtype == np.float16 and gp.dtype == np.float16
    want_x, want_p = reference.backward(dy, x, p, activation=activation, output_activation="sigmoid", **opts)
    close(gx, want_x, 1e-2)
    close(gp, want_p, 1e-2)


@pytest.mark.parametrize("activation", ["sigmoid", "softplus", "exponential", "none"])
def test_numerical_jacobian(activation):
    x, p, opts = make_case(4, 3, 3, 2, 16, 2, True)
    kwargs = dict(opts, activation=activation, output_activation="softplus")
    theoretical, numerical = tf.test.compute_gradient(lambda a, b: fused_mlp(a, b, **kwargs),
                                                      [tf.constant(x), tf.constant(p)], delta=1e-2)
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=2e-2, atol=2e-2 * max(1.0, np.abs(n).max()))


def test_gradient_without_kept_activations_and_in_tf_function():
    """training=False inside a tape: the gradient reruns the forward for the activations, with the same bits; a
    tf.function gives the same bits as eager."""
    x, p, opts = make_case(8, 300, 10, 3, 64, 2, True)
    dy = np.random.default_rng(1).standard_normal((300, 3)).astype(np.float32)
    kwargs = dict(opts, activation="leaky_relu", output_activation="exponential")
    _, gx, gp = op_grads(x, p, dy, **kwargs)
    _, gx2, gp2 = op_grads(x, p, dy, training=False, **kwargs)
    np.testing.assert_array_equal(gx, gx2)
    np.testing.assert_array_equal(gp, gp2)

    @tf.function
    def step(xt, pt):
        with tf.GradientTape() as tape:
            tape.watch([xt, pt])
            y = fused_mlp(xt, pt, **kwargs)
        return tape.gradient(y, [xt, pt], output_gradients=tf.constant(dy))

    gx3, gp3 = step(tf.constant(x), tf.constant(p))
    np.testing.assert_array_equal(gx, gx3.numpy())
    np.testing.assert_array_equal(gp, gp3.numpy())


def test_training_follows_the_tape():
    """training=None keeps the hidden activations exactly when a tape records the inputs: one FusedMlp op either
    way (with them, the gradient reads them instead of rerunning the forward)."""
    x, p, opts = make_case(13, 20, 6, 2, 16, 2, False)

    def traced(with_tape):
        @tf.function
        def f(xt, pt):
            if not with_tape:
                return fused_mlp(xt, pt, **opts)
            with tf.GradientTape() as tape:
                tape.watch(pt)
                y = fused_mlp(xt, pt, **opts)
            return tape.gradient(y, pt)

        graph = f.get_concrete_function(tf.constant(x), tf.constant(p)).graph
        return [op.get_attr("training") for op in graph.get_operations() if op.type == "FusedMlp"]

    assert traced(False) == [False]
    assert traced(True) == [True]


def test_matches_pure_tf():
    x, p, opts = make_case(9, 70, 12, 6, 32, 3, True)
    kwargs = dict(opts, activation="softplus", output_activation="sigmoid")
    dy = np.random.default_rng(2).standard_normal((70, 6)).astype(np.float32)
    assert_matches_pure_tf(x, p, dy, **kwargs)


def assert_matches_pure_tf(x, p, dy, **kwargs):
    """The op's y and gradients against fused_mlp_tf's (autodiff): 2e-5 forward, 1e-4 gradients."""
    y, gx, gp = op_grads(x, p, dy, **kwargs)
    xt, pt = tf.constant(x), tf.constant(p)
    with tf.GradientTape() as tape:
        tape.watch([xt, pt])
        y_tf = fused_mlp_tf(xt, pt, **kwargs)
    gx_tf, gp_tf = tape.gradient(y_tf, [xt, pt], output_gradients=tf.constant(dy))
    close(y, y_tf.numpy(), 2e-5)
    close(gx, gx_tf.numpy(), 1e-4)
    close(gp, tf.convert_to_tensor(gp_tf).numpy(), 1e-4)


# ---- feature-major input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, products", [("float32", "float32"), ("float16", "float32"), ("float32", "bfloat16")])
@pytest.mark.parametrize("width, n_in, n", [(16, 5, 300), (64, 32, 129), (128, 100, 70)])
def test_feature_major_input_gives_the_same_bits(dtype, products, width, n_in, n):
    """x [n_input, N] read in place: y and dparams bitwise those of the row-major call, dx its transpose (the
    kernels load the same values into the same blocks)."""
    x, p, opts = make_case(21, n, n_in, 3, width, 2, True, dtype)
    kwargs = dict(opts, activation="softplus", output_activation="sigmoid", products=products)
    dy = np.random.default_rng(3).standard_normal((n, 3)).astype(dtype)
    y, gx, gp = op_grads(x, p, dy, **kwargs)
    y_fm, gx_fm, gp_fm = op_grads(np.ascontiguousarray(x.T), p, dy, feature_major=True, **kwargs)
    assert y_fm.shape == (n, 3) and gx_fm.shape == (n_in, n)
    np.testing.assert_array_equal(y_fm, y)
    np.testing.assert_array_equal(gx_fm, gx.T)
    np.testing.assert_array_equal(gp_fm, gp)


def test_feature_major_gradients_and_pure_tf():
    """feature_major: TF's numerical Jacobian w.r.t. x [n_input, N] and params; fused_mlp_tf with feature_major
    against the op (values and gradients); the hash grid's feature-major encoding feeds it directly."""
    x, p, opts = make_case(5, 4, 3, 2, 16, 2, True)
    kwargs = dict(opts, activation="softplus", output_activation="sigmoid", feature_major=True)
    theoretical, numerical = tf.test.compute_gradient(lambda a, b: fused_mlp(a, b, **kwargs),
                                                      [tf.constant(x.T), tf.constant(p)], delta=1e-2)
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=2e-2, atol=2e-2 * max(1.0, np.abs(n).max()))
    x, p, opts = make_case(6, 90, 12, 5, 32, 2, True)
    kwargs = dict(opts, activation="relu", output_activation="none", feature_major=True)
    dy = np.random.default_rng(4).standard_normal((90, 5)).astype(np.float32)
    assert_matches_pure_tf(np.ascontiguousarray(x.T), p, dy, **kwargs)
    # The hash grid's [L*F, N] output as the MLP's input.
    from tf_metal_ops.hash_grid import HashGridConfig

    grid = HashGridConfig(n_input_dims=3, n_levels=8, log2_hashmap_size=10, base_resolution=4, per_level_scale=1.5)
    pos = tf.random.stateless_uniform([50, 3], seed=[1, 2])
    table = tf.random.stateless_uniform([grid.total_entries, 2], seed=[3, 4], minval=-1.0, maxval=1.0)
    mlp = dict(n_hidden_layers=1, width=32, n_output=4)
    params = fused_mlp_layout(16, 4, width=32, n_hidden_layers=1).init_params(seed=2)
    enc_fm = tf_metal_ops.hash_grid_encode(pos, table, feature_major=True, **grid.op_kwargs())
    enc = tf_metal_ops.hash_grid_encode(pos, table, **grid.op_kwargs())
    assert enc_fm.shape == (16, 50)
    np.testing.assert_array_equal(fused_mlp(enc_fm, params, feature_major=True, **mlp).numpy(),
                                  fused_mlp(enc, params, **mlp).numpy())


@pytest.mark.parametrize("dtype, products", [("float32", "float32"), ("float16", "float32"), ("float32", "bfloat16")])
def test_bitwise_reproducible_across_thread_counts(dtype, products):
    x, p, opts = make_case(10, 5000, 27, 4, 64, 3, True, dtype)
    dy = np.random.default_rng(3).standard_normal((5000, 4)).astype(dtype)
    kwargs = dict(opts, activation="relu", output_activation="none", products=products)
    results = []
    for threads in (1, 2, 3, 8):
        with tf_metal_ops.num_threads(threads):
            results.append(op_grads(x, p, dy, **kwargs))
    for got in results[1:]:
        for a, b in zip(results[0], got):
            assert a.tobytes() == b.tobytes()


KEEP_SCRIPT = textwrap.dedent(
    """
    import sys, numpy as np, tensorflow as tf
    sys.path.insert(0, sys.argv[1])
    from test_fused_mlp import make_case
    from tf_metal_ops._library import ops
    for dtype, products in [("float32", "float32"), ("float16", "float32"), ("float32", "bfloat16")]:
        for width, layers, n_in, n, fm in [(16, 1, 16, 333, False), (64, 2, 32, 130, False), (64, 3, 21, 257, True),
                                           (128, 2, 40, 70, False)]:
            x, p, opts = make_case(5, n, n_in, 7, width, layers, True, dtype)
            attrs = dict(opts, activation="softplus", output_activation="sigmoid", products=products, feature_major=fm)
            x = tf.constant(np.ascontiguousarray(x.T) if fm else x)
            p = tf.constant(p)
            y, hidden = ops().fused_mlp(x, p, training=True, **attrs)
            assert hidden.shape == (layers, n, width), hidden.shape  # TF_METAL_OPS_FUSED_MLP_KEEP_ACTIVATIONS=always
            dy = tf.constant(np.random.default_rng(2).standard_normal((n, 7)).astype(dtype))
            kept = ops().fused_mlp_grad(dy, x, p, y, hidden, **attrs)
            again = ops().fused_mlp_grad(dy, x, p, y, hidden[:0], **attrs)
            for a, b in zip(kept, again):
                assert a.numpy().tobytes() == b.numpy().tobytes(), (dtype, products, width, layers)
    print("ok")
    """
)


def test_gradient_without_kept_activations_gives_the_same_bits(tmp_path):
    """FusedMlpGrad with hidden [0, N, width] (none kept) computes each block's activations again on the CPU: dx and
    dparams bitwise those from the kept activations (the same layers on the same block rows), for both dtypes, both
    product settings, feature-major x and partial blocks. The kept ones come from a process told to keep them at
    every width (TF_METAL_OPS_FUSED_MLP_KEEP_ACTIVATIONS=always)."""
    (tmp_path / "keep.py").write_text(KEEP_SCRIPT)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_METAL_OPS_FUSED_MLP_KEEP_ACTIVATIONS="always")
    proc = subprocess.run([sys.executable, str(tmp_path / "keep.py"), os.path.dirname(os.path.abspath(__file__))],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


@pytest.mark.parametrize("mode, width, kept", [("never", 128, False), ("always", 16, True), ("sometimes", 16, False)])
def test_keep_activations_variable(tmp_path, mode, width, kept):
    """TF_METAL_OPS_FUSED_MLP_KEEP_ACTIVATIONS overrides the width rule; an unknown value is reported on stderr and
    the rule applies."""
    n_params = fused_mlp_layout(3, 2, width=width, n_hidden_layers=1).n_params
    script = textwrap.dedent(f"""
        import tensorflow as tf
        from tf_metal_ops._library import ops
        y, h = ops().fused_mlp(tf.ones([5, 3]), tf.ones([{n_params}]), training=True, n_hidden_layers=1,
                               width={width}, n_output=2, activation="relu", output_activation="none", use_bias=False,
                               products="float32", feature_major=False)
        print(h.shape[0])
        """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_METAL_OPS_FUSED_MLP_KEEP_ACTIVATIONS=mode)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)  # not the source tree, whose tf_metal_ops may be unbuilt
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == ("1" if kept else "0")
    assert ("is not one of auto, always, never" in proc.stderr) == (mode == "sometimes")


ISA_SCRIPT = textwrap.dedent(
    """
    import sys, numpy as np, tensorflow as tf
    from tf_metal_ops import diagnostics
    from tf_metal_ops.fused_mlp import fused_mlp
    d = np.load(sys.argv[1])
    x, p, dy = (tf.constant(d[k]) for k in ("x", "p", "dy"))
    out = {}
    def edges(v, seed):  # every value a tie of bfloat16 rounding, some denormal, some zero (ToBf16's cases)
        u = (v.numpy().view(np.uint32) & 0xffff0000) | 0x8000
        pick = np.random.default_rng(seed).integers(0, 8, u.shape)
        u = np.where(pick == 0, u & 0x807fffff, np.where(pick == 1, u & 0x80000000, u))
        return tf.constant(u.view(np.float32))
    for products in ("float32", "bfloat16", "bfloat16_edges", "bfloat16_tiny"):
        if products == "bfloat16_edges":
            x, p = edges(x, 1), edges(p, 2)
        if products == "bfloat16_tiny":  # the gradients' products and sums around the smallest normal float32
            x, p = x * 2.0 ** -40, p * 2.0 ** -40
        with tf.GradientTape() as tape:
            tape.watch([x, p])
            y = fused_mlp(x, p, n_hidden_layers=2, width=128, n_output=5, activation="softplus", use_bias=True,
                          products=products[:8])
        gx, gp = tape.gradient(y, [x, p], output_gradients=dy)
        out.update({products + "_y": y.numpy(), products + "_gx": gx.numpy(), products + "_gp": gp.numpy()})
    paths = diagnostics.cpu_paths("fused_mlp")
    np.savez(sys.argv[2], selected=paths["selected"], calls=paths["calls"][paths["selected"]], **out)
    """
)


def test_isa_builds_give_the_same_bits(tmp_path):
    """Every build of the products (TF_METAL_OPS_FUSED_MLP_ISA) gives bitwise the same results, with float32 and
    with bfloat16 products (VDPBF16PS on the avx512bf16 build, its definition in float32 code on the others), also
    on inputs whose rounding to bfloat16 ties or flushes (every build's vector rounding against ToBf16's cases).
    The amx build's bfloat16 products (TDPBF16PS) round their sums their own way: its float32 products are bitwise
    the others', its bfloat16 results within AMX_BF16_TOL of them (AMX_BF16_TOL says why)."""

    builds = diagnostics.cpu_paths("fused_mlp")["supported"]
    if len(builds) < 2:
        pytest.skip(f"only the {builds} build runs on this machine")
    x, p, _ = make_case(12, 333, 40, 5, 128, 2, True)
    np.savez(tmp_path / "in.npz", x=x, p=p, dy=np.random.default_rng(4).standard_normal((333, 5)).astype(np.float32))
    (tmp_path / "run.py").write_text(ISA_SCRIPT)
    results = {}
    for build in builds:
        out = tmp_path / f"{build}.npz"
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_METAL_OPS_FUSED_MLP_ISA=build)
        proc = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "in.npz"), str(out)],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[build] = np.load(out)
        assert str(results[build]["selected"]) == build and int(results[build]["calls"]) > 0
    first = results[builds[0]]
    for build in builds[1:]:
        for k in ("y", "gx", "gp"):
            for products in ("float32", "bfloat16", "bfloat16_edges", "bfloat16_tiny"):
                key = products + "_" + k
                if build == "amx" and products != "float32":
                    assert_amx_close(results[build][key], first[key], products, key)
                else:
                    assert first[key].tobytes() == results[build][key].tobytes(), (build, key)


# The amx build's bfloat16 results against the definition's (the other builds'). TDPBF16PS sums several pairs per
# instruction and rounds them in an order Intel does not document, so a layer's outputs differ from the definition's
# by float32 roundings (about 1e-7 of the largest); rounded to bfloat16 for the next layer, such a difference can move
# an input by one bfloat16 step (2^-8 of it), which the later layers carry: 2e-3 of the largest value per output.
# Near the smallest normal float32 (the "tiny" cases: values below 2^-100) the two flush different partial sums, so
# there only the absolute difference is bounded, by 2^-120.
AMX_BF16_TOL = 2e-3
AMX_TINY_ATOL = 2.0 ** -120


def assert_amx_close(got, want, products, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.all(np.isfinite(got)), what
    if products == "bfloat16_tiny":
        small = np.abs(want) < 2.0 ** -100
        assert np.abs(got - want)[small].max(initial=0) <= AMX_TINY_ATOL, what
        if np.any(~small):
            assert rel_err(got[~small], want[~small]) < AMX_BF16_TOL, what
    else:
        assert rel_err(got, want) < AMX_BF16_TOL, (what, rel_err(got, want))


# ---- errors -------------------------------------------------------------------------------------------------
GOOD = dict(n_hidden_layers=2, width=16, n_output=2, activation="relu", output_activation="none", use_bias=False)


@pytest.mark.parametrize("change, x_shape, n_params, message", [
    ({"width": 24}, (5, 3), 768, "width must be 16, 32, 64 or 128"),
    ({"n_hidden_layers": 0}, (5, 3), 768, "n_hidden_layers must be in 1..8"),
    ({"n_hidden_layers": 9}, (5, 3), 768, "n_hidden_layers must be in 1..8"),
    ({"n_output": 17}, (5, 3), 768, "n_output must be in 1..width"),
    ({"activation": "tanh"}, (5, 3), 768, "activation must be"),
    ({"output_activation": "sine"}, (5, 3), 768, "output_activation must be"),
    ({"products": "float16"}, (5, 3), 768, "products must be \"float32\" or \"bfloat16\""),
    ({}, (5, 3), 767, r"params must have shape \[768\]"),
    ({}, (5, 17), 768, "x must have shape"),
    ({}, (5, 3, 1), 768, "x must have shape"),
    ({}, (5, 0), 768, "x must have shape"),
    ({"feature_major": True}, (17, 5), 768, r"x must have shape \[n_input, N\] \(feature_major\)"),
])
def test_raw_op_rejects_bad_arguments(change, x_shape, n_params, message):
    attrs = {**GOOD, **change}
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"fused_mlp: .*{message}"):
        ops().fused_mlp(tf.zeros(x_shape), tf.zeros([n_params]), **attrs)
    y = fused_mlp(tf.ones([2, 3]), tf.ones([768]), **GOOD)  # the process goes on
    assert y.shape == (2, 2)


def test_raw_grad_op_rejects_bad_arguments():
    x, p = tf.ones([5, 3]), tf.ones([768])
    y, hidden = ops().fused_mlp(x, p, training=True, **GOOD)
    dy = tf.ones_like(y)
    for wrong in (tf.zeros([1, 5, 16]), tf.zeros([0, 4, 16]), tf.zeros([2, 5, 32])):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"fused_mlp \(gradient\): hidden must have shape \[2, 5, 16\] .* or \[0, 5, 16\]"):
            ops().fused_mlp_grad(dy, x, p, y, wrong, **GOOD)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"fused_mlp \(gradient\): dy must have shape"):
        ops().fused_mlp_grad(tf.ones([4, 2]), x, p, y, hidden, **GOOD)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"fused_mlp \(gradient\): y must have shape"):
        ops().fused_mlp_grad(dy, x, p, tf.ones([5, 3]), hidden, **GOOD)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"fused_mlp \(gradient\): params must have shape"):
        ops().fused_mlp_grad(dy, x, tf.ones([769]), y, hidden, **GOOD)
    dx, dp = ops().fused_mlp_grad(dy, x, p, y, hidden, **GOOD)
    assert dx.shape == (5, 3) and dp.shape == (768,)


@pytest.mark.parametrize("kwargs, message", [
    ({"width": 48}, "width must be one of"),
    ({"n_hidden_layers": 9}, "n_hidden_layers must be an integer in"),
    ({"n_output": 0}, "n_output must be an integer in"),
    ({"activation": "tanh"}, "activation must be one of"),
    ({"use_bias": 1}, "use_bias must be True or False"),
    ({"products": "bf16"}, "products must be one of"),
    ({"training": "yes"}, "training must be True, False or None"),
    ({"x": np.zeros((5, 17), np.float32)}, r"x must have shape \[N, n_input\] with 1 to width"),
    ({"x": np.zeros((17, 5), np.float32), "feature_major": True},
     r"x must have shape \[n_input, N\] \(feature_major\) with 1 to width"),
    ({"feature_major": 1}, "feature_major must be True or False"),
    ({"x": np.zeros((5,), np.float32)}, "x must have rank 2"),
    ({"x": np.zeros((5, 3), np.float64)}, "x must be float32 or float16"),
    ({"params": np.zeros(768, np.float16)}, "params must have x's dtype"),
    ({"params": np.zeros(700, np.float32)}, "params must have 768 values"),
])
def test_wrapper_raises_value_error(kwargs, message):
    args = {"x": np.zeros((5, 3), np.float32), "params": np.zeros(768, np.float32), **GOOD, **kwargs}
    with pytest.raises(ValueError, match=f"fused_mlp: {message}"):
        fused_mlp(args.pop("x"), args.pop("params"), **args)


# ---- Keras layer --------------------------------------------------------------------------------------------
def make_model(implementation):
    import keras

    inputs = keras.Input((7,))
    h = FusedMLP(n_output=3, width=32, n_hidden_layers=2, activation="softplus", use_bias=True,
                 implementation=implementation, name="mlp")(inputs)
    return keras.Model(inputs, h)


@pytest.mark.parametrize("implementation", ["op", "pure_tf"])
def test_layer_save_reload(implementation, tmp_path):
    import keras

    keras.utils.set_random_seed(0)
    model = make_model(implementation)
    layer = model.get_layer("mlp")
    assert layer.params.shape == (fused_mlp_layout(7, 3, width=32, n_hidden_layers=2, use_bias=True).n_params,)
    jitter = np.random.default_rng(0).uniform(-0.1, 0.1, layer.params.shape).astype(np.float32)
    layer.params.assign(layer.params.numpy() + jitter)
    x = np.random.default_rng(1).standard_normal((33, 7)).astype(np.float32)
    expected = model(x).numpy()
    want, _, _ = reference.forward(x, layer.params.numpy(), width=32, n_hidden_layers=2, n_output=3,
                                   activation="softplus", output_activation="none", use_bias=True)
    close(expected, want, 2e-5)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.get_layer("mlp"), FusedMLP)
    np.testing.assert_array_equal(loaded(x).numpy(), expected)
    export_dir = str(tmp_path / "exported")
    model.export(export_dir, verbose=False)
    reloaded = tf.saved_model.load(export_dir)
    # The exported graph may fuse TF's own ops differently (pure_tf); the op's kernel gives the same bits.
    close(reloaded.serve(x).numpy(), expected, 0.0 if implementation == "op" else 1e-6)


def test_layer_feature_major():
    """FusedMLP(feature_major=True) takes [n_input, N] (the same bits as the row-major layer on the transpose),
    keeps the option through get_config, and refuses other ranks."""
    opts = dict(n_output=3, width=16, n_hidden_layers=1, activation="softplus")
    fm = FusedMLP(feature_major=True, **opts)
    x = tf.random.stateless_uniform([5, 40], seed=[1, 2])
    y = fm(x)
    assert y.shape == (40, 3) and fm.compute_output_shape((5, 40)) == (40, 3)
    rows = FusedMLP(**opts)
    rows.build((None, 5))
    rows.params.assign(fm.params)
    np.testing.assert_array_equal(y.numpy(), rows(tf.transpose(x)).numpy())
    assert FusedMLP.from_config(fm.get_config())._options["feature_major"] is True
    with pytest.raises(ValueError, match="with feature_major the input must be"):
        FusedMLP(feature_major=True, **opts)(tf.zeros([2, 3, 4]))


def test_layer_trains_with_fit():
    import keras

    keras.utils.set_random_seed(1)
    x = np.random.default_rng(2).uniform(-1, 1, (512, 7)).astype(np.float32)
    y = np.stack([np.sin(3 * x[:, 0]), x[:, 1] * x[:, 2], np.cos(2 * x[:, 3])], axis=1).astype(np.float32)
    model = make_model("op")
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    first = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=15, batch_size=64, verbose=0)
    assert model.evaluate(x, y, verbose=0) < 0.5 * first


# ---- bfloat16 products --------------------------------------------------------------------------------------
# The benchmark networks (bench/fused_mlp.py): NeRF's density and colour MLPs.
BENCH_NETS = {"density": dict(n_in=32, width=64, layers=1, n_out=16, out_act="none"),
              "colour": dict(n_in=32, width=64, layers=2, n_out=3, out_act="sigmoid")}
# products="bfloat16" against NumPy float64 on those networks (4096 rows; measured values: docs/fused_mlp.md
# "bfloat16 products"): "max" is the largest |error| over the largest |reference value|, "norm" the error's 2-norm over
# the reference's. With relu hidden layers the gradients' error is mostly relu'(z) switching where the rounding
# moves z across 0 (a jump of a whole term), so they are compared in norm there; softplus is smooth.
BF16_TOL = {"relu": {"y": ("max", 1e-2), "dx": ("norm", 0.15), "dparams": ("norm", 0.15)},
            "softplus": {"y": ("max", 1.5e-2), "dx": ("max", 1.5e-2), "dparams": ("max", 1.5e-2)}}
TINY = np.float32(np.finfo(np.float32).tiny)


def bf16_round(v):
    """float32 v rounded to bfloat16 (kept float32): nearest even; denormals to zero with their sign."""
    u = np.asarray(v, np.float32).view(np.uint32)
    denormal = (u & 0x7F800000) == 0
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    return np.where(denormal, u & 0x80000000, r).astype(np.uint32).view(np.float32)


def flush(v):
    return np.where(np.abs(v) < TINY, np.copysign(np.float32(0), v), v).astype(np.float32)


def fma32(a, b, c):
    """float32 a b + c rounded once (to nearest even), for bfloat16-valued a and b (their product is exact in
    float64): the float64 sum is rounded to odd (TwoSum's error nudges an inexact even result one ulp towards it),
    which makes the final rounding to float32 correct."""
    p, c = np.asarray(a, np.float64) * np.asarray(b, np.float64), np.asarray(c, np.float64)
    p, c = np.broadcast_arrays(p, c)
    s = p + c
    bp = s - c
    err = (p - bp) + (c - (s - bp))
    even = (s.view(np.int64) & 1) == 0
    s = np.where((err != 0) & even, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def bf16_forward(x, params, *, width, n_hidden_layers, n_output, activation, output_activation, use_bias):
    """The forward with bfloat16 products in NumPy float32, written from their definition (docs/fused_mlp.md): each
    layer's inputs and weights rounded to bfloat16, the sum over the inputs in pairs (2p, 2p + 1), odd term first,
    each product and each sum rounded to float32 and flushed to zero below the smallest normal."""
    lay = fused_mlp_layout(x.shape[1], n_output, width=width, n_hidden_layers=n_hidden_layers, use_bias=use_bias)
    weights, biases = lay.unpack(np.asarray(params, np.float32))
    h = np.zeros((x.shape[0], weights[0].shape[1]), np.float32)
    h[:, :x.shape[1]] = x
    for m, w in enumerate(weights):
        a, wb = bf16_round(h), bf16_round(w)
        acc = np.zeros((h.shape[0], w.shape[0]), np.float32)
        if use_bias:
            acc[:, :len(biases[m])] = flush(biases[m])
        for p in range(w.shape[1] // 2):
            for k in (2 * p + 1, 2 * p):
                acc = flush(fma32(a[:, k:k + 1], wb[None, :, k], acc))
        last = m == len(weights) - 1
        h = reference.activate(output_activation if last else activation, acc.astype(np.float64)).astype(np.float32)
    return h[:, :n_output]


def rel_err(got, want, kind="max"):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if kind == "norm":
        return float(np.linalg.norm(got - want) / np.linalg.norm(want))
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("activation, use_bias, scale", [("relu", False, 1.0), ("softplus", True, 1.0),
                                                         ("sigmoid", True, 1.0), ("relu", False, 2.0 ** -31)])
def test_bfloat16_forward_matches_its_definition(activation, use_bias, scale):
    """products="bfloat16": bitwise the NumPy float32 model of its arithmetic (inputs and weights rounded, pairs,
    flushes); the activations in NumPy may differ in the last bit, so relu (exact) checks bits, the others 1 ulp.
    scale 2^-31 (x and the weights; y up to about 2^-123): products and sums around the smallest normal float32."""
    x, p, opts = make_case(21, 203, 21, 5, 32, 2, use_bias)
    x, p = (x * np.float32(scale)), (p * np.float32(scale))
    x[0, :3] = [1e-39, -3e-39, 0.0]  # float32 denormals: read as zeros
    kwargs = dict(opts, activation=activation, output_activation="none")
    y = fused_mlp(x, p, products="bfloat16", **kwargs).numpy()
    want = bf16_forward(x, p, **kwargs)
    if diagnostics.cpu_paths("fused_mlp")["selected"] == "amx":  # TDPBF16PS: its own roundings (AMX_BF16_TOL)
        assert_amx_close(y, want, "bfloat16" if scale == 1.0 else "bfloat16_tiny", "y")
    elif activation == "relu":
        assert y.tobytes() == want.tobytes()
        assert scale == 1.0 or (np.count_nonzero(y) > 0 and np.count_nonzero(y) < y.size)  # some flushed
    else:
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    assert not np.array_equal(y, fused_mlp(x, p, **kwargs).numpy())  # the rounding happened


@pytest.mark.parametrize("activation", sorted(BF16_TOL))
@pytest.mark.parametrize("net", sorted(BENCH_NETS))
def test_bfloat16_accuracy_on_the_benchmark_networks(net, activation):
    c = BENCH_NETS[net]
    lay = fused_mlp_layout(c["n_in"], c["n_out"], width=c["width"], n_hidden_layers=c["layers"])
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4096, c["n_in"])).astype(np.float32)
    p = lay.init_params(seed=7)
    dy = rng.standard_normal((4096, c["n_out"])).astype(np.float32)
    kwargs = dict(n_hidden_layers=c["layers"], width=c["width"], n_output=c["n_out"], activation=activation,
                  output_activation=c["out_act"])
    want = dict(zip(("y", "dx", "dparams"), (reference.forward(x, p, **kwargs)[0],
                                              *reference.backward(dy, x, p, **kwargs))))
    for products in ("float32", "bfloat16"):
        got = dict(zip(("y", "dx", "dparams"), op_grads(x, p, dy, products=products, **kwargs)))
        for k, (kind, tol) in BF16_TOL[activation].items():
            err = rel_err(got[k], want[k], kind)
            assert err < (1e-5 if products == "float32" else tol), (products, k, kind, err)


def test_bfloat16_pure_tf_and_layer_round_trip(tmp_path):
    """fused_mlp_tf with products="bfloat16" rounds its matmul operands the same way (close to the op, not bitwise:
    float32 sums in another order); the layer keeps the option through get_config, .keras and SavedModel."""
    import keras

    x, p, opts = make_case(31, 64, 7, 3, 32, 2, True)
    kwargs = dict(opts, activation="softplus", output_activation="none", products="bfloat16")
    y = fused_mlp(x, p, **kwargs).numpy()
    close(fused_mlp_tf(x, p, **kwargs).numpy(), y, 1e-5)
    assert rel_err(fused_mlp_tf(x, p, **dict(kwargs, products="float32")), y) > 1e-5

    inputs = keras.Input((7,))
    out = FusedMLP(n_output=3, width=32, n_hidden_layers=2, activation="softplus", use_bias=True,
                   implementation="op", products="bfloat16", name="mlp")(inputs)
    model = keras.Model(inputs, out)
    layer = model.get_layer("mlp")
    assert layer.get_config()["products"] == "bfloat16"
    layer.params.assign(p)
    np.testing.assert_array_equal(model(x).numpy(), y)
    path = str(tmp_path / "m.keras")
    model.save(path)
    np.testing.assert_array_equal(keras.models.load_model(path)(x).numpy(), y)
    model.export(str(tmp_path / "exported"), verbose=False)
    reloaded = tf.saved_model.load(str(tmp_path / "exported"))
    np.testing.assert_array_equal(reloaded.serve(x).numpy(), y)
    with pytest.raises(ValueError, match="FusedMLP: products must be one of"):
        FusedMLP(n_output=3, products="float16")
