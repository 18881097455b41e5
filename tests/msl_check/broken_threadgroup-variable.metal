// Negative control (rule threadgroup-variable): threadgroup memory declared outside a kernel's scope.
#include <metal_stdlib>
using namespace metal;

inline float helper(uint i) {
  threadgroup float shared[32];  // expect-finding: threadgroup-variable
  shared[i] = 1.0f;
  return shared[0];
}

kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  threadgroup float ok[32];
  ok[i % 32] = helper(i % 32);
  x[i] = ok[0];
}
