// Negative control (rule memory-order): MSL 2.4/3.0 atomics take memory_order_relaxed only.
#include <metal_stdlib>
using namespace metal;

kernel void k(device atomic_uint* counter [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  atomic_fetch_add_explicit(counter, 1u, memory_order_relaxed);
  atomic_fetch_add_explicit(counter, 1u, memory_order_seq_cst);  // expect-finding: memory-order
}
