// The per-ray bodies of the render kernels, one SIMD group (kRpLanes threads) per ray: VolumeRender and
// DistortionLoss (metal_kernels/render.metal, rays of S samples) and their packed variants
// (metal_kernels/render_packed.metal, ragged rays). Metal only (SIMD-group functions); per-sample math:
// csrc/shared/render_math.h, included first.
//
// A ray is its samples [a, b) of the flat sample arrays (densities, colors [k * C + c], weights, ...) and the
// pointers ts, te with sample k's interval [ts[k], te[k]]. Packed rays: t_starts, t_ends. Dense rays (ray r of
// t [R, S + 1], samples k = r S + i): ts = t + r, te = t + r + 1, since t[r (S + 1) + i] = ts[k] and te[k] = t[...+ 1].
// Likewise a dense ray's edge gradients gt [R, S + 1]: dL/d(start of k) lands at (gt + r)[k], dL/d(end of k) at
// (gt + r + 1)[k], the same element as the start of k + 1; the backward bodies sum the two there (RpEdgeGrads).
//
// Layout: lane l takes the samples k = a + l, a + l + 32, ...: chunk c is the samples [a + 32 c, a + 32 c + 32), so a
// load instruction of the group reads 32 consecutive floats. Every lane of the SIMD group reaches every SIMD-group
// call (a ray's control flow is uniform). Running sums along the ray (the optical depth cum in front of a sample, the
// distortion loss's W and A forward, the suffix sums of the gradients backward) are SIMD-group prefix sums within a
// chunk plus a carry from the chunks before it (backward: after it): the terms of the serial scans of
// render_math.h, added in another order, so they agree with them (and the CPU kernels) to rounding.
// The volume render's stop is the serial one: the first sample with T < threshold (a ballot per chunk); the
// transmittance after the ray is exp(-cum) at its end (the carry past the last chunk), or T at the stop.
// The gradient bodies keep per-sample scan values in their outputs between a forward and a reverse pass over the
// chunks; each such value is written and read back by the same lane (RpEdgeGrads.scratch).
#pragma once

enum : uint {
  kRpLanes = kVrpLanes,   // threads per ray (render_math.h)
  kRpChannelsPerPass = 4,  // colour channels a lane accumulates per pass over its samples (4 stores)
};

struct RpRay {
  device const float* ts;  // ts[k]: start of sample k
  device const float* te;  // te[k]: its end
  uint2 ab;                // the samples [ab.x, ab.y)
};

TFMO_FN device const float* rp_background_row(device const float* bg, uint mode, uint C, uint r) {
  return mode == 2u ? bg + ulong(r) * C : bg;
}

