// The ISA builds of the fused-MLP CPU kernels' products (csrc/cpu/fused_mlp_cpu.cc; the choice between them is at
// its end): Dense and AccumulateOuter, each a portable body (the baseline build) and, on x86-64 with GCC, an
// AVX2+FMA version written with intrinsics. Both compute every output element with the same operations in the same
// order: a chain of fused multiply-adds in order of the summed index, each rounded once (the baseline body through
// tfmo_fma: the FMA instructions of ARM, glibc's correctly rounded fmaf on x86-64, which is slow and runs only on
// CPUs without AVX2 and FMA; the AVX2 version with vfmadd). The register tiles differ, which changes no element's
// chain. So every build gives bitwise identical results.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/isa_choice.h"
#include "shared/device_compat.h"

#ifdef TFMO_ISA_X86_BUILDS
#include <immintrin.h>
#endif

namespace tfmo::fused_mlp::cpu {

// default and avx2, chosen at the end of fused_mlp_cpu.cc (TF_METAL_OPS_FUSED_MLP_ISA); a call is a product.
TFMO_ISA_FAMILY_BUILDS(2);

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

// The baseline build: the bodies above with 2-row tiles.
__attribute__((noinline)) inline void DenseDefault(const float* in, int cols, const float* m, int r,
                                                   const float* bias, float* out, int rows) {
  DenseBody<2>(in, cols, m, r, bias, out, rows);
}
__attribute__((noinline)) inline void OuterDefault(const float* g, int rows, const float* prev, int64_t ld, int cols,
                                                   int n, float* dw) {
  OuterBody<2>(g, rows, prev, ld, cols, n, dw);
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
#endif

// The selected build of DenseBody / OuterBody (the call counted in g_isa_calls).
inline void Dense(const float* in, int cols, const float* m, int r, const float* bias, float* out, int rows) {
  const int isa = tfmo::CountIsaCall(tfmo::fused_mlp::cpu::IsaSelection(), g_isa_calls);
#ifdef TFMO_ISA_X86_BUILDS
  if (isa == kIsaAvx2) return DenseAvx2(in, cols, m, r, bias, out, rows);
#endif
  (void)isa;
  DenseDefault(in, cols, m, r, bias, out, rows);
}
inline void AccumulateOuter(const float* g, int rows, const float* prev, int64_t ld, int cols, int n, float* dw) {
  const int isa = tfmo::CountIsaCall(tfmo::fused_mlp::cpu::IsaSelection(), g_isa_calls);
#ifdef TFMO_ISA_X86_BUILDS
  if (isa == kIsaAvx2) return OuterAvx2(g, rows, prev, ld, cols, n, dw);
#endif
  (void)isa;
  OuterDefault(g, rows, prev, ld, cols, n, dw);
}

}  // namespace tfmo::fused_mlp::cpu
