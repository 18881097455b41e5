// msl_emu: counting the atomic operations a launch runs, attributed to address ranges. Part of <metal_stdlib>
// (through runtime.h); README.md "Counting atomics" explains how to use it.
//
// Conventions and invariants:
//  - counting is per launch and opt-in: Options::atomic_counts points at an AtomicCounts that holds the caller's
//    address ranges and, when the dispatch returns, the counts. Null (the default) counts nothing;
//  - what is counted, per call of <metal_stdlib>'s atomic functions (one call = one operation, whatever the CPU does
//    to implement it): `rmw` = atomic_fetch_{add,sub,and,or,xor,min,max}_explicit and atomic_exchange_explicit;
//    `cas` = atomic_compare_exchange_weak_explicit calls (attempts), `cas_failed` = those that returned false (the
//    retries of a CAS loop); `load`, `store` = atomic_load_explicit / atomic_store_explicit (not read-modify-write);
//  - attribution: an operation on object address p goes to the FIRST range, in the order given, with
//    begin <= p < end, else to `outside`. The emulated GPU's launcher gives every bound buffer as a range, so there
//    `outside` is threadgroup memory (MSL has atomics in the device and threadgroup address spaces only);
//  - thread safety: each worker OS thread counts into its own AtomicCounter (thread_local pointer; the fibers of a
//    group run on their worker's OS thread), merged into AtomicCounts when the worker has run its last group, so the
//    counts are exact for any number of workers;
//  - cost when no launch counts: one relaxed load of a process-wide integer per atomic operation, nothing in code
//    without atomics; while some launch counts, the atomics of launches that do not count also read a
//    thread_local pointer (null for them).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

namespace msl_emu {

struct AtomicTally {
  uint64_t rmw = 0;         // fetch_add/sub/and/or/xor/min/max, exchange
  uint64_t cas = 0;         // compare-exchange attempts
  uint64_t cas_failed = 0;  // attempts that failed (<= cas)
  uint64_t load = 0;        // atomic loads (not read-modify-write)
  uint64_t store = 0;       // atomic stores (not read-modify-write)

  // Read-modify-write operations: every RMW and every compare-exchange attempt.
  uint64_t atomics() const { return rmw + cas; }
  AtomicTally& operator+=(const AtomicTally& o) {
    rmw += o.rmw, cas += o.cas, cas_failed += o.cas_failed, load += o.load, store += o.store;
    return *this;
  }
};

struct AtomicRange {
  uintptr_t begin = 0, end = 0;  // [begin, end) in bytes
};

enum class AtomicOp : uint8_t { rmw, cas_ok, cas_failed, load, store };

// The caller's ranges and, after a dispatch that pointed Options::atomic_counts here, the counts of that dispatch
// (added to what the object already holds: one object can sum several dispatches).
class AtomicCounts {
 public:
  explicit AtomicCounts(std::vector<AtomicRange> ranges = {}) : ranges_(std::move(ranges)), in_range_(ranges_.size()) {
    // Elementary segments between consecutive distinct boundaries, each owned by the first range covering it.
    std::vector<uintptr_t> cuts;
    for (const AtomicRange& r : ranges_)
      if (r.begin < r.end) cuts.push_back(r.begin), cuts.push_back(r.end);
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      int owner = -1;
      for (size_t r = 0; r < ranges_.size() && owner < 0; ++r)
        if (ranges_[r].begin <= cuts[i] && cuts[i] < ranges_[r].end) owner = int(r);
      seg_begin_.push_back(cuts[i]);
      seg_owner_.push_back(owner);
    }
    if (!cuts.empty()) seg_begin_.push_back(cuts.back()), seg_owner_.push_back(-1);  // past the last range
  }

  const std::vector<AtomicRange>& ranges() const { return ranges_; }
  const std::vector<AtomicTally>& in_range() const { return in_range_; }  // one per range, in the order given
  const AtomicTally& outside() const { return outside_; }                 // in no range
  AtomicTally total() const {
    AtomicTally t = outside_;
    for (const AtomicTally& r : in_range_) t += r;
    return t;
  }

  // Index of the first range holding address p, else -1.
  int find(uintptr_t p) const {
    auto it = std::upper_bound(seg_begin_.begin(), seg_begin_.end(), p);
    if (it == seg_begin_.begin()) return -1;
    return seg_owner_[size_t(it - seg_begin_.begin()) - 1];
  }

