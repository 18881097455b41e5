"""Claims the README and docs make that no other test checked:

- ``TF_METAL_OPS_NUM_THREADS`` sets the CPU kernels' thread count (README, Threads);
- ``examples/zero_out.py`` runs and prints what its docstring and the README say;
- the README's main command (``examples/nerf/train.py --quick``) is wired up: the same flags with a step cap and a
  small scene (the full command trains for ~3 minutes);
- ``--xla-inner`` trains (finite losses) and runs the parts around the custom ops as compiled XLA functions;
- a tensor ``max_level`` does not retrace a tf.function (docs/hash_grid.md);
- the hash-grid op rejects more than 2^31 / n_levels points (InvalidArgumentError), tested at the boundary.
"""

import glob
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_metal_ops
from tf_metal_ops._library import ops
from tf_metal_ops.hash_grid import HashGridConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


def _env(**kw):
    env = dict(os.environ)
    for k, v in kw.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


# ---------------------------------------------------------------------------------------------------------------
# TF_METAL_OPS_NUM_THREADS

THREADS_SCRIPT = r'''
import json, sys, numpy as np, tensorflow as tf
import tf_metal_ops as t
from tf_metal_ops.diagnostics import backend_info, volume_render_cpu_paths
rng = np.random.default_rng(0)
R, S, C = 8192, 64, 3          # 8192 rays in ranges of >= 102 (the kernel's grain for S=64, C=3): 81 ranges at most
d = rng.uniform(0, 3, (R, S)).astype(np.float32)
c = rng.uniform(0, 1, (R, S, C)).astype(np.float32)
tt = (2.0 + np.cumsum(rng.uniform(0.01, 0.05, (R, S + 1)), axis=1)).astype(np.float32)
before = sum(volume_render_cpu_paths()["calls"].values())
color, depth, opacity, weights = t.volume_render(d, c, tt)
ranges = sum(volume_render_cpu_paths()["calls"].values()) - before
cfg = t.HashGridConfig(3, n_levels=8, log2_hashmap_size=12)
x = rng.uniform(0, 1, (5000, 3)).astype(np.float32)
p = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
y = t.hash_grid_encode(x, p, **cfg.op_kwargs())
np.savez(sys.argv[1], color=color.numpy(), weights=weights.numpy(), y=y.numpy(),
         z=t.zero_out(tf.constant([[5, 6], [7, 8]])).numpy())
print(json.dumps({"threads": t.get_num_threads(), "info": backend_info()["num_threads"], "ranges": ranges}))
'''


def test_num_threads_environment_variable(tmp_path):
    """A subprocess with TF_METAL_OPS_NUM_THREADS=n reports n threads (get_num_threads, backend_info), its kernels
    really split the work for n threads (the volume-render kernel runs ParallelFor's 4 ranges per thread, counted by
    volume_render_cpu_paths; one range with one thread), and the ops give the same bits as with other counts.
    0 and a non-number are ignored (the default: the CPUs this process may use)."""
    default = len(os.sched_getaffinity(0))
    want = {"1": 1, "3": 3, "5": 5, "0": default, "many": default}
    runs = {}
    for value, n in want.items():
        path = str(tmp_path / f"t{value}.npz")
        run = subprocess.run([sys.executable, "-c", THREADS_SCRIPT, path], capture_output=True, text=True,
                             env=_env(TF_METAL_OPS_NUM_THREADS=value), cwd=str(tmp_path))
        assert run.returncode == 0, run.stderr[-4000:]
        rep = json.loads(run.stdout.strip().splitlines()[-1])
        assert rep["threads"] == n and rep["info"] == n, (value, rep)
        assert rep["ranges"] == (1 if n == 1 else 4 * n), (value, rep)
        runs[value] = np.load(path)
    assert runs["1"]["z"].tolist() == [[5, 0], [0, 0]]
    for value in want:
        for k in ("color", "weights", "y"):
            a, b = runs["1"][k], runs[value][k]
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), (value, k)


# ---------------------------------------------------------------------------------------------------------------
# examples/zero_out.py

ZERO_OUT_PRINT = "[[1 0]\n [0 0]]\n"


