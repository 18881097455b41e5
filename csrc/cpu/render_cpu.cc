// CPU kernels of the render family: VolumeRender, DistortionLoss and their gradients (semantics:
// csrc/ops/render_op.cc, math: csrc/shared/render_math.h). Rays are independent: the project pool splits them into
// ranges, and each ray is one serial scan (O(S·C) for VolumeRender, O(S) for DistortionLoss), so results do not
// depend on the thread count. VolumeRender's per-ray loops are vectorised and built per ISA
// (csrc/cpu/render_cpu_isa.h; the choice between the builds: the end of this file).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "common/op_names.h"
#include "common/tfc.h"
#include "common/thread_pool.h"
#include "cpu/render_cpu_isa.h"
#include "ops/render_args.h"
#include "shared/render_math.h"

namespace {

using tfmo::TensorRef;
using tfmo::render::VrDims;
using namespace tfmo::render::cpu;

using tfmo::render::VrAttrs;

// Rays per work item: enough samples to amortise the hand-off.
int64_t RayGrain(int64_t S, int64_t C) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, S * (C + 2))); }

// Lowest offending ray found by any thread (-1: none); reported after the parallel loop.
using FirstBadRay = tfmo::FirstIndex;

TFMO_FN bool RayInvalid(const float* sigma, const float* t, int64_t S) {
  int bad = 0;  // an int, not a bool, so the loop vectorises
  for (int64_t i = 0; i < S; ++i) bad |= static_cast<int>(vr_sample_invalid(sigma[i], t[i + 1] - t[i]));
  return bad != 0;
}

