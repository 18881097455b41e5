"""Kernels run by name with a checked binding contract (csrc/emulated_gpu/kernel_launch.h), through the glue that
tf_metal_ops/msl_emu.py generates. The test executable (tests/msl_emu/launch/launch_driver.cc, no
TensorFlow) links kernel_launch.cc with the glue of the fixtures (tests/msl_emu/launch/*.metal) and of every
real metal_kernels/*.metal file. Needs clang++-16 (conftest.py: skip, or fail under TFMO_REQUIRE_MAC_CHECKS=1)."""

from __future__ import annotations

import re
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest

from support import kernel_launch_driver, msl_emu_build
from support.kernel_launch_driver import Script, run

REPO = Path(__file__).resolve().parents[1]
LAUNCH_DIR = REPO / "tests" / "msl_emu" / "launch"
FIXTURE = LAUNCH_DIR / "launch_fixture.metal"
FAST = LAUNCH_DIR / "launch_fast.metal"
REAL_KERNEL_FILES = sorted((REPO / "metal_kernels").glob("*.metal"))

from tf_metal_ops import msl_emu as glue  # noqa: E402 (the generator of the kernel-table units)


@pytest.fixture(scope="module")
def launcher(clang16):
    """(path of the test executable, its glue units); built once, cached by a hash of what it is built from."""
    return kernel_launch_driver.build(clang16, [FIXTURE, FAST, *REAL_KERNEL_FILES])


ORDERS = [{"MSL_EMU_ORDER": "forward"}, {"MSL_EMU_ORDER": "reverse"},
          {"MSL_EMU_ORDER": "shuffle", "MSL_EMU_SEED": "7"},
          {"MSL_EMU_ORDER": "shuffle", "TF_METAL_OPS_EMULATED_GPU_WORKERS": "3"},
          {"MSL_EMU_ORDER": "forward", "MSL_EMU_WORKERS": "2"}]
ORDER_IDS = ["forward", "reverse", "shuffle", "shuffle-3workers", "forward-2workers"]

AFFINE_CONSTANTS = [(0, "b", True), (1, "i", -3), (2, "u", 5), (3, "f", 0.25)]


def affine_struct(scale, shift, n):
    return struct.pack("<ffII", scale, shift, n, 0)


def affine_script(tmp, x, n, *, constants=AFFINE_CONSTANTS, group=32):
    s = Script(tmp).kernel("affine_half", grid=(max(n, 1), 1, 1), group=(group, 1, 1))
    s.buf(2, "float", nbytes=4 * len(x), out="y", dtype=np.float32)
    s.bytes(5, affine_struct(1.5, -0.5, n))
    s.buf(0, "half", x.astype(np.float16))
    for c in constants:
        s.const(*c)
    return s


# --- correct launches ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("env", ORDERS, ids=ORDER_IDS)
def test_affine_half_struct_and_function_constants(launcher, tmp_path, env):
    x = np.random.default_rng(1).standard_normal(1000).astype(np.float16)
    n = 997  # the last threads return early; not a multiple of the group size
    s = affine_script(tmp_path, x, n).cmd("check").cmd("launch")
    # Same kernel again with other constant values: the setter must apply them per launch.
    s.cmd("reset")
    (tmp_path / "second").mkdir()
    s2 = affine_script(tmp_path / "second", x, n, constants=[(0, "b", False), (1, "i", 7), (2, "u", 1), (3, "f", -2.0)])
    s.lines += s2.lines[:]
    s.outs["y2"] = s2.outs.pop("y")
    s.cmd("launch")
    res, _, outs = run(launcher, s, env)
    assert res.stdout.count(": ok") == 3, res.stdout
    xf = x.astype(np.float32)
    want = -(np.float32(1.5) * xf[:n] + np.float32(-0.5)) * np.float32(5) + np.float32(-3) + np.float32(0.25)
    np.testing.assert_allclose(outs["y"][:n], want, rtol=1e-6, atol=1e-6)
    assert (outs["y"][n:].view(np.uint32) == 0xABABABAB).all()  # never written past a.n
    want2 = (np.float32(1.5) * xf[:n] + np.float32(-0.5)) * np.float32(1) + np.float32(7) + np.float32(-2.0)
    np.testing.assert_allclose(outs["y2"][:n], want2, rtol=1e-6, atol=1e-6)


