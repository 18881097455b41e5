// CPU kernels of VolumeRenderPacked, DistortionLossPacked and their gradients (semantics:
// csrc/ops/render_packed_op.cc; math: csrc/shared/render_math.h). The project pool splits the rays into
// ranges; a range checks its samples first (RangeValid), then runs in chunks of consecutive rays (ChunkEnd), whose
// samples are contiguous in the flat arrays. VolumeRenderPacked computes the per-sample parts of a chunk (tau, the
// transmittances exp(-cum), the weights) in flat vectorised loops over all its samples, many rays at once
// (csrc/cpu/render_cpu_isa.h, built per ISA like VolumeRender's ray loops); only the running sums along the rays
// (four interleaved chains, Interleave4), the accumulations and the gradient's reverse scan are serial, per ray.
// DistortionLossPacked is a serial scan per ray (no exp). Every value depends only on its own ray (a vector lane computes what the scalar
// tail computes), so results do not depend on the thread count. O(N + R) in total.
// Invalid input fails with InvalidArgument: row_splits are checked first (serially, O(R)), then every range checks
// its samples (densities >= 0, t_starts <= t_ends, no overlap with the previous sample of the ray); the message
// names the lowest offending sample whatever the thread count.
#include <algorithm>
#include <cstring>
#include <vector>

#include "common/op_names.h"
#include "common/tfc.h"
#include "common/thread_pool.h"
#include "cpu/render_cpu_isa.h"
#include "ops/render_packed_args.h"
#include "shared/render_math.h"

namespace {

using tfmo::TensorRef;
using tfmo::render_packed::VrAttrs;
using tfmo::render_packed::VrpDims;
using namespace tfmo::render_packed::cpu;

// Rays per work item: about 32K sample-channels, from the mean samples per ray.
int64_t RayGrain(int64_t R, int64_t N, int64_t C) {
  const int64_t per_ray = std::max<int64_t>(1, N / std::max<int64_t>(1, R)) * (C + 2);
  return std::max<int64_t>(1, 32768 / per_ray);
}

// The flat sample arrays of packed rays; sg is nullptr for the distortion ops (no densities to check).
struct PackedSamples {
  const float* sg;
  const float* t0;
  const float* t1;
  const int32_t* splits;
};

// Samples [a, b) of a ray: invalid when a density is negative (sg given), a sample ends before it starts, or
// overlaps its predecessor. Notes the first offending sample in *bad. NaN passes (it propagates).
TFMO_FN bool RaySamplesInvalid(const PackedSamples& p, int64_t a, int64_t b, tfmo::FirstIndex* bad) {
  for (int64_t k = a; k < b; ++k) {
    const float delta = p.t1[k] - p.t0[k];
    const bool invalid = (p.sg != nullptr ? vr_sample_invalid(p.sg[k], delta) : delta < 0.0f) ||
                         (k > a && vr_overlaps(p.t1[k - 1], p.t0[k]));
    if (invalid) {
      bad->Note(k);
      return true;
    }
  }
  return false;
}

// The samples of rays [r0, r1): true when all are valid, else notes the range's lowest offending sample in *bad.
// A flat vectorised pass over all of them first (the overlap test runs across ray boundaries too, and the ray
// starts, which have no predecessor, are taken back out), the per-ray scan only when it found something.
TFMO_FN bool RangeValid(const PackedSamples& p, int64_t r0, int64_t r1, tfmo::FirstIndex* bad) {
  const int64_t A = p.splits[r0], B = p.splits[r1];
  int flags = 0;  // ints, not bools, so that the loops vectorise
  if (p.sg != nullptr) {
    for (int64_t k = A; k < B; ++k)
      flags |= static_cast<int>(vr_sample_invalid(p.sg[k], p.t1[k] - p.t0[k]));
  } else {
    for (int64_t k = A; k < B; ++k) flags |= static_cast<int>(p.t1[k] - p.t0[k] < 0.0f);
  }
  int overlaps = 0;  // < 2^31: N fits int32 row_splits
  for (int64_t k = A + 1; k < B; ++k) overlaps += static_cast<int>(vr_overlaps(p.t1[k - 1], p.t0[k]));
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t a = p.splits[r];
    if (a > A && a < p.splits[r + 1]) overlaps -= static_cast<int>(vr_overlaps(p.t1[a - 1], p.t0[a]));
  }
  if (flags == 0 && overlaps == 0) return true;
  for (int64_t r = r0; r < r1; ++r)
    if (RaySamplesInvalid(p, p.splits[r], p.splits[r + 1], bad)) return false;
  return true;  // not reached: both passes test the same conditions
}

