// Metal kernels of VolumeRenderPacked / DistortionLossPacked and their gradients (semantics:
// csrc/ops/render_packed_op.cc; math: csrc/shared/render_math.h; host: csrc/gpu/render_packed_gpu.cc).
// One thread per ray, the same loops as the CPU kernels (csrc/cpu/render_packed_cpu.cc). Offsets are 64-bit.
//
// NaN policy (a GPU kernel cannot fail the op; never an out-of-bounds access, whatever the input holds):
//  - row_splits: render_packed_check_init + render_packed_check_splits run first and set status[0] = 1 unless
//    row_splits[0] = 0, row_splits[r] <= row_splits[r+1] and row_splits[R] = N. With status set, every output of the
//    call is NaN: thread r writes its ray's outputs and the per-sample outputs k = r, r + R, r + 2R, ... < N.
//    Independently, each thread clamps its range to 0 <= a <= b <= N before reading samples.
//  - samples (a density < 0, t_ends < t_starts, or overlapping its predecessor): every output of that ray (and its
//    gradients, including those of its samples) is NaN. NaN inputs propagate.
// For an empty tensor the host binds a one-element scratch buffer in its place; it is never read or written.
//
// render_packed_check_init:       status(0); 1 thread
// render_packed_check_splits:     row_splits(0) status(1) params(2); R + 1 threads
// volume_render_packed_forward:   densities(0) colors(1) t_starts(2) t_ends(3) row_splits(4) background(5)
//                                 status(6) -> color(7) depth(8) opacity(9) weights(10), params(11)
// volume_render_packed_backward:  densities(0) colors(1) t_starts(2) t_ends(3) row_splits(4) background(5)
//                                 grad_color(6) grad_depth(7) grad_opacity(8) grad_weights(9) status(10) ->
//                                 grad_densities(11) grad_colors(12) grad_t_starts(13) grad_t_ends(14)
//                                 grad_background(15), params(16). grad_background is per ray ([R, C]).
// distortion_loss_packed_forward: weights(0) t_starts(1) t_ends(2) row_splits(3) status(4) -> loss(5), params(6)
// distortion_loss_packed_backward: weights(0) t_starts(1) t_ends(2) row_splits(3) grad_loss(4) status(5) ->
//                                 grad_weights(6) grad_t_starts(7) grad_t_ends(8), params(9)
#include <metal_stdlib>
using namespace metal;

#include "render_math.h"

enum : uint { kVrpLocalChannels = 4 };

kernel void render_packed_check_init(device atomic_int* status [[buffer(0)]],
                                     uint i [[thread_position_in_grid]]) {
  if (i == 0) atomic_store_explicit(status, 0, memory_order_relaxed);
}

kernel void render_packed_check_splits(device const int* row_splits [[buffer(0)]],
                                       device atomic_int* status [[buffer(1)]],
                                       constant DlpParams& p [[buffer(2)]],
                                       uint i [[thread_position_in_grid]]) {
  if (i > p.R) return;
  const int v = row_splits[i];
  const bool bad = (i == 0 && v != 0) || (i == p.R && v != int(p.N)) || (i < p.R && row_splits[i + 1] < v);
  if (bad) atomic_store_explicit(status, 1, memory_order_relaxed);
}

// Samples [a, b) of ray r, clamped to 0 <= a <= b <= N (valid row_splits are unchanged by it).
inline uint2 rp_ray_range(device const int* row_splits, uint r, uint N) {
  const int n = int(N);  // the host guarantees N < 2^31
  const int a = clamp(row_splits[r], 0, n);
  const int b = clamp(row_splits[r + 1], a, n);
  return uint2(uint(a), uint(b));
}