// Fails ctx with a message naming the first bad sample of ray r.
void FailBadRay(TF_OpKernelContext* ctx, const char* op, const float* dens, const float* t, int64_t r, int64_t S) {
  const float* sg = dens + r * S;
  const float* tt = t + r * (S + 1);
  for (int64_t i = 0; i < S; ++i) {
    if (sg[i] < 0.0f) {
      tfmo::Fail(ctx, TF_INVALID_ARGUMENT, "%s: densities must be >= 0, got densities[%lld, %lld] = %g", op,
                 static_cast<long long>(r), static_cast<long long>(i), static_cast<double>(sg[i]));
      return;
    }
    if (tt[i + 1] < tt[i]) {
      tfmo::Fail(ctx, TF_INVALID_ARGUMENT,
                 "%s: t must be non-decreasing along each ray, got t[%lld, %lld] = %g > t[%lld, %lld] = %g", op,
                 static_cast<long long>(r), static_cast<long long>(i), static_cast<double>(tt[i]),
                 static_cast<long long>(r), static_cast<long long>(i + 1), static_cast<double>(tt[i + 1]));
      return;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Per-ray scan on arrays. The exps of a ray are independent of each other, so they are computed in
// vectorisable loops (NegExp below); only the running sums (cum, suffix) are serial. Forward and gradient
// kernels share RayForward, so both see bitwise the same T, w and stop index.

// Thread-local scratch of one ray (S floats each; T has S+1).
struct RayScratch {
  std::vector<float> tau, cum, T, w, v, suf;
  explicit RayScratch(int64_t S) : tau(S), cum(S + 1), T(S + 1), w(S), v(S), suf(S) {}
};

// Running sums: four interleaved chains over the four quarters of the array, then the quarter offsets added.
// Breaks the add-latency chain (the serial part of a ray) about 4x. Sums of non-negative terms stay
// non-decreasing along the array, so T = exp(-cum) stays non-increasing (early termination relies on it).
// out[i] = sum_{j<i} x[j] for i <= n. out must not alias x.
TFMO_FN void ExclusivePrefix(const float* x, float* out, int64_t n) {
  const int64_t q = n / 4;
  float c0 = 0.0f, c1 = 0.0f, c2 = 0.0f, c3 = 0.0f;
  for (int64_t j = 0; j < q; ++j) {
    out[j] = c0, c0 += x[j];
    out[q + j] = c1, c1 += x[q + j];
    out[2 * q + j] = c2, c2 += x[2 * q + j];
    out[3 * q + j] = c3, c3 += x[3 * q + j];
  }
  for (int64_t i = 4 * q; i < n; ++i) out[i] = c3, c3 += x[i];
  float off = c0;
  for (int64_t i = q; i < 2 * q; ++i) out[i] += off;
  off += c1;
  for (int64_t i = 2 * q; i < 3 * q; ++i) out[i] += off;
  off += c2;
  for (int64_t i = 3 * q; i < n; ++i) out[i] += off;
  out[n] = off + c3;
}

// out[i] = sum_{j>i} x[j] for i < n (the mirror image of ExclusivePrefix). out must not alias x.
TFMO_FN void ExclusiveSuffix(const float* x, float* out, int64_t n) {
  const int64_t q = n / 4;
  float c0 = 0.0f, c1 = 0.0f, c2 = 0.0f, c3 = 0.0f;
  for (int64_t j = 1; j <= q; ++j) {
    out[n - j] = c0, c0 += x[n - j];
    out[n - q - j] = c1, c1 += x[n - q - j];
    out[n - 2 * q - j] = c2, c2 += x[n - 2 * q - j];
    out[n - 3 * q - j] = c3, c3 += x[n - 3 * q - j];
  }
  for (int64_t i = n - 4 * q - 1; i >= 0; --i) out[i] = c3, c3 += x[i];
  float off = c0;
  for (int64_t i = n - 2 * q; i < n - q; ++i) out[i] += off;
  off += c1;
  for (int64_t i = n - 3 * q; i < n - 2 * q; ++i) out[i] += off;
  off += c2;
  for (int64_t i = 0; i < n - 3 * q; ++i) out[i] += off;
}

// Fills tau[i], cum[i] = sum_{j<i} tau_j and T[i] = exp(-cum[i]) for i <= S, w[i] = T_i alpha_i (0 from the stop
// on), and returns the number n of composited samples (the stop index). T[n] is T_final.
TFMO_FN int64_t RayForward(const float* sg, const float* tt, int64_t S, float thr, RayScratch* sc, float* w) {
  float* tau = sc->tau.data();
  float* cum = sc->cum.data();
  float* T = sc->T.data();
  for (int64_t i = 0; i < S; ++i) tau[i] = vr_tau(sg[i], tt[i + 1] - tt[i]);
  ExclusivePrefix(tau, cum, S);
  ExpNegArray(cum, T, S + 1);
  int64_t n = S;
  if (thr > 0.0f) {  // T is non-increasing: the first T_i < thr is where the ray stops
    for (int64_t i = 0; i < S; ++i)
      if (vr_terminated(VrScan{0.0f, T[i]}, thr)) { n = i; break; }
  }
  WeightsArray(w, T, tau, n);
  for (int64_t i = n; i < S; ++i) w[i] = 0.0f;
  return n;
}

// The forward inputs both ray loops read (densities, colors, t, background), and where they note an invalid ray.
struct VrIn {
  const float *sg_all, *c_all, *t_all, *bg_all;
  VrDims d;
  float thr;
  FirstBadRay* bad;
};

VrIn MakeVrIn(const TensorRef& dens, const TensorRef& cols, const TensorRef& t, const TensorRef& bg, const VrDims& d,
              float thr, FirstBadRay* bad) {
  return VrIn{dens.data<float>(), cols.data<float>(), t.data<float>(), bg.data<float>(), d, thr, bad};
}

// Ray r's rows of the forward inputs; false, after noting r as bad, when they are invalid.
struct VrRayIn {
  const float *sg, *tt, *cl;
};
TFMO_FN bool RayIn(const VrIn& in, int64_t r, VrRayIn* ray) {
  const int64_t S = in.d.S;
  *ray = VrRayIn{in.sg_all + r * S, in.t_all + r * (S + 1), in.c_all + r * S * in.d.C};
  if (!RayInvalid(ray->sg, ray->tt, S)) return true;
  in.bad->Note(r);
  return false;
}

struct VrFwdJob {
  VrIn in;
  float *color_out, *depth_out, *opac_out, *w_out;
};

TFMO_FN void VrForwardRaysBody(const VrFwdJob& j, int64_t r0, int64_t r1) {
  const VrIn& in = j.in;
  const VrDims& d = in.d;
  const int64_t S = d.S, C = d.C;
  RayScratch sc(S);
  for (int64_t r = r0; r < r1; ++r) {
    VrRayIn ray;
    if (!RayIn(in, r, &ray)) continue;
    const float *tt = ray.tt, *cl = ray.cl;
    float* col = j.color_out + r * C;
    float* w = j.w_out + r * S;
    const int64_t n = RayForward(ray.sg, tt, S, in.thr, &sc, w);
    float dep = 0.0f;
    for (int64_t i = 0; i < n; ++i) dep += w[i] * vr_mid(tt[i], tt[i + 1]);
    if (C == 3) {
      float c0 = 0.0f, c1 = 0.0f, c2 = 0.0f;
      for (int64_t i = 0; i < n; ++i) {
        c0 += w[i] * cl[3 * i];
        c1 += w[i] * cl[3 * i + 1];
        c2 += w[i] * cl[3 * i + 2];
      }
      col[0] = c0, col[1] = c1, col[2] = c2;
    } else {
      for (int64_t c = 0; c < C; ++c) col[c] = 0.0f;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < C; ++c) col[c] += w[i] * cl[i * C + c];
    }
    const float T_final = sc.T[n];
    const float* b = tfmo::render::BackgroundRow(d.bg, in.bg_all, r, C);
    if (b)
      for (int64_t c = 0; c < C; ++c) col[c] += T_final * b[c];
    j.depth_out[r] = dep;
    j.opac_out[r] = vr_opacity(VrScan{sc.cum[n], T_final});
  }
}

struct VrGradJob {
  VrIn in;
  const float *gc_all, *gd_all, *go_all, *gw_all;
  float *gs_out, *gcol_out, *gt_out, *gbg_out;
};

TFMO_FN void VrGradRaysBody(const VrGradJob& j, int64_t r0, int64_t r1) {
  const VrIn& in = j.in;
  const VrDims& d = in.d;
  const int64_t S = d.S, C = d.C;
  float* gbg_out = j.gbg_out;
  RayScratch sc(S);
  for (int64_t r = r0; r < r1; ++r) {
    VrRayIn ray;
    if (!RayIn(in, r, &ray)) continue;
    const float *sg = ray.sg, *tt = ray.tt, *cl = ray.cl;
    const float* gcr = j.gc_all + r * C;
    const float* gwr = j.gw_all + r * S;
    float* gs = j.gs_out + r * S;
    float* gcol = j.gcol_out + r * S * C;
    float* gt = j.gt_out + r * (S + 1);
    float* w = sc.w.data();
    const int64_t n = RayForward(sg, tt, S, in.thr, &sc, w);
    const float* T = sc.T.data();
    float* v = sc.v.data();
    const float T_final = T[n];
    const float* b = tfmo::render::BackgroundRow(d.bg, in.bg_all, r, C);
    float bdot = 0.0f;
    for (int64_t c = 0; c < C; ++c) {
      if (b) bdot += gcr[c] * b[c];
      gbg_out[r * C + c] = T_final * gcr[c];
    }
    const float tail = T_final * bdot;
    const float g_depth = j.gd_all[r], g_opac = j.go_all[r];
    // v_i = sum_c gC_c c_ic + gD m_i + gO + gW_i, and dL/dc_ic = w_i gC_c.
    if (C == 3) {
      const float g0 = gcr[0], g1 = gcr[1], g2 = gcr[2];
      for (int64_t i = 0; i < n; ++i) {
        v[i] = g_depth * vr_mid(tt[i], tt[i + 1]) + g_opac + gwr[i] +
               (g0 * cl[3 * i] + g1 * cl[3 * i + 1] + g2 * cl[3 * i + 2]);
        gcol[3 * i] = w[i] * g0;
        gcol[3 * i + 1] = w[i] * g1;
        gcol[3 * i + 2] = w[i] * g2;
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        float dot = 0.0f;
        for (int64_t c = 0; c < C; ++c) {
          dot += gcr[c] * cl[i * C + c];
          gcol[i * C + c] = w[i] * gcr[c];
        }
        v[i] = g_depth * vr_mid(tt[i], tt[i + 1]) + g_opac + gwr[i] + dot;
      }
    }
    // Reverse scan: v[i] becomes dL/dtau_i, with suf[i] = sum_{k>i} w_k v_k.
    float* suf = sc.suf.data();
    float* wv = sc.cum.data();  // cum is not needed any more
    for (int64_t i = 0; i < n; ++i) wv[i] = w[i] * v[i];
    ExclusiveSuffix(wv, suf, n);
    for (int64_t i = 0; i < n; ++i) v[i] = vr_grad_tau(T[i + 1], v[i], suf[i], tail);
    for (int64_t i = 0; i < n; ++i) gs[i] = (tt[i + 1] - tt[i]) * v[i];
    // dL/dt_j = sigma_{j-1} gtau_{j-1} - sigma_j gtau_j + gD (w_{j-1} + w_j) / 2, zero past the stop.
    if (n > 0) {
      gt[0] = -sg[0] * v[0] + 0.5f * g_depth * w[0];
      for (int64_t j = 1; j < n; ++j)
        gt[j] = sg[j - 1] * v[j - 1] - sg[j] * v[j] + 0.5f * g_depth * (w[j - 1] + w[j]);
      gt[n] = sg[n - 1] * v[n - 1] + 0.5f * g_depth * w[n - 1];
    } else {
      gt[0] = 0.0f;
    }
    // Terminated samples: no gradient.
    std::memset(gs + n, 0, sizeof(float) * (S - n));
    std::memset(gcol + n * C, 0, sizeof(float) * (S - n) * C);
    std::memset(gt + n + 1, 0, sizeof(float) * (S - n));
  }
}

// ---------------------------------------------------------------------------------------------------------
// The kernels: each range of rays runs the selected ISA build of its ray loop (RenderBuild; the choice between the
// builds: the end of this file).

void VrCompute(void* p, TF_OpKernelContext* ctx) {
  const char* op = "volume_render";
  const float thr = static_cast<VrAttrs*>(p)->threshold;
  TensorRef dens, cols, t, bg;
  if (!tfmo::GetInput(ctx, 0, &dens) || !tfmo::GetInput(ctx, 1, &cols) || !tfmo::GetInput(ctx, 2, &t) ||
      !tfmo::GetInput(ctx, 3, &bg))
    return;
  VrDims d;
  if (!tfmo::render::ValidateVolumeRender(ctx, op, dens, cols, t, bg, &d)) return;
  const int64_t R = d.R, S = d.S, C = d.C;
  TensorRef color, depth, opacity, weights;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {R, C}, &color) || !tfmo::AllocateOutput(ctx, 1, TF_FLOAT, {R}, &depth) ||
      !tfmo::AllocateOutput(ctx, 2, TF_FLOAT, {R}, &opacity) ||
      !tfmo::AllocateOutput(ctx, 3, TF_FLOAT, {R, S}, &weights))
    return;
  if (R == 0) return;
  FirstBadRay bad;
  const VrFwdJob job{MakeVrIn(dens, cols, t, bg, d, thr, &bad), color.data<float>(), depth.data<float>(),
                     opacity.data<float>(), weights.data<float>()};
  tfmo::ParallelFor(R, RayGrain(S, C), [&](int64_t r0, int64_t r1) {
    tfmo::render::cpu::RenderBuild([&](auto) TFMO_FN_LAMBDA { VrForwardRaysBody(job, r0, r1); });
  });
  if (bad.get() >= 0) FailBadRay(ctx, op, job.in.sg_all, job.in.t_all, bad.get(), S);
}

