"""Every public op's docstring has a short example (``>>>`` lines, as nerfacc's), and the examples run: each
docstring is executed with doctest against the installed package and must print what it shows."""

import doctest
import os

import pytest

import tf_metal_ops

# Public names that are not ops: results, errors, configuration and diagnostics. Everything else in __all__ needs an
# example (a new public op without one fails test_every_public_op_has_an_example).
NOT_OPS = {"__version__", "CulledSamples", "HashGridConfig", "KernelCompileError", "MetalKernel", "OpLibraryError",
           "RayMarchResult", "ShaderLibrary", "VolumeRenderResult", "backend_info", "get_num_threads",
           "hash_grid_table_layout", "library_path", "num_threads", "set_num_threads",
           "enable_unsafe_kernel_loading"}  # its example would allow every kernel in the test process
OPS = sorted(set(tf_metal_ops.__all__) - NOT_OPS)
NEEDS_COMPILER = {"metal_kernel", "compile_shader"}  # the examples compile an inline kernel (clang++-16 on Linux)


def examples(name):
    tests = doctest.DocTestFinder(recurse=False).find(getattr(tf_metal_ops, name), name)
    return [t for t in tests if t.examples]


def test_every_public_op_has_an_example():
    assert NOT_OPS <= set(tf_metal_ops.__all__), NOT_OPS - set(tf_metal_ops.__all__)
    assert {"hash_grid_encode", "HashGridEncoding", "volume_render", "distortion_loss", "volume_render_packed",
            "distortion_loss_packed", "ray_march", "OccupancyGrid", "zero_out", "metal_kernel", "compile_shader",
            "volume_render_tf", "ray_march_tf"} <= set(OPS)
    missing = [name for name in OPS if not examples(name)]
    assert not missing, f"public ops whose docstring has no >>> example: {missing}"


@pytest.mark.parametrize("name", OPS)
def test_docstring_example_runs(name, request):
    if name in NEEDS_COMPILER:
        os.environ.setdefault("TF_METAL_OPS_CLANGXX", request.getfixturevalue("clang16"))
    tests = examples(name)
    if not tests:
        pytest.fail(f"{name} has no docstring example")
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    report = []
    for t in tests:
        runner.run(t, out=report.append)
    result = runner.summarize(verbose=False)
    assert result.failed == 0 and result.attempted > 0, "".join(report)
