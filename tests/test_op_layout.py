"""One shape per op family: every op named in csrc/common/op_names.h belongs to a family (a `// family: NAME` line
above it), and every file of a family is named after it, in every layer; every repository path named in a comment
or a doc exists.

A family's files (docs/writing_ops.md, "The shape of the package's own ops"), all derived from its name <f>:
  csrc/ops/<f>_op.cc        op definitions (tfmo::DefineOp, common/shape_fns.h)
  csrc/ops/<f>_args.h       host-side argument parsing and checks and the kernel registrations, shared by the CPU
                            kernels and the GPU host code
  csrc/cpu/<f>_cpu.cc       CPU kernels
  csrc/cpu/<f>_cpu_isa.h    the ISA builds of its CPU loops, where it has some (common/isa_choice.h)
  csrc/cpu/<f>_cpu_kernels.h and csrc/cpu/<f>_cpu_<part>.cc: CPU kernels whose instantiations take long to compile,
                            as templates in the header and one file per op kernel instantiating them (<f>_cpu.cc
                            then holds the registration and the ISA choice)
  csrc/gpu/<f>_gpu.cc       GPU host code
  metal_kernels/<f>.metal   Metal kernels, unless its GPU host binds a kernel source that the op receives
                            (`call.pass(name, spec, &source)`: metal_kernel)
                            A family marked `// kernels: CPU only` in op_names.h (the line right under its family
                            line) has neither, and no GPU kernel registration.
  csrc/shared/<f>_math.h    per-element math shared by the CPU and Metal kernels, where it has some; a family named
                            <g>_<variant> after another family <g> (render_packed) may use <g>'s instead
  tf_metal_ops/<f>/ or tf_metal_ops/<f>.py, or else the module that defines its public function `def <f>(`
Every file of these folders is a family's, except the layer's own helpers (LAYER_FILES).
No file reads the repository at run time: this is a check of the source tree only."""

import glob
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OP_NAMES = os.path.join(ROOT, "csrc", "common", "op_names.h")

# Folder -> the name endings of a family's files there (a family <f> owns <f><ending>).
FAMILY_FILES = {
    "csrc/ops": ("_op.cc", "_args.h"),
    "csrc/cpu": ("_cpu.cc", "_cpu_isa.h", "_cpu_kernels.h"),
    "csrc/gpu": ("_gpu.cc",),
    "csrc/shared": ("_math.h",),
    "metal_kernels": (".metal", ".h"),  # <family>.h: Metal-only code shared by the family's .metal files
}
# The layers' own helpers, shared by every family.
LAYER_FILES = {"csrc/gpu/gpu_host.h", "csrc/gpu/gpu_host.cc", "csrc/shared/device_compat.h"}


def families_in_op_names():
    """{family: [op type, ...]} from op_names.h, in file order; every TFMO_OP_ define must sit under a family."""
    out, family = {}, None
    for line in open(OP_NAMES, encoding="utf-8"):
        m = re.match(r"//\s*family:\s*(\w+)\s*$", line)
        if m:
            family = m.group(1)
            out.setdefault(family, [])
            continue
        m = re.match(r'#define\s+TFMO_OP_\w+\s+"(\w+)"', line)
        if m:
            assert family is not None, f"op_names.h: {m.group(1)} is not under a `// family: NAME` line"
            out[family].append(m.group(1))
    return out


FAMILIES = list(families_in_op_names())


def cpu_only_families():
    """The families whose `// family: NAME` line is followed by `// kernels: CPU only` (no GPU kernels yet)."""
    lines = open(OP_NAMES, encoding="utf-8").read().splitlines()
    out = set()
    for line, following in zip(lines, lines[1:] + [""]):
        m = re.match(r"//\s*family:\s*(\w+)\s*$", line)
        if m and re.match(r"//\s*kernels:\s*CPU only\s*$", following):
            out.add(m.group(1))
    return out


CPU_ONLY = cpu_only_families()


def read(rel):
    return open(os.path.join(ROOT, rel), encoding="utf-8").read()


def isfile(rel):
    return os.path.isfile(os.path.join(ROOT, rel))


def base_family(family):
    """The family <g> that family <g>_<variant> is named after, or None."""
    bases = [g for g in FAMILIES if g != family and family.startswith(g + "_")]
    return max(bases, key=len) if bases else None


def binds_op_source(family):
    """The family's GPU host binds a kernel source that its op receives (no .metal file of its own)."""
    return re.search(r"\.pass\([^;]*&[\w.]*source\)", read(f"csrc/gpu/{family}_gpu.cc")) is not None


