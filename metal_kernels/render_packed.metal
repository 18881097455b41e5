// Metal kernels of VolumeRenderPacked / DistortionLossPacked and their gradients (semantics:
// csrc/ops/render_packed_op.cc; math: csrc/shared/render_math.h; host: csrc/gpu/render_packed_gpu.cc).
// Offsets are 64-bit.
//
// Layout of the four ray kernels: one SIMD group (32 threads) per ray. The host dispatches 32 R threads in
// threadgroups of a multiple of 32 threads, so SIMD group r (thread_position_in_grid / 32) is ray r; every lane of it
// reaches every SIMD-group call (the ray's control flow is uniform). Lane l takes the samples k = a + l, a + l + 32,
// ... of the ray's range [a, b): chunk c is the samples [a + 32 c, a + 32 c + 32), so a load instruction of the
// group reads 32 consecutive floats. Running sums along the ray (the optical depth cum in front of a sample, the
// distortion loss's W and A forward, the suffix sums of the gradients backward) are SIMD-group prefix sums within a
// chunk plus a carry from the chunks before it (backward: after it): the terms of the serial scans of
// render_math.h, added in another order, so they agree with them (and the CPU kernels) to rounding.
// The volume render's stop is the serial one: the first sample with T < threshold (a ballot per chunk); the
// transmittance after the ray is exp(-cum) at its end (the carry past the last chunk), or T at the stop.
// The gradient kernels keep per-sample scan values in their outputs between a forward and a reverse pass over the
// chunks; each such value is written and read back by the same lane.
//
// NaN policy (a GPU kernel cannot fail the op; never an out-of-bounds access, whatever the input holds):
//  - row_splits: render_packed_check_init + render_packed_check_splits run first and set status[0] = 1 unless
//    row_splits[0] = 0, row_splits[r] <= row_splits[r+1] and row_splits[R] = N. With status set, every output of the
//    call is NaN: the SIMD group of ray r writes its ray's outputs and the per-sample outputs k = r, r + R, r + 2R,
//    ... < N. Independently, each ray clamps its range to 0 <= a <= b <= N before reading samples.
//  - samples (a density < 0, t_ends < t_starts, or overlapping its predecessor): every output of that ray (and its
//    gradients, including those of its samples) is NaN. NaN inputs propagate.
// For an empty tensor the host binds a one-element scratch buffer in its place; it is never read or written.
//
// render_packed_check_init:       status(0); 1 thread
// render_packed_check_splits:     row_splits(0) status(1) params(2); R + 1 threads
// The ray kernels below: 32 R threads.
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

enum : uint {
  kRpLanes = kVrpLanes,  // threads per ray (render_math.h)
  kRpChannelsPerPass = 4,         // colour channels a lane accumulates per pass over its samples (4 stores)
};

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
TFMO_FN uint2 rp_ray_range(device const int* row_splits, uint r, uint N) {
  const int n = int(N);  // the host guarantees N < 2^31
  const int a = clamp(row_splits[r], 0, n);
  const int b = clamp(row_splits[r + 1], a, n);
  return uint2(uint(a), uint(b));
}

// Sample validity of a ray (csrc/cpu/render_packed_cpu.cc: RaySamplesInvalid), checked by the ray's SIMD group.
TFMO_FN bool rp_ray_invalid(device const float* sg, device const float* ts, device const float* te, uint2 ab,
                           bool check_density, uint lane) {
  bool bad = false;
  for (uint k = ab.x + lane; k < ab.y; k += kRpLanes) {
    const float delta = te[k] - ts[k];
    bad = bad || (check_density ? vr_sample_invalid(sg[k], delta) : delta < 0.0f) ||
          (k > ab.x && vr_overlaps(te[k - 1], ts[k]));
  }
  return simd_any(bad);
}

// Samples k = first, first + step, ... < end.
struct RpNanSamples {
  ulong first, end, step;
};

