// CPU kernels of DistortionLoss and DistortionLossGrad (semantics: csrc/ops/render_op.cc, math:
// csrc/shared/volume_render_math.h): O(S) per ray, rays split over the project pool; per-ray results do not
// depend on the thread count.
#include <algorithm>
#include <atomic>

#include "common/op_names.h"
#include "common/tfc.h"
#include "common/thread_pool.h"
#include "ops/render_args.h"
#include "shared/volume_render_math.h"

namespace {

using tfmo::TensorRef;

int64_t RayGrain(int64_t S) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, S)); }

// Lowest offending ray found by any thread (-1: none); reported after the parallel loop.
using FirstBadRay = tfmo::FirstIndex;

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

static const tfmo::OnLoad kRegister([] {
  tfmo::RegisterKernelPair(tfmo::KernelSpecFor("CPU"), TFMO_OP_DISTORTION_LOSS, &DlCompute,
                           TFMO_OP_DISTORTION_LOSS_GRAD, &DlGradCompute);
});

}  // namespace
