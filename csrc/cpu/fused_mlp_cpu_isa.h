// The ISA builds of the fused-MLP CPU kernels' products (csrc/cpu/fused_mlp_cpu.cc; the choice between them is at
// its end). Every build computes every output element with the same operations in the same order; the register
// tiles differ, which changes no element's chain. So every build gives bitwise identical results, but for the amx
// build's bfloat16 products (AMX tiles, whose rounding is the hardware's own: see DenseBf16Amx).
//
// float32 products, Dense and AccumulateOuter: a chain of fused multiply-adds in order of the summed index, each
// rounded once. A portable body (the default build; tfmo_fma: the FMA instructions of ARM, glibc's correctly rounded
// fmaf on x86-64, which is slow and runs only on CPUs without AVX2 and FMA) and, on x86-64 with GCC, intrinsics:
// 8-lane vfmadd (avx2), 16-lane vfmadd (avx512, and the avx512bf16 and amx builds).
//
// bfloat16 products, DenseBf16 and AccumulateOuterBf16: the operands are bfloat16 (ToBf16: round to nearest even,
// float32 denormals to zero), taken in pairs (k = 2p, 2p + 1) along the summed index; each output's float32 sum
// goes pair by pair, and pair p adds first the odd term, then the even one, each as a fused multiply-add (the exact
// product added, rounded once to nearest even), every result below the smallest normal float32 flushed to zero
// (sign kept): VDPBF16PS's definition (Intel's SDM: "FP32 FMA with daz in, ftz out and RNE rounding"; the inputs
// here are never denormal). A product of two bfloat16 values is exact in float32 unless it falls below the smallest
// normal, so only there does the fused step differ from a multiply and an add; an AMD Zen 4 (AVX512-BF16) matched
// this definition bit for bit on 400,000 random pairs in that range, where a product flushed or rounded on its own
// did not. The avx512bf16 build runs that instruction; default, avx2 and avx512 compute the same definition: the
// default build in scalar code (std::fma, FlushTiny), avx2 and avx512 with 8-lane fused multiply-adds under MXCSR's
// flush-to-zero and denormals-are-zero modes (BF16Flush, set around the call). The amx build runs TDPBF16PS, whose
// sums are rounded its own way (DenseBf16Amx).
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "common/isa_choice.h"
#include "shared/device_compat.h"

#ifdef TFMO_ISA_X86_BUILDS
#include <immintrin.h>
#endif

