"""Helpers of the test suite: shared cases, build helpers, and the check scripts that run in a fresh process.

Tests import them as ``from support import op_cases`` (pytest puts tests/ first on sys.path; pyproject.toml adds
examples/, for ``from nerf import ...``). A check script is started as ``python -m support.<name>`` from tests/
(support/scripts.py), never by path, so the installed tf_metal_ops is what it imports.
"""
