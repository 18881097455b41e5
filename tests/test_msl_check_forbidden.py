"""The strict check refuses what is not Metal, end to end: hostile inline kernels (each construct of
tf_metal_ops/msl_check/forbidden.py and the C++ features MSL does not support, in the header and in the body where
C++ allows it there) are refused by the op with InvalidArgumentError before anything of them is compiled or runs
(no file is written, the process goes on), and the error points at the user's line. Function definitions, linkage
specifications and program-scope variables exist only at file scope, so those cases are header-only; block-scope
forms (a local declaration of an external function, a local struct with a virtual method, a static local, an
attribute on a local) stand in for them in the body."""

import os

import pytest

M = "MARKER"
SYS = 'int system(thread const char* command);'
# (name, header, body (before the kernel's store), rule, the part the finding is in)
CASES = [
    ('asm-statement', 'inline void f() { __asm__ volatile("syscall"); }', 'f();', 'asm', 'header'),
    # open(MARKER, O_CREAT | O_WRONLY, 0644) as a Linux x86-64 system call
    ('asm-statement', '', '__asm__ volatile("mov $2, %%eax\\n syscall" : : "D"("MARKER"), "S"(0101), "d"(0644) : "rax", "rcx", "r11", "memory");', 'asm', 'source'),
    ('asm-file-scope', '__asm__(".section .init_array");', '', 'asm', 'header'),
    ('asm-label', 'int run(thread const char* c) __asm__("system");', '', 'asm', 'header'),
    ('asm-label', '', 'int run(thread const char* c) __asm__("system"); run("touch MARKER");', 'asm', 'source'),
    ('external-function', 'int system(thread const char* command);', 'system("touch MARKER");', 'external-function', 'source'),
    ('external-function', '', 'int system(thread const char* command); system("touch MARKER");', 'external-function', 'source'),
    ('extern-c', 'extern "C" int system(thread const char* command);', 'system("touch MARKER");', 'linkage', 'header'),
    ('extern-c', 'extern "C" { inline int one() { return 1; } }', '', 'linkage', 'header'),
    ('constructor', '__attribute__((constructor)) void at_load() { }', '', 'gnu-attribute', 'header'),
    ('constructor', '[[gnu::constructor]] void at_load() { }', '', 'gnu-attribute', 'header'),
    ('destructor', '__attribute__((destructor)) void at_exit() { }', '', 'gnu-attribute', 'header'),
    ('destructor', '[[gnu::destructor]] void at_exit() { }', '', 'gnu-attribute', 'header'),
    ('section', '__attribute__((section(".init_array"))) void placed() { }', '', 'gnu-attribute', 'header'),
    ('section', '[[gnu::section(".init_array")]] void placed() { }', '', 'gnu-attribute', 'header'),
    ('section', '', '__attribute__((section(".init_array"))) constant int v = 1; (void)v;', 'gnu-attribute', 'source'),
    ('alias', 'inline void t() {} void a() __attribute__((alias("_Z1tv")));', '', 'gnu-attribute', 'header'),
    ('alias', 'inline void t() {} [[gnu::alias("_Z1tv")]] void a();', '', 'gnu-attribute', 'header'),
    ('weak', '__attribute__((weak)) void w() { }', '', 'gnu-attribute', 'header'),
    ('weak', '[[gnu::weak]] void w() { }', '', 'gnu-attribute', 'header'),
    ('used', '__attribute__((used)) void u() { }', '', 'gnu-attribute', 'header'),
    ('used', '[[gnu::used]] void u() { }', '', 'gnu-attribute', 'header'),
    ('used', '', '[[gnu::used]] constant int v = 1; (void)v;', 'gnu-attribute', 'source'),
    ('visibility', '__attribute__((visibility("default"))) void v() { }', '', 'gnu-attribute', 'header'),
    ('visibility', '[[gnu::visibility("default")]] void v() { }', '', 'gnu-attribute', 'header'),
    ('visibility', '', 'struct __attribute__((visibility("default"))) L { int a; }; L l{1}; (void)l;', 'gnu-attribute', 'source'),
    ('init_priority', 'struct P { int v; }; __attribute__((init_priority(101))) constant P p{1};', '', 'gnu-attribute', 'header'),
    ('init_priority', 'struct P { int v; }; [[gnu::init_priority(101)]] constant P p{1};', '', 'gnu-attribute', 'header'),
    ('builtin', 'inline void f() { __builtin_trap(); }', 'f();', 'builtin', 'header'),
    ('builtin', '', '__builtin_trap();', 'builtin', 'source'),
    ('builtin', '', 'thread char* p = (thread char*)__builtin_alloca(16); p[0] = 0;', 'builtin', 'source'),
    ('throw', 'inline void f() { throw 1; }', 'f();', 'exception', 'header'),
    ('throw', '', 'if (thread_position_in_grid.x > 100u) throw 1;', 'exception', 'source'),
    ('try', '', 'try { } catch (...) { }', 'exception', 'source'),
    ('new', 'inline void f() { thread int* p = new int(1); (void)p; }', 'f();', 'new-delete', 'header'),
    ('new', '', 'thread int* p = new int(1); (void)p;', 'new-delete', 'source'),
    ('delete', '', 'thread int* p = nullptr; delete p;', 'new-delete', 'source'),
    ('thread_local', 'thread_local int t = 0;', '', 'thread-local', 'header'),
    ('thread_local', '', 'thread_local int t = 0; (void)t;', 'thread-local', 'source'),
    ('virtual', 'struct B { virtual float g() const { return 1; } };', '', 'virtual-function', 'header'),
    ('virtual', '', 'struct B { virtual float g() const { return 1; } }; B b; (void)b;', 'virtual-function', 'source'),
    ('goto', 'inline void f(int n) { if (n) goto end; end: return; }', 'f(1);', 'goto', 'header'),
    ('goto', '', 'goto end; end:;', 'goto', 'source'),
    ('variadic', 'inline int f(int n, ...) { return n; }', 'f(1, 2);', 'variadic', 'header'),
    ('variadic', '', 'struct V { static int f(int n, ...) { return n; } }; V::f(1, 2);', 'variadic', 'source'),
    ('static-local', 'inline int f() { static int n = 0; return ++n; }', 'f();', 'program-scope-variable', 'header'),
    ('static-local', '', 'static int n = 0; n++;', 'program-scope-variable', 'source'),
    ('program-scope-variable', 'device int* p;', '', 'program-scope-variable', 'header'),
    ('program-scope-variable', 'int counter;', '', 'program-scope-variable', 'header'),
    ('dynamic-initializer', 'inline float f() { return 2.0f; } constant float c = f();', '', 'program-scope-variable', 'header'),
]


