// Device memory of the emulated GPU: the reservation, allocations and epochs (device_memory.h).
#include "device_memory.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <algorithm>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <set>

#include "device_messages.h"

namespace tfmo_emu __attribute__((visibility("hidden"))) {
namespace {

constexpr uint64_t kAlign = 256;
constexpr uint64_t kGuard = 4096;  // unmapped-to-anything gap after every allocation
constexpr uint64_t kLive = ~0ull;  // Alloc::freed_epoch of an allocation not deallocated
constexpr uint64_t kDefaultMemoryMb = 8192;
constexpr size_t kFreedRing = 1024;

struct Alloc {
  uint64_t size = 0;
  uint64_t span = 0;  // reserved address bytes (size rounded up + guard)
  void* host = nullptr;
  uint64_t freed_epoch = kLive;
};

struct FreedRange {
  uintptr_t start = 0;
  uint64_t size = 0;
};

// The reserved range, read by the signal handler (plain words written once before the handler is installed).
volatile uintptr_t g_reserve_base = 0;
volatile uint64_t g_reserve_size = 0;

struct Memory {
  std::mutex mu;  // guards everything below
  uint64_t limit = 0;
  uint64_t cursor = 0;  // next-fit offset into the reservation
  bool wrapped_warned = false;
  std::map<uintptr_t, Alloc> allocs;   // live and deallocated-but-not-yet-freed, by device start address
  std::deque<uintptr_t> pending_free;  // deallocated, host memory held, in deallocation (epoch) order
  std::multiset<uint64_t> pending_epochs;
  uint64_t epoch = 0;
  FreedRange freed[kFreedRing];
  uint64_t freed_count = 0;
  uint64_t held_bytes = 0, peak_held_bytes = 0, live_allocs = 0, live_bytes = 0, total_allocs = 0,
           total_alloc_bytes = 0, failed_allocs = 0, bad_frees = 0, largest_alloc = 0, deferred_frees = 0;
};

Memory& M() {
  static Memory* m = new Memory;  // never destroyed: worker threads and TF may outlive static destructors
  return *m;
}

void ReclaimLocked(Memory& m) {
  uint64_t min_pending = m.pending_epochs.empty() ? kLive : *m.pending_epochs.begin();
  while (!m.pending_free.empty()) {
    auto it = m.allocs.find(m.pending_free.front());
    if (it == m.allocs.end()) {  // cannot happen; keep going rather than spin
      m.pending_free.pop_front();
      continue;
    }
    if (!(it->second.freed_epoch < min_pending)) break;
    free(it->second.host);
    m.held_bytes -= it->second.size;
    m.freed[m.freed_count % kFreedRing] = FreedRange{it->first, it->second.size};
    ++m.freed_count;
    ++m.deferred_frees;
    m.allocs.erase(it);
    m.pending_free.pop_front();
  }
}

}  // namespace

uint64_t RegisterEpoch() {
  Memory& m = M();
  std::lock_guard<std::mutex> l(m.mu);
  m.pending_epochs.insert(m.epoch);
  return m.epoch;
}

void UnregisterEpoch(uint64_t epoch) {
  Memory& m = M();
  std::lock_guard<std::mutex> l(m.mu);
  auto it = m.pending_epochs.find(epoch);
  if (it != m.pending_epochs.end()) m.pending_epochs.erase(it);
  ReclaimLocked(m);
}

void* Resolve(uintptr_t addr, uint64_t bytes, uint64_t epoch, std::string* err) {
  Memory& m = M();
  std::lock_guard<std::mutex> l(m.mu);
  auto it = m.allocs.upper_bound(addr);
  if (it != m.allocs.begin()) {
    --it;
    const Alloc& a = it->second;
    uint64_t off = addr - it->first;
    if (off < a.size || off == 0) {
      if (bytes > a.size - off) {
        *err = "device range [" + Hex(addr) + ", +" + std::to_string(bytes) + " bytes) overruns its allocation of " +
               std::to_string(a.size) + " bytes at " + Hex(it->first);
        return nullptr;
      }
      if (a.freed_epoch != kLive && (epoch == kNoWork || epoch > a.freed_epoch)) {
        *err = "use after free: device address " + Hex(addr) + " is in an allocation of " + std::to_string(a.size) +
               " bytes at " + Hex(it->first) + " that was deallocated before this work was created";
        return nullptr;
      }
      return static_cast<char*>(a.host) + off;
    }
  }
  uint64_t n = std::min<uint64_t>(m.freed_count, kFreedRing);
  for (uint64_t i = 0; i < n; ++i) {
    const FreedRange& f = m.freed[i];
    if (addr >= f.start && (addr - f.start < f.size || addr == f.start)) {
      *err = "use after free: device address " + Hex(addr) + " is in an allocation of " + std::to_string(f.size) +
             " bytes at " + Hex(f.start) + " that has been freed";
      return nullptr;
    }
  }
  if (addr >= g_reserve_base && addr - g_reserve_base < g_reserve_size) {
    *err = "device address " + Hex(addr) + " is not inside any live allocation (freed or never allocated)";
  } else {
    *err = "address " + Hex(addr) + " is not device memory of this device";
  }
  return nullptr;
}

std::string InitMemory() {
  static std::once_flag once;
  static std::string error;
  std::call_once(once, [] {
    Memory& m = M();
    uint64_t mb = kDefaultMemoryMb;
    const char* env = getenv("TF_METAL_OPS_EMULATED_GPU_MEMORY_MB");
    if (env == nullptr) env = getenv("TF_METAL_OPS_EMU_MEMORY_MB");  // the deprecated name
    if (env != nullptr) {
      char* end = nullptr;
      errno = 0;
      unsigned long long v = strtoull(env, &end, 10);
      if (errno != 0 || end == env || *end != '\0' || v == 0 || v > (1ull << 30)) {
        LogError(std::string("ignoring TF_METAL_OPS_EMULATED_GPU_MEMORY_MB=\"") + env + "\" (want a positive number of MiB)");
      } else {
        mb = v;
      }
    }
    m.limit = mb << 20;
    // Several TiB of address space (nothing is committed); smaller if the address space is limited.
    for (uint64_t gib : {4096ull, 1024ull, 256ull, 64ull, 16ull}) {
      uint64_t bytes = gib << 30;
      if (bytes < m.limit * 2 && gib != 16) continue;
      void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p != MAP_FAILED) {
        g_reserve_base = reinterpret_cast<uintptr_t>(p);
        g_reserve_size = bytes;
        break;
      }
    }
    if (g_reserve_base == 0) error = "could not reserve address space for device memory";
  });
  return error;
}

