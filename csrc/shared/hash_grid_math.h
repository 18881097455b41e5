// Multiresolution hash-grid encoding (Instant-NGP): the per-point math, written once and compiled both as C++
// (CPU kernels, g++/clang) and as Metal Shading Language (metal_kernels/hash_grid.metal). Rules for this header
// are at the top of device_compat.h. Semantics follow tiny-cuda-nn `encodings/grid.h` (reference only, not copied).
//
// Coordinate convention (stated once, used everywhere):
//  - positions x in [0,1]^D; a position outside [0,1] is clamped to [0,1] and NaN becomes 0 (so indices are
//    always in range). The derivative w.r.t. a clamped coordinate (x < 0, x > 1, NaN) is 0.
//  - level l (0-based): scale_l = 2^(l*log2(b)) * N_min - 1, resolution_l = ceil(scale_l) + 1 (the "-1" makes
//    N_min count grid vertices). scale_l is tcnn's float32 sequence exp2f(float(l) * log2f(b)) * N_min - 1.0f
//    with every step rounded to float32 (hg_level_scale, on the host; the kernels read it from the level table).
//  - pos = fma(scale_l, x, 0.5) in float32 with ONE rounding (tcnn's fmaf; tfmo_fma here), grid = floor(pos),
//    frac = pos - grid. The half-cell offset staggers the levels; vertex g of a level sits at
//    x = (g - 0.5)/scale_l; grid coordinates lie in [0, resolution_l].
//  - Level table sizes: min(round_up_8(resolution^D), cap) entries, cap = 2^log2_hashmap_size (hash),
//    N_min^D (tiled), none (dense, beyond 2^31-1 an error). res^D is saturated at 2^31-1 before rounding.
//  - Indexing of corner c with grid coordinates g: tcnn's current grid_index (common_device.h). With
//    HG_MAX_BASE[D] = the largest base whose D-th power fits in uint32:
//      res <= HG_MAX_BASE[D]: index = sum over ALL D dims of g_d * res^d (uint32 arithmetic), stride = res^D;
//      otherwise:             index = 0,                                          stride = 0xFFFFFFFF;
//      grid type hash and size < stride: index = XOR_d g_d * pi_d (uint32), pi = (1, 2654435761, 805459861,
//      3674653429) (size is then 2^log2_hashmap_size);
//    then index mod size. (For res <= HG_MAX_BASE[D] the uint32 sum cannot actually wrap, even with g_d = res.)
//    Tiled levels finer than the tile (res^D > size) thus wrap the full row-major index, and tiled levels with
//    res > HG_MAX_BASE[D] read row 0 for every corner, exactly as tcnn. The host precomputes the strides and
//    the mode per level (hg_level_table).
//  - Interpolation: linear w = frac; smoothstep w = frac^2 (3 - 2 frac); nearest: only the corner `grid`
//    (= floor(pos), tcnn's definition) with weight 1 and zero position derivative.
//    Corner c (bit d of c set = upper vertex in dim d) has weight prod_d (bit ? w_d : 1 - w_d).
//  - Feature layout: table row (level offset + index) holds F features; output column l*F + f.
#pragma once

#include "device_compat.h"

#define HG_MAX_DIMS 4
#define HG_MAX_LEVELS 32
#define HG_MAX_FEATURES 8  // n_features_per_level is 1, 2, 4 or 8

// Grid types.
#define HG_GRID_HASH 0
#define HG_GRID_DENSE 1
#define HG_GRID_TILED 2
// Interpolations.
#define HG_INTERP_NEAREST 0
#define HG_INTERP_LINEAR 1
#define HG_INTERP_SMOOTHSTEP 2
// Per-level index modes (decided on the host).
#define HG_INDEX_HASH 0     // coherent prime hash, size is a power of two: index = hash & (size - 1)
#define HG_INDEX_DENSE 1    // row-major sum < 2*size (host-checked): index = sum, minus size once if >= size
#define HG_INDEX_TILED 2    // row-major uint32 sum (strides may be 0: res > HG_MAX_BASE) mod size (tiled levels)