namespace tfmo::fused_mlp::cpu {

// default, avx2, avx512, avx512bf16 and amx, chosen at the end of fused_mlp_cpu.cc (TF_METAL_OPS_FUSED_MLP_ISA); a call is
// a product.
TFMO_ISA_FAMILY_BUILDS(5);

constexpr int kRowPad = 4;    // block row counts are padded to a multiple of this (every build's row tile divides it)
constexpr int kColTile = 16;  // outputs per register tile (every layer's output count is a multiple of 16)

// out[b][o] = (bias ? bias[o] : 0) + sum_{i < cols, in order} in[b][i] * m[i][o] (acc = fma(in, m, acc) for
// i = 0, 1, ...) for b < rows (a multiple of
// kRowPad), o < r (a multiple of kColTile); in is [rows][cols], m [cols][r], out [rows][r], all row-major.
template <int kRowTile>
TFMO_FN void DenseBody(const float* in, int cols, const float* m, int r, const float* bias, float* out, int rows) {
  for (int b0 = 0; b0 < rows; b0 += kRowTile) {
    const float* a = in + static_cast<int64_t>(b0) * cols;
    for (int o0 = 0; o0 < r; o0 += kColTile) {
      float acc[kRowTile][kColTile];
      for (int t = 0; t < kRowTile; ++t)
        for (int j = 0; j < kColTile; ++j) acc[t][j] = bias ? bias[o0 + j] : 0.0f;
      for (int i = 0; i < cols; ++i) {
        const float* w = m + static_cast<int64_t>(i) * r + o0;
        for (int t = 0; t < kRowTile; ++t) {
          const float av = a[t * cols + i];
          for (int j = 0; j < kColTile; ++j) acc[t][j] = tfmo_fma(av, w[j], acc[t][j]);
        }
      }
      for (int t = 0; t < kRowTile; ++t)
        for (int j = 0; j < kColTile; ++j) out[static_cast<int64_t>(b0 + t) * r + o0 + j] = acc[t][j];
    }
  }
}

// dw[o][i] += sum_{b < n, in order} g[b][o] * prev[b][i] (dw = fma(g, prev, dw) for b = 0, 1, ...); g is [n][rows]
// (rows a multiple of 16), prev rows have
// stride ld, dw is row-major [rows][cols] (cols a multiple of kColTile).
template <int kRowTile>
TFMO_FN void OuterBody(const float* g, int rows, const float* prev, int64_t ld, int cols, int n, float* dw) {
  for (int o0 = 0; o0 < rows; o0 += kRowTile) {
    for (int i0 = 0; i0 < cols; i0 += kColTile) {
      float acc[kRowTile][kColTile];
      for (int t = 0; t < kRowTile; ++t)
        for (int j = 0; j < kColTile; ++j) acc[t][j] = dw[static_cast<int64_t>(o0 + t) * cols + i0 + j];
      for (int b = 0; b < n; ++b) {
        const float* p = prev + b * ld + i0;
        for (int t = 0; t < kRowTile; ++t) {
          const float gv = g[static_cast<int64_t>(b) * rows + o0 + t];
          for (int j = 0; j < kColTile; ++j) acc[t][j] = tfmo_fma(gv, p[j], acc[t][j]);
        }
      }
      for (int t = 0; t < kRowTile; ++t)
        for (int j = 0; j < kColTile; ++j) dw[static_cast<int64_t>(o0 + t) * cols + i0 + j] = acc[t][j];
    }
  }
}

// ---- bfloat16 ---------------------------------------------------------------------------------------------------

// The bfloat16 (bits) nearest to x, ties to even; float32 denormals become zero (with x's sign), NaN a quiet NaN.
TFMO_FN uint16_t ToBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0) return static_cast<uint16_t>((u >> 16) & 0x8000u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
TFMO_FN float Bf16ToFloat(uint32_t bits16) {
  const uint32_t u = bits16 << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
// x, or zero with x's sign when |x| is below the smallest normal float32 (flush to zero).
TFMO_FN float FlushTiny(float x) {
  return std::fabs(x) < std::numeric_limits<float>::min() ? std::copysign(0.0f, x) : x;
}
// One pair of a bfloat16 sum (see the top): fma(a1, b1, acc), then fma(a0, b0, .), each result flushed.
TFMO_FN float PairStep(float acc, float a0, float a1, float b0, float b1) {
  acc = FlushTiny(std::fma(a1, b1, acc));
  return FlushTiny(std::fma(a0, b0, acc));
}
// The pair (in[2p], in[2p + 1]) of a bfloat16 array as one 32-bit word (element 2p in the low half).
TFMO_FN uint32_t LoadPair(const uint16_t* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

// out[b][o] = (bias ? bias[o] : 0) + sum over pairs p < cols / 2, in order, of in[b][2p + 1] m[2p + 1][o] and
// in[b][2p] m[2p][o] (PairStep) for b < rows (a multiple of kRowPad), o < r (a multiple of kColTile); in is bfloat16
// [rows][cols] (cols even), mp the bfloat16 matrix in pairs: m[2p + e][o] at mp[(p * r + o) * 2 + e]; bias flushed
// (FlushTiny).
TFMO_FN void DenseBf16Body(const uint16_t* in, int cols, const uint16_t* mp, int r, const float* bias, float* out,
                           int rows) {
  for (int b = 0; b < rows; ++b) {
    const uint16_t* a = in + static_cast<int64_t>(b) * cols;
    for (int o0 = 0; o0 < r; o0 += kColTile) {
      float acc[kColTile];
      for (int j = 0; j < kColTile; ++j) acc[j] = bias ? bias[o0 + j] : 0.0f;
      for (int p = 0; p < cols / 2; ++p) {
        const float a0 = Bf16ToFloat(a[2 * p]), a1 = Bf16ToFloat(a[2 * p + 1]);
        const uint16_t* w = mp + (static_cast<int64_t>(p) * r + o0) * 2;
        for (int j = 0; j < kColTile; ++j)
          acc[j] = PairStep(acc[j], a0, a1, Bf16ToFloat(w[2 * j]), Bf16ToFloat(w[2 * j + 1]));
      }
      for (int j = 0; j < kColTile; ++j) out[static_cast<int64_t>(b) * r + o0 + j] = acc[j];
    }
  }
}

// dw[o][i] += sum over pairs p < pairs, in order, of g[2p + 1][o] prev[2p + 1][i] and g[2p][o] prev[2p][i]
// (PairStep), dw row-major [rows][cols] (rows a multiple of kRowPad, cols of kColTile), flushed (it holds only
// results of earlier calls or zeros); gp and pp the bfloat16 pairs of rows: g[2p + e][o] at gp[(p * rows + o) * 2 + e],
// prev[2p + e][i] at pp[(p * cols + i) * 2 + e].
TFMO_FN void OuterBf16Body(const uint16_t* gp, int rows, const uint16_t* pp, int cols, int pairs, float* dw) {
  for (int o = 0; o < rows; ++o) {
    for (int i0 = 0; i0 < cols; i0 += kColTile) {
      float acc[kColTile];
      float* d = dw + static_cast<int64_t>(o) * cols + i0;
      for (int j = 0; j < kColTile; ++j) acc[j] = d[j];
      for (int p = 0; p < pairs; ++p) {
        const uint16_t* gv = gp + (static_cast<int64_t>(p) * rows + o) * 2;
        const float g0 = Bf16ToFloat(gv[0]), g1 = Bf16ToFloat(gv[1]);
        const uint16_t* q = pp + (static_cast<int64_t>(p) * cols + i0) * 2;
        for (int j = 0; j < kColTile; ++j)
          acc[j] = PairStep(acc[j], g0, g1, Bf16ToFloat(q[2 * j]), Bf16ToFloat(q[2 * j + 1]));
      }
      for (int j = 0; j < kColTile; ++j) d[j] = acc[j];
    }
  }
}

// ---- the builds ---------------------------------------------------------------------------------------------------

// The default build: the bodies above (float32 with 2-row tiles).
__attribute__((noinline)) inline void DenseDefault(const float* in, int cols, const float* m, int r,
                                                   const float* bias, float* out, int rows) {
  DenseBody<2>(in, cols, m, r, bias, out, rows);
}
__attribute__((noinline)) inline void OuterDefault(const float* g, int rows, const float* prev, int64_t ld, int cols,
                                                   int n, float* dw) {
  OuterBody<2>(g, rows, prev, ld, cols, n, dw);
}
__attribute__((noinline)) inline void DenseBf16Default(const uint16_t* in, int cols, const uint16_t* mp, int r,
                                                       const float* bias, float* out, int rows) {
  DenseBf16Body(in, cols, mp, r, bias, out, rows);
}
__attribute__((noinline)) inline void OuterBf16Default(const uint16_t* gp, int rows, const uint16_t* pp, int cols,
                                                       int pairs, float* dw) {
  OuterBf16Body(gp, rows, pp, cols, pairs, dw);
}
#ifdef TFMO_ISA_X86_BUILDS
// DenseBody and OuterBody with intrinsics (the compiler keeps neither's tile in registers by itself): 4 rows by 16
// outputs in eight 8-lane accumulators, each lane the same fma chain as DenseBody's / OuterBody's element.
struct Tile4x16 {
  __m256 v[4][2];  // row t, columns [8h, 8h + 8)
};
// Rows t < 4 of the tile from / to p + t * ld.
TFMO_FN TFMO_ISA(avx2) void TileLoad(Tile4x16& a, const float* p, int64_t ld) {
  for (int t = 0; t < 4; ++t) a.v[t][0] = _mm256_loadu_ps(p + t * ld), a.v[t][1] = _mm256_loadu_ps(p + t * ld + 8);
}
TFMO_FN TFMO_ISA(avx2) void TileStore(const Tile4x16& a, float* p, int64_t ld) {
  for (int t = 0; t < 4; ++t) _mm256_storeu_ps(p + t * ld, a.v[t][0]), _mm256_storeu_ps(p + t * ld + 8, a.v[t][1]);
}
// Row t += x[t * step] * (w0, w1), one fused multiply-add per element.
TFMO_FN TFMO_ISA(avx2) void TileFma(Tile4x16& a, const float* x, int64_t step, __m256 w0, __m256 w1) {
  for (int t = 0; t < 4; ++t) {
    const __m256 v = _mm256_broadcast_ss(x + t * step);
    a.v[t][0] = _mm256_fmadd_ps(v, w0, a.v[t][0]);
    a.v[t][1] = _mm256_fmadd_ps(v, w1, a.v[t][1]);
  }
}

TFMO_ISA(avx2) __attribute__((noinline)) inline void DenseAvx2(const float* in, int cols, const float* m, int r,
                                                                 const float* bias, float* out, int rows) {
  for (int b0 = 0; b0 < rows; b0 += 4) {
    const float* a = in + static_cast<int64_t>(b0) * cols;
    for (int o0 = 0; o0 < r; o0 += kColTile) {
      Tile4x16 acc;
      for (int t = 0; t < 4; ++t) {
        acc.v[t][0] = bias ? _mm256_loadu_ps(bias + o0) : _mm256_setzero_ps();
        acc.v[t][1] = bias ? _mm256_loadu_ps(bias + o0 + 8) : _mm256_setzero_ps();
      }
      for (int i = 0; i < cols; ++i) {
        const float* w = m + static_cast<int64_t>(i) * r + o0;
        TileFma(acc, a + i, cols, _mm256_loadu_ps(w), _mm256_loadu_ps(w + 8));
      }
      TileStore(acc, out + static_cast<int64_t>(b0) * r + o0, r);
    }
  }
}

TFMO_ISA(avx2) __attribute__((noinline)) inline void OuterAvx2(const float* g, int rows, const float* prev,
                                                                 int64_t ld, int cols, int n, float* dw) {
  for (int o0 = 0; o0 < rows; o0 += 4) {
    for (int i0 = 0; i0 < cols; i0 += kColTile) {
      float* d = dw + static_cast<int64_t>(o0) * cols + i0;
      Tile4x16 acc;
      TileLoad(acc, d, cols);
      for (int b = 0; b < n; ++b) {
        const float* p = prev + b * ld + i0;
        TileFma(acc, g + static_cast<int64_t>(b) * rows + o0, 1, _mm256_loadu_ps(p), _mm256_loadu_ps(p + 8));
      }
      TileStore(acc, d, cols);
    }
  }
}

// bfloat16 pairs as float32 lanes: 8 pairs at p -> (even, odd) elements; one pair word -> broadcast (even, odd).
TFMO_FN TFMO_ISA(avx2) void SplitPairs(const uint16_t* p, __m256& even, __m256& odd) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}
TFMO_FN TFMO_ISA(avx2) void SplitPair(uint32_t w, __m256& even, __m256& odd) {
  const __m256i v = _mm256_set1_epi32(static_cast<int>(w));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}
// PairStep on 8 lanes: fused multiply-adds (flushed by MXCSR's modes, BF16Flush).
TFMO_FN TFMO_ISA(avx2) __m256 PairStep8(__m256 acc, __m256 a0, __m256 a1, __m256 b0, __m256 b1) {
  acc = _mm256_fmadd_ps(a1, b1, acc);
  return _mm256_fmadd_ps(a0, b0, acc);
}

// DenseBf16Body and OuterBf16Body on 4 rows by 16 outputs in 8-lane registers; the caller sets BF16Flush.
TFMO_ISA(avx2) __attribute__((noinline)) inline void DenseBf16Avx2(const uint16_t* in, int cols, const uint16_t* mp,
                                                                     int r, const float* bias, float* out, int rows) {
  for (int b0 = 0; b0 < rows; b0 += 4) {
    const uint16_t* a = in + static_cast<int64_t>(b0) * cols;
    for (int o0 = 0; o0 < r; o0 += kColTile) {
      Tile4x16 acc;
      for (int t = 0; t < 4; ++t) {
        acc.v[t][0] = bias ? _mm256_loadu_ps(bias + o0) : _mm256_setzero_ps();
        acc.v[t][1] = bias ? _mm256_loadu_ps(bias + o0 + 8) : _mm256_setzero_ps();
      }
      for (int p = 0; p < cols / 2; ++p) {
        const uint16_t* w = mp + (static_cast<int64_t>(p) * r + o0) * 2;
        __m256 we0, wo0, we1, wo1;
        SplitPairs(w, we0, wo0);
        SplitPairs(w + 16, we1, wo1);
        for (int t = 0; t < 4; ++t) {
          __m256 ae, ao;
          SplitPair(LoadPair(a + static_cast<int64_t>(t) * cols + 2 * p), ae, ao);
          acc.v[t][0] = PairStep8(acc.v[t][0], ae, ao, we0, wo0);
          acc.v[t][1] = PairStep8(acc.v[t][1], ae, ao, we1, wo1);
        }
      }
      TileStore(acc, out + static_cast<int64_t>(b0) * r + o0, r);
    }
  }
}
TFMO_ISA(avx2) __attribute__((noinline)) inline void OuterBf16Avx2(const uint16_t* gp, int rows, const uint16_t* pp,
                                                                     int cols, int pairs, float* dw) {
  for (int o0 = 0; o0 < rows; o0 += 4) {
    for (int i0 = 0; i0 < cols; i0 += kColTile) {
      float* d = dw + static_cast<int64_t>(o0) * cols + i0;
      Tile4x16 acc;
      TileLoad(acc, d, cols);
      for (int p = 0; p < pairs; ++p) {
        const uint16_t* q = pp + (static_cast<int64_t>(p) * cols + i0) * 2;
        __m256 qe0, qo0, qe1, qo1;
        SplitPairs(q, qe0, qo0);
        SplitPairs(q + 16, qe1, qo1);
        const uint16_t* gv = gp + (static_cast<int64_t>(p) * rows + o0) * 2;
        for (int t = 0; t < 4; ++t) {
          __m256 ge, go;
          SplitPair(LoadPair(gv + 2 * t), ge, go);
          acc.v[t][0] = PairStep8(acc.v[t][0], ge, go, qe0, qo0);
          acc.v[t][1] = PairStep8(acc.v[t][1], ge, go, qe1, qo1);
        }
      }
      TileStore(acc, d, cols);
    }
  }
}

// MXCSR's flush-to-zero and denormals-are-zero modes for the life of the object (this thread), for the 8-lane
// bfloat16 emulation.
class BF16Flush {
 public:
  BF16Flush() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~BF16Flush() { _mm_setcsr(saved_); }
  BF16Flush(const BF16Flush&) = delete;
  BF16Flush& operator=(const BF16Flush&) = delete;

 private:
  unsigned saved_;
};

// The float32 products with 16-lane registers: kRows rows by kV * 16 outputs (kV 16-lane accumulators per row,
// kRows * kV = 16 of them, enough to cover the fused multiply-add's latency), each lane the same fma chain as
// DenseBody's / OuterBody's element. Built for avx512 (which the avx512bf16 and amx builds run).
template <int kRows, int kV>
TFMO_FN TFMO_ISA(avx512) void DenseZmm(const float* in, int cols, const float* m, int r, const float* bias, float* out,
                                       int b_begin, int b_end) {
  for (int b0 = b_begin; b0 < b_end; b0 += kRows) {
    const float* a = in + static_cast<int64_t>(b0) * cols;
    for (int o0 = 0; o0 < r; o0 += 16 * kV) {
      __m512 acc[kRows][kV];
      for (int t = 0; t < kRows; ++t)
        for (int v = 0; v < kV; ++v) acc[t][v] = bias ? _mm512_loadu_ps(bias + o0 + 16 * v) : _mm512_setzero_ps();
      for (int i = 0; i < cols; ++i) {
        const float* w = m + static_cast<int64_t>(i) * r + o0;
        __m512 wv[kV];
        for (int v = 0; v < kV; ++v) wv[v] = _mm512_loadu_ps(w + 16 * v);
        for (int t = 0; t < kRows; ++t) {
          const __m512 x = _mm512_set1_ps(a[static_cast<int64_t>(t) * cols + i]);
          for (int v = 0; v < kV; ++v) acc[t][v] = _mm512_fmadd_ps(x, wv[v], acc[t][v]);
        }
      }
      for (int t = 0; t < kRows; ++t)
        for (int v = 0; v < kV; ++v) _mm512_storeu_ps(out + static_cast<int64_t>(b0 + t) * r + o0 + 16 * v, acc[t][v]);
    }
  }
}
// Rows in tiles of kRows (a multiple of 4), the last rows % kRows (a multiple of kRowPad = 4) in tiles of 4.
template <int kRows, int kV>
TFMO_FN TFMO_ISA(avx512) void DenseZmmRows(const float* in, int cols, const float* m, int r, const float* bias,
                                           float* out, int rows) {
  const int full = rows / kRows * kRows;
  DenseZmm<kRows, kV>(in, cols, m, r, bias, out, 0, full);
  if (full < rows) DenseZmm<4, kV>(in, cols, m, r, bias, out, full, rows);
}
template <int kRows, int kV>
TFMO_FN TFMO_ISA(avx512) void OuterZmm(const float* g, int rows, const float* prev, int64_t ld, int cols, int n,
                                       float* dw) {
  for (int o0 = 0; o0 < rows; o0 += kRows) {
    for (int i0 = 0; i0 < cols; i0 += 16 * kV) {
      float* d = dw + static_cast<int64_t>(o0) * cols + i0;
      __m512 acc[kRows][kV];
      for (int t = 0; t < kRows; ++t)
        for (int v = 0; v < kV; ++v) acc[t][v] = _mm512_loadu_ps(d + static_cast<int64_t>(t) * cols + 16 * v);
      for (int b = 0; b < n; ++b) {
        const float* p = prev + b * ld + i0;
        __m512 pv[kV];
        for (int v = 0; v < kV; ++v) pv[v] = _mm512_loadu_ps(p + 16 * v);
        const float* gv = g + static_cast<int64_t>(b) * rows + o0;
        for (int t = 0; t < kRows; ++t) {
          const __m512 x = _mm512_set1_ps(gv[t]);
          for (int v = 0; v < kV; ++v) acc[t][v] = _mm512_fmadd_ps(x, pv[v], acc[t][v]);
        }
      }
      for (int t = 0; t < kRows; ++t)
        for (int v = 0; v < kV; ++v) _mm512_storeu_ps(d + static_cast<int64_t>(t) * cols + 16 * v, acc[t][v]);
    }
  }
}
TFMO_ISA(avx512) __attribute__((noinline)) inline void DenseAvx512(const float* in, int cols, const float* m, int r,
                                                                     const float* bias, float* out, int rows) {
  if (r % 64 == 0) return DenseZmmRows<4, 4>(in, cols, m, r, bias, out, rows);
  if (r % 32 == 0) return DenseZmmRows<8, 2>(in, cols, m, r, bias, out, rows);
  DenseZmmRows<16, 1>(in, cols, m, r, bias, out, rows);
}
// rows (the layer's outputs) is a multiple of 16.
TFMO_ISA(avx512) __attribute__((noinline)) inline void OuterAvx512(const float* g, int rows, const float* prev,
                                                                     int64_t ld, int cols, int n, float* dw) {
  if (cols % 64 == 0) return OuterZmm<4, 4>(g, rows, prev, ld, cols, n, dw);
  if (cols % 32 == 0) return OuterZmm<8, 2>(g, rows, prev, ld, cols, n, dw);
  OuterZmm<16, 1>(g, rows, prev, ld, cols, n, dw);
}

// The bfloat16 products with VDPBF16PS: 4 rows by kV * 16 outputs, one instruction per pair, row and 16 outputs.
TFMO_FN TFMO_ISA(avx512bf16) __m512 DotPairs(__m512 acc, uint32_t pair, __m512i pairs16) {
  return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32(static_cast<int>(pair)), (__m512bh)pairs16);
}
template <int kV>
TFMO_FN TFMO_ISA(avx512bf16) void DenseBf16Zmm(const uint16_t* in, int cols, const uint16_t* mp, int r,
                                               const float* bias, float* out, int rows) {
  for (int b0 = 0; b0 < rows; b0 += 4) {
    const uint16_t* a = in + static_cast<int64_t>(b0) * cols;
    for (int o0 = 0; o0 < r; o0 += 16 * kV) {
      __m512 acc[4][kV];
      for (int t = 0; t < 4; ++t)
        for (int v = 0; v < kV; ++v) acc[t][v] = bias ? _mm512_loadu_ps(bias + o0 + 16 * v) : _mm512_setzero_ps();
      for (int p = 0; p < cols / 2; ++p) {
        const uint16_t* w = mp + (static_cast<int64_t>(p) * r + o0) * 2;
        __m512i wv[kV];
        for (int v = 0; v < kV; ++v) wv[v] = _mm512_loadu_si512(w + 32 * v);
        for (int t = 0; t < 4; ++t) {
          const uint32_t x = LoadPair(a + static_cast<int64_t>(t) * cols + 2 * p);
          for (int v = 0; v < kV; ++v) acc[t][v] = DotPairs(acc[t][v], x, wv[v]);
        }
      }
      for (int t = 0; t < 4; ++t)
        for (int v = 0; v < kV; ++v) _mm512_storeu_ps(out + static_cast<int64_t>(b0 + t) * r + o0 + 16 * v, acc[t][v]);
    }
  }
}
template <int kV>
TFMO_FN TFMO_ISA(avx512bf16) void OuterBf16Zmm(const uint16_t* gp, int rows, const uint16_t* pp, int cols, int pairs,
                                               float* dw) {
  for (int o0 = 0; o0 < rows; o0 += 4) {
    for (int i0 = 0; i0 < cols; i0 += 16 * kV) {
      float* d = dw + static_cast<int64_t>(o0) * cols + i0;
      __m512 acc[4][kV];
      for (int t = 0; t < 4; ++t)
        for (int v = 0; v < kV; ++v) acc[t][v] = _mm512_loadu_ps(d + static_cast<int64_t>(t) * cols + 16 * v);
      for (int p = 0; p < pairs; ++p) {
        const uint16_t* q = pp + (static_cast<int64_t>(p) * cols + i0) * 2;
        __m512i qv[kV];
        for (int v = 0; v < kV; ++v) qv[v] = _mm512_loadu_si512(q + 32 * v);
        const uint16_t* gv = gp + (static_cast<int64_t>(p) * rows + o0) * 2;
        for (int t = 0; t < 4; ++t) {
          const uint32_t x = LoadPair(gv + 2 * t);
          for (int v = 0; v < kV; ++v) acc[t][v] = DotPairs(acc[t][v], x, qv[v]);
        }
      }
      for (int t = 0; t < 4; ++t)
        for (int v = 0; v < kV; ++v) _mm512_storeu_ps(d + static_cast<int64_t>(t) * cols + 16 * v, acc[t][v]);
    }
  }
}
TFMO_ISA(avx512bf16) __attribute__((noinline)) inline void DenseBf16Avx512Bf16(const uint16_t* in, int cols,
                                                                                 const uint16_t* mp, int r,
                                                                                 const float* bias, float* out,
                                                                                 int rows) {
  if (r % 64 == 0) return DenseBf16Zmm<4>(in, cols, mp, r, bias, out, rows);
  if (r % 32 == 0) return DenseBf16Zmm<2>(in, cols, mp, r, bias, out, rows);
  DenseBf16Zmm<1>(in, cols, mp, r, bias, out, rows);
}
TFMO_ISA(avx512bf16) __attribute__((noinline)) inline void OuterBf16Avx512Bf16(const uint16_t* gp, int rows,
                                                                                 const uint16_t* pp, int cols,
                                                                                 int pairs, float* dw) {
  if (cols % 64 == 0) return OuterBf16Zmm<4>(gp, rows, pp, cols, pairs, dw);
  if (cols % 32 == 0) return OuterBf16Zmm<2>(gp, rows, pp, cols, pairs, dw);
  OuterBf16Zmm<1>(gp, rows, pp, cols, pairs, dw);
}

// The bfloat16 products with AMX (the amx build): TDPBF16PS on 16-row tiles. C [16 rows][16 outputs] float32 +=
// A [16 rows][32 bfloat16] . B [16 pairs][16 outputs x 2], where B is exactly the pair layout of mp / pp (a row of B
// is one pair p for 16 consecutive outputs, 64 bytes). Its arithmetic is not VDPBF16PS's definition: Intel's SDM
// gives TDPBF16PS the same per-pair pseudocode, but on the Xeon it was measured on (cpuid family 6 model 167) one
// pair per instruction gives acc + RNE(a0 b0 + a1 b1), rounded once more, and with 16 pairs per instruction about
// half of the outputs (operands spread over 2^+-15) differ by an ulp or so from every sequential order tried: the
// partial sums round in an order Intel does not document. So the amx build's bfloat16 results are its own: the same
// bits for the same inputs on every run and thread count (the order of tiles and instructions is fixed), within
// float32 rounding of the definition per layer (tests/test_fused_mlp.py: AMX_BF16_TOL), not bitwise the other
// builds'. Its float32 products are avx512's.
//
// The tile configuration (LDTILECFG's 64-byte operand): palette 1, rows and bytes per row of tiles 0..7.
struct alignas(64) AmxConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  void Set(int t, int nrows, int bytes) { rows[t] = static_cast<uint8_t>(nrows), colsb[t] = static_cast<uint16_t>(bytes); }
};
// Tiles 0, 1: C (16 rows x 16 float32); 2: A (16 x 32 bfloat16); 3, 4: B (16 pairs x 32 bfloat16); 5, 6, 7: A and
// two B for a last chunk of 16 inputs (16 x 16 bfloat16, 8 pairs). Loaded for the life of the object (this thread),
// released after (TILERELEASE: the OS then need not save tile state).
class AmxTiles {
 public:
  TFMO_ISA(amx) AmxTiles() {
    AmxConfig c;
    c.Set(0, 16, 64), c.Set(1, 16, 64), c.Set(2, 16, 64), c.Set(3, 16, 64), c.Set(4, 16, 64);
    c.Set(5, 16, 32), c.Set(6, 8, 64), c.Set(7, 8, 64);
    _tile_loadconfig(&c);
  }
  TFMO_ISA(amx) ~AmxTiles() { _tile_release(); }
  AmxTiles(const AmxTiles&) = delete;
  AmxTiles& operator=(const AmxTiles&) = delete;
};

