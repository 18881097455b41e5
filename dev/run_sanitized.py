"""Builds the op library with AddressSanitizer + UndefinedBehaviorSanitizer and runs the op tests against it.

    python dev/run_sanitized.py [pytest args...]

The CPU kernels run inside the real TensorFlow process: libasan is preloaded (it must come first), leak detection
is off (TensorFlow's own one-time allocations would drown the report) and any UB aborts (-fno-sanitize-recover).
Debug information is line tables only (-g1): the reports' stacks still name functions, files and lines, and the hash
grid's template instances compile in little more than half the time of full -g.
The emulated Metal kernels and the thread pool have their own sanitizer builds (tests/support/msl_emu_build.py,
tests/test_thread_pool_native.py). Exits with pytest's status.
"""

import concurrent.futures
import glob
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = ["tests/test_zero_out.py", "tests/test_render_ops.py", "tests/test_hash_grid_op.py",
         "tests/test_render_packed.py", "tests/test_ray_march.py", "tests/test_ray_march_cascades.py",
         "tests/test_occupancy_grid.py",
         "tests/test_concurrency_and_memory.py", "tests/test_fuzz.py"]


def main(extra):
    import tensorflow as tf

    cxx = os.environ.get("CXX", "g++")
    out_dir = tempfile.mkdtemp(prefix="tfmo-asan-")
    lib = os.path.join(out_dir, "libtf_metal_ops.so")
    sources = sorted(glob.glob(os.path.join(ROOT, "csrc", "**", "*.cc"), recursive=True))
    # The Linux library's sources, as setup.py picks them: GPU host code and backends are not part of it.
    gpu_dirs = ("gpu", "metal", "emulated_gpu")
    sources = [s for s in sources if os.path.relpath(s, os.path.join(ROOT, "csrc")).split(os.sep)[0] not in gpu_dirs]
    version = {}
    exec(open(os.path.join(ROOT, "tf_metal_ops", "_version.py")).read(), version)
    flags = [f'-DTFMO_VERSION="{version["__version__"]}"', "-std=c++17", "-O1", "-g1", "-fno-omit-frame-pointer",
             "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fPIC", "-I", os.path.join(ROOT, "csrc"),
             "-I", os.path.join(ROOT, "csrc", "shared"), "-I", tf.sysconfig.get_include()]
    objects = [os.path.join(out_dir, f"{i}.o") for i in range(len(sources))]
    print("building", lib, flush=True)
    jobs = sorted(zip(sources, objects), key=lambda so: -os.path.getsize(so[0]))  # the big ones first
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # one compiler per core
        list(pool.map(lambda so: subprocess.run([cxx, *flags, "-c", so[0], "-o", so[1]], check=True), jobs))
    subprocess.run([cxx, "-fsanitize=address,undefined", "-shared", *objects, "-L", tf.sysconfig.get_lib(),
                    "-l:libtensorflow_framework.so.2", "-o", lib], check=True)

    def runtime(name):
        return subprocess.run([cxx, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()

    env = dict(os.environ,
               # libstdc++ right after libasan, so ASan's __cxa_throw interceptor finds the real one.
               LD_PRELOAD=f"{runtime('libasan.so')}:{runtime('libstdc++.so.6')}",
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
               TF_METAL_OPS_LIBRARY=lib,
               TFMO_FUZZ_EXAMPLES=os.environ.get("TFMO_FUZZ_EXAMPLES", "200"))
    # Memory growth is meaningless under ASan (quarantine), and the 2^31-sample march takes minutes there; the fuzz
    # tests' negative controls check the fuzz harness, not the kernels, and ran in the main suite; everything else
    # runs. Test paths given as arguments may be relative to the caller's directory.
    extra = [os.path.abspath(a) if os.path.exists(a) else a for a in extra]
    # One pytest-xdist worker per core, as the main suite runs (each worker loads the sanitized library).
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "auto", "-k",
            "not memory_growth and not more_than_int32_samples and not rejected_valid_call",
            *[os.path.join(ROOT, t) for t in TESTS if os.path.exists(os.path.join(ROOT, t))], *extra]
    return subprocess.run(args, env=env, cwd=out_dir).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
