// Kernels of the host-layer probe (tests/test_emulated_gpu_host_layer.py): the parts of the GPU host layer that the
// package's own ops do not use yet — function constants of every type, threadgroup memory, barriers, whole
// threadgroups, scratch buffers and several passes in one call — plus a half kernel for a contract violation.
#include <metal_stdlib>
using namespace metal;

constant uint kScale [[function_constant(0)]];
constant int kOffset [[function_constant(1)]];
constant bool kNegate [[function_constant(2)]];
constant float kBias [[function_constant(3)]];

// partial[g] = sum of x over threadgroup g (tree reduction in threadgroup memory; the group size is a power of 2).
kernel void probe_block_sum(device const float* x [[buffer(0)]], device float* partial [[buffer(1)]],
                            constant uint& n [[buffer(2)]], threadgroup float* tile [[threadgroup(0)]],
                            uint gid [[thread_position_in_grid]], uint lid [[thread_position_in_threadgroup]],
                            uint group [[threadgroup_position_in_grid]], uint width [[threads_per_threadgroup]]) {
  tile[lid] = gid < n ? x[gid] : 0.0f;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint s = width / 2; s > 0; s >>= 1) {
    if (lid < s) tile[lid] += tile[lid + s];
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (lid == 0) partial[group] = tile[0];
}

// y[g] = +-(partial[g] * kScale + kOffset + kBias).
kernel void probe_finish(device const float* partial [[buffer(0)]], device float* y [[buffer(1)]],
                         constant uint& groups [[buffer(2)]], uint g [[thread_position_in_grid]]) {
  if (g >= groups) return;
  const float v = partial[g] * float(kScale) + float(kOffset) + kBias;
  y[g] = kNegate ? -v : v;
}

kernel void probe_half_input(device const half* x [[buffer(0)]], device float* y [[buffer(1)]],
                             uint i [[thread_position_in_grid]]) {
  y[i] = float(x[i]);
}
