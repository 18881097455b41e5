// Negative control (rule position-attribute-type).
#include <metal_stdlib>
using namespace metal;

kernel void k(device float* x [[buffer(0)]],
              int i [[thread_position_in_grid]],  // expect-finding: position-attribute-type
              uint2 lane [[thread_index_in_simdgroup]],  // expect-finding: position-attribute-type
              ushort3 tid [[thread_position_in_threadgroup]]) {
  x[i] = float(lane.x + tid.y);
}
