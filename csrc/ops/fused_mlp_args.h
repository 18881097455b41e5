// Host-side parts of the fused-MLP ops (semantics: csrc/ops/fused_mlp_op.cc): attr parsing and checks (at kernel
// construction), the parameter layout, input checks and the kernel registrations. Every failure is an
// InvalidArgument naming the op and the argument.
//
// Parameter layout: one flat vector of P values, tiny-cuda-nn's FullyFusedMLP layout followed by the biases:
//   weights: L = n_hidden_layers + 1 matrices, each row-major [outputs, inputs] (row o holds the weights into
//   output o), back to back:
//     W_1 [width, in_pad], W_2 .. W_{L-1} [width, width], W_L [out_pad, width],
//   in_pad = n_input and out_pad = n_output rounded up to a multiple of 16 (tiny-cuda-nn's padding). The padding
//   columns of W_1 multiply zeros (x is padded with 0) and the padding rows of W_L feed no output: they never
//   change y and their gradient is 0.
//   biases (use_bias only; tiny-cuda-nn has none): b_1 .. b_{L-1} [width] each, then b_L [n_output].
//   P = width * in_pad + (L - 2) * width^2 + out_pad * width (+ (L - 1) * width + n_output with biases).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/op_names.h"
#include "common/tfc.h"
#include "shared/fused_mlp_math.h"

