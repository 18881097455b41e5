// Metal kernels of the hash-grid ops (semantics: csrc/ops/hash_grid_op.cc; per-point math shared with the CPU
// kernels: csrc/shared/hash_grid_math.h). Host: csrc/gpu/hash_grid_gpu.cc. Buffers:
//   positions [N*D] float, params [rows*F] T, levels [L] HgLevel (constant), args HgArgs (constant).
// Kernels (each a template, instantiated by name below it for T = float32 | float16 and the specialisations):
//   hash_grid_encode_T, hash_grid_encode_d3f2_T
//                             1-D grid, one thread per (point, level): a SIMD group takes G levels of 32 / G points
//                             (hg_encode_thread; G from the host). out [N, L*F] T.
//   hash_grid_encode_fm_T, hash_grid_encode_fm_d3f2_T (feature-major)
//                             grid (N, L), threadgroups (T, 1, 1): a SIMD group is 32 consecutive points of one
//                             level (tiny-cuda-nn's launch). The level is the threadgroup's y, so the compiler sees
//                             it uniform across the threadgroup (as tcnn's blockIdx.y): the level's fields, and the
//                             branches on its index mode, are uniform. out [L*F, N] T.
//                             Inactive levels (l >= n_active) write zeros.
//                             The gradient kernels read dy (and write d/d(dy)) in the layout args.feature_major
//                             says: the scatters through hg_col, the per-point kernels as one instance per layout.
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
//   hash_grid_grad_params_d3f2_T, hash_grid_grad2_params_d3f2_T: the same for D = 3, F = 2, linear interpolation
//                             (compile-time; the host launches them for that configuration).
//   hash_grid_grad{,2}_params_det[_d3f2]_T: the deterministic table gradients (HgFixedSink: fixed-point sums with
//                             integer atomics into words [3 * rows * F] uint (hash_grid_fixed_init), header meta
//                             [2 + L] uint, zeroed), with hash_grid_abs_max_T (max |dy|, max |ddx|), hash_grid_fixed_exponents
//                             (grid L) before and hash_grid_fixed_to_T (grid rows * F, into the output) after.
//   hash_grid_fill_zero, hash_grid_fill_zero_uint  x[i] = 0 for i < args.count (float32, uint).
//   hash_grid_float_to_half   y[i] = half(x[i]) for i < args.count.
// Specialisation: D, F and the interpolation as compile-time constants keep points, weights and accumulators in
// registers. D = 3, F = 2, linear (the NeRF configuration) has kernels of its own (_d3f2: the encode and the
// scatters); the general encode dispatches inside the kernel (linear (D, F) = (2, 2), (3, 4); else the general
// instance). Every instance does the same float operations in the same order as the general one, so the choice
// never changes a result. Functions are TFMO_FN (always inlined): a call would pass the per-thread arrays through
// memory.
#include <metal_stdlib>
using namespace metal;

#include "hash_grid_math.h"

// Offset of element (point i, column k = l*F + f) in the encoded-shaped buffers (out, dy, d/d(dy)): [N, L*F], or
// [L*F, N] when args.feature_major (tiny-cuda-nn's layout).
TFMO_FN ulong hg_col(constant HgArgs& args, uint i, uint k) {
  return args.feature_major ? (ulong)k * args.n + i : (ulong)i * (args.n_levels * args.n_features) + k;
}