def python_files(family):
    for rel in (f"tf_metal_ops/{family}", f"tf_metal_ops/{family}.py"):
        if os.path.exists(os.path.join(ROOT, rel)):
            return [rel]
    return [os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "tf_metal_ops", "**", "*.py"), recursive=True)
            if re.search(rf"^def {family}\(", open(p, encoding="utf-8").read(), re.M)]


def family_files(family):
    """{kind: [repository path, ...]} of the files the family must have (derived from its name only)."""
    files = {"op": [f"csrc/ops/{family}_op.cc"], "args": [f"csrc/ops/{family}_args.h"],
             "cpu": [f"csrc/cpu/{family}_cpu.cc"]}
    if family not in CPU_ONLY:
        files["gpu"] = [f"csrc/gpu/{family}_gpu.cc"]
        if not binds_op_source(family):
            files["metal"] = [f"metal_kernels/{family}.metal"]
    files["python"] = python_files(family)
    return files


def test_every_op_belongs_to_a_family_with_all_its_files():
    found = families_in_op_names()
    assert sum(len(v) for v in found.values()) >= 15 and len(found) >= 6, sorted(found)
    missing = []
    for family in found:
        for kind, paths in family_files(family).items():
            if not paths:
                missing.append(f"{family} {kind}: nothing found")
            missing += [f"{family} {kind}: {p}" for p in paths if not os.path.exists(os.path.join(ROOT, p))]
    assert not missing, missing


def test_cpu_only_families_have_no_gpu_files():
    """The `// kernels: CPU only` marker is true: no GPU host code, no Metal kernel, no GPU kernel registration; and
    the family's doc says so."""
    assert CPU_ONLY <= set(FAMILIES), CPU_ONLY
    for family in CPU_ONLY:
        present = [p for p in (f"csrc/gpu/{family}_gpu.cc", f"metal_kernels/{family}.metal", f"metal_kernels/{family}.h")
                   if isfile(p)]
        assert not present, (family, present)
        assert not re.search(r'RegisterKernels(<\w+>)?\("GPU"', read(f"csrc/cpu/{family}_cpu.cc")), family
        assert "Metal kernel" in read(f"docs/{family}.md") and "not written yet" in read(f"docs/{family}.md"), family


def test_every_file_of_the_kernel_folders_is_a_family_s_by_its_name():
    stray = []
    for folder, endings in FAMILY_FILES.items():
        for path in sorted(glob.glob(os.path.join(ROOT, folder, "*"))):
            rel = os.path.relpath(path, ROOT)
            name = os.path.basename(path)
            if rel in LAYER_FILES:
                continue
            part = re.fullmatch(r"(\w+)_cpu_[a-z_]+\.cc", name) if folder == "csrc/cpu" else None
            if part and part.group(1) in FAMILIES and os.path.exists(os.path.join(ROOT, folder, part.group(1) + "_cpu_kernels.h")):
                continue
            if not any(name == f + e for f in FAMILIES for e in endings):
                stray.append(rel)
    assert not stray, f"not named <family><ending> ({FAMILY_FILES}): {stray}"


def test_each_family_uses_only_its_own_math_header():
    """A family's kernels include csrc/shared/<f>_math.h, or <g>_math.h of the family <g> it is named after."""
    wrong = []
    for family in FAMILIES:
        allowed = {f"{family}_math.h"} | ({f"{base_family(family)}_math.h"} if base_family(family) else set())
        paths = [p for p in (f"csrc/ops/{family}_args.h", f"csrc/cpu/{family}_cpu.cc", f"csrc/cpu/{family}_cpu_isa.h",
                             f"csrc/gpu/{family}_gpu.cc", f"metal_kernels/{family}.metal") if isfile(p)]
        for p in paths:
            for header in re.findall(r'#include\s+"(?:shared/)?(\w+_math\.h)"', read(p)):
                if header not in allowed or not isfile(f"csrc/shared/{header}"):
                    wrong.append(f"{p}: {header}")
    assert not wrong, wrong