void VrGradCompute(void* p, TF_OpKernelContext* ctx) {
  const char* op = "volume_render_grad";
  const float thr = static_cast<VrAttrs*>(p)->threshold;
  TensorRef dens, cols, t, bg, gc, gd, go, gw;
  for (auto [i, ref] : {std::pair<int, TensorRef*>{0, &dens}, {1, &cols}, {2, &t}, {3, &bg}, {4, &gc}, {5, &gd},
                        {6, &go}, {7, &gw}})
    if (!tfmo::GetInput(ctx, i, ref)) return;
  VrDims d;
  if (!tfmo::render::ValidateVolumeRender(ctx, op, dens, cols, t, bg, &d) ||
      !tfmo::render::ValidateVolumeRenderUpstream(ctx, op, d, gc, gd, go, gw))
    return;
  const int64_t R = d.R, S = d.S, C = d.C;
  TensorRef g_dens, g_cols, g_t, g_bg;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {R, S}, &g_dens) ||
      !tfmo::AllocateOutput(ctx, 1, TF_FLOAT, {R, S, C}, &g_cols) ||
      !tfmo::AllocateOutput(ctx, 2, TF_FLOAT, {R, S + 1}, &g_t) ||
      !tfmo::AllocateOutput(ctx, 3, TF_FLOAT, {R, C}, &g_bg))
    return;
  if (R == 0) return;
  FirstBadRay bad;
  const VrGradJob job{MakeVrIn(dens, cols, t, bg, d, thr, &bad), gc.data<float>(), gd.data<float>(),
                      go.data<float>(), gw.data<float>(), g_dens.data<float>(), g_cols.data<float>(),
                      g_t.data<float>(), g_bg.data<float>()};
  tfmo::ParallelFor(R, RayGrain(S, C), [&](int64_t r0, int64_t r1) {
    tfmo::render::cpu::RenderBuild([&](auto) TFMO_FN_LAMBDA { VrGradRaysBody(job, r0, r1); });
  });
  if (bad.get() >= 0) FailBadRay(ctx, op, job.in.sg_all, job.in.t_all, bad.get(), S);
}