@pytest.fixture(scope="module", autouse=True)
def compiler(clang16):
    os.environ.setdefault("TF_METAL_OPS_CLANGXX", clang16)
    return clang16


def _case_id(case):
    name, header, body, _, _ = case
    return f"{name}-{'header' if header else 'body'}" + ("" if not (header and body) else "+call")


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{_case_id(c)}" for i, c in enumerate(CASES)])
def test_hostile_kernel_is_refused_before_anything_runs(case, tmp_path, monkeypatch):
    import tensorflow as tf

    import tf_metal_ops
    from tf_metal_ops.inline_kernels import build

    monkeypatch.setenv("TF_METAL_OPS_CACHE", str(tmp_path / "cache"))
    name, header, body, rule, part = case
    marker = tmp_path / "marker"
    header, body = header.replace(M, str(marker)), body.replace(M, str(marker))
    k = tf_metal_ops.metal_kernel("hostile", ["x"], ["y"], f"{body}\nuint i = thread_position_in_grid.x; y[i] = x[i];",
                                  header=header)
    compiled = build.stats["compiled"]
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        k(inputs=[tf.ones([4])], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
          output_dtypes=[tf.float32])
    message = e.value.message
    assert f"[{rule}]" in message, message
    assert f"hostile:{part}:1:" in message, message  # the user's line: each case is one line of its part
    assert "strict Metal-language check" in message, message
    assert not marker.exists()
    assert not list((tmp_path / "cache").rglob("*.o")) and not list((tmp_path / "cache").rglob("*.so")), \
        "something was compiled"
    assert build.stats["compiled"] == compiled + 1  # one build attempt, which the check stopped


def test_accepted_sources_still_run(tmp_path, monkeypatch):
    """Next to the refusals: a kernel using what MSL has (templates, structs, constant program-scope data, pure
    builtins, the Metal standard library, threadgroup memory and barriers) compiles and runs."""
    import numpy as np
    import tensorflow as tf

    import tf_metal_ops

    monkeypatch.setenv("TF_METAL_OPS_CACHE", str(tmp_path / "cache"))
    header = """
        struct Scale { float a; };
        constant Scale kScale = {2.0f};
        template <typename T> inline T twice(T v) { return v * T(kScale.a); }
        inline float safe(float v) { return isnan(v) ? __builtin_nanf("") : v; }
    """
    body = """
        uint i = thread_position_in_grid.x;
        threadgroup float tile[4];
        tile[i] = x[i];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        y[i] = safe(twice(metal::exp(tile[3u - i])));
    """
    k = tf_metal_ops.metal_kernel("accepted", ["x"], ["y"], body, header=header)
    x = np.array([0.0, 0.5, 1.0, 1.5], np.float32)
    (y,) = k(inputs=[x], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)], output_dtypes=[tf.float32])
    np.testing.assert_allclose(y.numpy(), 2 * np.exp(x[::-1].astype(np.float64)), rtol=1e-6)
