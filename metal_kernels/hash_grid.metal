// Metal kernels of the hash-grid ops (semantics: csrc/ops/hash_grid_op.cc; per-point math shared with the CPU
// kernels: csrc/shared/hash_grid_math.h). Host: csrc/gpu/hash_grid_gpu.cc. Buffers:
//   positions [N*D] float, params [rows*F] T, levels [L] HgLevel (constant), args HgArgs (constant).
// Kernels (T = float32 | float16; spelled out per dtype so the C++ emulation in csrc/msl_emu compiles them):
//   hash_grid_encode_T        1-D grid of N*L threads: thread t encodes point t / L at level t % L (the level
//                             fastest: a SIMD group writes one contiguous run of the [N, L*F] output).
//                             Inactive levels (l >= n_active) write zeros. out [N, L*F] T.
//   hash_grid_grad_params_T   grid (N, n_active), threadgroups 1-D along the points (a SIMD group is one level):
//                             scatters weight * dy into acc [rows*F] float32 with float atomics (atomic_float on
//                             MSL >= 3.0, else a CAS loop on atomic_uint; never a plain +=). On levels
//                             l < args.n_aggregate, adjacent lanes adding to the same row sum in the SIMD group
//                             first (hg_scatter_runs) and one lane does the atomic. acc must be zero on entry
//                             (hash_grid_fill_zero); the float16 op converts it with hash_grid_float_to_half.
//                             Summation order is unspecified (not bitwise reproducible).
//   hash_grid_grad_positions_T  grid N: one thread per point, levels in order; dx [N*D] float32, written fully.
//   hash_grid_grad2_points_T  second order (gradient of grad_positions, see hash_grid_math.h "Second order"):
//                             grid N, one thread per point, levels in order; writes d/d(dy) [N, L*F] T (zeros on
//                             inactive levels) and d/dx [N*D] float32 fully. ddx [N*D] float32.
//   hash_grid_grad2_params_T  second order, grid (N, n_active): scatters v[c] * dy into acc [rows*F] float32 like
//                             grad_params (run sums on levels l < n_aggregate; acc zeroed first).
//   hash_grid_fill_zero       x[i] = 0 for i < args.count (float32).
//   hash_grid_float_to_half   y[i] = half(x[i]) for i < args.count.
// Specialisation: the configurations listed in hg_encode / hg_scatter (linear interpolation with (D, F) = (3, 2),
// (2, 2), (3, 4)) run instances with D, F and the interpolation as compile-time constants (points, weights and
// accumulators in registers); the others run the general instance. Both do the same float operations in the same
// order, so the choice never changes a result.
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

// One active level of one point: acc[f] = sum over corners of weight * params[row][f]. DIMS, FEAT, INTERP are the
// compile-time configuration (0, 0, -1: read from args); a specialised instance keeps the point, its weights and the
// accumulators in registers.
template <typename T, uint DIMS, uint FEAT, int INTERP>
inline void hg_encode_level(device const float* positions, device const T* params, constant HgLevel* levels,
                            constant HgArgs& args, uint i, uint l, thread float* acc) {
  const uint dims = DIMS ? DIMS : args.dims;
  const uint F = FEAT ? FEAT : args.n_features;
  const int interp = INTERP >= 0 ? INTERP : (int)args.interpolation;
  const HgLevel lv = levels[l];
  float x[HG_MAX_DIMS];
  hg_load_point(positions, i, dims, x);
  HgPoint p;
  hg_point(x, (int)dims, lv.scale, interp, &p);
  const uint nc = hg_num_corners((int)dims, interp);
  for (uint f = 0; f < F; ++f) acc[f] = 0.0f;
  for (uint c = 0; c < nc; ++c) {
    const uint row = lv.offset + hg_corner_index(lv, &p, c);
    const float w = nc == 1u ? 1.0f : hg_corner_weight(&p, c, (int)dims);
    device const T* v = params + (ulong)row * F;
    for (uint f = 0; f < F; ++f) acc[f] += w * float(v[f]);
  }
}

template <typename T, uint DIMS, uint FEAT, int INTERP>
inline void hg_encode_store(device const float* positions, device const T* params, constant HgLevel* levels,
                            constant HgArgs& args, device T* o, uint i, uint l) {
  float acc[HG_MAX_FEATURES];
  hg_encode_level<T, DIMS, FEAT, INTERP>(positions, params, levels, args, i, l, acc);
  const uint F = FEAT ? FEAT : args.n_features;
  for (uint f = 0; f < F; ++f) o[f] = T(acc[f]);
}

