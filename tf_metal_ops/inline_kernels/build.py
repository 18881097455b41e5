"""Compiles an inline kernel's MSL source for the CPU and the emulated GPU: the unchanged source as C++ through
csrc/msl_emu, one shared library per (source, bounds checks), cached on disk by content (tf_metal_ops._builder).

The op library calls compile() back through ``tfmo_set_inline_compiler`` (csrc/common/inline_library.h) when a
TfmoMetalKernel runs a source it has not loaded yet, so a graph or SavedModel holding the kernel needs only
``import tf_metal_ops`` in a new process.

One generated unit per source (build/unit.cc), compiled with clang++ >= 16 and linked with kernel_launch.cc:
  - the kernel table glue of the source (tf_metal_ops/msl_emu.py): the emulated GPU checks each dispatch
    against the kernel's signature with it (csrc/emulated_gpu/kernel_launch.h);
  - per kernel, a launcher (csrc/msl_emu/include/msl_emu/inline_launch.h) that binds the buffer slots once and runs
    the threads of each threadgroup in a loop the kernel is inlined into (``#pragma clang attribute`` marks every
    function of the source always_inline), so that the compiler vectorises elementwise bodies; built for this CPU
    (-march=native, the CPU's flags are part of the cache key), without FMA contraction or errno-setting math, with
    glibc's vector math library (-fveclib=libmvec);
  - with bounds checks ("checked"), the launcher runs a copy of the source whose pointer buffer parameters are
    msl_emu::inline_launch::checked<T> (same text otherwise);
  - a caller that passes MTLCompileOptions (a Metal host over test doubles) may ask for fast math (clang's
    -ffast-math: finite-math-only, reassociation, no signed zeros; Apple's default) and an MSL version other than
    3.0 (__METAL_VERSION__ and the strict check follow it); the op library asks for neither.
Before a source is compiled it must pass the strict Metal-language check (tf_metal_ops.msl_check, MSL 3.0): what
Apple's compiler would reject (a pointer without an address space, double, recursion, inline assembly, a call to a
function outside the source, code that runs when the library loads, ...) fails here too, not only on a Mac, and is
never compiled as C++. The check's own files are part of the cache key, so a cached library passed today's check.
A source the op library asks for must also be allowed by the user (trust.py: a source from a graph this process did
not create needs consent); the refusal is TFMO_INLINE_REFUSED, which the op library does not remember.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import platform
import re
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from tf_metal_ops import _builder, _env, _library
from tf_metal_ops.inline_kernels import trust

if TYPE_CHECKING:
    from tf_metal_ops import msl_emu

# The MSL-on-CPU generator (msl_emu), the strict check (msl_check) and the emulated GPU load on first use, not with
# the package: `import tf_metal_ops` only registers the compiler callback.


def _msl_emu():
    from tf_metal_ops import msl_emu

    return msl_emu


def _emulated_gpu():
    """The emulated GPU module when this process imported it (enabling it imports it), else None. While another
    thread is importing it (its first kernel build asks it for the compiler), this waits for that import to finish:
    a partially initialised module has none of its functions yet."""
    module = sys.modules.get("tf_metal_ops.emulated_gpu")
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False):
        module = importlib.import_module("tf_metal_ops.emulated_gpu")  # takes the module's import lock
    return module


class KernelCompileError(ValueError):
    """An inline kernel's source does not compile; the message quotes the compiler with the user's line numbers."""


LIBRARY = "kernel.so"
_CHECKED = "::msl_emu::inline_launch::checked"
stats = {"compiled": 0, "requested": 0}  # kernel libraries built / asked for by this process (diagnostics, tests)


def find_compiler() -> str:
    from tf_metal_ops import emulated_gpu

    try:
        return emulated_gpu.find_compiler()
    except emulated_gpu.EmulatedGPUError as e:
        raise KernelCompileError(
            "tf_metal_ops.metal_kernel: running Metal kernels on the CPU (and the emulated GPU) compiles them with "
            "clang++ >= 16, and none was found: install it (Debian/Ubuntu: `apt-get install clang-16`) or point "
            f"TF_METAL_OPS_CLANGXX at one ({e})") from None


def _cpu_flags() -> str:
    """The CPU's feature flags (builds use -march=native: a cache shared between machines must not mix them)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return line
    except OSError:
        pass
    return platform.machine() + platform.processor()


