// Negative control (rule compile): clang's own errors. A device pointer bound to a thread pointer, and a write to
// constant memory (a struct assignment; copying the struct out of constant memory is fine).
#include <metal_stdlib>
using namespace metal;

struct P {
  float a;
};

kernel void k(device float* x [[buffer(0)]], constant P& c [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  thread float* p = x;  // expect-finding: compile
  P local = c;
  c = local;  // expect-finding: compile
  p[i] = local.a;
}