// Output row i, columns l*F .. l*F + F - 1 (zeros for an inactive level). The configurations of HG_SPECIALISED
// run with D, F and the interpolation known at compile time; every other one takes the general instance (same
// arithmetic in the same order: identical results).
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
  const bool linear = args.interpolation == HG_INTERP_LINEAR;
  if (linear && args.dims == 3 && F == 2) hg_encode_store<T, 3, 2, HG_INTERP_LINEAR>(positions, params, levels, args, o, i, l);
  else if (linear && args.dims == 2 && F == 2) hg_encode_store<T, 2, 2, HG_INTERP_LINEAR>(positions, params, levels, args, o, i, l);
  else if (linear && args.dims == 3 && F == 4) hg_encode_store<T, 3, 4, HG_INTERP_LINEAR>(positions, params, levels, args, o, i, l);
  else hg_encode_store<T, 0, 0, -1>(positions, params, levels, args, o, i, l);
}

#define HG_NO_ROW 0xFFFFFFFFu

// Scatter of one corner's terms v[0..F) into acc rows `row` (HG_NO_ROW: this lane has none). Called by every active
// lane of the SIMD group at once (uniform control flow). Adjacent lanes adding to the same row form a run
// (consecutive samples of a ray share the cells of the coarse levels); the run's terms are summed in the SIMD group
// (a segmented tree over the run, in a fixed order) and its first lane does one atomic per feature.
template <uint FEAT>
inline void hg_scatter_runs(device float* acc, uint row, thread float* v, uint F, uint lane) {
  const uint active = uint((simd_vote::vote_t)simd_active_threads_mask());
  const uint next_row = simd_shuffle_down(row, (ushort)1);
  const bool next_active = lane < 31u && ((active >> (lane + 1u)) & 1u);
  const bool tail = !next_active || next_row != row;
  const uint tails = uint((simd_vote::vote_t)simd_ballot(tail));
  if (tails != active) {  // some run is longer than one lane (uniform: tails and active are the SIMD group's)
    const uint run_last = lane + ctz(tails >> lane);  // the caller's own bit is set when it is a tail: never ctz(0)
    for (ushort off = 1; off < 32; off <<= 1) {
      for (uint f = 0; f < (FEAT ? FEAT : F); ++f) {
        const float o = simd_shuffle_down(v[f], off);
        if (lane + off <= run_last) v[f] += o;
      }
    }
  }
  const bool head = lane == 0u || !((active >> (lane - 1u)) & 1u) || ((tails >> (lane - 1u)) & 1u);
  if (head && row != HG_NO_ROW) {
    device float* a = acc + (ulong)row * (FEAT ? FEAT : F);
    for (uint f = 0; f < (FEAT ? FEAT : F); ++f) hg_atomic_add(a + f, v[f]);
  }
}

// Table gradient of one (point, level): corner c's row gets weight_c * dy[f] (grad_params) or v[c] * dy[f]
// (grad2_params, SECOND). Plain atomics, or run sums in the SIMD group first (aggregate; uniform per SIMD group:
// a threadgroup is one level). DIMS/FEAT/INTERP as hg_encode_level.
template <typename T, uint DIMS, uint FEAT, int INTERP, bool SECOND>
inline void hg_scatter_level(device const float* ddx_in, device const T* dy, device const float* positions,
                             constant HgLevel* levels, constant HgArgs& args, device float* acc, uint i, uint l,
                             bool valid, bool aggregate, uint lane) {
  const uint dims = DIMS ? DIMS : args.dims;
  const uint F = FEAT ? FEAT : args.n_features;
  const int interp = INTERP >= 0 ? INTERP : (int)args.interpolation;
  const HgLevel lv = levels[l];
  float gf[HG_MAX_FEATURES];
  HgPoint p;
  float wc[16];
  if (valid) {
    device const T* g = dy + (ulong)i * (args.n_levels * F) + l * F;
    for (uint f = 0; f < F; ++f) gf[f] = float(g[f]);
    float x[HG_MAX_DIMS];
    hg_load_point(positions, i, dims, x);
    hg_point(x, (int)dims, lv.scale, interp, &p);
    if (SECOND) {
      float dd[HG_MAX_DIMS];
      hg_load_point(ddx_in, i, dims, dd);
      hg_second_order_weights(&p, dd, (int)dims, wc);
    }
  } else {
    for (uint f = 0; f < F; ++f) gf[f] = 0.0f;
    for (uint d = 0; d < HG_MAX_DIMS; ++d) { p.grid[d] = 0u; p.w[d] = 0.0f; p.dw[d] = 0.0f; }
    for (uint c = 0; c < 16u; ++c) wc[c] = 0.0f;
  }
  const uint nc = SECOND ? 1u << dims : hg_num_corners((int)dims, interp);
  for (uint c = 0; c < nc; ++c) {
    const uint row = valid ? lv.offset + hg_corner_index(lv, &p, c) : HG_NO_ROW;
    const float w = SECOND ? wc[c] : (nc == 1u ? 1.0f : hg_corner_weight(&p, c, (int)dims));
    float v[HG_MAX_FEATURES];
    for (uint f = 0; f < F; ++f) v[f] = w * gf[f];
    if (aggregate) {
      hg_scatter_runs<FEAT>(acc, row, v, F, lane);
    } else if (valid) {
      device float* a = acc + (ulong)row * F;
      for (uint f = 0; f < F; ++f) hg_atomic_add(a + f, v[f]);
    }
  }
}