# glibc's vector math library where clang 16 knows it (x86-64 Linux): (compile flags, link flags).
_VECLIB = (["-fveclib=libmvec"], ["-lmvec"]) if sys.platform == "linux" and platform.machine() == "x86_64" else ([], [])


@functools.lru_cache(maxsize=None)
def _toolchain() -> tuple[str, Path, list[str], str]:
    """(compiler, source root, compile flags, key of everything but the source)."""
    compiler = find_compiler()
    glue = _msl_emu()
    root = glue.source_root()
    flags = [*glue.base_flags(), "-O2", "-march=native", "-ffp-contract=off", "-fno-math-errno", *_VECLIB[0],
             "-fvisibility=hidden", "-Wno-unused-parameter", "-Wno-unused-variable", f"-I{root / 'csrc' / 'common'}"]
    files = [*_builder.tree_files(root, ("csrc/msl_emu",)), root / "csrc" / "common" / "inline_kernel_abi.h",
             glue.launch_source(root), root / "csrc" / "emulated_gpu" / "kernel_launch.h",
             root / "csrc" / "emulated_gpu" / "kernel_table.h", Path(glue.__file__), Path(__file__),
             *_strict_check_files()]
    key = _builder.content_key([_builder.compiler_identity(compiler), *flags, _cpu_flags(), sys.platform], files)
    return compiler, root, flags, key


def _strict_check_files() -> list[Path]:
    """The strict check's rules and stub headers: a cached library passed the check of these exact files."""
    from tf_metal_ops import msl_check

    here = Path(msl_check.__file__).parent
    return [*sorted(here.glob("*.py")), *sorted(p for p in msl_check.include_dir().iterdir() if p.is_file())]


def cache_dir() -> Path:
    return _env.cache_root() / "inline-kernels"


def _runtime_object() -> Path:
    """kernel_launch.cc compiled once per toolchain (linked into every kernel library)."""
    compiler, root, flags, key = _toolchain()

    def make(work: Path):
        glue = _msl_emu()
        incs = [f"-I{d}" for d in glue.include_dirs(root=root)]
        _builder.run([compiler, *flags, *incs, "-c", str(glue.launch_source(root)), "-o", str(work / "kernel_launch.o")],
                     "tf_metal_ops.metal_kernel: compiling kernel_launch.cc", KernelCompileError)
        return ()

    return _builder.cached_build(cache_dir() / f"runtime-{key}", ["kernel_launch.o"], make, KernelCompileError) / \
        "kernel_launch.o"


def _checked_copy(text: str, kernels) -> str:
    """`text` (the source as written) with each kernel's pointer [[buffer(n)]] parameters as checked<T>: the
    declaration before the attribute, read at the span clang gave (Param.span), rewritten; lines are kept. A kernel
    template's instances share their pattern's parameters, rewritten once."""
    edits = {}  # (start, end) -> replacement
    for k in kernels:
        for p in k.params:
            if p.kind != "buffer" or not p.pointer or p.span is None:
                continue
            words = text[p.span[0]:p.span[1]].replace("*", " * ").split()
            if len(words) < 3 or words[-2] != "*" or words[-1] != p.name:
                continue  # not `[space] [const] T* name` (a macro, a qualifier): left as written, unchecked
            written = [w for w in words[:-2] if w not in ("device", "constant", "const", "volatile")]
            const = "const " if ("const" in words[:-2] or p.address_space == "constant") else ""
            edits[p.span] = f"{_CHECKED}<{const}{' '.join(written)}> {p.name} "
    out = text
    for (start, end), rep in sorted(edits.items(), reverse=True):
        out = out[:start] + rep + out[end:]
    return out


