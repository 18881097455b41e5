// Negative control (rule dynamic-cast).
#include <metal_stdlib>
using namespace metal;

struct A {
  float v;
};
struct B : A {};

kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  B b;
  b.v = 1.0f;
  thread A* a = dynamic_cast<thread A*>(&b);  // expect-finding: dynamic-cast
  x[i] = a->v;
}