// Float atomic add on device memory.
TFMO_FN void hg_atomic_add(device float* addr, float v) {
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

// ---- Table-gradient sinks: where a scatter's terms go. A sink is built per level (for_level) and takes one term
// for one table element (add). HgFloatSink: float atomics into a float32 accumulator (the order of the additions
// varies between runs). HgFixedSink: the deterministic gradient, below.
struct HgFloatSink {
  device float* acc;
  HgFloatSink for_level(uint) const { return *this; }
  void add(ulong e, float v) const { hg_atomic_add(acc + e, v); }
};

// ---- Deterministic table gradient (fixed point). The header `meta` (uint words): HG_FIXED_DY_MAX, HG_FIXED_DDX_MAX
// hold the largest finite |dy| and |ddx| as float bits (hash_grid_abs_max; the bits of non-negative floats order as
// uints), HG_FIXED_EXPONENTS + l level l's exponent e_l (hash_grid_fixed_exponents). A term t of level l becomes
// the integer rint(t * 2^e_l), added exactly into element e's 64-bit two's-complement sum held as two uint words
// (words[2e] low, words[2e+1] high) with integer atomics: integer addition is associative, so the sums, and the
// float each becomes (hash_grid_fixed_to_T: float(sum) * 2^-e_l, one rounding), do not depend on the order of the
// adds, on thread scheduling or on the threadgroups' placement. Every term of level l is bounded by B_l < 2^E_l
// (grad_params: max|dy|, the weights are in [0,1]; grad2_params: max|dy| * D * max|ddx| * 1.5 * scale_l, a bound
// of |v[c]|), and an element takes at most N * corners terms: e_l = min(31 - E_l, 62 - E_l - log2 bound of N *
// corners) keeps every term below 2^31 and every sum below 2^62. Each term's rounding error is at most
// 2^-(e_l + 1) <= 2^-31 B_l; a sum's, its number of terms times that. The sums start at HG_FIXED_BIAS (2^31, in
// the low word; hash_grid_fixed_init) and the conversion subtracts it: a sum that stays within +-2^31 never carries
// out of the low word, so the high word's atomic (needed only on a carry, or a borrow) stays rare. A non-finite term sets a bit in
// flags[e] (words[2 * count + e]) instead, resolved as float addition would: NaN if any term is NaN or both
// infinities occur, else that infinity.
// (HG_FIXED_*, HG_FLAG_*: hash_grid_math.h)

// x * 2^e for |e| <= 252, in two exact power-of-two steps (one rounding, where the result is subnormal).
TFMO_FN float hg_ldexp(float x, int e) {
  const int a = e / 2, b = e - a;
  return (x * as_type<float>(uint(a + 127) << 23)) * as_type<float>(uint(b + 127) << 23);
}

// The smallest E with x < 2^E, for finite x >= 0 given as its float bits (zero and subnormals: -126).
TFMO_FN int hg_exponent_above(uint bits) {
  const int biased = int((bits >> 23) & 0xFFu);
  return biased == 0 ? -126 : biased - 126;
}

// The smallest E with n < 2^E (n >= 1), for counts.
TFMO_FN int hg_count_exponent(uint n) { return 32 - int(clz(n)); }

struct HgFixedSink {
  device atomic_uint* words;  // [2 * count] sums, then [count] flags
  device const uint* meta;
  uint count;
  int exponent;
  HgFixedSink for_level(uint l) const {
    HgFixedSink s = *this;
    s.exponent = as_type<int>(meta[HG_FIXED_EXPONENTS + l]);
    return s;
  }
  void add(ulong e, float v) const {
    if (!isfinite(v)) {
      const uint bit = isnan(v) ? HG_FLAG_NAN : (v > 0.0f ? HG_FLAG_POS_INF : HG_FLAG_NEG_INF);
      atomic_fetch_or_explicit(words + 2ul * count + e, bit, memory_order_relaxed);
      return;
    }
    const long x = long(rint(hg_ldexp(v, exponent)));
    if (x == 0) return;
    const uint lo = uint(ulong(x)), hi = uint(ulong(x) >> 32);
    const uint old = atomic_fetch_add_explicit(words + 2ul * e, lo, memory_order_relaxed);
    const uint high = hi + (old + lo < old ? 1u : 0u);  // the carry out of the low word, counted once by its adder
    if (high != 0u) atomic_fetch_add_explicit(words + 2ul * e + 1ul, high, memory_order_relaxed);
  }
};

TFMO_FN void hg_load_point(device const float* positions, uint i, uint dims, thread float* x) {
  for (uint d = 0; d < HG_MAX_DIMS; ++d) x[d] = d < dims ? positions[i * dims + d] : 0.0f;
}

// acc[f] += weight_c * params[row_c][f] over the nc corners of p, in corner order. MODE: the level's index mode
// (HG_INDEX_*) fixed for the whole loop, or -1: dispatched per corner (hg_index).
template <typename T, int MODE>
TFMO_FN void hg_gather_corners(device const T* params, HgLevel lv, thread const HgPoint* p, uint nc, uint F,
                               uint dims, thread float* acc) {
  for (uint c = 0; c < nc; ++c) {
    const uint g0 = p->grid[0] + (c & 1u), g1 = p->grid[1] + ((c >> 1) & 1u), g2 = p->grid[2] + ((c >> 2) & 1u),
               g3 = p->grid[3] + ((c >> 3) & 1u);
    const uint idx = MODE == HG_INDEX_HASH    ? hg_index_hash(lv, g0, g1, g2, g3)
                     : MODE == HG_INDEX_DENSE ? hg_index_dense(lv, g0, g1, g2, g3)
                     : MODE == HG_INDEX_TILED ? hg_index_tiled(lv, g0, g1, g2, g3)
                                              : hg_index(lv, g0, g1, g2, g3);
    const float w = nc == 1u ? 1.0f : hg_corner_weight(p, c, (int)dims);
    device const T* v = params + (ulong)(lv.offset + idx) * F;
    for (uint f = 0; f < F; ++f) acc[f] += w * float(v[f]);
  }
}

// One active level of one point: acc[f] = sum over corners of weight * params[row][f]. DIMS, FEAT, INTERP are the
// compile-time configuration (0, 0, -1: read from args); a specialised instance keeps the point, its weights and the
// accumulators in registers. HOIST: branch on the level's index mode once, before the corner loop (a loop without
// branches, whose corner loads the compiler issues together), instead of once per corner. The _d3f2 kernels hoist
// for float32 tables and not for float16 ones, nor does the general instance: each choice is the faster one on the
// GPU proxy (bench/gpu_proxy.md, the encode rows of the latest-run table hold the kept variants); the choice never
// changes a result.
template <typename T, uint DIMS, uint FEAT, int INTERP, bool HOIST = false>
TFMO_FN void hg_encode_level(device const float* positions, device const T* params, constant HgLevel* levels,
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
  if (!HOIST) hg_gather_corners<T, -1>(params, lv, &p, nc, F, dims, acc);
  else if (lv.mode == HG_INDEX_HASH) hg_gather_corners<T, HG_INDEX_HASH>(params, lv, &p, nc, F, dims, acc);
  else if (lv.mode == HG_INDEX_DENSE) hg_gather_corners<T, HG_INDEX_DENSE>(params, lv, &p, nc, F, dims, acc);
  else hg_gather_corners<T, HG_INDEX_TILED>(params, lv, &p, nc, F, dims, acc);
}

template <typename T, uint DIMS, uint FEAT, int INTERP>
TFMO_FN void hg_encode_store(device const float* positions, device const T* params, constant HgLevel* levels,
                            constant HgArgs& args, device T* o, uint fs, uint i, uint l) {
  float acc[HG_MAX_FEATURES];
  hg_encode_level<T, DIMS, FEAT, INTERP>(positions, params, levels, args, i, l, acc);
  const uint F = FEAT ? FEAT : args.n_features;
  for (uint f = 0; f < F; ++f) o[f * fs] = T(acc[f]);
}

// Output point i, columns l*F .. l*F + F - 1 (zeros for an inactive level), into [N, L*F], or [L*F, N] when FM
// (feature-major: the _fm kernels; the layout is a compile-time choice, so the point-major kernels carry no
// branch on it). Linear (D, F) = (2, 2) and (3, 4) run with D, F and the interpolation known at compile time; every
// other configuration takes the general instance (same arithmetic in the same order: identical results). D = 3,
// F = 2, linear has a kernel of its own (hg_encode_d3f2).
template <typename T, bool FM>
TFMO_FN void hg_encode(device const float* positions, device const T* params, constant HgLevel* levels,
                      constant HgArgs& args, device T* out, uint i, uint l) {
  if (i >= args.n || l >= args.n_levels) return;
  const uint F = args.n_features;
  const uint fs = FM ? args.n : 1u;  // feature f at o[f * fs]
  device T* o = out + (FM ? (ulong)(l * F) * args.n + i : (ulong)i * (args.n_levels * F) + l * F);
  if (l >= args.n_active) {
    for (uint f = 0; f < F; ++f) o[f * fs] = T(0.0f);
    return;
  }
  const bool linear = args.interpolation == HG_INTERP_LINEAR;
  if (linear && args.dims == 2 && F == 2) hg_encode_store<T, 2, 2, HG_INTERP_LINEAR>(positions, params, levels, args, o, fs, i, l);
  else if (linear && args.dims == 3 && F == 4) hg_encode_store<T, 3, 4, HG_INTERP_LINEAR>(positions, params, levels, args, o, fs, i, l);
  else hg_encode_store<T, 0, 0, -1>(positions, params, levels, args, o, fs, i, l);
}

// Two-element vectors of T.
template <typename T> struct HgVec2;
template <> struct HgVec2<float> { typedef float2 type; };
template <> struct HgVec2<half> { typedef half2 type; };

// hg_encode for D = 3, F = 2, linear only: a kernel holding no other instance takes only its registers (on the GPU
// proxy, bench/gpu_proxy.md: 32 / 40 for float32 / float16 tables, against the general kernel's 48). Point-major:
// one two-element store per thread; feature-major (FM): one store into each of the level's two rows, so a SIMD
// group of 32 consecutive points (the _fm kernels' grid (N, L)) writes two contiguous runs.
template <typename T, bool FM>
TFMO_FN void hg_encode_d3f2(device const float* positions, device const T* params, constant HgLevel* levels,
                           constant HgArgs& args, device T* out, uint i, uint l) {
  if (i >= args.n || l >= args.n_levels) return;
  const uint fs = FM ? args.n : 1u;  // feature f at o[f * fs]
  device T* o = out + (FM ? (ulong)(2u * l) * args.n + i : (ulong)i * (args.n_levels * 2u) + l * 2u);
  if (l >= args.n_active) {
    o[0] = T(0.0f);
    o[fs] = T(0.0f);
    return;
  }
  float acc[HG_MAX_FEATURES];
  hg_encode_level<T, 3, 2, HG_INTERP_LINEAR, sizeof(T) == 4>(positions, params, levels, args, i, l, acc);
  if (FM) {
    o[0] = T(acc[0]);
    o[fs] = T(acc[1]);
    return;
  }
  typename HgVec2<T>::type v;  // one two-element store (o is 2-element aligned: the op allocates the output)
  v.x = T(acc[0]);
  v.y = T(acc[1]);
  *(device typename HgVec2<T>::type*)o = v;
}

#define HG_NO_ROW 0xFFFFFFFFu

// Scatter of one corner's terms v[0..F) into acc rows `row` (HG_NO_ROW: this lane has none). Called by every active
// lane of the SIMD group at once (uniform control flow). Adjacent lanes adding to the same row form a run
// (consecutive samples of a ray share the cells of the coarse levels); the run's terms are summed in the SIMD group
// (a segmented tree over the run, in a fixed order) and its first lane does one atomic per feature.
template <uint FEAT, typename Sink>
TFMO_FN void hg_scatter_runs(thread const Sink& sink, uint row, thread float* v, uint F, uint lane) {
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
    const ulong e = (ulong)row * (FEAT ? FEAT : F);
    for (uint f = 0; f < (FEAT ? FEAT : F); ++f) sink.add(e + f, v[f]);
  }
}

