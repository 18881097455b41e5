// Negative control (rule buffer-index-range): buffer indices are 0 to 30.
#include <metal_stdlib>
using namespace metal;

kernel void k(device float* x [[buffer(30)]],
              device float* y [[buffer(31)]],  // expect-finding: buffer-index-range
              uint i [[thread_position_in_grid]]) {
  x[i] = y[i];
}