// C tiles 0 (and 1 when `two`) += A . B for A in tile KA from a (lda bytes per row) and B in tiles KB0, KB1 from b
// and b + 32 (16 outputs further; ldb bytes per row). A macro: GCC's tile intrinsics take the tile numbers as
// literals (they are pasted into the instruction's text).
#define TFMO_AMX_DOT(KA, KB0, KB1, a, lda, b, ldb, two) \
  do {                                                  \
    _tile_loadd(KA, a, lda);                            \
    _tile_loadd(KB0, b, ldb);                           \
    _tile_dpbf16ps(0, KA, KB0);                         \
    if (two) {                                          \
      _tile_loadd(KB1, (b) + 32, ldb);                  \
      _tile_dpbf16ps(1, KA, KB1);                       \
    }                                                   \
  } while (0)

// DenseBf16Body's product (in bfloat16 [rows][cols], cols a multiple of 16; mp in pairs) with TDPBF16PS: per 16 rows
// and 32 outputs, C = bias rows (a stride-0 load) or zero, then one instruction per 32 inputs (and one for a last
// 16) and 16 outputs. A last group of fewer than 16 rows goes through zero-padded copies.
TFMO_ISA(amx) __attribute__((noinline)) inline void DenseBf16Amx(const uint16_t* in, int cols, const uint16_t* mp,
                                                                   int r, const float* bias, float* out, int rows) {
  AmxTiles tiles;
  alignas(64) uint16_t a_pad[16 * 128];
  alignas(64) float c_pad[16 * 32];
  const int k32 = cols / 32 * 32;
  for (int b0 = 0; b0 < rows; b0 += 16) {
    const int nb = rows - b0 < 16 ? rows - b0 : 16;
    const uint16_t* a = in + static_cast<int64_t>(b0) * cols;
    if (nb < 16) {
      std::memset(a_pad, 0, sizeof(uint16_t) * 16 * cols);
      std::memcpy(a_pad, a, sizeof(uint16_t) * nb * cols);
      a = a_pad;
    }
    for (int o0 = 0; o0 < r; o0 += 32) {
      const bool two = o0 + 16 < r;
      if (bias) {
        _tile_loadd(0, bias + o0, 0);
        if (two) _tile_loadd(1, bias + o0 + 16, 0);
      } else {
        _tile_zero(0);
        _tile_zero(1);
      }
      for (int k0 = 0; k0 < k32; k0 += 32)
        TFMO_AMX_DOT(2, 3, 4, a + k0, cols * 2, mp + (static_cast<int64_t>(k0 / 2) * r + o0) * 2, r * 4, two);
      if (k32 < cols)
        TFMO_AMX_DOT(5, 6, 7, a + k32, cols * 2, mp + (static_cast<int64_t>(k32 / 2) * r + o0) * 2, r * 4, two);
      float* o = out + static_cast<int64_t>(b0) * r + o0;
      if (nb == 16) {
        _tile_stored(0, o, r * 4);
        if (two) _tile_stored(1, o + 16, r * 4);
      } else {
        _tile_stored(0, c_pad, 32 * 4);
        _tile_stored(1, c_pad + 16, 32 * 4);
        for (int t = 0; t < nb; ++t) std::memcpy(o + static_cast<int64_t>(t) * r, c_pad + 32 * t, (two ? 32 : 16) * 4);
      }
    }
  }
}

