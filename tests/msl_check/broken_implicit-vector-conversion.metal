// Negative control (rule implicit-vector-conversion): half4 <-> float4 and int4 <-> uint4 need explicit
// conversions in MSL (initialisation, assignment, argument, arithmetic); scalar half <-> float does not.
#include <metal_stdlib>
using namespace metal;

inline half4 twice(half4 h) { return h * 2.0h; }

kernel void k(device float4* x [[buffer(0)]], device uint4* y [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  half4 h = x[i];  // expect-finding: implicit-vector-conversion
  int4 s = int4(1, 2, 3, 4);
  y[i] = s;  // expect-finding: implicit-vector-conversion
  h = twice(x[i]);  // expect-finding: implicit-vector-conversion
  int4 t = s + y[i];  // expect-finding: implicit-vector-conversion
  half hs = x[i].x;
  x[i] = float4(h) + hs + float4(t);
}
