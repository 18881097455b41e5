// The CPU kernels of the hash-grid ops as templates over (D, F, T), shared by the four files that instantiate them,
// one per op kernel: hash_grid_cpu_encode.cc, hash_grid_cpu_grad_params.cc, hash_grid_cpu_grad_positions.cc and
// hash_grid_cpu_second_order.cc (four translation units, so that the 32 (D, F, T) instantiations of each compile in
// parallel). Registration and the ISA choice: hash_grid_cpu.cc. Semantics: csrc/ops/hash_grid_op.cc, math:
// csrc/shared/hash_grid_math.h.
//
// Structure (memory-latency bound: per point and level 2^D random reads of F values):
//  - level by level, so one level's table is hot in cache at a time; points split among the project pool's
//    threads in tiles of kTile: first the corner indices and weights of the whole tile (index arithmetic the
//    compiler can vectorise), then the gathers;
//  - the AVX2 build computes the tile's coordinates 8 points per instruction and runs the F = 2 forward with
//    points in lanes (gathers; float16 rows converted with F16C); per point the same operations in the same order
//    as the scalar loops, so every build gives the same bits;
//  - float16 tables are converted to float32 on load, accumulation is float32, results rounded on store;
//  - param gradient, deterministic: every table row is summed by exactly one task in point order, whatever the
//    thread count. Tasks own (level, row range) pairs; each walks all points of its level in order and adds
//    the contributions that land in its rows. With at least 2 levels per thread a task is a whole level (no
//    redundant work); with fewer levels the level's rows are split and the corner math is recomputed.
//  - position gradient: levels in order for every point (deterministic), recomputing the weight derivatives.
//  - second order (gradient of the position gradient): the same two schemes, d/d(dy) and d/dx per point (levels
//    in order), d/dparams per table row in point order.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <numeric>
#include <type_traits>

#include "common/half.h"
#include "common/huge_pages.h"
#include "common/op_names.h"
#include "common/tfc.h"
#include "common/thread_pool.h"
#include "cpu/hash_grid_cpu_isa.h"
#include "shared/hash_grid_math.h"
#include "ops/hash_grid_args.h"

namespace tfmo::hash_grid::cpu {

using tfmo::hash_grid::Inputs;
using tfmo::hash_grid::Config;


constexpr int kTile = 256;

using tfmo::Load;
using tfmo::Store;

// Scratch memory: per calling thread, reused across calls (a fresh multi-MB allocation per call costs a page
// fault on every first touch). Up to kMaxCachedBytes per slot stays allocated for the thread's lifetime (TF's
// executor threads: one buffer per op kind per thread); larger requests are freed when the call ends.
constexpr size_t kMaxCachedBytes = size_t{256} << 20;

template <typename T>
class Scratch {
 public:
  Scratch(size_t n, int slot) {
    if (n * sizeof(T) > kMaxCachedBytes) {
      own_.reset(new T[n]);
      ptr_ = own_.get();
      return;
    }
    struct Buf { std::unique_ptr<T[]> p; size_t n = 0; };
    thread_local Buf bufs[2];
    Buf& b = bufs[slot];
    if (b.n < n) { b.p.reset(); b.p.reset(new T[n]); b.n = n; }
    ptr_ = b.p.get();
  }
  T* get() const { return ptr_; }

