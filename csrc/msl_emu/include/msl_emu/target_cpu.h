// The CPU target layer of <metal_stdlib> (the default one: csrc/msl_emu/include/metal_stdlib selects it unless
// MSL_EMU_TARGET names another). Included twice by <metal_stdlib>, with MSL_EMU_TARGET_PART 1 and then 2.
//
// Conventions:
//  - part 1 (before msl_emu/stdlib_generic.h): the types, and namespace msl_emu::target: the scalar primitives
//    (libm through clang's builtins, in float: not the GPU's fast-math results, see README "Limits") and the
//    atomic operations over std::atomic, each reporting itself to msl_emu's atomic counting
//    (msl_emu/atomic_counts.h: one call = one operation; fetch_min/max are one RMW although a CAS loop implements
//    them here);
//  - part 2 (after it): threadgroup_barrier (a real rendezvous of the calling threadgroup's threads, see
//    msl_emu/runtime.h; the call site is recorded to report threads that wait at different barriers), the SIMD-group
//    functions and matrices, and the target's keywords: `threadgroup` is `static thread_local` (a kernel-scope
//    threadgroup array is shared by the threads of the group running on a worker thread, one group at a time per
//    worker, and is not reset between groups), `kernel` is nothing.
#if MSL_EMU_TARGET_PART == 1

#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <source_location>
#include <type_traits>
#include <utility>

#include "msl_emu/runtime.h"
#include "msl_emu/types.h"

namespace msl_emu::target {

#define MSL_EMU_LIBM1(name) \
  inline float name(float a) { return __builtin_##name##f(a); }
#define MSL_EMU_LIBM2(name) \
  inline float name(float a, float b) { return __builtin_##name##f(a, b); }
MSL_EMU_LIBM1(exp) MSL_EMU_LIBM1(exp2) MSL_EMU_LIBM1(log) MSL_EMU_LIBM1(log2) MSL_EMU_LIBM1(log10)
MSL_EMU_LIBM1(sin) MSL_EMU_LIBM1(cos) MSL_EMU_LIBM1(tan) MSL_EMU_LIBM1(asin) MSL_EMU_LIBM1(acos) MSL_EMU_LIBM1(atan)
MSL_EMU_LIBM1(sinh) MSL_EMU_LIBM1(cosh) MSL_EMU_LIBM1(tanh)
MSL_EMU_LIBM2(pow) MSL_EMU_LIBM2(atan2) MSL_EMU_LIBM2(fmod)
#undef MSL_EMU_LIBM1
#undef MSL_EMU_LIBM2
inline float exp10(float a) { return __builtin_powf(10.0f, a); }

template <class T>
using atomic_storage = std::atomic<T>;

template <class A, class T>
inline void atomic_store(A* obj, T desired) {
  detail::note_atomic(obj, AtomicOp::store);
  obj->v.store(desired, std::memory_order_relaxed);
}
template <class A>
inline auto atomic_load(A* obj) {
  detail::note_atomic(obj, AtomicOp::load);
  return obj->v.load(std::memory_order_relaxed);
}
template <class A, class T>
inline T atomic_exchange(A* obj, T desired) {
  detail::note_atomic(obj, AtomicOp::rmw);
  return obj->v.exchange(desired, std::memory_order_relaxed);
}
template <class A, class T>
inline bool atomic_compare_exchange_weak(A* obj, T* expected, T desired) {
  const bool ok = obj->v.compare_exchange_weak(*expected, desired, std::memory_order_relaxed, std::memory_order_relaxed);
  detail::note_atomic(obj, ok ? AtomicOp::cas_ok : AtomicOp::cas_failed);
  return ok;
}
#define MSL_EMU_ATOMIC_RMW(op)                                \
  template <class A, class T>                                 \
  inline T atomic_##op(A* obj, T arg) {                       \
    detail::note_atomic(obj, AtomicOp::rmw);                  \
    return obj->v.op(arg, std::memory_order_relaxed);         \
  }
MSL_EMU_ATOMIC_RMW(fetch_add)
MSL_EMU_ATOMIC_RMW(fetch_sub)
MSL_EMU_ATOMIC_RMW(fetch_and)
MSL_EMU_ATOMIC_RMW(fetch_or)
MSL_EMU_ATOMIC_RMW(fetch_xor)
#undef MSL_EMU_ATOMIC_RMW
// fetch_min/max: a CAS loop that stores `arg` while it replaces the current value.
template <class A, class T, class Replaces>
inline T atomic_fetch_extremum(A* obj, T arg, Replaces replaces) {
  detail::note_atomic(obj, AtomicOp::rmw);
  auto cur = obj->v.load(std::memory_order_relaxed);
  while (replaces(arg, cur) && !obj->v.compare_exchange_weak(cur, arg, std::memory_order_relaxed)) {
  }
  return cur;
}
template <class A, class T>
inline T atomic_fetch_max(A* obj, T arg) {
  return atomic_fetch_extremum(obj, arg, [](T a, T cur) { return cur < a; });
}
template <class A, class T>
inline T atomic_fetch_min(A* obj, T arg) {
  return atomic_fetch_extremum(obj, arg, [](T a, T cur) { return a < cur; });
}

}  // namespace msl_emu::target

#elif MSL_EMU_TARGET_PART == 2

static_assert(std::atomic<int>::is_always_lock_free && std::atomic<uint>::is_always_lock_free &&
              std::atomic<float>::is_always_lock_free, "msl_emu's atomics must be lock-free to alias device memory");

namespace metal {
inline void threadgroup_barrier(mem_flags, std::source_location site = std::source_location::current()) {
  ::msl_emu::detail::GroupRunner* r = ::msl_emu::detail::tls_runner;
  if (r == nullptr) ::msl_emu::detail::no_group_runner("threadgroup_barrier", site);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  r->barrier(site);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}
}  // namespace metal

#include "msl_emu/simdgroup.h"         // simd_*, quad_*, simdgroup_barrier
#include "msl_emu/simdgroup_matrix.h"  // simdgroup_matrix, simdgroup_load/store/multiply(_accumulate)

#define threadgroup static thread_local
#define kernel

#endif
