// The choice between the scalar and the AVX2 march of the RayMarch CPU kernel (csrc/cpu/ray_march_avx2.h), once
// per process, and its diagnostics (tfmo_ray_march_cpu_paths).
#include <atomic>

#include "cpu/ray_march_avx2.h"

#ifdef TFMO_RM_AVX2
#include <cpuid.h>
#endif

namespace tfmo::rm_cpu {

namespace {

const char* const kRmIsaNames[kRmIsaCount] = {"default", "avx2"};

#ifdef TFMO_RM_AVX2
constexpr int kRmBuilt = kRmIsaCount;
#else
constexpr int kRmBuilt = 1;
#endif

// AVX2 usable: the CPU has it (CPUID 7.0:EBX bit 5) and the OS saves the YMM registers (OSXSAVE, XCR0 bits 1-2).
// CPUID directly rather than __builtin_cpu_supports, which needs compiler-rt on some clang targets.
bool CpuHasAvx2() {
#ifdef TFMO_RM_AVX2
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX)) return false;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 6u) != 6u) return false;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (b & bit_AVX2) != 0;
#else
  return false;
#endif
}

constexpr IsaBuilds kRmIsaBuilds{
    "TF_METAL_OPS_RAY_MARCH_ISA", "the ray-march CPU kernel uses", kRmIsaNames, kRmIsaCount, kRmBuilt,
    [](int) { return CpuHasAvx2(); }, "that build is not compiled into this library (x86-64 GCC/clang only)",
    [](int) { return "this CPU (or OS) lacks AVX2"; }};

}  // namespace

std::atomic<long long> g_rm_path_calls[kRmIsaCount];

// TF_METAL_OPS_RAY_MARCH_ISA (avx2, default or auto), read once (the first march or diagnostics query of the
// process); the rules: common/isa_choice.h (automatically AVX2 when the CPU has it).
const RmIsaChoice& RmIsaSelection() { return ChosenIsa<kRmIsaBuilds>(); }

}  // namespace tfmo::rm_cpu

// Diagnostics (ctypes, tf_metal_ops.backend.cpu_paths; tests/test_ray_march_isa.py): the arguments as
// tfmo::ReportIsa (common/isa_choice.h), builds default, avx2; calls: chunk marches.
TFMO_ISA_DIAGNOSTICS(tfmo_ray_march_cpu_paths, tfmo::rm_cpu::kRmIsaBuilds, tfmo::rm_cpu::RmIsaSelection(),
                     tfmo::rm_cpu::g_rm_path_calls)