// The samples whose outputs a lane sets to NaN for an invalid ray: with bad row_splits, the ray's share of every
// sample (see the NaN policy), else the ray's own samples.
TFMO_FN RpNanSamples rp_nan_samples(bool splits_bad, uint r, uint2 ab, uint R, uint N, uint lane) {
  RpNanSamples s;
  if (splits_bad) {
    s.first = ulong(r) + ulong(lane) * R;
    s.end = N;
    s.step = ulong(kRpLanes) * R;
  } else {
    s.first = ulong(ab.x) + lane;
    s.end = ab.y;
    s.step = kRpLanes;
  }
  return s;
}

TFMO_FN device const float* rp_background_row(device const float* bg, uint mode, uint C, uint r) {
  return mode == 2u ? bg + ulong(r) * C : bg;
}

// x summed over the lanes after this one (exclusive) or from this one on (inclusive), in lane order from the
// SIMD group's end: the suffix sums of a reverse scan over a chunk.
TFMO_FN float rp_suffix_exclusive_sum(float x, uint lane) {
  const ushort mirror = ushort(kRpLanes - 1u - lane);
  return simd_shuffle(simd_prefix_exclusive_sum(simd_shuffle(x, mirror)), mirror);
}
TFMO_FN float rp_suffix_inclusive_sum(float x, uint lane) {
  const ushort mirror = ushort(kRpLanes - 1u - lane);
  return simd_shuffle(simd_prefix_inclusive_sum(simd_shuffle(x, mirror)), mirror);
}

// One chunk of the volume render's forward scan, lane's sample k (`in`: k < b) with s->tau = tau_k (0 when !in).
// *carry is cum in front of the chunk (uniform); the lane gets cum_k = *carry + the chunk's exclusive prefix sum of
// tau and T_k = exp(-cum_k), and *carry moves past the chunk (carry + the chunk's sum: cum at the next chunk's first
// sample, or after the ray's last one). Returns the stop's lane: the first lane whose sample has T_k < threshold
// (vr_terminated), kRpLanes when none. The callers load a chunk's samples before its scan, so that the loads of a
// chunk are in flight together.
struct VrpScanLane {
  float tau, cum, T;
};
TFMO_FN uint rp_vr_scan_chunk(bool in, float threshold, thread float* carry, thread VrpScanLane* s) {
  const float excl = simd_prefix_exclusive_sum(s->tau);
  s->cum = *carry + excl;
  s->T = tfmo_exp(-s->cum);
  VrScan st;
  st.cum = s->cum;
  st.T = s->T;
  const uint stops = uint((simd_vote::vote_t)simd_ballot(in && vr_terminated(st, threshold)));
  *carry += simd_broadcast(excl + s->tau, ushort(kRpLanes - 1u));
  return stops == 0u ? kRpLanes : ctz(stops);
}

