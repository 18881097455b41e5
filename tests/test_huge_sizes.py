"""Requests whose memory cannot be had fail cleanly (ResourceExhaustedError) and the process goes on.

Each case runs in a subprocess whose data segment is capped with RLIMIT_DATA (Linux counts heap and anonymous
mappings against it), so a 1 GiB output or scratch buffer cannot be allocated however much memory the machine has.
"""

import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import os, resource, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import numpy as np, tensorflow as tf, tf_metal_ops as t
    cfg = dict(n_levels=32, n_features_per_level=8, log2_hashmap_size=10, base_resolution=2, per_level_scale=1.1)
    layout = t.HashGridConfig(n_input_dims=3, **cfg)
    x = tf.constant(np.random.default_rng(0).random((1 << 20, 3), dtype=np.float32))  # output: 1 GiB of float32
    p = tf.Variable(tf.zeros(layout.params_shape))
    dy = tf.ones([1 << 20, 256])  # allocated before the cap
    t.hash_grid_encode(x[:8], p, **cfg)  # warm up (library, kernels, small scratch)
    if sys.argv[1] == "gradient":  # the forward output exists; the backward's outputs and scratch do not fit
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = t.hash_grid_encode(x, p, **cfg)
    headroom = (256 if sys.argv[1] == "forward" else 4) << 20
    vmdata = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmData")][0]
    resource.setrlimit(resource.RLIMIT_DATA, (vmdata + headroom, resource.RLIM_INFINITY))
    try:
        if sys.argv[1] == "forward":
            t.hash_grid_encode(x, p, **cfg)
        else:
            tape.gradient(y, [x, p], output_gradients=dy)
        print("NO ERROR")
    except tf.errors.ResourceExhaustedError as e:
        print("ResourceExhaustedError:", str(e).splitlines()[0][:200])
    print("after:", t.zero_out([5, 6]).numpy().tolist())
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA semantics are Linux's")
@pytest.mark.parametrize("what", ["forward", "gradient"])
def test_hash_grid_allocation_failure_is_a_clean_error(what):
    # cwd outside the repo: `python -c` puts the working directory first on sys.path
    run = subprocess.run([sys.executable, "-c", SCRIPT, what], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), cwd=tempfile.gettempdir())
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    assert "ResourceExhaustedError:" in run.stdout, run.stdout + run.stderr[-4000:]
    assert "after: [5, 0]" in run.stdout
