"""SIMD-group matrices (simdgroup_matrix and its functions, MSL 2.3+) in inline kernels: every check of
tests/support/simdgroup_matrix_checks.py on /CPU:0 (here) and on the emulated /GPU:0 (one subprocess for all of them),
which kernels run on fibers, a divergent call ending the process with the kernel and the threads named, the strict
Metal-language check refusing them below MSL 2.3, and the GPU proxy compiling them to PTX (tensor-core mma for half
products; assembled by ptxas when it is installed).

Needs clang++ >= 16 (skips without it; fails under TFMO_REQUIRE_MAC_CHECKS=1).
"""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support import scripts
from support import simdgroup_matrix_checks as checks
from support.native import gpu_backend_env

ROOT = Path(__file__).resolve().parent.parent
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONWARNINGS": "ignore"}


@pytest.fixture(scope="module", autouse=True)
def compiler(clang16):
    os.environ.setdefault("TF_METAL_OPS_CLANGXX", clang16)
    return clang16


@pytest.mark.parametrize("name", list(checks.CHECKS))
def test_on_cpu(name):
    checks.CHECKS[name]("/CPU:0")


def test_on_the_emulated_gpu():
    env = {**os.environ, **QUIET, **gpu_backend_env("direct")}
    r = scripts.run("simdgroup_matrix_checks", "/GPU:0", env=env, timeout=1200)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    lines = r.stdout.splitlines()
    assert lines[-1] == "ok all" and all(f"ok {n}" in lines for n in checks.CHECKS), r.stdout


def test_kernels_naming_simdgroup_matrices_run_on_fibers():
    """A kernel reaches the SIMD-group rendezvous through a matrix type or function named anywhere in its body or
    helpers; the thread attribute simdgroup_index_in_threadgroup alone does not make a kernel need fibers."""
    from tf_metal_ops.inline_kernels import build

    mf = build.parse_source(checks.SOURCE + textwrap.dedent("""
        inline float twice(float v) { return 2 * v; }
        kernel void plain(const device float* x [[buffer(0)]], device float* y [[buffer(1)]],
                          uint i [[thread_position_in_grid]], uint s [[simdgroup_index_in_threadgroup]]) {
          y[i] = twice(x[i]) + float(s);
        }
        inline simdgroup_half8x8 identity() { return simdgroup_half8x8(half(1)); }
        kernel void via_helper(device half* y [[buffer(0)]]) {
          simdgroup_store(identity(), y);
        }
    """))
    flags = {k.name: k.needs_fibers for k in mf.kernels}
    assert flags == {"gemm_f32": True, "gemm_f16": True, "gemm_f16_f32": True, "gemm_threadgroup": True,
                     "elements": True, "lanes": True, "plain": False, "via_helper": True}, flags