// Sample validity of a ray (csrc/cpu/render_packed_cpu.cc: RaySamplesInvalid; a dense ray's intervals touch, so only
// a density < 0 or t decreasing can fail there), checked by the ray's SIMD group.
TFMO_FN bool rp_ray_invalid(device const float* sg, RpRay ray, bool check_density, uint lane) {
  bool bad = false;
  for (uint k = ray.ab.x + lane; k < ray.ab.y; k += kRpLanes) {
    const float delta = ray.te[k] - ray.ts[k];
    bad = bad || (check_density ? vr_sample_invalid(sg[k], delta) : delta < 0.0f) ||
          (k > ray.ab.x && vr_overlaps(ray.te[k - 1], ray.ts[k]));
  }
  return simd_any(bad);
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

// Where a backward body writes the gradients of the interval edges. Packed rays: start and end of each sample in
// arrays of their own. Dense rays (merged): one array holding both, the end of k and the start of k + 1 being one
// element: the lane of k writes end_k + start_{k+1} (the next lane's start, or the carry from the chunk after this
// one: 0 after the ray's last or stop sample), and the ray's first start is written last (rp_edges_finish). So each
// element is written once, by one lane. scratch[k]: a per-sample value the distortion loss keeps between its passes,
// in the element the lane of k writes last (packed: starts[k]; merged: ends[k]).
struct RpEdgeGrads {
  device float* starts;   // starts[k]
  device float* ends;     // ends[k]
  device float* scratch;  // scratch[k]
  bool merged;            // dense: ends == starts + 1 (one array)
  float carry;            // merged: the start gradient of the first sample of the chunk after the current one
};

TFMO_FN RpEdgeGrads rp_edges_packed(device float* starts, device float* ends) {
  RpEdgeGrads e;
  e.starts = starts;
  e.ends = ends;
  e.scratch = starts;
  e.merged = false;
  e.carry = 0.0f;
  return e;
}

// Ray r of a dense t gradient gt [R, S + 1] (see the header comment).
TFMO_FN RpEdgeGrads rp_edges_merged(device float* gt, uint r) {
  RpEdgeGrads e;
  e.starts = gt + r;
  e.ends = gt + r + 1u;
  e.scratch = e.ends;
  e.merged = true;
  e.carry = 0.0f;
  return e;
}

// One chunk's edge gradients, last chunk first, called by every lane (`in`: its sample k has gradients).
TFMO_FN void rp_edges_store(thread RpEdgeGrads* e, uint k, bool in, float start, float end, uint lane) {
  if (!e->merged) {
    if (in) {
      e->starts[k] = start;
      e->ends[k] = end;
    }
    return;
  }
  float next = simd_shuffle_down(start, ushort(1));
  if (lane == kRpLanes - 1u) next = e->carry;
  e->carry = simd_broadcast(start, ushort(0));
  if (in) e->ends[k] = end + next;
}

// Zero gradients for sample k after the stop (merged: its end element only; the stop sample's start element is
// the end of the sample before it).
TFMO_FN void rp_edges_zero(thread const RpEdgeGrads* e, uint k) {
  if (!e->merged) e->starts[k] = 0.0f;
  e->ends[k] = 0.0f;
}

// After the last rp_edges_store of a ray (or none): its first sample's start gradient (merged).
TFMO_FN void rp_edges_finish(thread const RpEdgeGrads* e, uint a, uint lane) {
  if (e->merged && lane == 0u) e->starts[a] = e->carry;
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

// The volume render of one valid ray: weights_out[k] for its samples, col[0, C) (b: its background row, read when
// bg_mode != 0), *depth and *opacity.
TFMO_FN void rp_volume_render_ray(device const float* densities, device const float* colors, RpRay ray,
                                  device const float* b, uint bg_mode, uint C, float threshold,
                                  device float* weights_out, device float* col, device float* depth,
                                  device float* opacity, uint lane) {
  const uint2 ab = ray.ab;
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
      t0 = ray.ts[k];
      t1 = ray.te[k];
      s.tau = vr_tau(densities[k], t1 - t0);
      device const float* cp = colors + ulong(k) * C;
      for (uint j = 0; j < kRpChannelsPerPass; ++j)
        if (j < C) ck[j] = cp[j];
    }
    const uint stop = rp_vr_scan_chunk(in, threshold, &carry, &s);
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
    rp_vr_store_channel(col, b, bg_mode, fin.T, C, c0, acc[0], lane);
    rp_vr_store_channel(col, b, bg_mode, fin.T, C, c0 + 1u, acc[1], lane);
    rp_vr_store_channel(col, b, bg_mode, fin.T, C, c0 + 2u, acc[2], lane);
    rp_vr_store_channel(col, b, bg_mode, fin.T, C, c0 + 3u, acc[3], lane);
  }
  dep = simd_sum(dep);
  if (lane == 0) {
    *depth = dep;
    *opacity = vr_opacity(fin);
  }
}

