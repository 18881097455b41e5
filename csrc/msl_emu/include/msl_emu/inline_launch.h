// msl_emu for inline kernels (tf_metal_ops.metal_kernel): the CPU launcher behind csrc/common/inline_kernel_abi.h
// and the bounds-checked buffer parameters of checked builds. Included by the unit that
// tf_metal_ops/inline_kernels/build.py generates per kernel source, before <metal_stdlib> (standard headers only).
//
// Invariants:
//  - threadgroups run in parallel through the caller's parallel_for; one worker runs one group at a time, so
//    kernel-scope `threadgroup` variables (static thread_local) belong to the running group;
//  - a kernel without barriers and SIMD-group functions runs each group as a plain loop over its threads, x fastest,
//    the kernel inlined into it, so the compiler can vectorise the body over a row of threads; a kernel that reaches
//    threadgroup_barrier or a SIMD-group function (in its body or a function it calls; the generator decides per
//    kernel: tf_metal_ops/msl_emu.py) runs its group as fibers (msl_emu::detail::GroupRunner, one per worker
//    thread, reused); such a call reached in the plain loop ends the process with the fast path's error;
//  - checked<T> stands for a `device`/`constant` pointer parameter in checked builds: an index outside the bound
//    buffer records the first violation of the launch (kernel, parameter, index, size, thread) and yields a
//    zeroed scratch element, so the access reads 0 and a write is discarded; the launch then fails with that
//    message. Converting a checked<T> to a plain pointer (passing it to a helper) leaves checking behind.
#pragma once

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "inline_kernel_abi.h"
#include "msl_emu/runtime.h"
#include "msl_emu/types.h"

namespace msl_emu::inline_launch {

struct Violation {
  std::atomic<bool> hit{false};
  char message[512] = {0};
};

struct ThreadState {
  Violation* violation = nullptr;
  const ThreadCtx* thread = nullptr;  // the thread running now (checked builds report it)
};
inline thread_local ThreadState tls;

[[gnu::noinline, gnu::cold]] inline void* out_of_bounds(const char* name, int64_t index, int64_t count) {
  Violation* v = tls.violation;
  bool first = false;
  if (v != nullptr && v->hit.compare_exchange_strong(first, true)) {
    const uint3 p = tls.thread ? tls.thread->thread_position_in_grid : uint3{0, 0, 0};
    std::snprintf(v->message, sizeof v->message,
                  "out-of-bounds access to '%s' at element %" PRId64 " of %" PRId64
                  " by the thread at thread_position_in_grid (%u, %u, %u)",
                  name, index, count, p.x, p.y, p.z);
  }
  alignas(64) static thread_local unsigned char scratch[256];
  std::memset(scratch, 0, sizeof scratch);
  return scratch;
}

template <class T>
struct checked {
  static_assert(sizeof(T) <= 256, "checked<T>: element types up to 256 bytes");
  T* base;
  int64_t count;   // elements in the bound buffer
  int64_t offset;  // this pointer's position in it
  const char* name;

