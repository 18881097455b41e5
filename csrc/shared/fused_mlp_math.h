// Per-element math of the fully fused MLP (FusedMlp, FusedMlpGrad; csrc/ops/fused_mlp_op.cc): the activations and
// their derivatives. Rules: device_compat.h. The matrix products live in the kernels (csrc/cpu/fused_mlp_cpu.cc).
//
// Activations (tiny-cuda-nn's names and formulas; the codes are the kernels' and the op attrs' order):
//   none         y = x
//   relu         y = max(x, 0)
//   leaky_relu   y = x > 0 ? x : FM_LEAKY_SLOPE * x                  (slope 0.01, tiny-cuda-nn's)
//   sigmoid      y = 1 / (1 + exp(-x))
//   exponential  y = exp(x)
//   softplus     y = log(1 + exp(x)), as max(x, 0) + log(1 + exp(-|x|)) (no overflow for large x)
//
// Derivatives from the output y (what the forward pass keeps; tiny-cuda-nn's backward does the same):
//   none 1; relu y > 0; leaky_relu y > 0 ? 1 : slope; sigmoid y (1 - y); exponential y;
//   softplus sigmoid(x) = 1 - exp(-y).
// At x = 0 relu's derivative is 0 and leaky_relu's the slope (y = 0 is not > 0).
#pragma once

#include "device_compat.h"

#define FM_ACT_NONE 0
#define FM_ACT_RELU 1
#define FM_ACT_LEAKY_RELU 2
#define FM_ACT_SIGMOID 3
#define FM_ACT_EXPONENTIAL 4
#define FM_ACT_SOFTPLUS 5
#define FM_ACT_COUNT 6

#define FM_LEAKY_SLOPE 0.01f

TFMO_FN float fm_activate(int act, float x) {
  switch (act) {
    case FM_ACT_RELU: return x > 0.0f ? x : 0.0f;
    case FM_ACT_LEAKY_RELU: return x > 0.0f ? x : FM_LEAKY_SLOPE * x;
    case FM_ACT_SIGMOID: return 1.0f / (1.0f + tfmo_exp(-x));
    case FM_ACT_EXPONENTIAL: return tfmo_exp(x);
    case FM_ACT_SOFTPLUS: return tfmo_fmax(x, 0.0f) + tfmo_log(1.0f + tfmo_exp(-tfmo_fabs(x)));
    default: return x;
  }
}

// dy/dx of fm_activate(act, x), from y = fm_activate(act, x).
TFMO_FN float fm_activation_derivative(int act, float y) {
  switch (act) {
    case FM_ACT_RELU: return y > 0.0f ? 1.0f : 0.0f;
    case FM_ACT_LEAKY_RELU: return y > 0.0f ? 1.0f : FM_LEAKY_SLOPE;
    case FM_ACT_SIGMOID: return y * (1.0f - y);
    case FM_ACT_EXPONENTIAL: return y;
    case FM_ACT_SOFTPLUS: return 1.0f - tfmo_exp(-y);
    default: return 1.0f;
  }
}