// Fails ctx with a message naming sample k (the lowest one noted) and its ray.
void FailBadSample(TF_OpKernelContext* ctx, const char* op, const PackedSamples& p, int64_t R, int64_t k) {
  const float *sg = p.sg, *ts = p.t0, *te = p.t1;
  const int64_t r = std::upper_bound(p.splits, p.splits + R + 1, static_cast<int32_t>(k)) - p.splits - 1;
  const long long kk = static_cast<long long>(k), rr = static_cast<long long>(r);
  if (sg != nullptr && sg[k] < 0.0f) {
    tfmo::Fail(ctx, TF_INVALID_ARGUMENT, "%s: densities must be >= 0, got densities[%lld] = %g (ray %lld)", op, kk,
               static_cast<double>(sg[k]), rr);
  } else if (te[k] - ts[k] < 0.0f) {
    tfmo::Fail(ctx, TF_INVALID_ARGUMENT,
               "%s: every sample needs t_starts <= t_ends, got t_starts[%lld] = %g > t_ends[%lld] = %g (ray %lld)",
               op, kk, static_cast<double>(ts[k]), kk, static_cast<double>(te[k]), rr);
  } else {
    tfmo::Fail(ctx, TF_INVALID_ARGUMENT,
               "%s: the samples of a ray must be sorted and non-overlapping, got t_ends[%lld] = %g > "
               "t_starts[%lld] = %g (ray %lld)",
               op, kk - 1, static_cast<double>(te[k - 1]), kk, static_cast<double>(ts[k]), rr);
  }
}

// ---------------------------------------------------------------------------------------------------------
// VolumeRenderPacked

// The lambdas of the ray loops are always inlined (TFMO_FN_LAMBDA), so that they are compiled for the ISA of the
// build they run in.

// A chunk holds at most this many samples (and rays), so that its scratch stays in cache; a longer ray is a
// chunk of its own.
constexpr int64_t kChunkSamples = 2048;

// The end of the chunk of rays that starts at ray ra (< r1).
TFMO_FN int64_t ChunkEnd(const int32_t* splits, int64_t ra, int64_t r1) {
  int64_t rb = ra + 1;
  while (rb < r1 && rb - ra < kChunkSamples && splits[rb + 1] - splits[ra] <= kChunkSamples) ++rb;
  return rb;
}

