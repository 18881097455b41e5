// Metal kernels of the render family: VolumeRender, DistortionLoss and their gradients (semantics:
// csrc/ops/render_op.cc; math and conventions: csrc/shared/render_math.h; host: csrc/gpu/render_gpu.cc). One SIMD
// group (32 threads) per ray: the host dispatches 32 R threads in threadgroups of a multiple of 32 threads (the host
// skips R == 0), so SIMD group r (thread_position_in_grid / 32) is ray r. Each checks its ray and runs the ray's body
// in metal_kernels/render.h (layout, scans and their order there) on the samples [r S, r S + S) with
// ts = t + r, te = t + r + 1; the edge gradients go to t's layout merged (rp_edges_merged). Offsets are 64-bit
// (R*S*C may exceed 2^32). Invalid input (a negative density, or t decreasing along the ray) cannot fail the op from
// the GPU: every output of that ray is NaN instead. For an empty input the host binds another buffer in its place;
// it is never read.
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
#include "render.h"

// Ray r: its samples [r S, r S + S) and their intervals in t [R, S + 1].
TFMO_FN RpRay vr_dense_ray(device const float* t, uint r, uint S) {
  RpRay ray;
  ray.ts = t + r;
  ray.te = t + r + 1u;
  ray.ab = uint2(r * S, r * S + S);
  return ray;
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
                                  uint gid [[thread_position_in_grid]],
                                  uint lane [[thread_index_in_simdgroup]]) {
  const uint r = gid / kRpLanes;
  if (r >= p.R) return;  // whole SIMD groups
  const uint C = p.C;
  device float* col = color_out + ulong(r) * C;
  const RpRay ray = vr_dense_ray(t, r, p.S);
  if (rp_ray_invalid(densities, ray, true, lane)) {
    for (uint c = lane; c < C; c += kRpLanes) col[c] = vr_nan();
    if (lane == 0) {
      depth_out[r] = vr_nan();
      opacity_out[r] = vr_nan();
    }
    for (uint k = ray.ab.x + lane; k < ray.ab.y; k += kRpLanes) weights_out[k] = vr_nan();
    return;
  }
  rp_volume_render_ray(densities, colors, ray, rp_background_row(background, p.bg_mode, C, r), p.bg_mode, C,
                       p.threshold, weights_out, col, depth_out + r, opacity_out + r, lane);
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
                                   uint gid [[thread_position_in_grid]],
                                   uint lane [[thread_index_in_simdgroup]]) {
  const uint r = gid / kRpLanes;
  if (r >= p.R) return;  // whole SIMD groups
  const uint S = p.S, C = p.C;
  device float* gbg = grad_background + ulong(r) * C;
  const RpRay ray = vr_dense_ray(t, r, S);
  if (rp_ray_invalid(densities, ray, true, lane)) {
    for (uint c = lane; c < C; c += kRpLanes) gbg[c] = vr_nan();
    for (uint k = ray.ab.x + lane; k < ray.ab.y; k += kRpLanes) {
      grad_densities[k] = vr_nan();
      for (uint c = 0; c < C; ++c) grad_colors[ulong(k) * C + c] = vr_nan();
    }
    for (uint i = lane; i <= S; i += kRpLanes) grad_t[ulong(r) * (S + 1) + i] = vr_nan();
    return;
  }
  rp_volume_render_grad_ray(densities, colors, ray, rp_background_row(background, p.bg_mode, C, r), p.bg_mode, C,
                            p.threshold, grad_color + ulong(r) * C, grad_depth[r], grad_opacity[r], grad_weights,
                            grad_densities, grad_colors, rp_edges_merged(grad_t, r), gbg, lane);
}

// ---- DistortionLoss ----

kernel void distortion_loss_forward(device const float* weights [[buffer(0)]],
                                    device const float* t [[buffer(1)]],
                                    device float* loss [[buffer(2)]],
                                    constant DlParams& p [[buffer(3)]],
                                    uint gid [[thread_position_in_grid]],
                                    uint lane [[thread_index_in_simdgroup]]) {
  const uint r = gid / kRpLanes;
  if (r >= p.R) return;  // whole SIMD groups
  const RpRay ray = vr_dense_ray(t, r, p.S);
  const float l = rp_ray_invalid(weights, ray, false, lane) ? vr_nan() : rp_distortion_loss_ray(weights, ray, lane);
  if (lane == 0) loss[r] = l;
}

kernel void distortion_loss_backward(device const float* weights [[buffer(0)]],
                                     device const float* t [[buffer(1)]],
                                     device const float* grad_loss [[buffer(2)]],
                                     device float* grad_weights [[buffer(3)]],
                                     device float* grad_t [[buffer(4)]],
                                     constant DlParams& p [[buffer(5)]],
                                     uint gid [[thread_position_in_grid]],
                                     uint lane [[thread_index_in_simdgroup]]) {
  const uint r = gid / kRpLanes;
  if (r >= p.R) return;  // whole SIMD groups
  const uint S = p.S;
  const RpRay ray = vr_dense_ray(t, r, S);
  if (rp_ray_invalid(weights, ray, false, lane)) {
    for (uint k = ray.ab.x + lane; k < ray.ab.y; k += kRpLanes) grad_weights[k] = vr_nan();
    for (uint i = lane; i <= S; i += kRpLanes) grad_t[ulong(r) * (S + 1) + i] = vr_nan();
    return;
  }
  rp_distortion_loss_grad_ray(weights, ray, grad_loss[r], grad_weights, rp_edges_merged(grad_t, r), lane);
}