// One level's constants. Same layout in C++ and MSL (only 4-byte members): the Metal host passes an array of
// these in a buffer.
struct HgLevel {
  uint offset;          // first table row of the level
  uint size;            // rows in the level
  uint resolution;      // ceil(scale) + 1
  uint mode;            // HG_INDEX_*
  uint n_stride_dims;   // D when the row-major index is used (res <= HG_MAX_BASE[D]), else 0 (index 0)
  float scale;          // scale_l (float32)
  uint stride[HG_MAX_DIMS];  // res^d for d < n_stride_dims, 0 beyond (unused dims, or all when index 0)
};

// Scalar arguments of the Metal kernels (metal_kernels/hash_grid.metal), set by csrc/gpu/hash_grid_gpu.cc.
struct HgArgs {
  uint n;             // points
  uint dims;          // D
  uint n_features;    // F
  uint n_levels;      // L (output columns L*F)
  uint n_active;      // levels l < n_active are active
  uint interpolation; // HG_INTERP_*
  uint count;         // element count for the elementwise helper kernels
  uint n_aggregate;   // table-gradient scatters: levels l < n_aggregate sum runs of equal rows in the SIMD group
  uint order;         // deterministic table gradient: 1 (grad_params) or 2 (grad2_params), for the exponents
  uint slot;          // hash_grid_abs_max: the word of the fixed-point header it raises (HG_FIXED_*_MAX)
  uint level_group;   // encode: G levels of 32 / G points per SIMD group (G a power of two <= 32; hg_encode_thread)
  uint feature_major; // encoded-shaped tensors (out, dy, d/d(dy)) are [L*F, N] when 1, else [N, L*F] (hg_col)
};

// The deterministic table gradient's header words and flag bits (metal_kernels/hash_grid.metal, HgFixedSink).
#define HG_FIXED_DY_MAX 0u
#define HG_FIXED_DDX_MAX 1u
#define HG_FIXED_EXPONENTS 2u
#define HG_FIXED_BIAS 0x80000000u  // every sum's starting value (low word), subtracted by the conversion
#define HG_FLAG_NAN 1u
#define HG_FLAG_POS_INF 2u
#define HG_FLAG_NEG_INF 4u

// Per (point, level): grid coordinates, upper-corner weights and their derivatives w.r.t. x_d.
struct HgPoint {
  uint grid[HG_MAX_DIMS];
  float w[HG_MAX_DIMS];    // interpolated frac: weight of the upper vertex
  float dw[HG_MAX_DIMS];   // d w / d x_d (includes scale; 0 for clamped coordinates and nearest)
};

// Clamp policy: [0,1], NaN -> 0. Returns whether x was inside [0,1] (its derivative then passes through).
TFMO_FN float hg_clamp01(float x, TFMO_THREAD bool* inside) {
  *inside = x >= 0.0f && x <= 1.0f;  // false for NaN
  return x >= 0.0f ? (x <= 1.0f ? x : 1.0f) : 0.0f;  // NaN fails x >= 0 -> 0
}

TFMO_FN float hg_interp_weight(float t, int interp) {
  return interp == HG_INTERP_SMOOTHSTEP ? t * t * (3.0f - 2.0f * t) : t;
}
// d weight / d frac.
TFMO_FN float hg_interp_dweight(float t, int interp) {
  return interp == HG_INTERP_SMOOTHSTEP ? 6.0f * t * (1.0f - t) : (interp == HG_INTERP_LINEAR ? 1.0f : 0.0f);
}

// d^2 weight / d frac^2 (smoothstep 6 - 12 t; linear and nearest 0: piecewise linear / constant in each cell).
TFMO_FN float hg_interp_d2weight(float t, int interp) {
  return interp == HG_INTERP_SMOOTHSTEP ? 6.0f - 12.0f * t : 0.0f;
}

// The scaled position: one rounding, as tcnn's fmaf(scale, x, 0.5f).
TFMO_FN float hg_pos(float x, float scale) { return tfmo_fma(scale, x, 0.5f); }

