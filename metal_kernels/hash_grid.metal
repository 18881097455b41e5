// Metal kernels of the hash-grid ops (semantics: csrc/ops/hash_grid_op.cc; per-point math shared with the CPU
// kernels: csrc/shared/hash_grid_math.h). Host: csrc/gpu/hash_grid_gpu.cc. Buffers:
//   positions [N*D] float, params [rows*F] T, levels [L] HgLevel (constant), args HgArgs (constant).
// Kernels (T = float32 | float16; spelled out per dtype so the C++ emulation in csrc/msl_emu compiles them):
//   hash_grid_encode_T        grid (N, L): one thread per (point, level); a threadgroup is a run of points of ONE
//                             level (groups are 1-D along x), so that level's table is what the group reads.
//                             Inactive levels (l >= n_active) write zeros. out [N, L*F] T.
//   hash_grid_grad_params_T   grid (N, n_active): scatters weight * dy into acc [rows*F] float32 with float atomics
//                             (atomic_float on MSL >= 3.0, else a CAS loop on atomic_uint; never a plain +=).
//                             acc must be zero on entry (hash_grid_fill_zero); the float16 op converts it with
//                             hash_grid_float_to_half. Summation order is unspecified (not bitwise reproducible).
//   hash_grid_grad_positions_T  grid N: one thread per point, levels in order; dx [N*D] float32, written fully.
//   hash_grid_grad2_points_T  second order (gradient of grad_positions, see hash_grid_math.h "Second order"):
//                             grid N, one thread per point, levels in order; writes d/d(dy) [N, L*F] T (zeros on
//                             inactive levels) and d/dx [N*D] float32 fully. ddx [N*D] float32.
//   hash_grid_grad2_params_T  second order, grid (N, n_active): scatters v[c] * dy into acc [rows*F] float32 with
//                             float atomics (acc zeroed by hash_grid_fill_zero first), like grad_params.
//   hash_grid_fill_zero       x[i] = 0 for i < args.count (float32).
//   hash_grid_float_to_half   y[i] = half(x[i]) for i < args.count.
#include <metal_stdlib>
using namespace metal;

#include "hash_grid_math.h"

// Float atomic add on device memory.
inline void hg_atomic_add(device float* addr, float v) {
#if __METAL_VERSION__ >= 300
  atomic_fetch_add_explicit((device atomic_float*)addr, v, memory_order_relaxed);
#else
  device atomic_uint* a = (device atomic_uint*)addr;
  uint expected = atomic_load_explicit(a, memory_order_relaxed);
  for (;;) {
    const uint desired = as_type<uint>(as_type<float>(expected) + v);
    // On failure `expected` is reloaded with the current value.
    if (atomic_compare_exchange_weak_explicit(a, &expected, desired, memory_order_relaxed, memory_order_relaxed))
      break;
  }
#endif
}

inline void hg_load_point(device const float* positions, uint i, uint dims, thread float* x) {
  for (uint d = 0; d < HG_MAX_DIMS; ++d) x[d] = d < dims ? positions[i * dims + d] : 0.0f;
}

template <typename T>
inline void hg_encode(device const float* positions, device const T* params, constant HgLevel* levels,
                      constant HgArgs& args, device T* out, uint i, uint l) {
  if (i >= args.n || l >= args.n_levels) return;
  const uint F = args.n_features;
  device T* o = out + (ulong)i * (args.n_levels * F) + l * F;
  if (l >= args.n_active) {
    for (uint f = 0; f < F; ++f) o[f] = T(0.0f);
    return;
  }
  const HgLevel lv = levels[l];
  float x[HG_MAX_DIMS];
  hg_load_point(positions, i, args.dims, x);
  HgPoint p;
  hg_point(x, (int)args.dims, lv.scale, (int)args.interpolation, &p);
  const uint nc = hg_num_corners((int)args.dims, (int)args.interpolation);
  float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  for (uint c = 0; c < nc; ++c) {
    const uint row = lv.offset + hg_corner_index(lv, &p, c);
    const float w = nc == 1u ? 1.0f : hg_corner_weight(&p, c, (int)args.dims);
    device const T* v = params + (ulong)row * F;
    for (uint f = 0; f < F; ++f) acc[f] += w * float(v[f]);
  }
  for (uint f = 0; f < F; ++f) o[f] = T(acc[f]);
}