namespace tfmo::fused_mlp {

constexpr int kMaxHiddenLayers = 8;
constexpr int kMaxMatrices = kMaxHiddenLayers + 1;

// The activation code (fused_mlp_math.h FM_ACT_*) of an attr value, or -1.
inline int ActivationCode(const std::string& name) {
  static const char* const kNames[FM_ACT_COUNT] = {"none", "relu", "leaky_relu", "sigmoid", "exponential",
                                                   "softplus"};
  for (int i = 0; i < FM_ACT_COUNT; ++i)
    if (name == kNames[i]) return i;
  return -1;
}

// The products attr: "float32" (every build) or "bfloat16" (operands rounded to bfloat16, float32 sums: the CPU
// kernels; csrc/cpu/fused_mlp_cpu_isa.h).
enum Products : int { kProductsFloat32 = 0, kProductsBfloat16 = 1 };

inline int64_t RoundUp16(int64_t n) { return (n + 15) / 16 * 16; }

// Where each matrix and bias sits in the flat parameter vector (see the layout above), for one input width.
struct Layout {
  int width = 0, n_input = 0, in_pad = 0, n_output = 0, out_pad = 0, n_matrices = 0;
  bool use_bias = false;
  int64_t rows[kMaxMatrices] = {}, cols[kMaxMatrices] = {};
  int64_t weight_offset[kMaxMatrices] = {}, bias_offset[kMaxMatrices] = {};  // bias_offset: use_bias only
  int64_t total = 0;
};

inline Layout MakeLayout(int width, int n_input, int n_output, int n_hidden_layers, bool use_bias) {
  Layout l;
  l.width = width;
  l.n_input = n_input;
  l.in_pad = static_cast<int>(RoundUp16(n_input));
  l.n_output = n_output;
  l.out_pad = static_cast<int>(RoundUp16(n_output));
  l.n_matrices = n_hidden_layers + 1;
  l.use_bias = use_bias;
  int64_t at = 0;
  for (int m = 0; m < l.n_matrices; ++m) {
    l.rows[m] = m == l.n_matrices - 1 ? l.out_pad : width;
    l.cols[m] = m == 0 ? l.in_pad : width;
    l.weight_offset[m] = at;
    at += l.rows[m] * l.cols[m];
  }
  for (int m = 0; use_bias && m < l.n_matrices; ++m) {
    l.bias_offset[m] = at;
    at += m == l.n_matrices - 1 ? n_output : width;
  }
  l.total = at;
  return l;
}

// Kernel state: the attrs, checked once.
struct Config {
  int n_hidden_layers = 0, width = 0, n_output = 0, activation = 0, output_activation = 0;
  int products = kProductsFloat32;
  bool use_bias = false, training = false;
  bool feature_major = false;  // x (and dx) [n_input, N] instead of [N, n_input]
  TF_DataType dtype = TF_FLOAT;
};

// `op`: the name in messages ("fused_mlp" or "fused_mlp (gradient)"); has_training: FusedMlp's attr.
inline void* CreateConfig(TF_OpKernelConstruction* c, const char* op, bool has_training) {
  auto* cfg = new Config;
  int64_t layers = 0, width = 0, n_output = 0;
  std::string act, out_act, products;
  bool ok = GetAttr(c, "n_hidden_layers", &layers) && GetAttr(c, "width", &width) &&
            GetAttr(c, "n_output", &n_output) && GetAttr(c, "activation", &act) &&
            GetAttr(c, "output_activation", &out_act) && GetAttr(c, "use_bias", &cfg->use_bias) &&
            GetAttr(c, "T", &cfg->dtype) && GetAttr(c, "products", &products) &&
            GetAttr(c, "feature_major", &cfg->feature_major) &&
            (!has_training || GetAttr(c, "training", &cfg->training));
  if (ok && !(layers >= 1 && layers <= kMaxHiddenLayers))
    ok = ConstructionFail(c, TF_INVALID_ARGUMENT, "%s: n_hidden_layers must be in 1..%d, got %lld", op,
                          kMaxHiddenLayers, static_cast<long long>(layers));
  if (ok && width != 16 && width != 32 && width != 64 && width != 128)
    ok = ConstructionFail(c, TF_INVALID_ARGUMENT, "%s: width must be 16, 32, 64 or 128, got %lld", op,
                          static_cast<long long>(width));
  if (ok && !(n_output >= 1 && n_output <= width))
    ok = ConstructionFail(c, TF_INVALID_ARGUMENT, "%s: n_output must be in 1..width (%lld), got %lld", op,
                          static_cast<long long>(width), static_cast<long long>(n_output));
  const int code = ActivationCode(act), out_code = ActivationCode(out_act);
  if (ok && code < 0)
    ok = ConstructionFail(c, TF_INVALID_ARGUMENT,
                          "%s: activation must be \"none\", \"relu\", \"leaky_relu\", \"sigmoid\", \"exponential\" "
                          "or \"softplus\", got \"%s\"", op, act.c_str());
  if (ok && out_code < 0)
    ok = ConstructionFail(c, TF_INVALID_ARGUMENT,
                          "%s: output_activation must be \"none\", \"relu\", \"leaky_relu\", \"sigmoid\", "
                          "\"exponential\" or \"softplus\", got \"%s\"", op, out_act.c_str());
  if (ok && products != "float32" && products != "bfloat16")
    ok = ConstructionFail(c, TF_INVALID_ARGUMENT, "%s: products must be \"float32\" or \"bfloat16\", got \"%s\"", op,
                          products.c_str());
  cfg->products = products == "bfloat16" ? kProductsBfloat16 : kProductsFloat32;
  if (ok && cfg->dtype != TF_FLOAT && cfg->dtype != TF_HALF)
    ok = ConstructionFail(c, TF_INVALID_ARGUMENT, "%s: T must be float32 or float16, got %s", op,
                          DataTypeName(cfg->dtype));
  if (!ok) {
    delete cfg;
    return nullptr;
  }
  cfg->n_hidden_layers = static_cast<int>(layers);
  cfg->width = static_cast<int>(width);
  cfg->n_output = static_cast<int>(n_output);
  cfg->activation = code;
  cfg->output_activation = out_code;
  return cfg;
}
inline void* CreateForward(TF_OpKernelConstruction* c) { return CreateConfig(c, "fused_mlp", true); }
inline void* CreateGrad(TF_OpKernelConstruction* c) { return CreateConfig(c, "fused_mlp (gradient)", false); }
inline void DeleteConfig(void* p) { delete static_cast<Config*>(p); }

// One call's validated inputs.
struct Call {
  const Config* cfg = nullptr;
  Layout layout;
  int64_t n = 0;  // rows
  TensorRef x, params;
  TensorRef dy, y, hidden;  // FusedMlpGrad only
  bool hidden_kept = true;  // FusedMlpGrad: hidden is [n_hidden_layers, N, width]; false: [0, N, width], none kept

