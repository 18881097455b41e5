// CPU kernels of VolumeRenderPacked, DistortionLossPacked and their gradients (semantics:
// csrc/ops/render_packed_ops.cc; math: csrc/shared/volume_render_math.h). Rays are independent: the project pool
// splits them into ranges and each ray is one serial O(samples * C) scan with the shared per-sample functions, in
// the order of metal_kernels/render_packed.metal, so results do not depend on the thread count. O(N + R) in total.
// Invalid input fails with InvalidArgument: row_splits are checked first (serially, O(R)), then every ray checks
// its samples (densities >= 0, t_starts <= t_ends, no overlap with the previous sample); the message names the
// lowest offending sample whatever the thread count.
#include <algorithm>
#include <cstring>

#include "common/op_names.h"
#include "common/tfc.h"
#include "common/thread_pool.h"
#include "ops/render_packed_validate.h"
#include "shared/volume_render_math.h"

namespace {

using tfmo::TensorRef;
using tfmo::render::VrAttrs;
using tfmo::render::VrDelete;
using tfmo::render::VrpCreate;
using tfmo::render::VrpDims;

// Rays per work item: about 32K sample-channels, from the mean samples per ray.
int64_t RayGrain(int64_t R, int64_t N, int64_t C) {
  const int64_t per_ray = std::max<int64_t>(1, N / std::max<int64_t>(1, R)) * (C + 2);
  return std::max<int64_t>(1, 32768 / per_ray);
}

// Samples [a, b) of a ray: invalid when a density is negative (check_density), a sample ends before it starts, or
// overlaps its predecessor. Notes the first offending sample in *bad. NaN passes (it propagates).
bool RaySamplesInvalid(const float* sg, const float* ts, const float* te, int64_t a, int64_t b, bool check_density,
                       tfmo::FirstIndex* bad) {
  for (int64_t k = a; k < b; ++k) {
    const bool invalid = (check_density ? vr_sample_invalid(sg[k], te[k] - ts[k]) : te[k] - ts[k] < 0.0f) ||
                         (k > a && vr_overlaps(te[k - 1], ts[k]));
    if (invalid) {
      bad->Note(k);
      return true;
    }
  }
  return false;
}

// Fails ctx with a message naming sample k (the lowest one noted) and its ray.
void FailBadSample(TF_OpKernelContext* ctx, const char* op, const float* sg, const float* ts, const float* te,
                   const int32_t* rs, int64_t R, int64_t k) {
  const int64_t r = std::upper_bound(rs, rs + R + 1, static_cast<int32_t>(k)) - rs - 1;
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

const float* BackgroundRow(const VrpDims& d, const float* bg, int64_t r) {
  switch (d.bg) {
    case tfmo::render::kSharedBackground: return bg;
    case tfmo::render::kPerRayBackground: return bg + r * d.C;
    default: return nullptr;
  }
}

// ---------------------------------------------------------------------------------------------------------
// VolumeRenderPacked

void VrpCompute(void* p, TF_OpKernelContext* ctx) {
  const char* op = "volume_render_packed";
  const float thr = static_cast<VrAttrs*>(p)->threshold;
  TensorRef dens, cols, ts, te, rs, bg;
  if (!tfmo::GetInput(ctx, 0, &dens) || !tfmo::GetInput(ctx, 1, &cols) || !tfmo::GetInput(ctx, 2, &ts) ||
      !tfmo::GetInput(ctx, 3, &te) || !tfmo::GetInput(ctx, 4, &rs) || !tfmo::GetInput(ctx, 5, &bg))
    return;
  VrpDims d;
  if (!tfmo::render::ValidateVolumeRenderPacked(ctx, op, dens, cols, ts, te, rs, bg, &d) ||
      !tfmo::render::ValidateRowSplitsValues(ctx, op, rs.data<int32_t>(), d.R, d.N))
    return;
  const int64_t R = d.R, N = d.N, C = d.C;
  TensorRef color, depth, opacity, weights;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {R, C}, &color) || !tfmo::AllocateOutput(ctx, 1, TF_FLOAT, {R}, &depth) ||
      !tfmo::AllocateOutput(ctx, 2, TF_FLOAT, {R}, &opacity) || !tfmo::AllocateOutput(ctx, 3, TF_FLOAT, {N}, &weights))
    return;
  if (R == 0) return;
  const float* sg = dens.data<float>();
  const float* cl = cols.data<float>();
  const float* t0 = ts.data<float>();
  const float* t1 = te.data<float>();
  const int32_t* splits = rs.data<int32_t>();
  const float* bg_all = bg.data<float>();
  float* col_all = color.data<float>();
  float* dep_all = depth.data<float>();
  float* opa_all = opacity.data<float>();
  float* w = weights.data<float>();
  tfmo::FirstIndex bad;
  tfmo::ParallelFor(R, RayGrain(R, N, C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t a = splits[r], b = splits[r + 1];
      if (RaySamplesInvalid(sg, t0, t1, a, b, true, &bad)) continue;
      float* col = col_all + r * C;
      std::memset(col, 0, sizeof(float) * C);
      VrScan s = vr_scan_begin();
      float dep = 0.0f;
      int64_t k = a;
      for (; k < b && !vr_terminated(s, thr); ++k) {
        const float wk = vr_scan_step(&s, sg[k], t1[k] - t0[k]);
        w[k] = wk;
        dep += wk * vr_mid(t0[k], t1[k]);
        const float* ck = cl + k * C;
        for (int64_t c = 0; c < C; ++c) col[c] += wk * ck[c];
      }
      for (; k < b; ++k) w[k] = 0.0f;
      if (const float* bgr = BackgroundRow(d, bg_all, r))
        for (int64_t c = 0; c < C; ++c) col[c] += s.T * bgr[c];
      dep_all[r] = dep;
      opa_all[r] = vr_opacity(s);
    }
  });
  if (bad.get() >= 0) FailBadSample(ctx, op, sg, t0, t1, splits, R, bad.get());
}

