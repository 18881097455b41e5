// How the GPU proxy numbers a SIMD group's lanes (MSL's thread_index_in_simdgroup) on a warp's lanes (CUDA %laneid).
// Included by the generated entry points (gpu_proxy/entry.h) and the SIMD-group functions (gpu_proxy/simdgroup.h),
// which must agree.
//
// Conventions:
//  - without GPU_PROXY_MATRIX_LANES (every file that uses no SIMD-group matrix), Metal lane m is CUDA lane m;
//  - with GPU_PROXY_MATRIX_LANES 1 (build.py defines it for a file that uses SIMD-group matrices), a full warp (all
//    32 of its threads inside the block) numbers its lanes so that Apple's 8x8 layout (lane m holds row
//    4 bit4(m) + 2 bit2(m) + bit1(m), columns 4 bit3(m) + 2 bit0(m) and the next; gpu_proxy/simdgroup_matrix.h) is
//    the layout of the tensor cores' mma fragments (CUDA lane L holds row L / 4, columns 2 (L % 4) and the next):
//    Metal lane m is CUDA lane cuda_lane(m) = bit4(m) bit2(m) bit1(m) bit3(m) bit0(m), a permutation of the index
//    bits. A partial warp (the block's last, when its size is not a multiple of 32) keeps m = L, so that its
//    lanes stay 0 .. n-1 as in Metal;
//  - the threads themselves do not change: Metal thread (warp w, lane m) is CUDA thread 32 w + cuda_lane(m), so a
//    warp's memory accesses touch the same addresses in another lane order. Every MSL-visible index (the thread
//    attributes, shuffle sources, ballot and active-mask bits, lane order of folds and scans) is a Metal lane.
#pragma once

#include "gpu_proxy/cuda.h"

#ifndef GPU_PROXY_MATRIX_LANES
#define GPU_PROXY_MATRIX_LANES 0
#endif

namespace gpu_proxy::lanes {

// The CUDA lane of Metal lane m in a renumbered warp, and its inverse.
__device__ inline unsigned cuda_of(unsigned m) {
  return (m & 0x11u) | (m >> 2 & 1u) << 3 | (m >> 1 & 1u) << 2 | (m >> 3 & 1u) << 1;
}
__device__ inline unsigned metal_of(unsigned l) {
  return (l & 0x11u) | (l >> 1 & 1u) << 3 | (l >> 3 & 1u) << 2 | (l >> 2 & 1u) << 1;
}

// Whether the calling thread's warp is renumbered: GPU_PROXY_MATRIX_LANES and all 32 of its threads in the block.
__device__ inline bool renumbered() {
  if constexpr (!GPU_PROXY_MATRIX_LANES) {
    return false;
  } else {
    using namespace gpu_proxy::sreg;
    const unsigned nx = ntid_x(), ny = ntid_y();
    const unsigned c = tid_x() + nx * (tid_y() + ny * tid_z());
    return (c | 31u) < nx * ny * ntid_z();
  }
}

// The calling thread's Metal lane; the CUDA lane of Metal lane m in the caller's warp.
__device__ inline unsigned metal_lane() {
  const unsigned l = gpu_proxy::sreg::laneid();
  return renumbered() ? metal_of(l) : l;
}
__device__ inline unsigned cuda_lane(unsigned m) { return renumbered() ? cuda_of(m) : m; }

// A 32-bit lane mask indexed by CUDA lanes (activemask, ballot) as one indexed by Metal lanes: bit m of the result
// is bit cuda_of(m) of x. Two swaps of index bits: 1 with 2, then 2 with 3 (the delta swaps of a bit-index
// permutation).
__device__ inline unsigned metal_mask(unsigned x) {
  if (!renumbered()) return x;
  unsigned t = ((x >> 2) ^ x) & 0x0c0c0c0cu;
  x ^= t ^ (t << 2);
  t = ((x >> 4) ^ x) & 0x00f000f0u;
  return x ^ t ^ (t << 4);
}

}  // namespace gpu_proxy::lanes
