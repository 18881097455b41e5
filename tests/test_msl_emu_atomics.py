"""Counting atomic operations per launch in the MSL emulation (csrc/msl_emu/include/msl_emu/atomic_counts.h), through
the kernel-by-name launcher (csrc/emulated_gpu/kernel_launch.h LaunchAtomics) that the emulated GPU uses: exact counts
for kernels with a known number of atomics, CAS attempts and retries of a contended loop, attribution to buffers and
to parts of a buffer, threadgroup memory apart, nothing counted unless asked. The fixture kernels are in
tests/msl_emu/launch/atomics_fixture.metal; the driver is tests/msl_emu/launch/launch_driver.cc (ASan+UBSan).
Needs clang++-16 (conftest.py: skip, or fail under TFMO_REQUIRE_MAC_CHECKS=1)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from support import kernel_launch_driver
from support.kernel_launch_driver import Script, run

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "msl_emu" / "launch" / "atomics_fixture.metal"
FIELDS = ("rmw", "cas", "cas_failed", "load", "store")
WORKER_ENVS = [{"TF_METAL_OPS_EMULATED_GPU_WORKERS": "1"},
               {"TF_METAL_OPS_EMULATED_GPU_WORKERS": "3", "MSL_EMU_ORDER": "shuffle", "MSL_EMU_SEED": "5"}]
WORKER_IDS = ["1worker", "3workers-shuffle"]


@pytest.fixture(scope="module")
def launcher(clang16):
    return kernel_launch_driver.build(clang16, [FIXTURE], name="atomics")


def parse(stdout: str) -> list[dict]:
    """One dict per counted launch: {"buffers": {(slot, param): [part dicts with "begin" and FIELDS]}, "tg": dict}."""
    launches, cur = [], None
    for line in stdout.splitlines():
        if not line.startswith("atomics: "):
            continue
        w = line.split()[1:]
        if cur is None:
            cur = {"buffers": {}}
        if w[0] == "buf":
            slot, param, part, begin = int(w[1]), w[2], int(w[3]), int(w[4])
            parts = cur["buffers"].setdefault((slot, param), [])
            assert part == len(parts)
            parts.append({"begin": begin, **dict(zip(FIELDS, map(int, w[5:])))})
        else:
            cur["tg"] = dict(zip(FIELDS, map(int, w[1:])))
            launches.append(cur)
            cur = None
    assert cur is None, stdout
    return launches


def add_args(n, k, m, skip=0xFFFFFFFF):
    return struct.pack("<IIII", n, k, m, skip)


def adds_script(tmp, n, k, m, *, group=64, skip=0xFFFFFFFF, split=None, count=True):
    s = Script(tmp)
    if count:
        s.cmd("atomics on")
    if split:
        s.cmd("split acc " + " ".join(map(str, split)))
    s.kernel("atomic_adds", grid=(n, 1, 1), group=(group, 1, 1))
    s.buf(0, "uint", np.zeros(m, np.uint32), out="acc", dtype=np.uint32).bytes(1, add_args(n, k, m, skip))
    return s.cmd("launch")


def expected_adds(n, k, m, skip=None):
    """acc[e] after atomic_adds (float64-free: exact integers from the kernel's index rule)."""
    acc = np.zeros(m, np.int64)
    for i in range(n):
        kk = k - 1 if i == skip else k
        np.add.at(acc, (i * k + np.arange(kk)) % m, 1)
    return acc


@pytest.mark.parametrize("env", WORKER_ENVS, ids=WORKER_IDS)
def test_rmw_count_is_exact(launcher, tmp_path, env):
    n, k, m = 1000, 3, 97  # 16 groups, the last one partial
    res, _, outs = run(launcher, adds_script(tmp_path, n, k, m), env)
    (launch,) = parse(res.stdout)
    (acc,) = launch["buffers"][(0, "acc")]
    assert acc == {"begin": 0, "rmw": n * k, "cas": 0, "cas_failed": 0, "load": 0, "store": 0}
    assert launch["buffers"][(1, "a")] == [{"begin": 0, "rmw": 0, "cas": 0, "cas_failed": 0, "load": 0, "store": 0}]
    assert launch["tg"] == dict.fromkeys(FIELDS, 0)
    np.testing.assert_array_equal(outs["acc"], expected_adds(n, k, m))


def test_one_atomic_fewer_is_seen(launcher, tmp_path):
    """Negative control: the same launch with thread 17 doing one add fewer counts exactly one RMW less."""
    n, k, m = 500, 4, 61
    s = adds_script(tmp_path, n, k, m)
    s.cmd("reset")
    (tmp_path / "b").mkdir()
    s2 = adds_script(tmp_path / "b", n, k, m, skip=17)
    s.lines += s2.lines
    s.outs["acc2"] = s2.outs["acc"]
    res, _, outs = run(launcher, s)
    full, fewer = parse(res.stdout)
    assert full["buffers"][(0, "acc")][0]["rmw"] == n * k
    assert fewer["buffers"][(0, "acc")][0]["rmw"] == n * k - 1
    np.testing.assert_array_equal(outs["acc2"], expected_adds(n, k, m, skip=17))


@pytest.mark.parametrize("env", WORKER_ENVS, ids=WORKER_IDS)
def test_parts_of_a_buffer(launcher, tmp_path, env):
    """Split at element offsets 10, 40, 41 (bytes 40, 160, 164): each part counts the adds to its elements."""
    n, k, m = 700, 2, 53
    cuts = [10, 40, 41]
    res, _, _ = run(launcher, adds_script(tmp_path, n, k, m, split=[4 * c for c in cuts]), env)
    (launch,) = parse(res.stdout)
    parts = launch["buffers"][(0, "acc")]
    acc = expected_adds(n, k, m)
    bounds = [0, *cuts, m]
    assert [p["begin"] for p in parts] == [4 * b for b in bounds[:-1]]
    assert [p["rmw"] for p in parts] == [int(acc[a:b].sum()) for a, b in zip(bounds, bounds[1:])]
    assert sum(p["rmw"] for p in parts) == n * k


def test_split_offset_zero_and_errors(launcher, tmp_path):
    """A leading 0 adds no empty part; a split of a name that is no parameter is ignored; offsets out of order or past
    the buffer fail the launch (nothing ran)."""
    s = adds_script(tmp_path, 64, 1, 16, split=[0, 32]).cmd("split nope 4").cmd("launch")
    for bad in ("split acc 32 16", "split acc 64"):
        s.cmd("reset")
        s.lines += adds_script(tmp_path, 64, 1, 16).lines[:1] + [bad] + adds_script(tmp_path, 64, 1, 16).lines[1:]
    res, _, _ = run(launcher, s, check=False)
    assert res.returncode == 0, res.stderr
    first, second = parse(res.stdout)
    assert [(p["begin"], p["rmw"]) for p in first["buffers"][(0, "acc")]] == [(0, 32), (32, 32)]
    assert second["buffers"] == first["buffers"]
    errors = [line for line in res.stdout.splitlines() if line.startswith("launch: ERR")]
    assert len(errors) == 2, res.stdout
    assert "must ascend" in errors[0] and "not inside its 64-byte buffer" in errors[1]


@pytest.mark.parametrize("env", WORKER_ENVS, ids=WORKER_IDS)
def test_cas_attempts_are_successes_plus_retries(launcher, tmp_path, env):
    """Every thread increments one word with a CAS loop: n successes exactly, retries >= 0 (with several workers the
    groups really race; within a group threads run one after another, so a retry needs another worker)."""
    n = 4096
    s = Script(tmp_path).cmd("atomics on").kernel("cas_increment", grid=(n, 1, 1), group=(32, 1, 1))
    s.buf(0, "uint", np.zeros(1, np.uint32), out="w", dtype=np.uint32).bytes(1, struct.pack("<I", n)).cmd("launch")
    res, _, outs = run(launcher, s, env)
    (launch,) = parse(res.stdout)
    (w,) = launch["buffers"][(0, "word")]
    assert outs["w"][0] == n
    assert w["load"] == n and w["rmw"] == 0
    assert w["cas"] - w["cas_failed"] == n
    assert w["cas_failed"] >= 0
    if env["TF_METAL_OPS_EMULATED_GPU_WORKERS"] == "1":
        assert w["cas_failed"] == 0  # one worker, threads run to completion one after another: nothing can interleave


@pytest.mark.parametrize("env", WORKER_ENVS, ids=WORKER_IDS)
def test_every_kind_and_threadgroup_memory_apart(launcher, tmp_path, env):
    n, group = 300, 64
    s = Script(tmp_path).cmd("atomics on").kernel("mixed_ops", grid=(n, 1, 1), group=(group, 1, 1))
    s.buf(0, "int", np.zeros(8, np.int32)).bytes(1, struct.pack("<I", n)).tgmem(0, 4 * group).cmd("launch")
    res, _, _ = run(launcher, s, env)
    (launch,) = parse(res.stdout)
    (d,) = launch["buffers"][(0, "d")]
    assert d == {"begin": 0, "rmw": 7 * n, "cas": 0, "cas_failed": 0, "load": n, "store": n}
    tg = launch["tg"]
    assert tg["rmw"] == 2 * n and tg["store"] == n and tg["load"] == 0
    assert tg["cas"] - tg["cas_failed"] == n and tg["cas_failed"] >= n  # each thread's first attempt fails


def test_off_by_default_and_off_again(launcher, tmp_path):
    """No counts without `atomics on`; after `atomics off` the next launch counts nothing and still computes; a
    kernel without atomics counts zero."""
    n, k, m = 256, 2, 32
    s = adds_script(tmp_path, n, k, m, count=False)
    s.cmd("atomics on").cmd("launch").cmd("atomics off").cmd("launch")
    s.cmd("reset").cmd("atomics on").kernel("plain_double", grid=(100, 1, 1), group=(32, 1, 1))
    x = np.arange(100, dtype=np.float32)
    s.buf(0, "float", x).buf(1, "float", nbytes=400, out="y", dtype=np.float32).cmd("launch")
    res, _, outs = run(launcher, s)
    assert res.stdout.count("launch: ok") == 4
    counted = parse(res.stdout)
    assert len(counted) == 2  # the second launch of atomic_adds and plain_double only
    assert counted[0]["buffers"][(0, "acc")][0]["rmw"] == n * k
    zero = {"begin": 0, **dict.fromkeys(FIELDS, 0)}
    assert counted[1]["buffers"] == {(0, "x"): [zero], (1, "y"): [zero]}
    np.testing.assert_array_equal(outs["y"], 2 * x)
    lines = res.stdout.splitlines()
    first_launch = lines.index("launch: ok")
    assert not lines[first_launch + 1].startswith("atomics:")  # the launch before `atomics on`
