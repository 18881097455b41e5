// Negative control (rule exception): throw and try.
#include <metal_stdlib>
using namespace metal;

inline float checked(float v) {
  if (v < 0.0f) throw 1;  // expect-finding: exception
  return v;
}

kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  try {  // expect-finding: exception
    x[i] = checked(x[i]);
  } catch (int) {
    x[i] = 0.0f;
  }
}
