// The ISA builds of the hash-grid CPU kernels (csrc/cpu/hash_grid_cpu.cc; the choice between them is at its end):
// the builds, HashGridBuild (a hot loop's always-inline body compiled once per build) and the AVX2 tile helpers the
// avx2 build runs. Per point they compute what the scalar loops of hash_grid_cpu.cc compute (csrc/shared/
// hash_grid_math.h), in the same order.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "common/isa_choice.h"
#include "shared/hash_grid_math.h"

// Hot loops are always-inline bodies BODY<D, F, T, kAvx2> compiled once per build (HashGridBuild), chosen at run
// time: default (baseline ISA) and, on x86-64 with GCC, avx2 (common/isa_choice.h; kAvx2 selects the intrinsic fast
// paths). Same source and same float operation order, so the two give bitwise identical results: the one fused
// multiply-add of the math (pos = fma(scale, x, 0.5), as tcnn) is explicit (tfmo_fma: the vfmadd instruction in the
// AVX2 build, glibc's correctly rounded fmaf in the baseline: the same bits), and the compiler fuses nothing else
// (setup.py builds with -ffp-contract=off; GCC's default in GNU mode would contract a*b + c only in the FMA-capable
// build). A lambda called from a body is TFMO_FN_LAMBDA (always inlined), so it is compiled for that body's build.
// The AVX2 helpers below work on a tile of points (called per tile of kTile points, so not inlined: GCC inlines a
// target-specific function only into callers of the same target), used under `if constexpr (kAvx2)`.
#ifdef TFMO_ISA_X86_BUILDS
#include <immintrin.h>
#endif

namespace tfmo::hash_grid::cpu {

// default and avx2, chosen at the end of hash_grid_cpu.cc (TF_METAL_OPS_HASH_GRID_ISA, or TF_METAL_OPS_NO_AVX2 set
// to anything for default); a call is a hot loop over a range of points.
TFMO_ISA_FAMILY_BUILDS(2);

// Runs body(std::integral_constant<bool, kAvx2>) compiled for the selected build, counting the call: body is a
// generic lambda marked TFMO_FN_LAMBDA that calls a hot loop's always-inline body with that kAvx2.
template <class Body>
void HashGridBuild(const Body& body) {
  RunIsaBuild<kIsaCount>(CountIsaCall(IsaSelection(), g_isa_calls), [&](auto isa) TFMO_FN_LAMBDA {
    body(std::integral_constant<bool, decltype(isa)::value == kIsaAvx2>{});
  });
}

constexpr int kPrefetch = 16;  // points ahead: random table rows start their cache misses this early

#ifdef TFMO_ISA_X86_BUILDS
// hg_coord for xs[0, count), 8 points per instruction: the same float operations in the same order (clamp with
// NaN -> 0, one fused multiply-add, truncation, weight and derivative), so the same bits as the scalar loop.
template <int kInterp>
TFMO_ISA(avx2) __attribute__((noinline)) void CoordsAvx2(const float* xs, float scale, int count, uint* g, float* w,
                                                   float* dw) {
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f);
  const __m256 vs = _mm256_set1_ps(scale);
  int i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 x = _mm256_loadu_ps(xs + i);
    const __m256 ge0 = _mm256_cmp_ps(x, zero, _CMP_GE_OQ), le1 = _mm256_cmp_ps(x, one, _CMP_LE_OQ);
    const __m256 xc = _mm256_and_ps(ge0, _mm256_blendv_ps(one, x, le1));  // x >= 0 ? (x <= 1 ? x : 1) : 0
    const __m256 pos = _mm256_fmadd_ps(vs, xc, half);
    const __m256i gi = _mm256_cvttps_epi32(pos);  // pos in [0.5, 2^24 + 0.5]: truncation = floor, fits int32
    const __m256 t = _mm256_sub_ps(pos, _mm256_cvtepi32_ps(gi));
    __m256 wt = t, dwt;
    if (kInterp == HG_INTERP_SMOOTHSTEP) {
      const __m256 two_t = _mm256_mul_ps(_mm256_set1_ps(2.0f), t);
      wt = _mm256_mul_ps(_mm256_mul_ps(t, t), _mm256_sub_ps(_mm256_set1_ps(3.0f), two_t));
      dwt = _mm256_mul_ps(vs, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(6.0f), t), _mm256_sub_ps(one, t)));
    } else if (kInterp == HG_INTERP_LINEAR) {
      dwt = _mm256_mul_ps(vs, one);
    } else {
      dwt = _mm256_mul_ps(vs, zero);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(g + i), gi);
    _mm256_storeu_ps(w + i, wt);
    _mm256_storeu_ps(dw + i, _mm256_and_ps(_mm256_and_ps(ge0, le1), dwt));  // inside ? dwt : 0
  }
  for (; i < count; ++i) hg_coord(xs[i], scale, kInterp, &g[i], &w[i], &dw[i]);
}
#endif

