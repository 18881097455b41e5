// Negative control (rule builtin): builtins that leave the kernel or touch memory; pure ones are not findings.
#include <metal_stdlib>
using namespace metal;

kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  if (i > 1000u) __builtin_trap();  // expect-finding: builtin
  if (i > 2000u) __builtin_unreachable();  // expect-finding: builtin
  __sync_synchronize();  // expect-finding: builtin
  x[i] = __builtin_nanf("") + __builtin_inff();
}