// 0 when z, else x, without a branch (segment starts are as unpredictable as ray lengths).
TFMO_FN float ZeroIf(bool z, float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits &= static_cast<uint32_t>(z) - 1u;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

// Runs step(j, i) for every sample i of a chunk of n samples, j = 0..3 naming one of four parts that each begin at
// a ray's first sample (starts[i] > 0), interleaved: a running sum along rays becomes four independent chains. Each
// part sees its samples in order, and every ray lies in one part, so a sum restarted at each ray's first sample is
// bitwise that of a serial scan of the ray alone (whatever the chunk boundaries).
template <class Step>
TFMO_FN void Interleave4(const int32_t* starts, int64_t n, Step&& step) {
  int64_t p[5] = {0, 0, 0, 0, n};
  for (int j = 1; j < 4; ++j) {
    int64_t i = std::max(p[j - 1], j * n / 4);
    while (i < n && starts[i] == 0) ++i;
    p[j] = i;
  }
  int64_t m = n;
  for (int j = 0; j < 4; ++j) m = std::min(m, p[j + 1] - p[j]);
  for (int64_t i = 0; i < m; ++i) {
    step(0, p[0] + i);
    step(1, p[1] + i);
    step(2, p[2] + i);
    step(3, p[3] + i);
  }
  for (int j = 0; j < 4; ++j)
    for (int64_t i = p[j] + m; i < p[j + 1]; ++i) step(j, i);
}

// Scratch of one chunk, indexed from its first sample / first ray.
struct ChunkScratch {
  // Per sample (one spare entry): cum = sum of tau over the earlier samples of its ray, T = exp(-cum), w = T alpha
  // (gradient only), v (gradient only); starts = the number of rays whose first sample it is (> 0: a ray starts
  // there; empty rays share the next ray's start).
  std::vector<float> tau, cum, T, w, v;
  std::vector<int32_t> starts;
  // Per ray: cum and T after its last sample, its stop (first sample not composited; b when none), T_final * b.
  std::vector<float> cum_end, T_end, tail;
  std::vector<int64_t> stop;
  ChunkScratch() : cum_end(kChunkSamples), T_end(kChunkSamples), tail(kChunkSamples), stop(kChunkSamples) {
    Fit(kChunkSamples);
  }
  void Fit(int64_t samples) {
    if (static_cast<int64_t>(tau.size()) > samples) return;
    for (auto* a : {&tau, &cum, &T, &w, &v}) a->resize(samples + 1);
    starts.resize(samples + 1);
  }
};

// The forward scan of the rays [ra, rb) (samples [A, B) = [splits[ra], splits[rb])): fills the scratch (sized by
// Fit(B - A)) and w[k - A] = T_k alpha_k, 0 from the ray's stop on (the first sample with T < thr). Forward and
// gradient kernels share it, so both see bitwise the same T, w and stop. Only the running sums are serial (along
// each ray: Interleave4).
TFMO_FN void ChunkForward(const PackedSamples& p, int64_t ra, int64_t rb, float thr, ChunkScratch* sc,
                              float* w) {
  const int32_t* splits = p.splits;
  const int64_t A = splits[ra], n = splits[rb] - A, nr = rb - ra;
  float *tau = sc->tau.data(), *cum = sc->cum.data(), *T = sc->T.data();
  const float *sg = p.sg + A, *t0 = p.t0 + A, *t1 = p.t1 + A;
  for (int64_t i = 0; i < n; ++i) tau[i] = vr_tau(sg[i], t1[i] - t0[i]);
  int32_t* starts = sc->starts.data();
  std::memset(starts, 0, sizeof(int32_t) * (n + 1));
  for (int64_t r = 0; r < nr; ++r) ++starts[splits[ra + r] - A];
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  Interleave4(starts, n, [&](int j, int64_t i) TFMO_FN_LAMBDA {
    c[j] = ZeroIf(starts[i] != 0, c[j]);
    cum[i] = c[j];
    c[j] += tau[i];
  });
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t a = splits[ra + r] - A, b = splits[ra + r + 1] - A;
    sc->cum_end[r] = b > a ? cum[b - 1] + tau[b - 1] : 0.0f;
  }
  ExpNegArray(cum, T, n);
  ExpNegArray(sc->cum_end.data(), sc->T_end.data(), nr);
  WeightsArray(w, T, tau, n);
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t a = splits[ra + r] - A, b = splits[ra + r + 1] - A;
    int64_t stop = b;
    if (thr > 0.0f) {  // threshold 0 never stops
      for (int64_t i = a; i < b; ++i)
        if (vr_terminated(VrScan{cum[i], T[i]}, thr)) {
          stop = i;
          break;
        }
    }
    sc->stop[r] = stop;
    for (int64_t i = stop; i < b; ++i) w[i] = 0.0f;
  }
}

// The inputs both volume-render kernels share.
struct VrpJob {
  PackedSamples p;
  const float *cl, *bg_all;
  VrpDims d;
  float thr;
  tfmo::FirstIndex* bad;
};

// Checks the samples of rays [r0, r1) and runs each chunk's forward scan (weights into w_all, or the scratch when
// nullptr), then chunk(ra, rb, sc, w) with w the chunk's weights.
template <class Chunk>
TFMO_FN void ForEachChunk(const VrpJob& j, int64_t r0, int64_t r1, float* w_all, Chunk&& chunk) {
  if (!RangeValid(j.p, r0, r1, j.bad)) return;
  ChunkScratch sc;
  for (int64_t ra = r0, rb; ra < r1; ra = rb) {
    rb = ChunkEnd(j.p.splits, ra, r1);
    const int64_t A = j.p.splits[ra];
    sc.Fit(j.p.splits[rb] - A);
    float* w = w_all != nullptr ? w_all + A : sc.w.data();
    ChunkForward(j.p, ra, rb, j.thr, &sc, w);
    chunk(ra, rb, sc, w);
  }
}