def test_a_divergent_matrix_call_ends_the_process_naming_kernel_and_threads():
    r = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import tensorflow as tf, tf_metal_ops as t
        k = t.metal_kernel("mat_split", ["x"], ["y"], '''
            simdgroup_float8x8 m;
            if (thread_index_in_simdgroup == 7) {
                simdgroup_load(m, x);
            } else {
                m = make_filled_simdgroup_matrix<float, 8, 8>(1.0f);
            }
            simdgroup_store(m, y);
        ''')
        (y,) = k(inputs=[tf.ones([64])], grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(64,)],
                 output_dtypes=[tf.float32])
        print(y.numpy())
        print("not reached")
    """)], capture_output=True, text=True, env={**os.environ, **QUIET}, timeout=600,
        cwd=Path(__file__).resolve().parent)  # not the repository root: its tf_metal_ops/ is the unbuilt source
    assert r.returncode == 70 and "not reached" not in r.stdout, (r.returncode, r.stderr[-3000:])
    assert re.search(r"kernel custom_kernel_mat_split: divergent SIMD-group function: in threadgroup \(0,0,0\), SIMD "
                     r"group 0, thread 0 \(index in group\) is in make_filled_simdgroup_matrix at "
                     r"mat_split:source:6:\d+ while thread 7 is in simdgroup_load at mat_split:source:4:\d+",
                     r.stderr), r.stderr[-3000:]


def test_the_strict_check_refuses_them_below_msl_2_3(clang16):
    """Every line of the checks' source that names a matrix type or function is a finding at MSL 2.2, with the
    rule's message; at MSL 2.4 and 3.0 the source is clean. metal_kernel's own compile reports the same way."""
    from tf_metal_ops import msl_check

    src = checks.SOURCE
    findings = msl_check.check_source(src, filename="mm.metal", msl_version="2.2", compiler=clang16)
    lines = src.split("\n")
    naming = {i + 1 for i, ln in enumerate(lines)
              if re.search(r"simdgroup_(matrix|float8x8|load|store|multiply)|make_filled|thread_elements", ln.split("//")[0])
              and not ln.lstrip().startswith("#")}
    assert findings and {f.rule for f in findings} == {"simdgroup-matrix"}, "\n".join(map(str, findings))
    assert {f.line for f in findings} == naming, (sorted(naming), "\n".join(map(str, findings)))
    assert all(f.file == "mm.metal" and "need MSL 2.3 or later" in f.message for f in findings)
    for version in ("2.4", "3.0"):
        assert msl_check.check_source(src, filename="mm.metal", msl_version=version, compiler=clang16) == []

    from tf_metal_ops.inline_kernels import build

    with pytest.raises(build.KernelCompileError, match=r"MSL 2\.2\):\n<source>:\d+:\d+: error: simdgroup_matrix and "
                                                       r"the SIMD-group matrix functions .* \[simdgroup-matrix\]"):
        build.compile(src, checked=False, msl_version="2.2")


def test_the_gpu_proxy_compiles_them_to_ptx(tmp_path):
    """dev/gpu_proxy/build.py compiles the checks' kernels (float, half, half into float, threadgroup memory) to PTX:
    the half products are tensor-core mma.sync instructions, the float ones FMAs; ptxas (when installed) assembles
    the module for sm_90. Compile-only: nothing runs on a GPU here."""
    sys.path.insert(0, str(ROOT / "dev"))
    from gpu_proxy import build as gpu_proxy

    metal = tmp_path / "simdgroup_matrix.metal"
    metal.write_text(checks.SOURCE)
    manifest = gpu_proxy.build(tmp_path / "out", [metal], msl_versions=("3.0",), baselines=False, log=lambda *_: None)
    assert set(manifest["kernels"]) == {"gemm_f32", "gemm_f16", "gemm_f16_f32", "gemm_threadgroup", "elements", "lanes"}
    ptx = (tmp_path / "out" / "simdgroup_matrix.ptx").read_text()
    # Function bodies by (mangled) name: the kernels' metal functions are .func (gemm_tiles<half, half> and
    # <half, float> may be ones of their own), the entry points call them.
    heads = [(m.group(1), m.start()) for m in re.finditer(r"\.(?:entry|func)\s+(?:\([^)]*\)\s*)?(\w+)", ptx)]
    bodies = {}
    for i, (name, start) in enumerate(heads):
        body = ptx[start:heads[i + 1][1] if i + 1 < len(heads) else len(ptx)]
        if "{" in body:
            bodies[name] = bodies.get(name, "") + body
    mma = "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32"
    def code(*prefixes):  # a kernel's function and the gemm_tiles instance it calls (inlined or not)
        return "".join(b for n, b in bodies.items() if n.startswith(prefixes))

    half_half = code("_Z8gemm_f16P", "_Z10gemm_tilesIDhDh")
    half_float = code("_Z12gemm_f16_f32P", "_Z10gemm_tilesIDhf")
    single = code("_Z8gemm_f32P", "_Z10gemm_tilesIff")
    assert mma in half_half and mma in half_float
    assert mma not in single and single.count("fma.rn.f32") >= 16  # 8 products per element, 2 elements per lane
    assert mma not in next(b for n, b in bodies.items() if n.startswith("_Z8elementsP"))  # float only
    ptxas = gpu_proxy.find_ptxas()
    if ptxas is None:
        return  # the PTX checks above still ran; CI without ptxas assembles nothing
    r = subprocess.run([ptxas, "-arch=sm_90", str(tmp_path / "out" / "simdgroup_matrix.ptx"), "-o",
                        str(tmp_path / "out.cubin")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_the_gpu_check_script_builds_the_checks_own_kernels(tmp_path):
    """dev/gpu_proxy/check_simdgroup_matrix.py (run on an NVIDIA GPU with CuPy, not here) compiles the very source of
    these checks and its launches match the PTX entries' parameters."""
    sys.path.insert(0, str(ROOT / "dev" / "gpu_proxy"))
    import check_simdgroup_matrix as gpu_check

    assert gpu_check.kernels.SOURCE == checks.SOURCE
    assert gpu_check.main(["build", "--out", str(tmp_path)]) == 0
    ptx = (tmp_path / "simdgroup_matrix.ptx").read_text()
    # buffers in [[buffer(n)]] order, then the grid's three thread counts (the launcher passes exactly these)
    for kernel, buffers in (("gemm_f32", 5), ("gemm_f16", 5), ("gemm_f16_f32", 5), ("gemm_threadgroup", 3),
                            ("elements", 2), ("lanes", 1)):
        params = re.search(r"\.entry %s\((.*?)\)" % kernel, ptx, re.S).group(1)
        assert re.findall(r"\.param \.(u64|u32)", params) == ["u64"] * buffers + ["u32"] * 3, kernel