def _check_zero_out_output(out):
    assert out.startswith(2 * ZERO_OUT_PRINT), out[:200]  # the package API, then tf.load_op_library(...).zero_out
    rest = out[len(2 * ZERO_OUT_PRINT):]
    end = rest.index("\n}\n") + 3
    info = json.loads(rest[:end])
    assert set(info) == {"tensorflow", "kernels", "metal_usable", "metal_reason"}
    assert info["tensorflow"] == tf.__version__
    assert set(info["kernels"]["ZeroOut"]["CPU"]) == {"float16", "float32", "int32", "int64"}
    assert {"HashGridEncode", "VolumeRender", "DistortionLoss"} <= set(info["kernels"])
    return info, rest[end:]


def test_zero_out_example_prints_what_it_documents():
    run = subprocess.run([sys.executable, os.path.join(EXAMPLES, "zero_out.py")], capture_output=True, text=True,
                         env=_env(TF_METAL_OPS_EMULATED_GPU=None), cwd=ROOT)
    assert run.returncode == 0, run.stderr[-4000:]
    info, tail = _check_zero_out_output(run.stdout)
    if sys.platform != "darwin":
        assert info["metal_usable"] is False and "Metal needs macOS" in info["metal_reason"]
        assert tail == ""  # no GPU line: neither Metal nor the emulated GPU


def test_zero_out_example_on_the_emulated_gpu(clang16):
    """The docstring's second command: TF_METAL_OPS_EMULATED_GPU=1 runs the op on /GPU:0 and prints it."""
    run = subprocess.run([sys.executable, os.path.join(EXAMPLES, "zero_out.py")], capture_output=True, text=True,
                         env=_env(TF_METAL_OPS_EMULATED_GPU="1"), cwd=ROOT)
    assert run.returncode == 0, run.stderr[-4000:]
    _, tail = _check_zero_out_output(run.stdout)
    assert re.fullmatch(r"/job:localhost/replica:0/task:0/device:GPU:0 \[\[1\. 0\.\]\n \[0\. 0\.\]\]\n", tail), tail


# ---------------------------------------------------------------------------------------------------------------
# The README's main command

def readme_main_command():
    """The argv of train.py in the README's `<!-- command: main -->` block."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    block = re.search(r"<!-- command: main -->\s*```bash\n(.*?)\n```", text, re.S).group(1)
    cmd = block.split("&&")[-1].split()
    assert cmd[:2] == ["python", "examples/nerf/train.py"], block
    return cmd[2:]


def test_readme_main_command_flags_mean_what_it_says():
    """--quick: 2.5 minutes of training (about 3 minutes in all), small evaluations; the hash-grid model with the
    package's ops (the README: 'train a NeRF ... with the hash-grid and volume-rendering ops')."""
    from nerf import train

    args = train.parse_args(readme_main_command())
    assert args.quick and args.minutes == 2.5 and args.steps is None and args.epochs is None
    assert (args.model, args.impl, args.data) == ("hash", "op", "builtin")
    assert args.eval_views == 2 and args.final_views == 8
    assert train.parse_args(readme_main_command() + ["--steps", "2"]).minutes is None  # a cap replaces the budget


def test_readme_main_command_runs(tmp_path):
    """The README's command line as a subprocess with a 2-step cap and a 24x24 built-in scene (the only changes):
    it writes runs/hash-*/ (metrics, renders, PSNR plot, model) in the working directory with the --quick settings,
    shows a tqdm bar, and the reloaded model matches."""
    argv = readme_main_command() + ["--steps", "2", "--scene-res", "24"]
    run = subprocess.run([sys.executable, os.path.join(EXAMPLES, "nerf", "train.py"), *argv], capture_output=True,
                         text=True, cwd=str(tmp_path), env=_env(TF_METAL_OPS_CACHE=str(tmp_path / "cache")))
    assert run.returncode == 0, run.stderr[-4000:]
    outs = glob.glob(str(tmp_path / "runs" / "hash-*"))
    assert len(outs) == 1, os.listdir(tmp_path)
    out = outs[0]
    with open(os.path.join(out, "metrics.json")) as f:
        m = json.load(f)
    cfg = m["config"]
    assert cfg["quick"] and cfg["model"] == "hash" and cfg["impl"] == "op" and cfg["steps"] == 2
    assert cfg["eval_views"] == 2 and cfg["final_views"] == 8 and m["final"]["eval_views"] == 8
    assert m["final"]["steps"] == 2 and np.all(np.isfinite(m["train_losses"]))
    assert m["final"]["reload_max_abs_diff"] < 1e-6
    assert os.path.getsize(os.path.join(out, "psnr.png")) > 1000
    assert "novel_view.png" in os.listdir(os.path.join(out, "renders"))
    assert os.path.exists(os.path.join(out, "model", "model.json"))
    assert "step/s" in run.stderr or "s/step" in run.stderr  # the tqdm bar
    assert "model hash (op)" in run.stdout and "done: test PSNR" in run.stdout


