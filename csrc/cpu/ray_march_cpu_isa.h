// The ISA builds of the RayMarch CPU kernel (csrc/cpu/ray_march_cpu.cc; the choice between them is at its end): the
// scalar march there (default) and here the AVX2 march of one chunk of rays (avx2), 8 rays per vector.
// Each lane runs the steps of csrc/shared/ray_march_math.h exactly: every block below names the shared function it
// mirrors and does the same float32 operations in the same order (separate mul/add, no FMA: the library is built
// with -ffp-contract=off). _mm256_min_ps(a, b) / _mm256_max_ps(a, b) are
// exactly `a < b ? a : b` / `a > b ? a : b` (the second operand on NaN), i.e. rm_min / rm_max with the same
// operand order. tests/test_ray_march_isa.py runs both paths and requires bitwise equal outputs.
//
// It marches one cascade (RmParams.K = 1, the AVX2 lanes use cascade 0's box and cells); cascaded marches take the
// scalar path. Only the loop over candidates is vectorised: rm_begin stays scalar per ray, and a lane whose ray has
// finished takes the next ray of the chunk. Samples are staged in emission order tagged with their ray's position in
// the chunk and placed in ray order at the end (prefix sum of the chunk's counts), so the chunk's samples come out
// as in the scalar path. Built for x86-64 GCC only (TFMO_ISA_X86_BUILDS); chosen at run time (IsaSelection).
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "common/isa_choice.h"
#include "shared/ray_march_math.h"

#ifdef TFMO_ISA_X86_BUILDS
#include <immintrin.h>
#endif

namespace tfmo::ray_march::cpu {

// default and avx2, chosen at the end of ray_march_cpu.cc (TF_METAL_OPS_RAY_MARCH_ISA); a call is a chunk march.
TFMO_ISA_FAMILY_BUILDS(2);

// What the march looks up per candidate cell: the bitfield and the mip levels above it (rm_empty_level), and
// optionally `levels`, one byte per grid cell holding the answer of both lookups at once (kOccupiedCell or the
// cell's rm_empty_level).
constexpr unsigned char kOccupiedCell = 0xFF;
struct Occupancy {
  const unsigned char* bits;
  const unsigned char* mip;
  const unsigned char* levels;  // null: look up bits and mip
};

// The level of candidate cell (c, cell) of cascade k: kOccupiedCell or rm_empty_level (the scalar lookup of both
// paths; `levels` holds the K cascades' tables one after the other, G^3 bytes each).
inline uint CellLevel(const RmParams& p, const Occupancy& occ, const RmRay& s) {
  return occ.levels != nullptr ? occ.levels[size_t{s.k} * p.G * p.G * p.G + s.cell]
         : rm_occupied(p, occ.bits, &s) ? kOccupiedCell
                                        : rm_empty_level(p, occ.mip, &s);
}

#ifdef TFMO_ISA_X86_BUILDS

// RmParams broadcast to every lane.
struct RmConstsV {
  __m256 lo[3], cs[3], inv_cs[3], step_size, cone_angle, max_step, half, zero, g_max;
  __m256i G, max_samples, max_skips, sign, ff;
};

// a < b as unsigned 32-bit integers, per lane (all ones / zero).
TFMO_FN TFMO_ISA(avx2) __m256i RmULtV(__m256i a, __m256i b, __m256i sign) {
  return _mm256_cmpgt_epi32(_mm256_xor_si256(b, sign), _mm256_xor_si256(a, sign));
}

// rm_dt: rm_min(rm_max(t * cone_angle, step_size), max_step).
TFMO_FN TFMO_ISA(avx2) __m256 RmDtV(const RmConstsV& k, __m256 t) {
  return _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(t, k.cone_angle), k.step_size), k.max_step);
}

