// Metal kernels of ZeroOut (semantics in csrc/ops/zero_out_op.cc): the output has the input's shape, the
// first element in flat order is kept and every other element is zero.
// One thread per element, dispatched with dispatchThreads over n = number of elements (the host skips
// the dispatch when n == 0). The host binds the kernels by these names, one per dtype:
//   zero_out_int32, zero_out_int64 (MSL long is 64-bit), zero_out_float32, zero_out_float16.
// Kernels are spelled out (not template instantiations with [[host_name]]) so that the emulation in
// csrc/msl_emu, which compiles this file as C++, accepts them too.
#include <metal_stdlib>
using namespace metal;

template <typename T>
inline void zero_out_element(device const T* in, device T* out, uint n, uint gid) {
  if (gid >= n) return;
  out[gid] = gid == 0 ? in[0] : T(0);
}

kernel void zero_out_int32(device const int* in [[buffer(0)]], device int* out [[buffer(1)]],
                           constant uint& n [[buffer(2)]], uint gid [[thread_position_in_grid]]) {
  zero_out_element(in, out, n, gid);
}

kernel void zero_out_int64(device const long* in [[buffer(0)]], device long* out [[buffer(1)]],
                           constant uint& n [[buffer(2)]], uint gid [[thread_position_in_grid]]) {
  zero_out_element(in, out, n, gid);
}

kernel void zero_out_float32(device const float* in [[buffer(0)]], device float* out [[buffer(1)]],
                             constant uint& n [[buffer(2)]], uint gid [[thread_position_in_grid]]) {
  zero_out_element(in, out, n, gid);
}

kernel void zero_out_float16(device const half* in [[buffer(0)]], device half* out [[buffer(1)]],
                             constant uint& n [[buffer(2)]], uint gid [[thread_position_in_grid]]) {
  zero_out_element(in, out, n, gid);
}