void VrpGradCompute(void* p, TF_OpKernelContext* ctx) {
  const char* op = "volume_render_packed_grad";
  const float thr = static_cast<VrAttrs*>(p)->threshold;
  TensorRef in[10];
  for (int i = 0; i < 10; ++i)
    if (!tfmo::GetInput(ctx, i, &in[i])) return;
  const TensorRef &dens = in[0], &cols = in[1], &ts = in[2], &te = in[3], &rs = in[4], &bg = in[5];
  VrpDims d;
  if (!tfmo::render::ValidateVolumeRenderPacked(ctx, op, dens, cols, ts, te, rs, bg, &d) ||
      !tfmo::render::ValidateVolumeRenderPackedUpstream(ctx, op, d, in[6], in[7], in[8], in[9]) ||
      !tfmo::render::ValidateRowSplitsValues(ctx, op, rs.data<int32_t>(), d.R, d.N))
    return;
  const int64_t R = d.R, N = d.N, C = d.C;
  TensorRef g_dens, g_cols, g_ts, g_te, g_bg;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {N}, &g_dens) ||
      !tfmo::AllocateOutput(ctx, 1, TF_FLOAT, {N, C}, &g_cols) ||
      !tfmo::AllocateOutput(ctx, 2, TF_FLOAT, {N}, &g_ts) || !tfmo::AllocateOutput(ctx, 3, TF_FLOAT, {N}, &g_te) ||
      !tfmo::AllocateOutput(ctx, 4, TF_FLOAT, {R, C}, &g_bg))
    return;
  if (R == 0) return;
  const float* sg = dens.data<float>();
  const float* cl = cols.data<float>();
  const float* t0 = ts.data<float>();
  const float* t1 = te.data<float>();
  const int32_t* splits = rs.data<int32_t>();
  const float* bg_all = bg.data<float>();
  const float* gc_all = in[6].data<float>();
  const float* gd_all = in[7].data<float>();
  const float* go_all = in[8].data<float>();
  const float* gw = in[9].data<float>();
  float* gs = g_dens.data<float>();  // holds T_{k+1} between the two passes
  float* gcol = g_cols.data<float>();
  float* gt0 = g_ts.data<float>();
  float* gt1 = g_te.data<float>();
  float* gbg_all = g_bg.data<float>();
  tfmo::FirstIndex bad;
  tfmo::ParallelFor(R, RayGrain(R, N, C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t a = splits[r], b = splits[r + 1];
      if (RaySamplesInvalid(sg, t0, t1, a, b, true, &bad)) continue;
      // Pass 1: the forward scan, as in VrpCompute; gs[k] = T_{k+1}.
      VrScan s = vr_scan_begin();
      int64_t n = a;
      for (; n < b && !vr_terminated(s, thr); ++n) {
        vr_scan_step(&s, sg[n], t1[n] - t0[n]);
        gs[n] = s.T;
      }
      const float T_final = s.T;
      const float* gcr = gc_all + r * C;
      float bdot = 0.0f;
      if (const float* bgr = BackgroundRow(d, bg_all, r))
        for (int64_t c = 0; c < C; ++c) bdot += gcr[c] * bgr[c];
      for (int64_t c = 0; c < C; ++c) gbg_all[r * C + c] = T_final * gcr[c];
      const float tail = T_final * bdot;
      const float g_depth = gd_all[r], g_opac = go_all[r];
      // Terminated samples: no gradient.
      for (int64_t k = n; k < b; ++k) {
        gs[k] = gt0[k] = gt1[k] = 0.0f;
        std::memset(gcol + k * C, 0, sizeof(float) * C);
      }
      // Pass 2: reverse scan.
      float suffix = 0.0f;  // sum_{j>k} w_j v_j
      for (int64_t k = n - 1; k >= a; --k) {
        const float delta = t1[k] - t0[k];
        const float tau = vr_tau(sg[k], delta);
        const float T_k = k > a ? gs[k - 1] : 1.0f;
        const float wk = T_k * vr_alpha(tau, tfmo_exp(-tau));
        const float* ck = cl + k * C;
        float* gck = gcol + k * C;
        float v = g_depth * vr_mid(t0[k], t1[k]) + g_opac + gw[k];
        for (int64_t c = 0; c < C; ++c) {
          v += gcr[c] * ck[c];
          gck[c] = wk * gcr[c];
        }
        const float gtau = vr_grad_tau(gs[k], v, suffix, tail);
        suffix += wk * v;
        gs[k] = delta * gtau;
        const float sgt = sg[k] * gtau;
        gt0[k] = vr_grad_start(sgt, g_depth, wk);
        gt1[k] = vr_grad_end(sgt, g_depth, wk);
      }
    }
  });
  if (bad.get() >= 0) FailBadSample(ctx, op, sg, t0, t1, splits, R, bad.get());
}

