// One of several builds of a CPU kernel, chosen once per process: the best build the CPU can run, unless an
// environment variable names one (for tests and comparisons). Build 0 is the portable one, higher numbers are
// preferred. A request that cannot be honoured (an unknown name, a build not compiled in or that this CPU cannot run)
// falls back to the best runnable build below it, with a message on stderr saying why.
//
// The builds are the same for every family: default (the baseline ISA), avx2 (x86-64-v3: AVX2, FMA, F16C, BMI1/2,
// MOVBE), avx512 (x86-64-v4), avx512bf16 (x86-64-v4 and AVX512-BF16) and amx (avx512bf16's and AMX-TILE with
// AMX-BF16, which Linux lends a process only on request: X86BuildRuns asks); a family has the first kIsaCount of them. The x86-64 builds are compiled by GCC on
// x86-64 (TFMO_ISA_X86_BUILDS); other compilers and targets compile the default build only. A function compiled for
// a build is marked TFMO_ISA(avx2), TFMO_ISA(avx512), TFMO_ISA(avx512bf16) or TFMO_ISA(amx), the one ISA-variant
// marker:
//   - a build's entry point is TFMO_ISA(build) __attribute__((noinline)) (GCC inlines a function only into a
//     caller whose ISA includes the callee's), or the RunIsaBuild below, which compiles an always-inline body
//     once per build;
//   - its helpers are TFMO_FN TFMO_ISA(build), so that they inline into the entry point.
// The library is built with -ffp-contract=off, and every build of a kernel does the same float operations in the
// same order, so the builds give bitwise identical results (each family's tests run every build and compare). The
// one exception is the amx build's bfloat16 products (TDPBF16PS, whose internal rounding Intel does not document:
// csrc/cpu/fused_mlp_cpu_isa.h).
//
// Every op family whose CPU kernels are built for several ISAs has the same two pieces:
//   csrc/cpu/<family>_cpu_isa.h  its builds (namespace tfmo::<family>::cpu: kIsaCount, IsaSelection(),
//                                g_isa_calls) and the code that differs per build (vector helpers, intrinsic paths);
//   csrc/cpu/<family>_cpu.cc     the kernels, and at its end the choice (kIsaBuilds = FamilyIsaBuilds(the variable
//                                TF_METAL_OPS_<FAMILY>_ISA: auto, default or a build name, ...)) and the diagnostics
//                                tfmo_<family>_cpu_paths (TFMO_ISA_DIAGNOSTICS below; Python:
//                                tf_metal_ops.diagnostics.cpu_paths).
//   hash_grid  TF_METAL_OPS_HASH_GRID_ISA  default, avx2          (alias: TF_METAL_OPS_NO_AVX2 = default)
//   render     TF_METAL_OPS_RENDER_ISA     default, avx2, avx512  (alias: TF_METAL_OPS_VOLUME_RENDER_ISA; the
//                                                                  render_packed kernels run these builds too)
//   ray_march  TF_METAL_OPS_RAY_MARCH_ISA  default, avx2
//   fused_mlp  TF_METAL_OPS_FUSED_MLP_ISA  default, avx2, avx512, avx512bf16, amx
#pragma once

#include <atomic>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TFMO_ISA_X86_BUILDS 1
#endif
#define TFMO_ISA(build) TFMO_ISA_##build
#define TFMO_ISA_avx2 __attribute__((target("arch=x86-64-v3")))
#define TFMO_ISA_avx512 __attribute__((target("arch=x86-64-v4")))
#define TFMO_ISA_avx512bf16 __attribute__((target("arch=x86-64-v4,avx512bf16")))
#define TFMO_ISA_amx __attribute__((target("arch=x86-64-v4,avx512bf16,amx-tile,amx-bf16")))

