// Negative control (rule gnu-attribute): attributes that run code at load or place symbols, in every spelling.
#include <metal_stdlib>
using namespace metal;

__attribute__((constructor)) void at_load() {}  // expect-finding: gnu-attribute
__attribute__((destructor)) void at_unload() {}  // expect-finding: gnu-attribute
[[gnu::constructor]] void at_load2() {}  // expect-finding: gnu-attribute
[[gnu::section(".init_array")]] void placed() {}  // expect-finding: gnu-attribute
__attribute__((used, visibility("default"))) void kept() {}  // expect-finding: gnu-attribute
__attribute__((weak)) float weak_one(float v) { return v; }  // expect-finding: gnu-attribute
float aliased(float v) __attribute__((alias("_Z8weak_onef")));  // expect-finding: gnu-attribute
struct P {
  float v;
};
[[gnu::used]] constant P p{1.0f};  // expect-finding: gnu-attribute
#pragma clang attribute push(__attribute__((constructor)), apply_to = function)  // expect-finding: gnu-attribute
void also_at_load() {}
#pragma clang attribute pop

kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  x[i] = weak_one(x[i]) + p.v;
}
