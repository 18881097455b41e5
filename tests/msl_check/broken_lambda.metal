// Negative control (rule lambda).
#include <metal_stdlib>
using namespace metal;

kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  auto sq = [](float v) { return v * v; };  // expect-finding: lambda
  x[i] = sq(x[i]);
}
