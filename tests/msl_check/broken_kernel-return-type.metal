// Negative control (rule kernel-return-type).
#include <metal_stdlib>
using namespace metal;

kernel float k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {  // expect-finding: kernel-return-type
  return x[i];
}
