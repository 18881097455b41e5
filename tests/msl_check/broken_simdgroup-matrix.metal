// Negative control (rule simdgroup-matrix): SIMD-group matrices exist from MSL 2.3 on (clean at 2.4 and 3.0).
// msl-version: 2.2
#include <metal_stdlib>
using namespace metal;

kernel void k(device const float* a [[buffer(0)]], device float* c [[buffer(1)]]) {
  simdgroup_float8x8 m;  // expect-finding: simdgroup-matrix
  simdgroup_load(m, a);  // expect-finding: simdgroup-matrix
  simdgroup_multiply(m, m, m);  // expect-finding: simdgroup-matrix
  simdgroup_store(m, c, 8);  // expect-finding: simdgroup-matrix
}
