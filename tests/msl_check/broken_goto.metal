// Negative control (rule goto).
#include <metal_stdlib>
using namespace metal;

kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  if (i > 4) goto done;  // expect-finding: goto
  x[i] = 1.0f;
done:
  return;
}