void* AllocateDevice(uint64_t size) {
  Memory& m = M();
  uint64_t host_bytes = AlignUp(std::max<uint64_t>(size, 1), 64);
  uint64_t span = AlignUp(std::max<uint64_t>(size, 1), kAlign) + kGuard;
  {
    std::lock_guard<std::mutex> l(m.mu);
    if (size > m.limit || m.held_bytes > m.limit - size) {
      ++m.failed_allocs;
      return nullptr;
    }
  }
  void* host = nullptr;
  if (posix_memalign(&host, 64, host_bytes) != 0) {
    std::lock_guard<std::mutex> l(m.mu);
    ++m.failed_allocs;
    return nullptr;
  }
  memset(host, 0xFF, host_bytes);
  std::lock_guard<std::mutex> l(m.mu);
  if (size > m.limit || m.held_bytes > m.limit - size || span > g_reserve_size) {
    ++m.failed_allocs;
    free(host);
    return nullptr;
  }
  // Next fit from the cursor; wrap around once when the end of the reservation is reached.
  uint64_t found = kLive;
  for (int pass = 0; pass < 2 && found == kLive; ++pass) {
    uint64_t cand = AlignUp(pass == 0 ? m.cursor : 0, kAlign);
    while (cand + span <= g_reserve_size) {
      uintptr_t a = g_reserve_base + cand;
      auto it = m.allocs.lower_bound(a);
      if (it != m.allocs.begin()) {
        auto prev = std::prev(it);
        if (prev->first + prev->second.span > a) {
          cand = AlignUp(prev->first + prev->second.span - g_reserve_base, kAlign);
          continue;
        }
      }
      if (it != m.allocs.end() && it->first < a + span) {
        cand = AlignUp(it->first + it->second.span - g_reserve_base, kAlign);
        continue;
      }
      found = cand;
      break;
    }
    if (found == kLive && pass == 0 && !m.wrapped_warned) {
      m.wrapped_warned = true;
      LogError("device address space exhausted once; reusing freed ranges from now on");
    }
  }
  if (found == kLive) {
    ++m.failed_allocs;
    free(host);
    return nullptr;
  }
  m.cursor = found + span;
  uintptr_t dev = g_reserve_base + found;
  Alloc& al = m.allocs[dev];
  al.size = size;
  al.span = span;
  al.host = host;
  al.freed_epoch = kLive;
  m.held_bytes += size;
  m.peak_held_bytes = std::max(m.peak_held_bytes, m.held_bytes);
  ++m.live_allocs;
  m.live_bytes += size;
  ++m.total_allocs;
  m.total_alloc_bytes += size;
  m.largest_alloc = std::max(m.largest_alloc, size);
  return reinterpret_cast<void*>(dev);
}