// Sample validity of a ray (csrc/cpu/render_packed_cpu.cc: RaySamplesInvalid).
inline bool rp_ray_invalid(device const float* sg, device const float* ts, device const float* te, uint2 ab,
                           bool check_density) {
  bool bad = false;
  for (uint k = ab.x; k < ab.y; ++k) {
    const float delta = te[k] - ts[k];
    bad = bad || (check_density ? vr_sample_invalid(sg[k], delta) : delta < 0.0f) ||
          (k > ab.x && vr_overlaps(te[k - 1], ts[k]));
  }
  return bad;
}

inline device const float* rp_background_row(device const float* bg, uint mode, uint C, uint r) {
  return mode == 2u ? bg + ulong(r) * C : bg;
}

kernel void volume_render_packed_forward(device const float* densities [[buffer(0)]],
                                         device const float* colors [[buffer(1)]],
                                         device const float* t_starts [[buffer(2)]],
                                         device const float* t_ends [[buffer(3)]],
                                         device const int* row_splits [[buffer(4)]],
                                         device const float* background [[buffer(5)]],
                                         device const int* status [[buffer(6)]],
                                         device float* color_out [[buffer(7)]],
                                         device float* depth_out [[buffer(8)]],
                                         device float* opacity_out [[buffer(9)]],
                                         device float* weights_out [[buffer(10)]],
                                         constant VrpParams& p [[buffer(11)]],
                                         uint r [[thread_position_in_grid]]) {
  if (r >= p.R) return;
  const uint C = p.C;
  device float* col = color_out + ulong(r) * C;
  const bool splits_bad = status[0] != 0;
  const uint2 ab = splits_bad ? uint2(0, 0) : rp_ray_range(row_splits, r, p.N);
  if (splits_bad || rp_ray_invalid(densities, t_starts, t_ends, ab, true)) {
    for (uint c = 0; c < C; ++c) col[c] = vr_nan();
    depth_out[r] = vr_nan();
    opacity_out[r] = vr_nan();
    if (splits_bad) {
      for (ulong k = r; k < p.N; k += p.R) weights_out[k] = vr_nan();
    } else {
      for (uint k = ab.x; k < ab.y; ++k) weights_out[k] = vr_nan();
    }
    return;
  }
  const bool local = C <= kVrpLocalChannels;
  float acc[kVrpLocalChannels] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (!local)
    for (uint c = 0; c < C; ++c) col[c] = 0.0f;
  VrScan s = vr_scan_begin();
  float dep = 0.0f;
  uint k = ab.x;
  for (; k < ab.y && !vr_terminated(s, p.threshold); ++k) {
    const float wk = vr_scan_step(&s, densities[k], t_ends[k] - t_starts[k]);
    weights_out[k] = wk;
    dep += wk * vr_mid(t_starts[k], t_ends[k]);
    device const float* ck = colors + ulong(k) * C;
    if (local) {
      for (uint c = 0; c < C; ++c) acc[c] += wk * ck[c];
    } else {
      for (uint c = 0; c < C; ++c) col[c] += wk * ck[c];
    }
  }
  for (; k < ab.y; ++k) weights_out[k] = 0.0f;
  if (local)
    for (uint c = 0; c < C; ++c) col[c] = acc[c];
  if (p.bg_mode != 0u) {
    device const float* b = rp_background_row(background, p.bg_mode, C, r);
    for (uint c = 0; c < C; ++c) col[c] += s.T * b[c];
  }
  depth_out[r] = dep;
  opacity_out[r] = vr_opacity(s);
}