// OuterBf16Body's sum with TDPBF16PS: dw^T's tiles are C [16 outputs o][16 inputs i] (dw rows o), A [16 o][32 rows b]
// is g transposed (its pair words, gp's [pairs][rows] words turned to [rows][pairs], zero past `pairs` up to a multiple
// of 16 pairs) and B [16 pairs][16 i x 2] is pp as it is (rows past `pairs` copied as zeros).
TFMO_ISA(amx) __attribute__((noinline)) inline void OuterBf16Amx(const uint16_t* gp, int rows, const uint16_t* pp,
                                                                   int cols, int pairs, float* dw) {
  constexpr int kP = 16;  // pairs per instruction (64 bytes per row of A)
  const int pairs16 = (pairs + kP - 1) / kP * kP;
  alignas(64) uint32_t gt[128 * 64];  // [rows][pairs16] (rows <= 128, pairs16 <= 64)
  alignas(64) uint16_t b_pad[kP * 128 * 2];
  // gt[o][p0 .. p0 + 16) gathered from gp's column o (word stride `rows`), zeros past `pairs`.
  const __m512i step = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(rows));
  for (int p0 = 0; p0 < pairs16; p0 += kP) {
    const __mmask16 live = pairs - p0 >= kP ? 0xffff : static_cast<__mmask16>((1u << (pairs - p0)) - 1);
    const int* column = reinterpret_cast<const int*>(gp) + static_cast<int64_t>(p0) * rows;
    for (int o = 0; o < rows; ++o)
      _mm512_store_si512(gt + o * pairs16 + p0,
                         _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, step, column + o, 4));
  }
  AmxTiles tiles;
  for (int o0 = 0; o0 < rows; o0 += 16) {
    for (int i0 = 0; i0 < cols; i0 += 32) {
      const bool two = i0 + 16 < cols;
      float* d = dw + static_cast<int64_t>(o0) * cols + i0;
      _tile_loadd(0, d, cols * 4);
      if (two) _tile_loadd(1, d + 16, cols * 4);
      for (int p0 = 0; p0 < pairs16; p0 += kP) {
        const uint16_t* b = pp + (static_cast<int64_t>(p0) * cols + i0) * 2;
        int64_t ldb = static_cast<int64_t>(cols) * 4;
        if (p0 + kP > pairs) {  // the last chunk: pairs past `pairs` as zeros
          std::memset(b_pad, 0, sizeof(b_pad));
          for (int p = p0; p < pairs; ++p) std::memcpy(b_pad + (p - p0) * 64, b + (p - p0) * cols * 2, (two ? 64 : 32) * 2);
          b = b_pad;
          ldb = 128;
        }
        TFMO_AMX_DOT(2, 3, 4, gt + o0 * pairs16 + p0, pairs16 * 4, b, ldb, two);
      }
      _tile_stored(0, d, cols * 4);
      if (two) _tile_stored(1, d + 16, cols * 4);
    }
  }
}
#undef TFMO_AMX_DOT
#endif

