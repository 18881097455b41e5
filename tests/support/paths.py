"""Directories of the checkout the tests read from (sources, fixtures, examples); never import paths."""

import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_ROOT = os.path.dirname(TESTS)
EXAMPLES = os.path.join(REPO_ROOT, "examples")
