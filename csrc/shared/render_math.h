// Per-sample math of the NeRF rendering ops (VolumeRender, DistortionLoss and their gradients), shared by the
// CPU kernels (csrc/cpu/*_cpu.cc) and the Metal kernels (metal_kernels/*.metal). Rules: device_compat.h.
// The per-ray loops live in the kernels (they read device memory). The Metal kernels and the CPU DistortionLoss
// kernels run these functions as they are; the CPU VolumeRender and VolumeRenderPacked kernels run the same formulas
// on arrays (csrc/cpu/render_cpu_isa.h: vectorised exp; VolumeRender's running sums in four interleaved
// chains), so CPU and GPU agree to rounding, not bitwise.
//
// Conventions (both ops):
//  - A ray has S samples; sample i covers the interval [t_i, t_{i+1}] of the edges t[0..S];
//    delta_i = t_{i+1} - t_i, midpoint m_i = (t_i + t_{i+1}) / 2.
//  - t must be non-decreasing along a ray (delta_i >= 0); VolumeRender also needs densities >= 0. The CPU
//    kernels reject violations with InvalidArgument; a GPU kernel cannot fail the op, so the Metal kernels
//    write NaN into every output of an offending ray (and its gradients) instead. NaN inputs propagate.
//
// VolumeRender, ray-local, with tau_i = sigma_i delta_i >= 0:
//   alpha_i = 1 - exp(-tau_i)            (a polynomial for small tau: no cancellation, exact 0 for tau = 0)
//   T_i     = exp(-sum_{j<i} tau_j)      (exp of a running sum: no product of many factors; a huge or even
//                                         infinite tau gives alpha = 1, T = 0, never NaN)
//   w_i     = T_i alpha_i
//   early termination: the ray stops before the first sample i with T_i < threshold (0 disables: T >= 0).
//   Samples from there on get w = 0 and no gradient; T_final = T at the stop (or after the last sample),
//   so opacity = 1 - T_final = sum_i w_i up to rounding.
//   colour_c = sum_i w_i c_ic + T_final bg_c;  depth = sum_i w_i m_i (not normalised);
//   opacity = 1 - T_final (= 1 - exp(-cum) through vr_alpha: accurate for tiny opacities too).
// Backward (upstream gC[c], gD, gO, gW[i]); v_i = sum_c gC_c c_ic + gD m_i + gO + gW_i, b = sum_c gC_c bg_c:
//   dL/dtau_i = T_{i+1} v_i - sum_{k>i} w_k v_k - T_final b        (reverse scan, O(S))
//   dL/dsigma_i = delta_i dL/dtau_i;  dL/dc_ic = w_i gC_c;  dL/dbg_c = T_final gC_c
//   dL/dt_j = sigma_{j-1} dL/dtau_{j-1} - sigma_j dL/dtau_j + gD (w_{j-1} + w_j) / 2   (out-of-range terms 0)
//   The stop index is treated as a constant (the function is piecewise smooth in it), as in the forward.
//
// DistortionLoss (mip-NeRF 360), per ray: L = sum_{i,j} w_i w_j |m_i - m_j| + (1/3) sum_i w_i^2 delta_i.
//   With sorted midpoints: A_k = sum_{j<k} w_j (m_k - m_j) obeys A_k = A_{k-1} + W_{<k} (m_k - m_{k-1}), and
//   L = sum_k (2 w_k A_k + w_k^2 delta_k / 3). Every term is >= 0 for w >= 0: no cancellation, and no
//   dependence on the absolute position of t (only on differences). m_k - m_{k-1} = (delta_{k-1} + delta_k) / 2.
//   Backward: B_k = sum_{j>k} w_j (m_j - m_k) by the mirrored recurrence in a reverse scan;
//   dL/dw_k = 2 (A_k + B_k) + (2/3) w_k delta_k;
//   dL/dm_k = 2 w_k (W_{<k} - W_{>k});  dL/dt_j = (dL/dm_{j-1} + dL/dm_j) / 2 + (w_{j-1}^2 - w_j^2) / 3.
//
// Packed (ragged) rays: VolumeRenderPacked / DistortionLossPacked (csrc/ops/render_packed_op.cc). Sample k has
// its own interval [s_k, e_k] (t_starts, t_ends); the samples of ray r are k in [row_splits[r], row_splits[r+1]),
// sorted and non-overlapping: s_k <= e_k <= s_{k+1} (gaps allowed). The per-sample math is the functions above:
// delta_k = e_k - s_k, m_k = vr_mid(s_k, e_k); a gap g_k = s_k - e_{k-1} >= 0 only moves midpoints apart:
// m_k - m_{k-1} = (delta_{k-1} + delta_k) / 2 + g_k (dl_*_step with gap 0 is the [R,S] recurrence, bitwise).
// Gradients w.r.t. the interval ends are per sample: with gtau_k = dL/dtau_k,
//   VolumeRender:   dL/ds_k = -sigma_k gtau_k + gD w_k / 2,  dL/de_k = sigma_k gtau_k + gD w_k / 2;
//   DistortionLoss: dL/ds_k = dL/dm_k / 2 - w_k^2 / 3,       dL/de_k = dL/dm_k / 2 + w_k^2 / 3.
// (Summing e_{j-1}'s and s_j's terms gives the [R,S] dL/dt_j.) The packed Metal kernels run one SIMD group per ray
// and evaluate the running sums along it (cum, W, A, B, the suffix sums) as SIMD-group prefix sums over chunks of 32
// samples with a carry between chunks: the same terms as the serial scans, added in another order (equal to
// rounding), and the same stop (the first sample with T < threshold). Invalid packed input on the GPU (row_splits not
// 0 = r_0 <= r_1 <= ... <= r_R = N, a sample with e < s or overlapping its predecessor, a negative density):
// see metal_kernels/render_packed.metal.
#pragma once

