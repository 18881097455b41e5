"""The GPU proxy's build (dev/gpu_proxy/build.py): every metal_kernels/*.metal compiles to PTX at MSL 3.0 and 2.4 with one
`.entry` per kernel that msl_emu's signature parse finds, each with the parameters of its launch contract; the MSL
version selects native float atomics or the compare-and-swap loop; the MSL emulation's own fixtures (threadgroup
storage and arguments, threadgroup atomics, function constants, ushort attributes, SIMD-group functions) compile
too; and a construct the
CUDA target layer of <metal_stdlib> lacks fails with a message that names it. Needs clang++-16 (CI has it); no GPU, no ptxas.

The build of the module runs once (the `built` fixture)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = [ROOT / "tests" / "msl_emu" / "emu_selftest.metal", ROOT / "tests" / "msl_emu" / "launch" / "launch_fixture.metal"]

sys.path.insert(0, str(ROOT / "dev"))
from gpu_proxy import build as gpu_proxy  # noqa: E402
from gpu_proxy import run as bench  # noqa: E402

msl_emu = gpu_proxy.load_msl_emu()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_proxy")
    manifest = gpu_proxy.build(out, log=lambda *_: None)
    fixtures = tmp_path_factory.mktemp("gpu_proxy_fixtures")
    fixture_manifest = gpu_proxy.build(fixtures, FIXTURES, msl_versions=("3.0",), baselines=False, log=lambda *_: None)
    return out, manifest, fixtures, fixture_manifest


def test_every_kernel_has_its_entry_point_at_both_msl_versions(built):
    out, manifest, _, _ = built
    files = gpu_proxy.default_files()
    assert {f.stem for f in files} == set(manifest["files"]) and len(files) >= 5
    for f in files:
        kernels = msl_emu.parse_metal(f, search=[ROOT / "csrc" / "shared"]).kernels
        assert kernels, f
        for version in ("3.0", "2.4"):
            ptx = gpu_proxy.ptx_path(out, f.stem, version).read_text()
            entries, sizes = gpu_proxy.ptx_entries(ptx), gpu_proxy.ptx_sizeof(ptx)
            assert set(entries) == {k.name for k in kernels}, (f.name, version)
            for k in kernels:
                params = gpu_proxy.entry_params(k)
                assert entries[k.name] == [p["ptx"] for p in params], (k.name, version)
                n_buffers = sum(p.kind == "buffer" for p in k.params)
                assert params[-3:] == [{"name": f"grid_{a}", "role": "grid", "ptx": ".u32"} for a in "xyz"]
                assert [p["index"] for p in params[:n_buffers]] == sorted(p.index for p in k.params if p.kind == "buffer")
                assert len(sizes[k.name]) == len(params) and all(s > 0 for s in sizes[k.name][:n_buffers])
                assert manifest["kernels"][k.name]["params"] == params


def test_msl_version_selects_the_atomics(built):
    out, _, _, _ = built
    native = gpu_proxy.ptx_path(out, "hash_grid", "3.0").read_text()
    cas = gpu_proxy.ptx_path(out, "hash_grid", "2.4").read_text()
    assert "atom.global.add.f32" in native and "atom.global.cas.b32" not in native
    assert "atom.global.cas.b32" in cas and "add.f32 \t[" not in cas and "atom.global.add.f32" not in cas


def test_baselines_and_struct_sizes(built):
    out, manifest, _, _ = built
    entries = gpu_proxy.ptx_entries((out / manifest["baselines"]).read_text())
    for t in ("f32", "f16"):
        assert entries[f"hg_gather_{t}_F2_D3"] == [".u64"] * 3 + [".u32"] * 2 + [".u64"]
        assert entries[f"hg_scatter_{t}_F2_D3"] == [".u64"] * 3 + [".u32"] * 2 + [".u64"]
    # The compiler's sizeof of the shared structs: a launcher packs them with these sizes.
    sizes = gpu_proxy.ptx_sizeof(gpu_proxy.ptx_path(out, "hash_grid", "3.0").read_text())
    assert sizes["hash_grid_encode_float32"][:5] == [4, 4, 40, 48, 4]  # float, float, HgLevel, HgArgs, float
    assert sizes["hash_grid_encode_float16"][:5] == [4, 2, 40, 48, 2]


def test_barriers_threadgroup_memory_and_function_constants(built):
    out, manifest, fixtures, fixture_manifest = built
    scan = manifest["kernels"]["ray_march_scan_block"]
    assert scan["uses_barriers"] and [p["role"] for p in scan["params"]].count("threadgroup_bytes") == 1
    # ray_march's scan and the fused MLP's forward and backward (threadgroup barriers between layers).
    assert sorted(k for k, v in manifest["kernels"].items() if v["uses_barriers"]) == sorted(
        ["ray_march_scan_block"] + [f"fused_mlp_{p}_w{w}_{t}" for p in ("forward", "backward") for w in (16, 32, 64, 128)
                                    for t in ("float32", "float16")])
    mlp = manifest["kernels"]["fused_mlp_backward_w64_float16"]
    assert [p["role"] for p in mlp["params"]].count("threadgroup_bytes") == 3  # g, prev, weights
    assert manifest["files"]["fused_mlp"]["function_constants"] == ["fm_activation", "fm_output_activation"]
    ray_march = gpu_proxy.ptx_path(out, "ray_march", "3.0").read_text()
    assert "bar.sync" in ray_march and ".extern .shared .align 16 .b8 gpu_proxy_threadgroup_memory[]" in ray_march
    # A barrier in a helper (emu_selftest's tree_reduce) marks every kernel of the file; launch_fixture's only in
    # the kernel that calls it.
    assert all(k["uses_barriers"] for k in fixture_manifest["kernels"].values() if k["file"] == "emu_selftest")
    assert {k for k, v in fixture_manifest["kernels"].items() if v["file"] == "launch_fixture" and v["uses_barriers"]} == {"group_sum"}
    selftest = (fixtures / "emu_selftest.ptx").read_text()
    assert ".shared .align 4 .b8 _ZZ9block_sum" in selftest  # kernel-scope `threadgroup float tile[256]`
    assert "atom.shared.add.u32" in selftest or "atom.add.u32" in selftest  # threadgroup atomic_uint
    # emu_selftest's simd_reduce: SIMD-group functions as warp shuffles over the active lanes
    assert "shfl.sync.idx.b32" in selftest and "activemask.b32" in selftest and "bar.warp.sync" in selftest
    launch = (fixtures / "launch_fixture.ptx").read_text()
    constants = fixture_manifest["files"]["launch_fixture"]["function_constants"]
    assert constants == ["kNegate", "kOffset", "kMul", "kBias"]
    for c in constants:
        assert f".visible .const .align" in launch and f" {c};" in launch and f"[{c}]" in launch, c


def test_bench_dry_run_matches_the_entry_signatures(built, capsys):
    """dev/gpu_proxy/run.py's launches (small sizes) against this build: arguments, dtypes, struct sizes, shared memory."""
    out, _, _, _ = built
    assert bench.main(["--ptx", str(out), "--dry-run", "--small"]) == 0
    assert "all match" in capsys.readouterr().out
    cases = bench.cases_mod.all_cases(small=True)
    case = next(c for c in cases if c.name.startswith("hash_grid_encode_d3f2_float16") and c.name.endswith("(host)"))
    wrong = bench.cases_mod.Launch(case.launches[0].module, case.launches[0].kernel,
                                   [("buf", "x"), ("buf", "params")] + case.launches[0].args[2:], (8, 1, 1), (8, 1, 1))
    assert bench.check_launch(bench.Signatures(out), case, wrong) == [
        f"{case.name}: hash_grid:hash_grid_encode_d3f2_float16: params is device const half* but 'params' is float32",
        f"{case.name}: hash_grid:hash_grid_encode_d3f2_float16: params: element of 4 bytes, the compiler's is 2"]


