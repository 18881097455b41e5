"""Builds the op library ``tf_metal_ops/libtf_metal_ops.so`` from csrc/ against TensorFlow's C API.

Linux: CPU kernels, linked to libtensorflow_framework.so.2.
macOS: CPU kernels + Metal host code (csrc/metal/*.mm) and the Metal kernels (metal_kernels/*.metal), either
precompiled to tf_metal_ops.metallib (when `xcrun metal` exists) or embedded as source for compilation at
first use; linked strictly (no -undefined dynamic_lookup, an install name, the one rpath @loader_path/../tensorflow).
Source files are discovered, so adding an op needs no change here. build_spec() is the one list of sources and flags:
dev/build_mac_wheel.py cross-builds the macOS arm64 wheel on Linux from it. Wheels are tagged py3-none-<platform>.
"""

import glob
import importlib.metadata
import importlib.util
import os
import platform
import sys

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
IS_MAC = sys.platform == "darwin"
LIB_NAME = "libtf_metal_ops.so"


def _rel(*parts):
    return os.path.join(*parts)  # setuptools wants paths relative to setup.py


def tensorflow_dirs():
    """(include dir, lib dir, version) of the TensorFlow in the build environment, without importing it."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("tf-metal-ops: building needs TensorFlow >= 2.16 in the build environment (see pyproject.toml)")
    tf_dir = list(spec.submodule_search_locations)[0]
    version = "unknown"
    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-macos"):
        try:
            version = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            pass
    return os.path.join(tf_dir, "include"), tf_dir, version


def metal_tools():
    """tf_metal_ops/metal_sources.py, loaded by path: the package's __init__ imports TensorFlow."""
    spec = importlib.util.spec_from_file_location("metal_sources", os.path.join(ROOT, "tf_metal_ops", "metal_sources.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def strict_mac_linker(cmd):
    """Python's LDSHARED on macOS links a loadable bundle with ``-undefined dynamic_lookup``; the op library is a
    dylib (it has an install name) whose every symbol resolves at link time, as in the cross-built wheel."""
    out, skip = [], False
    for arg in cmd:
        if skip:
            skip = False
        elif arg == "-undefined":
            skip = True  # and its value (dynamic_lookup)
        elif arg in ("-Wl,-undefined,dynamic_lookup", "-bundle"):
            pass
        else:
            out.append(arg)
    return out + ["-dynamiclib"]


def _parallel_compile(compiler, jobs):
    """compiler.compile over `jobs` compiler processes: setuptools compiles one extension's sources one after the
    other (its `parallel` option spreads whole extensions, and this library is one). The largest sources start first,
    so the longest compile is not the last to begin; the objects come back in the sources' order, as compile's do."""
    import concurrent.futures

    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=False, extra_preargs=None,
                extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj):
            src, ext = build[obj]
            compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        order = sorted(objects, key=lambda obj: -os.path.getsize(build[obj][0]) if obj in build else 0)
        with concurrent.futures.ThreadPoolExecutor(max(1, int(jobs or 1))) as pool:
            list(pool.map(one, [obj for obj in order if obj in build]))
        return objects

    return compile


class BuildOpLibrary(build_ext):
    """Builds a plain shared library (not a Python extension module) with per-language flags."""

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def get_ext_filename(self, fullname):
        return os.path.join(*fullname.split(".")[:-1], LIB_NAME)

    def build_extensions(self):
        self.compiler.src_extensions.append(".mm")
        original_compile = self.compiler._compile

        def compile_one(obj, src, ext, cc_args, extra_postargs, pp_opts):
            extra = list(extra_postargs)
            if src.endswith(".mm"):
                extra += OBJCXX_ARGS
            return original_compile(obj, src, ext, cc_args, extra, pp_opts)

        self.compiler._compile = compile_one
        self.compiler.compile = _parallel_compile(self.compiler, self.parallel)
        # Python's own CFLAGS may carry C-only flags; the library is C++.
        for attr in ("compiler_so", "compiler"):
            cmd = getattr(self.compiler, attr, None)
            if cmd:
                setattr(self.compiler, attr, [a for a in cmd if a not in ("-Wstrict-prototypes",)])
        if IS_MAC:
            for attr in ("linker_so", "linker_so_cxx"):
                cmd = getattr(self.compiler, attr, None)
                if cmd:
                    setattr(self.compiler, attr, strict_mac_linker(cmd))
        super().build_extensions()
        if IS_MAC:
            self._build_metallib()

    def _build_metallib(self):
        tools = metal_tools()
        out_dir = os.path.dirname(self.get_ext_fullpath(self.extensions[0].name))
        metallib = os.path.join(out_dir, "tf_metal_ops.metallib")
        ok = tools.build_metallib(sorted(glob.glob(_rel("metal_kernels", "*.metal"))), METAL_INCLUDE_DIRS, metallib)
        if not ok and os.path.exists(metallib):
            os.remove(metallib)  # a stale one would shadow the embedded sources

    def copy_extensions_to_source(self):
        """In-place builds (`pip install -e .`, `setup.py build_ext --inplace`): setuptools builds in build_lib and
        copies only the library back; the metallibs must sit next to it too (the Metal backend looks there), and a
        stale in-place metallib from an earlier build must go (it would shadow the embedded sources)."""
        super().copy_extensions_to_source()
        if not IS_MAC:
            return
        built_dir = os.path.dirname(os.path.join(self.build_lib, self.get_ext_filename(self.extensions[0].name)))
        package_dir = self.get_finalized_command("build_py").get_package_dir("tf_metal_ops")
        for name in METALLIB_NAMES:
            built, inplace = os.path.join(built_dir, name), os.path.join(package_dir, name)
            if os.path.exists(built):
                self.copy_file(built, inplace, level=self.verbose)
            elif os.path.exists(inplace):
                os.remove(inplace)


METALLIB_NAMES = ("tf_metal_ops.metallib", "tf_metal_ops.metal3.metallib")  # tf_metal_ops/metal_sources.py builds both


METAL_INCLUDE_DIRS = [_rel("metal_kernels"), _rel("csrc", "shared")]

# What the emulated GPU (tf_metal_ops/emulated_gpu, opt-in), inline kernels (csrc/msl_emu) and the op kit compile at
# run time, and the stub <metal_stdlib> of the strict Metal-language check (tf_metal_ops/msl_check, csrc/msl_check),
# shipped as package data under tf_metal_ops/_sources/ so that they work from an installed wheel. Our own sources
# only: no SDK, nothing vendored, nothing of dev/ (the development tools and the Apple doubles never ship).
EMULATED_GPU_SOURCES = ["csrc/**/*.h", "csrc/**/*.cc", "csrc/**/*.mm", "metal_kernels/*.metal", "metal_kernels/*.h", "csrc/msl_emu/**/*",
                        "csrc/msl_check/include/*"]
# The op kit's public headers (tf_metal_ops.extension.get_include()), laid out as under csrc/.
# Of csrc/emulated_gpu/ only the stream protocol and the kernel launcher: the device's own headers are internal.
PUBLIC_HEADERS = ["csrc/common/*.h", "csrc/gpu/*.h", "csrc/shared/*.h", "csrc/emulated_gpu/emu_stream.h",
                  "csrc/emulated_gpu/kernel_*.h"]


class BuildPy(build_py):
    """build_py that also copies the emulated GPU's sources (tf_metal_ops/_sources/) and the op kit's headers
    (tf_metal_ops/include/) into the package."""

    def run(self):
        super().run()
        pkg = os.path.join(self.build_lib, "tf_metal_ops")
        self._copy(EMULATED_GPU_SOURCES, ROOT, os.path.join(pkg, "_sources"))
        self._copy(PUBLIC_HEADERS, os.path.join(ROOT, "csrc"), os.path.join(pkg, "include"))

    def _copy(self, patterns, base, target):
        for pattern in patterns:
            for src in glob.glob(os.path.join(ROOT, pattern), recursive=True):
                if os.path.isfile(src) and "__pycache__" not in src:
                    dst = os.path.join(target, os.path.relpath(src, base))
                    self.mkpath(os.path.dirname(dst))
                    self.copy_file(src, dst, preserve_mode=False)


# The op library's sources, compiler flags and link arguments per target, shared by this file (native builds) and
# dev/build_mac_wheel.py (the macOS arm64 wheel cross-built on Linux): one list of files, one set of flags.
OBJCXX_ARGS = ["-fobjc-arc", "-fblocks"]  # added for .mm files (clang treats .mm as Objective-C++ by its extension)
MACOS_MIN = "12.0"


def build_spec(target, tf_include, tf_lib, tf_version, generated_dir):
    """What the op library of ``target`` ("linux" or "macos") is built from, as a dict: sources, include_dirs,
    define_macros, compile_args, objcxx_args, link_args, libraries, library_dirs. Paths are relative to the repository
    root; ``generated_dir`` receives the embedded Metal sources (macOS)."""
    version = {}
    exec(open(os.path.join(ROOT, "tf_metal_ops", "_version.py")).read(), version)
    # csrc/gpu/ (GPU host code) goes with a GPU backend: csrc/metal/ on macOS; csrc/emulated_gpu/ is the opt-in
    # emulated GPU (tf_metal_ops/emulated_gpu), compiled at first use, never here.
    gpu_dirs = ("gpu", "metal", "emulated_gpu")
    sources = [os.path.relpath(s, ROOT) for s in sorted(glob.glob(os.path.join(ROOT, "csrc", "**", "*.cc"),
                                                                   recursive=True))
               if os.path.relpath(s, ROOT).split(os.sep)[1] not in gpu_dirs]
    # -ffp-contract=off: the compiler never fuses a*b + c by itself (kernels compiled for several ISAs, e.g. the hash
    # grid's baseline and AVX2+FMA variants, must give the same bits; fused multiply-adds are explicit: tfmo_fma).
    # -g0: no debug information, although Python's own CFLAGS (which come first) carry -g. Full -g makes the hash
    # grid's template instances compile about a fifth slower and the Linux library about six times larger, and
    # changes no instruction; the symbol table stays, so profilers still name the functions.
    compile_args = ["-std=c++17", "-O3", "-g0", "-ffp-contract=off", "-fvisibility=hidden", "-fPIC", "-Wall", "-Wextra",
                    "-Wno-unused-parameter"]
    define_macros = [
        ("NDEBUG", None),
        ("TFMO_VERSION", '"%s"' % version["__version__"]),
        ("TFMO_BUILT_WITH_TF", '"%s"' % tf_version),
    ]
    if target == "macos":
        generated = os.path.join(generated_dir, "metal_embedded_sources.cc")
        os.makedirs(os.path.dirname(os.path.join(ROOT, generated)), exist_ok=True)
        metal_files = sorted(glob.glob(os.path.join(ROOT, "metal_kernels", "*.metal")))
        metal_tools().write_embedded_source(os.path.join(ROOT, generated), metal_files,
                                            [os.path.join(ROOT, d) for d in METAL_INCLUDE_DIRS])
        for pattern in (("csrc", "gpu", "*.cc"), ("csrc", "metal", "*.mm")):
            sources += [os.path.relpath(s, ROOT) for s in sorted(glob.glob(os.path.join(ROOT, *pattern)))]
        sources += [generated]
        define_macros.append(("TFMO_WITH_METAL", "1"))
        compile_args += ["-mmacosx-version-min=" + MACOS_MIN]
        # As TF's custom-op guide: link TF's framework library (install name @rpath/libtensorflow_framework.2.dylib)
        # with an rpath to TF's directory next to the installed tensorflow package (the usual site-packages layout,
        # like $ORIGIN on Linux). Every symbol resolves at link time: the whole C API is defined in the framework
        # library (TF >= 2.16), and @available's helper is our own (csrc/metal/platform_version.mm), so no
        # -undefined dynamic_lookup. TF loads op libraries with RTLD_NOW: a hole would fail tf.load_op_library.
        link_args = [
            "-ltensorflow_framework.2", "-Wl,-rpath,@loader_path/../tensorflow",
            "-mmacosx-version-min=" + MACOS_MIN, "-framework", "Metal", "-framework", "Foundation",
            "-install_name", "@rpath/" + LIB_NAME,
        ]
        libraries = []
    else:
        link_args = ["-l:libtensorflow_framework.so.2", "-Wl,-rpath,$ORIGIN/../tensorflow"]
        libraries = ["pthread", "dl"]  # dl: inline kernels (csrc/common/inline_library.cc) on glibc < 2.34
    return {
        "sources": sources,
        "include_dirs": [tf_include, _rel("csrc"), _rel("csrc", "shared")],
        "define_macros": define_macros,
        "compile_args": compile_args,
        "objcxx_args": OBJCXX_ARGS,
        "link_args": link_args,
        "libraries": libraries,
        "library_dirs": [tf_lib],
    }


def extension():
    tf_include, tf_lib, tf_version = tensorflow_dirs()
    spec = build_spec("macos" if IS_MAC else "linux", tf_include, tf_lib, tf_version, os.path.join("build", "generated"))
    link_args = spec["link_args"]
    if IS_MAC:
        link_args = link_args + ["-Wl,-rpath," + tf_lib]  # the build environment's TF: editable installs, local builds
    return Extension(
        "tf_metal_ops.libtf_metal_ops",
        sources=spec["sources"],
        include_dirs=spec["include_dirs"],
        define_macros=spec["define_macros"],
        extra_compile_args=spec["compile_args"],
        extra_link_args=link_args,
        libraries=spec["libraries"],
        library_dirs=spec["library_dirs"],
        language="c++",
    )


class BdistWheel(bdist_wheel):
    """The library links no libpython and uses no Python API: one wheel per platform serves every CPython
    (py3-none-<platform>). The platform is the build machine's (linux_x86_64: auditwheel decides manylinux, see
    dev/tag_linux_wheel.py), macosx_12_0_<arch> on a Mac (the library's deployment target), or --plat-name."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        if IS_MAC and not self.plat_name_supplied:
            plat = "macosx_%s_%s" % (MACOS_MIN.replace(".", "_"), platform.machine())
        return "py3", "none", plat


CMDCLASS = {"build_ext": BuildOpLibrary, "build_py": BuildPy, "bdist_wheel": BdistWheel}

if __name__ == "__main__":
    setup(ext_modules=[extension()], cmdclass=CMDCLASS)