#include "device_compat.h"

// Kernel parameters of the Metal kernels (one struct, bound with setBytes; same layout in C++ and MSL).
struct VrParams {
  uint R, S, C;
  uint bg_mode;     // 0: none, 1: shared [C], 2: per ray [R, C] (tfmo::render::BackgroundMode)
  float threshold;  // termination_threshold
};
struct DlParams {
  uint R, S;
};
// Packed variants: N samples in total, R rays (row_splits has R + 1 entries).
struct VrpParams {
  uint R, N, C;
  uint bg_mode;
  float threshold;
};
struct DlpParams {
  uint R, N;
};
// Threads per ray of the Metal ray kernels, dense and packed (one SIMD group of an Apple GPU): the host dispatches
// kVrpLanes * R threads in threadgroups of kVrpRayGroup (8 rays; the kernels need a multiple of kVrpLanes).
enum : uint { kVrpLanes = 32, kVrpRayGroup = 8 * kVrpLanes };

// Quiet NaN: what the Metal kernels write for a ray with invalid input (see conventions).
TFMO_FN float vr_nan() {
#if defined(__METAL_VERSION__)
  return metal::as_type<float>(0x7fc00000u);
#else
  return __builtin_nanf("");
#endif
}

// ---------------------------------------------------------------------------------------------------------
// VolumeRender

// 1 - exp(-tau) for tau >= 0, given e = exp(-tau). Below 1/8 a 6-term Taylor series (relative error < 1e-9,
// exact 0 at 0); above it 1 - e loses at most ~3 bits. MSL has no expm1, hence this.
TFMO_FN float vr_alpha(float tau, float e) {
  if (tau < 0.125f) {
    return tau * (1.0f - tau * 0.5f * (1.0f - tau * (1.0f / 3.0f) *
                  (1.0f - tau * 0.25f * (1.0f - tau * 0.2f * (1.0f - tau * (1.0f / 6.0f))))));
  }
  return 1.0f - e;
}

TFMO_FN float vr_tau(float sigma, float delta) { return sigma * delta; }

TFMO_FN float vr_mid(float t0, float t1) { return 0.5f * (t0 + t1); }

// Running state of the forward scan along one ray.
struct VrScan {
  float cum;  // sum of tau over the samples composited so far
  float T;    // exp(-cum): transmittance in front of the next sample
};

TFMO_FN VrScan vr_scan_begin() {
  VrScan s;
  s.cum = 0.0f;
  s.T = 1.0f;
  return s;
}

// True when the ray stops before the next sample (threshold 0 never stops).
TFMO_FN bool vr_terminated(VrScan s, float threshold) { return s.T < threshold; }

// The weight w = T alpha of a sample with transmittance T in front of it and optical depth tau.
TFMO_FN float vr_weight(float T, float tau) { return T * vr_alpha(tau, tfmo_exp(-tau)); }

// Composites one sample (call only while !vr_terminated): returns its weight w = T alpha and advances s.
TFMO_FN float vr_scan_step(TFMO_THREAD VrScan* s, float sigma, float delta) {
  const float tau = vr_tau(sigma, delta);
  const float w = vr_weight(s->T, tau);
  s->cum += tau;
  s->T = tfmo_exp(-s->cum);
  return w;
}

// Opacity 1 - T_final = 1 - exp(-cum), accurate also when it is tiny.
TFMO_FN float vr_opacity(VrScan s) { return vr_alpha(s.cum, s.T); }

// dL/dtau_i from the transmittance behind the sample, its value v_i, the suffix sum_{k>i} w_k v_k and
// T_final * b (see the header comment).
TFMO_FN float vr_grad_tau(float T_next, float v, float suffix, float tail) { return T_next * v - suffix - tail; }

// Input validity of one sample (see conventions): densities >= 0, t non-decreasing. NaN passes (propagates).
// `|`, not `||`: no branch, so that the CPU kernels' checking loops vectorise.
TFMO_FN bool vr_sample_invalid(float sigma, float delta) { return (sigma < 0.0f) | (delta < 0.0f); }

// Packed samples: sample k overlaps its predecessor in the same ray (e_{k-1} > s_k). NaN passes.
TFMO_FN bool vr_overlaps(float prev_end, float start) { return start < prev_end; }

