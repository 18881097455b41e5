// Negative control (rule kernel-argument-address-space): a kernel argument pointing to thread memory.
#include <metal_stdlib>
using namespace metal;

kernel void k(device float* x [[buffer(0)]],
              thread float* t [[buffer(1)]],  // expect-finding: kernel-argument-address-space
              uint i [[thread_position_in_grid]]) {
  x[i] = t[0];
}