// Channel c (< C: uniform) of a ray's colour from the lanes' partial sums: sum_k w_k c_kc + T_final bg_c.
TFMO_FN void rp_vr_store_channel(device float* col, device const float* bg, uint bg_mode, float T_final, uint C, uint c,
                                float part, uint lane) {
  if (c >= C) return;
  const float sum = simd_sum(part);
  if (lane == 0) col[c] = bg_mode != 0u ? sum + T_final * bg[c] : sum;
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
                                         uint gid [[thread_position_in_grid]],
                                         uint lane [[thread_index_in_simdgroup]]) {
  const uint r = gid / kRpLanes;
  if (r >= p.R) return;  // whole SIMD groups
  const uint C = p.C;
  device float* col = color_out + ulong(r) * C;
  const bool splits_bad = status[0] != 0;
  const uint2 ab = splits_bad ? uint2(0, 0) : rp_ray_range(row_splits, r, p.N);
  if (splits_bad || rp_ray_invalid(densities, t_starts, t_ends, ab, true, lane)) {
    for (uint c = lane; c < C; c += kRpLanes) col[c] = vr_nan();
    if (lane == 0) {
      depth_out[r] = vr_nan();
      opacity_out[r] = vr_nan();
    }
    const RpNanSamples ns = rp_nan_samples(splits_bad, r, ab, p.R, p.N, lane);
    for (ulong k = ns.first; k < ns.end; k += ns.step) weights_out[k] = vr_nan();
    return;
  }
  // The scan: weights, depth and the first channels of colour, per lane; n = the stop (b when none).
  float acc[kRpChannelsPerPass] = {0.0f, 0.0f, 0.0f, 0.0f};
  float dep = 0.0f, carry = 0.0f, cum_final = 0.0f;
  uint n = ab.y;
  for (uint base = ab.x; base < ab.y && n == ab.y; base += kRpLanes) {
    const uint k = base + lane;
    const bool in = k < ab.y;
    float t0 = 0.0f, t1 = 0.0f, ck[kRpChannelsPerPass] = {0.0f, 0.0f, 0.0f, 0.0f};
    VrpScanLane s;
    s.tau = 0.0f;
    if (in) {
      t0 = t_starts[k];
      t1 = t_ends[k];
      s.tau = vr_tau(densities[k], t1 - t0);
      device const float* cp = colors + ulong(k) * C;
      for (uint j = 0; j < kRpChannelsPerPass; ++j)
        if (j < C) ck[j] = cp[j];
    }
    const uint stop = rp_vr_scan_chunk(in, p.threshold, &carry, &s);
    if (in && lane < stop) {
      const float wk = vr_weight(s.T, s.tau);
      weights_out[k] = wk;
      dep += wk * vr_mid(t0, t1);
      for (uint j = 0; j < kRpChannelsPerPass; ++j) acc[j] += wk * ck[j];
    }
    if (stop < kRpLanes) {
      n = base + stop;
      cum_final = simd_broadcast(s.cum, ushort(stop));
    }
  }
  if (n == ab.y) cum_final = carry;
  for (uint k = n + lane; k < ab.y; k += kRpLanes) weights_out[k] = 0.0f;  // from the stop on
  VrScan fin;
  fin.cum = cum_final;
  fin.T = tfmo_exp(-cum_final);
  device const float* b = p.bg_mode != 0u ? rp_background_row(background, p.bg_mode, C, r) : background;
  for (uint c0 = 0; c0 < C; c0 += kRpChannelsPerPass) {
    if (c0 > 0) {  // channels c0.. from the weights this lane wrote
      for (uint j = 0; j < kRpChannelsPerPass; ++j) acc[j] = 0.0f;
      for (uint k = ab.x + lane; k < n; k += kRpLanes) {
        const float wk = weights_out[k];
        device const float* ck = colors + ulong(k) * C + c0;
        for (uint j = 0; j < kRpChannelsPerPass; ++j)
          if (c0 + j < C) acc[j] += wk * ck[j];
      }
    }
    rp_vr_store_channel(col, b, p.bg_mode, fin.T, C, c0, acc[0], lane);
    rp_vr_store_channel(col, b, p.bg_mode, fin.T, C, c0 + 1u, acc[1], lane);
    rp_vr_store_channel(col, b, p.bg_mode, fin.T, C, c0 + 2u, acc[2], lane);
    rp_vr_store_channel(col, b, p.bg_mode, fin.T, C, c0 + 3u, acc[3], lane);
  }
  dep = simd_sum(dep);
  if (lane == 0) {
    depth_out[r] = dep;
    opacity_out[r] = vr_opacity(fin);
  }
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
                                          uint gid [[thread_position_in_grid]],
                                          uint lane [[thread_index_in_simdgroup]]) {
  const uint r = gid / kRpLanes;
  if (r >= p.R) return;  // whole SIMD groups
  const uint C = p.C;
  device const float* gcr = grad_color + ulong(r) * C;
  device float* gbg = grad_background + ulong(r) * C;
  device float* gs = grad_densities;  // gs[k] holds cum_k between the two passes
  const bool splits_bad = status[0] != 0;
  const uint2 ab = splits_bad ? uint2(0, 0) : rp_ray_range(row_splits, r, p.N);
  if (splits_bad || rp_ray_invalid(densities, t_starts, t_ends, ab, true, lane)) {
    for (uint c = lane; c < C; c += kRpLanes) gbg[c] = vr_nan();
    const RpNanSamples ns = rp_nan_samples(splits_bad, r, ab, p.R, p.N, lane);
    for (ulong k = ns.first; k < ns.end; k += ns.step) {
      gs[k] = vr_nan();
      grad_t_starts[k] = vr_nan();
      grad_t_ends[k] = vr_nan();
      for (uint c = 0; c < C; ++c) grad_colors[k * C + c] = vr_nan();
    }
    return;
  }
  // Pass 1: the forward scan, as in volume_render_packed_forward; gs[k] = cum_k before the stop n.
  float carry = 0.0f, cum_final = 0.0f;
  uint n = ab.y;
  for (uint base = ab.x; base < ab.y && n == ab.y; base += kRpLanes) {
    const uint k = base + lane;
    const bool in = k < ab.y;
    VrpScanLane s;
    s.tau = in ? vr_tau(densities[k], t_ends[k] - t_starts[k]) : 0.0f;
    const uint stop = rp_vr_scan_chunk(in, p.threshold, &carry, &s);
    if (in && lane < stop) gs[k] = s.cum;
    if (stop < kRpLanes) {
      n = base + stop;
      cum_final = simd_broadcast(s.cum, ushort(stop));
    }
  }
  if (n == ab.y) cum_final = carry;
  const float T_final = tfmo_exp(-cum_final);
  float bdot = 0.0f;
  if (p.bg_mode != 0u) {
    device const float* b = rp_background_row(background, p.bg_mode, C, r);
    for (uint c = 0; c < C; ++c) bdot += gcr[c] * b[c];
  }
  for (uint c = lane; c < C; c += kRpLanes) gbg[c] = T_final * gcr[c];
  const float tail = T_final * bdot;
  const float g_depth = grad_depth[r], g_opac = grad_opacity[r];
  // Samples from the stop on: no gradient.
  for (uint k = n + lane; k < ab.y; k += kRpLanes) {
    gs[k] = 0.0f;
    grad_t_starts[k] = 0.0f;
    grad_t_ends[k] = 0.0f;
    for (uint c = 0; c < C; ++c) grad_colors[ulong(k) * C + c] = 0.0f;
  }
  // Pass 2: the chunks before the stop, last to first. cum_above = cum in front of the first sample of the chunk
  // after this one (at the stop, or after the ray, for the last chunk); suffix = sum_{j > chunk} w_j v_j.
  float cum_above = cum_final, suffix = 0.0f;
  for (uint c = (n - ab.x + kRpLanes - 1u) / kRpLanes; c > 0; --c) {
    const uint k = ab.x + (c - 1u) * kRpLanes + lane;
    const bool in = k < n;
    float cum = cum_above, sigma = 0.0f, t0 = 0.0f, t1 = 0.0f, wk = 0.0f, v = 0.0f;
    if (in) {
      cum = gs[k];
      sigma = densities[k];
      t0 = t_starts[k];
      t1 = t_ends[k];
      wk = vr_weight(tfmo_exp(-cum), vr_tau(sigma, t1 - t0));
      device const float* ck = colors + ulong(k) * C;
      device float* gck = grad_colors + ulong(k) * C;
      v = g_depth * vr_mid(t0, t1) + g_opac + grad_weights[k];
      for (uint ch = 0; ch < C; ++ch) {
        v += gcr[ch] * ck[ch];
        gck[ch] = wk * gcr[ch];
      }
    }
    float cum_next = simd_shuffle_down(cum, ushort(1));  // cum_{k+1}
    if (lane == kRpLanes - 1u) cum_next = cum_above;
    cum_above = simd_broadcast(cum, ushort(0));
    const float wv = wk * v;
    const float after = rp_suffix_exclusive_sum(wv, lane);  // sum over this chunk's samples after k
    if (in) {
      const float gtau = vr_grad_tau(tfmo_exp(-cum_next), v, suffix + after, tail);
      gs[k] = (t1 - t0) * gtau;
      const float sgt = sigma * gtau;
      grad_t_starts[k] = vr_grad_start(sgt, g_depth, wk);
      grad_t_ends[k] = vr_grad_end(sgt, g_depth, wk);
    }
    suffix += simd_broadcast(after + wv, ushort(0));
  }
}

