// Negative control (rule recursion): direct and mutual recursion.
#include <metal_stdlib>
using namespace metal;

inline uint fact(uint n) { return n <= 1 ? 1 : n * fact(n - 1); }  // expect-finding: recursion

uint odd(uint n);
inline uint even(uint n) { return n == 0 ? 1 : odd(n - 1); }  // expect-finding: recursion
uint odd(uint n) { return n == 0 ? 0 : even(n - 1); }  // expect-finding: recursion

kernel void k(device uint* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  x[i] = fact(i) + even(i);
}