kernel void volume_render_packed_backward(device const float* densities [[buffer(0)]],
                                          device const float* colors [[buffer(1)]],
                                          device const float* t_starts [[buffer(2)]],
                                          device const float* t_ends [[buffer(3)]],
                                          device const int* row_splits [[buffer(4)]],
                                          device const float* background [[buffer(5)]],
                                          device const float* grad_color [[buffer(6)]],
                                          device const float* grad_depth [[buffer(7)]],
                                          device const float* grad_opacity [[buffer(8)]],
                                          device const float* grad_weights [[buffer(9)]],
                                          device const int* status [[buffer(10)]],
                                          device float* grad_densities [[buffer(11)]],
                                          device float* grad_colors [[buffer(12)]],
                                          device float* grad_t_starts [[buffer(13)]],
                                          device float* grad_t_ends [[buffer(14)]],
                                          device float* grad_background [[buffer(15)]],
                                          constant VrpParams& p [[buffer(16)]],
                                          uint r [[thread_position_in_grid]]) {
  if (r >= p.R) return;
  const uint C = p.C;
  device const float* gcr = grad_color + ulong(r) * C;
  device float* gbg = grad_background + ulong(r) * C;
  device float* gs = grad_densities;  // gs[k] holds T_{k+1} between the two passes
  const bool splits_bad = status[0] != 0;
  const uint2 ab = splits_bad ? uint2(0, 0) : rp_ray_range(row_splits, r, p.N);
  if (splits_bad || rp_ray_invalid(densities, t_starts, t_ends, ab, true)) {
    for (uint c = 0; c < C; ++c) gbg[c] = vr_nan();
    const ulong first = splits_bad ? ulong(r) : ulong(ab.x);
    const ulong end = splits_bad ? ulong(p.N) : ulong(ab.y);
    const ulong step = splits_bad ? ulong(p.R) : 1ul;
    for (ulong k = first; k < end; k += step) {
      gs[k] = vr_nan();
      grad_t_starts[k] = vr_nan();
      grad_t_ends[k] = vr_nan();
      for (uint c = 0; c < C; ++c) grad_colors[k * C + c] = vr_nan();
    }
    return;
  }
  // Pass 1: the forward scan, exactly as in volume_render_packed_forward; gs[k] = T_{k+1}.
  VrScan s = vr_scan_begin();
  uint n = ab.x;
  for (; n < ab.y && !vr_terminated(s, p.threshold); ++n) {
    vr_scan_step(&s, densities[n], t_ends[n] - t_starts[n]);
    gs[n] = s.T;
  }
  const float T_final = s.T;
  float bdot = 0.0f;
  if (p.bg_mode != 0u) {
    device const float* b = rp_background_row(background, p.bg_mode, C, r);
    for (uint c = 0; c < C; ++c) bdot += gcr[c] * b[c];
  }
  for (uint c = 0; c < C; ++c) gbg[c] = T_final * gcr[c];
  const float tail = T_final * bdot;
  const float g_depth = grad_depth[r], g_opac = grad_opacity[r];
  // Terminated samples: no gradient.
  for (uint k = n; k < ab.y; ++k) {
    gs[k] = 0.0f;
    grad_t_starts[k] = 0.0f;
    grad_t_ends[k] = 0.0f;
    for (uint c = 0; c < C; ++c) grad_colors[ulong(k) * C + c] = 0.0f;
  }
  // Pass 2: reverse scan.
  float suffix = 0.0f;  // sum_{j>k} w_j v_j
  for (uint j = n; j > ab.x; --j) {
    const uint k = j - 1;
    const float delta = t_ends[k] - t_starts[k];
    const float tau = vr_tau(densities[k], delta);
    const float T_k = k > ab.x ? gs[k - 1] : 1.0f;
    const float wk = T_k * vr_alpha(tau, tfmo_exp(-tau));
    device const float* ck = colors + ulong(k) * C;
    device float* gck = grad_colors + ulong(k) * C;
    float v = g_depth * vr_mid(t_starts[k], t_ends[k]) + g_opac + grad_weights[k];
    for (uint c = 0; c < C; ++c) {
      v += gcr[c] * ck[c];
      gck[c] = wk * gcr[c];
    }
    const float gtau = vr_grad_tau(gs[k], v, suffix, tail);
    suffix += wk * v;
    gs[k] = delta * gtau;
    const float sgt = densities[k] * gtau;
    grad_t_starts[k] = vr_grad_start(sgt, g_depth, wk);
    grad_t_ends[k] = vr_grad_end(sgt, g_depth, wk);
  }
}