// Table gradient of one (point, level): corner c's row gets weight_c * dy[f] (grad_params) or v[c] * dy[f]
// (grad2_params, SECOND). Plain atomics, or run sums in the SIMD group first (aggregate; uniform per SIMD group:
// a threadgroup is one level). DIMS/FEAT/INTERP as hg_encode_level.
template <typename T, uint DIMS, uint FEAT, int INTERP, bool SECOND, typename Sink>
TFMO_FN void hg_scatter_level(device const float* ddx_in, device const T* dy, device const float* positions,
                             constant HgLevel* levels, constant HgArgs& args, thread const Sink& sink, uint i,
                             uint l, bool valid, bool aggregate, uint lane) {
  const uint dims = DIMS ? DIMS : args.dims;
  const uint F = FEAT ? FEAT : args.n_features;
  const int interp = INTERP >= 0 ? INTERP : (int)args.interpolation;
  const HgLevel lv = levels[l];
  float gf[HG_MAX_FEATURES];
  HgPoint p;
  float dd[HG_MAX_DIMS] = {0.0f, 0.0f, 0.0f, 0.0f};  // SECOND: the point's ddx (each corner's weight from it)
  if (valid) {
    for (uint f = 0; f < F; ++f) gf[f] = float(dy[hg_col(args, i, l * F + f)]);
    float x[HG_MAX_DIMS];
    hg_load_point(positions, i, dims, x);
    hg_point(x, (int)dims, lv.scale, interp, &p);
    if (SECOND) hg_load_point(ddx_in, i, dims, dd);
  } else {
    for (uint f = 0; f < F; ++f) gf[f] = 0.0f;
    for (uint d = 0; d < HG_MAX_DIMS; ++d) { p.grid[d] = 0u; p.w[d] = 0.0f; p.dw[d] = 0.0f; }
  }
  const uint nc = SECOND ? 1u << dims : hg_num_corners((int)dims, interp);
  for (uint c = 0; c < nc; ++c) {
    const uint row = valid ? lv.offset + hg_corner_index(lv, &p, c) : HG_NO_ROW;
    const float w = SECOND ? hg_second_order_weight(&p, dd, (int)dims, c)
                           : (nc == 1u ? 1.0f : hg_corner_weight(&p, c, (int)dims));
    float v[HG_MAX_FEATURES];
    for (uint f = 0; f < F; ++f) v[f] = w * gf[f];
    if (aggregate) {
      hg_scatter_runs<FEAT>(sink, row, v, F, lane);
    } else if (valid) {
      const ulong e = (ulong)row * F;
      for (uint f = 0; f < F; ++f) sink.add(e + f, v[f]);
    }
  }
}

