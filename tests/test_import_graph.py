"""The package's modules depend one way: the import graph of tf_metal_ops (read from the source with `ast`, function-level
imports included) has no cycle, and the environment module is a leaf (layers: tf_metal_ops/_env.py).

Edges: ``import a.b`` and ``from a.b import name`` lead to the module ``a.b`` (to ``a.b.name`` when that is a module);
relative imports are resolved against the importing module; a name that is no module of the package leads to the
longest module prefix it has. Implicit imports of parent packages are not edges (every module has them)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def package_modules(pkg_dir: Path) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package) for every .py file under pkg_dir (pkg_dir's name is the top package)."""
    out = {}
    for path in sorted(pkg_dir.rglob("*.py")):
        rel = path.relative_to(pkg_dir.parent).with_suffix("")
        if "__pycache__" in rel.parts or "_sources" in rel.parts:
            continue
        parts = list(rel.parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join(parts)] = (path, is_package)
    return out


def _known_prefix(name: str, modules) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node, module: str, is_package: bool, modules) -> list[str]:
    if isinstance(node, ast.Import):
        return [t for t in (_known_prefix(a.name, modules) for a in node.names) if t]
    if node.level:
        base = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        base = f"{base}.{node.module}" if node.module else base
    else:
        base = node.module
    out = []
    for alias in node.names:
        target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else _known_prefix(base, modules)
        if target:
            out.append(target)
    return out


def _is_type_checking(test) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree, in_functions: bool):
    """The import statements of a module's syntax tree; those in function bodies (and under `if TYPE_CHECKING:`)
    only when `in_functions`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif not in_functions and isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)  # `if TYPE_CHECKING:` imports for annotations never run
        elif in_functions or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def import_graph(pkg_dir: Path, in_functions: bool = True) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its text (module level, functions, classes), or with
    in_functions=False only those it imports when it is imported (module and class level)."""
    modules = package_modules(pkg_dir)
    graph = {}
    for name, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges = set()
        for node in _imports(tree, in_functions):
            edges.update(_targets(node, name, is_package, modules))
        edges.discard(name)
        graph[name] = edges
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, stack = {start}, [start]
    while stack:
        for n in graph.get(stack.pop(), ()):
            if n not in seen:
                seen.add(n)
                stack.append(n)
    return seen


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [m0, m1, ..., m0], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m):
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


PACKAGE_GRAPH = import_graph(REPO_ROOT / "tf_metal_ops")
IMPORT_TIME_GRAPH = import_graph(REPO_ROOT / "tf_metal_ops", in_functions=False)