// ---- bfloat16 rounding of a run of floats: ToBf16 per element, 16 or 8 lanes at a time ----------------------------
TFMO_FN void RoundBf16Body(const float* v, int64_t count, uint16_t* out) {
  for (int64_t k = 0; k < count; ++k) out[k] = ToBf16(v[k]);
}
__attribute__((noinline)) inline void RoundBf16Default(const float* v, int64_t count, uint16_t* out) {
  RoundBf16Body(v, count, out);
}
// Rows b < n of v (row stride ld, columns c < cols) as bfloat16 pairs of rows: (2p + e, c) at
// out[(p * cols + c) * 2 + e] for p < (n + 1) / 2, row n (when n is odd) read as zeros.
TFMO_FN void PairBlockRowsBody(const float* v, int64_t ld, int cols, int n, uint16_t* out) {
  for (int p = 0; p < (n + 1) / 2; ++p)
    for (int c = 0; c < cols; ++c)
      for (int e = 0; e < 2; ++e)
        out[(static_cast<int64_t>(p) * cols + c) * 2 + e] = 2 * p + e < n ? ToBf16(v[(2 * p + e) * ld + c]) : 0;
}
__attribute__((noinline)) inline void PairBlockRowsDefault(const float* v, int64_t ld, int cols, int n,
                                                           uint16_t* out) {
  PairBlockRowsBody(v, ld, cols, n, out);
}
// Pair p of PairBlockRows: rows a = 2p and b = 2p + 1 (null past n: zeros), written at o.
struct RowPair {
  const float* a;
  const float* b;
  uint16_t* o;
};
TFMO_FN RowPair PairOf(const float* v, int64_t ld, int cols, int n, uint16_t* out, int p) {
  const float* a = v + static_cast<int64_t>(2 * p) * ld;
  return {a, 2 * p + 1 < n ? a + ld : nullptr, out + static_cast<int64_t>(p) * cols * 2};
}
// Columns [c, cols) of a pair, as PairBlockRowsBody writes them.
TFMO_FN void PairTail(const RowPair& r, int c, int cols) {
  for (; c < cols; ++c) {
    r.o[2 * c] = ToBf16(r.a[c]);
    r.o[2 * c + 1] = r.b ? ToBf16(r.b[c]) : 0;
  }
}
#ifdef TFMO_ISA_X86_BUILDS
// ToBf16's three cases on the bits u of 16 (or 8) floats: zero / denormal -> the sign; NaN -> quiet; else rounded.
TFMO_FN TFMO_ISA(avx512) __m512i RoundBf16x16(const float* p) {
  const __mmask16 all = 0xffff;  // the zero-masking shifts: GCC's unmasked ones read an undefined vector
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000);
  const __m512i u = _mm512_loadu_si512(p), hi = _mm512_maskz_srli_epi32(all, u, 16);
  const __m512i rounded = _mm512_maskz_srli_epi32(
      all, _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(hi, _mm512_set1_epi32(1)))),
      16);
  const __mmask16 tiny = _mm512_testn_epi32_mask(u, exp_mask);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), exp_mask);
  const __m512i r = _mm512_mask_mov_epi32(rounded, tiny, _mm512_and_si512(hi, _mm512_set1_epi32(0x8000)));
  return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
}
TFMO_ISA(avx512) __attribute__((noinline)) inline void RoundBf16Avx512(const float* v, int64_t count, uint16_t* out) {
  int64_t k = 0;
  for (; k + 16 <= count; k += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), _mm512_maskz_cvtepi32_epi16(0xffff, RoundBf16x16(v + k)));
  RoundBf16Body(v + k, count - k, out + k);
}
// (u & abs) > exp_mask as a signed compare: both sides are below 2^31.
TFMO_FN TFMO_ISA(avx2) __m256i RoundBf16x8(const float* p) {
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
  const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), hi = _mm256_srli_epi32(u, 16);
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(hi, _mm256_set1_epi32(1)))),
      16);
  const __m256i tiny = _mm256_cmpeq_epi32(_mm256_and_si256(u, exp_mask), _mm256_setzero_si256());
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), exp_mask);
  const __m256i r = _mm256_blendv_epi8(rounded, _mm256_and_si256(hi, _mm256_set1_epi32(0x8000)), tiny);
  return _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
}
TFMO_ISA(avx2) __attribute__((noinline)) inline void RoundBf16Avx2(const float* v, int64_t count, uint16_t* out) {
  int64_t k = 0;
  for (; k + 16 <= count; k += 16) {
    // packus keeps 0..0xffff exactly; it interleaves the 128-bit halves, which the permute puts back in order.
    const __m256i packed = _mm256_packus_epi32(RoundBf16x8(v + k), RoundBf16x8(v + k + 8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), _mm256_permute4x64_epi64(packed, 0xd8));
  }
  RoundBf16Body(v + k, count - k, out + k);
}
// A pair's 16 (8) columns from c in one store: row 2p's element in the low half of each 32-bit lane, 2p + 1's high.
TFMO_FN TFMO_ISA(avx512) void PairColumns16(const RowPair& r, int c) {
  const __m512i high = r.b ? _mm512_maskz_slli_epi32(0xffff, RoundBf16x16(r.b + c), 16) : _mm512_setzero_si512();
  _mm512_storeu_si512(r.o + 2 * c, _mm512_or_si512(RoundBf16x16(r.a + c), high));
}
TFMO_FN TFMO_ISA(avx2) void PairColumns8(const RowPair& r, int c) {
  const __m256i high = r.b ? _mm256_slli_epi32(RoundBf16x8(r.b + c), 16) : _mm256_setzero_si256();
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(r.o + 2 * c), _mm256_or_si256(RoundBf16x8(r.a + c), high));
}
TFMO_ISA(avx512) __attribute__((noinline)) inline void PairBlockRowsAvx512(const float* v, int64_t ld, int cols, int n,
                                                                          uint16_t* out) {
  for (int p = 0; p < (n + 1) / 2; ++p) {
    const RowPair r = PairOf(v, ld, cols, n, out, p);
    int c = 0;
    for (; c + 16 <= cols; c += 16) PairColumns16(r, c);
    PairTail(r, c, cols);
  }
}
TFMO_ISA(avx2) __attribute__((noinline)) inline void PairBlockRowsAvx2(const float* v, int64_t ld, int cols, int n,
                                                                      uint16_t* out) {
  for (int p = 0; p < (n + 1) / 2; ++p) {
    const RowPair r = PairOf(v, ld, cols, n, out, p);
    int c = 0;
    for (; c + 8 <= cols; c += 8) PairColumns8(r, c);
    PairTail(r, c, cols);
  }
}
#endif