// grid (N, n_active), threadgroups 1-D along the points: a SIMD group is one level. A thread past N (a host that
// rounds the grid up) takes part in the run sums without a term. DIMS/FEAT/INTERP: see hg_encode_level; each
// configuration is a kernel of its own (hash_grid_grad_params_d3f2_T ...): one kernel holding several instances
// takes the registers of the largest, which costs the scatter its occupancy (bench/gpu_proxy.md).
template <typename T, bool SECOND, uint DIMS, uint FEAT, int INTERP, typename Sink>
TFMO_FN void hg_scatter(device const float* ddx_in, device const T* dy, device const float* positions,
                       constant HgLevel* levels, constant HgArgs& args, Sink sink, uint i, uint l, uint lane) {
  if (l >= args.n_active || (SECOND && args.interpolation == HG_INTERP_NEAREST)) return;
  const bool valid = i < args.n;
  const bool aggregate = l < args.n_aggregate;
  if (!valid && !aggregate) return;
  const Sink level_sink = sink.for_level(l);
  hg_scatter_level<T, DIMS, FEAT, INTERP, SECOND>(ddx_in, dy, positions, levels, args, level_sink, i, l, valid,
                                                  aggregate, lane);
}

// DIMS/FEAT/INTERP: see hg_encode_level (the _d3f2 kernels: 3, 2, linear).
template <typename T, uint DIMS, uint FEAT, int INTERP, bool FM>
TFMO_FN void hg_grad_positions(device const T* dy, device const float* positions, device const T* params,
                              constant HgLevel* levels, constant HgArgs& args, device float* dx_out, uint i) {
  if (i >= args.n) return;
  const uint F = FEAT ? FEAT : args.n_features;
  const uint udims = DIMS ? DIMS : args.dims;
  const int dims = (int)udims;
  const int interp = INTERP >= 0 ? INTERP : (int)args.interpolation;
  const uint gs = FM ? args.n : 1u;  // from column k to k + 1 of dy (and d/d(dy))
  float dx[HG_MAX_DIMS] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (interp != HG_INTERP_NEAREST) {  // nearest: piecewise constant, zero gradient
    float x[HG_MAX_DIMS];
    hg_load_point(positions, i, udims, x);
    const uint nc = 1u << udims;
    for (uint l = 0; l < args.n_active; ++l) {
      const HgLevel lv = levels[l];
      HgPoint p;
      hg_point(x, dims, lv.scale, interp, &p);
      device const T* g = dy + (FM ? (ulong)(l * F) * args.n + i : (ulong)i * (args.n_levels * F) + l * F);
      float s[16];
      for (uint c = 0; c < nc; ++c) {
        device const T* v = params + (ulong)(lv.offset + hg_corner_index(lv, &p, c)) * F;
        float dot = 0.0f;
        for (uint f = 0; f < F; ++f) dot += float(g[f * gs]) * float(v[f]);
        s[c] = dot;
      }
      hg_accumulate_dx(&p, s, dims, dx);
    }
  }
  for (uint d = 0; d < udims; ++d) dx_out[(ulong)i * udims + d] = dx[d];
}