struct VrpFwdJob : VrpJob {
  float *col_all, *dep_all, *opa_all, *w_all;
};

TFMO_FN void VrpForwardRaysBody(const VrpFwdJob& j, int64_t r0, int64_t r1) {
  const int32_t* splits = j.p.splits;
  const int64_t C = j.d.C;
  ForEachChunk(j, r0, r1, j.w_all, [&](int64_t ra, int64_t rb, ChunkScratch& sc, const float* w)
                                        TFMO_FN_LAMBDA {
    const int64_t A = splits[ra];
    const float *t0 = j.p.t0 + A, *t1 = j.p.t1 + A, *cl = j.cl + A * C;
    for (int64_t r = ra; r < rb; ++r) {
      const int64_t a = splits[r] - A, b = splits[r + 1] - A, n = sc.stop[r - ra];
      float* col = j.col_all + r * C;
      float dep = 0.0f;
      if (C == 3) {
        float c0 = 0.0f, c1 = 0.0f, c2 = 0.0f;
        for (int64_t k = a; k < n; ++k) {
          const float wk = w[k];
          dep += wk * vr_mid(t0[k], t1[k]);
          c0 += wk * cl[3 * k];
          c1 += wk * cl[3 * k + 1];
          c2 += wk * cl[3 * k + 2];
        }
        col[0] = c0, col[1] = c1, col[2] = c2;
      } else {
        std::memset(col, 0, sizeof(float) * C);
        for (int64_t k = a; k < n; ++k) {
          const float wk = w[k];
          dep += wk * vr_mid(t0[k], t1[k]);
          for (int64_t c = 0; c < C; ++c) col[c] += wk * cl[k * C + c];
        }
      }
      const float T_final = n < b ? sc.T[n] : sc.T_end[r - ra];
      const float cum_final = n < b ? sc.cum[n] : sc.cum_end[r - ra];
      if (const float* bgr = tfmo::render_packed::BackgroundRow(j.d.bg, j.bg_all, r, C))
        for (int64_t c = 0; c < C; ++c) col[c] += T_final * bgr[c];
      j.dep_all[r] = dep;
      j.opa_all[r] = vr_opacity(VrScan{cum_final, T_final});
    }
  });
}

struct VrpGradJob : VrpJob {
  const float *gc_all, *gd_all, *go_all, *gw_all;
  float *gs_all, *gcol_all, *gt0_all, *gt1_all, *gbg_all;
};