  // Adds one worker's counts (called once per worker at the end of a dispatch).
  void merge(const std::vector<AtomicTally>& in_range, const AtomicTally& outside) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < in_range_.size(); ++i) in_range_[i] += in_range[i];
    outside_ += outside;
  }

 private:
  std::vector<AtomicRange> ranges_;
  std::vector<uintptr_t> seg_begin_;  // sorted
  std::vector<int> seg_owner_;        // range index of [seg_begin_[i], seg_begin_[i+1]), or -1
  std::vector<AtomicTally> in_range_;
  AtomicTally outside_;
  std::mutex mu_;
};

namespace detail {

// One worker's counts during a dispatch (see the header comment).
class AtomicCounter {
 public:
  explicit AtomicCounter(const AtomicCounts& layout) : layout_(layout), in_range_(layout.ranges().size()) {}
  void note(const void* p, AtomicOp op) {
    const int r = layout_.find(reinterpret_cast<uintptr_t>(p));
    AtomicTally& t = r < 0 ? outside_ : in_range_[size_t(r)];
    switch (op) {
      case AtomicOp::rmw: ++t.rmw; break;
      case AtomicOp::cas_ok: ++t.cas; break;
      case AtomicOp::cas_failed: ++t.cas, ++t.cas_failed; break;
      case AtomicOp::load: ++t.load; break;
      case AtomicOp::store: ++t.store; break;
    }
  }
  void merge_into(AtomicCounts& c) const { c.merge(in_range_, outside_); }

 private:
  const AtomicCounts& layout_;
  std::vector<AtomicTally> in_range_;
  AtomicTally outside_;
};

// Dispatches that count right now, process-wide (within this shared object: each DSO that includes msl_emu has
// its own); the fast "nothing counts" test of note_atomic.
inline std::atomic<int> counting_dispatches{0};
// This worker's counter while it runs groups of a counting dispatch, else null.
inline thread_local AtomicCounter* tls_atomic_counter = nullptr;

// Out of line and cold, so that the atomics' fast path stays one load and one branch; preserve_most (x86-64 and
// AArch64), so that a kernel calling it need not save registers around the call.
#if defined(__x86_64__) || defined(__aarch64__)
#define MSL_EMU_PRESERVE_MOST __attribute__((preserve_most))
#else
#define MSL_EMU_PRESERVE_MOST
#endif
[[gnu::noinline, gnu::cold]] MSL_EMU_PRESERVE_MOST inline void note_atomic_counting(const void* p, AtomicOp op) {
  if (AtomicCounter* c = tls_atomic_counter) c->note(p, op);
}

// Called by <metal_stdlib>'s atomic functions with the atomic object's address. Compiled with
// -DMSL_EMU_COUNT_ATOMICS=0 it does nothing (no launch counts anything): the reference build of
// bench/msl_emu_atomics_overhead.py.
#ifndef MSL_EMU_COUNT_ATOMICS
#define MSL_EMU_COUNT_ATOMICS 1
#endif
inline void note_atomic(const void* p, AtomicOp op) {
#if MSL_EMU_COUNT_ATOMICS
  if (counting_dispatches.load(std::memory_order_relaxed) != 0) [[unlikely]]
    note_atomic_counting(p, op);
#else
  (void)p, (void)op;
#endif
}

// RAII for one worker of a counting dispatch: installs its counter, merges it at the end.
class WorkerAtomicScope {
 public:
  explicit WorkerAtomicScope(AtomicCounts* counts) : counts_(counts) {
    if (counts_ == nullptr) return;
    counter_.emplace(*counts_);
    saved_ = tls_atomic_counter;
    tls_atomic_counter = &*counter_;
  }
  ~WorkerAtomicScope() {
    if (counts_ == nullptr) return;
    tls_atomic_counter = saved_;
    counter_->merge_into(*counts_);
  }
  WorkerAtomicScope(const WorkerAtomicScope&) = delete;
  WorkerAtomicScope& operator=(const WorkerAtomicScope&) = delete;

 private:
  AtomicCounts* counts_;
  std::optional<AtomicCounter> counter_;
  AtomicCounter* saved_ = nullptr;
};

// RAII for a whole counting dispatch: raises counting_dispatches while it runs.
class DispatchAtomicScope {
 public:
  explicit DispatchAtomicScope(bool counting) : counting_(counting) {
    if (counting_) counting_dispatches.fetch_add(1, std::memory_order_relaxed);
  }
  ~DispatchAtomicScope() {
    if (counting_) counting_dispatches.fetch_sub(1, std::memory_order_relaxed);
  }
  DispatchAtomicScope(const DispatchAtomicScope&) = delete;
  DispatchAtomicScope& operator=(const DispatchAtomicScope&) = delete;

 private:
  bool counting_;
};

}  // namespace detail
}  // namespace msl_emu