template <typename T, uint DIMS, uint FEAT, int INTERP, bool FM>
TFMO_FN void hg_grad2_points(device const float* ddx_in, device const T* dy, device const float* positions,
                            device const T* params, constant HgLevel* levels, constant HgArgs& args,
                            device T* ddy_out, device float* dx_out, uint i) {
  if (i >= args.n) return;
  const uint F = FEAT ? FEAT : args.n_features;
  const uint udims = DIMS ? DIMS : args.dims;
  const int dims = (int)udims;
  const int interp = INTERP >= 0 ? INTERP : (int)args.interpolation;
  float dx[HG_MAX_DIMS] = {0.0f, 0.0f, 0.0f, 0.0f};
  const uint gs = FM ? args.n : 1u;  // from column k to k + 1 of dy (and d/d(dy))
  device T* o = ddy_out + (FM ? (ulong)i : (ulong)i * (args.n_levels * F));  // column k at o[k * gs]
  const bool nearest = interp == HG_INTERP_NEAREST;  // all second-order terms are zero
  float x[HG_MAX_DIMS];
  hg_load_point(positions, i, udims, x);
  float dd[HG_MAX_DIMS];
  hg_load_point(ddx_in, i, udims, dd);
  const uint nc = 1u << udims;
  for (uint l = 0; l < args.n_levels; ++l) {
    if (nearest || l >= args.n_active) {
      for (uint f = 0; f < F; ++f) o[(l * F + f) * gs] = T(0.0f);
      continue;
    }
    const HgLevel lv = levels[l];
    HgPoint p;
    hg_point(x, dims, lv.scale, interp, &p);
    float ddw[HG_MAX_DIMS];
    hg_point_d2(x, dims, lv.scale, interp, ddw);
    float v[16];
    hg_second_order_weights(&p, dd, dims, v);
    device const T* g = dy + (FM ? (ulong)(l * F) * args.n + i : (ulong)i * (args.n_levels * F) + l * F);
    float s[16];
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (uint c = 0; c < nc; ++c) {
      device const T* val = params + (ulong)(lv.offset + hg_corner_index(lv, &p, c)) * F;
      float dot = 0.0f;
      for (uint f = 0; f < F; ++f) {
        const float vf = float(val[f]);
        dot += float(g[f * gs]) * vf;
        acc[f] += v[c] * vf;
      }
      s[c] = dot;
    }
    for (uint f = 0; f < F; ++f) o[(l * F + f) * gs] = T(acc[f]);
    hg_accumulate_d2x(&p, ddw, s, dd, dims, dx);
  }
  for (uint d = 0; d < udims; ++d) dx_out[(ulong)i * udims + d] = dx[d];
}

// The largest finite |x[i]|, i < args.count, into meta[args.slot] (atomic max of float bits; meta zeroed first).
// Grid-stride: any grid size covers x.
template <typename T>
TFMO_FN void hg_abs_max(device const T* x, constant HgArgs& args, device atomic_uint* meta, uint gid, uint threads) {
  uint m = 0u;
  for (uint i = gid; i < args.count; i += threads) {
    const float a = fabs(float(x[i]));
    if (isfinite(a)) m = max(m, as_type<uint>(a));
  }
  m = simd_max(m);
  if (simd_is_first()) atomic_fetch_max_explicit(meta + args.slot, m, memory_order_relaxed);
}

// The encode's thread -> (point, level) map: a SIMD group holds G = args.level_group levels of 32 / G consecutive
// points, level fastest (lane = point_in_group * G + level_in_group), so each point's G levels are one contiguous
// run of the [N, L*F] output. The level group is the grid's slowest dimension: SIMD group s takes level group
// s / P of point group s % P (P = ceil(N * G / 32) point groups). Dispatched in order, the SIMD groups in flight
// read G levels' tables at a time (the cache footprint of tiny-cuda-nn's launch, whose grid's y is the level)
// instead of all L. Grid: P * ceil(L / G) * 32 threads; threads past N or L do nothing.
TFMO_FN uint2 hg_encode_thread(constant HgArgs& args, uint gid) {
  const uint G = args.level_group, lg = ctz(G);  // G a power of two: shifts, and one division (by P)
  const uint lane = gid & 31u, simd = gid >> 5;
  const uint point_groups = (args.n + (32u >> lg) - 1u) >> (5u - lg);
  const uint level_group = simd / point_groups;
  const uint point = ((simd - level_group * point_groups) << (5u - lg)) + (lane >> lg);
  const uint level = (level_group << lg) + (lane & (G - 1u));
  return uint2(point, level);
}

// ---- Entry points: one kernel template per kernel, its instances named below it (MLX's form,
// `template [[host_name("name")]] [[kernel]] decltype(f<A>) f<A>;`, through HG_KERNEL(...);). The host finds them by
// these names. T: the table's element type (float32: float, float16: half). DIMS, FEAT, INTERP: the compile-time
// configuration of the gradient kernels, (0, 0, -1) for the general instance (read from args) or (3, 2, linear),
// the _d3f2 instance (see hg_encode_level). D3F2: the encode's instance for D = 3, F = 2, linear (hg_encode_d3f2).
#define HG_KERNEL(name, ...) template [[host_name(name)]] [[kernel]] decltype(__VA_ARGS__) __VA_ARGS__
#define HG_GENERAL 0, 0, -1
#define HG_D3F2 3, 2, HG_INTERP_LINEAR