// The volume render's gradients for one valid ray: gs[k] (dL/d density; holds cum_k between the passes), the
// colour gradients grad_colors[k * C + c], the edges' (RpEdgeGrads) and gbg[0, C) (dL/d background row).
// gcr: dL/d colour [C] of the ray; g_depth, g_opac its depth and opacity gradients; grad_weights[k].
TFMO_FN void rp_volume_render_grad_ray(device const float* densities, device const float* colors, RpRay ray,
                                       device const float* b, uint bg_mode, uint C, float threshold,
                                       device const float* gcr, float g_depth, float g_opac,
                                       device const float* grad_weights, device float* gs, device float* grad_colors,
                                       RpEdgeGrads eg, device float* gbg, uint lane) {
  const uint2 ab = ray.ab;
  // Pass 1: the forward scan, as in rp_volume_render_ray; gs[k] = cum_k before the stop n.
  float carry = 0.0f, cum_final = 0.0f;
  uint n = ab.y;
  for (uint base = ab.x; base < ab.y && n == ab.y; base += kRpLanes) {
    const uint k = base + lane;
    const bool in = k < ab.y;
    VrpScanLane s;
    s.tau = in ? vr_tau(densities[k], ray.te[k] - ray.ts[k]) : 0.0f;
    const uint stop = rp_vr_scan_chunk(in, threshold, &carry, &s);
    if (in && lane < stop) gs[k] = s.cum;
    if (stop < kRpLanes) {
      n = base + stop;
      cum_final = simd_broadcast(s.cum, ushort(stop));
    }
  }
  if (n == ab.y) cum_final = carry;
  const float T_final = tfmo_exp(-cum_final);
  float bdot = 0.0f;
  if (bg_mode != 0u)
    for (uint c = 0; c < C; ++c) bdot += gcr[c] * b[c];
  for (uint c = lane; c < C; c += kRpLanes) gbg[c] = T_final * gcr[c];
  const float tail = T_final * bdot;
  // Samples from the stop on: no gradient.
  for (uint k = n + lane; k < ab.y; k += kRpLanes) {
    gs[k] = 0.0f;
    rp_edges_zero(&eg, k);
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
      t0 = ray.ts[k];
      t1 = ray.te[k];
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
    float g_start = 0.0f, g_end = 0.0f;
    if (in) {
      const float gtau = vr_grad_tau(tfmo_exp(-cum_next), v, suffix + after, tail);
      gs[k] = (t1 - t0) * gtau;
      const float sgt = sigma * gtau;
      g_start = vr_grad_start(sgt, g_depth, wk);
      g_end = vr_grad_end(sgt, g_depth, wk);
    }
    rp_edges_store(&eg, k, in, g_start, g_end, lane);
    suffix += simd_broadcast(after + wv, ushort(0));
  }
  rp_edges_finish(&eg, ab.x, lane);
}

// m_k - m_{k-1} for lane's sample k (`in`: k < b) of the ray, as dl_scan_step_gap takes it (the first sample:
// prev_delta and gap 0); 0 for lanes past the ray.
TFMO_FN float rp_dl_mid_step_before(RpRay ray, uint k, bool in, float delta) {
  if (!in) return 0.0f;
  device const float* ts = ray.ts;
  device const float* te = ray.te;
  return k > ray.ab.x ? dl_mid_step(te[k - 1] - ts[k - 1], delta, ts[k] - te[k - 1]) : dl_mid_step(0.0f, delta, 0.0f);
}

// m_{k+1} - m_k, as dl_rev_step_gap takes it (the last sample: next_delta and next_gap 0); 0 past the ray.
TFMO_FN float rp_dl_mid_step_after(RpRay ray, uint k, bool in, float delta) {
  if (!in) return 0.0f;
  device const float* ts = ray.ts;
  device const float* te = ray.te;
  return k + 1u < ray.ab.y ? dl_mid_step(delta, te[k + 1] - ts[k + 1], ts[k + 1] - te[k])
                           : dl_mid_step(delta, 0.0f, 0.0f);
}

