// Fixture of tests/test_emulated_kernel_launch.py: kernels run by name through csrc/emulated_gpu/kernel_launch.cc.
// Covers buffer slots out of order, a `constant Struct&`, a half buffer, one function constant of each type,
// a [[threadgroup(0)]] argument with barriers, and a uint2 grid. This file calls threadgroup_barrier, so all its
// kernels run on fibers (not the fiber-free fast path).
#include <metal_stdlib>
using namespace metal;

struct Affine {
  float scale;
  float shift;
  uint n;
  uint pad;
};

constant bool kNegate [[function_constant(0)]];
constant int kOffset [[function_constant(1)]];
constant uint kMul [[function_constant(2)]];
constant float kBias [[function_constant(3)]];

/* y[i] = sign * (a.scale * x[i] + a.shift) * kMul + kOffset + kBias for i < a.n, sign = kNegate ? -1 : 1.
   Slots deliberately out of order. */
kernel void affine_half(device float* y [[buffer(2)]],
                        constant Affine& a [[buffer(5)]],
                        device const half* x [[buffer(0)]],   // half input
                        uint gid [[thread_position_in_grid]]) {
  if (gid >= a.n) return;
  const float v = (a.scale * float(x[gid]) + a.shift) * (kNegate ? -1.0f : 1.0f);
  y[gid] = v * float(kMul) + float(kOffset) + kBias;
}

// sums[g] = sum of in[g*tg .. g*tg+tg) (zero past n); dispatchThreadgroups, tg a power of two.
kernel void group_sum(device const float* in [[buffer(0)]], device float* sums [[buffer(1)]],
                      constant uint& n [[buffer(2)]], threadgroup float* tile [[threadgroup(0)]],
                      uint tid [[thread_index_in_threadgroup]], ushort tg [[threads_per_threadgroup]],
                      uint group [[threadgroup_position_in_grid]], uint gid [[thread_position_in_grid]]) {
  tile[tid] = gid < n ? in[gid] : 0.0f;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint s = tg / 2; s > 0; s >>= 1) {
    if (tid < s) tile[tid] += tile[tid + s];
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (tid == 0) sums[group] = tile[0];
}

// out[(y * width + x) * 4 + 0..3] = pos.x, pos.y, lpos.x, lpos.y over a 2-D dispatchThreads grid.
kernel void grid2d(device uint* out [[buffer(0)]], constant uint2& size [[buffer(1)]],
                   uint2 pos [[thread_position_in_grid]],
                   ushort2 lpos [[thread_position_in_threadgroup]]) {
  const uint i = (pos.y * size.x + pos.x) * 4;
  out[i + 0] = pos.x;
  out[i + 1] = pos.y;
  out[i + 2] = lpos.x;
  out[i + 3] = lpos.y;
}