# ---------------------------------------------------------------------------------------------------------------
# --xla-inner

def test_xla_inner_trains_with_finite_loss(tmp_path):
    """A short --xla-inner run trains (finite, falling losses) and matches the plain run's first loss (same seed,
    same model: only the compilation of the parts around the custom ops differs)."""
    from test_nerf_train import run_train

    common = ["--model", "hash", "--steps", "12", "--log2-table", "12", "--lr-decay", "1", "--sampler", "uniform"]
    inner = run_train(tmp_path / "inner", *common, "--xla-inner")
    plain = run_train(tmp_path / "plain", *common)
    losses = np.asarray(inner["train_losses"])
    assert len(losses) == 12 and np.all(np.isfinite(losses)), losses
    assert inner["config"]["xla_inner"] and not plain["config"]["xla_inner"]
    np.testing.assert_allclose(losses[0], plain["train_losses"][0], rtol=1e-4)
    assert np.mean(losses[-3:]) < np.mean(losses[:3]), losses
    with open(tmp_path / "inner" / "out" / "model" / "model.json") as f:
        assert json.load(f)["config"]["xla_inner"] is True  # the saved model keeps it


def test_xla_inner_model_compiles_the_parts_around_the_ops():
    """The model built with xla_inner=True runs its pre/post parts as jit_compile=True tf.functions, and agrees with
    the same weights without them."""
    from nerf import models

    kw = dict(n_levels=4, log2_hashmap_size=10, finest_resolution=64, n_samples=16)
    a = models.build_model("hash", xla_inner=True, **kw)
    b = models.build_model("hash", xla_inner=False, **kw)
    b.set_weights(a.get_weights())
    rng = np.random.default_rng(0)
    o = tf.constant(np.tile([[0.0, 0.0, 4.0]], (64, 1)).astype(np.float32))
    d = rng.standard_normal((64, 3)).astype(np.float32) * 0.2 + [0, 0, -1]
    d = tf.constant((d / np.linalg.norm(d, axis=1, keepdims=True)).astype(np.float32))
    ya = a(o, d)["color"].numpy()
    yb = b(o, d)["color"].numpy()
    assert a._pre_xla[False]._jit_compile and a._post_xla._jit_compile
    assert a._pre_xla[False].experimental_get_tracing_count() >= 1 and a._post_xla.experimental_get_tracing_count() >= 1
    assert a._pre_xla[True].experimental_get_tracing_count() == 0  # not trained here
    assert not hasattr(b, "_pre_xla")
    np.testing.assert_allclose(ya, yb, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# max_level as a tensor

def test_tensor_max_level_does_not_retrace():
    """docs/hash_grid.md: 'A tensor avoids retracing when it changes.' One trace serves every int32 tensor value
    (and one more every float32 one), with the right result for each; the negative control shows the counter sees
    retraces: Python ints retrace per value."""
    cfg = HashGridConfig(3, n_levels=6, n_features_per_level=2, log2_hashmap_size=10, base_resolution=4,
                         per_level_scale=1.5)
    rng = np.random.default_rng(1)
    x = tf.constant(rng.uniform(0, 1, (200, 3)).astype(np.float32))
    p = tf.constant(rng.uniform(-1, 1, cfg.params_shape).astype(np.float32))
    traces = []

    @tf.function
    def encode(m):
        traces.append(m)
        return tf_metal_ops.hash_grid_encode(x, p, max_level=m, **cfg.op_kwargs())

    full = tf_metal_ops.hash_grid_encode(x, p, **cfg.op_kwargs()).numpy()
    for k in (0, 2, 5, 6, 3):
        y = encode(tf.constant(k, tf.int32)).numpy()
        np.testing.assert_array_equal(y[:, :2 * k], full[:, :2 * k])
        assert not y[:, 2 * k:].any()
    assert len(traces) == 1
    for m in (0.0, 0.5, 1.0):
        y = encode(tf.constant(m, tf.float32)).numpy()
        k = sum(1 for level in range(6) if level < m * 6 + 1e-3)
        np.testing.assert_array_equal(y[:, :2 * k], full[:, :2 * k])
        assert not y[:, 2 * k:].any()
    assert len(traces) == 2 and encode.experimental_get_tracing_count() == 2
    # negative control: Python numbers are part of the trace key
    for k in (1, 2, 3):
        encode(k)
    assert len(traces) == 5


def test_tensor_max_level_does_not_retrace_through_the_layer():
    layer = tf_metal_ops.HashGridEncoding(n_levels=4, log2_hashmap_size=8, base_resolution=4)
    x = tf.constant(np.random.default_rng(2).uniform(0, 1, (50, 2)).astype(np.float32))
    layer(x)
    traces = []

    @tf.function
    def f(m):
        traces.append(m)
        return layer(x, max_level=m)

    outs = [f(tf.constant(k)).numpy() for k in (1, 4, 2)]
    assert len(traces) == 1
    assert not outs[0][:, 2:].any() and outs[1][:, 6:].any() and not outs[2][:, 4:].any()


# ---------------------------------------------------------------------------------------------------------------
# Too many points

GUARD_ATTRS = dict(n_features_per_level=1, log2_hashmap_size=4, base_resolution=2, per_level_scale=1.0,
                   grid_type="hash", interpolation="linear")


@pytest.mark.parametrize("L", [32, 31])
def test_too_many_points_guard_at_its_boundary(L):
    """The kernels reject N > 2^31 / n_levels points (N * L and per-level indices must fit 32 bits on the GPU).

    The rejected side is cheap: the guard runs before any output is allocated, so it needs only the positions,
    [N, 1] float32: with the most levels allowed (32) the smallest rejected N is 2^26 + 1 (256 MiB), the least
    memory any configuration can trigger it with. The accepted side cannot be run to completion cheaply: at
    N = floor(2^31 / L) the output [N, L * F] has >= 2^31 - L elements (8 GiB of float32, 4 GiB of float16) for
    every L and F. So it is shown to pass the guard by the error that comes next in the kernels' validation order
    (positions, params, the points guard, grad, max_level): a NaN max_level for the forward and the position
    gradient, a grad of the wrong shape for the table gradient. L = 31 checks the floor of a non-power-of-two
    division (2^31 / 31 = 69273666.06)."""
    limit = (1 << 31) // L
    attrs = dict(GUARD_ATTRS, n_levels=L)
    cfg = HashGridConfig(1, **attrs)
    params = tf.zeros(cfg.params_shape)
    nan = tf.constant(float("nan"))
    small_grad = tf.zeros([1, L])
    raw = ops()
    for n in (limit, limit + 1):
        x = tf.zeros([n, 1])
        calls = {
            "hash_grid_encode": lambda: tf_metal_ops.hash_grid_encode(x, params, max_level=nan, **attrs),
            "hash_grid_encode_grad_positions": lambda: raw.hash_grid_encode_grad_positions(
                small_grad, x, params, nan, n_levels=L, **GUARD_ATTRS),
            "hash_grid_encode_grad_params": lambda: raw.hash_grid_encode_grad_params(
                small_grad, x, params, tf.constant(L), n_levels=L, **GUARD_ATTRS),
        }
        for name, call in calls.items():
            with pytest.raises(tf.errors.InvalidArgumentError) as e:
                call()
            msg = e.value.message
            if n > limit:
                assert f"too many points ({n}) for {L} levels" in msg, (name, msg)
            else:
                assert "too many points" not in msg, (name, msg)
                expected = "grad must have shape" if "grad" in name else "max_level must not be NaN"
                assert expected in msg, (name, msg)
        del x, calls
    assert limit == {32: 1 << 26, 31: 69273666}[L] and math.floor(2**31 / L) == limit
