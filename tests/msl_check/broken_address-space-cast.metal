// Negative control (rule address-space-cast): an explicit cast from constant to device memory.
#include <metal_stdlib>
using namespace metal;

kernel void k(constant float* c [[buffer(0)]], device float* x [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  device float* w = (device float*)c;  // expect-finding: address-space-cast
  x[i] = w[i];
}
