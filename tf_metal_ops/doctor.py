"""Self-check: ``python -m tf_metal_ops.doctor``. On a Mac, run this first and paste its output into a bug report.

Prints the versions (Python, TensorFlow, tensorflow-metal or the community plugin), the Metal device and kernel
library (``backend_info()``), then runs every op and gradient with random inputs on the CPU (against the pure-TF
implementations) and on ``/GPU:0`` when there is one (against the CPU kernels; the result must have been placed on
the GPU), with the time per call, and ends with one line: usable or not, and why.

Exit code: 0 when every check passed and, on an Apple-silicon Mac, the Metal kernels are usable; 1 otherwise.
On Linux there is no Metal device and that is not an error: the CPU checks (and, with
``TF_METAL_OPS_EMULATED_GPU=1``, the same checks on the emulated ``/GPU:0``) decide the exit code.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_metal_ops as tfmo  # noqa: E402
from tf_metal_ops.hash_grid import pure_tf  # noqa: E402
from tf_metal_ops.inline_kernels import build  # noqa: E402


def _cases(tf, tfmo):
    """name -> (inputs, op fn, reference fn, rtol, atol): fn(*tensors) -> list of tensors (values and gradients)."""
    rng = np.random.default_rng(0)
    hg = dict(n_levels=8, n_features_per_level=2, log2_hashmap_size=12, base_resolution=4, per_level_scale=1.7)
    cfg = tfmo.HashGridConfig(n_input_dims=3, **hg)
    x = rng.random((2048, 3), dtype=np.float32)
    params = rng.uniform(-1, 1, cfg.params_shape).astype(np.float32)
    r, s = 256, 32
    sigma = rng.gamma(1.0, 2.0, (r, s)).astype(np.float32)
    rgb = rng.random((r, s, 3), dtype=np.float32)
    t = np.sort(rng.uniform(2.0, 6.0, (r, s + 1)), axis=1).astype(np.float32)
    bg = rng.random(3, dtype=np.float32)
    w = (sigma / sigma.sum(axis=1, keepdims=True)).astype(np.float32)

    def with_gradients(op, loss_of, wrt):
        """fn(*inputs) -> [*outputs, d loss / d inputs[i] for i in wrt] (dense)."""

        def fn(*inputs):
            watched = [inputs[i] for i in wrt]
            with tf.GradientTape() as tape:
                tape.watch(watched)
                out = op(*inputs)
                loss = loss_of(out)
            out = out if isinstance(out, (list, tuple)) else [out]
            return [*out, *(tf.convert_to_tensor(g) for g in tape.gradient(loss, watched))]

        return fn

    def hash_grid(encode):
        return with_gradients(lambda x, p: encode(x, p, **hg), lambda y: tf.reduce_sum(y**2), (0, 1))

    # the fused MLP: NeRF's colour network shape (32 -> 64 -> 64 -> 3), relu, sigmoid output
    mlp = dict(n_hidden_layers=2, width=64, n_output=3, activation="relu", output_activation="sigmoid")
    mlp_x = rng.uniform(-1, 1, (1024, 32)).astype(np.float32)
    mlp_params = tfmo.fused_mlp_layout(32, 3, width=64, n_hidden_layers=2).init_params(seed=0)

    def fused_mlp(op):
        return with_gradients(lambda x, p: op(x, p, **mlp), lambda y: tf.reduce_sum(y**2), (0, 1))

    def render_loss(out):
        return tf.reduce_sum(out[0] ** 2) + tf.reduce_sum(out[1]) + tf.reduce_sum(out[3] ** 2)

    def render(op):
        return with_gradients(op, render_loss, (0, 1, 3))  # sigma, rgb, bg

    def distortion(op):
        return with_gradients(op, lambda loss: loss, (0, 1))  # w, t

    # packed (ragged) rays: 0..63 samples per ray, gaps between samples
    counts = rng.integers(0, 64, 256)
    rs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    n = int(rs[-1])
    edges = np.cumsum(rng.uniform(0.01, 0.1, 2 * n))  # start_k = edges[2k], end_k = edges[2k+1]
    base = np.concatenate([[0.0], edges])[2 * rs[:-1]]  # each ray starts at t = 2
    edges = (2.0 + edges - np.repeat(base, counts).repeat(2)).astype(np.float32)
    p_sigma = rng.gamma(1.0, 2.0, n).astype(np.float32)
    p_rgb = rng.random((n, 3), dtype=np.float32)
    p_w = rng.uniform(0.0, 0.05, n).astype(np.float32)

    def render_packed(op):
        return with_gradients(op, render_loss, (0, 1, 2, 3, 5))  # sigma, rgb, t_starts, t_ends, bg

    def distortion_packed(op):
        return with_gradients(op, lambda loss: loss, (0, 1, 2))  # w, t_starts, t_ends

    def zero_out_ref(x):
        return [tf.concat([x[:1], tf.zeros_like(x[1:])], 0)]

    # An inline kernel (tfmo.metal_kernel): on a Mac GPU this is Metal's runtime compile path.
    inline_exp = tfmo.metal_kernel("doctor_exp", ["x"], ["y"], "uint i = thread_position_in_grid.x; "
                                   "if (i < uint(x_shape[0])) y[i] = metal::exp(x[i]);")

    def inline(x):
        with tf.GradientTape() as tape:
            tape.watch(x)

            @tf.custom_gradient
            def f(v):
                (y,) = inline_exp(inputs=[v], grid=(tf.size(v), 1, 1), threadgroup=(64, 1, 1),
                                  output_shapes=[tf.shape(v)], output_dtypes=[tf.float32])
                return y, lambda dy: dy * y

            loss = tf.reduce_sum(f(x) ** 2)
        return [f(x), tape.gradient(loss, x)]

    def inline_ref(x):
        return [tf.exp(x), 2 * tf.exp(x) ** 2]

    # the occupancy sampler: rays through a random grid (one box; three cascades with cone stepping), no jitter
    class Grid:  # what ray_march reads of an OccupancyGrid, with the bits as the case's input
        def __init__(self, bits, resolution, cascades):
            self.bits, self.resolution, self.cascades = bits, resolution, cascades
            self.aabb = np.float32([[-1, -1, -1], [1, 1, 1]])

    g = 16
    bits1 = np.packbits(rng.random(g**3) < 0.3, bitorder="little")
    bits3 = np.stack([np.packbits(rng.random(g**3) < f, bitorder="little") for f in (0.3, 0.2, 0.1)])
    m_o = rng.uniform(-0.5, 0.5, (512, 3)).astype(np.float32)
    m_d = rng.normal(size=(512, 3)).astype(np.float32)
    m_d /= np.linalg.norm(m_d, axis=1, keepdims=True)

    def march(op, cascades, **kw):
        def fn(o, d, bits):
            m = op(o, d, Grid(bits, g, cascades), near=0.05, jitter=False, max_samples=256, **kw)
            return [m.t_starts, m.t_ends, m.ray_indices, m.row_splits]
        return fn

    return {
        "ZeroOut": ([np.arange(1, 4097, dtype=np.float32)], lambda x: [tfmo.zero_out(x)], zero_out_ref, 0, 0),
        INLINE_CASE: ([rng.uniform(-2, 2, 1000).astype(np.float32)], inline, inline_ref, 1e-5, 1e-6),
        "HashGridEncode (+ gradients)": ([x, params], hash_grid(tfmo.hash_grid_encode),
                                         hash_grid(pure_tf.hash_grid_encode), 1e-3, 1e-3),  # d/dx: float32 cells
        "FusedMlp (+ gradients)": ([mlp_x, mlp_params], fused_mlp(tfmo.fused_mlp), fused_mlp(tfmo.fused_mlp_tf),
                                   1e-4, 1e-5),
        "VolumeRender (+ gradient)": ([sigma, rgb, t, bg], render(tfmo.volume_render),
                                      render(tfmo.volume_render_tf), 1e-4, 1e-5),
        "DistortionLoss (+ gradient)": ([w, t], distortion(tfmo.distortion_loss),
                                        distortion(tfmo.distortion_loss_tf), 1e-4, 1e-5),
        "VolumeRenderPacked (+ gradient)": ([p_sigma, p_rgb, edges[0::2], edges[1::2], rs, bg],
                                            render_packed(tfmo.volume_render_packed),
                                            render_packed(tfmo.volume_render_packed_tf), 1e-4, 1e-5),
        "RayMarch (occupancy grid)": ([m_o, m_d, bits1], march(tfmo.ray_march, 1, step_size=0.01),
                                      march(tfmo.ray_march_tf, 1, step_size=0.01), 1e-5, 1e-6),
        "RayMarch (3 cascades, cone)": ([m_o, m_d, bits3],
                                        march(tfmo.ray_march, 3, step_size=0.01, cone_angle=1 / 64),
                                        march(tfmo.ray_march_tf, 3, step_size=0.01, cone_angle=1 / 64), 1e-5, 1e-6),
        "DistortionLossPacked (+ gradient)": ([p_w, edges[0::2], edges[1::2], rs],
                                              distortion_packed(tfmo.distortion_loss_packed),
                                              distortion_packed(tfmo.distortion_loss_packed_tf), 1e-4, 1e-5),
    }


INLINE_CASE = "metal_kernel (inline, + gradient)"


def _run(tf, fn, inputs, device, repeats=3):
    """(numpy outputs, seconds per call, devices the outputs were placed on)."""
    with tf.device(device):
        tensors = [tf.constant(a) for a in inputs]
        out = fn(*tensors)  # warm-up (first-call compilation, pipeline creation)
        values = [o.numpy() for o in out]
        start = time.perf_counter()
        for _ in range(repeats):
            for o in fn(*tensors):
                o.numpy()
        per_call = (time.perf_counter() - start) / repeats
    return values, per_call, sorted({o.device.split("device:")[-1] for o in out})


def _agree(a, b, rtol, atol):
    """None when every output matches, else where the largest difference is."""
    if len(a) != len(b):
        return f"{len(a)} outputs vs {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        if x.shape != y.shape:
            return f"output {i}: shape {x.shape} vs {y.shape}"
        if not np.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True):
            return f"output {i}: max |diff| {np.nanmax(np.abs(x - y)):.3g}"
    return None


class _SkipCpu(Exception):
    pass


def _inline_cpu_compiler(tfmo) -> bool:
    """Whether inline kernels can run on the CPU here (a clang++ >= 16); the reason when not."""
    try:
        build.find_compiler()
        return True
    except build.KernelCompileError as e:
        _inline_cpu_compiler.reason = str(e)
        return False


def run_checks(tf, tfmo, devices, out=print):
    """Runs every case on each device; returns the list of failures (strings)."""
    failures = []
    cases = _cases(tf, tfmo)
    for name, (inputs, fn, ref, rtol, atol) in cases.items():
        if name == INLINE_CASE and not _inline_cpu_compiler(tfmo):
            # The CPU path compiles inline kernels with clang++ >= 16; a Mac GPU needs no compiler: compare there
            # against pure TF.
            out(f"  {name:34s} CPU  skipped: {_inline_cpu_compiler.reason}")
            cpu = _run(tf, ref, inputs, "/CPU:0", repeats=1)[0]
        else:
            cpu = None
        try:
            if cpu is not None:
                raise _SkipCpu
            cpu, cpu_t, placed = _run(tf, fn, inputs, "/CPU:0")
            ref_values, ref_t, _ = _run(tf, ref, inputs, "/CPU:0", repeats=1)
            bad = _agree(cpu, ref_values, rtol, atol)
            out(f"  {name:34s} CPU  {cpu_t * 1e3:9.2f} ms/call  vs pure TF: {bad or 'agree'}")
            if bad:
                failures.append(f"{name} on the CPU disagrees with pure TF: {bad}")
        except _SkipCpu:
            pass
        except Exception as e:
            out(f"  {name:34s} CPU  FAILED: {type(e).__name__}: {e}")
            failures.append(f"{name} on the CPU: {type(e).__name__}: {e}")
            continue
        for device in devices:
            try:
                gpu, gpu_t, placed = _run(tf, fn, inputs, device)
                bad = _agree(gpu, cpu, rtol, atol)
                where = ",".join(placed)
                if not any(p.startswith("GPU") for p in placed):
                    bad = f"ran on {where}, not the GPU"
                out(f"  {name:34s} {device} {gpu_t * 1e3:9.2f} ms/call  on {where}  vs CPU: {bad or 'agree'}")
                if bad:
                    failures.append(f"{name} on {device}: {bad}")
            except Exception as e:
                out(f"  {name:34s} {device} FAILED: {type(e).__name__}: {e}")
                failures.append(f"{name} on {device}: {type(e).__name__}: {e}")
    return failures


def main(argv=None) -> int:
    info = tfmo.backend_info()
    print("tf-metal-ops doctor")
    print(f"  tf-metal-ops        {tfmo.__version__}")
    print(f"  Python              {info['python']} on {info['platform']}")
    print(f"  TensorFlow          {info['tensorflow']}")
    print(f"  tensorflow-metal    {info['tensorflow_metal'] or 'not installed'}")
    print(f"  community plugin    {info.get('community_metal_plugin') or 'not installed'}")
    print(f"  devices             {', '.join(info['devices'])}")
    if not info["library_loaded"]:
        print(f"  op library          NOT LOADED: {info['library_error']}")
        print("RESULT: not usable: the op library did not load (reinstall with `pip install .`)")
        return 1
    print(f"  op library          {info['library_path']}")
    print(f"  build               {json.dumps(info['build'])}")
    if "metal_device" in info:  # Metal device, GPU family, kernel library variant and load time
        print(f"  Metal device        {json.dumps(info['metal_device'])}")
    reason = info["metal_reason"]
    reason = reason[len("unusable: "):] if reason.startswith("unusable: ") else reason  # (3.9: no removeprefix)
    print(f"  Metal               {'usable' if info['metal_usable'] else 'not usable'}: {reason}")
    emu = info.get("emulated_gpu", {})
    if emu.get("requested") or emu.get("enabled"):
        print(f"  emulated GPU        {'usable' if emu.get('usable') else 'not usable'}: {emu.get('reason')}")
    print(f"  CPU threads         {info['num_threads']}")
    if info.get("cpu_paths"):  # the build each per-ISA CPU kernel family runs (backend.cpu_paths)
        print(f"  CPU builds          {', '.join(f'{k} {v}' for k, v in info['cpu_paths'].items())}")

    gpus = tf.config.list_logical_devices("GPU")
    devices = ["/GPU:0"] if gpus else []
    print(f"checks (random inputs; CPU kernels vs pure TF{', GPU vs CPU kernels' if devices else ''}):")
    start = time.perf_counter()
    failures = run_checks(tf, tfmo, devices)
    print(f"  (checks took {time.perf_counter() - start:.1f} s)")

    # Metal kernels are expected on Apple-silicon Macs; Intel Macs get the CPU kernels (no tensorflow-metal wheel).
    on_mac = sys.platform == "darwin" and platform.machine() == "arm64"
    if failures:
        print(f"RESULT: not usable: {len(failures)} check(s) failed; first: {failures[0]}")
        return 1
    if on_mac and not info["metal_usable"]:
        print(f"RESULT: CPU kernels usable; Metal kernels not usable: {info['metal_reason']}")
        return 1
    if on_mac:
        print(f"RESULT: usable: Metal and CPU kernels agree ({info['metal_reason']})")
    elif devices:
        print(f"RESULT: usable: CPU kernels and the emulated GPU ({gpus[0].name}) pass; no Metal device on "
              f"{info['platform']} (not an error)")
    else:
        print(f"RESULT: usable: CPU kernels pass; no Metal device on {info['platform']} (not an error)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
