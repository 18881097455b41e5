// CPU kernels of Volume_render and Volume_render_grad (semantics: csrc/ops/render_ops.cc, math:
// csrc/shared/volume_render_math.h). Rays are independent: the project pool splits them into ranges, and each
// ray is one serial O(S·C) scan, so results do not depend on the thread count.
#include <algorithm>
#include <atomic>
#include <cstring>

#include "common/op_names.h"
#include "common/tfc.h"
#include "common/thread_pool.h"
#include "ops/render_validate.h"
#include "shared/volume_render_math.h"

namespace {

using tfmo::TensorRef;
using tfmo::render::VrDims;

struct VrAttrs {
  float threshold = 0.0f;
};

void* VrCreate(TF_OpKernelConstruction* c) {
  auto* a = new VrAttrs;
  if (!tfmo::render::ReadThreshold(c, "volume_render", &a->threshold)) {
    delete a;
    return nullptr;
  }
  return a;
}
void VrDelete(void* p) { delete static_cast<VrAttrs*>(p); }

// Rays per work item: enough samples to amortise the hand-off.
int64_t RayGrain(int64_t S, int64_t C) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, S * (C + 2))); }

// Lowest offending ray found by any thread (-1: none).
class FirstBadRay {
 public:
  void Note(int64_t r) {
    int64_t cur = ray_.load(std::memory_order_relaxed);
    while ((cur < 0 || r < cur) && !ray_.compare_exchange_weak(cur, r, std::memory_order_relaxed)) {}
  }
  int64_t get() const { return ray_.load(); }

 private:
  std::atomic<int64_t> ray_{-1};
};