#ifdef TFMO_ISA_X86_BUILDS
// RoundBf16 and PairBlockRows with VCVTNEPS2BF16 (the avx512bf16 and amx builds): Intel's SDM defines it as ToBf16
// (round to nearest even; denormal inputs to zero with their sign; NaN quieted, bit 6); on the Xeon the amx build
// was measured on it gave ToBf16's bits for 4.3 million inputs (every class, ties and edges included), and the ISA
// test compares it with every other build's rounding.
TFMO_FN TFMO_ISA(avx512bf16) __m256i CvtBf16x16(const float* p) {
  return (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(p));
}
TFMO_ISA(avx512bf16) __attribute__((noinline)) inline void RoundBf16Cvt(const float* v, int64_t count, uint16_t* out) {
  int64_t k = 0;
  for (; k + 16 <= count; k += 16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), CvtBf16x16(v + k));
  RoundBf16Body(v + k, count - k, out + k);
}
TFMO_ISA(avx512bf16) __attribute__((noinline)) inline void PairBlockRowsCvt(const float* v, int64_t ld, int cols, int n,
                                                                           uint16_t* out) {
  for (int p = 0; p < (n + 1) / 2; ++p) {
    const RowPair r = PairOf(v, ld, cols, n, out, p);
    int c = 0;
    for (; c + 16 <= cols; c += 16) {
      const __mmask16 all = 0xffff;  // the zero-masking forms: GCC's unmasked ones read an undefined vector
      const __m512i low = _mm512_maskz_cvtepu16_epi32(all, CvtBf16x16(r.a + c));
      const __m512i high = r.b ? _mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu16_epi32(all, CvtBf16x16(r.b + c)), 16)
                               : _mm512_setzero_si512();
      _mm512_storeu_si512(r.o + 2 * c, _mm512_or_si512(low, high));
    }
    PairTail(r, c, cols);
  }
}
#endif

