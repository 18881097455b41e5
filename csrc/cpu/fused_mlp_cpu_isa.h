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

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TFMO_FM_HAVE_AVX2 1
#define TFMO_FM_AVX2 __attribute__((target("avx2,fma"), noinline))
#include <immintrin.h>
#endif

namespace tfmo::fused_mlp::cpu {

// The builds and the choice between them (defined at the end of fused_mlp_cpu.cc; one choice per process):
// TF_METAL_OPS_FUSED_MLP_ISA = avx2 | default | auto (automatically AVX2 when the CPU has AVX2 and FMA).
enum Isa : int { kIsaDefault = 0, kIsaAvx2 = 1, kIsaCount = 2 };

const IsaChoice& IsaSelection();

// How many product calls ran each build, for tfmo_fused_mlp_cpu_paths (a test can prove which build ran).
extern std::atomic<long long> g_isa_calls[kIsaCount];

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
#ifdef TFMO_FM_HAVE_AVX2
// DenseBody and OuterBody with intrinsics (the compiler keeps neither's tile in registers by itself): 4 rows by 16
// outputs in eight 8-lane accumulators, each lane the same fma chain as DenseBody's / OuterBody's element.
#define TFMO_FM_ROW(T)                                                                          \
  {                                                                                             \
    const __m256 v = _mm256_broadcast_ss(a + (T) * cols + i);                                   \
    acc##T##0 = _mm256_fmadd_ps(v, w0, acc##T##0);                                              \
    acc##T##1 = _mm256_fmadd_ps(v, w1, acc##T##1);                                              \
  }
TFMO_FM_AVX2 inline void DenseAvx2(const float* in, int cols, const float* m, int r, const float* bias, float* out,
                                   int rows) {
  for (int b0 = 0; b0 < rows; b0 += 4) {
    const float* a = in + static_cast<int64_t>(b0) * cols;
    for (int o0 = 0; o0 < r; o0 += kColTile) {
      const __m256 b0v = bias ? _mm256_loadu_ps(bias + o0) : _mm256_setzero_ps();
      const __m256 b1v = bias ? _mm256_loadu_ps(bias + o0 + 8) : _mm256_setzero_ps();
      __m256 acc00 = b0v, acc01 = b1v, acc10 = b0v, acc11 = b1v, acc20 = b0v, acc21 = b1v, acc30 = b0v, acc31 = b1v;
      for (int i = 0; i < cols; ++i) {
        const float* w = m + static_cast<int64_t>(i) * r + o0;
        const __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8);
        TFMO_FM_ROW(0) TFMO_FM_ROW(1) TFMO_FM_ROW(2) TFMO_FM_ROW(3)
      }
      float* o = out + static_cast<int64_t>(b0) * r + o0;
      _mm256_storeu_ps(o, acc00);
      _mm256_storeu_ps(o + 8, acc01);
      _mm256_storeu_ps(o + r, acc10);
      _mm256_storeu_ps(o + r + 8, acc11);
      _mm256_storeu_ps(o + 2 * r, acc20);
      _mm256_storeu_ps(o + 2 * r + 8, acc21);
      _mm256_storeu_ps(o + 3 * r, acc30);
      _mm256_storeu_ps(o + 3 * r + 8, acc31);
    }
  }
}
#undef TFMO_FM_ROW

#define TFMO_FM_ROW(T)                                                                          \
  {                                                                                             \
    const __m256 v = _mm256_broadcast_ss(gb + (T));                                             \
    acc##T##0 = _mm256_fmadd_ps(v, p0, acc##T##0);                                              \
    acc##T##1 = _mm256_fmadd_ps(v, p1, acc##T##1);                                              \
  }
TFMO_FM_AVX2 inline void OuterAvx2(const float* g, int rows, const float* prev, int64_t ld, int cols, int n,
                                   float* dw) {
  for (int o0 = 0; o0 < rows; o0 += 4) {
    for (int i0 = 0; i0 < cols; i0 += kColTile) {
      float* d = dw + static_cast<int64_t>(o0) * cols + i0;
      __m256 acc00 = _mm256_loadu_ps(d), acc01 = _mm256_loadu_ps(d + 8);
      __m256 acc10 = _mm256_loadu_ps(d + cols), acc11 = _mm256_loadu_ps(d + cols + 8);
      __m256 acc20 = _mm256_loadu_ps(d + 2 * cols), acc21 = _mm256_loadu_ps(d + 2 * cols + 8);
      __m256 acc30 = _mm256_loadu_ps(d + 3 * cols), acc31 = _mm256_loadu_ps(d + 3 * cols + 8);
      for (int b = 0; b < n; ++b) {
        const float* p = prev + b * ld + i0;
        const float* gb = g + static_cast<int64_t>(b) * rows + o0;
        const __m256 p0 = _mm256_loadu_ps(p), p1 = _mm256_loadu_ps(p + 8);
        TFMO_FM_ROW(0) TFMO_FM_ROW(1) TFMO_FM_ROW(2) TFMO_FM_ROW(3)
      }
      _mm256_storeu_ps(d, acc00);
      _mm256_storeu_ps(d + 8, acc01);
      _mm256_storeu_ps(d + cols, acc10);
      _mm256_storeu_ps(d + cols + 8, acc11);
      _mm256_storeu_ps(d + 2 * cols, acc20);
      _mm256_storeu_ps(d + 2 * cols + 8, acc21);
      _mm256_storeu_ps(d + 3 * cols, acc30);
      _mm256_storeu_ps(d + 3 * cols + 8, acc31);
    }
  }
}
#undef TFMO_FM_ROW
#endif

// The selected build of DenseBody / OuterBody (the call counted in g_isa_calls).
inline void Dense(const float* in, int cols, const float* m, int r, const float* bias, float* out, int rows) {
  const int isa = tfmo::CountIsaCall(tfmo::fused_mlp::cpu::IsaSelection(), g_isa_calls);
#ifdef TFMO_FM_HAVE_AVX2
  if (isa == kIsaAvx2) return DenseAvx2(in, cols, m, r, bias, out, rows);
#endif
  (void)isa;
  DenseDefault(in, cols, m, r, bias, out, rows);
}
inline void AccumulateOuter(const float* g, int rows, const float* prev, int64_t ld, int cols, int n, float* dw) {
  const int isa = tfmo::CountIsaCall(tfmo::fused_mlp::cpu::IsaSelection(), g_isa_calls);
#ifdef TFMO_FM_HAVE_AVX2
  if (isa == kIsaAvx2) return OuterAvx2(g, rows, prev, ld, cols, n, dw);
#endif
  (void)isa;
  OuterDefault(g, rows, prev, ld, cols, n, dw);
}

}  // namespace tfmo::fused_mlp::cpu
