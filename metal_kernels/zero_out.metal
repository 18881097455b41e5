// Metal kernels of ZeroOut (semantics in csrc/ops/zero_out_op.cc): the output has the input's shape, the
// first element in flat order is kept and every other element is zero.
// One thread per element, dispatched with dispatchThreads over n = number of elements (the host skips
// the dispatch when n == 0). One kernel template, instantiated once per dtype under the names the host binds:
//   zero_out_int32, zero_out_int64 (MSL long is 64-bit), zero_out_float32, zero_out_float16.
#include <metal_stdlib>
using namespace metal;

template <typename T>
[[kernel]] void zero_out(device const T* in [[buffer(0)]], device T* out [[buffer(1)]], constant uint& n [[buffer(2)]],
                         uint gid [[thread_position_in_grid]]) {
  if (gid >= n) return;
  out[gid] = gid == 0 ? in[0] : T(0);
}

template [[host_name("zero_out_int32")]] [[kernel]] decltype(zero_out<int>) zero_out<int>;
template [[host_name("zero_out_int64")]] [[kernel]] decltype(zero_out<long>) zero_out<long>;
template [[host_name("zero_out_float32")]] [[kernel]] decltype(zero_out<float>) zero_out<float>;
template [[host_name("zero_out_float16")]] [[kernel]] decltype(zero_out<half>) zero_out<half>;