  // Strides of x (and dx) in elements: row r's input i at r * row_stride + i * input_stride.
  int64_t row_stride() const { return cfg->feature_major ? 1 : layout.n_input; }
  int64_t input_stride() const { return cfg->feature_major ? n : 1; }
  // x's (and dx's) shape.
  std::vector<int64_t> x_shape() const {
    const int64_t k = layout.n_input;
    return cfg->feature_major ? std::vector<int64_t>{k, n} : std::vector<int64_t>{n, k};
  }
};

// x [N, n_input] ([n_input, N] with feature_major; 1 <= n_input <= width) and params [P], both T. Sets
// call->layout and call->n.
inline bool CheckXAndParams(TF_OpKernelContext* ctx, const char* op, Call* call) {
  const Config& cfg = *call->cfg;
  const TensorRef &x = call->x, &p = call->params;
  if (!CheckDtype(ctx, op, "x", x, cfg.dtype) || !CheckDtype(ctx, op, "params", p, cfg.dtype)) return false;
  const int n_axis = cfg.feature_major ? 1 : 0, input_axis = 1 - n_axis;
  if (x.rank() != 2 || x.dim(input_axis) < 1 || x.dim(input_axis) > cfg.width)
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: x must have shape %s with 1 <= n_input <= width (%d), got %s", op,
                cfg.feature_major ? "[n_input, N] (feature_major)" : "[N, n_input]", cfg.width,
                ShapeString(x).c_str());
  call->n = x.dim(n_axis);
  call->layout =
      MakeLayout(cfg.width, static_cast<int>(x.dim(input_axis)), cfg.n_output, cfg.n_hidden_layers, cfg.use_bias);
  if (p.rank() != 1 || p.dim(0) != call->layout.total)
    return Fail(ctx, TF_INVALID_ARGUMENT,
                "%s: params must have shape [%lld] (n_input=%lld, width=%d, n_output=%d, n_hidden_layers=%d, "
                "use_bias=%s), got %s",
                op, static_cast<long long>(call->layout.total), static_cast<long long>(call->layout.n_input), cfg.width,
                cfg.n_output, cfg.n_hidden_layers, cfg.use_bias ? "true" : "false", ShapeString(p).c_str());
  return true;
}

// FusedMlp: inputs x, params.
inline bool PrepareForward(TF_OpKernelContext* ctx, void* state, Call* call) {
  call->cfg = static_cast<const Config*>(state);
  return GetInput(ctx, 0, &call->x) && GetInput(ctx, 1, &call->params) && CheckXAndParams(ctx, "fused_mlp", call);
}

// FusedMlpGrad: inputs dy, x, params, y, hidden.
inline bool PrepareGrad(TF_OpKernelContext* ctx, void* state, Call* call) {
  const char* op = "fused_mlp (gradient)";
  call->cfg = static_cast<const Config*>(state);
  const Config& cfg = *call->cfg;
  if (!GetInput(ctx, 0, &call->dy) || !GetInput(ctx, 1, &call->x) || !GetInput(ctx, 2, &call->params) ||
      !GetInput(ctx, 3, &call->y) || !GetInput(ctx, 4, &call->hidden) || !CheckXAndParams(ctx, op, call))
    return false;
  const long long n = static_cast<long long>(call->n);
  const std::pair<const char*, const TensorRef*> per_output[] = {{"dy", &call->dy}, {"y", &call->y}};
  for (const auto& [name, t] : per_output) {
    if (!CheckDtype(ctx, op, name, *t, cfg.dtype)) return false;
    if (t->rank() != 2 || t->dim(0) != call->n || t->dim(1) != cfg.n_output)
      return Fail(ctx, TF_INVALID_ARGUMENT, "%s: %s must have shape [%lld, %d] (N, n_output), got %s", op, name, n,
                  cfg.n_output, ShapeString(*t).c_str());
  }
  const TensorRef& h = call->hidden;
  if (!CheckDtype(ctx, op, "hidden", h, TF_FLOAT)) return false;
  if (h.rank() != 3 || (h.dim(0) != cfg.n_hidden_layers && h.dim(0) != 0) || h.dim(1) != call->n ||
      h.dim(2) != cfg.width)
    return Fail(ctx, TF_INVALID_ARGUMENT,
                "%s: hidden must have shape [%d, %lld, %d] (n_hidden_layers, N, width: FusedMlp's hidden output with "
                "training=True) or [0, %lld, %d] (none kept), got %s",
                op, cfg.n_hidden_layers, n, cfg.width, n, cfg.width, ShapeString(h).c_str());
  call->hidden_kept = h.dim(0) != 0;
  return true;
}

// Registers FusedMlp's and FusedMlpGrad's kernels on `device` (T in {float, half}).
inline void RegisterKernels(const char* device, void (*forward)(void*, TF_OpKernelContext*),
                            void (*grad)(void*, TF_OpKernelContext*)) {
  const struct {
    const char* op;
    void* (*create)(TF_OpKernelConstruction*);
    void (*compute)(void*, TF_OpKernelContext*);
  } kernels[] = {{TFMO_OP_FUSED_MLP, &CreateForward, forward}, {TFMO_OP_FUSED_MLP_GRAD, &CreateGrad, grad}};
  for (const auto& k : kernels) {
    KernelSpec spec = KernelSpecFor(device);
    spec.op = k.op;
    spec.create = k.create;
    spec.compute = k.compute;
    spec.destroy = &DeleteConfig;
    spec.type_attr = "T";
    spec.types = {TF_FLOAT, TF_HALF};
    RegisterKernel(spec);
  }
}

}  // namespace tfmo::fused_mlp