void DeallocateDevice(void* ptr) {
  if (ptr == nullptr) return;
  Memory& m = M();
  std::lock_guard<std::mutex> l(m.mu);
  auto it = m.allocs.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == m.allocs.end() || it->second.freed_epoch != kLive) {
    ++m.bad_frees;
    LogError("deallocate of " + Hex(reinterpret_cast<uintptr_t>(ptr)) +
             (it == m.allocs.end() ? ", which is not the start of an allocation" : ", which was already deallocated"));
    return;
  }
  it->second.freed_epoch = m.epoch++;
  --m.live_allocs;
  m.live_bytes -= it->second.size;
  m.pending_free.push_back(it->first);
  ReclaimLocked(m);
}

MemoryStats GetMemoryStats() {
  Memory& m = M();
  std::lock_guard<std::mutex> l(m.mu);
  MemoryStats s;
  s.limit = m.limit;
  s.held_bytes = m.held_bytes;
  s.peak_held_bytes = m.peak_held_bytes;
  s.live_allocs = m.live_allocs;
  s.live_bytes = m.live_bytes;
  s.total_allocs = m.total_allocs;
  s.total_alloc_bytes = m.total_alloc_bytes;
  s.failed_allocs = m.failed_allocs;
  s.bad_frees = m.bad_frees;
  s.largest_alloc = m.largest_alloc;
  s.deferred_frees = m.deferred_frees;
  s.pending_frees = m.pending_free.size();
  s.pending_work_items = m.pending_epochs.size();
  s.reserve_base = g_reserve_base;
  s.reserve_size = g_reserve_size;
  return s;
}

int64_t ReportUnfreed(int max_listed) {
  Memory& m = M();
  std::lock_guard<std::mutex> l(m.mu);
  int n = 0;
  for (auto& kv : m.allocs) {
    if (n++ >= max_listed) break;
    LogError("not freed: " + std::to_string(kv.second.size) + " bytes at " + Hex(kv.first) +
             (kv.second.freed_epoch == kLive ? " (live)" : " (deallocated, waiting for pending work)"));
  }
  return static_cast<int64_t>(m.allocs.size());
}

bool InReservation(uintptr_t addr) {
  uintptr_t base = g_reserve_base;
  uint64_t size = g_reserve_size;
  return base != 0 && addr >= base && addr - base < size;
}

FaultAddressInfo LookUpFaultAddress(uintptr_t addr) {
  FaultAddressInfo info;
  Memory& m = M();
  if (!m.mu.try_lock()) return info;
  info.looked_up = true;
  auto it = m.allocs.upper_bound(addr);
  if (it != m.allocs.begin()) {
    --it;
    if (addr - it->first < std::max<uint64_t>(it->second.size, 1)) {
      info.in_allocation = true;
      info.start = it->first;
      info.size = it->second.size;
      info.deallocated = it->second.freed_epoch != kLive;
    }
  }
  m.mu.unlock();
  return info;
}

}  // namespace tfmo_emu