// ---------------------------------------------------------------------------------------------------------
// DistortionLoss: a serial O(S) scan per ray (no exp, one build).

int64_t RayGrain(int64_t S) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, S)); }

bool Unsorted(const float* t, int64_t S) {
  bool bad = false;
  for (int64_t i = 0; i < S; ++i) bad |= t[i + 1] < t[i];
  return bad;
}

void FailUnsorted(TF_OpKernelContext* ctx, const char* op, const float* t, int64_t r, int64_t S) {
  const float* tt = t + r * (S + 1);
  int64_t i = 0;
  while (i < S && !(tt[i + 1] < tt[i])) ++i;
  tfmo::Fail(ctx, TF_INVALID_ARGUMENT,
             "%s: t must be non-decreasing along each ray, got t[%lld, %lld] = %g > t[%lld, %lld] = %g", op,
             static_cast<long long>(r), static_cast<long long>(i), static_cast<double>(tt[i]),
             static_cast<long long>(r), static_cast<long long>(i + 1), static_cast<double>(tt[i + 1]));
}

// Runs body(r, tt) for every ray r whose t row tt is sorted, rays split over the pool; after the loop, fails ctx
// naming the first unsorted ray, if any.
template <class Body>
void ForSortedRays(TF_OpKernelContext* ctx, const char* op, const float* t_all, int64_t R, int64_t S, Body body) {
  FirstBadRay bad;
  tfmo::ParallelFor(R, RayGrain(S), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* tt = t_all + r * (S + 1);
      if (Unsorted(tt, S)) {
        bad.Note(r);
        continue;
      }
      body(r, tt);
    }
  });
  if (bad.get() >= 0) FailUnsorted(ctx, op, t_all, bad.get(), S);
}