// out[k] = ToBf16(v[k]) for k < count, and PairBlockRows, by the selected build (the same bits on every build; not
// products, so not counted in g_isa_calls).
inline void RoundBf16(const float* v, int64_t count, uint16_t* out) {
#ifdef TFMO_ISA_X86_BUILDS
  const int isa = tfmo::fused_mlp::cpu::IsaSelection().selected;
  if (isa >= kIsaAvx512Bf16) return RoundBf16Cvt(v, count, out);
  if (isa >= kIsaAvx512) return RoundBf16Avx512(v, count, out);
  if (isa == kIsaAvx2) return RoundBf16Avx2(v, count, out);
#endif
  RoundBf16Default(v, count, out);
}

inline void PairBlockRows(const float* v, int64_t ld, int cols, int n, uint16_t* out) {
#ifdef TFMO_ISA_X86_BUILDS
  const int isa = tfmo::fused_mlp::cpu::IsaSelection().selected;
  if (isa >= kIsaAvx512Bf16) return PairBlockRowsCvt(v, ld, cols, n, out);
  if (isa >= kIsaAvx512) return PairBlockRowsAvx512(v, ld, cols, n, out);
  if (isa == kIsaAvx2) return PairBlockRowsAvx2(v, ld, cols, n, out);
#endif
  PairBlockRowsDefault(v, ld, cols, n, out);
}