// One chunk of the distortion loss's forward scan, lane's sample k (`in`: k < b): its weight, interval length,
// W_{<k} = *W_c + the chunk's exclusive prefix sum of w and A_k = *A_c + the chunk's inclusive prefix sum of
// W_{<j} (m_j - m_{j-1}) (the recurrence of dl_scan_step_gap, whose terms are >= 0); moves the carries *W_c, *A_c
// (uniform) past the chunk.
struct DlpScanLane {
  float w, delta, W_before, A;
};
TFMO_FN DlpScanLane rp_dl_scan_chunk(device const float* weights, RpRay ray, uint k, bool in, thread float* W_c,
                                     thread float* A_c) {
  DlpScanLane s;
  s.w = in ? weights[k] : 0.0f;
  s.delta = in ? ray.te[k] - ray.ts[k] : 0.0f;
  const float dm = rp_dl_mid_step_before(ray, k, in, s.delta);
  const float w_excl = simd_prefix_exclusive_sum(s.w);
  s.W_before = *W_c + w_excl;
  const float a_incl = simd_prefix_inclusive_sum(s.W_before * dm);
  s.A = *A_c + a_incl;
  *W_c += simd_broadcast(w_excl + s.w, ushort(kRpLanes - 1u));
  *A_c += simd_broadcast(a_incl, ushort(kRpLanes - 1u));
  return s;
}

// The distortion loss of one valid ray.
TFMO_FN float rp_distortion_loss_ray(device const float* weights, RpRay ray, uint lane) {
  float W_c = 0.0f, A_c = 0.0f, part = 0.0f;
  for (uint base = ray.ab.x; base < ray.ab.y; base += kRpLanes) {
    const uint k = base + lane;
    const bool in = k < ray.ab.y;
    const DlpScanLane s = rp_dl_scan_chunk(weights, ray, k, in, &W_c, &A_c);
    if (in) part += dl_loss_term(s.w, s.A, s.delta);
  }
  return simd_sum(part);
}

// The distortion loss's gradients for one valid ray with upstream gradient gl: gw[k] (holds A_k between the passes)
// and the edges' (RpEdgeGrads; eg.scratch[k] holds W_{<k} between the passes).
TFMO_FN void rp_distortion_loss_grad_ray(device const float* weights, RpRay ray, float gl, device float* gw,
                                         RpEdgeGrads eg, uint lane) {
  const uint2 ab = ray.ab;
  device float* gt0 = eg.scratch;
  // Pass 1, chunks first to last: W_{<k} and A_k as in rp_distortion_loss_ray.
  float W_c = 0.0f, A_c = 0.0f;
  for (uint base = ab.x; base < ab.y; base += kRpLanes) {
    const uint k = base + lane;
    const bool in = k < ab.y;
    const DlpScanLane s = rp_dl_scan_chunk(weights, ray, k, in, &W_c, &A_c);
    if (in) {
      gt0[k] = s.W_before;
      gw[k] = s.A;
    }
  }
  // Pass 2, chunks last to first (the recurrence of dl_rev_step_gap): W_{>k} = W_c + the chunk's exclusive suffix
  // sum of w; B_k = B_c + the chunk's inclusive suffix sum of W_{>j} (m_{j+1} - m_j).
  W_c = 0.0f;
  float B_c = 0.0f;
  for (uint c = (ab.y - ab.x + kRpLanes - 1u) / kRpLanes; c > 0; --c) {
    const uint k = ab.x + (c - 1u) * kRpLanes + lane;
    const bool in = k < ab.y;
    const float wk = in ? weights[k] : 0.0f;
    const float delta = in ? ray.te[k] - ray.ts[k] : 0.0f;
    const float dm = rp_dl_mid_step_after(ray, k, in, delta);
    const float W_before = in ? gt0[k] : 0.0f, A = in ? gw[k] : 0.0f;
    const float w_after = rp_suffix_exclusive_sum(wk, lane);
    const float W_after = W_c + w_after;
    const float b_incl = rp_suffix_inclusive_sum(W_after * dm, lane);
    float g_start = 0.0f, g_end = 0.0f;
    if (in) {
      const float B = B_c + b_incl;
      const float gm = dl_grad_m(wk, W_before, W_after);
      gw[k] = gl * dl_grad_w(wk, delta, A, B);
      g_start = gl * dl_grad_start(gm, wk);
      g_end = gl * dl_grad_end(gm, wk);
    }
    rp_edges_store(&eg, k, in, g_start, g_end, lane);
    W_c += simd_broadcast(w_after + wk, ushort(0));
    B_c += simd_broadcast(b_incl, ushort(0));
  }
  rp_edges_finish(&eg, ab.x, lane);
}
