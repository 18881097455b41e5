// Negative control (rule thread-local).
#include <metal_stdlib>
using namespace metal;

constant thread_local float kScale = 2.0f;  // expect-finding: thread-local

kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  x[i] = kScale;
}
