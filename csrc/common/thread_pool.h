// The project's CPU thread pool. TF's intra-op pool is not reachable through the C API, so the CPU
// kernels share this one persistent pool.
//
// Invariants:
//  - Sized by TF_METAL_OPS_NUM_THREADS, else the number of CPUs this process may run on (affinity mask).
//  - Several TF executor threads may call ParallelFor at once; the caller always works on its own job,
//    so nested or concurrent calls cannot deadlock, and a job never waits on a worker that is not coming.
//  - Survives fork: the child rebuilds the pool lazily on first use. Never destroyed, so interpreter
//    exit cannot race a worker against static destructors.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

namespace tfmo {

// Threads a ParallelFor may use, the calling thread included (>= 1).
int NumThreads();

// Sets the thread count for subsequent calls (n <= 0 restores the default). Thread-safe.
void SetNumThreads(int n);

// Calls fn(begin, end) on disjoint ranges covering [0, n), each of at least `grain` items (except the last),
// on up to NumThreads() threads. Returns when all ranges are done. Chunking depends only on n, grain and
// NumThreads(): a kernel that must be bitwise deterministic across thread counts must not let its results
// depend on chunk boundaries (use ParallelParts with a fixed part count instead).
void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t begin, int64_t end)>& fn);

// Calls fn(part) for every part in [0, parts), in parallel; which thread runs which part is unspecified.
void ParallelParts(int64_t parts, const std::function<void(int64_t part)>& fn);

// The lowest index noted by any thread (-1 while none), e.g. the first invalid row found by a parallel
// validation: the error message then names the same row whatever the thread count.
class FirstIndex {
 public:
  void Note(int64_t i) {
    int64_t cur = index_.load(std::memory_order_relaxed);
    while ((cur < 0 || i < cur) && !index_.compare_exchange_weak(cur, i, std::memory_order_relaxed)) {}
  }
  int64_t get() const { return index_.load(); }

 private:
  std::atomic<int64_t> index_{-1};
};

}  // namespace tfmo

// C entry points for Python (ctypes on the loaded library).
extern "C" {
__attribute__((visibility("default"))) int tfmo_get_num_threads(void);
__attribute__((visibility("default"))) void tfmo_set_num_threads(int n);
// Totals since the library loaded: the ranges ParallelFor has run and the items they covered (a diagnostic:
// tests check how a kernel's work was split).
__attribute__((visibility("default"))) void tfmo_parallel_for_stats(long long* ranges, long long* items);
}
