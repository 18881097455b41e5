// Clean control for tf_metal_ops.msl_check: valid MSL 2.4 / 3.0 using the features the rules are near to. The
// check must report nothing here, at either version.
#include <metal_stdlib>
using namespace metal;

struct Params {
  uint n;
  float scale;
  float4 tint;
};

constant float kWeights[3] = {0.25f, 0.5f, 0.25f};
constexpr constant uint kLanes = 32;
constant Params kDefaults = {1u, 1.0f, {0.0f, 0.0f, 0.0f, 1.0f}};
constant bool kUseTint [[function_constant(0)]];
constant bool kHasTint = is_function_constant_defined(kUseTint);

template <typename T>
inline float load_scaled(device const T* v, uint i, float s) {
  return float(v[i]) * s;
}

inline void bump(thread float& v, float by) { v += by; }

inline float sum3(const thread float* v) {
  float s = 0.0f;
  for (uint k = 0; k < 3; ++k) s += v[k];
  return s;
}

inline void add_float(device float* addr, float v) {
#if __METAL_VERSION__ >= 300
  atomic_fetch_add_explicit((device atomic_float*)addr, v, memory_order_relaxed);
#else
  device atomic_uint* a = (device atomic_uint*)addr;
  uint expected = atomic_load_explicit(a, memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(a, &expected, as_type<uint>(as_type<float>(expected) + v),
                                                memory_order_relaxed, memory_order_relaxed)) {
  }
#endif
}

[[kernel]] void good_kernel(device const half* in [[buffer(0)]],
                            device float4* out [[buffer(1)]],
                            constant Params& params [[buffer(2)]],
                            device const Params* all_params [[buffer(3)]],
                            device float* acc [[buffer(4)]],
                            device Params* params_out [[buffer(5)]],
                            threadgroup float* scratch [[threadgroup(0)]],
                            uint3 gid [[thread_position_in_grid]],
                            ushort lane [[thread_index_in_simdgroup]],
                            uint tid [[thread_index_in_threadgroup]],
                            uint3 tg [[threadgroup_position_in_grid]]) {
  threadgroup atomic_uint count;
  threadgroup float tile[kLanes];
  threadgroup Params shared_params;
  constant float local_table[2] = {1.0f, 2.0f};
  const Params p = params;    // struct copies across address spaces
  Params q = all_params[tg.x];
  if (tid == 0) shared_params = kDefaults;
  q.scale += shared_params.scale;
  params_out[gid.x] = q;
  if (gid.x >= p.n) return;
  if (tid == 0) atomic_store_explicit(&count, 0u, memory_order_relaxed);
  tile[tid % kLanes] = load_scaled(in, gid.x, p.scale);
  scratch[tid] = tile[tid % kLanes];
  threadgroup_barrier(mem_flags::mem_threadgroup | mem_flags::mem_device);
  atomic_fetch_add_explicit(&count, 1u, memory_order_relaxed);

  float v[3] = {kWeights[0], kWeights[1], kWeights[2]};
  thread float* pv = v;
  auto pv2 = &v[1];
  for (auto& w : v) w *= 2.0f;
  bump(*pv, 0.5);
  bump(*pv2, local_table[1]);
  float s = sum3(v) + simd_sum(scratch[tid]) + simd_shuffle_down(tile[0], ushort(1));

  half h = s;             // scalar half <-> float converts implicitly
  float back = h;
  half4 h4 = half4(out[gid.x]);   // explicit vector conversions
  float4 f4 = float4(h4) * back;
  float3 rgb = float3(int3(1, 2, 3));
  float4 c = float4(rgb, 1.0);
  uint2 u2 = uint2(7);
  int2 i2 = int2(u2);
  float2 bits = as_type<float2>(h4);
  c = select(c, c * 0.5, c.x > 0.5);
  c.xy += bits + float2(i2);
  c = mix(c, p.tint, float4(clamp(s, 0.0f, 1.0f)));
  if (kHasTint && kUseTint) c *= p.tint;
  c.w = metal::fast::exp(c.w) + precise::sqrt(fabs(c.z)) + min(c.x, 0.5f) + fma(c.y, 2.0f, 1.0f);
  device float4& dst = out[gid.x];
  dst = c + f4 + float(lane + u2.x + gid.y + gid.z);
  add_float(acc, c.x);
}
