// Negative control (rule typeid).
#include <metal_stdlib>
using namespace metal;

namespace std {
class type_info;
}

kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  (void)typeid(x[i]);  // expect-finding: typeid
  x[i] = 0.0f;
}