def test_tf_metal_ops_has_no_import_cycle():
    cycle = find_cycle(PACKAGE_GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_graph_holds_function_level_imports():
    # diagnostics imports zero_out (which imports TensorFlow) inside the functions that run the GPU probe
    assert "tf_metal_ops.zero_out" in PACKAGE_GRAPH["tf_metal_ops.diagnostics"]
    assert "tf_metal_ops.emulated_gpu" in PACKAGE_GRAPH["tf_metal_ops.inline_kernels.build"]
    # inline_kernels.build imports msl_check in the function that builds a kernel
    assert "tf_metal_ops.msl_check" in PACKAGE_GRAPH["tf_metal_ops.inline_kernels.build"]
    assert "tf_metal_ops.msl_check" not in IMPORT_TIME_GRAPH["tf_metal_ops.inline_kernels.build"]


MSL_CHECK = sorted(m for m in PACKAGE_GRAPH if m == "tf_metal_ops.msl_check" or m.startswith("tf_metal_ops.msl_check."))


def test_the_platform_layers():
    assert PACKAGE_GRAPH["tf_metal_ops._env"] == set()
    assert PACKAGE_GRAPH["tf_metal_ops._builder"] == {"tf_metal_ops._env"}
    assert PACKAGE_GRAPH["tf_metal_ops._library"] == {"tf_metal_ops._env"}
    # run without TensorFlow by the development tools (the package entered without its __init__, as dev/check_msl.py
    # does), so the standard library and msl_check only: the kernel signatures come from msl_check's clang AST
    assert PACKAGE_GRAPH["tf_metal_ops.msl_emu"] <= set(MSL_CHECK)
    assert "tf_metal_ops.msl_check.signatures" in PACKAGE_GRAPH["tf_metal_ops.msl_emu"]
    assert PACKAGE_GRAPH["tf_metal_ops.metal_sources"] == set()


def test_import_tf_metal_ops_loads_no_feature_the_process_did_not_ask_for():
    """`import tf_metal_ops` imports neither the emulated GPU, nor msl_emu's generator, nor the Metal-language check,
    nor the op kit; with TF_METAL_OPS_EMULATED_GPU unset nothing of them is in sys.modules afterwards."""
    import os
    import subprocess
    import sys

    code = ("import sys, tf_metal_ops; print(sorted(m for m in sys.modules if m.startswith('tf_metal_ops.') and "
            "m.split('.')[1] in ('emulated_gpu', 'msl_emu', 'msl_check', 'extension', 'metal_sources', 'doctor')))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_METAL_OPS_EMULATED_GPU")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd="/", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout
    # and a lazy submodule still resolves as an attribute (a negative control of the check above: it then is loaded)
    code = "import sys, tf_metal_ops; tf_metal_ops.emulated_gpu.enabled(); print('tf_metal_ops.emulated_gpu' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd="/", timeout=300)
    assert r.stdout.strip().splitlines()[-1] == "True", (r.stdout, r.stderr[-3000:])


def test_msl_check_needs_only_builder_and_env():
    # dev/check_msl.py imports it without running tf_metal_ops/__init__ (no TensorFlow)
    assert len(MSL_CHECK) >= 4, MSL_CHECK
    outside = {m: PACKAGE_GRAPH[m] - set(MSL_CHECK) for m in MSL_CHECK}
    assert all(edges <= {"tf_metal_ops._builder", "tf_metal_ops._env"} for edges in outside.values()), outside


def test_import_tf_metal_ops_does_not_import_msl_check():
    loaded = reachable(IMPORT_TIME_GRAPH, "tf_metal_ops")
    assert "tf_metal_ops.inline_kernels.build" in loaded
    assert not loaded & set(MSL_CHECK), sorted(loaded & set(MSL_CHECK))


# ---- negative controls: a small package with a cycle ------------------------------------------------------------
def _package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / "pkg" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root / "pkg"


CYCLES = {
    "module level, relative": {
        "__init__.py": "",
        "a.py": "from . import b\n",
        "b.py": "from .sub.c import f\n",
        "sub/__init__.py": "",
        "sub/c.py": "from ..a import x\n",
    },
    "hidden in a function": {
        "__init__.py": "from pkg.a import g\n",
        "a.py": "from pkg import b\ndef g():\n    return b\n",
        "b.py": "def h():\n    from pkg import a\n    return a\n",
    },
    "import ... as, in a method": {
        "__init__.py": "",
        "a.py": "import pkg.b as b\n",
        "b.py": "class K:\n    def m(self):\n        import pkg.a\n",
    },
    "through a package's name": {
        "__init__.py": "from pkg.a import g\n",
        "a.py": "def g():\n    from pkg import g2\n",
    },
}


@pytest.mark.parametrize("case", sorted(CYCLES))
def test_a_cycle_is_found(tmp_path, case):
    cycle = find_cycle(import_graph(_package(tmp_path, CYCLES[case])))
    assert cycle is not None and cycle[0] == cycle[-1], cycle


def test_no_cycle_in_a_one_way_package(tmp_path):
    pkg = _package(tmp_path, {
        "__init__.py": "from pkg.a import g\nfrom pkg import b\n",
        "a.py": "import os\nfrom . import b\ndef g():\n    from pkg.sub import c\n",
        "b.py": "from .sub.c import f\n",
        "sub/__init__.py": "",
        "sub/c.py": "import json\ndef f():\n    pass\n",
    })
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.b", "pkg.sub.c"}
    assert graph["pkg.b"] == {"pkg.sub.c"}
    assert find_cycle(graph) is None