// ---------------------------------------------------------------------------------------------------------
// DistortionLossPacked

// Reads and validates (weights, t_starts, t_ends, row_splits) of both distortion ops.
bool DlpInputs(TF_OpKernelContext* ctx, const char* op, TensorRef* w, TensorRef* ts, TensorRef* te, TensorRef* rs,
               int64_t* R, int64_t* N) {
  return tfmo::GetInput(ctx, 0, w) && tfmo::GetInput(ctx, 1, ts) && tfmo::GetInput(ctx, 2, te) &&
         tfmo::GetInput(ctx, 3, rs) && tfmo::render::ValidateDistortionLossPacked(ctx, op, *w, *ts, *te, *rs, R, N);
}

void DlpCompute(void*, TF_OpKernelContext* ctx) {
  const char* op = "distortion_loss_packed";
  TensorRef w, ts, te, rs;
  int64_t R = 0, N = 0;
  if (!DlpInputs(ctx, op, &w, &ts, &te, &rs, &R, &N) ||
      !tfmo::render::ValidateRowSplitsValues(ctx, op, rs.data<int32_t>(), R, N))
    return;
  TensorRef loss;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {R}, &loss) || R == 0) return;
  const float* wk = w.data<float>();
  const float* t0 = ts.data<float>();
  const float* t1 = te.data<float>();
  const int32_t* splits = rs.data<int32_t>();
  float* out = loss.data<float>();
  tfmo::FirstIndex bad;
  tfmo::ParallelFor(R, RayGrain(R, N, 0), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t a = splits[r], b = splits[r + 1];
      if (RaySamplesInvalid(nullptr, t0, t1, a, b, false, &bad)) continue;
      DlScan s = dl_scan_begin();
      for (int64_t k = a; k < b; ++k) dl_scan_step_gap(&s, wk[k], t1[k] - t0[k], k > a ? t0[k] - t1[k - 1] : 0.0f);
      out[r] = s.loss;
    }
  });
  if (bad.get() >= 0) FailBadSample(ctx, op, nullptr, t0, t1, splits, R, bad.get());
}