// One coordinate: x (raw) -> grid coordinate, weight, derivative. pos >= 0.5 > 0 so truncation is floor.
TFMO_FN void hg_coord(float x_raw, float scale, int interp, TFMO_THREAD uint* grid, TFMO_THREAD float* w,
                      TFMO_THREAD float* dw) {
  bool inside;
  float x = hg_clamp01(x_raw, &inside);
  float pos = hg_pos(x, scale);
  uint g = (uint)pos;
  float frac = pos - (float)g;
  *grid = g;
  *w = hg_interp_weight(frac, interp);
  *dw = inside ? scale * hg_interp_dweight(frac, interp) : 0.0f;
}

TFMO_FN void hg_point(const TFMO_THREAD float* x, int dims, float scale, int interp, TFMO_THREAD HgPoint* p) {
  for (int d = 0; d < HG_MAX_DIMS; ++d) {
    if (d < dims) {
      hg_coord(x[d], scale, interp, &p->grid[d], &p->w[d], &p->dw[d]);
    } else {
      p->grid[d] = 0; p->w[d] = 0.0f; p->dw[d] = 0.0f;
    }
  }
}

// Coherent prime hash of grid coordinates (uint32 wraparound multiply, as tcnn).
TFMO_FN uint hg_hash(uint g0, uint g1, uint g2, uint g3) {
  return g0 ^ (g1 * 2654435761u) ^ (g2 * 805459861u) ^ (g3 * 3674653429u);
}

// Table index (row within the level) of grid coordinates g (unused dims are 0: they contribute nothing to
// the hash, and their strides are 0). One function per mode, so loops can hoist the mode.
TFMO_FN uint hg_index_hash(HgLevel lv, uint g0, uint g1, uint g2, uint g3) {
  return hg_hash(g0, g1, g2, g3) & (lv.size - 1u);
}
TFMO_FN uint hg_index_dense(HgLevel lv, uint g0, uint g1, uint g2, uint g3) {
  // stride[0] == 1 in this mode; the sum is < 2*size (host checks)
  uint s = g0 + g1 * lv.stride[1] + g2 * lv.stride[2] + g3 * lv.stride[3];
  return s >= lv.size ? s - lv.size : s;
}
TFMO_FN uint hg_index_tiled(HgLevel lv, uint g0, uint g1, uint g2, uint g3) {
  // uint32 arithmetic as tcnn (all strides 0 when res > HG_MAX_BASE[D]: index 0)
  uint s = g0 * lv.stride[0] + g1 * lv.stride[1] + g2 * lv.stride[2] + g3 * lv.stride[3];
  return s % lv.size;
}
TFMO_FN uint hg_index(HgLevel lv, uint g0, uint g1, uint g2, uint g3) {
  if (lv.mode == HG_INDEX_HASH) return hg_index_hash(lv, g0, g1, g2, g3);
  if (lv.mode == HG_INDEX_DENSE) return hg_index_dense(lv, g0, g1, g2, g3);
  return hg_index_tiled(lv, g0, g1, g2, g3);
}

// Row within the level of corner c (bit d set: upper vertex in dim d).
TFMO_FN uint hg_corner_index(HgLevel lv, const TFMO_THREAD HgPoint* p, uint c) {
  return hg_index(lv, p->grid[0] + (c & 1u), p->grid[1] + ((c >> 1) & 1u), p->grid[2] + ((c >> 2) & 1u),
                  p->grid[3] + ((c >> 3) & 1u));
}

// Interpolation weight of corner c (nearest: corner 0 only, weight 1; callers use hg_num_corners).
TFMO_FN float hg_corner_weight(const TFMO_THREAD HgPoint* p, uint c, int dims) {
  float w = 1.0f;
  for (int d = 0; d < HG_MAX_DIMS; ++d)
    if (d < dims) w *= ((c >> d) & 1u) ? p->w[d] : 1.0f - p->w[d];
  return w;
}