// rm_axis_cell: uint(rm_min(rm_max((x - lo) * inv_cs, 0), float(G - 1))) (the value is in [0, G-1]: truncation
// to int32 is the uint conversion).
TFMO_FN TFMO_ISA(avx2) __m256i RmAxisCellV(const RmConstsV& k, __m256 x, int i) {
  return _mm256_cvttps_epi32(
      _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_sub_ps(x, k.lo[i]), k.inv_cs[i]), k.zero), k.g_max));
}

// Replaces lane `lane` of v by x.
TFMO_FN TFMO_ISA(avx2) __m256 RmPutV(__m256 v, __m256 lane_mask, float x) {
  return _mm256_blendv_ps(v, _mm256_set1_ps(x), lane_mask);
}

// base[idx] per lane (bytes, zero-extended).
TFMO_FN TFMO_ISA(avx2) __m256i RmLoadBytesV(const unsigned char* base, __m256i idx) {
  alignas(32) int32_t a[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(a), idx);
  return _mm256_setr_epi32(base[a[0]], base[a[1]], base[a[2]], base[a[3]], base[a[4]], base[a[5]], base[a[6]],
                           base[a[7]]);
}

// rm_bit(byte_value, cell) per lane: all ones where set.
TFMO_FN TFMO_ISA(avx2) __m256i RmBitV(__m256i byte_value, __m256i cell) {
  const __m256i one = _mm256_set1_epi32(1);
  return _mm256_cmpeq_epi32(
      _mm256_and_si256(_mm256_srlv_epi32(byte_value, _mm256_and_si256(cell, _mm256_set1_epi32(7))), one), one);
}

// For each 8-bit lane mask, the indices of its set lanes first (in lane order): compresses a vector's selected
// lanes with one permute.
struct RmCompressTable {
  int32_t idx[256][8];
  constexpr RmCompressTable() : idx() {
    for (int m = 0; m < 256; ++m) {
      int n = 0;
      for (int lane = 0; lane < 8; ++lane)
        if (m & (1 << lane)) idx[m][n++] = lane;
      while (n < 8) idx[m][n++] = 0;
    }
  }
};
inline constexpr RmCompressTable kRmCompress{};

// Staged samples of a chunk, in emission order, each with its ray's position in the chunk.
struct RmStage {
  std::vector<float> t0, t1;
  std::vector<int32_t> pos;
};

// 8 lanes, each marching one ray (its RmRay state and sample count k), plus what the march of a chunk shares.
struct RmLanesV {
  __m256 o[3], d[3], inv_d[3], t, t_hi;
  __m256i k, skips, pos;  // pos: the lane's ray is r0 + pos
  unsigned live;          // lanes with a ray
};
struct RmChunkV {
  const RmParams* p;
  const float *o, *d, *near_t, *far_t;
  int64_t r0;
  int n, next;  // rays of the chunk; the next one to start
  const Occupancy* occ;
  bool store;
  int64_t* counts;
  RmStage* st;
  size_t n_st;
};

// Free lanes of g take the next rays of the chunk (rm_begin, scalar; rays without samples count 0).
TFMO_FN TFMO_ISA(avx2) void RmRefillV(RmChunkV& ch, RmLanesV& g) {
  const RmParams& p = *ch.p;
  for (int lane = 0; lane < 8 && ch.next < ch.n; ++lane) {
    if (g.live & (1u << lane)) continue;
    while (ch.next < ch.n) {
      const int i = ch.next++;
      const int64_t r = ch.r0 + i;
      const float *o = ch.o + 3 * r, *d = ch.d + 3 * r;
      RmRay s;
      if (!rm_begin(p, o[0], o[1], o[2], d[0], d[1], d[2], ch.near_t[r], ch.far_t[r], static_cast<uint>(r), &s)) {
        ch.counts[i] = 0;
        continue;
      }
      const __m256i lm = _mm256_cmpeq_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(lane));
      const __m256 lmf = _mm256_castsi256_ps(lm);
      for (int a = 0; a < 3; ++a) {
        g.o[a] = RmPutV(g.o[a], lmf, s.o[a]);
        g.d[a] = RmPutV(g.d[a], lmf, s.d[a]);
        g.inv_d[a] = RmPutV(g.inv_d[a], lmf, s.inv_d[a]);
      }
      g.t = RmPutV(g.t, lmf, s.t);
      g.t_hi = RmPutV(g.t_hi, lmf, s.t_hi);
      g.k = _mm256_andnot_si256(lm, g.k);
      g.skips = _mm256_andnot_si256(lm, g.skips);
      g.pos = _mm256_blendv_epi8(g.pos, _mm256_set1_epi32(i), lm);
      g.live |= 1u << lane;
      break;
    }
  }
}

