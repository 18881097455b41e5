// Negative control (rule double): the type written in a variable, a cast and sizeof; 0.5 alone is a float in MSL.
#include <metal_stdlib>
using namespace metal;

kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  double acc = x[i];  // expect-finding: double
  x[i] = float((double)acc * 0.5);  // expect-finding: double
  x[i] += sizeof(double);  // expect-finding: double
  x[i] *= 0.5;
}