def _launcher(kernel: msl_emu.Kernel, ns: str, checked: bool) -> str:
    """Run_<k> and Check_<k> of one kernel (no MSL keyword spelled: they are macros here); its groups run as fibers
    when kernel.needs_fibers."""
    T = "::tfmo::emu::table"
    k = kernel.name
    fn = f"decltype(&{ns}::{k})"
    if any(p.kind == "threadgroup" for p in kernel.params):
        raise KernelCompileError(f"tf_metal_ops.metal_kernel: kernel {k}: [[threadgroup(n)]] parameters are not "
                                 "supported inline; declare threadgroup arrays in the kernel body instead")
    members, inits, args = [], [], []
    for i, p in enumerate(kernel.params):
        pt = f"{T}::ParamT<{fn}, {i}>"
        if p.kind == "buffer":
            members.append(f"    {pt} a{i};")
            inits.append(f"::msl_emu::inline_launch::bind_slot<{pt}>(L->slots[{p.index}], L->slot_bytes[{p.index}], "
                         f'"{p.name}")')
            args.append(f"a.a{i}")
        else:
            args.append(f"{T}::AttrArg<{pt}>(t.{p.attribute})")
    return f"""
struct Args_{k} {{
{chr(10).join(members) if members else "    int unused;"}
}};
int Run_{k}(const TfmoInlineLaunch* L, char* error, size_t error_len) {{
  const Args_{k} a{{{", ".join(inits) if inits else "0"}}};
  auto body = [&a](const ::msl_emu::ThreadCtx& t) {{
    (void)a;
    (void)t;
    {ns}::{k}({", ".join(args)});
  }};
  return ::msl_emu::inline_launch::run<{'true' if kernel.needs_fibers else 'false'}, {'true' if checked else 'false'}>(
      L, body, "{k}", error, error_len);
}}
int Check_{k}(const void* desc, char* error, size_t error_len) {{
  const std::string m = ::tfmo::emu::CheckLaunch(*static_cast<const ::tfmo::emu::LaunchDesc*>(desc));
  if (m.empty()) return 0;
  std::snprintf(error, error_len, "%s", m.c_str());
  return 1;
}}
"""


def _unit(glue_text: str, kernels, stage_checked: str | None, checked: bool) -> str:
    head = ('// Generated by tf_metal_ops/inline_kernels/build.py. Do not edit.\n'
            '#include <cstdio>\n#include <cstring>\n#include <string>\n'
            '#include "inline_kernel_abi.h"\n#include "kernel_launch.h"\n#include "msl_emu/inline_launch.h"\n')
    # The glue includes the staged source; every function the user wrote becomes always_inline.
    glue_text = glue_text.replace(
        '#include "kernel.metal"',
        '#include <metal_stdlib>\n'
        '#pragma clang attribute push (__attribute__((always_inline)), apply_to = function)\n'
        '#include "kernel.metal"\n#pragma clang attribute pop')
    ns = ""
    body = [head, glue_text]
    if stage_checked is not None:
        body.append('namespace tfmo_checked {\n'
                    '#pragma clang attribute push (__attribute__((always_inline)), apply_to = function)\n'
                    f'#include "{stage_checked}"\n#pragma clang attribute pop\n}}  // namespace tfmo_checked\n')
        ns = "tfmo_checked"
    body.append("namespace tfmo_inline {")
    for k in kernels:
        body.append(_launcher(k, ns, checked))
    names = ", ".join(f'"{k.name}"' for k in kernels)
    table = ", ".join(f'{{TFMO_INLINE_ABI_VERSION, "{k.name}", {int(k.needs_fibers)}, {int(checked)}, &Run_{k.name}, '
                      f'&Check_{k.name}}}' for k in kernels)
    body.append(f"""const char* const kNames[] = {{{names}}};
const TfmoInlineKernel kTable[] = {{{table}}};
}}  // namespace tfmo_inline

extern "C" __attribute__((visibility("default"))) const TfmoInlineKernel* tfmo_inline_kernel(const char* name) {{
  for (size_t i = 0; i < sizeof tfmo_inline::kNames / sizeof tfmo_inline::kNames[0]; ++i)
    if (std::strcmp(tfmo_inline::kNames[i], name) == 0) return &tfmo_inline::kTable[i];
  return nullptr;
}}
""")
    return "\n".join(body)