def test_named_namespaces_are_family_names():
    """The named namespaces of a family's files are tfmo::<f> (and tfmo::<f>::cpu for its CPU builds)."""
    wrong = []
    for folder, endings in FAMILY_FILES.items():
        for path in glob.glob(os.path.join(ROOT, folder, "*")):
            rel = os.path.relpath(path, ROOT)
            family = next((f for f in sorted(FAMILIES, key=len, reverse=True)
                           if any(os.path.basename(path) == f + e for e in endings)), None)
            if family is None:
                continue
            for ns in re.findall(r"^namespace\s+([\w:]+)\s*\{", read(rel), re.M):
                if ns not in (f"tfmo::{family}", f"tfmo::{family}::cpu") and not (
                        base_family(family) and ns == f"tfmo::{base_family(family)}::cpu"):
                    wrong.append(f"{rel}: namespace {ns}")
    assert not wrong, wrong


def test_kernels_are_registered_in_the_family_args_header():
    """Every family registers its kernels through RegisterKernels(device, ...) of csrc/ops/<f>_args.h, called once
    from its CPU kernels and once from its GPU host code (CPU-only families: from the CPU kernels only)."""
    for family in FAMILIES:
        assert re.search(r"void RegisterKernels\(const char\* device", read(f"csrc/ops/{family}_args.h")), family
        devices = [(f"csrc/cpu/{family}_cpu.cc", "CPU")]
        if family not in CPU_ONLY:
            devices.append((f"csrc/gpu/{family}_gpu.cc", "GPU"))
        for rel, device in devices:
            text = read(rel)
            assert re.search(rf'tfmo::{family}::RegisterKernels(<\w+>)?\("{device}"', text), rel
            assert "RegisterKernelPair" not in text and "RegisterKernel(" not in text, rel


def test_each_op_is_defined_in_its_family_op_file_through_define_op():
    for family, ops in families_in_op_names().items():
        text = open(os.path.join(ROOT, "csrc", "ops", f"{family}_op.cc"), encoding="utf-8").read()
        assert "tfmo::DefineOp(" in text and "TF_NewOpDefinitionBuilder" not in text, family
        defined = re.findall(r"tfmo::DefineOp\(\s*(TFMO_OP_\w+)", text)
        names = dict(re.findall(r'#define\s+(TFMO_OP_\w+)\s+"(\w+)"', open(OP_NAMES, encoding="utf-8").read()))
        assert sorted(names[d] for d in defined) == sorted(ops), family


def test_cpu_isa_families_share_one_choice_and_one_diagnostic():
    """Every family with ISA builds of its CPU loops has them in csrc/cpu/<f>_cpu_isa.h (namespace tfmo::<f>::cpu:
    TFMO_ISA_FAMILY_BUILDS, dispatch through tfmo::CountIsaCall), and at the end of <f>_cpu.cc the
    choice through common/isa_choice.h's TFMO_ISA_FAMILY, read from TF_METAL_OPS_<F>_ISA, and the diagnostics
    tfmo_<f>_cpu_paths, which tf_metal_ops.diagnostics.cpu_paths lists. Another family runs them only when named after
    it (render_packed). A function is compiled for a build by the one marker TFMO_ISA(build): no family writes its own
    target attribute or its own test of the compiler and the architecture."""
    backend = read("tf_metal_ops/diagnostics.py")
    isa_families = [f for f in FAMILIES if isfile(f"csrc/cpu/{f}_cpu_isa.h")]
    listed = re.findall(r'"tfmo_(\w+)_cpu_paths"', backend)
    assert len(isa_families) >= 3 and sorted(listed) == sorted(isa_families), (isa_families, listed)
    for family in isa_families:
        variable = f"TF_METAL_OPS_{family.upper()}_ISA"
        assert f'"tfmo_{family}_cpu_paths", "{variable}"' in backend, family
        users = [p for p in glob.glob(os.path.join(ROOT, "csrc", "cpu", "*.cc"))
                 if f'"{variable}"' in open(p, encoding="utf-8").read()]
        assert [os.path.basename(p) for p in users] == [f"{family}_cpu.cc"], (variable, users)
        text = read(f"csrc/cpu/{family}_cpu.cc")
        assert re.search(rf'TFMO_ISA_FAMILY\(tfmo::{family}::cpu, tfmo_{family}_cpu_paths, "{variable}",', text), family
        header = read(f"csrc/cpu/{family}_cpu_isa.h")
        assert re.search(rf"namespace tfmo::{family}::cpu {{\n(.*\n)*TFMO_ISA_FAMILY_BUILDS\([2-5]\);", header), family
        assert re.search(r"CountIsaCall\((tfmo::\w+::cpu::)?IsaSelection\(\)", header + text), family
    for path in glob.glob(os.path.join(ROOT, "csrc", "cpu", "*")):
        text = open(path, encoding="utf-8").read()
        assert "target(" not in text and "__x86_64__" not in text, path
    for path in glob.glob(os.path.join(ROOT, "csrc", "cpu", "*.cc")):
        name = os.path.basename(path)
        for used in re.findall(r'#include "cpu/(\w+)_cpu_isa\.h"', open(path, encoding="utf-8").read()):
            assert name.startswith(used + "_"), (name, used)


