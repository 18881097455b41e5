"""One shape per op family: every op named in csrc/common/op_names.h belongs to a family (a `// family: NAME` line
above it) whose files all exist, and every repository path named in a comment or a doc exists.

A family's files (docs/writing_ops.md, "The package's own ops"):
  csrc/ops/<family>_op.cc    op definitions (tfmo::DefineOp, common/shape_fns.h)
  csrc/ops/<family>_args.h   host-side argument parsing and checks, shared by the CPU kernels and the GPU host code
  csrc/cpu/*_cpu.cc          CPU kernels
  csrc/gpu/<family>_gpu.cc   GPU host code
  metal_kernels/*.metal      Metal kernels
  csrc/shared/*_math.h       per-element math shared by the CPU and Metal kernels
  tf_metal_ops/...           the Python wrappers (and the NumPy reference, where the family has one)
No file reads the repository at run time: this is a check of the source tree only."""

import glob
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OP_NAMES = os.path.join(ROOT, "csrc", "common", "op_names.h")

# Each family's files beyond its NAME_op.cc, NAME_args.h and NAME_gpu.cc, by kind (cpu, metal, math, python):
# repository paths, or "-" where the family has no such file (the reason follows on the line).
FAMILY_TABLE = """
zero_out       cpu     csrc/cpu/zero_out_cpu.cc
zero_out       metal   metal_kernels/zero_out.metal
zero_out       math    -   one memset and one copy: no per-element math to share
zero_out       python  tf_metal_ops/zero_out.py
render         cpu     csrc/cpu/volume_render_cpu.cc csrc/cpu/distortion_loss_cpu.cc csrc/cpu/volume_render_simd.h
render         metal   metal_kernels/volume_render.metal metal_kernels/distortion_loss.metal
render         math    csrc/shared/volume_render_math.h
render         python  tf_metal_ops/render/ops.py tf_metal_ops/render/pure_tf.py tf_metal_ops/render/reference.py
render_packed  cpu     csrc/cpu/render_packed_cpu.cc
render_packed  metal   metal_kernels/render_packed.metal
render_packed  math    csrc/shared/volume_render_math.h
render_packed  python  tf_metal_ops/render_packed/ops.py tf_metal_ops/render_packed/pure_tf.py
render_packed  python  tf_metal_ops/render_packed/reference.py
hash_grid      cpu     csrc/cpu/hash_grid_cpu.cc
hash_grid      metal   metal_kernels/hash_grid.metal
hash_grid      math    csrc/shared/hash_grid_math.h
hash_grid      python  tf_metal_ops/hash_grid/ops.py tf_metal_ops/hash_grid/pure_tf.py tf_metal_ops/hash_grid/reference.py
ray_march      cpu     csrc/cpu/ray_march_cpu.cc csrc/cpu/ray_march_isa.cc csrc/cpu/ray_march_avx2.h
ray_march      metal   metal_kernels/ray_march.metal metal_kernels/ray_march_scan.metal
ray_march      math    csrc/shared/ray_march_math.h
ray_march      python  tf_metal_ops/ray_march/ops.py tf_metal_ops/ray_march/pure_tf.py tf_metal_ops/ray_march/reference.py
ray_march      python  tf_metal_ops/occupancy.py
metal_kernel   cpu     csrc/cpu/metal_kernel_cpu.cc
metal_kernel   metal   -   the user's kernel source is an attr of the op (tf_metal_ops.metal_kernel)
metal_kernel   math    -   the generated source's ABI with the kernels: csrc/common/inline_kernel_abi.h
metal_kernel   python  tf_metal_ops/inline_kernels/api.py tf_metal_ops/inline_kernels/source.py
"""
FAMILIES = {}
for _row in FAMILY_TABLE.strip().splitlines():  # rows of one family and kind add up
    _family, _kind, _rest = _row.split(None, 2)
    _files = FAMILIES.setdefault(_family, {}).setdefault(_kind, [])
    FAMILIES[_family][_kind] = None if _rest.startswith("-") else _files + _rest.split()


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


def family_files(family):
    files = {"op": [f"csrc/ops/{family}_op.cc"], "args": [f"csrc/ops/{family}_args.h"],
             "gpu": [f"csrc/gpu/{family}_gpu.cc"]}
    files.update(FAMILIES[family])
    return files


def test_every_op_belongs_to_a_family_with_all_its_files():
    found = families_in_op_names()
    assert sum(len(v) for v in found.values()) >= 15 and set(found) == set(FAMILIES), sorted(found)
    missing = []
    for family in found:
        for kind, paths in family_files(family).items():
            for p in paths or []:
                if not os.path.isfile(os.path.join(ROOT, p)):
                    missing.append(f"{family} {kind}: {p}")
    assert not missing, missing
    # Nothing in csrc/ops/ outside the shape: only NAME_op.cc and NAME_args.h of the families.
    expected = {p for f in found for kind in ("op", "args") for p in family_files(f)[kind]}
    actual = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "csrc", "ops", "*"))}
    assert actual == expected, (sorted(actual - expected), sorted(expected - actual))


def test_each_op_is_defined_in_its_family_op_file_through_define_op():
    for family, ops in families_in_op_names().items():
        text = open(os.path.join(ROOT, "csrc", "ops", f"{family}_op.cc"), encoding="utf-8").read()
        assert "tfmo::DefineOp(" in text and "TF_NewOpDefinitionBuilder" not in text, family
        defined = re.findall(r"tfmo::DefineOp\(\s*(TFMO_OP_\w+)", text)
        names = dict(re.findall(r'#define\s+(TFMO_OP_\w+)\s+"(\w+)"', open(OP_NAMES, encoding="utf-8").read()))
        assert sorted(names[d] for d in defined) == sorted(ops), family


def test_cpu_isa_families_share_one_choice_and_one_diagnostic():
    """Every CPU kernel built per ISA picks its build through common/isa_choice.h and reports it through
    tfmo_<family>_cpu_paths, which tf_metal_ops.diagnostics.cpu_paths lists."""
    backend = open(os.path.join(ROOT, "tf_metal_ops", "diagnostics.py"), encoding="utf-8").read()
    for family, variable in (("hash_grid", "TF_METAL_OPS_HASH_GRID_ISA"),
                             ("volume_render", "TF_METAL_OPS_VOLUME_RENDER_ISA"),
                             ("ray_march", "TF_METAL_OPS_RAY_MARCH_ISA")):
        assert f'"tfmo_{family}_cpu_paths", "{variable}"' in backend, family
        users = [p for p in glob.glob(os.path.join(ROOT, "csrc", "cpu", "*.cc"))
                 if f'"{variable}"' in open(p, encoding="utf-8").read()]
        assert len(users) == 1, (variable, users)
        text = open(users[0], encoding="utf-8").read()
        assert "ChosenIsa<" in text and f"TFMO_ISA_DIAGNOSTICS(tfmo_{family}_cpu_paths," in text, users[0]


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
                                  "TFMO_HG_VARIANTS"])
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