  T& operator[](int64_t i) const {
    const int64_t j = offset + i;
    if (__builtin_expect(j < 0 || j >= count, 0)) return *static_cast<T*>(out_of_bounds(name, j, count));
    return base[j];
  }
  T& operator*() const { return (*this)[0]; }
  T* operator->() const { return &(*this)[0]; }
  checked operator+(int64_t i) const { return {base, count, offset + i, name}; }
  checked operator-(int64_t i) const { return {base, count, offset - i, name}; }
  checked& operator+=(int64_t i) { offset += i; return *this; }
  checked& operator-=(int64_t i) { offset -= i; return *this; }
  checked& operator++() { ++offset; return *this; }
  checked& operator--() { --offset; return *this; }
  operator T*() const { return base + offset; }  // into a helper function: unchecked from here on
};

template <class P>
inline P bind_slot(void* p, uint64_t bytes, const char* name) {
  if constexpr (std::is_pointer_v<P>) {
    return static_cast<P>(p);
  } else if constexpr (std::is_reference_v<P>) {
    return *static_cast<std::remove_reference_t<P>*>(p);
  } else {  // checked<T>
    using T = std::remove_pointer_t<decltype(P::base)>;
    return P{static_cast<T*>(p), static_cast<int64_t>(bytes / sizeof(T)), 0, name};
  }
}

using detail::dim;

template <class Body>
struct Job {
  Body* body;
  uint3 grid, group, groups;
  const char* kernel;  // its name, for the fiber runtime's errors
  Violation violation;
};

template <bool kChecked, class Body>
[[gnu::always_inline]] inline void run_thread(Body& body, ThreadCtx& t) {
  if constexpr (kChecked) tls.thread = &t;
  body(t);
}

// Groups [begin, end) of a kernel that needs no fibers: each group's threads in a loop, x fastest.
template <bool kChecked, class Body>
void run_direct(void* arg, int64_t begin, int64_t end) {
  auto* job = static_cast<Job<Body>*>(arg);
  if constexpr (kChecked) tls.violation = &job->violation;
  detail::tls_direct_kernel = job->kernel;  // a barrier or SIMD-group call in here: the fast path's error
  Body& body = *job->body;
  const uint3 grid = job->grid, tg = job->group, groups = job->groups;
  ThreadCtx t{};
  t.dispatch_threads_per_threadgroup = tg;
  t.threadgroups_per_grid = groups;
  t.threads_per_grid = grid;
  t.threads_per_simdgroup = detail::kSimdWidth;
  t.thread_execution_width = detail::kSimdWidth;
  const uint nd = tg.x * tg.y * tg.z;
  t.dispatch_simdgroups_per_threadgroup = (nd + 31) / 32;
  t.dispatch_quadgroups_per_threadgroup = (nd + 3) / 4;
  for (int64_t g = begin; g < end; ++g) {
    const uint3 gp = {uint(g % groups.x), uint(g / groups.x % groups.y), uint(g / groups.x / groups.y)};
    const uint3 actual = detail::group_extent(gp, tg, grid);
    const uint3 origin = gp * tg;
    t.threadgroup_position_in_grid = gp;
    t.threads_per_threadgroup = actual;
    const uint n = actual.x * actual.y * actual.z;
    t.simdgroups_per_threadgroup = (n + 31) / 32;
    t.quadgroups_per_threadgroup = (n + 3) / 4;
    for (uint z = 0; z < actual.z; ++z) {
      for (uint y = 0; y < actual.y; ++y) {
        const uint row = (z * actual.y + y) * actual.x;
        for (uint x = 0; x < actual.x; ++x) {
          t.thread_position_in_threadgroup = uint3{x, y, z};
          t.thread_position_in_grid = origin + uint3{x, y, z};
          t.thread_index_in_threadgroup = row + x;
          t.simdgroup_index_in_threadgroup = (row + x) / 32;
          t.thread_index_in_simdgroup = (row + x) % 32;
          t.quadgroup_index_in_threadgroup = (row + x) / 4;
          t.thread_index_in_quadgroup = (row + x) % 4;
          run_thread<kChecked>(body, t);
        }
      }
    }
  }
  detail::tls_direct_kernel = nullptr;
  if constexpr (kChecked) tls = {};
}

// Groups [begin, end) of a kernel with barriers or SIMD-group functions: each group as fibers on this worker's GroupRunner.
template <bool kChecked, class Body>
void run_fibers(void* arg, int64_t begin, int64_t end) {
  auto* job = static_cast<Job<Body>*>(arg);
  static const Options options = [] {
    Options o = Options::from_env();  // MSL_EMU_ORDER / MSL_EMU_SEED / MSL_EMU_STACK_KB apply
    o.workers = 1;
    o.fiber_free = false;
    return o;
  }();
  thread_local std::unique_ptr<detail::GroupRunner> runner;
  thread_local std::vector<ThreadCtx> ctx;
  if (!runner) runner = std::make_unique<detail::GroupRunner>(options);
  runner->set_kernel_name(job->kernel);
  if constexpr (kChecked) tls.violation = &job->violation;
  const uint3 grid = job->grid, tg = job->group, groups = job->groups;
  auto thread_fn = [](void* user, const ThreadCtx& t) {
    if constexpr (kChecked) tls.thread = &t;
    (*static_cast<Body*>(user))(t);
  };
  for (int64_t g = begin; g < end; ++g) {
    const uint3 gp = {uint(g % groups.x), uint(g / groups.x % groups.y), uint(g / groups.x / groups.y)};
    const uint3 actual = detail::group_extent(gp, tg, grid);
    const uint n = actual.x * actual.y * actual.z;
    ctx.resize(n);
    for (uint i = 0; i < n; ++i) detail::fill_ctx(ctx[i], i, gp, actual, tg, groups, grid);
    runner->run_group(ctx.data(), n, thread_fn, job->body, uint64_t(g));
  }
  if constexpr (kChecked) tls = {};
}

// Runs body(const ThreadCtx&) for every thread of launch's grid. 0, or non-zero with a message in error.
template <bool kFibers, bool kChecked, class Body>
int run(const TfmoInlineLaunch* launch, Body& body, const char* kernel, char* error, size_t error_len) {
  Job<Body> job;
  job.body = &body;
  job.kernel = kernel;
  job.grid = uint3{launch->grid[0], launch->grid[1], launch->grid[2]};
  job.group = uint3{launch->group[0], launch->group[1], launch->group[2]};
  for (int d = 0; d < 3; ++d) {
    if (dim(job.grid, d) == 0 || dim(job.group, d) == 0) {
      std::snprintf(error, error_len, "empty grid or threadgroup dimension (the caller skips empty grids)");
      return 1;
    }
  }
  job.groups = (job.grid + job.group - 1) / job.group;
  const int64_t total = int64_t(job.groups.x) * job.groups.y * job.groups.z;
  const int64_t per_group = int64_t(job.group.x) * job.group.y * job.group.z;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / per_group);  // >= 16k threads per task
  TfmoRangeFn fn = kFibers ? &run_fibers<kChecked, Body> : &run_direct<kChecked, Body>;
  if (total <= grain || launch->parallel_for == nullptr) {
    fn(&job, 0, total);
  } else {
    launch->parallel_for(total, grain, fn, &job);
  }
  if (job.violation.hit.load()) {
    std::snprintf(error, error_len, "%s", job.violation.message);
    return 1;
  }
  return 0;
}

}  // namespace msl_emu::inline_launch