void DlpGradCompute(void*, TF_OpKernelContext* ctx) {
  const char* op = "distortion_loss_packed_grad";
  TensorRef w, ts, te, rs, g;
  int64_t R = 0, N = 0;
  if (!DlpInputs(ctx, op, &w, &ts, &te, &rs, &R, &N) || !tfmo::GetInput(ctx, 4, &g)) return;
  if (!tfmo::render::CheckFloat(ctx, op, "grad_loss", g) ||
      !tfmo::render::CheckShape(ctx, op, "grad_loss", g, {R}, tfmo::render::Dims({R}).c_str()) ||
      !tfmo::render::ValidateRowSplitsValues(ctx, op, rs.data<int32_t>(), R, N))
    return;
  TensorRef gw, gts, gte;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {N}, &gw) || !tfmo::AllocateOutput(ctx, 1, TF_FLOAT, {N}, &gts) ||
      !tfmo::AllocateOutput(ctx, 2, TF_FLOAT, {N}, &gte) || R == 0)
    return;
  const float* wk = w.data<float>();
  const float* t0 = ts.data<float>();
  const float* t1 = te.data<float>();
  const int32_t* splits = rs.data<int32_t>();
  const float* gl_all = g.data<float>();
  float* gw_all = gw.data<float>();   // holds A_k between the passes
  float* gt0 = gts.data<float>();     // holds W_{<k} between the passes
  float* gt1 = gte.data<float>();
  tfmo::FirstIndex bad;
  tfmo::ParallelFor(R, RayGrain(R, N, 0), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t a = splits[r], b = splits[r + 1];
      if (RaySamplesInvalid(nullptr, t0, t1, a, b, false, &bad)) continue;
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
  if (bad.get() >= 0) FailBadSample(ctx, op, nullptr, t0, t1, splits, R, bad.get());
}

static const tfmo::OnLoad kRegister([] {
  tfmo::KernelSpec spec;
  spec.device = "CPU";
  spec.create = &VrpCreate;
  spec.destroy = &VrDelete;
  spec.op = TFMO_OP_VOLUME_RENDER_PACKED;
  spec.compute = &VrpCompute;
  tfmo::RegisterKernel(spec);
  spec.op = TFMO_OP_VOLUME_RENDER_PACKED_GRAD;
  spec.compute = &VrpGradCompute;
  tfmo::RegisterKernel(spec);

  tfmo::KernelSpec dl;
  dl.device = "CPU";
  dl.op = TFMO_OP_DISTORTION_LOSS_PACKED;
  dl.compute = &DlpCompute;
  tfmo::RegisterKernel(dl);
  dl.op = TFMO_OP_DISTORTION_LOSS_PACKED_GRAD;
  dl.compute = &DlpGradCompute;
  tfmo::RegisterKernel(dl);
});

}  // namespace
