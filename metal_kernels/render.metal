// Metal kernels of the render family: VolumeRender, DistortionLoss and their gradients (semantics:
// csrc/ops/render_op.cc; math and conventions: csrc/shared/render_math.h; host: csrc/gpu/render_gpu.cc). One thread
// per ray, dispatched with dispatchThreads over R rays (the host skips R == 0). Offsets are 64-bit (R*S*C may exceed
// 2^32). Invalid input (a negative density, or t decreasing along the ray) cannot fail the op from the GPU: every
// output of that ray is NaN instead. For an empty input the host binds another buffer in its place; it is never read.
//
// volume_render_forward:  densities(0) colors(1) t(2) background(3) -> color(4) depth(5) opacity(6) weights(7),
//                         params(8)
// volume_render_backward: densities(0) colors(1) t(2) background(3) grad_color(4) grad_depth(5) grad_opacity(6)
//                         grad_weights(7) -> grad_densities(8) grad_colors(9) grad_t(10) grad_background(11),
//                         params(12). grad_background is per ray ([R, C]): the caller reduces it.
// distortion_loss_forward:  weights(0) t(1) -> loss(2), params(3); O(S) per ray
// distortion_loss_backward: weights(0) t(1) grad_loss(2) -> grad_weights(3) grad_t(4), params(5)
#include <metal_stdlib>
using namespace metal;

#include "render_math.h"

// Channels accumulated in registers; more channels accumulate in the output row itself.
enum : uint { kVrLocalChannels = 4 };

TFMO_FN bool vr_ray_invalid(device const float* sg, device const float* tt, uint S) {
  bool bad = false;
  for (uint i = 0; i < S; ++i) bad = bad || vr_sample_invalid(sg[i], tt[i + 1] - tt[i]);
  return bad;
}

TFMO_FN device const float* vr_background_row(device const float* bg, uint mode, uint C, uint r) {
  return mode == 2u ? bg + ulong(r) * C : bg;
}

kernel void volume_render_forward(device const float* densities [[buffer(0)]],
                                  device const float* colors [[buffer(1)]],
                                  device const float* t [[buffer(2)]],
                                  device const float* background [[buffer(3)]],
                                  device float* color_out [[buffer(4)]],
                                  device float* depth_out [[buffer(5)]],
                                  device float* opacity_out [[buffer(6)]],
                                  device float* weights_out [[buffer(7)]],
                                  constant VrParams& p [[buffer(8)]],
                                  uint r [[thread_position_in_grid]]) {
  if (r >= p.R) return;
  const uint S = p.S, C = p.C;
  device const float* sg = densities + ulong(r) * S;
  device const float* tt = t + ulong(r) * (S + 1);
  device const float* cl = colors + ulong(r) * S * C;
  device float* w = weights_out + ulong(r) * S;
  device float* col = color_out + ulong(r) * C;
  if (vr_ray_invalid(sg, tt, S)) {
    for (uint i = 0; i < S; ++i) w[i] = vr_nan();
    for (uint c = 0; c < C; ++c) col[c] = vr_nan();
    depth_out[r] = vr_nan();
    opacity_out[r] = vr_nan();
    return;
  }
  const bool local = C <= kVrLocalChannels;
  float acc[kVrLocalChannels] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (!local)
    for (uint c = 0; c < C; ++c) col[c] = 0.0f;
  VrScan s = vr_scan_begin();
  float dep = 0.0f;
  uint i = 0;
  for (; i < S && !vr_terminated(s, p.threshold); ++i) {
    const float wi = vr_scan_step(&s, sg[i], tt[i + 1] - tt[i]);
    w[i] = wi;
    dep += wi * vr_mid(tt[i], tt[i + 1]);
    device const float* ci = cl + ulong(i) * C;
    if (local) {
      for (uint c = 0; c < C; ++c) acc[c] += wi * ci[c];
    } else {
      for (uint c = 0; c < C; ++c) col[c] += wi * ci[c];
    }
  }
  for (; i < S; ++i) w[i] = 0.0f;
  if (local)
    for (uint c = 0; c < C; ++c) col[c] = acc[c];
  if (p.bg_mode != 0u) {
    device const float* b = vr_background_row(background, p.bg_mode, C, r);
    for (uint c = 0; c < C; ++c) col[c] += s.T * b[c];
  }
  depth_out[r] = dep;
  opacity_out[r] = vr_opacity(s);
}