// Position gradient of one (point, level): given s[c] = <dL/d(output features), value of corner c> for every
// corner, adds dL/dx_k = dw_k * sum over corner pairs differing in dim k of (s[upper] - s[lower]) * (weight of
// the other dims) to dx[k]. Differences first (as tcnn): corners that alias to the same row cancel exactly.
TFMO_FN void hg_accumulate_dx(const TFMO_THREAD HgPoint* p, const TFMO_THREAD float* s, int dims,
                              TFMO_THREAD float* dx) {
  for (int k = 0; k < HG_MAX_DIMS; ++k) {
    if (k >= dims) break;
    const uint bit = 1u << k;
    float acc = 0.0f;
    for (uint c = 0; c < (1u << dims); ++c) {
      if (c & bit) continue;
      float w = 1.0f;
      for (int d = 0; d < HG_MAX_DIMS; ++d)
        if (d < dims && d != k) w *= ((c >> d) & 1u) ? p->w[d] : 1.0f - p->w[d];
      acc += w * (s[c | bit] - s[c]);
    }
    dx[k] += p->dw[k] * acc;
  }
}

// ---- Second order (gradient of the position gradient; tcnn's kernel_grid_backward_input_backward_*) ----
// The position gradient of one (point, level) is gx_k = sum_c dW_c/dx_k * s[c] with s[c] = <dy_l, value of
// corner c>, W_c = prod_d (bit_d(c) ? w_d : 1 - w_d). Given the incoming gradient ddx (= dPhi/dgx, [D]):
//   v[c]      = sum_k ddx_k * dW_c/dx_k                                (per-corner weight of the second order)
//   dPhi/d(dy_l[f])      = sum_c v[c] * value[c][f]
//   dPhi/d(table row c)  += v[c] * dy_l                                (scatter, like the param gradient)
//   dPhi/dx_j           += sum_k ddx_k * sum_c d^2 W_c/(dx_k dx_j) * s[c]
// with d^2 W_c/dx_k dx_j = sign_k sign_j dw_k dw_j W_c^{-kj} (k != j; the mixed partials, any interpolation)
// and  d^2 W_c/dx_k^2    = sign_k ddw_k W_c^{-k}              (ddw = scale^2 w''(frac): smoothstep only),
// sign_k = +1 for the upper vertex, -1 for the lower, W^{-K} = the product over the dims not in K.

// d^2 w / d x^2 of one coordinate: scale^2 * w''(frac), 0 for clamped coordinates (x outside [0,1], NaN).
TFMO_FN float hg_coord_d2(float x_raw, float scale, int interp) {
  bool inside;
  float x = hg_clamp01(x_raw, &inside);
  float pos = hg_pos(x, scale);
  float frac = pos - (float)(uint)pos;
  return inside ? scale * scale * hg_interp_d2weight(frac, interp) : 0.0f;
}

TFMO_FN void hg_point_d2(const TFMO_THREAD float* x, int dims, float scale, int interp, TFMO_THREAD float* ddw) {
  for (int d = 0; d < HG_MAX_DIMS; ++d) ddw[d] = d < dims ? hg_coord_d2(x[d], scale, interp) : 0.0f;
}

// v[c] (see above) of corner c: sum_k ddx_k * sign_k(c) * dw_k * W_c^{-k}.
TFMO_FN float hg_second_order_weight(const TFMO_THREAD HgPoint* p, const TFMO_THREAD float* ddx, int dims, uint c) {
  float acc = 0.0f;
  for (int k = 0; k < HG_MAX_DIMS; ++k) {
    if (k >= dims) break;
    float w = ddx[k] * p->dw[k];
    for (int d = 0; d < HG_MAX_DIMS; ++d)
      if (d < dims && d != k) w *= ((c >> d) & 1u) ? p->w[d] : 1.0f - p->w[d];
    acc += ((c >> k) & 1u) ? w : -w;
  }
  return acc;
}

// v[c] for every corner c < 2^dims.
TFMO_FN void hg_second_order_weights(const TFMO_THREAD HgPoint* p, const TFMO_THREAD float* ddx, int dims,
                                     TFMO_THREAD float* v) {
  for (uint c = 0; c < (1u << dims); ++c) v[c] = hg_second_order_weight(p, ddx, dims, c);
}