// CellLevel without the level table: kOccupiedCell where rm_bit(bits[cell >> 3], cell), else rm_empty_level: the
// levels m = 0, 1, .. are tried for all searching lanes at once; a lane stops at the first level l = m + 1 whose
// block is occupied (level m), or at p.mip_levels.
TFMO_FN TFMO_ISA(avx2) __m256i RmBitsMipLevelV(const RmConstsV& K, const RmChunkV& ch, const __m256i c[3], __m256i cell,
                                  __m256i go) {
  const RmParams& p = *ch.p;
  const __m256i occupied = RmBitV(RmLoadBytesV(ch.occ->bits, _mm256_srli_epi32(cell, 3)), cell);
  __m256i searching = _mm256_andnot_si256(occupied, go), level = _mm256_setzero_si256();
  for (uint m = 0; m < p.mip_levels && !_mm256_testz_si256(searching, searching); ++m) {
    const uint l = m + 1;
    const __m128i sh = _mm_cvtsi32_si128(static_cast<int>(l));
    const __m256i g = _mm256_set1_epi32(static_cast<int>(rm_mip_res(p.G, l)));
    const __m256i cm = _mm256_add_epi32(
        _mm256_srl_epi32(c[0], sh),
        _mm256_mullo_epi32(g, _mm256_add_epi32(_mm256_srl_epi32(c[1], sh),
                                               _mm256_mullo_epi32(g, _mm256_srl_epi32(c[2], sh)))));
    const __m256i set = RmBitV(RmLoadBytesV(ch.occ->mip + p.mip_offset[m], _mm256_srli_epi32(cm, 3)), cm);
    searching = _mm256_andnot_si256(set, searching);
    level = _mm256_blendv_epi8(level, _mm256_set1_epi32(static_cast<int>(l)), searching);
  }
  return _mm256_blendv_epi8(level, K.ff, occupied);
}