template <typename T>
inline void hg_grad_params(device const T* dy, device const float* positions, constant HgLevel* levels,
                           constant HgArgs& args, device float* acc, uint i, uint l) {
  if (i >= args.n || l >= args.n_active) return;
  const uint F = args.n_features;
  device const T* g = dy + (ulong)i * (args.n_levels * F) + l * F;
  float gf[8];
  for (uint f = 0; f < F; ++f) gf[f] = float(g[f]);
  const HgLevel lv = levels[l];
  float x[HG_MAX_DIMS];
  hg_load_point(positions, i, args.dims, x);
  HgPoint p;
  hg_point(x, (int)args.dims, lv.scale, (int)args.interpolation, &p);
  const uint nc = hg_num_corners((int)args.dims, (int)args.interpolation);
  for (uint c = 0; c < nc; ++c) {
    const uint row = lv.offset + hg_corner_index(lv, &p, c);
    const float w = nc == 1u ? 1.0f : hg_corner_weight(&p, c, (int)args.dims);
    device float* a = acc + (ulong)row * F;
    for (uint f = 0; f < F; ++f) hg_atomic_add(a + f, w * gf[f]);
  }
}

template <typename T>
inline void hg_grad_positions(device const T* dy, device const float* positions, device const T* params,
                              constant HgLevel* levels, constant HgArgs& args, device float* dx_out, uint i) {
  if (i >= args.n) return;
  const uint F = args.n_features;
  const int dims = (int)args.dims;
  float dx[HG_MAX_DIMS] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (args.interpolation != HG_INTERP_NEAREST) {  // nearest: piecewise constant, zero gradient
    float x[HG_MAX_DIMS];
    hg_load_point(positions, i, args.dims, x);
    const uint nc = 1u << args.dims;
    for (uint l = 0; l < args.n_active; ++l) {
      const HgLevel lv = levels[l];
      HgPoint p;
      hg_point(x, dims, lv.scale, (int)args.interpolation, &p);
      device const T* g = dy + (ulong)i * (args.n_levels * F) + l * F;
      float s[16];
      for (uint c = 0; c < nc; ++c) {
        device const T* v = params + (ulong)(lv.offset + hg_corner_index(lv, &p, c)) * F;
        float dot = 0.0f;
        for (uint f = 0; f < F; ++f) dot += float(g[f]) * float(v[f]);
        s[c] = dot;
      }
      hg_accumulate_dx(&p, s, dims, dx);
    }
  }
  for (uint d = 0; d < args.dims; ++d) dx_out[(ulong)i * args.dims + d] = dx[d];
}

