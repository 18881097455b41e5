// One of several builds of a CPU kernel, chosen once per process: the best build the CPU can run, unless an
// environment variable names one (for tests and comparisons). Build 0 is the portable one, higher numbers are
// preferred. A request that cannot be honoured (an unknown name, a build not compiled in or that this CPU cannot run)
// falls back to the best runnable build below it, with a message on stderr saying why.
//
// Every op family whose CPU kernels are built for several ISAs has the same two pieces:
//   csrc/cpu/<family>_cpu_isa.h  its builds (namespace tfmo::<family>::cpu: enum Isa {kIsaDefault, kIsaAvx2, ...,
//                                kIsaCount}, IsaSelection(), g_isa_calls), the code that differs per build (vector
//                                helpers, intrinsic paths) and TFMO_<PREFIX>_BUILDS, which compiles an always-inline
//                                loop body once per build and dispatches on IsaSelection() (CountIsaCall below);
//   csrc/cpu/<family>_cpu.cc     the kernels, and at its end the choice (kIsaBuilds, the variable
//                                TF_METAL_OPS_<FAMILY>_ISA: auto, default or a build name) and the diagnostics
//                                tfmo_<family>_cpu_paths (TFMO_ISA_DIAGNOSTICS below; Python:
//                                tf_metal_ops.diagnostics.cpu_paths).
//   hash_grid  TF_METAL_OPS_HASH_GRID_ISA  default, avx2          (alias: TF_METAL_OPS_NO_AVX2 = default)
//   render     TF_METAL_OPS_RENDER_ISA     default, avx2, avx512  (alias: TF_METAL_OPS_VOLUME_RENDER_ISA; the
//                                                                  render_packed kernels run these builds too)
//   ray_march  TF_METAL_OPS_RAY_MARCH_ISA  default, avx2
//   fused_mlp  TF_METAL_OPS_FUSED_MLP_ISA  default, avx2
#pragma once

#include <atomic>

namespace tfmo {

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