// One candidate of every live lane of g.
TFMO_FN TFMO_ISA(avx2) void RmStepV(const RmConstsV& K, RmChunkV& ch, RmLanesV& g) {
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i live_v =
      _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(g.live)), lane_bit), lane_bit);
  const __m256 t = g.t, t_hi = g.t_hi;

  // rm_candidate (and the caller's k < max_samples): the lane goes on iff t < t_hi, skips < max_skips,
  // k < max_samples and t1 = rm_min(t + rm_dt(t), t_hi) > t.
  __m256i go = _mm256_and_si256(live_v, _mm256_castps_si256(_mm256_cmp_ps(t, t_hi, _CMP_LT_OQ)));
  go = _mm256_and_si256(go, RmULtV(g.skips, K.max_skips, K.sign));
  go = _mm256_and_si256(go, RmULtV(g.k, K.max_samples, K.sign));
  const __m256 t1 = _mm256_min_ps(_mm256_add_ps(t, RmDtV(K, t)), t_hi);
  go = _mm256_and_si256(go, _mm256_castps_si256(_mm256_cmp_ps(t1, t, _CMP_GT_OQ)));
  const unsigned go_bits = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(go)));
  if (const unsigned done = g.live & ~go_bits) {  // finished rays: their counts; the lanes are free
    alignas(32) int32_t a_k[8], a_pos[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(a_k), g.k);
    _mm256_store_si256(reinterpret_cast<__m256i*>(a_pos), g.pos);
    for (unsigned b = done; b != 0; b &= b - 1) {
      const int lane = __builtin_ctz(b);
      ch.counts[a_pos[lane]] = a_k[lane];
    }
    g.live = go_bits;
    if (go_bits == 0) return;
  }
  const __m256 tm = _mm256_mul_ps(K.half, _mm256_add_ps(t, t1));
  __m256i c[3];
  for (int a = 0; a < 3; ++a) c[a] = RmAxisCellV(K, _mm256_add_ps(g.o[a], _mm256_mul_ps(tm, g.d[a])), a);
  const __m256i cell =
      _mm256_add_epi32(c[0], _mm256_mullo_epi32(K.G, _mm256_add_epi32(c[1], _mm256_mullo_epi32(K.G, c[2]))));

  // CellLevel: a byte of `levels` per lane, else rm_bit on the bitfield and rm_empty_level on the mip, per lane
  // (8 scalar byte loads each time: faster than a gather here, and the buffers have no padding for 32-bit
  // gathers). Lanes that do not go on look up their stale cell (in range: the cells are clamped).
  const __m256i level =
      ch.occ->levels != nullptr ? RmLoadBytesV(ch.occ->levels, cell) : RmBitsMipLevelV(K, ch, c, cell, go);
  const __m256i occupied = _mm256_cmpeq_epi32(level, K.ff);
  const __m256i emit = _mm256_and_si256(go, occupied);
  const __m256i empty = _mm256_andnot_si256(occupied, go);

  // The caller's store of emitted samples [t, t1]: the emitting lanes compressed to the front, stored to the stage.
  if (ch.store) {
    const unsigned emit_bits = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(emit)));
    RmStage& st = *ch.st;
    if (st.t0.size() < ch.n_st + 8) {
      const size_t cap = 2 * ch.n_st + 1024;
      st.t0.resize(cap);
      st.t1.resize(cap);
      st.pos.resize(cap);
    }
    const __m256i perm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kRmCompress.idx[emit_bits]));
    _mm256_storeu_ps(st.t0.data() + ch.n_st, _mm256_permutevar8x32_ps(t, perm));
    _mm256_storeu_ps(st.t1.data() + ch.n_st, _mm256_permutevar8x32_ps(t1, perm));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(st.pos.data() + ch.n_st), _mm256_permutevar8x32_epi32(g.pos, perm));
    ch.n_st += static_cast<size_t>(__builtin_popcount(emit_bits));
  }

  // rm_skip_to with m = level: t_next = rm_min((face - o) * inv_d, t_next) over the axes with d != 0, face =
  // lo + float(rm_min_u(((c >> m) + (d > 0)) << m, G)) * cs; then t_next > t ? t_next : t1. (Lanes with
  // level = kOccupiedCell shift by >= 32, giving 0; their result is not used.)
  __m256 t_next = t_hi;
  for (int a = 0; a < 3; ++a) {
    const __m256i up = _mm256_castps_si256(_mm256_cmp_ps(g.d[a], K.zero, _CMP_GT_OQ));  // -1 where d > 0
    const __m256i kf =
        _mm256_min_epu32(_mm256_sllv_epi32(_mm256_sub_epi32(_mm256_srlv_epi32(c[a], level), up), level), K.G);
    const __m256 face = _mm256_add_ps(K.lo[a], _mm256_mul_ps(_mm256_cvtepi32_ps(kf), K.cs[a]));
    const __m256 cand = _mm256_min_ps(_mm256_mul_ps(_mm256_sub_ps(face, g.o[a]), g.inv_d[a]), t_next);
    t_next = _mm256_blendv_ps(t_next, cand, _mm256_cmp_ps(g.d[a], K.zero, _CMP_NEQ_OQ));
  }
  const __m256 skip_to = _mm256_blendv_ps(t1, t_next, _mm256_cmp_ps(t_next, t, _CMP_GT_OQ));

  // rm_accept (t = t1, k += 1) on emitted lanes, rm_skip (t = skip_to, skips += 1) on empty ones.
  g.t = _mm256_blendv_ps(_mm256_blendv_ps(t, t1, _mm256_castsi256_ps(emit)), skip_to, _mm256_castsi256_ps(empty));
  g.k = _mm256_sub_epi32(g.k, emit);
  g.skips = _mm256_sub_epi32(g.skips, empty);
}

