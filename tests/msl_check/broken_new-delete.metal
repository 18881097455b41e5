// Negative control (rule new-delete).
#include <metal_stdlib>
using namespace metal;

struct Box {
  float v;
};

kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  thread Box* b = new Box;  // expect-finding: new-delete
  x[i] = b->v;
  delete b;  // expect-finding: new-delete
}
