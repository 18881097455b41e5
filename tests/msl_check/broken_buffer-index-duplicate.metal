// Negative control (rule buffer-index-duplicate).
#include <metal_stdlib>
using namespace metal;

kernel void k(device float* x [[buffer(0)]],
              device float* y [[buffer(0)]],  // expect-finding: buffer-index-duplicate
              uint i [[thread_position_in_grid]]) {
  x[i] = y[i];
}