// ---------------------------------------------------------------------------------------------------------
// DistortionLoss

// Forward scan state: W = sum_{j<k} w_j, A = sum_{j<k} w_j (m_k - m_j) (after dl_scan_step for k: for k+1).
struct DlScan {
  float W;
  float A;
  float prev_delta;  // delta_{k-1} (0 before the first sample)
  float loss;
};

TFMO_FN DlScan dl_scan_begin() {
  DlScan s;
  s.W = 0.0f;
  s.A = 0.0f;
  s.prev_delta = 0.0f;
  s.loss = 0.0f;
  return s;
}

// The distance between the midpoints of two consecutive samples (lower one first): m_hi - m_lo from their
// interval lengths and the gap s_hi - e_lo between them.
TFMO_FN float dl_mid_step(float delta_lo, float delta_hi, float gap) { return 0.5f * (delta_lo + delta_hi) + gap; }

// Sample k's terms of the loss, 2 w_k A_k + w_k^2 delta_k / 3.
TFMO_FN float dl_loss_term(float w, float A, float delta) { return w * (2.0f * A + w * delta * (1.0f / 3.0f)); }

// Sample k with weight w, interval length delta and gap = s_k - e_{k-1} to the previous sample (0: contiguous,
// and for the first sample): returns A_k (used by the backward) and adds its loss terms.
TFMO_FN float dl_scan_step_gap(TFMO_THREAD DlScan* s, float w, float delta, float gap) {
  s->A += s->W * dl_mid_step(s->prev_delta, delta, gap);  // m_k - m_{k-1}; at k = 0 W = 0
  const float A = s->A;
  s->loss += dl_loss_term(w, A, delta);
  s->W += w;
  s->prev_delta = delta;
  return A;
}

// Contiguous samples (edges t): dl_scan_step_gap with gap 0.
TFMO_FN float dl_scan_step(TFMO_THREAD DlScan* s, float w, float delta) { return dl_scan_step_gap(s, w, delta, 0.0f); }

// Reverse scan state: W = sum_{j>k} w_j, B = sum_{j>k} w_j (m_j - m_k).
struct DlRevScan {
  float W;
  float B;
  float next_delta;  // delta_{k+1} (0 after the last sample)
};

TFMO_FN DlRevScan dl_rev_begin() {
  DlRevScan s;
  s.W = 0.0f;
  s.B = 0.0f;
  s.next_delta = 0.0f;
  return s;
}

// Sample k (visited last to first), next_gap = s_{k+1} - e_k (0: contiguous, and for the last sample): returns
// B_k in *B and W_{>k} in *W_after; then folds w_k in.
TFMO_FN void dl_rev_step_gap(TFMO_THREAD DlRevScan* s, float w, float delta, float next_gap, TFMO_THREAD float* B,
                             TFMO_THREAD float* W_after) {
  s->B += s->W * dl_mid_step(delta, s->next_delta, next_gap);  // m_{k+1} - m_k
  *B = s->B;
  *W_after = s->W;
  s->W += w;
  s->next_delta = delta;
}

// Contiguous samples: dl_rev_step_gap with gap 0.
TFMO_FN void dl_rev_step(TFMO_THREAD DlRevScan* s, float w, float delta, TFMO_THREAD float* B,
                         TFMO_THREAD float* W_after) {
  dl_rev_step_gap(s, w, delta, 0.0f, B, W_after);
}

// dL/dw_k (before the upstream factor).
TFMO_FN float dl_grad_w(float w, float delta, float A, float B) {
  return 2.0f * (A + B) + (2.0f / 3.0f) * w * delta;
}

// dL/dm_k (before the upstream factor) from W_{<k} and W_{>k}.
TFMO_FN float dl_grad_m(float w, float W_before, float W_after) { return 2.0f * w * (W_before - W_after); }

// dL/dt_j (before the upstream factor) from the neighbouring samples j-1 ("lo") and j ("hi");
// pass gm = w = 0 for a missing neighbour.
TFMO_FN float dl_grad_t(float gm_lo, float w_lo, float gm_hi, float w_hi) {
  return 0.5f * (gm_lo + gm_hi) + (w_lo * w_lo - w_hi * w_hi) * (1.0f / 3.0f);
}

// Packed samples: dL/ds_k and dL/de_k (before the upstream factor) from dL/dm_k and w_k.
TFMO_FN float dl_grad_start(float gm, float w) { return 0.5f * gm - w * w * (1.0f / 3.0f); }
TFMO_FN float dl_grad_end(float gm, float w) { return 0.5f * gm + w * w * (1.0f / 3.0f); }

// Packed samples, VolumeRender: dL/ds_k and dL/de_k from sigma_k dL/dtau_k, gD and w_k.
TFMO_FN float vr_grad_start(float sgt, float g_depth, float w) { return -sgt + 0.5f * g_depth * w; }
TFMO_FN float vr_grad_end(float sgt, float g_depth, float w) { return sgt + 0.5f * g_depth * w; }