namespace tfmo {

enum IsaBuild : int { kIsaDefault = 0, kIsaAvx2 = 1, kIsaAvx512 = 2, kIsaAvx512Bf16 = 3, kIsaAmx = 4 };
inline constexpr const char* kIsaBuildNames[] = {"default", "avx2", "avx512", "avx512bf16", "amx"};

// Whether this CPU (and OS) can run build isa >= 1, and why not (messages).
bool X86BuildRuns(int isa);
const char* X86BuildLacks(int isa);

struct IsaChoice {
  int selected;    // the build that runs
  int requested;   // from the variable; -1: unset or "auto", -2: not a known name
  bool fell_back;  // the request could not be honoured
};

struct IsaBuilds {
  const char* env;           // the variable, e.g. "TF_METAL_OPS_RAY_MARCH_ISA"
  const char* kernels;       // for messages, e.g. "the ray-march CPU kernel uses"
  const char* const* names;  // names[0 .. count): build names, "default" first
  int count;
  int built;                 // builds [0, built) are compiled into this library (1: only the portable one)
  bool (*cpu_runs)(int);     // whether this CPU (and OS) can run built build isa >= 1
  const char* not_built;     // why a build that is not compiled in cannot run
  const char* (*lacks)(int); // why a built build cannot run on this CPU
  // A second variable: when `env` is unset (or empty) and `alias` is set, the request is `alias_request` (e.g.
  // TF_METAL_OPS_NO_AVX2, set to anything, for TF_METAL_OPS_HASH_GRID_ISA=default), or the alias's value when
  // alias_request is null (TF_METAL_OPS_VOLUME_RENDER_ISA for TF_METAL_OPS_RENDER_ISA).
  const char* alias = nullptr;
  const char* alias_request = nullptr;
};

IsaChoice ChooseIsa(const IsaBuilds& b);

// The builds [0, count) of a family: env, kernels, alias and alias_request as in IsaBuilds.
constexpr IsaBuilds FamilyIsaBuilds(const char* env, const char* kernels, int count, const char* alias = nullptr,
                                    const char* alias_request = nullptr) {
#ifdef TFMO_ISA_X86_BUILDS
  const int built = count;
#else
  const int built = 1;
#endif
  return IsaBuilds{env, kernels, kIsaBuildNames, count, built, &X86BuildRuns,
                   "that build is not compiled into this library (x86-64 GCC only)", &X86BuildLacks, alias,
                   alias_request};
}

// The choice for the builds B, made once per process (at the first call).
template <const IsaBuilds& B>
const IsaChoice& ChosenIsa() {
  static const IsaChoice choice = ChooseIsa(B);
  return choice;
}

// The build that this call runs (c.selected), counted in calls[build] (the calls of the family's diagnostics).
inline int CountIsaCall(const IsaChoice& c, std::atomic<long long>* calls) {
  calls[c.selected].fetch_add(1, std::memory_order_relaxed);
  return c.selected;
}

// Runs f(std::integral_constant<int, isa>{}) compiled for build isa (< kCount): f is a generic lambda marked
// TFMO_FN_LAMBDA (shared/device_compat.h) that calls an always-inline body, which is thereby compiled once per build.
// Each build's instance is a function of its own, never inlined into the caller.
template <class F>
__attribute__((noinline)) void RunIsaDefault(const F& f) {
  f(std::integral_constant<int, kIsaDefault>{});
}
#ifdef TFMO_ISA_X86_BUILDS
template <class F>
TFMO_ISA(avx2) __attribute__((noinline)) void RunIsaAvx2(const F& f) {
  f(std::integral_constant<int, kIsaAvx2>{});
}
template <class F>
TFMO_ISA(avx512) __attribute__((noinline)) void RunIsaAvx512(const F& f) {
  f(std::integral_constant<int, kIsaAvx512>{});
}
template <class F>
TFMO_ISA(avx512bf16) __attribute__((noinline)) void RunIsaAvx512Bf16(const F& f) {
  f(std::integral_constant<int, kIsaAvx512Bf16>{});
}
#endif
template <int kCount, class F>
void RunIsaBuild(int isa, const F& f) {
  static_assert(kCount <= kIsaAmx, "RunIsaBuild compiles no amx build (the fused MLP's products dispatch by hand)");
#ifdef TFMO_ISA_X86_BUILDS
  if constexpr (kCount > kIsaAvx512Bf16) {
    if (isa == kIsaAvx512Bf16) return RunIsaAvx512Bf16(f);
  }
  if constexpr (kCount > kIsaAvx512) {
    if (isa == kIsaAvx512) return RunIsaAvx512(f);
  }
  if constexpr (kCount > kIsaAvx2) {
    if (isa == kIsaAvx2) return RunIsaAvx2(f);
  }
#endif
  (void)isa;
  RunIsaDefault(f);
}

// Build isa is compiled in / compiled in and runnable on this CPU (build 0 always is).
bool IsaBuilt(const IsaBuilds& b, int isa);
bool IsaSupported(const IsaBuilds& b, int isa);

// Fills the diagnostics of a family (the arguments of its extern "C" tfmo_<family>_cpu_paths): calls[isa] from
// counts[isa] (calls so far that ran each build); built / supported: bit isa set when that build is compiled in /
// runnable on this CPU; selected: the build in use; requested: the requested build (-1 unset or auto, -2 not a
// known name); fell_back: 1 when the request could not be honoured.
void ReportIsa(const IsaBuilds& b, const IsaChoice& c, const std::atomic<long long>* counts, long long* calls,
               int* built, int* supported, int* selected, int* requested, int* fell_back);

}  // namespace tfmo