template <typename T>
inline void hg_grad2_points(device const float* ddx_in, device const T* dy, device const float* positions,
                            device const T* params, constant HgLevel* levels, constant HgArgs& args,
                            device T* ddy_out, device float* dx_out, uint i) {
  if (i >= args.n) return;
  const uint F = args.n_features;
  const int dims = (int)args.dims;
  float dx[HG_MAX_DIMS] = {0.0f, 0.0f, 0.0f, 0.0f};
  device T* o = ddy_out + (ulong)i * (args.n_levels * F);
  const bool nearest = args.interpolation == HG_INTERP_NEAREST;  // all second-order terms are zero
  float x[HG_MAX_DIMS];
  hg_load_point(positions, i, args.dims, x);
  float dd[HG_MAX_DIMS];
  hg_load_point(ddx_in, i, args.dims, dd);
  const uint nc = 1u << args.dims;
  for (uint l = 0; l < args.n_levels; ++l) {
    if (nearest || l >= args.n_active) {
      for (uint f = 0; f < F; ++f) o[l * F + f] = T(0.0f);
      continue;
    }
    const HgLevel lv = levels[l];
    HgPoint p;
    hg_point(x, dims, lv.scale, (int)args.interpolation, &p);
    float ddw[HG_MAX_DIMS];
    hg_point_d2(x, dims, lv.scale, (int)args.interpolation, ddw);
    float v[16];
    hg_second_order_weights(&p, dd, dims, v);
    device const T* g = dy + (ulong)i * (args.n_levels * F) + l * F;
    float s[16];
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (uint c = 0; c < nc; ++c) {
      device const T* val = params + (ulong)(lv.offset + hg_corner_index(lv, &p, c)) * F;
      float dot = 0.0f;
      for (uint f = 0; f < F; ++f) {
        const float vf = float(val[f]);
        dot += float(g[f]) * vf;
        acc[f] += v[c] * vf;
      }
      s[c] = dot;
    }
    for (uint f = 0; f < F; ++f) o[l * F + f] = T(acc[f]);
    hg_accumulate_d2x(&p, ddw, s, dd, dims, dx);
  }
  for (uint d = 0; d < args.dims; ++d) dx_out[(ulong)i * args.dims + d] = dx[d];
}

template <typename T>
inline void hg_grad2_params(device const float* ddx_in, device const T* dy, device const float* positions,
                            constant HgLevel* levels, constant HgArgs& args, device float* acc, uint i, uint l) {
  if (i >= args.n || l >= args.n_active || args.interpolation == HG_INTERP_NEAREST) return;
  const uint F = args.n_features;
  const int dims = (int)args.dims;
  device const T* g = dy + (ulong)i * (args.n_levels * F) + l * F;
  float gf[8];
  for (uint f = 0; f < F; ++f) gf[f] = float(g[f]);
  const HgLevel lv = levels[l];
  float x[HG_MAX_DIMS];
  hg_load_point(positions, i, args.dims, x);
  float dd[HG_MAX_DIMS];
  hg_load_point(ddx_in, i, args.dims, dd);
  HgPoint p;
  hg_point(x, dims, lv.scale, (int)args.interpolation, &p);
  float v[16];
  hg_second_order_weights(&p, dd, dims, v);
  const uint nc = 1u << args.dims;
  for (uint c = 0; c < nc; ++c) {
    device float* a = acc + (ulong)(lv.offset + hg_corner_index(lv, &p, c)) * F;
    for (uint f = 0; f < F; ++f) hg_atomic_add(a + f, v[c] * gf[f]);
  }
}

kernel void hash_grid_encode_float32(device const float* positions [[buffer(0)]],
                                     device const float* params [[buffer(1)]],
                                     constant HgLevel* levels [[buffer(2)]], constant HgArgs& args [[buffer(3)]],
                                     device float* out [[buffer(4)]], uint2 gid [[thread_position_in_grid]]) {
  hg_encode(positions, params, levels, args, out, gid.x, gid.y);
}

kernel void hash_grid_encode_float16(device const float* positions [[buffer(0)]],
                                     device const half* params [[buffer(1)]],
                                     constant HgLevel* levels [[buffer(2)]], constant HgArgs& args [[buffer(3)]],
                                     device half* out [[buffer(4)]], uint2 gid [[thread_position_in_grid]]) {
  hg_encode(positions, params, levels, args, out, gid.x, gid.y);
}

kernel void hash_grid_grad_params_float32(device const float* dy [[buffer(0)]],
                                          device const float* positions [[buffer(1)]],
                                          constant HgLevel* levels [[buffer(2)]], constant HgArgs& args [[buffer(3)]],
                                          device float* acc [[buffer(4)]], uint2 gid [[thread_position_in_grid]]) {
  hg_grad_params(dy, positions, levels, args, acc, gid.x, gid.y);
}