 private:
  std::unique_ptr<T[]> own_;
  T* ptr_ = nullptr;
};

// dy (T; element (i, l*F + f) at i * ps + (l*F + f) * cs: Inputs::point_stride, column_stride) -> level-major
// float32 [active][N][F] for the first `active` levels. [N, L*F] goes in blocks of kBlock source rows (a few KB,
// cache-resident while every level's slice of them is copied), so each source line is read from memory once;
// [L*F, N] (feature_major) is F contiguous rows per level.
template <int F, typename T>
void ToLevelMajor(const T* src, int64_t n, int64_t ps, int64_t cs, int active, float* dst) {
  constexpr int64_t kBlock = 64;
  tfmo::ParallelFor(n, 2048, [&](int64_t b, int64_t e) {
    for (int64_t i0 = b; i0 < e; i0 += kBlock) {
      const int64_t i1 = std::min(e, i0 + kBlock);
      for (int l = 0; l < active; ++l) {
        float* d = dst + ((size_t)l * n) * F;
        for (int64_t i = i0; i < i1; ++i)
          for (int f = 0; f < F; ++f) d[i * F + f] = Load<T>(src + i * ps + (l * F + f) * cs);
      }
    }
  });
}

// Corner rows (level offset included) and weights of a tile of points for one level. Structure-of-arrays and
// one loop per (dimension | corner) with the index mode and interpolation hoisted, so the compiler vectorises
// the per-point math of csrc/shared/hash_grid_math.h across the tile.
template <int D>
struct TileCorners {
  static constexpr int kCorners = 1 << D;
  float x[D][kTile];
  uint g[D][kTile];
  float w[D][kTile];
  float dw[D][kTile];
  uint row[kCorners][kTile];
  float wt[kCorners][kTile];

  HgPoint Point(int i) const {
    HgPoint p{};
    for (int d = 0; d < D; ++d) { p.grid[d] = g[d][i]; p.w[d] = w[d][i]; p.dw[d] = dw[d][i]; }
    return p;
  }

  template <int kMode>
  TFMO_FN void Rows(const HgLevel& lv, int count, int nc) {
    for (int c = 0; c < nc; ++c) {
      const uint b0 = c & 1, b1 = (c >> 1) & 1, b2 = (c >> 2) & 1, b3 = (c >> 3) & 1;
      uint* r = row[c];
      for (int i = 0; i < count; ++i) {
        const uint g0 = g[0][i] + b0;
        const uint g1 = D > 1 ? g[D > 1 ? 1 : 0][i] + b1 : 0u;
        const uint g2 = D > 2 ? g[D > 2 ? 2 : 0][i] + b2 : 0u;
        const uint g3 = D > 3 ? g[D > 3 ? 3 : 0][i] + b3 : 0u;
        uint idx;
        if (kMode == HG_INDEX_HASH) idx = hg_index_hash(lv, g0, g1, g2, g3);
        else if (kMode == HG_INDEX_DENSE) idx = hg_index_dense(lv, g0, g1, g2, g3);
        else idx = hg_index_tiled(lv, g0, g1, g2, g3);
        r[i] = lv.offset + idx;
      }
    }
  }

