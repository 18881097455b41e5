// Kernels that test the MSL emulation itself (tests/test_msl_emu.py via emu_selftest_driver.cc).
// Valid MSL; some are deliberately wrong (marked NEGATIVE) to show the emulation catches them.
#include <metal_stdlib>
#include "device_compat.h"
using namespace metal;

// Tree reduction of one threadgroup's tile (threads_per_threadgroup a power of two <= 256).
// Takes a pointer to threadgroup memory: exercises the harness's rewrite of `threadgroup T*`.
inline void tree_reduce(threadgroup float* tile, uint tid, uint tg, bool use_barrier) {
  for (uint s = tg / 2; s > 0; s >>= 1) {
    if (tid < s) tile[tid] += tile[tid + s];
    if (use_barrier) threadgroup_barrier(mem_flags::mem_threadgroup);
  }
}

// sums[g] = sum of in[g*tg .. g*tg+tg) (zero-padded past n). use_barrier == 0 is the NEGATIVE variant
// (a data race on tile: the result depends on the order threads run in).
kernel void block_sum(device const float* in [[buffer(0)]], device float* sums [[buffer(1)]],
                      constant uint& n [[buffer(2)]], constant uint& use_barrier [[buffer(3)]],
                      uint gid [[thread_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
                      uint tg [[threads_per_threadgroup]], uint group [[threadgroup_position_in_grid]]) {
  threadgroup float tile[256];
  tile[tid] = gid < n ? in[gid] : 0.0f;
  if (use_barrier != 0) threadgroup_barrier(mem_flags::mem_threadgroup);
  tree_reduce(tile, tid, tg, use_barrier != 0);
  if (tid == 0) sums[group] = tile[0];
}

// counts[g] = number of threads that ran in threadgroup g, counted with a threadgroup atomic.
kernel void group_count(device uint* counts [[buffer(0)]], uint tid [[thread_index_in_threadgroup]],
                        uint group [[threadgroup_position_in_grid]]) {
  threadgroup atomic_uint count;
  if (tid == 0) atomic_store_explicit(&count, 0u, memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  atomic_fetch_add_explicit(&count, 1u, memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tid == 0) counts[group] = atomic_load_explicit(&count, memory_order_relaxed);
}

// Thread-position attributes of a 2-D dispatch: 9 uints per thread, at (pos.y * grid.x + pos.x) * 9.
kernel void thread_ids(device uint* out [[buffer(0)]], constant uint2& grid [[buffer(1)]],
                       uint2 pos [[thread_position_in_grid]], uint2 lpos [[thread_position_in_threadgroup]],
                       uint2 gpos [[threadgroup_position_in_grid]], uint2 tpt [[threads_per_threadgroup]],
                       uint idx [[thread_index_in_threadgroup]]) {
  device uint* o = out + (pos.y * grid.x + pos.x) * 9;
  o[0] = pos.x; o[1] = pos.y; o[2] = lpos.x; o[3] = lpos.y; o[4] = gpos.x; o[5] = gpos.y;
  o[6] = tpt.x; o[7] = tpt.y; o[8] = idx;
}

// Many threads, few addresses: bucket b = gid % k.
#if __METAL_VERSION__ >= 300
kernel void atomic_buckets(device const float* vals [[buffer(0)]], device atomic_int* icount [[buffer(1)]],
                           device atomic_uint* usum [[buffer(2)]], device atomic_float* fsum [[buffer(3)]],
                           device atomic_int* imax [[buffer(4)]], device atomic_int* imin [[buffer(5)]],
                           device atomic_int* isub [[buffer(6)]], constant uint& n [[buffer(7)]],
                           constant uint& k [[buffer(8)]], uint gid [[thread_position_in_grid]]) {
  if (gid >= n) return;
  const uint b = gid % k;
  atomic_fetch_add_explicit(&icount[b], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&usum[b], gid, memory_order_relaxed);
  atomic_fetch_add_explicit(&fsum[b], vals[gid], memory_order_relaxed);
  atomic_fetch_max_explicit(&imax[b], int(gid), memory_order_relaxed);
  atomic_fetch_min_explicit(&imin[b], int(gid), memory_order_relaxed);
  atomic_fetch_sub_explicit(&isub[b], 2, memory_order_relaxed);
}
#endif

// Before MSL 3.0: float add as a compare-and-swap loop on the bits (atomic_uint + as_type).
inline void atomic_add_float_cas(device atomic_uint* p, float v) {
  uint expected = atomic_load_explicit(p, memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(p, &expected, as_type<uint>(as_type<float>(expected) + v),
                                                memory_order_relaxed, memory_order_relaxed)) {
  }
}
kernel void cas_buckets(device const float* vals [[buffer(0)]], device atomic_uint* fsum_bits [[buffer(1)]],
                        constant uint& n [[buffer(2)]], constant uint& k [[buffer(3)]],
                        uint gid [[thread_position_in_grid]]) {
  if (gid >= n) return;
  atomic_add_float_cas(&fsum_bits[gid % k], vals[gid]);
}

// old + v after `work` steps of dummy arithmetic (the same value: 0 * a finite number is +0): widens the window
// between reading the old value and writing the new one, so that concurrent adds to one address overlap.
inline float slow_add(float old, float v, uint work) {
  float acc = old;
  for (uint i = 0; i < work; ++i) acc = acc * 0.5f + 1.0f;  // stays finite (tends to 2)
  return (old + v) + 0.0f * acc;
}

// The same float add in three variants (mode), each failed exchange counted in *failures:
//   0: the compare-and-swap loop above (a failed exchange reloads `expected` and retries: no update is lost);
//   1: NEGATIVE, a non-atomic read-modify-write (an atomic load, then an atomic store: an add by another thread
//      in between is overwritten, i.e. lost);
//   2: NEGATIVE, a compare-and-swap loop that ignores failure (gives up after one failed exchange: that add is
//      lost, so the lost updates are exactly the counted failures).
inline void atomic_add_float_variant(device atomic_uint* p, float v, uint mode, uint work,
                                     device atomic_uint* failures) {
  uint expected = atomic_load_explicit(p, memory_order_relaxed);
  if (mode == 1) {
    atomic_store_explicit(p, as_type<uint>(slow_add(as_type<float>(expected), v, work)), memory_order_relaxed);
    return;
  }
  while (!atomic_compare_exchange_weak_explicit(p, &expected, as_type<uint>(slow_add(as_type<float>(expected), v, work)),
                                                memory_order_relaxed, memory_order_relaxed)) {
    atomic_fetch_add_explicit(failures, 1u, memory_order_relaxed);
    if (mode == 2) return;
  }
}
kernel void cas_buckets_variant(device const float* vals [[buffer(0)]], device atomic_uint* fsum_bits [[buffer(1)]],
                                device atomic_uint* failures [[buffer(2)]], constant uint& n [[buffer(3)]],
                                constant uint& k [[buffer(4)]], constant uint& mode [[buffer(5)]],
                                constant uint& work [[buffer(6)]], uint gid [[thread_position_in_grid]]) {
  if (gid >= n) return;
  atomic_add_float_variant(&fsum_bits[gid % k], vals[gid], mode, work, failures);
}

// Vector types, swizzles, constructors and math (one thread; the test recomputes each slot with numpy).
kernel void vector_ops(device const float4* in [[buffer(0)]], device float* out [[buffer(1)]],
                       uint gid [[thread_position_in_grid]]) {
  if (gid != 0) return;
  const float4 a = in[0], b = in[1];
  uint i = 0;
  const float3 zyx = a.zyx;
  out[i++] = zyx.x; out[i++] = zyx.y; out[i++] = zyx.z;                                  // 0..2
  const float4 c = float4(a.xy, b.wz);
  out[i++] = c.x; out[i++] = c.y; out[i++] = c.z; out[i++] = c.w;                       // 3..6
  const float3 x = cross(a.xyz, b.xyz);
  out[i++] = x.x; out[i++] = x.y; out[i++] = x.z;                                       // 7..9
  out[i++] = dot(a, b);                                                                 // 10
  out[i++] = length(a.xyz);                                                             // 11
  const float4 f = fract(a * 3.5f);
  out[i++] = f.x; out[i++] = f.y; out[i++] = f.z; out[i++] = f.w;                       // 12..15
  const float4 cl = clamp(b, -0.5, 0.5);
  out[i++] = cl.x; out[i++] = cl.y; out[i++] = cl.z; out[i++] = cl.w;                   // 16..19
  const float4 m = mix(a, b, 0.25f);
  out[i++] = m.x; out[i++] = m.y; out[i++] = m.z; out[i++] = m.w;                       // 20..23
  const float4 s = select(a, b, a < b);
  out[i++] = s.x; out[i++] = s.y; out[i++] = s.z; out[i++] = s.w;                       // 24..27
  out[i++] = rsqrt(fabs(a.x) + 1.0f);                                                   // 28
  out[i++] = as_type<float>(0x3f800000u);                                               // 29
  out[i++] = float(popcount(0xF0F0u));                                                  // 30
  out[i++] = float(sizeof(float3));                                                     // 31
  out[i++] = float(sizeof(half3));                                                      // 32
  out[i++] = float(sizeof(float2));                                                     // 33
  out[i++] = float(half(a.x));                                                          // 34
  out[i++] = tfmo_floor(a.y);                                                           // 35
  out[i++] = tfmo_exp(a.z * 0.25f);                                                     // 36
  out[i++] = tfmo_isfinite(a.w / 0.0f) ? 1.0f : 0.0f;                                   // 37
  out[i++] = float(min(3, 5));                                                          // 38
  out[i++] = max(a.x, 0.0);                                                             // 39
  const float2 u = float2(uint2(7u));
  out[i++] = u.x; out[i++] = u.y;                                                       // 40..41
  out[i++] = smoothstep(0.0f, 1.0f, 0.25f);                                             // 42
  out[i++] = all(a.xy == a.xy) ? 1.0f : 0.0f;                                           // 43
  out[i++] = any(a > 100.0f) ? 1.0f : 0.0f;                                             // 44
  const half2 h = half2(a.xy);
  out[i++] = float(h.y);                                                                // 45
  out[i++] = float(sizeof(half));                                                       // 46
  out[i++] = float(__METAL_VERSION__);                                                  // 47
}

// NEGATIVE: thread 3 returns without reaching the barrier the others wait at.
kernel void divergent_barrier(device float* out [[buffer(0)]], uint tid [[thread_index_in_threadgroup]],
                              uint tg [[threads_per_threadgroup]]) {
  threadgroup float tile[64];
  if (tid == 3) return;
  tile[tid] = float(tid);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = tile[tg - 1 - tid];
}

// SIMD groups: the lanes below `split` call simd_sum, the others simd_max (divergent: an error; split = 32: every
// lane sums); threads with tid % 5 == 4 return first (inactive). out[tid] = the reduction plus
// 1000 x the number of active lanes below this one (after a simdgroup_barrier).
kernel void simd_reduce(device float* out [[buffer(0)]], constant uint& split [[buffer(1)]],
                        uint tid [[thread_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
  if (tid % 5 == 4) return;
  float v = float(tid);
  out[tid] = lane < split ? simd_sum(v) : simd_max(v);
  simdgroup_barrier(mem_flags::mem_none);
  out[tid] += simd_prefix_exclusive_sum(1.0f) * 1000.0f;
}

// A SIMD-group call that one thread meets at a threadgroup_barrier instead: an error.
kernel void simd_vs_barrier(device float* out [[buffer(0)]], uint tid [[thread_index_in_threadgroup]]) {
  if (tid == 7) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  } else {
    out[tid] = simd_sum(1.0f);
  }
}

// NEGATIVE: odd and even threads wait at different barriers.
kernel void split_barrier(device float* out [[buffer(0)]], uint tid [[thread_index_in_threadgroup]]) {
  if (tid & 1) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  } else {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  out[tid] = 1.0f;
}

// NEGATIVE: off by one, the last thread writes one element past the end of out.
kernel void oob_write(device const float* in [[buffer(0)]], device float* out [[buffer(1)]],
                      constant uint& n [[buffer(2)]], uint gid [[thread_position_in_grid]]) {
  if (gid >= n) return;
  out[gid + 1] = in[gid];
}