def test_unsupported_construct_fails_with_a_clear_message(tmp_path):
    planted = tmp_path / "planted.metal"
    planted.write_text("#include <metal_stdlib>\nusing namespace metal;\n\n"
                       "kernel void angle(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {\n"
                       "  x[i] = atan(x[i]);\n}\n")
    with pytest.raises(gpu_proxy.BuildError) as e:
        gpu_proxy.build(tmp_path / "out", [planted], msl_versions=("3.0",), baselines=False, log=lambda *_: None)
    first = str(e.value).splitlines()[0]
    assert "planted.metal" in first and "does not compile as CUDA" in first
    assert "metal::atan has no CUDA counterpart" in str(e.value) and f"{planted}:5:" in str(e.value)

    unparsable = tmp_path / "unparsable.metal"
    unparsable.write_text("#include <metal_stdlib>\nkernel void k(device float* x [[buffer(0)]], float y) {}\n")
    with pytest.raises(gpu_proxy.BuildError, match=r"unparsable.metal:2: kernel k: cannot classify parameter `float y`"):
        gpu_proxy.build(tmp_path / "out2", [unparsable], msl_versions=("3.0",), baselines=False, log=lambda *_: None)


def test_half_vector_conversions_convert_the_values(tmp_path):
    """float2(half2) and half2(float2) convert values, element by element, as scalar half conversions do (clang 16's
    __builtin_convertvector on vectors of __fp16, the proxy's half, converts the raw 16-bit patterns as integers)."""
    src = tmp_path / "half_vectors.metal"
    src.write_text("#include <metal_stdlib>\nusing namespace metal;\n\n"
                   "kernel void widen(device const half2* h [[buffer(0)]], device float2* f [[buffer(1)]],\n"
                   "                  uint i [[thread_position_in_grid]]) {\n  f[i] = float2(h[i]);\n}\n"
                   "kernel void narrow(device const float2* f [[buffer(0)]], device half2* h [[buffer(1)]],\n"
                   "                   uint i [[thread_position_in_grid]]) {\n  h[i] = half2(f[i]);\n}\n")
    gpu_proxy.build(tmp_path / "out", [src], msl_versions=("3.0",), baselines=False, log=lambda *_: None)
    ptx = (tmp_path / "out" / "half_vectors.ptx").read_text()
    widen = ptx[ptx.index(".entry widen"):ptx.index(".entry narrow")]
    narrow = ptx[ptx.index(".entry narrow"):]
    assert widen.count("cvt.f32.f16") == 2 and "cvt.rn.f32.u16" not in widen, widen
    assert narrow.count("cvt.rn.f16.f32") == 2 and "cvt.rn.u16.f32" not in narrow, narrow