  // Points [begin, begin+count) of positions [N, D].
  template <bool kAvx2>
  TFMO_FN void Compute(const float* pos, int64_t begin, int count, const HgLevel& lv, int interp, int nc) {
    for (int i = 0; i < count; ++i)
      for (int d = 0; d < D; ++d) x[d][i] = pos[(begin + i) * D + d];
#ifdef TFMO_ISA_X86_BUILDS
    if constexpr (kAvx2) {
      for (int d = 0; d < D; ++d) {
        if (interp == HG_INTERP_SMOOTHSTEP) CoordsAvx2<HG_INTERP_SMOOTHSTEP>(x[d], lv.scale, count, g[d], w[d], dw[d]);
        else if (interp == HG_INTERP_LINEAR) CoordsAvx2<HG_INTERP_LINEAR>(x[d], lv.scale, count, g[d], w[d], dw[d]);
        else CoordsAvx2<HG_INTERP_NEAREST>(x[d], lv.scale, count, g[d], w[d], dw[d]);
      }
    }
#endif
    for (int d = 0; d < D && !kAvx2; ++d) {
      if (interp == HG_INTERP_SMOOTHSTEP) {
        for (int i = 0; i < count; ++i) hg_coord(x[d][i], lv.scale, HG_INTERP_SMOOTHSTEP, &g[d][i], &w[d][i], &dw[d][i]);
      } else if (interp == HG_INTERP_LINEAR) {
        for (int i = 0; i < count; ++i) hg_coord(x[d][i], lv.scale, HG_INTERP_LINEAR, &g[d][i], &w[d][i], &dw[d][i]);
      } else {
        for (int i = 0; i < count; ++i) hg_coord(x[d][i], lv.scale, HG_INTERP_NEAREST, &g[d][i], &w[d][i], &dw[d][i]);
      }
    }
    if (lv.mode == HG_INDEX_HASH) Rows<HG_INDEX_HASH>(lv, count, nc);
    else if (lv.mode == HG_INDEX_DENSE) Rows<HG_INDEX_DENSE>(lv, count, nc);
    else Rows<HG_INDEX_TILED>(lv, count, nc);
    if (nc == 1) {
      for (int i = 0; i < count; ++i) wt[0][i] = 1.0f;
      return;
    }
    for (int c = 0; c < nc; ++c) {
      float* out = wt[c];
      for (int i = 0; i < count; ++i) {
        float v = 1.0f;  // = hg_corner_weight, in the same multiplication order
        for (int d = 0; d < D; ++d) v *= ((c >> d) & 1) ? w[d][i] : 1.0f - w[d][i];
        out[i] = v;
      }
    }
  }
};

// The F values of each of the nc corners of tile point i, as float32: val[c*F + f]. float16 tables gather the
// raw bits first and convert them in one fixed-length loop the compiler vectorises.
template <int D, int F, typename T>
TFMO_FN void GatherCorners(const T* table, const TileCorners<D>& tc, int i, int nc, float* val) {
  constexpr int kN = (1 << D) * F;
  if (std::is_same<T, uint16_t>::value && nc == (1 << D)) {
    T raw[kN];
    for (int c = 0; c < (1 << D); ++c)
      for (int f = 0; f < F; ++f) raw[c * F + f] = table[(int64_t)tc.row[c][i] * F + f];
    for (int k = 0; k < kN; ++k) val[k] = Load<T>(raw + k);
    return;
  }
  for (int c = 0; c < nc; ++c)
    for (int f = 0; f < F; ++f) val[c * F + f] = Load<T>(table + (int64_t)tc.row[c][i] * F + f);
}

// Forward of points [b, e) of one level into o [N][F] (level-major).
template <int D, int F, typename T, bool kAvx2>
TFMO_FN void EncodeRangeBody(const HgLevel* lvp, int interp, int nc, const float* pos, const T* table, T* o,
                                    int64_t b, int64_t e) {
  const HgLevel lv = *lvp;
  TileCorners<D> tc;
  for (int64_t t = b; t < e; t += kTile) {
    const int count = (int)std::min<int64_t>(kTile, e - t);
    tc.template Compute<kAvx2>(pos, t, count, lv, interp, nc);
    int i0 = 0;
#ifdef TFMO_ISA_X86_BUILDS
    if constexpr (kAvx2 && F == 2) {
      if (nc == (1 << D)) {
        if constexpr (std::is_same<T, float>::value) {
          i0 = EncodeTileF2Avx2<D, T>(table, tc, count, o + t * F);
        } else {
          float res[kTile * F];
          i0 = EncodeTileF2Avx2<D, T>(table, tc, count, res);
          for (int k = 0; k < i0 * F; ++k) o[t * F + k] = Store<T>(res[k]);
        }
      }
    }
#endif
    for (int i = i0; i < count; ++i) {
      if (i + kPrefetch < count)  // random rows: start their cache misses a few points ahead
        for (int c = 0; c < nc; ++c) __builtin_prefetch(table + (int64_t)tc.row[c][i + kPrefetch] * F, 0);
      float val[(1 << D) * F];
      GatherCorners<D, F, T>(table, tc, i, nc, val);
      float acc[F] = {};
      for (int c = 0; c < nc; ++c) {
        const float w = tc.wt[c][i];
        for (int f = 0; f < F; ++f) acc[f] += w * val[c * F + f];
      }
      for (int f = 0; f < F; ++f) o[(t + i) * F + f] = Store<T>(acc[f]);
    }
  }
}
template <int D, int F, typename T, typename... A>
void EncodeRange(A... a) {
  HashGridBuild([&](auto avx2) TFMO_FN_LAMBDA { EncodeRangeBody<D, F, T, decltype(avx2)::value>(a...); });
}

// d/dparams of all points [0, n) of one level, for table rows [lo, hi) only when split.
template <int D, int F, typename T, bool kAvx2>
TFMO_FN void ScatterLevelBody(const HgLevel* lvp, int interp, int nc, const float* pos, const float* gl,
                                     float* acc, int64_t n, uint lo, uint hi, bool split) {
  const HgLevel lv = *lvp;
  TileCorners<D> tc;
  for (int64_t t = 0; t < n; t += kTile) {
    const int count = (int)std::min<int64_t>(kTile, n - t);
    tc.template Compute<kAvx2>(pos, t, count, lv, interp, nc);
    // The corner count (1: nearest, else 2^D) and the row filter as constants, so the corner loop unrolls.
    auto points = [&](auto corners, auto filtered) {
      constexpr int kNc = decltype(corners)::value;
      for (int i = 0; i < count; ++i) {
        if (i + kPrefetch < count)
          for (int c = 0; c < kNc; ++c) __builtin_prefetch(acc + (int64_t)tc.row[c][i + kPrefetch] * F, 1);
        const float* gi = gl + (t + i) * F;
        for (int c = 0; c < kNc; ++c) {
          const uint r = tc.row[c][i];
          if (decltype(filtered)::value && (r < lo || r >= hi)) continue;
          float* a = acc + (int64_t)r * F;
          const float w = tc.wt[c][i];
          for (int f = 0; f < F; ++f) a[f] += w * gi[f];
        }
      }
    };
    using Full = std::integral_constant<int, (1 << D)>;
    using One = std::integral_constant<int, 1>;
    if (nc == 1) split ? points(One(), std::true_type()) : points(One(), std::false_type());
    else split ? points(Full(), std::true_type()) : points(Full(), std::false_type());
  }
}
template <int D, int F, typename T, typename... A>
void ScatterLevel(A... a) {
  HashGridBuild([&](auto avx2) TFMO_FN_LAMBDA { ScatterLevelBody<D, F, T, decltype(avx2)::value>(a...); });
}

// The values of all 2^D corners of tile point i (val[c*F + f], float32) and their dot products with the point's
// dy of the level: sc[c] = <dy, value of corner c> (features in order). Shared by the position gradient and the
// second order.
template <int D, int F, typename T>
TFMO_FN void CornerDots(const T* table, const TileCorners<D>& tc, int i, const float* dy, float* val,
                               float* sc) {
  GatherCorners<D, F, T>(table, tc, i, 1 << D, val);
  for (int c = 0; c < (1 << D); ++c) {
    float acc = 0.0f;
    for (int f = 0; f < F; ++f) acc += dy[f] * val[c * F + f];
    sc[c] = acc;
  }
}

// For each point p of [b, e) on one level, in tiles: body(tc, i, p, val, sc) with the point's tile index i, its
// corners' values val and their dots sc with the level's dy (CornerDots; gl: dy of the level, float32 [N][F]), the
// table rows of the points kPrefetch ahead prefetched. Shared by the position gradient and the second order.
template <int D, int F, typename T, bool kAvx2, typename Body>
TFMO_FN void ForEachPointCornerDots(const HgLevel& lv, int interp, const float* pos, const T* table, const float* gl,
                                    int64_t b, int64_t e, Body body) {
  constexpr int nc = 1 << D;
  TileCorners<D> tc;
  for (int64_t t = b; t < e; t += kTile) {
    const int count = (int)std::min<int64_t>(kTile, e - t);
    tc.template Compute<kAvx2>(pos, t, count, lv, interp, nc);
    for (int i = 0; i < count; ++i) {
      if (i + kPrefetch < count)
        for (int c = 0; c < nc; ++c) __builtin_prefetch(table + (int64_t)tc.row[c][i + kPrefetch] * F, 0);
      float val[nc * F], sc[nc];
      CornerDots<D, F, T>(table, tc, i, gl + (t + i) * F, val, sc);
      body(tc, i, t + i, val, sc);
    }
  }
}

// d/dpositions contribution of one level for points [b, e), added to out [N][D].
template <int D, int F, typename T, bool kAvx2>
TFMO_FN void GradPosRangeBody(const HgLevel* lvp, int interp, const float* pos, const T* table, const float* gl,
                              float* out, int64_t b, int64_t e) {
  ForEachPointCornerDots<D, F, T, kAvx2>(
      *lvp, interp, pos, table, gl, b, e,
      [&](const TileCorners<D>& tc, int i, int64_t p, const float*, const float* sc) TFMO_FN_LAMBDA {
        float dx[HG_MAX_DIMS] = {};
        const HgPoint pt = tc.Point(i);
        hg_accumulate_dx(&pt, sc, D, dx);
        float* o = out + p * D;
        for (int k = 0; k < D; ++k) o[k] += dx[k];
      });
}
template <int D, int F, typename T, typename... A>
void GradPosRange(A... a) {
  HashGridBuild([&](auto avx2) TFMO_FN_LAMBDA { GradPosRangeBody<D, F, T, decltype(avx2)::value>(a...); });
}

// Second order, per point of one level (points [b, e)): d/d(dy) of the level's columns into out_dy (T; element
// (p, l*F + f) at p * ps + (l*F + f) * cs) and the level's d/dx contribution added to out_dx [N, D]. gl: dy of the
// level, float32 [N][F].
template <int D, int F, typename T, bool kAvx2>
TFMO_FN void Grad2PointsRangeBody(const HgLevel* lvp, int interp, int64_t ps, int64_t cs, int l, const float* pos,
                                         const T* table, const float* gl, const float* ddx, T* out_dy,
                                         float* out_dx, int64_t b, int64_t e) {
  const HgLevel lv = *lvp;
  constexpr int nc = 1 << D;
  ForEachPointCornerDots<D, F, T, kAvx2>(
      lv, interp, pos, table, gl, b, e,
      [&](const TileCorners<D>& tc, int i, int64_t p, const float* val, const float* sc) TFMO_FN_LAMBDA {
        const HgPoint pt = tc.Point(i);
        float xi[HG_MAX_DIMS] = {}, dd[HG_MAX_DIMS] = {}, ddw[HG_MAX_DIMS];
        for (int d = 0; d < D; ++d) { xi[d] = tc.x[d][i]; dd[d] = ddx[p * D + d]; }
        hg_point_d2(xi, D, lv.scale, interp, ddw);
        float v[nc];
        hg_second_order_weights(&pt, dd, D, v);
        float acc[F] = {};
        for (int c = 0; c < nc; ++c)
          for (int f = 0; f < F; ++f) acc[f] += v[c] * val[c * F + f];
        T* o = out_dy + p * ps + (int64_t)l * F * cs;
        for (int f = 0; f < F; ++f) o[f * cs] = Store<T>(acc[f]);
        float dx[HG_MAX_DIMS] = {};
        hg_accumulate_d2x(&pt, ddw, sc, dd, D, dx);
        float* ox = out_dx + p * D;
        for (int k = 0; k < D; ++k) ox[k] += dx[k];
      });
}
template <int D, int F, typename T, typename... A>
void Grad2PointsRange(A... a) {
  HashGridBuild([&](auto avx2) TFMO_FN_LAMBDA { Grad2PointsRangeBody<D, F, T, decltype(avx2)::value>(a...); });
}

// Second order, d/dparams of all points [0, n) of one level (rows [lo, hi) only when split): scatters
// v[c] * dy (hg_second_order_weights) in point order, like ScatterLevel.
template <int D, int F, typename T, bool kAvx2>
TFMO_FN void Scatter2LevelBody(const HgLevel* lvp, int interp, const float* pos, const float* gl,
                                      const float* ddx, float* acc, int64_t n, uint lo, uint hi, bool split) {
  const HgLevel lv = *lvp;
  constexpr int nc = 1 << D;
  TileCorners<D> tc;
  for (int64_t t = 0; t < n; t += kTile) {
    const int count = (int)std::min<int64_t>(kTile, n - t);
    tc.template Compute<kAvx2>(pos, t, count, lv, interp, nc);
    for (int i = 0; i < count; ++i) {
      if (i + kPrefetch < count)
        for (int c = 0; c < nc; ++c) __builtin_prefetch(acc + (int64_t)tc.row[c][i + kPrefetch] * F, 1);
      const int64_t p = t + i;
      const float* gi = gl + p * F;
      const HgPoint pt = tc.Point(i);
      float dd[HG_MAX_DIMS] = {};
      for (int d = 0; d < D; ++d) dd[d] = ddx[p * D + d];
      float v[nc];
      hg_second_order_weights(&pt, dd, D, v);
      for (int c = 0; c < nc; ++c) {
        const uint r = tc.row[c][i];
        if (split && (r < lo || r >= hi)) continue;
        float* a = acc + (int64_t)r * F;
        for (int f = 0; f < F; ++f) a[f] += v[c] * gi[f];
      }
    }
  }
}
template <int D, int F, typename T, typename... A>
void Scatter2Level(A... a) {
  HashGridBuild([&](auto avx2) TFMO_FN_LAMBDA { Scatter2LevelBody<D, F, T, decltype(avx2)::value>(a...); });
}

// ---------------------------------------------------------------------------------------------------------
// Forward. Results go level-major into scratch [active][N][F] (each level pass then writes one contiguous
// stream instead of 8 bytes into every output row), then one pass interleaves them into [N, L*F], or
// (feature_major) splits them into the F rows of [L*F, N] per level.
template <int D, int F, typename T>
void Encode(const Inputs& call, T* out) {
  const int L = call.cfg->n_levels;
  const int active = call.n_active;
  const int interp = call.cfg->interpolation;
  const int nc = (int)hg_num_corners(D, interp);
  const float* pos = call.positions.data<float>();
  const T* table = call.params.data<T>();
  const int64_t n = call.n;
  Scratch<T> tmp_buf((size_t)active * n * F, 0);
  T* tmp = tmp_buf.get();
  for (int l = 0; l < active; ++l) {
    const HgLevel lv = call.levels[l];
    T* o = tmp + (size_t)l * n * F;
    tfmo::ParallelFor(n, 4 * kTile, [&](int64_t b, int64_t e) {
      EncodeRange<D, F, T>(&lv, interp, nc, pos, table, o, b, e);
    });
  }
  const T zero = Store<T>(0.0f);
  if (call.cfg->feature_major) {
    tfmo::ParallelFor(n, 2048, [&](int64_t b, int64_t e) {
      for (int l = 0; l < L; ++l)
        for (int f = 0; f < F; ++f) {
          T* row = out + ((int64_t)l * F + f) * n;
          if (l >= active) {
            std::fill(row + b, row + e, zero);
            continue;
          }
          const T* src = tmp + (size_t)l * n * F + f;
          for (int64_t i = b; i < e; ++i) row[i] = src[i * F];
        }
    });
    return;
  }
  tfmo::ParallelFor(n, 2048, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      T* row = out + i * L * F;
      for (int l = 0; l < active; ++l)
        for (int f = 0; f < F; ++f) row[l * F + f] = tmp[((size_t)l * n + i) * F + f];
      for (int k = active * F; k < L * F; ++k) row[k] = zero;
    }
  });
}