// m_k - m_{k-1} for lane's sample k (`in`: k < b) of the ray [a, b), as dl_scan_step_gap takes it (the first
// sample: prev_delta and gap 0); 0 for lanes past the ray.
TFMO_FN float rp_dl_mid_step_before(device const float* ts, device const float* te, uint2 ab, uint k, bool in,
                                   float delta) {
  if (!in) return 0.0f;
  return k > ab.x ? dl_mid_step(te[k - 1] - ts[k - 1], delta, ts[k] - te[k - 1]) : dl_mid_step(0.0f, delta, 0.0f);
}

// m_{k+1} - m_k, as dl_rev_step_gap takes it (the last sample: next_delta and next_gap 0); 0 past the ray.
TFMO_FN float rp_dl_mid_step_after(device const float* ts, device const float* te, uint2 ab, uint k, bool in,
                                  float delta) {
  if (!in) return 0.0f;
  return k + 1u < ab.y ? dl_mid_step(delta, te[k + 1] - ts[k + 1], ts[k + 1] - te[k]) : dl_mid_step(delta, 0.0f, 0.0f);
}

kernel void distortion_loss_packed_forward(device const float* weights [[buffer(0)]],
                                           device const float* t_starts [[buffer(1)]],
                                           device const float* t_ends [[buffer(2)]],
                                           device const int* row_splits [[buffer(3)]],
                                           device const int* status [[buffer(4)]],
                                           device float* loss [[buffer(5)]],
                                           constant DlpParams& p [[buffer(6)]],
                                           uint gid [[thread_position_in_grid]],
                                           uint lane [[thread_index_in_simdgroup]]) {
  const uint r = gid / kRpLanes;
  if (r >= p.R) return;  // whole SIMD groups
  const bool splits_bad = status[0] != 0;
  const uint2 ab = splits_bad ? uint2(0, 0) : rp_ray_range(row_splits, r, p.N);
  if (splits_bad || rp_ray_invalid(weights, t_starts, t_ends, ab, false, lane)) {
    if (lane == 0) loss[r] = vr_nan();
    return;
  }
  // W_{<k} = W_c + the chunk's exclusive prefix sum of w; A_k = A_c + the chunk's inclusive prefix sum of
  // W_{<j} (m_j - m_{j-1}) (the recurrence of dl_scan_step_gap, whose terms are >= 0).
  float W_c = 0.0f, A_c = 0.0f, part = 0.0f;
  for (uint base = ab.x; base < ab.y; base += kRpLanes) {
    const uint k = base + lane;
    const bool in = k < ab.y;
    const float wk = in ? weights[k] : 0.0f;
    const float delta = in ? t_ends[k] - t_starts[k] : 0.0f;
    const float dm = rp_dl_mid_step_before(t_starts, t_ends, ab, k, in, delta);
    const float w_excl = simd_prefix_exclusive_sum(wk);
    const float a_incl = simd_prefix_inclusive_sum((W_c + w_excl) * dm);
    const float A = A_c + a_incl;
    if (in) part += dl_loss_term(wk, A, delta);
    W_c += simd_broadcast(w_excl + wk, ushort(kRpLanes - 1u));
    A_c += simd_broadcast(a_incl, ushort(kRpLanes - 1u));
  }
  part = simd_sum(part);
  if (lane == 0) loss[r] = part;
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
                                            uint gid [[thread_position_in_grid]],
                                            uint lane [[thread_index_in_simdgroup]]) {
  const uint r = gid / kRpLanes;
  if (r >= p.R) return;  // whole SIMD groups
  const bool splits_bad = status[0] != 0;
  const uint2 ab = splits_bad ? uint2(0, 0) : rp_ray_range(row_splits, r, p.N);
  if (splits_bad || rp_ray_invalid(weights, t_starts, t_ends, ab, false, lane)) {
    const RpNanSamples ns = rp_nan_samples(splits_bad, r, ab, p.R, p.N, lane);
    for (ulong k = ns.first; k < ns.end; k += ns.step) {
      grad_weights[k] = vr_nan();
      grad_t_starts[k] = vr_nan();
      grad_t_ends[k] = vr_nan();
    }
    return;
  }
  const float gl = grad_loss[r];
  device float* gw = grad_weights;    // holds A_k between the passes
  device float* gt0 = grad_t_starts;  // holds W_{<k} between the passes
  // Pass 1, chunks first to last: W_{<k} and A_k as in distortion_loss_packed_forward.
  float W_c = 0.0f, A_c = 0.0f;
  for (uint base = ab.x; base < ab.y; base += kRpLanes) {
    const uint k = base + lane;
    const bool in = k < ab.y;
    const float wk = in ? weights[k] : 0.0f;
    const float delta = in ? t_ends[k] - t_starts[k] : 0.0f;
    const float dm = rp_dl_mid_step_before(t_starts, t_ends, ab, k, in, delta);
    const float w_excl = simd_prefix_exclusive_sum(wk);
    const float W_before = W_c + w_excl;
    const float a_incl = simd_prefix_inclusive_sum(W_before * dm);
    if (in) {
      gt0[k] = W_before;
      gw[k] = A_c + a_incl;
    }
    W_c += simd_broadcast(w_excl + wk, ushort(kRpLanes - 1u));
    A_c += simd_broadcast(a_incl, ushort(kRpLanes - 1u));
  }
  // Pass 2, chunks last to first (the recurrence of dl_rev_step_gap): W_{>k} = W_c + the chunk's exclusive suffix
  // sum of w; B_k = B_c + the chunk's inclusive suffix sum of W_{>j} (m_{j+1} - m_j).
  W_c = 0.0f;
  float B_c = 0.0f;
  for (uint c = (ab.y - ab.x + kRpLanes - 1u) / kRpLanes; c > 0; --c) {
    const uint k = ab.x + (c - 1u) * kRpLanes + lane;
    const bool in = k < ab.y;
    const float wk = in ? weights[k] : 0.0f;
    const float delta = in ? t_ends[k] - t_starts[k] : 0.0f;
    const float dm = rp_dl_mid_step_after(t_starts, t_ends, ab, k, in, delta);
    const float W_before = in ? gt0[k] : 0.0f, A = in ? gw[k] : 0.0f;
    const float w_after = rp_suffix_exclusive_sum(wk, lane);
    const float W_after = W_c + w_after;
    const float b_incl = rp_suffix_inclusive_sum(W_after * dm, lane);
    if (in) {
      const float B = B_c + b_incl;
      const float gm = dl_grad_m(wk, W_before, W_after);
      gw[k] = gl * dl_grad_w(wk, delta, A, B);
      gt0[k] = gl * dl_grad_start(gm, wk);
      grad_t_ends[k] = gl * dl_grad_end(gm, wk);
    }
    W_c += simd_broadcast(w_after + wk, ushort(0));
    B_c += simd_broadcast(b_incl, ushort(0));
  }
}