def _compile_message(text: str) -> str:
    """The compiler's output without build paths and repeats: the checked build compiles the source twice."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if "In file included from" in line or re.match(r"^\d+ errors? generated", line):
            continue
        line = re.sub(r"^/\S*\.build-[^/]*/(glue/stage/)?", "", line)
        if re.search(r": (error|warning|note): ", line) and not re.search(r": note: ", line) or not blocks:
            blocks.append([line])
        else:
            blocks[-1].append(line)
    return "\n".join(dict.fromkeys("\n".join(b) for b in blocks)).strip()


def parse_source(msl: str) -> msl_emu.MetalFile:
    """The kernels of a complete source, checked for what inline kernels support. Raises KernelCompileError."""
    glue = _msl_emu()
    try:
        mf = glue.parse_metal("<source>", text=msl)
    except glue.GlueError as e:
        raise KernelCompileError(f"tf_metal_ops.metal_kernel: {e}") from None
    if not mf.kernels:
        raise KernelCompileError("tf_metal_ops.metal_kernel: the source defines no `kernel void name(...)`")
    if mf.constants:
        raise KernelCompileError("tf_metal_ops.metal_kernel: function constants are not supported in inline kernels; "
                                 "use template arguments, macros or constexpr values")
    return mf


def compile(msl: str, *, checked: bool, fast_math: bool = False, msl_version: str = "3.0") -> Path:
    """The path of the library compiled from `msl` (cached). Raises KernelCompileError."""
    stats["requested"] += 1
    compiler, root, flags, key = _toolchain()
    major, minor = (int(p) for p in msl_version.split("."))
    options = (["-ffast-math"] if fast_math else []) + ([f"-DMSL_EMU_VERSION={major}{minor}0"] if msl_version != "3.0" else [])
    flags = [*flags, *options]
    src_key = _builder.content_key([msl, *options], length=24)
    out = cache_dir() / f"{src_key}-{'checked' if checked else 'fast'}-{key[:12]}"

    def make(work: Path):
        from tf_metal_ops import msl_check  # imported where a kernel is built: `import tf_metal_ops` never loads it

        stats["compiled"] += 1
        # The check comes first: a source that is not MSL (asm, external functions, load-time code, ...) is never
        # compiled as C++.
        findings = msl_check.check_source(msl, filename="<source>", msl_version=msl_version, compiler=compiler)
        if findings:
            raise KernelCompileError("tf_metal_ops.metal_kernel: Apple's Metal compiler would reject the kernel "
                                     f"(strict Metal-language check, MSL {msl_version}):\n" + "\n".join(map(str, findings)))
        _make(work)
        return ()

    def _make(work: Path):
        metal = work / "kernel.metal"
        metal.write_text(msl)
        mf = parse_source(msl)
        glue = _msl_emu()
        try:
            unit = glue.generate([metal], work / "glue", root=root)[0]
        except glue.GlueError as e:
            raise KernelCompileError(f"tf_metal_ops.metal_kernel: {str(e).replace(str(metal), '<source>')}") from None
        stage_checked = None
        if checked:
            stage_checked = "kernel_checked.metal"
            (unit.staged.parent / stage_checked).write_text(
                f"#line 1 {glue._cstr(str(metal))}\n" + glue.rewrite_threadgroup_pointers(_checked_copy(msl, mf.kernels)))
        cc = work / "unit.cc"
        # unit.kernels: parsed with the include path, so a kernel's fiber use counts its headers' functions too
        cc.write_text(_unit(unit.source.read_text(), unit.kernels, stage_checked, checked))
        obj = work / "unit.o"
        try:
            _builder.run([compiler, *flags, *unit.flags, "-c", str(cc), "-o", str(obj)], "compiling", KernelCompileError)
        except KernelCompileError as e:
            raise KernelCompileError("tf_metal_ops.metal_kernel: the kernel does not compile:\n" +
                                     _compile_message(str(e).split("\n", 2)[-1])) from None
        runtime = _runtime_object()
        _builder.run([compiler, "-shared", "-o", str(work / LIBRARY), str(obj), str(runtime), *_VECLIB[1], "-lpthread"],
                     "tf_metal_ops.metal_kernel: linking the kernel", KernelCompileError)

    # The entry's name holds a prefix of the key; its manifest the whole key (source, options, toolchain).
    full_key = f"{_builder.content_key([msl, *options], length=64)}-{'checked' if checked else 'fast'}-{key}"
    return _builder.cached_build(out, [LIBRARY], make, KernelCompileError, key=full_key) / LIBRARY


# ---- the op library's compiler callback ------------------------------------------------------------------------
_COMPILER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                                ctypes.c_void_p, ctypes.c_size_t)


def _write(buf: int, size: int, text: str) -> None:
    data = text.encode(errors="replace")[: max(0, size - 1)]
    ctypes.memmove(buf, data + b"\0", len(data) + 1)


# TfmoInlineCompiler's options (csrc/common/inline_kernel_abi.h).
_CHECKED_OPTION, _FAST_MATH_OPTION = 1, 2


def _msl_version_option(options: int) -> str:
    v = (options >> 8) & 0xFFFF  # TFMO_INLINE_MSL_VERSION_OF: major * 100 + minor * 10, 0 = not given
    return f"{v // 100}.{v % 100 // 10}" if v else "3.0"


# TfmoInlineCompiler's results: a failure the op library remembers, and a refusal it asks about again next time.
_FAILED, _REFUSED = 1, 2


@_COMPILER_FN
def _compile_callback(source, options, path, path_len, error, error_len):  # called by TF's threads (GIL taken)
    try:
        text = source.decode()
        trust.check(text)  # consent first: nothing of a source from a graph is compiled without it
        _write(path, path_len, str(compile(text, checked=bool(options & _CHECKED_OPTION),
                                           fast_math=bool(options & _FAST_MATH_OPTION),
                                           msl_version=_msl_version_option(options))))
        return 0
    except trust.KernelNotAllowed as e:
        _write(error, error_len, str(e))
        return _REFUSED
    except Exception as e:  # every failure becomes the op's InvalidArgumentError
        _write(error, error_len, str(e).removeprefix("tf_metal_ops.metal_kernel: "))
        return _FAILED


_registered: set[str] = set()
_registered_lock = threading.Lock()


def _register(library: ctypes.CDLL, name: str) -> None:
    library.tfmo_set_inline_compiler.argtypes = [_COMPILER_FN]
    library.tfmo_set_inline_compiler.restype = None
    library.tfmo_set_inline_compiler(_compile_callback)
    _registered.add(name)


def ensure_registered() -> None:
    """Gives the op library, and the emulated GPU's kernel library once it is loaded, the compiler callback.
    Cheap after the first call; `import tf_metal_ops` calls it, so a reloaded graph finds its compiler."""
    emulated_gpu = _emulated_gpu()
    gpu_enabled = emulated_gpu is not None and emulated_gpu.enabled()
    if "ops" in _registered and ("emulated" in _registered or not gpu_enabled):
        return
    with _registered_lock:
        if "ops" not in _registered:
            _register(_library.native(), "ops")
        if "emulated" not in _registered and gpu_enabled:
            for library in emulated_gpu.compiler_targets():
                _register(library, "emulated")