// ---------------------------------------------------------------------------------------------------------
// d/dparams into `acc`, float32 [rows, F] (every row written: each task zeroes its rows right before scattering
// into them, so zeroing and first-touch page faults are spread over the threads; inactive levels are zeroed
// at the end); dy in T (the encoded layout: Inputs::point_stride, column_stride).
// The deterministic table-gradient driver shared by GradParams and the second order: zeroes acc [rows, F]
// (each task its own rows, inactive levels at the start), converts dy to level-major float32 and runs
// scatter(level, gl, lo, hi, split) once per (level, row range) task. Every row is summed by exactly one task.
template <int F, typename T, class Scatter>
void ParamTasks(const Inputs& call, const T* dy, float* acc, Scatter scatter) {
  const int active = call.n_active;
  const int64_t n = call.n;
  const int64_t rows_active = active > 0 ? (int64_t)call.levels[active - 1].offset + call.levels[active - 1].size : 0;
  tfmo::ParallelFor((call.rows - rows_active) * F, 1 << 16, [&](int64_t b, int64_t e) {
    std::fill(acc + rows_active * F + b, acc + rows_active * F + e, 0.0f);
  });
  if (active == 0) return;
  // dy for the active levels, level-major float32 [active][N][F]: each task then streams its level's slice.
  Scratch<float> g_buf((size_t)active * n * F, 1);
  float* g = g_buf.get();
  ToLevelMajor<F, T>(dy, n, call.point_stride, call.column_stride, active, g);
  // Tasks: (level, split). Larger levels first so the longest tasks start early.
  const int threads = tfmo::NumThreads();
  const int splits = std::max(1, (2 * threads + active - 1) / active);
  std::vector<int> order(active);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return call.levels[a].size > call.levels[b].size; });
  tfmo::ParallelParts((int64_t)active * splits, [&](int64_t task) {
    const int l = order[task / splits];
    const int s = (int)(task % splits);
    const HgLevel lv = call.levels[l];
    // Rows [lo, hi) of the table (absolute); splits == 1 covers the whole level.
    const uint lo = lv.offset + (uint)((uint64_t)lv.size * s / splits);
    const uint hi = lv.offset + (uint)((uint64_t)lv.size * (s + 1) / splits);
    std::fill(acc + (int64_t)lo * F, acc + (int64_t)hi * F, 0.0f);
    if (n == 0) return;
    scatter(lv, g + (size_t)l * n * F, lo, hi, splits > 1);
  });
}

