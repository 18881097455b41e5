// What the generated CUDA entry points (dev/gpu_proxy/build.py) use to call an MSL kernel: the parameter types of the
// kernel function, the MSL thread attributes computed from the CUDA launch, and dynamic shared memory for
// [[threadgroup(n)]] arguments. Include it before <metal_stdlib> (whose keyword macros would break it).
//
// Launch contract of an entry point `NAME(buffers..., threadgroup lengths..., grid_x, grid_y, grid_z)`:
//  - buffers in ascending [[buffer(n)]] order, each a pointer (a `constant T&` parameter too: a pointer to one T);
//  - one uint per [[threadgroup(n)]] parameter, ascending n: its length in bytes (Metal's
//    setThreadgroupMemoryLength); they are laid out one after another, each rounded up to 16 bytes, in dynamic
//    shared memory, whose size the launch must give (the sum of the rounded lengths);
//  - grid_x/y/z: the dispatch's threads per grid (dispatchThreads). Blocks = ceil(grid / block) per dimension;
//    the block is the threadgroup. Kernels without barriers drop the threads past the grid (Metal clips edge
//    threadgroups: they do not exist); in a kernel with barriers every thread of every block runs (dispatch such
//    kernels as whole threadgroups, as the host does: dispatchThreadgroups), and threads_per_threadgroup is the
//    block's size.
#pragma once

#include <cstdint>
#include <type_traits>

#include "gpu_proxy/cuda.h"
#include "gpu_proxy/lanes.h"  // Metal lanes on CUDA lanes

#define MSL_EMU_HALF __fp16
#pragma clang force_cuda_host_device begin
#include "msl_emu/types.h"
#pragma clang force_cuda_host_device end

namespace gpu_proxy {

template <int I, class A0, class... A>
struct Nth {
  using type = typename Nth<I - 1, A...>::type;
};
template <class A0, class... A>
struct Nth<0, A0, A...> {
  using type = A0;
};
template <class F, int I>
struct ParamOf;
template <class R, class... A, int I>
struct ParamOf<R (*)(A...), I> {
  using type = typename Nth<I, A...>::type;
};
// Parameter I of kernel function type F, and what a pointer or reference parameter points to (cv kept).
template <class F, int I>
using Param = typename ParamOf<F, I>::type;
template <class F, int I>
using Pointee = std::remove_reference_t<std::remove_pointer_t<std::remove_reference_t<Param<F, I>>>>;

struct Context {
  uint3 thread_position_in_grid, thread_position_in_threadgroup, threadgroup_position_in_grid;
  uint3 threads_per_threadgroup, dispatch_threads_per_threadgroup, threadgroups_per_grid, threads_per_grid;
  uint thread_index_in_threadgroup, threads_per_simdgroup, simdgroup_index_in_threadgroup, thread_index_in_simdgroup;
  bool in_grid;
};

__device__ inline unsigned clip(unsigned grid, unsigned group, unsigned block) {
  const unsigned start = group * block;
  return grid > start ? (grid - start < block ? grid - start : block) : 0u;
}

// The MSL attributes of the calling thread for a dispatch of `grid` threads; clipped = Metal's non-uniform edge
// threadgroups (kernels without barriers).
__device__ inline Context context(unsigned gx, unsigned gy, unsigned gz, bool clipped) {
  using namespace gpu_proxy::sreg;
  Context t;
  const uint3 ntid = {ntid_x(), ntid_y(), ntid_z()}, cta = {ctaid_x(), ctaid_y(), ctaid_z()};
  uint3 tid = {tid_x(), tid_y(), tid_z()};
  const unsigned lane = gpu_proxy::lanes::metal_lane();
  if (lane != laneid()) {  // a renumbered warp (gpu_proxy/lanes.h): this thread plays Metal thread 32 w + lane
    const unsigned linear = ((tid.x + ntid.x * (tid.y + ntid.y * tid.z)) & ~31u) | lane;
    tid = uint3{linear % ntid.x, linear / ntid.x % ntid.y, linear / (ntid.x * ntid.y)};
  }
  t.thread_position_in_threadgroup = tid;
  t.threadgroup_position_in_grid = cta;
  t.dispatch_threads_per_threadgroup = ntid;
  t.threadgroups_per_grid = uint3{nctaid_x(), nctaid_y(), nctaid_z()};
  t.threads_per_grid = uint3{gx, gy, gz};
  t.thread_position_in_grid = cta * ntid + tid;
  t.threads_per_threadgroup =
      clipped ? uint3{clip(gx, cta.x, ntid.x), clip(gy, cta.y, ntid.y), clip(gz, cta.z, ntid.z)} : ntid;
  t.thread_index_in_threadgroup = tid.x + ntid.x * (tid.y + ntid.y * tid.z);
  t.threads_per_simdgroup = 32u;
  t.simdgroup_index_in_threadgroup = t.thread_index_in_threadgroup / 32u;
  t.thread_index_in_simdgroup = lane;
  t.in_grid = t.thread_position_in_grid.x < gx && t.thread_position_in_grid.y < gy && t.thread_position_in_grid.z < gz;
  return t;
}

// An attribute of declared type T (uint, ushort; uint2/uint3 and their ushort forms) from the uint3 value.
template <class T>
__device__ inline T attribute(uint3 v) {
  using U = std::remove_cv_t<T>;
  if constexpr (::msl_emu::is_vec_v<U>) {
    U r{};
    for (int i = 0; i < ::msl_emu::count_v<U>; ++i) r[i] = ::msl_emu::elem_t<U>(v[i]);
    return r;
  } else {
    return U(v.x);
  }
}
template <class T>
__device__ inline T attribute(uint v) {
  return std::remove_cv_t<T>(v);
}

__device__ inline unsigned round16(unsigned n) { return (n + 15u) & ~15u; }

}  // namespace gpu_proxy

extern __shared__ __attribute__((aligned(16))) unsigned char gpu_proxy_threadgroup_memory[];
