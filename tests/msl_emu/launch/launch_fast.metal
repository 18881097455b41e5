// Fixture of tests/test_emulated_kernel_launch.py: kernels that (visibly) call neither threadgroup_barrier nor a
// SIMD-group function, so they run on msl_emu's fiber-free fast path.
#include <metal_stdlib>
using namespace metal;

// seq[gid] = position of this thread in its group's execution order; counters[group] counts (atomics).
kernel void order_probe(device atomic_uint* counters [[buffer(0)]], device uint* seq [[buffer(1)]],
                        constant uint& n [[buffer(2)]], uint gid [[thread_position_in_grid]],
                        uint group [[threadgroup_position_in_grid]]) {
  if (gid >= n) return;
  seq[gid] = atomic_fetch_add_explicit(&counters[group], 1u, memory_order_relaxed);
}

// y[i] = x[i] * s + simdgroup index * 1000 + lane.
kernel void scale_fast(device const float4* x [[buffer(0)]], device float4* y [[buffer(1)]],
                       constant float& s [[buffer(2)]], uint gid [[thread_position_in_grid]],
                       uint simd [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
  y[gid] = x[gid] * s + float(simd * 1000 + lane);
}

// A barrier the fiber analysis cannot see (a name pasted from pieces that split "barrier", its documented blind
// spot): reaching it on the fast path must be a fatal error.
#define TFMO_PASTE(a, b) a##b
kernel void pasted_sync(device float* out [[buffer(0)]], uint gid [[thread_position_in_grid]]) {
  out[gid] = 1.0f;
  TFMO_PASTE(threadgroup_bar, rier)(mem_flags::mem_threadgroup);
}
