// Metal kernels of VolumeRenderPacked / DistortionLossPacked and their gradients (semantics:
// csrc/ops/render_packed_op.cc; math: csrc/shared/render_math.h; host: csrc/gpu/render_packed_gpu.cc).
// Offsets are 64-bit.
//
// The four ray kernels run one SIMD group (32 threads) per ray: the host dispatches 32 R threads in threadgroups of
// a multiple of 32 threads, so SIMD group r (thread_position_in_grid / 32) is ray r. Each checks its ray and runs the
// ray's body in metal_kernels/render.h (layout, scans and their order there), on the ray's samples
// [row_splits[r], row_splits[r + 1]) with ts = t_starts, te = t_ends.
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
#include "render.h"

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
  RpRay ray;
  ray.ts = t_starts;
  ray.te = t_ends;
  ray.ab = splits_bad ? uint2(0, 0) : rp_ray_range(row_splits, r, p.N);
  if (splits_bad || rp_ray_invalid(densities, ray, true, lane)) {
    for (uint c = lane; c < C; c += kRpLanes) col[c] = vr_nan();
    if (lane == 0) {
      depth_out[r] = vr_nan();
      opacity_out[r] = vr_nan();
    }
    const RpNanSamples ns = rp_nan_samples(splits_bad, r, ray.ab, p.R, p.N, lane);
    for (ulong k = ns.first; k < ns.end; k += ns.step) weights_out[k] = vr_nan();
    return;
  }
  rp_volume_render_ray(densities, colors, ray, rp_background_row(background, p.bg_mode, C, r), p.bg_mode, C,
                       p.threshold, weights_out, col, depth_out + r, opacity_out + r, lane);
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
  device float* gbg = grad_background + ulong(r) * C;
  const bool splits_bad = status[0] != 0;
  RpRay ray;
  ray.ts = t_starts;
  ray.te = t_ends;
  ray.ab = splits_bad ? uint2(0, 0) : rp_ray_range(row_splits, r, p.N);
  if (splits_bad || rp_ray_invalid(densities, ray, true, lane)) {
    for (uint c = lane; c < C; c += kRpLanes) gbg[c] = vr_nan();
    const RpNanSamples ns = rp_nan_samples(splits_bad, r, ray.ab, p.R, p.N, lane);
    for (ulong k = ns.first; k < ns.end; k += ns.step) {
      grad_densities[k] = vr_nan();
      grad_t_starts[k] = vr_nan();
      grad_t_ends[k] = vr_nan();
      for (uint c = 0; c < C; ++c) grad_colors[k * C + c] = vr_nan();
    }
    return;
  }
  rp_volume_render_grad_ray(densities, colors, ray, rp_background_row(background, p.bg_mode, C, r), p.bg_mode, C,
                            p.threshold, grad_color + ulong(r) * C, grad_depth[r], grad_opacity[r], grad_weights,
                            grad_densities, grad_colors, rp_edges_packed(grad_t_starts, grad_t_ends), gbg, lane);
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
  RpRay ray;
  ray.ts = t_starts;
  ray.te = t_ends;
  ray.ab = splits_bad ? uint2(0, 0) : rp_ray_range(row_splits, r, p.N);
  if (splits_bad || rp_ray_invalid(weights, ray, false, lane)) {
    if (lane == 0) loss[r] = vr_nan();
    return;
  }
  const float l = rp_distortion_loss_ray(weights, ray, lane);
  if (lane == 0) loss[r] = l;
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
  RpRay ray;
  ray.ts = t_starts;
  ray.te = t_ends;
  ray.ab = splits_bad ? uint2(0, 0) : rp_ray_range(row_splits, r, p.N);
  if (splits_bad || rp_ray_invalid(weights, ray, false, lane)) {
    const RpNanSamples ns = rp_nan_samples(splits_bad, r, ray.ab, p.R, p.N, lane);
    for (ulong k = ns.first; k < ns.end; k += ns.step) {
      grad_weights[k] = vr_nan();
      grad_t_starts[k] = vr_nan();
      grad_t_ends[k] = vr_nan();
    }
    return;
  }
  rp_distortion_loss_grad_ray(weights, ray, grad_loss[r], grad_weights, rp_edges_packed(grad_t_starts, grad_t_ends),
                              lane);
}
