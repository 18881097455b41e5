// Negative control (rule atomic-float): atomic_float exists from MSL 3.0 on (clean at 3.0).
// msl-version: 2.4
#include <metal_stdlib>
using namespace metal;

kernel void k(device atomic_float* acc [[buffer(0)]],  // expect-finding: atomic-float
              device const float* v [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  atomic_fetch_add_explicit(acc, v[i], memory_order_relaxed);  // expect-finding: atomic-float
}
