// The CUDA target layer of <metal_stdlib> (csrc/msl_emu/include/metal_stdlib), for clang++-16 in CUDA mode: an
// unchanged .metal file compiles to PTX (dev/gpu_proxy/build.py builds every metal_kernels/*.metal with it: its
// generated unit defines MSL_EMU_TARGET as "gpu_proxy/target.h" before including <metal_stdlib>). Development only:
// never shipped. Included twice by <metal_stdlib>, with MSL_EMU_TARGET_PART 1 and then 2; everything else is
// msl_emu's generic part.
//
// Conventions:
//  - __METAL_VERSION__ is MSL_EMU_VERSION (default 300 = MSL 3.0, native float atomics); -DMSL_EMU_VERSION=240
//    selects MSL 2.4, which has no atomic_float (the kernels' compare-and-swap loop then runs), as in msl_emu;
//  - `device`, `thread` expand to nothing, `constant` to `const` (the generated entry point passes constant buffers
//    as `const T* __restrict__`, read through the non-coherent cache); `threadgroup` storage is __shared__;
//    pointers to threadgroup memory are plain (generic) pointers: msl_emu's staging rewrites them to MSL_EMU_TGP;
//    [[threadgroup(n)]] arguments are carved out of dynamic shared memory by the entry point; `kernel` is
//    always_inline (an entry point on Metal: no call from the generated __global__);
//  - function constants are declared by the build (dev/gpu_proxy/build.py) as __constant__ globals of the same name,
//    set by the host before a launch (CUDA: the module global; Metal folds them when the pipeline is made, so a
//    branch on one costs a uniform load here); is_function_constant_defined(x) is true;
//  - half is __fp16 (NVPTX in clang 16 has no _Float16): stored as IEEE binary16, arithmetic in float, rounded when
//    stored (msl_emu on the CPU: per operation);
//  - scalar primitives (namespace msl_emu::target): the GPU's approximate transcendental instructions where Metal's
//    default fast math uses approximations too: exp/exp2/exp10/log/log2/log10/pow/powr (ex2.approx, lg2.approx),
//    sin/cos/tan (sin.approx, cos.approx); sqrt and division are IEEE (sqrt.rn, div.rn); fma is one rounding; no
//    contraction (-ffp-contract=off, as the metallibs). Functions without a counterpart here (asin, acos, atan,
//    atan2, sinh, cosh, tanh, fmod) fail to compile when a kernel uses them, naming the function;
//  - atomics are the __atomic builtins on the value (atom.global.add.f32, atom.cas.b32, ...), relaxed, GPU scope;
//  - threadgroup_barrier is bar.sync 0 (it orders threadgroup and device memory within the threadgroup);
//  - the SIMD-group functions: gpu_proxy/simdgroup.h (a subset, scalar types); SIMD-group matrices:
//    gpu_proxy/simdgroup_matrix.h (float and half 8x8, half products on the tensor cores);
//  - part 1 opens `#pragma clang force_cuda_host_device`, part 2 closes it before the keyword macros.
#if MSL_EMU_TARGET_PART == 1

#include "gpu_proxy/cuda.h"

#define MSL_EMU_HALF __fp16
#pragma clang force_cuda_host_device begin
#include "msl_emu/types.h"

namespace msl_emu::target {

template <class T>
inline constexpr bool missing = false;
inline float exp2(float a) { return __nvvm_ex2_approx_f(a); }
inline float log2(float a) { return __nvvm_lg2_approx_f(a); }
inline float exp(float a) { return exp2(a * 1.4426950408889634f); }
inline float exp10(float a) { return exp2(a * 3.3219280948873622f); }
inline float log(float a) { return log2(a) * 0.6931471805599453f; }
inline float log10(float a) { return log2(a) * 0.3010299956639812f; }
inline float sin(float a) { return __nvvm_sin_approx_f(a); }
inline float cos(float a) { return __nvvm_cos_approx_f(a); }
inline float tan(float a) { return __nvvm_sin_approx_f(a) / __nvvm_cos_approx_f(a); }
inline float pow(float a, float b) { return exp2(b * log2(a)); }

// No counterpart (yet): a kernel using one is a compile error that names it.
#define GPU_PROXY_MISSING(name)                                                                        \
  template <class F, class... G>                                                                       \
  inline F name(F a, G...) {                                                                           \
    static_assert(missing<F>, "gpu_proxy: metal::" #name                                               \
                  " has no CUDA counterpart in dev/gpu_proxy/include/gpu_proxy/target.h; add one there"); \
    return a;                                                                                          \
  }
GPU_PROXY_MISSING(asin)
GPU_PROXY_MISSING(acos)
GPU_PROXY_MISSING(atan)
GPU_PROXY_MISSING(atan2)
GPU_PROXY_MISSING(sinh)
GPU_PROXY_MISSING(cosh)
GPU_PROXY_MISSING(tanh)
GPU_PROXY_MISSING(fmod)
#undef GPU_PROXY_MISSING

// The value itself (same size and alignment as T), updated with the __atomic builtins.
template <class T>
using atomic_storage = T;

template <class A, class T>
inline void atomic_store(A* obj, T desired) {
  __atomic_store_n(&obj->v, desired, __ATOMIC_RELAXED);
}
template <class A>
inline auto atomic_load(A* obj) {
  return __atomic_load_n(&obj->v, __ATOMIC_RELAXED);
}
template <class A, class T>
inline T atomic_exchange(A* obj, T desired) {
  return __atomic_exchange_n(&obj->v, desired, __ATOMIC_RELAXED);
}
template <class A, class T>
inline bool atomic_compare_exchange_weak(A* obj, T* expected, T desired) {
  return __atomic_compare_exchange_n(&obj->v, expected, desired, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}
#define GPU_PROXY_ATOMIC_RMW(op)                     \
  template <class A, class T>                        \
  inline T atomic_##op(A* obj, T arg) {              \
    return __atomic_##op(&obj->v, arg, __ATOMIC_RELAXED); \
  }
GPU_PROXY_ATOMIC_RMW(fetch_add)
GPU_PROXY_ATOMIC_RMW(fetch_sub)
GPU_PROXY_ATOMIC_RMW(fetch_and)
GPU_PROXY_ATOMIC_RMW(fetch_or)
GPU_PROXY_ATOMIC_RMW(fetch_xor)
GPU_PROXY_ATOMIC_RMW(fetch_min)
GPU_PROXY_ATOMIC_RMW(fetch_max)
#undef GPU_PROXY_ATOMIC_RMW

}  // namespace msl_emu::target

#elif MSL_EMU_TARGET_PART == 2

namespace metal {
inline void threadgroup_barrier(mem_flags) { __nvvm_bar_sync(0); }
}  // namespace metal

#include "gpu_proxy/simdgroup.h"         // simd_*, simdgroup_barrier: warp shuffles and votes
#include "gpu_proxy/simdgroup_matrix.h"  // simdgroup_matrix: tensor cores for half products (conventions there)
#pragma clang force_cuda_host_device end

#define threadgroup __shared__
#define kernel __attribute__((always_inline))  // an entry point on Metal: no call from the generated __global__

#endif
