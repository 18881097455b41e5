// Negative control (rule linkage).
#include <metal_stdlib>
using namespace metal;

extern "C" {  // expect-finding: linkage
inline float twice(float v) { return 2.0f * v; }
}
extern "C++" inline float thrice(float v) { return 3.0f * v; }  // expect-finding: linkage

kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  x[i] = twice(x[i]) + thrice(x[i]);
}
