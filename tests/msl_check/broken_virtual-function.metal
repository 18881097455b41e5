// Negative control (rule virtual-function).
#include <metal_stdlib>
using namespace metal;

struct Shape {
  virtual float area() const { return 0.0f; }  // expect-finding: virtual-function
};

kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  Shape s;
  x[i] = s.area();
}
