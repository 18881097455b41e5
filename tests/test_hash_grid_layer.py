"""The Keras layer HashGridEncoding, for both implementations (the compiled op and pure TF): training in
model.fit, get_config/from_config, .keras save/load, SavedModel export/reload (in a fresh process, with gradients),
dtype policies, max_level, and the XLA example of docs/hash_grid.md."""

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_metal_ops
from tf_metal_ops.hash_grid import HashGridConfig, HashGridEncoding, pure_tf, reference

IMPLEMENTATIONS = ["pure_tf", "op"]
SMALL = dict(n_levels=6, n_features_per_level=2, log2_hashmap_size=10, base_resolution=4, per_level_scale=1.6)
DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "hash_grid.md")


def make_model(implementation, d=2, **kwargs):
    inputs = keras.Input((d,))
    h = HashGridEncoding(**{**SMALL, **kwargs}, implementation=implementation, name="grid")(inputs)
    h = keras.layers.Dense(32, activation="relu")(h)
    return keras.Model(inputs, keras.layers.Dense(1)(h))


def randomize_table(layer, seed=0):
    rng = np.random.default_rng(seed)
    layer.table.assign(rng.uniform(-1, 1, layer.table.shape).astype(layer.table.dtype))


def points(n, d=2, seed=1):
    return np.random.default_rng(seed).uniform(0, 1, (n, d)).astype(np.float32)


def test_resolves_implementation():
    assert HashGridEncoding(implementation="op").resolved_implementation == "op"
    assert HashGridEncoding(implementation="auto").resolved_implementation == "op"  # the library is built
    layer = HashGridEncoding(implementation="pure_tf")
    assert layer.resolved_implementation == "pure_tf" and layer.supports_jit
    assert not HashGridEncoding(implementation="op").supports_jit  # keras' jit_compile="auto" then avoids XLA
    with pytest.raises(ValueError, match="implementation"):
        HashGridEncoding(implementation="cuda")
    with pytest.raises(ValueError, match="n_features_per_level"):
        HashGridEncoding(n_features_per_level=3)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_forward_matches_reference(implementation):
    layer = HashGridEncoding(**SMALL, interpolation="smoothstep", implementation=implementation)
    x = points(100, 3)
    layer.build((None, 3))
    randomize_table(layer)
    cfg = layer.hash_grid_config
    assert cfg == HashGridConfig(3, **SMALL, interpolation="smoothstep")
    assert layer.table.shape == cfg.params_shape
    y = layer(x)
    assert y.shape == (100, 12) and y.dtype == tf.float32
    np.testing.assert_allclose(y.numpy(), reference.encode(x, layer.table.numpy(), cfg), atol=2e-6)
    fresh = HashGridEncoding(**SMALL, implementation=implementation)
    assert fresh(x[:5]).shape == (5, 12)  # builds from a NumPy input on first call
    # leading dims: [B, S, D] -> [B, S, L*F]
    y3 = layer(x.reshape(10, 10, 3))
    assert y3.shape == (10, 10, 12)
    np.testing.assert_array_equal(y3.numpy().reshape(100, 12), y.numpy())
    assert layer.compute_output_shape((None, 7, 3)) == (None, 7, 12)
    # max_level: an int level count, a float fraction, a tensor
    for ml, n_active in [(2, 2), (0.5, 4), (tf.constant(3), 3)]:
        yl = layer(x, max_level=ml).numpy()
        np.testing.assert_array_equal(yl[:, 2 * n_active :], 0)
        np.testing.assert_array_equal(yl[:, : 2 * n_active], y.numpy()[:, : 2 * n_active])


def test_initializer():
    layer = HashGridEncoding(**SMALL)
    layer.build((None, 3))
    t = layer.table.numpy()
    assert np.abs(t).max() <= 1e-4 and t.std() > 1e-5  # uniform in +-1e-4


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_fit_decreases_loss(implementation):
    keras.utils.set_random_seed(0)
    x = points(2048, 2, seed=3)
    y = (np.sin(2 * np.pi * x[:, :1]) * np.cos(3 * np.pi * x[:, 1:])).astype(np.float32)
    model = make_model(implementation)
    # keras honours jit_compile=True only when every layer supports XLA: the op does not (keras warns and turns
    # XLA off), pure TF does (so fit runs it under XLA)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", jit_compile=True)
    assert model.jit_compile == (implementation == "pure_tf")
    table_before = model.get_layer("grid").table.numpy().copy()
    first = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=8, batch_size=256, verbose=0)
    last = model.evaluate(x, y, verbose=0)
    assert last < 0.2 * first, (first, last)
    assert np.abs(model.get_layer("grid").table.numpy() - table_before).max() > 1e-3  # the table trains


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_get_config_from_config(implementation):
    layer = HashGridEncoding(**SMALL, grid_type="tiled", interpolation="nearest", implementation=implementation,
                             name="g")
    config = layer.get_config()
    for k, v in {**SMALL, "grid_type": "tiled", "interpolation": "nearest", "implementation": implementation}.items():
        assert config[k] == v, k
    clone = HashGridEncoding.from_config(config)
    assert clone.get_config() == config
    x = points(50, 2)
    layer.build((None, 2))
    clone.build((None, 2))
    randomize_table(layer)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(clone(x).numpy(), layer(x).numpy())


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_keras_save_load(implementation, tmp_path):
    model = make_model(implementation)
    randomize_table(model.get_layer("grid"))
    x = points(64)
    expected = model(x).numpy()
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    layer = loaded.get_layer("grid")
    assert isinstance(layer, HashGridEncoding) and layer.implementation == implementation
    np.testing.assert_array_equal(loaded(x).numpy(), expected)
    np.testing.assert_array_equal(layer.table.numpy(), model.get_layer("grid").table.numpy())


