// Per-element math of the fully fused MLP (FusedMlp, FusedMlpGrad; csrc/ops/fused_mlp_op.cc): the activations and
// their derivatives, and the GPU kernels' argument struct and threadgroup shape. Rules: device_compat.h. The matrix
// products live in the kernels (csrc/cpu/fused_mlp_cpu.cc, metal_kernels/fused_mlp.metal).
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

// ---- GPU kernels (metal_kernels/fused_mlp.metal, host csrc/gpu/fused_mlp_gpu.cc) ----------------------------------

#define FM_MAX_MATRICES 9  // n_hidden_layers <= 8 (tfmo::fused_mlp::kMaxMatrices)

// SIMD groups per threadgroup of the forward and backward kernels, by width and T (half: sizeof 2). Each SIMD group
// owns 8 rows, so a threadgroup's block is 8 * FM_GPU_SIMDGROUPS rows. Chosen so that every threadgroup buffer
// (FM_GPU_*_BYTES) fits Apple's 32 KB of threadgroup memory.
#define FM_GPU_SIMDGROUPS(width, half) ((width) <= 32 ? 8u : ((width) == 64 && (half) ? 4u : 2u))
// Whether a layer's weights are copied into threadgroup memory (width <= 64); at width 128 they are 32 KB (half) or
// 64 KB (float), more than fits: the products read them from device memory.
#define FM_GPU_TG_WEIGHTS(width) ((width) <= 64)

// Threadgroup-memory lengths in bytes ([[threadgroup(n)]]) for width W, element size E (sizeof(T)), S SIMD groups;
// every row is padded by FM_GPU_TG_PAD(E) elements (16 bytes):
//   rows   [8 S][W] T: forward, the activations of the block (layer by layer, in place); backward, g;
//   prev   [8 S][W] T: backward only, the layer's inputs (x or the kept hidden) as T;
//   weights [rows][cols] T of one matrix (FM_GPU_TG_WEIGHTS), or of every matrix one after another when they fit
//           next to the row buffers (FmArgs.weights_resident), else 16 (unused).
#define FM_GPU_TG_PAD(E) (16u / (E))
#define FM_GPU_ROWS_BYTES(W, E, S) (8u * (S) * ((W) + FM_GPU_TG_PAD(E)) * (E))
#define FM_GPU_WEIGHT_BYTES(W, E) (FM_GPU_TG_WEIGHTS(W) ? (W) * ((W) + FM_GPU_TG_PAD(E)) * (E) : 16u)

// The kernels' arguments ([[buffer]] constant): the call's dimensions and the parameter layout
// (csrc/ops/fused_mlp_args.h), as 32-bit values.
struct FmArgs {
  uint n;           // rows
  uint n_input, in_pad, n_output, out_pad, n_matrices;
  uint use_bias, training;
  uint feature_major;  // x and dx [n_input][n] instead of [n][n_input]
  uint blocks;      // backward: row blocks of 8 * FM_GPU_SIMDGROUPS rows
  uint parts;       // backward: threadgroups; part p sums blocks [p blocks / parts, (p + 1) blocks / parts)
  uint total;       // P, the parameter count
  uint weights_resident;  // every matrix in threadgroup memory, copied once per threadgroup (weight_tg_offset)
  uint weight_offset[FM_MAX_MATRICES];
  uint bias_offset[FM_MAX_MATRICES];  // use_bias only
  uint weight_tg_offset[FM_MAX_MATRICES];  // weights_resident: matrix m's first element in the weights buffer
};
