// Negative control (rule as-type-size): as_type between types of different sizes.
#include <metal_stdlib>
using namespace metal;

kernel void k(device uint* x [[buffer(0)]], device const float2* v [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  x[i] = as_type<uint>(v[i].x);
  x[i] += as_type<uint>(v[i]);  // expect-finding: as-type-size
}