TFMO_FN void VrpGradRaysBody(const VrpGradJob& j, int64_t r0, int64_t r1) {
  const int32_t* splits = j.p.splits;
  const int64_t C = j.d.C;
  ForEachChunk(j, r0, r1, nullptr, [&](int64_t ra, int64_t rb, ChunkScratch& sc, const float* w)
                                       TFMO_FN_LAMBDA {
    const int64_t A = splits[ra];
    const float* T = sc.T.data();
    const float *sg = j.p.sg + A, *t0 = j.p.t0 + A, *t1 = j.p.t1 + A, *cl = j.cl + A * C, *gw = j.gw_all + A;
    float *gs = j.gs_all + A, *gcol = j.gcol_all + A * C, *gt0 = j.gt0_all + A, *gt1 = j.gt1_all + A;
    float* v = sc.v.data();
    for (int64_t r = ra; r < rb; ++r) {
      const int64_t a = splits[r] - A, b = splits[r + 1] - A, n = sc.stop[r - ra];
      const float T_final = n < b ? T[n] : sc.T_end[r - ra];
      const float* gcr = j.gc_all + r * C;
      float bdot = 0.0f;
      if (const float* bgr = tfmo::render_packed::BackgroundRow(j.d.bg, j.bg_all, r, C))
        for (int64_t c = 0; c < C; ++c) bdot += gcr[c] * bgr[c];
      for (int64_t c = 0; c < C; ++c) j.gbg_all[r * C + c] = T_final * gcr[c];
      const float tail = T_final * bdot;
      const float g_depth = j.gd_all[r], g_opac = j.go_all[r];
      // v_k = sum_c gC_c c_kc + gD m_k + gO + gW_k, and dL/dc_kc = w_k gC_c.
      if (C == 3) {
        const float g0 = gcr[0], g1 = gcr[1], g2 = gcr[2];
TFMO_IVDEP  // outputs and scratch never alias the inputs
        for (int64_t k = a; k < n; ++k) {
          v[k] = g_depth * vr_mid(t0[k], t1[k]) + g_opac + gw[k] +
                 (g0 * cl[3 * k] + g1 * cl[3 * k + 1] + g2 * cl[3 * k + 2]);
          gcol[3 * k] = w[k] * g0;
          gcol[3 * k + 1] = w[k] * g1;
          gcol[3 * k + 2] = w[k] * g2;
        }
      } else {
        for (int64_t k = a; k < n; ++k) {
          float dot = 0.0f;
          for (int64_t c = 0; c < C; ++c) {
            dot += gcr[c] * cl[k * C + c];
            gcol[k * C + c] = w[k] * gcr[c];
          }
          v[k] = g_depth * vr_mid(t0[k], t1[k]) + g_opac + gw[k] + dot;
        }
      }
      // Reverse scan: v_k becomes dL/dtau_k = T_{k+1} v_k - sum_{j>k} w_j v_j - tail (the only serial chain).
      float suffix = 0.0f, T_next = T_final;
      for (int64_t k = n - 1; k >= a; --k) {
        const float vk = v[k];
        v[k] = vr_grad_tau(T_next, vk, suffix, tail);
        suffix += w[k] * vk;
        T_next = T[k];
      }
TFMO_IVDEP
      for (int64_t k = a; k < n; ++k) {
        gs[k] = (t1[k] - t0[k]) * v[k];
        const float sgt = sg[k] * v[k];
        gt0[k] = vr_grad_start(sgt, g_depth, w[k]);
        gt1[k] = vr_grad_end(sgt, g_depth, w[k]);
      }
      if (n < b) {  // terminated samples: no gradient
        for (int64_t k = n; k < b; ++k) gs[k] = gt0[k] = gt1[k] = 0.0f;
        std::memset(gcol + n * C, 0, sizeof(float) * (b - n) * C);
      }
    }
  });
}


void VrpCompute(void* p, TF_OpKernelContext* ctx) {
  const char* op = "volume_render_packed";
  const float thr = static_cast<VrAttrs*>(p)->threshold;
  TensorRef dens, cols, ts, te, rs, bg;
  if (!tfmo::GetInput(ctx, 0, &dens) || !tfmo::GetInput(ctx, 1, &cols) || !tfmo::GetInput(ctx, 2, &ts) ||
      !tfmo::GetInput(ctx, 3, &te) || !tfmo::GetInput(ctx, 4, &rs) || !tfmo::GetInput(ctx, 5, &bg))
    return;
  VrpDims d;
  if (!tfmo::render_packed::ValidateVolumeRenderPacked(ctx, op, dens, cols, ts, te, rs, bg, &d) ||
      !tfmo::render_packed::ValidateRowSplitsValues(ctx, op, rs.data<int32_t>(), d.R, d.N))
    return;
  const int64_t R = d.R, N = d.N, C = d.C;
  TensorRef color, depth, opacity, weights;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {R, C}, &color) || !tfmo::AllocateOutput(ctx, 1, TF_FLOAT, {R}, &depth) ||
      !tfmo::AllocateOutput(ctx, 2, TF_FLOAT, {R}, &opacity) || !tfmo::AllocateOutput(ctx, 3, TF_FLOAT, {N}, &weights))
    return;
  if (R == 0) return;
  tfmo::FirstIndex bad;
  const VrpFwdJob job{{{dens.data<float>(), ts.data<float>(), te.data<float>(), rs.data<int32_t>()},
                       cols.data<float>(), bg.data<float>(), d, thr, &bad},
                      color.data<float>(), depth.data<float>(), opacity.data<float>(), weights.data<float>()};
  tfmo::ParallelFor(R, RayGrain(R, N, C), [&](int64_t r0, int64_t r1) {
    tfmo::render::cpu::RenderBuild([&](auto) TFMO_FN_LAMBDA { VrpForwardRaysBody(job, r0, r1); });
  });
  if (bad.get() >= 0) FailBadSample(ctx, op, job.p, R, bad.get());
}

