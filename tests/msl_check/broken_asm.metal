// Negative control (rule asm): inline assembly in a body, at file scope, and as a symbol's name.
#include <metal_stdlib>
using namespace metal;

__asm__(".pushsection .init_array\n.popsection");  // expect-finding: asm
float renamed(float x) __asm__("sinf");  // expect-finding: asm

kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  asm volatile("nop");  // expect-finding: asm
  x[i] = renamed(1.0f);  // expect-finding: external-function
}
