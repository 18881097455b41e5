// Metal kernels of the robust photometric loss (host: robust_loss_gpu.cc; math: robust_loss_math.h).
//   robust_loss_forward   grid N: loss[i] = sum_c rho(p[i,c] - t[i,c])
//   robust_loss_backward  grid N: gp[i,c] = g[i] * rho'(p[i,c] - t[i,c])
#include <metal_stdlib>
using namespace metal;

#include "robust_loss_math.h"

kernel void robust_loss_forward(device const float* p [[buffer(0)]], device const float* t [[buffer(1)]],
                                constant RlArgs& args [[buffer(2)]], device float* loss [[buffer(3)]],
                                uint i [[thread_position_in_grid]]) {
  if (i >= args.rows) return;
  float sum = 0.0f;
  for (uint k = 0; k < args.channels; ++k) {
    const ulong j = (ulong)i * args.channels + k;
    sum += rl_penalty(p[j] - t[j], args.eps);
  }
  loss[i] = sum;
}

kernel void robust_loss_backward(device const float* g [[buffer(0)]], device const float* p [[buffer(1)]],
                                 device const float* t [[buffer(2)]], constant RlArgs& args [[buffer(3)]],
                                 device float* gp [[buffer(4)]], uint i [[thread_position_in_grid]]) {
  if (i >= args.rows) return;
  for (uint k = 0; k < args.channels; ++k) {
    const ulong j = (ulong)i * args.channels + k;
    gp[j] = g[i] * rl_derivative(p[j] - t[j], args.eps);
  }
}