// Adds dPhi/dx_j = sum_k ddx_k * H_kj to dx[j], H the Hessian of sum_c W_c s[c] w.r.t. x (symmetric).
// Finite differences first (as hg_accumulate_dx): corners aliasing to the same row cancel exactly.
//   H_kk = ddw_k * sum_{c: bit k clear} W_c^{-k} (s[c|k] - s[c])
//   H_kj = dw_k dw_j * sum_{c: bits k, j clear} W_c^{-kj} (s[c|k|j] - s[c|k] - s[c|j] + s[c])   (k != j)
TFMO_FN void hg_accumulate_d2x(const TFMO_THREAD HgPoint* p, const TFMO_THREAD float* ddw,
                               const TFMO_THREAD float* s, const TFMO_THREAD float* ddx, int dims,
                               TFMO_THREAD float* dx) {
  TFMO_UNROLL
  for (int k = 0; k < HG_MAX_DIMS; ++k) {
    if (k >= dims) break;
    const uint bk = 1u << k;
    TFMO_UNROLL
    for (int j = 0; j < HG_MAX_DIMS; ++j) {
      if (j >= dims) break;
      const uint bj = 1u << j;
      float acc = 0.0f;
      for (uint c = 0; c < (1u << dims); ++c) {
        if ((c & bk) || (c & bj)) continue;
        float w = 1.0f;
        for (int d = 0; d < HG_MAX_DIMS; ++d)
          if (d < dims && d != k && d != j) w *= ((c >> d) & 1u) ? p->w[d] : 1.0f - p->w[d];
        const float diff = j == k ? s[c | bk] - s[c] : (s[c | bk | bj] - s[c | bk]) - (s[c | bj] - s[c]);
        acc += w * diff;
      }
      const float h = j == k ? ddw[k] * acc : (p->dw[k] * p->dw[j]) * acc;
      dx[j] += ddx[k] * h;
    }
  }
}

TFMO_FN uint hg_num_corners(int dims, int interp) { return interp == HG_INTERP_NEAREST ? 1u : (1u << dims); }

#if !defined(__METAL_VERSION__) || defined(HG_HOST_LEVEL_TABLE)
// ---- Host side (C++ only): the level table of a configuration. HG_HOST_LEVEL_TABLE exposes it to the MSL
// emulation drivers (tests/msl_emu), which compile the Metal source as C++. ----
#include <cmath>
#include <cstdint>

// tcnn's MAX_BASES: the largest base whose D-th power fits in uint32, for D = 0..4.
inline uint32_t hg_max_base(int dims) {
  static const uint32_t kMaxBase[HG_MAX_DIMS + 1] = {0u, 0xFFFFFFFFu, 0xFFFFu, 0x659u, 0xFFu};
  return kMaxBase[dims];
}

// Correctly rounded float32 2^x and log2(b) for the level scales' arguments (x in [0, 24.5], b in [1, 2^24 + 2]):
// the double libm value rounded to float, except for the arguments whose exact result lies within 4 double ulps
// of a midpoint between two floats (an exhaustive search over every float32 argument in range,
// dev/check_level_scale_rounding.py, found these; their values are the exactly rounded ones). So the result
// is correctly rounded whenever the libm's double exp2/log2 is within 3 ulps (glibc, Apple: < 1 ulp).
inline float hg_exp2_f32(float x) {
  static const float kHard[][2] = {{0x1.853a6ep-9f, 0x1.00870ap+0f}, {0x1.0f0af8p-11f, 0x1.00177cp+0f},
                                   {0x1.05535ap-7f, 0x1.016b46p+0f}, {0x1.0f39eep-18f, 0x1.00003p+0f}};
  for (const auto& h : kHard)
    if (x == h[0]) return h[1];
  return (float)std::exp2((double)x);
}
inline float hg_log2_f32(float b) {
  if (b == 0x1.40f572p+1f) return 0x1.5384bcp+0f;
  return (float)std::log2((double)b);
}