# ---- every repository path named in a comment or doc exists -------------------------------------------------
TOP = ("csrc", "metal_kernels", "tf_metal_ops", "tests", "dev", "docs", "bench", "examples")
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w.*{},/-]*[\w*}])" % "|".join(TOP))
# csrc-relative names in C++, Metal and docs (e.g. `ops/render_args.h`, `common/isa_choice.h`).
CSRC_RELATIVE = re.compile(r"(?<![\w./-])((?:common|ops|cpu|gpu|shared|metal|emulated_gpu)/[\w.*{},-]*\.(?:h|cc|mm))\b")
SCANNED = (".py", ".h", ".cc", ".mm", ".metal", ".md", ".in", ".toml", ".cfg", ".sh", ".txt")
# Paths that exist only after a build or a run, and the docs' placeholders.
GENERATED = ("tf_metal_ops/_sources", "tf_metal_ops/include", "tf_metal_ops/libtf_metal_ops.so", "bench/out")


def repo_files():
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split("\n")
        files = [f for f in out if f and os.path.isfile(os.path.join(ROOT, f))]
        if files:
            return files
    except (OSError, subprocess.CalledProcessError):
        pass
    skip = {".git", "build", "__pycache__"}
    return [os.path.relpath(os.path.join(d, f), ROOT) for d, dirs, fs in os.walk(ROOT)
            for f in fs if not (dirs.__setitem__(slice(None), [x for x in dirs if x not in skip]))]


def expand_braces(p):
    """`a/{b,c}.h` -> a/b.h, a/c.h; a one-name group is a placeholder (an f-string's `{family}`): any name."""
    m = re.search(r"\{([^{}]*)\}", p)
    if not m:
        return [p]
    if "," not in m.group(1):
        return expand_braces(p[:m.start()] + "*" + p[m.end():])
    return [q for alt in m.group(1).split(",") for q in expand_braces(p[:m.start()] + alt + p[m.end():])]


def exists(p, *bases):
    if p.startswith(GENERATED) or "my_" in p:
        return True
    pattern = p + "*" if p.endswith("_") else p  # a prefix: `tests/msl_check/broken_<rule>.metal`
    return any(glob.glob(os.path.join(ROOT, b, pattern)) for b in bases)


def test_every_path_named_in_comments_and_docs_exists():
    missing = []
    for f in repo_files():
        if not f.endswith(SCANNED) or f.startswith("build/"):
            continue
        try:
            text = open(os.path.join(ROOT, f), encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        native = f.startswith(("csrc/", "metal_kernels/")) or f.endswith(".md")
        for n, line in enumerate(text.splitlines(), 1):
            for m in PATH.finditer(line):
                if line[m.end():m.end() + 1] == "\\":  # a regular expression's source, e.g. `broken_goto\.metal`
                    continue
                missing += [f"{f}:{n}: {p}" for p in expand_braces(m.group(1).rstrip(".,")) if not exists(p, "")]
            if native:
                for m in CSRC_RELATIVE.finditer(line):
                    missing += [f"{f}:{n}: {p}" for p in expand_braces(m.group(1)) if not exists(p, "csrc", "")]
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("name", ["render_ops.cc", "render_packed_ops.cc", "hash_grid_kernel.h", "_validate.h",
                                  "TFMO_HG_VARIANTS", "volume_render_cpu.cc", "distortion_loss_cpu.cc",
                                  "volume_render_simd.h", "volume_render_math.h", "volume_render.metal",
                                  "distortion_loss.metal", "ray_march_scan.metal", "ray_march_isa.cc",
                                  "ray_march_avx2.h", "vr_cpu", "rm_cpu", "tfmo::march", "tfmo_volume_render_cpu_paths",
                                  "VrIsaSelection", "RmIsaSelection", "HgIsaSelection"])
def test_old_names_are_gone(name):
    hits = []
    for f in repo_files():
        if f.endswith(SCANNED) and f != "tests/test_op_layout.py" and not f.startswith("build/"):
            try:
                if name in open(os.path.join(ROOT, f), encoding="utf-8").read():
                    hits.append(f)
            except (UnicodeDecodeError, OSError):
                pass
    assert not hits, hits