kernel void volume_render_backward(device const float* densities [[buffer(0)]],
                                   device const float* colors [[buffer(1)]],
                                   device const float* t [[buffer(2)]],
                                   device const float* background [[buffer(3)]],
                                   device const float* grad_color [[buffer(4)]],
                                   device const float* grad_depth [[buffer(5)]],
                                   device const float* grad_opacity [[buffer(6)]],
                                   device const float* grad_weights [[buffer(7)]],
                                   device float* grad_densities [[buffer(8)]],
                                   device float* grad_colors [[buffer(9)]],
                                   device float* grad_t [[buffer(10)]],
                                   device float* grad_background [[buffer(11)]],
                                   constant VrParams& p [[buffer(12)]],
                                   uint r [[thread_position_in_grid]]) {
  if (r >= p.R) return;
  const uint S = p.S, C = p.C;
  device const float* sg = densities + ulong(r) * S;
  device const float* tt = t + ulong(r) * (S + 1);
  device const float* cl = colors + ulong(r) * S * C;
  device const float* gcr = grad_color + ulong(r) * C;
  device const float* gwr = grad_weights + ulong(r) * S;
  device float* gs = grad_densities + ulong(r) * S;  // holds T_{i+1} between the two passes
  device float* gcol = grad_colors + ulong(r) * S * C;
  device float* gt = grad_t + ulong(r) * (S + 1);
  device float* gbg = grad_background + ulong(r) * C;
  if (vr_ray_invalid(sg, tt, S)) {
    for (uint i = 0; i < S; ++i) gs[i] = vr_nan();
    for (ulong k = 0; k < ulong(S) * C; ++k) gcol[k] = vr_nan();
    for (uint i = 0; i <= S; ++i) gt[i] = vr_nan();
    for (uint c = 0; c < C; ++c) gbg[c] = vr_nan();
    return;
  }
  // Pass 1: the forward scan, exactly as in volume_render_forward; gs[i] = T_{i+1}.
  VrScan s = vr_scan_begin();
  uint n = 0;
  for (; n < S && !vr_terminated(s, p.threshold); ++n) {
    vr_scan_step(&s, sg[n], tt[n + 1] - tt[n]);
    gs[n] = s.T;
  }
  const float T_final = s.T;
  float bdot = 0.0f;
  if (p.bg_mode != 0u) {
    device const float* b = vr_background_row(background, p.bg_mode, C, r);
    for (uint c = 0; c < C; ++c) bdot += gcr[c] * b[c];
  }
  for (uint c = 0; c < C; ++c) gbg[c] = T_final * gcr[c];
  const float tail = T_final * bdot;
  const float g_depth = grad_depth[r], g_opac = grad_opacity[r];
  // Terminated samples: no gradient.
  for (uint i = n; i < S; ++i) {
    gs[i] = 0.0f;
    gt[i + 1] = 0.0f;
    for (uint c = 0; c < C; ++c) gcol[ulong(i) * C + c] = 0.0f;
  }
  // Pass 2: reverse scan.
  float suffix = 0.0f;               // sum_{k>i} w_k v_k
  float sgt_hi = 0.0f, w_hi = 0.0f;  // sigma_{i+1} dL/dtau_{i+1} and w_{i+1}
  for (uint k = n; k > 0; --k) {
    const uint i = k - 1;
    const float delta = tt[i + 1] - tt[i];
    const float tau = vr_tau(sg[i], delta);
    const float T_i = i > 0 ? gs[i - 1] : 1.0f;
    const float w = T_i * vr_alpha(tau, tfmo_exp(-tau));
    device const float* ci = cl + ulong(i) * C;
    device float* gci = gcol + ulong(i) * C;
    float v = g_depth * vr_mid(tt[i], tt[i + 1]) + g_opac + gwr[i];
    for (uint c = 0; c < C; ++c) {
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

// ---- DistortionLoss ----

TFMO_FN bool dl_ray_unsorted(device const float* tt, uint S) {
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