// 1-D grid, one thread per (point, level) (hg_encode_thread); out [N, L*F].
template <typename T, bool D3F2>
[[kernel]] void hash_grid_encode(device const float* positions [[buffer(0)]], device const T* params [[buffer(1)]],
                                 constant HgLevel* levels [[buffer(2)]], constant HgArgs& args [[buffer(3)]],
                                 device T* out [[buffer(4)]], uint gid [[thread_position_in_grid]]) {
  const uint2 pl = hg_encode_thread(args, gid);
  if (D3F2) hg_encode_d3f2<T, false>(positions, params, levels, args, out, pl.x, pl.y);
  else hg_encode<T, false>(positions, params, levels, args, out, pl.x, pl.y);
}
HG_KERNEL("hash_grid_encode_float32", hash_grid_encode<float, false>);
HG_KERNEL("hash_grid_encode_float16", hash_grid_encode<half, false>);
HG_KERNEL("hash_grid_encode_d3f2_float32", hash_grid_encode<float, true>);
HG_KERNEL("hash_grid_encode_d3f2_float16", hash_grid_encode<half, true>);

// Feature-major: grid (N, L), threadgroups (T, 1, 1); the level is the threadgroup's y. out [L*F, N].
template <typename T, bool D3F2>
[[kernel]] void hash_grid_encode_fm(device const float* positions [[buffer(0)]], device const T* params [[buffer(1)]],
                                    constant HgLevel* levels [[buffer(2)]], constant HgArgs& args [[buffer(3)]],
                                    device T* out [[buffer(4)]], uint2 gid [[thread_position_in_grid]],
                                    uint2 tg [[threadgroup_position_in_grid]]) {
  if (D3F2) hg_encode_d3f2<T, true>(positions, params, levels, args, out, gid.x, tg.y);
  else hg_encode<T, true>(positions, params, levels, args, out, gid.x, tg.y);
}
HG_KERNEL("hash_grid_encode_fm_float32", hash_grid_encode_fm<float, false>);
HG_KERNEL("hash_grid_encode_fm_float16", hash_grid_encode_fm<half, false>);
HG_KERNEL("hash_grid_encode_fm_d3f2_float32", hash_grid_encode_fm<float, true>);
HG_KERNEL("hash_grid_encode_fm_d3f2_float16", hash_grid_encode_fm<half, true>);

// Table gradient (grid (N, n_active)) into a float32 accumulator with float atomics.
template <typename T, uint DIMS, uint FEAT, int INTERP>
[[kernel]] void hash_grid_grad_params(device const T* dy [[buffer(0)]], device const float* positions [[buffer(1)]],
                                      constant HgLevel* levels [[buffer(2)]], constant HgArgs& args [[buffer(3)]],
                                      device float* acc [[buffer(4)]], uint2 gid [[thread_position_in_grid]],
                                      uint lane [[thread_index_in_simdgroup]]) {
  hg_scatter<T, false, DIMS, FEAT, INTERP>(nullptr, dy, positions, levels, args, HgFloatSink{acc}, gid.x, gid.y, lane);
}
HG_KERNEL("hash_grid_grad_params_float32", hash_grid_grad_params<float, HG_GENERAL>);
HG_KERNEL("hash_grid_grad_params_d3f2_float32", hash_grid_grad_params<float, HG_D3F2>);
HG_KERNEL("hash_grid_grad_params_float16", hash_grid_grad_params<half, HG_GENERAL>);
HG_KERNEL("hash_grid_grad_params_d3f2_float16", hash_grid_grad_params<half, HG_D3F2>);

// Position gradient, grid N; dy in the layout args.feature_major says (one instance per layout).
template <typename T, uint DIMS, uint FEAT, int INTERP>
[[kernel]] void hash_grid_grad_positions(device const T* dy [[buffer(0)]], device const float* positions [[buffer(1)]],
                                         device const T* params [[buffer(2)]], constant HgLevel* levels [[buffer(3)]],
                                         constant HgArgs& args [[buffer(4)]], device float* dx [[buffer(5)]],
                                         uint gid [[thread_position_in_grid]]) {
  if (args.feature_major) hg_grad_positions<T, DIMS, FEAT, INTERP, true>(dy, positions, params, levels, args, dx, gid);
  else hg_grad_positions<T, DIMS, FEAT, INTERP, false>(dy, positions, params, levels, args, dx, gid);
}
HG_KERNEL("hash_grid_grad_positions_float32", hash_grid_grad_positions<float, HG_GENERAL>);
HG_KERNEL("hash_grid_grad_positions_d3f2_float32", hash_grid_grad_positions<float, HG_D3F2>);
HG_KERNEL("hash_grid_grad_positions_float16", hash_grid_grad_positions<half, HG_GENERAL>);
HG_KERNEL("hash_grid_grad_positions_d3f2_float16", hash_grid_grad_positions<half, HG_D3F2>);