template <int D, int F, typename T>
void GradParams(const Inputs& call, const T* dy, float* acc) {
  const int interp = call.cfg->interpolation;
  const int nc = (int)hg_num_corners(D, interp);
  const float* pos = call.positions.data<float>();
  const int64_t n = call.n;
  ParamTasks<F, T>(call, dy, acc, [&](const HgLevel& lv, const float* gl, uint lo, uint hi, bool split) {
    ScatterLevel<D, F, T>(&lv, interp, nc, pos, gl, acc, n, lo, hi, split);
  });
}

// dy's active levels as level-major float32 (ToLevelMajor, in scratch slot 1), then per level l, in parallel over
// ranges [b, e) of the points: body(l, level, gl, b, e), gl being dy of the level [N][F].
template <int F, typename T, typename Body>
void ForEachActiveLevel(const Inputs& call, const T* dy, Body body) {
  if (call.n_active == 0 || call.n == 0) return;
  Scratch<float> g_buf((size_t)call.n_active * call.n * F, 1);
  float* g = g_buf.get();
  ToLevelMajor<F, T>(dy, call.n, call.point_stride, call.column_stride, call.n_active, g);
  for (int l = 0; l < call.n_active; ++l) {
    const float* gl = g + (size_t)l * call.n * F;
    const HgLevel lv = call.levels[l];
    tfmo::ParallelFor(call.n, 4 * kTile, [&](int64_t b, int64_t e) { body(l, lv, gl, b, e); });
  }
}

