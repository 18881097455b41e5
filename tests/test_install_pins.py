"""The `[metal]` extra (pyproject.toml) resolves to a working pair on each Mac, checked with pip's own resolver.

pip evaluates environment markers against the machine it runs on (Linux here), not against `--platform`, so the
markers are evaluated here for the target Mac (packaging.markers) and the selected requirements are handed to
`pip install --dry-run --platform ... --python-version ... --only-binary=:all:`. The resolver tests need PyPI:
they are marked `network` and skipped (not failed) when PyPI is unreachable."""

import concurrent.futures
import json
import os
import socket
import subprocess
import sys

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = pytest.importorskip("tomli")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MAC_ARM64 = {"sys_platform": "darwin", "platform_system": "Darwin", "os_name": "posix", "platform_machine": "arm64",
             "implementation_name": "cpython", "platform_python_implementation": "CPython"}
MAC_X86_64 = dict(MAC_ARM64, platform_machine="x86_64")
LINUX = dict(MAC_ARM64, sys_platform="linux", platform_system="Linux", platform_machine="x86_64")


def extra_requirements(extra, env, python):
    """The extra's requirement strings (markers removed) selected for the target environment."""
    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as f:
        reqs = tomllib.load(f)["project"]["optional-dependencies"][extra]
    env = dict(env, python_version=python, python_full_version=python + ".0", extra=extra)
    out = []
    for line in reqs:
        r = Requirement(line)
        if r.marker is None or r.marker.evaluate(env):
            r.marker = None
            out.append(str(r))
    return out


def names(reqs):
    return sorted(Requirement(r).name for r in reqs)


# ---- marker selection (offline) -------------------------------------------------------------------------------
def test_mac_arm64_up_to_312_gets_the_working_pair():
    for py in ("3.9", "3.10", "3.11", "3.12"):
        reqs = extra_requirements("metal", MAC_ARM64, py)
        assert sorted(reqs) == ["tensorflow-metal==1.2.0", "tensorflow<2.20,>=2.18"], (py, reqs)


def test_mac_arm64_313_gets_tensorflow_without_tensorflow_metal():
    assert names(extra_requirements("metal", MAC_ARM64, "3.13")) == ["tensorflow"]


def test_intel_mac_never_gets_tensorflow_metal_and_stays_on_tf_216():
    for py in ("3.9", "3.12"):
        reqs = extra_requirements("metal", MAC_X86_64, py)
        assert reqs == ["tensorflow<2.17,>=2.16"], (py, reqs)


def test_linux_gets_nothing_from_the_metal_extra():
    assert extra_requirements("metal", LINUX, "3.11") == []


# ---- pip's resolver (network) ---------------------------------------------------------------------------------
def _pypi_reachable():
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def _resolve(reqs, platform, python, target):
    """{name: version} pip would install for `reqs` on (platform, python), or an error string."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # PyPI only: no local indexes, find-links or constraints of this machine
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", "-",
           "--disable-pip-version-check", "--platform", platform, "--python-version", python,
           "--only-binary=:all:", "--no-deps", "--target", target] + reqs
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    if r.returncode != 0:
        return f"pip failed ({r.returncode}): {r.stderr[-2000:]}"
    report = json.loads(r.stdout)
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}


CASES = {  # name: (environment, python, pip platform)
    "arm64-3.12": (MAC_ARM64, "3.12", "macosx_12_0_arm64"),
    "arm64-3.13": (MAC_ARM64, "3.13", "macosx_14_0_arm64"),
    "x86_64-3.12": (MAC_X86_64, "3.12", "macosx_10_15_x86_64"),
}


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    """The three resolutions, run in parallel. --no-deps keeps it short (the question is which wheels exist for
    each platform and Python; a full resolution with dependencies took 70 s here)."""
    if not _pypi_reachable():
        pytest.skip("network: PyPI (pypi.org:443) is unreachable; pip resolution tests not run")
    with concurrent.futures.ThreadPoolExecutor(len(CASES)) as pool:
        futures = {
            name: pool.submit(_resolve, extra_requirements("metal", env, py), plat, py,
                              str(tmp_path_factory.mktemp(name)))
            for name, (env, py, plat) in CASES.items()
        }
        return {name: f.result() for name, f in futures.items()}


def _minor(v):
    return tuple(int(x) for x in v.split(".")[:2])


@pytest.mark.network
def test_pip_resolves_the_working_pair_on_mac_arm64_312(resolved):
    got = resolved["arm64-3.12"]
    assert isinstance(got, dict), got
    assert got["tensorflow-metal"] == "1.2.0"
    assert (2, 18) <= _minor(got["tensorflow"]) <= (2, 19), got["tensorflow"]


@pytest.mark.network
def test_pip_on_mac_arm64_313_installs_tensorflow_but_not_tensorflow_metal(resolved):
    got = resolved["arm64-3.13"]
    assert isinstance(got, dict), got
    assert "tensorflow" in got and "tensorflow-metal" not in got


@pytest.mark.network
def test_pip_on_intel_mac_installs_tf_216_and_no_tensorflow_metal(resolved):
    got = resolved["x86_64-3.12"]
    assert isinstance(got, dict), got
    assert got["tensorflow"] == "2.16.2" and "tensorflow-metal" not in got