// Groups of 8 lanes stepped alternately (their dependency chains overlap in the CPU; 3 or 4 measured no faster).
constexpr int kRmGroups = 2;

// Marches rays [r0, r0 + n) of a chunk: counts[i] = samples of ray r0 + i; when store, the samples are appended
// in ray order to *t0_out / *t1_out (st: the caller's stage buffers).
TFMO_ISA(avx2) __attribute__((noinline)) inline void MarchChunkAvx2(
    const RmParams& p, const float* o, const float* d, const float* near_t, const float* far_t, int64_t r0,
    int n, const Occupancy& occ, bool store, int64_t* counts, std::vector<float>* t0_out,
    std::vector<float>* t1_out, RmStage* st) {
  RmConstsV K;
  const float lo[3] = {p.lo_x, p.lo_y, p.lo_z}, cs[3] = {p.cs_x, p.cs_y, p.cs_z},
              inv_cs[3] = {p.inv_cs_x, p.inv_cs_y, p.inv_cs_z};
  for (int a = 0; a < 3; ++a) {
    K.lo[a] = _mm256_set1_ps(lo[a]);
    K.cs[a] = _mm256_set1_ps(cs[a]);
    K.inv_cs[a] = _mm256_set1_ps(inv_cs[a]);
  }
  K.step_size = _mm256_set1_ps(p.step_size);
  K.cone_angle = _mm256_set1_ps(p.cone_angle);
  K.max_step = _mm256_set1_ps(p.max_step);
  K.half = _mm256_set1_ps(0.5f);
  K.zero = _mm256_setzero_ps();
  K.g_max = _mm256_set1_ps(float(p.G - 1));
  K.G = _mm256_set1_epi32(static_cast<int>(p.G));
  K.max_samples = _mm256_set1_epi32(static_cast<int>(p.max_samples));
  K.max_skips = _mm256_set1_epi32(static_cast<int>(p.max_skips));
  K.sign = _mm256_set1_epi32(INT32_MIN);
  K.ff = _mm256_set1_epi32(kOccupiedCell);

  RmChunkV ch{&p, o, d, near_t, far_t, r0, n, 0, &occ, store, counts, st, 0};
  RmLanesV g[kRmGroups];
  for (RmLanesV& x : g) {
    for (int a = 0; a < 3; ++a) x.o[a] = x.d[a] = x.inv_d[a] = K.zero;
    x.t = x.t_hi = K.zero;
    x.k = x.skips = x.pos = _mm256_setzero_si256();
    x.live = 0;
  }
  for (;;) {
    unsigned any = 0;
    for (RmLanesV& x : g) {
      if (ch.next < n) RmRefillV(ch, x);
      any |= x.live;
    }
    if (any == 0) break;
    for (RmLanesV& x : g)
      if (x.live) RmStepV(K, ch, x);
  }

  if (store && ch.n_st > 0) {  // staged samples -> ray order (stable: a ray's samples were staged in order)
    std::vector<int64_t> at(n);
    int64_t sum = static_cast<int64_t>(t0_out->size());
    for (int i = 0; i < n; ++i) {
      at[i] = sum;
      sum += counts[i];
    }
    t0_out->resize(sum);
    t1_out->resize(sum);
    float* o0 = t0_out->data();
    float* o1 = t1_out->data();
    for (size_t j = 0; j < ch.n_st; ++j) {
      const int64_t w = at[st->pos[j]]++;
      o0[w] = st->t0[j];
      o1[w] = st->t1[j];
    }
  }
}

#endif  // TFMO_ISA_X86_BUILDS

}  // namespace tfmo::ray_march::cpu