// ---------------------------------------------------------------------------------------------------------
// d/dpositions: out float32 [N, D] (written here).
template <int D, int F, typename T>
void GradPositions(const Inputs& call, const T* dy, float* out) {
  const int interp = call.cfg->interpolation;
  const float* pos = call.positions.data<float>();
  const T* table = call.params.data<T>();
  const int64_t n = call.n;
  tfmo::ParallelFor(n * D, 1 << 16, [&](int64_t b, int64_t e) { std::fill(out + b, out + e, 0.0f); });
  if (interp == HG_INTERP_NEAREST) return;  // nearest: piecewise constant in x
  ForEachActiveLevel<F, T>(call, dy, [&](int, const HgLevel& lv, const float* gl, int64_t b, int64_t e) {
    GradPosRange<D, F, T>(&lv, interp, pos, table, gl, out, b, e);
  });
}

// ---------------------------------------------------------------------------------------------------------
// Second order (gradient of GradPositions): d/d(dy) into out_dy (dy's layout, T), d/dparams into acc [rows, F]
// float32, d/dx into out_dx [N, D] float32; everything written here. Deterministic: per point the levels in
// order; per table row the points in order (ParamTasks).
template <int D, int F, typename T>
void SecondOrder(const Inputs& call, const float* ddx, const T* dy, T* out_dy, float* acc, float* out_dx) {
  const int L = call.cfg->n_levels;
  const int interp = call.cfg->interpolation;
  const float* pos = call.positions.data<float>();
  const T* table = call.params.data<T>();
  const int64_t n = call.n;
  const T zero = Store<T>(0.0f);
  tfmo::ParallelFor(n * D, 1 << 16, [&](int64_t b, int64_t e) { std::fill(out_dx + b, out_dx + e, 0.0f); });
  tfmo::ParallelFor(n * L * F, 1 << 16, [&](int64_t b, int64_t e) { std::fill(out_dy + b, out_dy + e, zero); });
  if (interp == HG_INTERP_NEAREST) {  // the position gradient is identically zero: so are its derivatives
    tfmo::ParallelFor(call.rows * F, 1 << 16, [&](int64_t b, int64_t e) { std::fill(acc + b, acc + e, 0.0f); });
    return;
  }
  ParamTasks<F, T>(call, dy, acc, [&](const HgLevel& lv, const float* gl, uint lo, uint hi, bool split) {
    Scatter2Level<D, F, T>(&lv, interp, pos, gl, ddx, acc, n, lo, hi, split);
  });
  // (ParamTasks' use of scratch slot 1 has ended)
  ForEachActiveLevel<F, T>(call, dy, [&](int l, const HgLevel& lv, const float* gl, int64_t b, int64_t e) {
    Grad2PointsRange<D, F, T>(&lv, interp, call.point_stride, call.column_stride, l, pos, table, gl, ddx, out_dy,
                               out_dx, b, e);
  });
}