// Defines the family's diagnostics, extern "C" NAME(calls, built, supported, selected, requested, fell_back) (read
// with ctypes by tf_metal_ops.diagnostics.cpu_paths): ReportIsa of the builds BUILDS, the choice CHOICE and the call
// counters COUNTS.
#define TFMO_ISA_DIAGNOSTICS(NAME, BUILDS, CHOICE, COUNTS)                                                      \
  extern "C" __attribute__((visibility("default"))) void NAME(long long* calls, int* built, int* supported,     \
                                                              int* selected, int* requested, int* fell_back) { \
    tfmo::ReportIsa(BUILDS, CHOICE, COUNTS, calls, built, supported, selected, requested, fell_back);          \
  }

// Declares, in a family's namespace (csrc/cpu/<family>_cpu_isa.h), its builds [0, COUNT), the choice IsaSelection()
// and the call counters g_isa_calls (one relaxed increment per dispatched call, reported by the family's diagnostics:
// lets a test prove which build ran), all three defined by TFMO_ISA_FAMILY.
#define TFMO_ISA_FAMILY_BUILDS(COUNT)        \
  constexpr int kIsaCount = COUNT;           \
  const ::tfmo::IsaChoice& IsaSelection();   \
  extern std::atomic<long long> g_isa_calls[kIsaCount]

// A family's choice of build, at the end of its csrc/cpu/<family>_cpu.cc: in namespace NS (which declares kIsaCount,
// IsaSelection() and g_isa_calls, csrc/cpu/<family>_cpu_isa.h) the builds FamilyIsaBuilds(...), the call counters
// and IsaSelection() (the choice, made at the first call of the process); and its diagnostics DIAG.
#define TFMO_ISA_FAMILY(NS, DIAG, ...)                                                          \
  namespace NS {                                                                                \
  namespace {                                                                                   \
  constexpr ::tfmo::IsaBuilds kIsaBuilds = ::tfmo::FamilyIsaBuilds(__VA_ARGS__);                \
  }                                                                                             \
  std::atomic<long long> g_isa_calls[kIsaCount];                                                \
  const ::tfmo::IsaChoice& IsaSelection() { return ::tfmo::ChosenIsa<kIsaBuilds>(); }          \
  }                                                                                             \
  TFMO_ISA_DIAGNOSTICS(DIAG, NS::kIsaBuilds, NS::IsaSelection(), NS::g_isa_calls)