void VrpGradCompute(void* p, TF_OpKernelContext* ctx) {
  const char* op = "volume_render_packed_grad";
  const float thr = static_cast<VrAttrs*>(p)->threshold;
  TensorRef in[10];
  for (int i = 0; i < 10; ++i)
    if (!tfmo::GetInput(ctx, i, &in[i])) return;
  const TensorRef &dens = in[0], &cols = in[1], &ts = in[2], &te = in[3], &rs = in[4], &bg = in[5];
  VrpDims d;
  if (!tfmo::render_packed::ValidateVolumeRenderPacked(ctx, op, dens, cols, ts, te, rs, bg, &d) ||
      !tfmo::render_packed::ValidateVolumeRenderPackedUpstream(ctx, op, d, in[6], in[7], in[8], in[9]) ||
      !tfmo::render_packed::ValidateRowSplitsValues(ctx, op, rs.data<int32_t>(), d.R, d.N))
    return;
  const int64_t R = d.R, N = d.N, C = d.C;
  TensorRef g_dens, g_cols, g_ts, g_te, g_bg;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {N}, &g_dens) ||
      !tfmo::AllocateOutput(ctx, 1, TF_FLOAT, {N, C}, &g_cols) ||
      !tfmo::AllocateOutput(ctx, 2, TF_FLOAT, {N}, &g_ts) || !tfmo::AllocateOutput(ctx, 3, TF_FLOAT, {N}, &g_te) ||
      !tfmo::AllocateOutput(ctx, 4, TF_FLOAT, {R, C}, &g_bg))
    return;
  if (R == 0) return;
  tfmo::FirstIndex bad;
  const VrpGradJob job{{{dens.data<float>(), ts.data<float>(), te.data<float>(), rs.data<int32_t>()},
                        cols.data<float>(), bg.data<float>(), d, thr, &bad},
                       in[6].data<float>(), in[7].data<float>(), in[8].data<float>(), in[9].data<float>(),
                       g_dens.data<float>(), g_cols.data<float>(), g_ts.data<float>(), g_te.data<float>(),
                       g_bg.data<float>()};
  tfmo::ParallelFor(R, RayGrain(R, N, C), [&](int64_t r0, int64_t r1) {
    tfmo::render::cpu::RenderBuild([&](auto) TFMO_FN_LAMBDA { VrpGradRaysBody(job, r0, r1); });
  });
  if (bad.get() >= 0) FailBadSample(ctx, op, job.p, R, bad.get());
}

// ---------------------------------------------------------------------------------------------------------
// DistortionLossPacked

// Reads and validates (weights, t_starts, t_ends, row_splits) of both distortion ops.
bool DlpInputs(TF_OpKernelContext* ctx, const char* op, TensorRef* w, TensorRef* ts, TensorRef* te, TensorRef* rs,
               int64_t* R, int64_t* N) {
  return tfmo::GetInput(ctx, 0, w) && tfmo::GetInput(ctx, 1, ts) && tfmo::GetInput(ctx, 2, te) &&
         tfmo::GetInput(ctx, 3, rs) && tfmo::render_packed::ValidateDistortionLossPacked(ctx, op, *w, *ts, *te, *rs, R, N);
}

