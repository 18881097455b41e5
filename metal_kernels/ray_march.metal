// Metal kernels of RayMarch (semantics: csrc/ops/ray_march_op.cc; math and conventions:
// csrc/shared/ray_march_math.h; host: csrc/gpu/ray_march_gpu.cc). Host order of the passes:
//   ray_march_mip (levels 1 .. L in order, one thread per byte of the level) ->
//   ray_march_count (R threads) -> scan of counts (ray_march_scan_block / ray_march_scan_add) -> host reads N ->
//   ray_march_splits (R + 1 threads) -> ray_march_fill (R threads, skipped when N = 0).
// `scan` is int64 [R + 1]: scan[0] = 0, scan[r + 1] = samples of ray r, then (after the scan) samples of rays < r+1.
// Invalid input (non-finite origin/direction, NaN near/far): the ray gets no samples. The fill never writes outside
// [scan[r], scan[r + 1]) (<= N, the output length): no out-of-bounds access whatever the inputs.
#include <metal_stdlib>
using namespace metal;

#include "ray_march_math.h"

// Byte j of mip level `level` (1 .. L) of every cascade (thread j: byte j % n of cascade j / n, n the level's bytes
// per cascade), pooled from level - 1 (the cascade's bitfield for level 1). Levels are separate passes, in order; a
// level outside 1 .. L writes nothing.
kernel void ray_march_mip(device const uchar* bits [[buffer(0)]],
                          device uchar* mip [[buffer(1)]],
                          constant RmParams& params [[buffer(2)]],
                          constant uint& level [[buffer(3)]],
                          uint j [[thread_position_in_grid]]) {
  const uint m = level;
  if (m < 1u || m > params.mip_levels) return;
  const uint gs = rm_mip_res(params.G, m - 1u), gm = rm_mip_res(params.G, m);
  const uint n = (gm * gm * gm + 7u) / 8u;
  if (j >= params.K * n) return;
  const uint k = j / n, jj = j % n;
  device uchar* own = mip + k * params.mip_stride;
  device const uchar* src = m == 1u ? bits + k * params.cascade_bytes
                                    : (device const uchar*)(own + params.mip_offset[m - 2u]);
  own[params.mip_offset[m - 1u] + jj] = uchar(rm_mip_byte(src, gs, gm, jj));
}

kernel void ray_march_count(device const float* rays_o [[buffer(0)]],
                            device const float* rays_d [[buffer(1)]],
                            device const float* near_t [[buffer(2)]],
                            device const float* far_t [[buffer(3)]],
                            device const uchar* bits [[buffer(4)]],
                            device const uchar* mip [[buffer(5)]],
                            device long* scan [[buffer(6)]],
                            constant RmParams& params [[buffer(7)]],
                            uint r [[thread_position_in_grid]]) {
  constant RmParams& p = params;  // read in place (TFMO_UNIFORM)
  if (r == 0) scan[0] = 0;
  if (r >= p.R) return;
  device const float* o = rays_o + ulong(r) * 3;
  device const float* d = rays_d + ulong(r) * 3;
  RmRay s;
  uint n = 0;
  if (rm_begin(p, o[0], o[1], o[2], d[0], d[1], d[2], near_t[r], far_t[r], r, &s)) {
    while (n < p.max_samples && rm_candidate(p, &s)) {
      if (rm_occupied(p, bits, &s)) {
        ++n;
        rm_accept(&s);
      } else {
        rm_skip(p, rm_empty_level(p, mip, &s), &s);
      }
    }
  }
  scan[ulong(r) + 1] = long(n);
}

// First half of one scan level, the block scan of the per-ray counts (scheme: kRmScanBlock in
// csrc/shared/ray_march_math.h; the one kernel here with barriers). Dispatched as whole threadgroups of kRmScanBlock
// threads with kRmScanBlock longs of threadgroup memory at [[threadgroup(0)]]: each group scans its block of
// data[offset + i], i < n, in place (inclusive, Hillis-Steele in threadgroup memory) and writes the block's total
// to sums[group].
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

// Second half of one scan level: value i of block g > 0 adds the inclusive scan of the block totals up to g - 1.
kernel void ray_march_scan_add(device long* data [[buffer(0)]],
                               device const long* sums [[buffer(1)]],
                               constant RmScanParams& p [[buffer(2)]],
                               uint i [[thread_position_in_grid]]) {
  if (i >= p.n) return;
  const uint g = i / kRmScanBlock;
  if (g > 0) data[ulong(p.offset) + i] += sums[g - 1];
}

// row_splits[i] = scan[i] for i <= R (the host checked scan[R] = N < 2^31).
kernel void ray_march_splits(device const long* scan [[buffer(0)]],
                             device int* row_splits [[buffer(1)]],
                             constant uint& n [[buffer(2)]],
                             uint i [[thread_position_in_grid]]) {
  if (i >= n) return;
  row_splits[i] = int(scan[i]);
}

// R = 0: row_splits = [0].
kernel void ray_march_zero(device int* row_splits [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  if (i == 0) row_splits[0] = 0;
}

kernel void ray_march_fill(device const float* rays_o [[buffer(0)]],
                           device const float* rays_d [[buffer(1)]],
                           device const float* near_t [[buffer(2)]],
                           device const float* far_t [[buffer(3)]],
                           device const uchar* bits [[buffer(4)]],
                           device const uchar* mip [[buffer(5)]],
                           device const long* scan [[buffer(6)]],
                           device float* t_starts [[buffer(7)]],
                           device float* t_ends [[buffer(8)]],
                           device int* ray_indices [[buffer(9)]],
                           device float* positions [[buffer(10)]],
                           constant RmParams& params [[buffer(11)]],
                           uint r [[thread_position_in_grid]]) {
  constant RmParams& p = params;  // read in place (TFMO_UNIFORM)
  if (r >= p.R) return;
  const long base = scan[r];
  const long room = scan[ulong(r) + 1] - base;  // the count pass's result for this ray
  device const float* o = rays_o + ulong(r) * 3;
  device const float* d = rays_d + ulong(r) * 3;
  RmRay s;
  if (!rm_begin(p, o[0], o[1], o[2], d[0], d[1], d[2], near_t[r], far_t[r], r, &s)) return;
  uint n = 0;
  while (n < p.max_samples && long(n) < room && rm_candidate(p, &s)) {
    if (rm_occupied(p, bits, &s)) {
      const ulong k = ulong(base + long(n));
      t_starts[k] = s.t;
      t_ends[k] = s.t1;
      ray_indices[k] = int(r);
      const float tm = 0.5f * (s.t + s.t1);
      const uint outer = 3u * (p.K - 1u);  // unit coordinates of the outermost cascade's box
      positions[3 * k] = rm_unit_coord(s.o[0], s.d[0], tm, p.c_lo[outer], p.inv_ext_x);
      positions[3 * k + 1] = rm_unit_coord(s.o[1], s.d[1], tm, p.c_lo[outer + 1u], p.inv_ext_y);
      positions[3 * k + 2] = rm_unit_coord(s.o[2], s.d[2], tm, p.c_lo[outer + 2u], p.inv_ext_z);
      ++n;
      rm_accept(&s);
    } else {
      rm_skip(p, rm_empty_level(p, mip, &s), &s);
    }
  }
}
