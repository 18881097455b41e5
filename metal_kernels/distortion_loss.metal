// Metal kernels of DistortionLoss / DistortionLossGrad (semantics: csrc/ops/render_op.cc; math:
// csrc/shared/volume_render_math.h; host: csrc/gpu/render_gpu.cc). One thread per ray, dispatched with
// dispatchThreads over R rays (the host skips R == 0); O(S) per ray. A ray whose t decreases gets NaN outputs
// (a GPU kernel cannot fail the op). For an empty input the host binds another buffer in its place (never read).
//
// distortion_loss_forward:  weights(0) t(1) -> loss(2), params(3)
// distortion_loss_backward: weights(0) t(1) grad_loss(2) -> grad_weights(3) grad_t(4), params(5)
#include <metal_stdlib>
using namespace metal;

#include "volume_render_math.h"

inline bool dl_ray_unsorted(device const float* tt, uint S) {
  bool bad = false;
  for (uint i = 0; i < S; ++i) bad = bad || tt[i + 1] < tt[i];
  return bad;
}

kernel void distortion_loss_forward(device const float* weights [[buffer(0)]],
                                    device const float* t [[buffer(1)]],
                                    device float* loss [[buffer(2)]],
                                    constant DlParams& p [[buffer(3)]],
                                    uint r [[thread_position_in_grid]]) {
  if (r >= p.R) return;
  const uint S = p.S;
  device const float* wr = weights + ulong(r) * S;
  device const float* tt = t + ulong(r) * (S + 1);
  if (dl_ray_unsorted(tt, S)) {
    loss[r] = vr_nan();
    return;
  }
  DlScan s = dl_scan_begin();
  for (uint k = 0; k < S; ++k) dl_scan_step(&s, wr[k], tt[k + 1] - tt[k]);
  loss[r] = s.loss;
}

kernel void distortion_loss_backward(device const float* weights [[buffer(0)]],
                                     device const float* t [[buffer(1)]],
                                     device const float* grad_loss [[buffer(2)]],
                                     device float* grad_weights [[buffer(3)]],
                                     device float* grad_t [[buffer(4)]],
                                     constant DlParams& p [[buffer(5)]],
                                     uint r [[thread_position_in_grid]]) {
  if (r >= p.R) return;
  const uint S = p.S;
  device const float* wr = weights + ulong(r) * S;
  device const float* tt = t + ulong(r) * (S + 1);
  device float* gwr = grad_weights + ulong(r) * S;  // holds A_k between the passes
  device float* gtr = grad_t + ulong(r) * (S + 1);  // gtr[k] holds W_{<k} between the passes (k < S)
  if (dl_ray_unsorted(tt, S)) {
    for (uint k = 0; k < S; ++k) gwr[k] = vr_nan();
    for (uint k = 0; k <= S; ++k) gtr[k] = vr_nan();
    return;
  }
  const float gl = grad_loss[r];
  DlScan s = dl_scan_begin();
  for (uint k = 0; k < S; ++k) {
    gtr[k] = s.W;
    gwr[k] = dl_scan_step(&s, wr[k], tt[k + 1] - tt[k]);
  }
  DlRevScan rs = dl_rev_begin();
  float gm_hi = 0.0f, w_hi = 0.0f;  // dL/dm_{k+1}, w_{k+1}
  for (uint j = S; j > 0; --j) {
    const uint k = j - 1;
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
}