void DlpCompute(void*, TF_OpKernelContext* ctx) {
  const char* op = "distortion_loss_packed";
  TensorRef w, ts, te, rs;
  int64_t R = 0, N = 0;
  if (!DlpInputs(ctx, op, &w, &ts, &te, &rs, &R, &N) ||
      !tfmo::render_packed::ValidateRowSplitsValues(ctx, op, rs.data<int32_t>(), R, N))
    return;
  TensorRef loss;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {R}, &loss) || R == 0) return;
  const float* wk = w.data<float>();
  const PackedSamples p{nullptr, ts.data<float>(), te.data<float>(), rs.data<int32_t>()};
  const float *t0 = p.t0, *t1 = p.t1;
  const int32_t* splits = p.splits;
  float* out = loss.data<float>();
  tfmo::FirstIndex bad;
  tfmo::ParallelFor(R, RayGrain(R, N, 0), [&](int64_t r0, int64_t r1) {
    if (!RangeValid(p, r0, r1, &bad)) return;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t a = splits[r], b = splits[r + 1];
      DlScan s = dl_scan_begin();
      for (int64_t k = a; k < b; ++k) dl_scan_step_gap(&s, wk[k], t1[k] - t0[k], k > a ? t0[k] - t1[k - 1] : 0.0f);
      out[r] = s.loss;
    }
  });
  if (bad.get() >= 0) FailBadSample(ctx, op, p, R, bad.get());
}

void DlpGradCompute(void*, TF_OpKernelContext* ctx) {
  const char* op = "distortion_loss_packed_grad";
  TensorRef w, ts, te, rs, g;
  int64_t R = 0, N = 0;
  if (!DlpInputs(ctx, op, &w, &ts, &te, &rs, &R, &N) || !tfmo::GetInput(ctx, 4, &g)) return;
  if (!tfmo::render_packed::CheckFloat(ctx, op, "grad_loss", g) ||
      !tfmo::render_packed::CheckShape(ctx, op, "grad_loss", g, {R}, tfmo::render_packed::Dims({R}).c_str()) ||
      !tfmo::render_packed::ValidateRowSplitsValues(ctx, op, rs.data<int32_t>(), R, N))
    return;
  TensorRef gw, gts, gte;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {N}, &gw) || !tfmo::AllocateOutput(ctx, 1, TF_FLOAT, {N}, &gts) ||
      !tfmo::AllocateOutput(ctx, 2, TF_FLOAT, {N}, &gte) || R == 0)
    return;
  const float* wk = w.data<float>();
  const PackedSamples p{nullptr, ts.data<float>(), te.data<float>(), rs.data<int32_t>()};
  const float *t0 = p.t0, *t1 = p.t1;
  const int32_t* splits = p.splits;
  const float* gl_all = g.data<float>();
  float* gw_all = gw.data<float>();   // holds A_k between the passes
  float* gt0 = gts.data<float>();     // holds W_{<k} between the passes
  float* gt1 = gte.data<float>();
  tfmo::FirstIndex bad;
  tfmo::ParallelFor(R, RayGrain(R, N, 0), [&](int64_t r0, int64_t r1) {
    if (!RangeValid(p, r0, r1, &bad)) return;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t a = splits[r], b = splits[r + 1];
      const float gl = gl_all[r];
      DlScan s = dl_scan_begin();
      for (int64_t k = a; k < b; ++k) {
        gt0[k] = s.W;
        gw_all[k] = dl_scan_step_gap(&s, wk[k], t1[k] - t0[k], k > a ? t0[k] - t1[k - 1] : 0.0f);
      }
      DlRevScan rev = dl_rev_begin();
      for (int64_t k = b - 1; k >= a; --k) {
        const float delta = t1[k] - t0[k];
        float B, W_after;
        dl_rev_step_gap(&rev, wk[k], delta, k + 1 < b ? t0[k + 1] - t1[k] : 0.0f, &B, &W_after);
        const float gm = dl_grad_m(wk[k], gt0[k], W_after);
        gw_all[k] = gl * dl_grad_w(wk[k], delta, gw_all[k], B);
        gt0[k] = gl * dl_grad_start(gm, wk[k]);
        gt1[k] = gl * dl_grad_end(gm, wk[k]);
      }
    }
  });
  if (bad.get() >= 0) FailBadSample(ctx, op, p, R, bad.get());
}

const tfmo::OnLoad kRegister([] {
  tfmo::render_packed::RegisterKernels("CPU", &VrpCompute, &VrpGradCompute, &DlpCompute, &DlpGradCompute);
});

}  // namespace