kernel void distortion_loss_packed_forward(device const float* weights [[buffer(0)]],
                                           device const float* t_starts [[buffer(1)]],
                                           device const float* t_ends [[buffer(2)]],
                                           device const int* row_splits [[buffer(3)]],
                                           device const int* status [[buffer(4)]],
                                           device float* loss [[buffer(5)]],
                                           constant DlpParams& p [[buffer(6)]],
                                           uint r [[thread_position_in_grid]]) {
  if (r >= p.R) return;
  const bool splits_bad = status[0] != 0;
  const uint2 ab = splits_bad ? uint2(0, 0) : rp_ray_range(row_splits, r, p.N);
  if (splits_bad || rp_ray_invalid(weights, t_starts, t_ends, ab, false)) {
    loss[r] = vr_nan();
    return;
  }
  DlScan s = dl_scan_begin();
  for (uint k = ab.x; k < ab.y; ++k)
    dl_scan_step_gap(&s, weights[k], t_ends[k] - t_starts[k], k > ab.x ? t_starts[k] - t_ends[k - 1] : 0.0f);
  loss[r] = s.loss;
}

kernel void distortion_loss_packed_backward(device const float* weights [[buffer(0)]],
                                            device const float* t_starts [[buffer(1)]],
                                            device const float* t_ends [[buffer(2)]],
                                            device const int* row_splits [[buffer(3)]],
                                            device const float* grad_loss [[buffer(4)]],
                                            device const int* status [[buffer(5)]],
                                            device float* grad_weights [[buffer(6)]],
                                            device float* grad_t_starts [[buffer(7)]],
                                            device float* grad_t_ends [[buffer(8)]],
                                            constant DlpParams& p [[buffer(9)]],
                                            uint r [[thread_position_in_grid]]) {
  if (r >= p.R) return;
  const bool splits_bad = status[0] != 0;
  const uint2 ab = splits_bad ? uint2(0, 0) : rp_ray_range(row_splits, r, p.N);
  if (splits_bad || rp_ray_invalid(weights, t_starts, t_ends, ab, false)) {
    const ulong first = splits_bad ? ulong(r) : ulong(ab.x);
    const ulong end = splits_bad ? ulong(p.N) : ulong(ab.y);
    const ulong step = splits_bad ? ulong(p.R) : 1ul;
    for (ulong k = first; k < end; k += step) {
      grad_weights[k] = vr_nan();
      grad_t_starts[k] = vr_nan();
      grad_t_ends[k] = vr_nan();
    }
    return;
  }
  const float gl = grad_loss[r];
  device float* gw = grad_weights;   // holds A_k between the passes
  device float* gt0 = grad_t_starts;  // holds W_{<k} between the passes
  DlScan s = dl_scan_begin();
  for (uint k = ab.x; k < ab.y; ++k) {
    gt0[k] = s.W;
    gw[k] = dl_scan_step_gap(&s, weights[k], t_ends[k] - t_starts[k], k > ab.x ? t_starts[k] - t_ends[k - 1] : 0.0f);
  }
  DlRevScan rev = dl_rev_begin();
  for (uint j = ab.y; j > ab.x; --j) {
    const uint k = j - 1;
    const float wk = weights[k];
    const float delta = t_ends[k] - t_starts[k];
    float B, W_after;
    dl_rev_step_gap(&rev, wk, delta, k + 1 < ab.y ? t_starts[k + 1] - t_ends[k] : 0.0f, &B, &W_after);
    const float gm = dl_grad_m(wk, gt0[k], W_after);
    gw[k] = gl * dl_grad_w(wk, delta, gw[k], B);
    gt0[k] = gl * dl_grad_start(gm, wk);
    grad_t_ends[k] = gl * dl_grad_end(gm, wk);
  }
}