// Second order per point, grid N: d/d(dy) (layout as dy) and d/dx.
template <typename T, uint DIMS, uint FEAT, int INTERP>
[[kernel]] void hash_grid_grad2_points(device const float* ddx [[buffer(0)]], device const T* dy [[buffer(1)]],
                                       device const float* positions [[buffer(2)]], device const T* params [[buffer(3)]],
                                       constant HgLevel* levels [[buffer(4)]], constant HgArgs& args [[buffer(5)]],
                                       device T* ddy [[buffer(6)]], device float* dx [[buffer(7)]],
                                       uint gid [[thread_position_in_grid]]) {
  if (args.feature_major)
    hg_grad2_points<T, DIMS, FEAT, INTERP, true>(ddx, dy, positions, params, levels, args, ddy, dx, gid);
  else hg_grad2_points<T, DIMS, FEAT, INTERP, false>(ddx, dy, positions, params, levels, args, ddy, dx, gid);
}
HG_KERNEL("hash_grid_grad2_points_float32", hash_grid_grad2_points<float, HG_GENERAL>);
HG_KERNEL("hash_grid_grad2_points_d3f2_float32", hash_grid_grad2_points<float, HG_D3F2>);
HG_KERNEL("hash_grid_grad2_points_float16", hash_grid_grad2_points<half, HG_GENERAL>);
HG_KERNEL("hash_grid_grad2_points_d3f2_float16", hash_grid_grad2_points<half, HG_D3F2>);

// Second-order table gradient, grid (N, n_active), float atomics.
template <typename T, uint DIMS, uint FEAT, int INTERP>
[[kernel]] void hash_grid_grad2_params(device const float* ddx [[buffer(0)]], device const T* dy [[buffer(1)]],
                                       device const float* positions [[buffer(2)]],
                                       constant HgLevel* levels [[buffer(3)]], constant HgArgs& args [[buffer(4)]],
                                       device float* acc [[buffer(5)]], uint2 gid [[thread_position_in_grid]],
                                       uint lane [[thread_index_in_simdgroup]]) {
  hg_scatter<T, true, DIMS, FEAT, INTERP>(ddx, dy, positions, levels, args, HgFloatSink{acc}, gid.x, gid.y, lane);
}
HG_KERNEL("hash_grid_grad2_params_float32", hash_grid_grad2_params<float, HG_GENERAL>);
HG_KERNEL("hash_grid_grad2_params_d3f2_float32", hash_grid_grad2_params<float, HG_D3F2>);
HG_KERNEL("hash_grid_grad2_params_float16", hash_grid_grad2_params<half, HG_GENERAL>);
HG_KERNEL("hash_grid_grad2_params_d3f2_float16", hash_grid_grad2_params<half, HG_D3F2>);

// The deterministic table gradients: fixed-point sums into words (HgFixedSink).
template <typename T, uint DIMS, uint FEAT, int INTERP>
[[kernel]] void hash_grid_grad_params_det(device const T* dy [[buffer(0)]], device const float* positions [[buffer(1)]],
                                          constant HgLevel* levels [[buffer(2)]], constant HgArgs& args [[buffer(3)]],
                                          device atomic_uint* words [[buffer(4)]], device const uint* meta [[buffer(5)]],
                                          uint2 gid [[thread_position_in_grid]],
                                          uint lane [[thread_index_in_simdgroup]]) {
  hg_scatter<T, false, DIMS, FEAT, INTERP>(nullptr, dy, positions, levels, args, HgFixedSink{words, meta, args.count, 0},
                                           gid.x, gid.y, lane);
}
HG_KERNEL("hash_grid_grad_params_det_float32", hash_grid_grad_params_det<float, HG_GENERAL>);
HG_KERNEL("hash_grid_grad_params_det_d3f2_float32", hash_grid_grad_params_det<float, HG_D3F2>);
HG_KERNEL("hash_grid_grad_params_det_float16", hash_grid_grad_params_det<half, HG_GENERAL>);
HG_KERNEL("hash_grid_grad_params_det_d3f2_float16", hash_grid_grad_params_det<half, HG_D3F2>);

template <typename T, uint DIMS, uint FEAT, int INTERP>
[[kernel]] void hash_grid_grad2_params_det(device const float* ddx [[buffer(0)]], device const T* dy [[buffer(1)]],
                                           device const float* positions [[buffer(2)]],
                                           constant HgLevel* levels [[buffer(3)]], constant HgArgs& args [[buffer(4)]],
                                           device atomic_uint* words [[buffer(5)]],
                                           device const uint* meta [[buffer(6)]],
                                           uint2 gid [[thread_position_in_grid]],
                                           uint lane [[thread_index_in_simdgroup]]) {
  hg_scatter<T, true, DIMS, FEAT, INTERP>(ddx, dy, positions, levels, args, HgFixedSink{words, meta, args.count, 0},
                                          gid.x, gid.y, lane);
}
HG_KERNEL("hash_grid_grad2_params_det_float32", hash_grid_grad2_params_det<float, HG_GENERAL>);
HG_KERNEL("hash_grid_grad2_params_det_d3f2_float32", hash_grid_grad2_params_det<float, HG_D3F2>);
HG_KERNEL("hash_grid_grad2_params_det_float16", hash_grid_grad2_params_det<half, HG_GENERAL>);
HG_KERNEL("hash_grid_grad2_params_det_d3f2_float16", hash_grid_grad2_params_det<half, HG_D3F2>);