RELOAD_SCRIPT = textwrap.dedent(
    """
    import sys, numpy as np, tensorflow as tf
    import tf_metal_ops  # loads the op library and registers the op's gradient
    m = tf.saved_model.load(sys.argv[1])
    x = tf.constant(np.load(sys.argv[2]))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = m.serve(x)
        loss = tf.reduce_sum(y)
    table = [v for v in m.variables if "table" in v.name]
    gx, gt = tape.gradient(loss, [x, table[0]])
    np.savez(sys.argv[3], y=y.numpy(), gx=gx.numpy(), gt=tf.convert_to_tensor(gt).numpy())
    """
)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_savedmodel_export_reload(implementation, tmp_path):
    model = make_model(implementation)
    randomize_table(model.get_layer("grid"))
    x = points(64)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        loss = tf.reduce_sum(model(xt))
    gx, gt = tape.gradient(loss, [xt, model.get_layer("grid").table])
    export_dir = str(tmp_path / "exported")
    model.export(export_dir, verbose=False)

    # same process
    reloaded = tf.saved_model.load(export_dir)
    np.testing.assert_allclose(reloaded.serve(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-7)

    # fresh process: only `import tf_metal_ops` makes the op and its gradient known
    np.save(tmp_path / "x.npy", x)
    script = tmp_path / "reload.py"
    script.write_text(RELOAD_SCRIPT)
    out = tmp_path / "out.npz"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, str(script), export_dir, str(tmp_path / "x.npy"), str(out)],
                          capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(out)
    np.testing.assert_allclose(got["y"], model(x).numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got["gx"], gx.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["gt"], tf.convert_to_tensor(gt).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("policy", ["float16", "mixed_float16"])
def test_float16_policies(implementation, policy):
    layer = HashGridEncoding(**SMALL, implementation=implementation, dtype=policy)
    layer.build((None, 3))
    assert layer.table.dtype == ("float16" if policy == "float16" else "float32")
    randomize_table(layer)
    x = points(80, 3)
    y = layer(x)
    assert y.dtype == tf.float16  # the op/pure_tf get float16 params
    table16 = layer.table.numpy().astype(np.float16)
    np.testing.assert_allclose(y.numpy().astype(np.float64), reference.encode(x, table16, layer.hash_grid_config),
                               rtol=2**-10, atol=1e-6)
    # positions are not autocast to float16 (fine levels would collapse): a float16 cast would change the output
    y_f16_pos = pure_tf.encode(x.astype(np.float16).astype(np.float32), table16, layer.hash_grid_config)
    assert not np.array_equal(y.numpy(), y_f16_pos.numpy())
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.cast(layer(x), tf.float32))
    g = tape.gradient(loss, layer.table)
    assert tf.convert_to_tensor(g).dtype == layer.table.dtype


def _docs_example():
    text = open(DOCS).read()
    m = re.search(r"<!-- tested: test_docs_xla_example -->\s*```python\n(.*?)```", text, re.S)
    assert m, "docs/hash_grid.md lost its tested XLA example"
    return m.group(1)


def test_docs_xla_example(tmp_path):
    """The XLA example of docs/hash_grid.md runs as written (it trains), and the op really cannot be
    jit-compiled."""
    path = tmp_path / "docs_xla_example.py"  # a real file, so autograph can read the functions' source
    path.write_text(_docs_example())
    spec = importlib.util.spec_from_file_location("docs_xla_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.grid.resolved_implementation == "op"
    x = tf.constant(points(512, 3))
    target = tf.concat([x[:, :1] ** 2, tf.sin(3 * x[:, 1:2]), x[:, 2:] * 0.5], axis=1)
    errors = [float(tf.reduce_mean(tf.square(example.train_step(x, target) - target))) for _ in range(30)]
    assert errors[-1] < 0.3 * errors[0], errors
    assert example.mlp_and_loss.experimental_get_tracing_count() == 1
    params = np.zeros(tf_metal_ops.hash_grid_table_layout(3, n_levels=4, log2_hashmap_size=10).params_shape,
                      np.float32)
    with pytest.raises(Exception, match="(?i)xla|jit|kernel|compil"):
        tf.function(lambda p: tf_metal_ops.hash_grid_encode(x, p, n_levels=4, log2_hashmap_size=10),
                    jit_compile=True)(params)


def test_auto_falls_back_without_library(tmp_path):
    """Without the op library the package still imports and "auto" uses pure TF (with a warning); "op" raises."""
    script = textwrap.dedent(
        """
        import warnings, numpy as np
        import tf_metal_ops
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            layer = tf_metal_ops.HashGridEncoding(n_levels=4, log2_hashmap_size=10)
        assert layer.resolved_implementation == "pure_tf" and layer.supports_jit
        assert any("pure-TF" in str(w.message) for w in caught)
        assert layer(np.full((3, 2), 0.5, np.float32)).shape == (3, 8)
        try:
            tf_metal_ops.HashGridEncoding(implementation="op")
        except tf_metal_ops.OpLibraryError:
            print("OK")
        """
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_METAL_OPS_LIBRARY=str(tmp_path / "missing.so"))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-3000:]