// grid (N, n_active), threadgroups 1-D along the points: a SIMD group is one level. Lanes past N stay in the SIMD
// group without a term (the run sums need every lane at each call).
template <typename T, bool SECOND>
inline void hg_scatter(device const float* ddx_in, device const T* dy, device const float* positions,
                       constant HgLevel* levels, constant HgArgs& args, device float* acc, uint i, uint l, uint lane) {
  if (l >= args.n_active || (SECOND && args.interpolation == HG_INTERP_NEAREST)) return;
  const bool valid = i < args.n;
  const bool aggregate = l < args.n_aggregate;
  if (!valid && !aggregate) return;
  const bool linear = args.interpolation == HG_INTERP_LINEAR;
  const uint F = args.n_features;
  if (linear && args.dims == 3 && F == 2)
    hg_scatter_level<T, 3, 2, HG_INTERP_LINEAR, SECOND>(ddx_in, dy, positions, levels, args, acc, i, l, valid, aggregate, lane);
  else if (linear && args.dims == 2 && F == 2)
    hg_scatter_level<T, 2, 2, HG_INTERP_LINEAR, SECOND>(ddx_in, dy, positions, levels, args, acc, i, l, valid, aggregate, lane);
  else if (linear && args.dims == 3 && F == 4)
    hg_scatter_level<T, 3, 4, HG_INTERP_LINEAR, SECOND>(ddx_in, dy, positions, levels, args, acc, i, l, valid, aggregate, lane);
  else
    hg_scatter_level<T, 0, 0, -1, SECOND>(ddx_in, dy, positions, levels, args, acc, i, l, valid, aggregate, lane);
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

kernel void hash_grid_encode_float32(device const float* positions [[buffer(0)]],
                                     device const float* params [[buffer(1)]],
                                     constant HgLevel* levels [[buffer(2)]], constant HgArgs& args [[buffer(3)]],
                                     device float* out [[buffer(4)]], uint gid [[thread_position_in_grid]]) {
  hg_encode(positions, params, levels, args, out, gid / args.n_levels, gid % args.n_levels);
}

kernel void hash_grid_encode_float16(device const float* positions [[buffer(0)]],
                                     device const half* params [[buffer(1)]],
                                     constant HgLevel* levels [[buffer(2)]], constant HgArgs& args [[buffer(3)]],
                                     device half* out [[buffer(4)]], uint gid [[thread_position_in_grid]]) {
  hg_encode(positions, params, levels, args, out, gid / args.n_levels, gid % args.n_levels);
}

kernel void hash_grid_grad_params_float32(device const float* dy [[buffer(0)]],
                                          device const float* positions [[buffer(1)]],
                                          constant HgLevel* levels [[buffer(2)]], constant HgArgs& args [[buffer(3)]],
                                          device float* acc [[buffer(4)]], uint2 gid [[thread_position_in_grid]],
                                          uint lane [[thread_index_in_simdgroup]]) {
  hg_scatter<float, false>(nullptr, dy, positions, levels, args, acc, gid.x, gid.y, lane);
}

kernel void hash_grid_grad_params_float16(device const half* dy [[buffer(0)]],
                                          device const float* positions [[buffer(1)]],
                                          constant HgLevel* levels [[buffer(2)]], constant HgArgs& args [[buffer(3)]],
                                          device float* acc [[buffer(4)]], uint2 gid [[thread_position_in_grid]],
                                          uint lane [[thread_index_in_simdgroup]]) {
  hg_scatter<half, false>(nullptr, dy, positions, levels, args, acc, gid.x, gid.y, lane);
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
                                           device float* acc [[buffer(5)]], uint2 gid [[thread_position_in_grid]],
                                           uint lane [[thread_index_in_simdgroup]]) {
  hg_scatter<float, true>(ddx, dy, positions, levels, args, acc, gid.x, gid.y, lane);
}

kernel void hash_grid_grad2_params_float16(device const float* ddx [[buffer(0)]],
                                           device const half* dy [[buffer(1)]],
                                           device const float* positions [[buffer(2)]],
                                           constant HgLevel* levels [[buffer(3)]], constant HgArgs& args [[buffer(4)]],
                                           device float* acc [[buffer(5)]], uint2 gid [[thread_position_in_grid]],
                                           uint lane [[thread_index_in_simdgroup]]) {
  hg_scatter<half, true>(ddx, dy, positions, levels, args, acc, gid.x, gid.y, lane);
}

kernel void hash_grid_fill_zero(device float* x [[buffer(0)]], constant HgArgs& args [[buffer(1)]],
                                uint gid [[thread_position_in_grid]]) {
  if (gid < args.count) x[gid] = 0.0f;
}

kernel void hash_grid_float_to_half(device const float* x [[buffer(0)]], device half* y [[buffer(1)]],
                                    constant HgArgs& args [[buffer(2)]], uint gid [[thread_position_in_grid]]) {
  if (gid < args.count) y[gid] = half(x[gid]);
}
