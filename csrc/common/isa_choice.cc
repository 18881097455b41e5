#include "common/isa_choice.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#ifdef TFMO_ISA_X86_BUILDS
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace tfmo {

#ifdef TFMO_ISA_X86_BUILDS
namespace {
// Linux lends AMX's tile data (XSAVE feature 18) to a process only after arch_prctl(ARCH_REQ_XCOMP_PERM) (Linux >=
// 5.16); without it the first tile instruction faults. Asked once; the grant covers every thread of the process.
bool AmxTileDataGranted() {
  static const bool granted = [] {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
}
}  // namespace
#endif

bool X86BuildRuns(int isa) {
#ifdef TFMO_ISA_X86_BUILDS
  __builtin_cpu_init();
  if (isa == kIsaAmx)
    return X86BuildRuns(kIsaAvx512Bf16) && __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
           AmxTileDataGranted();
  if (isa == kIsaAvx512Bf16) return __builtin_cpu_supports("x86-64-v4") && __builtin_cpu_supports("avx512bf16");
  return isa == kIsaAvx512 ? __builtin_cpu_supports("x86-64-v4") : __builtin_cpu_supports("x86-64-v3");
#else
  (void)isa;
  return false;
#endif
}

const char* X86BuildLacks(int isa) {
  if (isa == kIsaAmx)
    return "this CPU lacks AMX-BF16 with AVX512-BF16 (amx-tile, amx-bf16, avx512bf16), or the OS did not grant "
           "the tile data (Linux >= 5.16, arch_prctl ARCH_REQ_XCOMP_PERM)";
  if (isa == kIsaAvx512Bf16) return "this CPU lacks AVX-512 with AVX512-BF16 (x86-64-v4 and avx512bf16)";
  return isa == kIsaAvx512 ? "this CPU lacks AVX-512 (x86-64-v4: avx512f/bw/cd/dq/vl)"
                           : "this CPU lacks AVX2 (x86-64-v3: avx2/fma/bmi/bmi2/f16c/movbe)";
}

bool IsaBuilt(const IsaBuilds& b, int isa) { return isa >= 0 && isa < b.built && isa < b.count; }

bool IsaSupported(const IsaBuilds& b, int isa) { return IsaBuilt(b, isa) && (isa == 0 || b.cpu_runs(isa)); }

IsaChoice ChooseIsa(const IsaBuilds& b) {
  int best = 0;
  for (int isa = b.count - 1; isa > 0; --isa)
    if (IsaSupported(b, isa)) {
      best = isa;
      break;
    }
  IsaChoice c{best, -1, false};
  const char* var = b.env;  // the variable the request comes from, for messages
  const char* env = std::getenv(b.env);
  if ((env == nullptr || env[0] == '\0') && b.alias != nullptr && std::getenv(b.alias) != nullptr) {
    env = b.alias_request != nullptr ? b.alias_request : std::getenv(b.alias);
    if (b.alias_request == nullptr) var = b.alias;
  }
  if (env == nullptr || env[0] == '\0' || std::strcmp(env, "auto") == 0) return c;
  for (int isa = 0; isa < b.count; ++isa)
    if (std::strcmp(env, b.names[isa]) == 0) c.requested = isa;
  if (c.requested == -1) {
    std::string known;
    for (int isa = b.count - 1; isa >= 0; --isa) known += std::string(b.names[isa]) + ", ";
    c.requested = -2;
    c.fell_back = true;
    std::fprintf(stderr, "tf_metal_ops: error: %s=%s is not one of %sauto; %s the %s build\n", var, env,
                 known.c_str(), b.kernels, b.names[best]);
    return c;
  }
  if (IsaSupported(b, c.requested)) {
    c.selected = c.requested;
    return c;
  }
  int fallback = 0;
  for (int isa = c.requested - 1; isa > 0; --isa)
    if (IsaSupported(b, isa)) {
      fallback = isa;
      break;
    }
  c.selected = fallback;
  c.fell_back = true;
  std::fprintf(stderr, "tf_metal_ops: error: %s=%s: %s; %s the %s build instead\n", var, env,
               !IsaBuilt(b, c.requested) ? b.not_built : b.lacks(c.requested), b.kernels, b.names[fallback]);
  return c;
}

void ReportIsa(const IsaBuilds& b, const IsaChoice& c, const std::atomic<long long>* counts, long long* calls,
               int* built, int* supported, int* selected, int* requested, int* fell_back) {
  *built = *supported = 0;
  for (int isa = 0; isa < b.count; ++isa) {
    calls[isa] = counts[isa].load();
    if (IsaBuilt(b, isa)) *built |= 1 << isa;
    if (IsaSupported(b, isa)) *supported |= 1 << isa;
  }
  *selected = c.selected;
  *requested = c.requested;
  *fell_back = c.fell_back ? 1 : 0;
}

}  // namespace tfmo