def fixture_constants(s):
    for c in AFFINE_CONSTANTS:
        s.const(*c)
    return s


@pytest.mark.parametrize("env", ORDERS, ids=ORDER_IDS)
@pytest.mark.parametrize("tg", [32, 256])
def test_threadgroup_argument_with_barriers(launcher, tmp_path, env, tg):
    n = 3000
    groups = -(-n // tg)
    x = np.random.default_rng(tg).standard_normal(n).astype(np.float32)
    s = Script(tmp_path).kernel("group_sum", grid=(groups, 1, 1), group=(tg, 1, 1), groups=True)
    s.buf(0, "float", x).buf(1, "float", nbytes=4 * groups, out="sums", dtype=np.float32)
    s.bytes(2, struct.pack("<I", n)).tgmem(0, 4 * tg)
    fixture_constants(s).cmd("launch")
    _, _, outs = run(launcher, s, env)
    want = np.pad(x.astype(np.float64), (0, groups * tg - n)).reshape(groups, tg).sum(axis=1)
    np.testing.assert_allclose(outs["sums"], want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("env", ORDERS[:3], ids=ORDER_IDS[:3])
def test_uint2_grid(launcher, tmp_path, env):
    w, h, tx, ty = 37, 11, 8, 4
    s = Script(tmp_path).kernel("grid2d", grid=(w, h, 1), group=(tx, ty, 1))
    s.buf(0, "uint", nbytes=4 * 4 * w * h, out="ids", dtype=np.uint32).bytes(1, struct.pack("<II", w, h))
    fixture_constants(s).cmd("launch")
    _, _, outs = run(launcher, s, env)
    ids = outs["ids"].reshape(h, w, 4)
    yy, xx = np.mgrid[0:h, 0:w]
    np.testing.assert_array_equal(ids[..., 0], xx)
    np.testing.assert_array_equal(ids[..., 1], yy)
    np.testing.assert_array_equal(ids[..., 2], xx % tx)
    np.testing.assert_array_equal(ids[..., 3], yy % ty)


# --- fiber-free fast path ----------------------------------------------------------------------------------
@pytest.mark.parametrize("env", ORDERS, ids=ORDER_IDS)
def test_fast_path_values(launcher, tmp_path, env):
    n, tg = 1000, 64  # float4 elements
    x = np.random.default_rng(3).standard_normal((n, 4)).astype(np.float32)
    s = Script(tmp_path).kernel("scale_fast", grid=(n, 1, 1), group=(tg, 1, 1))
    s.buf(0, "float", x).buf(1, "float", nbytes=x.nbytes, out="y", dtype=np.float32)
    s.bytes(2, struct.pack("<f", 3.0)).cmd("launch")
    _, _, outs = run(launcher, s, env)
    i = np.arange(n) % tg
    want = x * np.float32(3.0) + (i // 32 * 1000 + i % 32).astype(np.float32)[:, None]
    np.testing.assert_allclose(outs["y"].reshape(n, 4), want, rtol=1e-6)


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffle"])
@pytest.mark.parametrize("workers", ["1", "2"])
def test_fast_path_honours_order(launcher, tmp_path, order, workers):
    """Within each group, threads run one after another in MSL_EMU_ORDER order (seq = execution rank)."""
    n, tg = 200, 50
    s = Script(tmp_path).kernel("order_probe", grid=(n, 1, 1), group=(tg, 1, 1))
    s.buf(0, "uint", np.zeros(n // tg, np.uint32)).buf(1, "uint", nbytes=4 * n, out="seq", dtype=np.uint32)
    s.bytes(2, struct.pack("<I", n)).cmd("launch")
    _, _, outs = run(launcher, s, {"MSL_EMU_ORDER": order, "TF_METAL_OPS_EMULATED_GPU_WORKERS": workers})
    seq = outs["seq"].reshape(-1, tg)
    for g in seq:
        assert sorted(g) == list(range(tg))
        if order == "forward":
            assert list(g) == list(range(tg))
        elif order == "reverse":
            assert list(g) == list(range(tg))[::-1]
    if order == "shuffle":
        assert any(list(g) != list(range(tg)) and list(g) != list(range(tg))[::-1] for g in seq)


def test_barrier_on_fast_path_is_fatal(launcher, tmp_path):
    s = Script(tmp_path).kernel("pasted_sync", grid=(4, 1, 1), group=(4, 1, 1))
    s.buf(0, "float", nbytes=16).cmd("launch")
    res, stderr, _ = run(launcher, s, check=False)
    assert res.returncode == msl_emu_build.EMU_ERROR_EXIT, stderr
    assert "reached on the fiber-free fast path" in stderr and "launch_fast.metal" in stderr


# --- the binding contract ------------------------------------------------------------------------------------
def _contract_case(tmp, case):
    x = np.zeros(8, np.float16)
    s = affine_script(tmp, x, 8)
    lines = s.lines
    if case == "missing_slot":
        s.lines = [l for l in lines if not l.startswith("bytes 5 ")]
    elif case == "extra_slot":
        s.buf(1, "float", np.zeros(4, np.float32))
    elif case == "float_to_half":
        s.lines = [l for l in lines if not l.startswith("buf 0 ")]
        s.buf(0, "float", np.zeros(8, np.float32))
    elif case == "size_not_multiple":
        s.lines = [l for l in lines if not l.startswith("buf 0 ")]
        s.buf(0, "half", nbytes=7)
    elif case == "bytes_wrong_size":
        s.lines = [l for l in lines if not l.startswith("bytes 5 ")]
        s.bytes(5, struct.pack("<ffI", 1, 2, 3))
    elif case == "buffer_too_small_for_ref":
        s.lines = [l for l in lines if not l.startswith("bytes 5 ")]
        s.buf(5, "uint", np.zeros(3, np.uint32))
    elif case == "bytes_to_writable":
        s.lines = [l for l in lines if not l.startswith("buf 2 ")]
        s.bytes(2, bytes(32))
    elif case == "constant_missing":
        s.lines = [l for l in lines if not l.startswith("const 3 ")]
    elif case == "constant_wrong_type":
        s.lines = [l if not l.startswith("const 2 ") else "const 2 i 5" for l in lines]
    elif case == "constant_unknown":
        s.const(9, "u", 1)
    elif case == "grid_zero":
        s.lines = [l if not l.startswith("grid ") else "grid threads 8 0 1" for l in lines]
    elif case == "grid_too_big":
        s.lines = [l if not l.startswith("grid ") else "grid threads 4294967296 1 1" for l in lines]
    elif case == "group_too_big":
        s.lines = [l if not l.startswith("group ") else "group 32 33 1" for l in lines]
    elif case == "group_zero":
        s.lines = [l if not l.startswith("group ") else "group 0 1 1" for l in lines]
    elif case == "unknown_kernel":
        s.lines = [l if not l.startswith("kernel ") else "kernel no_such_kernel" for l in lines]
    elif case == "tgmem_without_param":
        s.tgmem(0, 256)
    return s


def _group_sum_case(tmp, tg_lines):
    s = Script(tmp).kernel("group_sum", grid=(2, 1, 1), group=(64, 1, 1), groups=True)
    s.buf(0, "float", np.zeros(128, np.float32)).buf(1, "float", np.zeros(2, np.float32))
    s.bytes(2, struct.pack("<I", 128))
    for i, n in tg_lines:
        s.tgmem(i, n)
    return fixture_constants(s)


CONTRACT = {
    "missing_slot": "affine_half: buffer(5) 'a' is constant Affine&, but nothing is bound there",
    "extra_slot": "affine_half: buffer(1) is bound, but the kernel has no [[buffer(1)]] parameter",
    "float_to_half": "affine_half: buffer(0) 'x' is device const half*, but a float buffer is bound",
    "size_not_multiple": "affine_half: buffer(0) 'x' is device const half*, but the bound buffer has 7 bytes, "
                         "not a multiple of sizeof(half) = 2",
    "bytes_wrong_size": "affine_half: buffer(5) 'a' is constant Affine&, but 12 bytes are bound (sizeof(Affine) = 16)",
    "buffer_too_small_for_ref": "affine_half: buffer(5) 'a' is constant Affine&, but the bound buffer has 12 bytes, "
                                "less than sizeof(Affine) = 16",
    "bytes_to_writable": "affine_half: buffer(2) 'y' is device float*, which the kernel may write, but read-only "
                         "bytes (setBytes) are bound",
    "constant_missing": re.compile(r"affine_half: function constant 3 'kBias' \(float\) of .*launch_fixture\.metal "
                                   r"has no value"),
    "constant_wrong_type": "affine_half: function constant 2 'kMul' is uint, but the value given is int",
    "constant_unknown": re.compile(r"affine_half: function constant 9 is given, but .*launch_fixture\.metal declares "
                                   r"no \[\[function_constant\(9\)\]\]"),
    "grid_zero": "affine_half: grid (threads) dimension 1 is 0, must be in 1 .. 4294967295",
    "grid_too_big": "affine_half: grid (threads) dimension 0 is 4294967296, must be in 1 .. 4294967295",
    "group_too_big": "affine_half: threadgroup of 32x33x1 = 1056 threads exceeds 1024 threads per threadgroup",
    "group_zero": "affine_half: threads per threadgroup dimension 0 is 0",
    "unknown_kernel": "unknown kernel 'no_such_kernel'",
    "tgmem_without_param": "affine_half: threadgroup memory length 256 is set for index 0, but the kernel has no "
                           "[[threadgroup(0)]] parameter",
}
TG_CONTRACT = {
    "tgmem_missing": ([], "group_sum: threadgroup(0) 'tile' is threadgroup float*, but no threadgroup memory length "
                          "is set for index 0"),
    "tgmem_too_much": ([(0, 40000)], "group_sum: threadgroup memory of 40000 bytes in all exceeds the 32768-byte "
                                     "limit"),
    "tgmem_extra_index": ([(0, 256), (3, 16)], "group_sum: threadgroup memory length 16 is set for index 3, but the "
                                              "kernel has no [[threadgroup(3)]] parameter"),
    "tgmem_not_multiple": ([(0, 258)], "group_sum: threadgroup(0) 'tile' is threadgroup float*, but its threadgroup "
                                       "memory length 258 is not a multiple of sizeof(float) = 4"),
}


def _assert_both_fail(res, expected):
    check = [l for l in res.stdout.splitlines() if l.startswith("check: ")]
    launch = [l for l in res.stdout.splitlines() if l.startswith("launch: ")]
    assert len(check) == 1 and len(launch) == 1, res.stdout
    for line in (check[0], launch[0]):
        msg = line.split(": ", 1)[1]
        assert msg.startswith("ERR "), f"contract violation accepted: {line}"
        if isinstance(expected, re.Pattern):
            assert expected.search(msg), f"{msg!r} !~ {expected.pattern!r}"
        else:
            assert expected in msg, f"{msg!r} lacks {expected!r}"


def test_contract_baseline_holds(launcher, tmp_path):
    """Control for the cases below: the unmodified script passes check and launch."""
    res, _, _ = run(launcher, _contract_case(tmp_path, None).cmd("check").cmd("launch"))
    assert res.stdout.splitlines() == ["check: ok", "launch: ok"]
    res, _, _ = run(launcher, _group_sum_case(tmp_path, [(0, 256)]).cmd("check").cmd("launch"))
    assert res.stdout.splitlines() == ["check: ok", "launch: ok"]


@pytest.mark.parametrize("case", sorted(CONTRACT))
def test_contract_violation(launcher, tmp_path, case):
    s = _contract_case(tmp_path, case)
    # The output buffer is poisoned: Launch must not have run anything.
    s.lines = [l if not l.startswith("buf 2 ") else l.rsplit(" ", 1)[0] + f" {tmp_path / 'y.bin'}" for l in s.lines]
    res, stderr, _ = run(launcher, s.cmd("check").cmd("launch"), check=False)
    assert res.returncode == 0, stderr
    _assert_both_fail(res, CONTRACT[case])
    assert not (tmp_path / "y.bin").exists()


@pytest.mark.parametrize("case", sorted(TG_CONTRACT))
def test_threadgroup_memory_contract(launcher, tmp_path, case):
    tg_lines, expected = TG_CONTRACT[case]
    res, stderr, _ = run(launcher, _group_sum_case(tmp_path, tg_lines).cmd("check").cmd("launch"), check=False)
    assert res.returncode == 0, stderr
    _assert_both_fail(res, expected)


# --- the real kernels ----------------------------------------------------------------------------------------
def test_every_real_kernel_is_registered(launcher):
    _, units = launcher
    expected = set()
    for f in REAL_KERNEL_FILES:
        text = re.sub(r"//[^\n]*", "", f.read_text())  # code only
        names = (re.findall(r"^\s*kernel\s+void\s+(\w+)", text, re.M)  # plain kernels
                 + re.findall(r'\[\[host_name\("(\w+)"\)\]\]', text)  # instantiations written out
                 + re.findall(r'^\s*\w+\("(\w+)",', text, re.M))  # instantiations through a macro
        assert names, f
        expected.update(names)
    s = Script(Path(tempfile.gettempdir())).cmd("names")
    for name in sorted(expected):
        s.cmd(f"has {name}")
    res, _, _ = run(launcher, s)
    listed = {l.split(": ", 1)[1] for l in res.stdout.splitlines() if l.startswith("name: ")}
    assert expected <= listed, sorted(expected - listed)
    assert listed == expected | {"affine_half", "group_sum", "grid2d", "order_probe", "scale_fast", "pasted_sync"}
    assert res.stdout.count("has: 1") == len(expected)
    by_file = {u.metal_file.name: u for u in units}
    # Per kernel: the block scan (barriers), the hash grid's table-gradient run sums, the rendering kernels' SIMD
    # group per ray (SIMD-group functions) and the fused MLP's forward and backward (barriers, SIMD-group matrices)
    # need fibers; every other kernel runs on the emulator's fiber-free fast path (also the hash-grid encoding and
    # position gradient, in the same file as the run sums, and the fused MLP's reduce).
    fibers = {k.name for u in units for k in u.kernels if k.needs_fibers}
    assert fibers == REAL_FIBER_KERNELS | {"group_sum"}
    assert {f.name for f in REAL_KERNEL_FILES if by_file[f.name].needs_fibers} == {
        "ray_march.metal", "hash_grid.metal", "render.metal", "render_packed.metal", "fused_mlp.metal"}
    assert by_file["launch_fixture.metal"].needs_fibers and not by_file["launch_fast.metal"].needs_fibers


# The real kernels that reach threadgroup_barrier or a SIMD-group function (through their helpers).
REAL_FIBER_KERNELS = {"ray_march_scan_block", "hash_grid_abs_max_float32", "hash_grid_abs_max_float16"} | {
    f"hash_grid_{g}_params{det}{c}_{t}" for g in ("grad", "grad2") for det in ("", "_det") for c in ("", "_d3f2")
    for t in ("float32", "float16")} | {
    f"{op}{packed}_{d}" for op in ("volume_render", "distortion_loss") for packed in ("", "_packed")
    for d in ("forward", "backward")} | {
    f"fused_mlp_{d}_w{w}_{t}" for d in ("forward", "backward") for w in (16, 32, 64, 128)
    for t in ("float32", "float16")}


def test_fiber_use_of_the_real_kernels_is_per_kernel():
    by_name = {}
    for f in REAL_KERNEL_FILES:
        by_name.update({k.name: k for k in glue.parse_metal(f, search=[REPO / "csrc" / "shared"]).kernels})
    assert {n for n, k in by_name.items() if k.needs_fibers} == REAL_FIBER_KERNELS
    for fast in ("hash_grid_encode_float32", "hash_grid_encode_float16", "hash_grid_encode_d3f2_float32",
                 "hash_grid_encode_d3f2_float16", "hash_grid_grad_positions_float32",
                 "hash_grid_grad_positions_float16", "hash_grid_grad_positions_d3f2_float32",
                 "hash_grid_grad2_points_float32", "hash_grid_grad2_points_d3f2_float32", "hash_grid_fill_zero",
                 "ray_march_scan_add", "render_packed_check_splits", "fused_mlp_reduce_float32",
                 "fused_mlp_reduce_float16"):
        assert not by_name[fast].needs_fibers, fast
    # Without the include path the hash grid's header is not found: its signatures cannot be read.
    with pytest.raises(glue.GlueError, match=r"hash_grid\.metal:\d+: 'hash_grid_math\.h' file not found"):
        glue.parse_metal(REPO / "metal_kernels" / "hash_grid.metal")


def test_real_kernel_launch_zero_out(launcher, tmp_path):
    """A real kernel by name: zero_out_float16 (out[0] = in[0], others 0), half buffers and `constant uint&`."""
    x = np.arange(1, 101, dtype=np.float16)
    s = Script(tmp_path).kernel("zero_out_float16", grid=(100, 1, 1), group=(32, 1, 1))
    s.buf(0, "half", x).buf(1, "half", nbytes=x.nbytes, out="y", dtype=np.float16)
    s.bytes(2, struct.pack("<I", 100)).cmd("launch")
    _, _, outs = run(launcher, s)
    np.testing.assert_array_equal(outs["y"], np.r_[x[:1], np.zeros(99, np.float16)])
    s = Script(tmp_path).kernel("zero_out_float16", grid=(100, 1, 1), group=(32, 1, 1))
    s.buf(0, "float", x.astype(np.float32)).buf(1, "half", nbytes=x.nbytes).bytes(2, struct.pack("<I", 100))
    res, _, _ = run(launcher, s.cmd("check"), check=False)
    assert "zero_out_float16: buffer(0) 'in' is device const half*, but a float buffer is bound" in res.stdout


# --- the parser ----------------------------------------------------------------------------------------------
def test_parser_reads_the_fixture():
    mf = glue.parse_metal(FIXTURE)
    k = {k.name: k for k in mf.kernels}
    assert list(k) == ["affine_half", "group_sum", "grid2d"]
    assert [(p.name, p.kind, p.index, p.decl) for p in k["affine_half"].params] == [
        ("y", "buffer", 2, "device float*"), ("a", "buffer", 5, "constant Affine&"),
        ("x", "buffer", 0, "device const half*"), ("gid", "attribute", 0, "uint")]
    tile = k["group_sum"].params[3]
    assert (tile.kind, tile.index, tile.address_space, tile.pointer) == ("threadgroup", 0, "threadgroup", True)
    assert k["grid2d"].params[3].attribute == "thread_position_in_threadgroup" and k["grid2d"].params[3].type == "ushort2"
    assert [(c.index, c.type, c.name) for c in mf.constants] == [
        (0, "bool", "kNegate"), (1, "int", "kOffset"), (2, "uint", "kMul"), (3, "float", "kBias")]
    assert mf.needs_fibers and not glue.parse_metal(FAST).needs_fibers


@pytest.mark.parametrize("param, why", [
    ("device float* x", "exactly one attribute"),
    ("float x [[buffer(0)]]", "pointer or a reference"),
    ("thread float* x [[buffer(0)]]", "device or constant address space"),
    ("float2 p [[thread_position_in_grid]]", "must have type"),
    ("uint2 i [[thread_index_in_threadgroup]]", "must have type"),
    ("device float* x [[stage_in]]", "unsupported attribute"),
    ("device float* x [[buffer(31)]]", "indices are 0..30"),
])
def test_parser_rejects_unclassifiable_parameters(tmp_path, param, why):
    f = tmp_path / "bad.metal"
    f.write_text("#include <metal_stdlib>\n/* a comment\n*/ kernel void k(device float* ok [[buffer(0)]],\n"
                 f"    {param}) {{}}\n")
    with pytest.raises(glue.GlueError, match=rf"bad\.metal:4: kernel k: cannot classify parameter .*{re.escape(why)}"):
        glue.parse_metal(f)


def test_parser_finds_barrier_in_included_header(tmp_path):
    (tmp_path / "helper.h").write_text("inline void sync() { threadgroup_barrier(mem_flags::mem_threadgroup); }\n")
    f = tmp_path / "k.metal"
    f.write_text('#include "helper.h"\n// threadgroup_barrier( in a comment does not count\n'
                 "kernel void k(device float* x [[buffer(0)]]) { sync(); }\n"
                 "kernel void plain(device float* x [[buffer(0)]]) {}\n")
    assert {k.name: k.needs_fibers for k in glue.parse_metal(f).kernels} == {"k": True, "plain": False}
    assert glue.parse_metal(f).needs_fibers
    (tmp_path / "helper.h").write_text("inline void sync() {}\n")
    assert not glue.parse_metal(f).needs_fibers


# Kernel a uses the construct, kernel b does not: (text before the kernels, a's statement, b's statement).
_KERNELS = """
kernel void a(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {{ float v = x[i]; {a} }}
kernel void b(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {{ float v = x[i]; {b} }}
"""
FOLLOWED = {
    "helper": ("inline float total(float v) { return simd_sum(v); }\n", "x[i] = total(v);", "x[i] = v;"),
    "two_levels": ("inline float inner(float v) { return metal::simd_prefix_exclusive_sum(v); }\n"
                   "inline float outer(float v) { return inner(v) * 2.0f; }\n", "x[i] = outer(v);", "x[i] = v;"),
    "template": ("template <typename T>\ninline T red(T v) { return simd_max(v); }\n", "x[i] = red<float>(v);",
                 "x[i] = v;"),
    "functor": ("struct Summer { float operator()(float v) const { return simd_sum(v); } };\n"
                "template <class F> inline float apply(F f, float v) { return f(v); }\n",
                "x[i] = apply(Summer{}, v);", "x[i] = apply([](float u) { return u + 1.0f; }, v);"),
    "member": ("struct Acc { float s; void add(float v) thread { s += quad_sum(v); } };\n",
               "Acc acc{0.0f}; acc.add(v); x[i] = acc.s;", "x[i] = v;"),
    "barrier_helper": ("inline void sync() { threadgroup_barrier(mem_flags::mem_device); }\n", "sync();", "x[i] = v;"),
    "function_macro": ("#define RED(v) simd_sum(v)\n", "x[i] = RED(v);", "x[i] = v;"),
    "object_macro": ("#define RED simd_sum\n", "x[i] = RED(v);", "x[i] = v;"),
    "macro_to_helper": ("inline float total(float v) { return simd_sum(v); }\n#define TOTAL(v) total(v)\n",
                        "x[i] = TOTAL(v);", "x[i] = v;"),
    "pasted_name": ("#define CAT(p, q) p##q\n", "x[i] = CAT(simd_, sum)(v);", "x[i] = CAT(fl, oat)(v);"),
    "macro_before_name": ("#define ALIGNED(n) inline\nALIGNED(16) float total(float v) { return simd_sum(v); }\n",
                          "x[i] = total(v);", "x[i] = v;"),
    "prototype_first": ("inline float total(float v);\ninline float total(float v) { return simd_sum(v); }\n",
                        "x[i] = total(v);", "x[i] = v;"),
}
UNDECIDED = {  # the analysis cannot follow the source: every kernel gets fibers
    "free_operator": ("struct V { float x; };\ninline V operator+(V l, V r) { return V{simd_sum(l.x) + r.x}; }\n",
                      "x[i] = (V{v} + V{v}).x;", "x[i] = v;"),
    "file_scope_lambda": ("constant auto red = [](float v) { return simd_sum(v); };\n", "x[i] = red(v);", "x[i] = v;"),
    "macro_defines_function": ("#define DEF(name) inline float name(float v) { return simd_sum(v); }\nDEF(total)\n",
                               "x[i] = total(v);", "x[i] = v;"),
    "if_splits_braces": ("#if FOO\ninline float f(float v) {\n#else\ninline float f(float v, float w) {\n#endif\n"
                         "  return simd_sum(v); }\n", "x[i] = f(v);", "x[i] = v;"),
}


@pytest.mark.parametrize("case", sorted(FOLLOWED) + sorted(UNDECIDED))
def test_parser_follows_calls_to_fiber_functions_per_kernel(tmp_path, case):
    head, a, b = {**FOLLOWED, **UNDECIDED}[case]
    f = tmp_path / "k.metal"
    f.write_text("#include <metal_stdlib>\nusing namespace metal;\n" + head + _KERNELS.format(a=a, b=b))
    for mf in (glue.parse_metal(f), glue.parse_metal("k.metal", text=f.read_text())):
        assert {k.name: k.needs_fibers for k in mf.kernels} == {"a": True, "b": case in UNDECIDED}
        assert mf.needs_fibers
    plain = glue.parse_metal("k.metal", text=f.read_text().replace(a, "x[i] = v;"))
    assert {k.name: k.needs_fibers for k in plain.kernels} == {"a": case in UNDECIDED, "b": case in UNDECIDED}


def test_parser_follows_template_kernels_and_their_instantiations():
    text = """#include <metal_stdlib>
template <typename T> inline T tot(T v) { return simd_sum(v); }
template <typename T>
kernel void k(device T* x [[buffer(0)]], uint i [[thread_position_in_grid]]) { x[i] = tot(x[i]); }
template <typename T>
kernel void plain(device T* x [[buffer(0)]], uint i [[thread_position_in_grid]]) { x[i] = x[i]; }
template [[host_name("k_float")]] kernel decltype(k<float>) k<float>;
template [[host_name("plain_float")]] kernel decltype(plain<float>) plain<float>;
"""
    mf = glue.parse_metal("s.metal", text=text)
    assert {k.name: k.needs_fibers for k in mf.kernels} == {"k_float": True, "plain_float": False}
    assert [(k.call, k.function) for k in mf.kernels] == [("k<float>", "k"), ("plain<float>", "plain")]


def test_parser_reads_a_source_with_non_ascii_text():
    # clang counts UTF-8 bytes; the attributes after each parameter are found by string index all the same.
    text = ("// Kernels — “sums” in µs\n#include <metal_stdlib>\nusing namespace metal;\n"
            "kernel void k(device const float* x [[buffer(0)]], /* ½ */ device float* y [[buffer(1)]],\n"
            "              uint i [[thread_position_in_grid]]) { y[i] = x[i]; }  // ∑\n"
            "kernel void k2(constant uint& n [[buffer(3)]]) {}\n")
    mf = glue.parse_metal("u.metal", text=text)
    assert [(k.name, [(p.name, p.kind, p.index) for p in k.params]) for k in mf.kernels] == [
        ("k", [("x", "buffer", 0), ("y", "buffer", 1), ("i", "attribute", 0)]), ("k2", [("n", "buffer", 3)])]


def test_parser_reports_a_missing_header(tmp_path):
    f = tmp_path / "k.metal"
    f.write_text('#include "not_there.h"\nkernel void k(device float* x [[buffer(0)]]) {}\n')
    with pytest.raises(glue.GlueError, match=r"k\.metal:1: 'not_there\.h' file not found"):
        glue.parse_metal(f)


def test_parser_reads_instantiations_written_through_macros_and_in_namespaces():
    text = """#include <metal_stdlib>
using namespace metal;
namespace ns {
template <typename T, uint N, bool B>
[[kernel]] void scale(device T* x [[buffer(0)]], constant float& s [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  x[i] = B ? x[i] * T(s) : T(N);
}
}  // namespace ns
#define INSTANTIATE(name, ...) template [[host_name(name)]] [[kernel]] decltype(__VA_ARGS__) __VA_ARGS__
INSTANTIATE("scale_half", ns::scale<half, 2, true>);
template [[host_name("scale_uint")]] [[kernel]] void ns::scale<uint, 3, false>(device uint*, constant float&, uint);
"""
    mf = glue.parse_metal("m.metal", text=text)
    assert [(k.name, k.call, [p.decl for p in k.params]) for k in mf.kernels] == [
        ("scale_half", "ns::scale<half, 2, true>", ["device half*", "constant float&", "uint"]),
        ("scale_uint", "ns::scale<uint, 3, false>", ["device uint*", "constant float&", "uint"])]
    with pytest.raises(glue.GlueError, match=r"m\.metal:11: an explicit instantiation of kernel template scale needs "
                                             r"\[\[host_name"):
        glue.parse_metal("m.metal", text=text.replace('[[host_name("scale_uint")]] ', ""))


@pytest.mark.parametrize("call", ["simd_sum(v)", "metal::simd_shuffle_down(v, 1)", "quad_broadcast(v, 0)",
                                  "simd_sum<float>(v)",
                                  "simdgroup_barrier(mem_flags::mem_none)", "simd_ballot(v > 0)"])
def test_parser_sends_simd_group_functions_to_fibers(call):
    text = f"kernel void k(device float* x [[buffer(0)]]) {{ float v = x[0]; {call}; }}\n"
    assert glue.parse_metal("k.metal", text=text).needs_fibers
    assert not glue.parse_metal("k.metal", text=text.replace(call, "v + 1")).needs_fibers
    assert not glue.parse_metal("k.metal", text=text.replace(call, "simd_width + my_quad_count")).needs_fibers
