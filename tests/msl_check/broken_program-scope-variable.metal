// Negative control (rule program-scope-variable): program-scope variables outside constant memory.
#include <metal_stdlib>
using namespace metal;

float scale = 2.0f;  // expect-finding: program-scope-variable
constexpr float kOffset = 1.0f;  // expect-finding: program-scope-variable
constant float kGood = 3.0f;

inline float counter() {
  static float n = 0.0f;  // expect-finding: program-scope-variable
  return n;
}

kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  x[i] = scale * kOffset * kGood + counter();
}
