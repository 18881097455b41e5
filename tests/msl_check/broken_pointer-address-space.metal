// Negative control (rule pointer-address-space): pointers and references without an address space.
#include <metal_stdlib>
using namespace metal;

inline float first(const float* v) { return v[0]; }  // expect-finding: pointer-address-space
inline void twice(float& v) { v *= 2.0f; }  // expect-finding: pointer-address-space

kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  float local[2] = {1.0f, 2.0f};
  float* p = local;  // expect-finding: pointer-address-space
  thread float* q = local;
  twice(*q);
  x[i] = first(p);
}
