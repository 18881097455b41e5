// Block scan of RayMarch's per-ray counts (host: csrc/gpu/ray_march_gpu.cc; scheme: kRmScanBlock in
// csrc/shared/ray_march_math.h). Dispatched as whole threadgroups of kRmScanBlock threads with kRmScanBlock longs of
// threadgroup memory at [[threadgroup(0)]]: each group scans its block of data[offset + i], i < n, in place
// (inclusive, Hillis-Steele in threadgroup memory) and writes the block's total to sums[group].
#include <metal_stdlib>
using namespace metal;

#include "ray_march_math.h"

kernel void ray_march_scan_block(device long* data [[buffer(0)]],
                                 device long* sums [[buffer(1)]],
                                 constant RmScanParams& p [[buffer(2)]],
                                 threadgroup long* tmp [[threadgroup(0)]],
                                 uint i [[thread_position_in_grid]],
                                 uint lid [[thread_position_in_threadgroup]],
                                 uint g [[threadgroup_position_in_grid]]) {
  tmp[lid] = i < p.n ? data[ulong(p.offset) + i] : 0;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint step = 1; step < kRmScanBlock; step <<= 1) {
    const long add = lid >= step ? tmp[lid - step] : 0;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    tmp[lid] += add;
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (i < p.n) data[ulong(p.offset) + i] = tmp[lid];
  if (lid == kRmScanBlock - 1) sums[g] = tmp[lid];
}