void DlCompute(void*, TF_OpKernelContext* ctx) {
  const char* op = "distortion_loss";
  TensorRef w, t, loss;
  int64_t R = 0, S = 0;
  if (!tfmo::render::PrepareDistortionLoss(ctx, op, &w, &t, &loss, &R, &S) || R == 0) return;
  const float* w_all = w.data<float>();
  const float* t_all = t.data<float>();
  float* out = loss.data<float>();
  ForSortedRays(ctx, op, t_all, R, S, [&](int64_t r, const float* tt) {
    const float* wr = w_all + r * S;
    DlScan s = dl_scan_begin();
    for (int64_t k = 0; k < S; ++k) dl_scan_step(&s, wr[k], tt[k + 1] - tt[k]);
    out[r] = s.loss;
  });
}

void DlGradCompute(void*, TF_OpKernelContext* ctx) {
  const char* op = "distortion_loss_grad";
  TensorRef w, t, g, gw, gt;
  int64_t R = 0, S = 0;
  if (!tfmo::render::PrepareDistortionLossGrad(ctx, op, &w, &t, &g, &gw, &gt, &R, &S) || R == 0) return;
  const float* w_all = w.data<float>();
  const float* t_all = t.data<float>();
  const float* g_all = g.data<float>();
  float* gw_all = gw.data<float>();
  float* gt_all = gt.data<float>();
  ForSortedRays(ctx, op, t_all, R, S, [&](int64_t r, const float* tt) {
    const float* wr = w_all + r * S;
    float* gwr = gw_all + r * S;       // holds A_k between the passes
    float* gtr = gt_all + r * (S + 1);  // gtr[k] holds W_{<k} between the passes (k < S)
    const float gl = g_all[r];
    DlScan s = dl_scan_begin();
    for (int64_t k = 0; k < S; ++k) {
      gtr[k] = s.W;
      gwr[k] = dl_scan_step(&s, wr[k], tt[k + 1] - tt[k]);
    }
    DlRevScan rs = dl_rev_begin();
    float gm_hi = 0.0f, w_hi = 0.0f;  // dL/dm_{k+1}, w_{k+1}
    for (int64_t k = S - 1; k >= 0; --k) {
      const float delta = tt[k + 1] - tt[k];
      float B, W_after;
      dl_rev_step(&rs, wr[k], delta, &B, &W_after);
      const float gm = dl_grad_m(wr[k], gtr[k], W_after);
      gwr[k] = gl * dl_grad_w(wr[k], delta, gwr[k], B);
      gtr[k + 1] = gl * dl_grad_t(gm, wr[k], gm_hi, w_hi);
      gm_hi = gm;
      w_hi = wr[k];
    }
    gtr[0] = gl * dl_grad_t(0.0f, 0.0f, gm_hi, w_hi);
  });
}

const tfmo::OnLoad kRegister([] {
  tfmo::render::RegisterKernels("CPU", &VrCompute, &VrGradCompute, &DlCompute, &DlGradCompute);
});

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// The builds (csrc/cpu/render_cpu_isa.h) and the choice between them, once per process, by TF_METAL_OPS_RENDER_ISA
// (or TF_METAL_OPS_VOLUME_RENDER_ISA; common/isa_choice.h); diagnostics (tf_metal_ops.diagnostics.cpu_paths) count
// the ray-range calls of every volume-render kernel (dense and packed, forward and gradient).
TFMO_ISA_FAMILY(tfmo::render::cpu, tfmo_render_cpu_paths, "TF_METAL_OPS_RENDER_ISA",
                "the volume-render CPU kernels use", kIsaCount, "TF_METAL_OPS_VOLUME_RENDER_ISA")
