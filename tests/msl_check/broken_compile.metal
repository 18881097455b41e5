// Negative control (rule compile): a device pointer bound to a thread pointer; clang's own error.
#include <metal_stdlib>
using namespace metal;

kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  thread float* p = x;  // expect-finding: compile
  p[i] = 0.0f;
}
