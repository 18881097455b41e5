// Negative control (rule variadic).
#include <metal_stdlib>
using namespace metal;

float first(int n, ...) { return float(n); }  // expect-finding: variadic

kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  x[i] = first(1, 2.0f);
}
