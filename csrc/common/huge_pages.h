// Transparent huge pages for large CPU output buffers (Linux).
//
// A kernel's large output is usually fresh memory: TensorFlow's CPU allocator takes it from malloc, and glibc maps
// blocks above its mmap threshold (adaptive, at most 32 MB) anew with mmap and unmaps them when they are freed, so
// every call's first write faults the buffer in 4 KB page by page (seen: 16,384 faults per call for a 64 MB output;
// on a 2-core VM about 4 us each, more than the writes themselves). Where the kernel's
// transparent-huge-page mode is "madvise" (the default of many distributions), advising the buffer's 2 MB-aligned
// interior MADV_HUGEPAGE lets those faults come 2 MB at a time. The advice changes no value and is only a hint: it
// is ignored where THP is off, and its failure is ignored. Elsewhere (macOS) it does nothing.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/tfc.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace tfmo {

// Buffers below this size are left alone (their page faults are cheap next to the work that fills them).
constexpr size_t kHugePageAdviceMin = size_t{8} << 20;

// Advises the 2 MB-aligned part of [p, p + bytes) MADV_HUGEPAGE when bytes >= kHugePageAdviceMin (Linux).
inline void AdviseHugePages(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (p == nullptr || bytes < kHugePageAdviceMin) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

// The same for a tensor's whole buffer (a CPU kernel's output, before the kernel writes it).
inline void AdviseHugePages(const TensorRef& t) {
  if (t) AdviseHugePages(t.raw(), TF_TensorByteSize(t.get()));
}

}  // namespace tfmo