// The selected build of each product (the call counted in g_isa_calls).
inline void Dense(const float* in, int cols, const float* m, int r, const float* bias, float* out, int rows) {
  const int isa = tfmo::CountIsaCall(tfmo::fused_mlp::cpu::IsaSelection(), g_isa_calls);
#ifdef TFMO_ISA_X86_BUILDS
  if (isa >= kIsaAvx512) return DenseAvx512(in, cols, m, r, bias, out, rows);
  if (isa == kIsaAvx2) return DenseAvx2(in, cols, m, r, bias, out, rows);
#endif
  (void)isa;
  DenseDefault(in, cols, m, r, bias, out, rows);
}
inline void AccumulateOuter(const float* g, int rows, const float* prev, int64_t ld, int cols, int n, float* dw) {
  const int isa = tfmo::CountIsaCall(tfmo::fused_mlp::cpu::IsaSelection(), g_isa_calls);
#ifdef TFMO_ISA_X86_BUILDS
  if (isa >= kIsaAvx512) return OuterAvx512(g, rows, prev, ld, cols, n, dw);
  if (isa == kIsaAvx2) return OuterAvx2(g, rows, prev, ld, cols, n, dw);
#endif
  (void)isa;
  OuterDefault(g, rows, prev, ld, cols, n, dw);
}
inline void DenseBf16(const uint16_t* in, int cols, const uint16_t* mp, int r, const float* bias, float* out,
                      int rows) {
  const int isa = tfmo::CountIsaCall(tfmo::fused_mlp::cpu::IsaSelection(), g_isa_calls);
#ifdef TFMO_ISA_X86_BUILDS
  if (isa == kIsaAmx) return DenseBf16Amx(in, cols, mp, r, bias, out, rows);
  if (isa == kIsaAvx512Bf16) return DenseBf16Avx512Bf16(in, cols, mp, r, bias, out, rows);
  if (isa >= kIsaAvx2) {
    BF16Flush flush;
    return DenseBf16Avx2(in, cols, mp, r, bias, out, rows);
  }
#endif
  (void)isa;
  DenseBf16Default(in, cols, mp, r, bias, out, rows);
}
inline void AccumulateOuterBf16(const uint16_t* gp, int rows, const uint16_t* pp, int cols, int pairs, float* dw) {
  const int isa = tfmo::CountIsaCall(tfmo::fused_mlp::cpu::IsaSelection(), g_isa_calls);
#ifdef TFMO_ISA_X86_BUILDS
  if (isa == kIsaAmx) return OuterBf16Amx(gp, rows, pp, cols, pairs, dw);
  if (isa == kIsaAvx512Bf16) return OuterBf16Avx512Bf16(gp, rows, pp, cols, pairs, dw);
  if (isa >= kIsaAvx2) {
    BF16Flush flush;
    return OuterBf16Avx2(gp, rows, pp, cols, pairs, dw);
  }
#endif
  (void)isa;
  OuterBf16Default(gp, rows, pp, cols, pairs, dw);
}

}  // namespace tfmo::fused_mlp::cpu