// x[i] = 0 for i < args.count.
template <typename T>
[[kernel]] void hash_grid_fill_zero(device T* x [[buffer(0)]], constant HgArgs& args [[buffer(1)]],
                                    uint gid [[thread_position_in_grid]]) {
  if (gid < args.count) x[gid] = T(0);
}
HG_KERNEL("hash_grid_fill_zero", hash_grid_fill_zero<float>);
HG_KERNEL("hash_grid_fill_zero_uint", hash_grid_fill_zero<uint>);

// The deterministic gradient's words for args.count values: each sum HG_FIXED_BIAS (low word), flags 0.
kernel void hash_grid_fixed_init(device uint* words [[buffer(0)]], constant HgArgs& args [[buffer(1)]],
                                 uint gid [[thread_position_in_grid]]) {
  if (gid < 3ul * args.count) words[gid] = gid < 2ul * args.count && (gid & 1u) == 0u ? HG_FIXED_BIAS : 0u;
}

kernel void hash_grid_float_to_half(device const float* x [[buffer(0)]], device half* y [[buffer(1)]],
                                    constant HgArgs& args [[buffer(2)]], uint gid [[thread_position_in_grid]]) {
  if (gid < args.count) y[gid] = half(x[gid]);
}

// The largest finite |x[i]| into meta[args.slot] (hg_abs_max).
template <typename T>
[[kernel]] void hash_grid_abs_max(device const T* x [[buffer(0)]], constant HgArgs& args [[buffer(1)]],
                                  device atomic_uint* meta [[buffer(2)]], uint gid [[thread_position_in_grid]],
                                  uint threads [[threads_per_grid]]) {
  hg_abs_max(x, args, meta, gid, threads);
}
HG_KERNEL("hash_grid_abs_max_float32", hash_grid_abs_max<float>);
HG_KERNEL("hash_grid_abs_max_float16", hash_grid_abs_max<half>);

// meta[HG_FIXED_EXPONENTS + l] for l < n_levels: the exponent e_l of the fixed-point sums (see HgFixedSink).
kernel void hash_grid_fixed_exponents(constant HgLevel* levels [[buffer(0)]], constant HgArgs& args [[buffer(1)]],
                                      device uint* meta [[buffer(2)]], uint l [[thread_position_in_grid]]) {
  if (l >= args.n_levels) return;
  const bool second = args.order == 2u;
  const uint corners = second ? 1u << args.dims : hg_num_corners((int)args.dims, (int)args.interpolation);
  int bound = hg_exponent_above(meta[HG_FIXED_DY_MAX]);
  if (second)  // |v[c]| <= D * max|ddx| * 1.5 * scale_l
    bound += hg_exponent_above(meta[HG_FIXED_DDX_MAX]) + hg_count_exponent(args.dims) +
             hg_exponent_above(as_type<uint>(levels[l].scale)) + 1;
  const int sum_bound = bound + hg_count_exponent(max(args.n, 1u)) + hg_count_exponent(corners);
  meta[HG_FIXED_EXPONENTS + l] = as_type<uint>(clamp(min(31 - bound, 62 - sum_bound), -252, 252));
}

// out[e] = the fixed-point sum of element e as T (float(sum) * 2^-e_l, e_l of the element's level), or the
// non-finite value its flags stand for. e < args.count = rows * F.
template <typename T>
TFMO_FN void hg_fixed_to(device const uint* words, device const uint* meta, constant HgLevel* levels,
                        constant HgArgs& args, device T* out, uint e) {
  if (e >= args.count) return;
  const uint row = e / args.n_features;
  uint l = 0;
  for (uint k = 1; k < args.n_levels; ++k)
    if (row >= levels[k].offset) l = k;
  const uint flags = words[2ul * args.count + e];
  float v;
  if (flags != 0u) {
    const bool nan_ = (flags & HG_FLAG_NAN) != 0u || (flags & (HG_FLAG_POS_INF | HG_FLAG_NEG_INF)) ==
                                                         (HG_FLAG_POS_INF | HG_FLAG_NEG_INF);
    v = as_type<float>(nan_ ? 0x7FC00000u : ((flags & HG_FLAG_POS_INF) != 0u ? 0x7F800000u : 0xFF800000u));
  } else {
    const long sum = long((ulong(words[2ul * e + 1ul]) << 32) | ulong(words[2ul * e])) - long(HG_FIXED_BIAS);
    v = hg_ldexp(float(sum), -as_type<int>(meta[HG_FIXED_EXPONENTS + l]));
  }
  out[e] = T(v);
}

template <typename T>
[[kernel]] void hash_grid_fixed_to(device const uint* words [[buffer(0)]], device const uint* meta [[buffer(1)]],
                                   constant HgLevel* levels [[buffer(2)]], constant HgArgs& args [[buffer(3)]],
                                   device T* out [[buffer(4)]], uint gid [[thread_position_in_grid]]) {
  hg_fixed_to(words, meta, levels, args, out, gid);
}
HG_KERNEL("hash_grid_fixed_to_float32", hash_grid_fixed_to<float>);
HG_KERNEL("hash_grid_fixed_to_float16", hash_grid_fixed_to<half>);