kernel void hash_grid_grad_params_float16(device const half* dy [[buffer(0)]],
                                          device const float* positions [[buffer(1)]],
                                          constant HgLevel* levels [[buffer(2)]], constant HgArgs& args [[buffer(3)]],
                                          device float* acc [[buffer(4)]], uint2 gid [[thread_position_in_grid]]) {
  hg_grad_params(dy, positions, levels, args, acc, gid.x, gid.y);
}

kernel void hash_grid_grad_positions_float32(device const float* dy [[buffer(0)]],
                                             device const float* positions [[buffer(1)]],
                                             device const float* params [[buffer(2)]],
                                             constant HgLevel* levels [[buffer(3)]],
                                             constant HgArgs& args [[buffer(4)]], device float* dx [[buffer(5)]],
                                             uint gid [[thread_position_in_grid]]) {
  hg_grad_positions(dy, positions, params, levels, args, dx, gid);
}

kernel void hash_grid_grad_positions_float16(device const half* dy [[buffer(0)]],
                                             device const float* positions [[buffer(1)]],
                                             device const half* params [[buffer(2)]],
                                             constant HgLevel* levels [[buffer(3)]],
                                             constant HgArgs& args [[buffer(4)]], device float* dx [[buffer(5)]],
                                             uint gid [[thread_position_in_grid]]) {
  hg_grad_positions(dy, positions, params, levels, args, dx, gid);
}

kernel void hash_grid_grad2_points_float32(device const float* ddx [[buffer(0)]],
                                           device const float* dy [[buffer(1)]],
                                           device const float* positions [[buffer(2)]],
                                           device const float* params [[buffer(3)]],
                                           constant HgLevel* levels [[buffer(4)]], constant HgArgs& args [[buffer(5)]],
                                           device float* ddy [[buffer(6)]], device float* dx [[buffer(7)]],
                                           uint gid [[thread_position_in_grid]]) {
  hg_grad2_points(ddx, dy, positions, params, levels, args, ddy, dx, gid);
}

kernel void hash_grid_grad2_points_float16(device const float* ddx [[buffer(0)]],
                                           device const half* dy [[buffer(1)]],
                                           device const float* positions [[buffer(2)]],
                                           device const half* params [[buffer(3)]],
                                           constant HgLevel* levels [[buffer(4)]], constant HgArgs& args [[buffer(5)]],
                                           device half* ddy [[buffer(6)]], device float* dx [[buffer(7)]],
                                           uint gid [[thread_position_in_grid]]) {
  hg_grad2_points(ddx, dy, positions, params, levels, args, ddy, dx, gid);
}

kernel void hash_grid_grad2_params_float32(device const float* ddx [[buffer(0)]],
                                           device const float* dy [[buffer(1)]],
                                           device const float* positions [[buffer(2)]],
                                           constant HgLevel* levels [[buffer(3)]], constant HgArgs& args [[buffer(4)]],
                                           device float* acc [[buffer(5)]], uint2 gid [[thread_position_in_grid]]) {
  hg_grad2_params(ddx, dy, positions, levels, args, acc, gid.x, gid.y);
}

kernel void hash_grid_grad2_params_float16(device const float* ddx [[buffer(0)]],
                                           device const half* dy [[buffer(1)]],
                                           device const float* positions [[buffer(2)]],
                                           constant HgLevel* levels [[buffer(3)]], constant HgArgs& args [[buffer(4)]],
                                           device float* acc [[buffer(5)]], uint2 gid [[thread_position_in_grid]]) {
  hg_grad2_params(ddx, dy, positions, levels, args, acc, gid.x, gid.y);
}

kernel void hash_grid_fill_zero(device float* x [[buffer(0)]], constant HgArgs& args [[buffer(1)]],
                                uint gid [[thread_position_in_grid]]) {
  if (gid < args.count) x[gid] = 0.0f;
}

kernel void hash_grid_float_to_half(device const float* x [[buffer(0)]], device half* y [[buffer(1)]],
                                    constant HgArgs& args [[buffer(2)]], uint gid [[thread_position_in_grid]]) {
  if (gid < args.count) y[gid] = half(x[gid]);
}
