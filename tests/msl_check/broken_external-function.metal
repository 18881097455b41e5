// Negative control (rule external-function): functions, a method and a variable declared and never defined.
#include <metal_stdlib>
using namespace metal;

int system(thread const char* command);
float helper(float v);
float defined_later(float v);
struct S {
  float get() const;
};
namespace metal {
float not_in_metal(float v);
}

kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  S s;
  x[i] = system("true")  // expect-finding: external-function
         + helper(x[i])  // expect-finding: external-function
         + s.get()  // expect-finding: external-function
         + metal::not_in_metal(x[i])  // expect-finding: external-function
         + defined_later(x[i]) + metal::exp(x[i]);
}

float defined_later(float v) { return v; }