// scale_l as tiny-cuda-nn computes it (grid_scale: exp2f(level * log2_per_level_scale) * base_resolution - 1.0f,
// log2_per_level_scale = log2f(b)), each of the five steps rounded to nearest float32 once:
//   log2_b = fl(log2 b), x = fl(l * log2_b), p = fl(2^x), m = fl(p * N_min), scale = fl(m - 1).
// log2 and exp2 correctly rounded (above). The products and the difference are computed in double, where they
// are exact (5 x 24 bits, 24 x 24 bits, 48 bits), then rounded: the IEEE float32 operations, and no compiler
// contraction (fma) can merge two steps. tcnn's values differ by at most 1 ulp when its host log2f is correctly
// rounded (its device exp2f is the approximate ex2; nvcc may fuse the multiply and the subtraction).
inline float hg_level_scale(int level, float per_level_scale, int base_resolution) {
  const float log2_b = hg_log2_f32(per_level_scale);
  const float x = (float)((double)level * (double)log2_b);
  const float p = hg_exp2_f32(x);
  const float m = (float)((double)p * (double)base_resolution);
  return (float)((double)m - 1.0);
}

// Fills levels[0..n_levels) and returns the total row count, or -1 when a size exceeds int32 (the table or
// its params tensor [total, F] would not be addressable with 32-bit indices). Preconditions (validated by the
// caller): 1 <= dims <= 4, 1 <= n_levels <= 32, base_resolution >= 1, per_level_scale >= 1, every scale_l
// <= 2^24, 0 <= log2_hashmap_size <= 30.
inline int64_t hg_level_table(int dims, int n_levels, int n_features, int log2_hashmap_size, int base_resolution,
                              float per_level_scale, int grid_type, HgLevel* levels) {
  const int64_t kMaxParams = int64_t{0xFFFFFFFFu} / 2;  // tcnn's cap on res^D before rounding
  int64_t offset = 0;
  for (int l = 0; l < n_levels; ++l) {
    HgLevel lv{};
    const float scale = hg_level_scale(l, per_level_scale, base_resolution);
    const int64_t res = (int64_t)std::ceil(scale) + 1;
    // res^D, saturated at kMaxParams.
    int64_t dense = 1;
    for (int d = 0; d < dims; ++d) dense = (dense > kMaxParams / res) ? kMaxParams + 1 : dense * res;
    int64_t size = (dense > kMaxParams ? kMaxParams : dense);
    size = (size + 7) / 8 * 8;
    if (grid_type == HG_GRID_TILED) {
      int64_t tile = 1;  // N_min^D, saturated like res^D (tcnn does not round it to a multiple of 8)
      for (int d = 0; d < dims; ++d)
        tile = (tile > kMaxParams / base_resolution) ? kMaxParams + 1 : tile * base_resolution;
      if (tile < size) size = tile;
    } else if (grid_type == HG_GRID_HASH) {
      const int64_t t = int64_t{1} << log2_hashmap_size;
      if (t < size) size = t;
    }
    // tcnn's grid_index: the row-major strides over all D dims when res <= MAX_BASE[D] (then res^D fits in
    // uint32), else index 0 and stride 0xFFFFFFFF. bound = the largest row-major sum (coordinates reach res at
    // the upper edge); it is < 2^32 whenever res <= MAX_BASE[D], so the kernels' uint32 sum never wraps.
    int64_t stride = 1, bound = 0;
    const bool row_major = (uint64_t)res <= (uint64_t)hg_max_base(dims);
    if (row_major) {
      for (int d = 0; d < dims; ++d) {
        lv.stride[d] = (uint)stride;
        bound += res * stride;
        stride *= res;  // <= 0xFFFFFFFF
      }
    } else {
      stride = 0xFFFFFFFF;
    }
    lv.offset = (uint)offset;
    lv.size = (uint)size;
    lv.resolution = (uint)res;
    lv.scale = scale;
    lv.n_stride_dims = row_major ? (uint)dims : 0u;
    if (grid_type == HG_GRID_HASH && size < stride) {
      lv.mode = HG_INDEX_HASH;  // size == 2^log2_hashmap_size here (a power of two)
    } else if (row_major && bound < 2 * size) {
      lv.mode = HG_INDEX_DENSE;  // one conditional subtraction is the modulo (size <= 2^31: no overflow)
    } else {
      lv.mode = HG_INDEX_TILED;  // tiled levels finer than the tile (or with index 0), tiles of N_min^D < 8 rows
    }
    levels[l] = lv;
    offset += size;
    if (offset > INT32_MAX || offset * n_features > INT32_MAX) return -1;
  }
  return offset;
}
#endif