// ---------------------------------------------------------------------------------------------------------
// Dispatch on (D, F, T).
template <template <int, int, typename> class K, typename... Args>
void Dispatch(const Inputs& call, Args... args) {
  const int F = call.cfg->n_features;
  const bool half = call.cfg->dtype == TF_HALF;
#define TFMO_HG_CASE(DD, FF)                                             \
  if (call.dims == DD && F == FF) {                                      \
    if (half) K<DD, FF, uint16_t>::Run(call, args...);                   \
    else K<DD, FF, float>::Run(call, args...);                           \
    return;                                                              \
  }
#define TFMO_HG_CASES(DD) TFMO_HG_CASE(DD, 1) TFMO_HG_CASE(DD, 2) TFMO_HG_CASE(DD, 4) TFMO_HG_CASE(DD, 8)
  TFMO_HG_CASES(1) TFMO_HG_CASES(2) TFMO_HG_CASES(3) TFMO_HG_CASES(4)
#undef TFMO_HG_CASES
#undef TFMO_HG_CASE
}

template <int D, int F, typename T>
struct EncodeK {
  static void Run(const Inputs& c, void* out) { Encode<D, F, T>(c, static_cast<T*>(out)); }
};
template <int D, int F, typename T>
struct GradParamsK {
  static void Run(const Inputs& c, const void* dy, float* acc) { GradParams<D, F, T>(c, static_cast<const T*>(dy), acc); }
};
template <int D, int F, typename T>
struct GradPositionsK {
  static void Run(const Inputs& c, const void* dy, float* out) {
    GradPositions<D, F, T>(c, static_cast<const T*>(dy), out);
  }
};

template <int D, int F, typename T>
struct SecondOrderK {
  static void Run(const Inputs& c, const float* ddx, const void* dy, void* out_dy, float* acc, float* out_dx) {
    SecondOrder<D, F, T>(c, ddx, static_cast<const T*>(dy), static_cast<T*>(out_dy), acc, out_dx);
  }
};

// The op kernels (registered by hash_grid_cpu.cc), one per file.
void EncodeCompute(void* state, TF_OpKernelContext* ctx);
void GradParamsCompute(void* state, TF_OpKernelContext* ctx);
void GradPositionsCompute(void* state, TF_OpKernelContext* ctx);
void SecondOrderCompute(void* state, TF_OpKernelContext* ctx);

}  // namespace tfmo::hash_grid::cpu