bool RayInvalid(const float* sigma, const float* t, int64_t S) {
  bool bad = false;
  for (int64_t i = 0; i < S; ++i) bad |= vr_sample_invalid(sigma[i], t[i + 1] - t[i]);
  return bad;
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

// Background row of ray r (nullptr: none).
const float* BackgroundRow(const VrDims& d, const float* bg, int64_t r) {
  switch (d.bg) {
    case tfmo::render::kSharedBackground: return bg;
    case tfmo::render::kPerRayBackground: return bg + r * d.C;
    default: return nullptr;
  }
}

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
  const float* sg_all = dens.data<float>();
  const float* c_all = cols.data<float>();
  const float* t_all = t.data<float>();
  const float* bg_all = bg.data<float>();
  float* color_out = color.data<float>();
  float* depth_out = depth.data<float>();
  float* opac_out = opacity.data<float>();
  float* w_out = weights.data<float>();
  FirstBadRay bad;

  tfmo::ParallelFor(R, RayGrain(S, C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* sg = sg_all + r * S;
      const float* tt = t_all + r * (S + 1);
      const float* cl = c_all + r * S * C;
      float* w = w_out + r * S;
      float* col = color_out + r * C;
      if (RayInvalid(sg, tt, S)) {
        bad.Note(r);
        continue;
      }
      for (int64_t c = 0; c < C; ++c) col[c] = 0.0f;
      VrScan s = vr_scan_begin();
      float dep = 0.0f;
      int64_t i = 0;
      for (; i < S && !vr_terminated(s, thr); ++i) {
        const float wi = vr_scan_step(&s, sg[i], tt[i + 1] - tt[i]);
        w[i] = wi;
        dep += wi * vr_mid(tt[i], tt[i + 1]);
        const float* ci = cl + i * C;
        if (C == 3) {
          col[0] += wi * ci[0];
          col[1] += wi * ci[1];
          col[2] += wi * ci[2];
        } else {
          for (int64_t c = 0; c < C; ++c) col[c] += wi * ci[c];
        }
      }
      for (; i < S; ++i) w[i] = 0.0f;
      const float* b = BackgroundRow(d, bg_all, r);
      if (b)
        for (int64_t c = 0; c < C; ++c) col[c] += s.T * b[c];
      depth_out[r] = dep;
      opac_out[r] = vr_opacity(s);
    }
  });
  if (bad.get() >= 0) FailBadRay(ctx, op, sg_all, t_all, bad.get(), S);
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
  const float* sg_all = dens.data<float>();
  const float* c_all = cols.data<float>();
  const float* t_all = t.data<float>();
  const float* bg_all = bg.data<float>();
  const float* gc_all = gc.data<float>();
  const float* gd_all = gd.data<float>();
  const float* go_all = go.data<float>();
  const float* gw_all = gw.data<float>();
  float* gs_out = g_dens.data<float>();
  float* gcol_out = g_cols.data<float>();
  float* gt_out = g_t.data<float>();
  float* gbg_out = g_bg.data<float>();
  FirstBadRay bad;

  tfmo::ParallelFor(R, RayGrain(S, C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* sg = sg_all + r * S;
      const float* tt = t_all + r * (S + 1);
      const float* cl = c_all + r * S * C;
      const float* gcr = gc_all + r * C;
      const float* gwr = gw_all + r * S;
      float* gs = gs_out + r * S;  // holds T_{i+1} between the two passes
      float* gcol = gcol_out + r * S * C;
      float* gt = gt_out + r * (S + 1);
      if (RayInvalid(sg, tt, S)) {
        bad.Note(r);
        continue;
      }
      // Pass 1: the forward scan, exactly as in VrCompute; gs[i] = T_{i+1}.
      VrScan s = vr_scan_begin();
      int64_t n = 0;
      for (; n < S && !vr_terminated(s, thr); ++n) {
        vr_scan_step(&s, sg[n], tt[n + 1] - tt[n]);
        gs[n] = s.T;
      }
      const float T_final = s.T;
      const float* b = BackgroundRow(d, bg_all, r);
      float bdot = 0.0f;
      for (int64_t c = 0; c < C; ++c) {
        if (b) bdot += gcr[c] * b[c];
        gbg_out[r * C + c] = T_final * gcr[c];
      }
      const float tail = T_final * bdot;
      const float g_depth = gd_all[r], g_opac = go_all[r];
      // Terminated samples: no gradient.
      std::memset(gs + n, 0, sizeof(float) * (S - n));
      std::memset(gcol + n * C, 0, sizeof(float) * (S - n) * C);
      std::memset(gt + n + 1, 0, sizeof(float) * (S - n));
      // Pass 2: reverse scan.
      float suffix = 0.0f;          // sum_{k>i} w_k v_k
      float sgt_hi = 0.0f, w_hi = 0.0f;  // sigma_{i+1} dL/dtau_{i+1} and w_{i+1}
      for (int64_t i = n - 1; i >= 0; --i) {
        const float delta = tt[i + 1] - tt[i];
        const float tau = vr_tau(sg[i], delta);
        const float T_i = i > 0 ? gs[i - 1] : 1.0f;
        const float w = T_i * vr_alpha(tau, tfmo_exp(-tau));
        const float* ci = cl + i * C;
        float v = g_depth * vr_mid(tt[i], tt[i + 1]) + g_opac + gwr[i];
        float* gci = gcol + i * C;
        for (int64_t c = 0; c < C; ++c) {
          v += gcr[c] * ci[c];
          gci[c] = w * gcr[c];
        }
        const float gtau = vr_grad_tau(gs[i], v, suffix, tail);
        suffix += w * v;
        gs[i] = delta * gtau;
        const float sgt = sg[i] * gtau;
        gt[i + 1] = sgt - sgt_hi + 0.5f * g_depth * (w + w_hi);
        sgt_hi = sgt;
        w_hi = w;
      }
      gt[0] = -sgt_hi + 0.5f * g_depth * w_hi;
    }
  });
  if (bad.get() >= 0) FailBadRay(ctx, op, sg_all, t_all, bad.get(), S);
}

static const tfmo::OnLoad kRegister([] {
  tfmo::KernelSpec spec;
  spec.op = TFMO_OP_VOLUME_RENDER;
  spec.device = "CPU";
  spec.create = &VrCreate;
  spec.compute = &VrCompute;
  spec.destroy = &VrDelete;
  tfmo::RegisterKernel(spec);
  spec.op = TFMO_OP_VOLUME_RENDER_GRAD;
  spec.compute = &VrGradCompute;
  tfmo::RegisterKernel(spec);
});

}  // namespace
