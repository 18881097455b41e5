"""Shared test setup.

Tests run against the *installed* package (``pip install .``): the op library is built at install time, so
importing tf_metal_ops from a source checkout finds no library. Run them as ``pytest tests`` (the pytest script
does not put the working directory on sys.path, so the installed package is imported).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    import tf_metal_ops

    try:
        tf_metal_ops.library_path()
    except tf_metal_ops.OpLibraryError as e:
        raise pytest.UsageError(
            f"{e}\n(imported tf_metal_ops from {os.path.dirname(tf_metal_ops.__file__)}; run `pip install .` "
            "and start pytest with the `pytest` command, not `python -m pytest`, from the repo root)"
        )