#ifdef TFMO_ISA_X86_BUILDS
// Forward of the first count & ~7 points of a tile with F = 2 and all 2^D corners, 8 points per instruction
// (points in lanes) into res [count][2] float32; returns how many points it did. Per point the same operations in
// the same order as the scalar loop (acc_f = +0, then acc_f += w_c * v_cf for c = 0, 1, ...), so the same bits.
// A corner's rows are gathered with both features at once (float32: 8-byte rows; float16: 4-byte rows converted
// with F16C, exact like HalfToFloat) in the point order 0,1,4,5 | 2,3,6,7, which the in-lane shuffles that split
// the features undo.
template <int D, typename T, class Tile>
TFMO_ISA(avx2) __attribute__((noinline)) int EncodeTileF2Avx2(const T* table, const Tile& tc, int count, float* res) {
  constexpr int nc = 1 << D;
  const int count8 = count & ~7;
  for (int i = 0; i < count8; i += 8) {
    const int pe = std::min(count, i + kPrefetch + 8);  // random rows: start their misses a few points ahead
    for (int c = 0; c < nc; ++c)
      for (int j = i + kPrefetch; j < pe; ++j) __builtin_prefetch(table + (int64_t)tc.row[c][j] * 2, 0);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int c = 0; c < nc; ++c) {
      const __m256i idx =
          _mm256_permute4x64_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tc.row[c] + i)), 0xD8);
      __m256 lo, hi;  // corner c of points 0,1 | 4,5 and 2,3 | 6,7, features interleaved
      if constexpr (std::is_same<T, float>::value) {
        const long long* tb = reinterpret_cast<const long long*>(table);
        lo = _mm256_castsi256_ps(_mm256_i32gather_epi64(tb, _mm256_castsi256_si128(idx), 8));
        hi = _mm256_castsi256_ps(_mm256_i32gather_epi64(tb, _mm256_extracti128_si256(idx, 1), 8));
      } else {
        const __m256i h = _mm256_i32gather_epi32(reinterpret_cast<const int*>(table), idx, 4);
        lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
        hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
      }
      const __m256 w = _mm256_loadu_ps(tc.wt[c] + i);
      a0 = _mm256_add_ps(a0, _mm256_mul_ps(w, _mm256_shuffle_ps(lo, hi, 0x88)));  // points 0..7, feature 0
      a1 = _mm256_add_ps(a1, _mm256_mul_ps(w, _mm256_shuffle_ps(lo, hi, 0xDD)));  // feature 1
    }
    const __m256 l = _mm256_unpacklo_ps(a0, a1), h = _mm256_unpackhi_ps(a0, a1);  // points 0,1 | 4,5; 2,3 | 6,7
    _mm256_storeu_ps(res + 2 * i, _mm256_permute2f128_ps(l, h, 0x20));
    _mm256_storeu_ps(res + 2 * i + 8, _mm256_permute2f128_ps(l, h, 0x31));
  }
  return count8;
}
#endif

}  // namespace tfmo::hash_grid::cpu
