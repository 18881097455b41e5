// Op definitions of the fully fused MLP (tiny-cuda-nn's FullyFusedMLP). Activations: csrc/shared/fused_mlp_math.h;
// parameter layout and argument checks: csrc/ops/fused_mlp_args.h; kernels: csrc/cpu/fused_mlp_cpu.cc,
// metal_kernels/fused_mlp.metal (host: csrc/gpu/fused_mlp_gpu.cc).
//
// FusedMlp(x [N, n_input] T, params [P] T) -> (y [N, n_output] T, hidden [n_hidden_layers, N, width] float32)
//   y = f_out(W_L h_{L-1} + b_L), h_l = f(W_l h_{l-1} + b_l) for l = 1 .. n_hidden_layers, h_0 = x (row by row);
//   L = n_hidden_layers + 1 weight matrices (tiny-cuda-nn counts the hidden layers the same way).
//   attrs: n_hidden_layers in 1..8, width in {16, 32, 64, 128}, n_output in 1..width, activation and
//   output_activation in {"none", "relu", "leaky_relu", "sigmoid", "exponential", "softplus"}, use_bias,
//   training, products ("float32" or "bfloat16": the CPU kernels' products, csrc/cpu/fused_mlp_cpu_isa.h),
//   feature_major (default false): x is [n_input, N] instead, column n holding row n's inputs (the hash grid's
//   feature-major output, tiny-cuda-nn's layout); y and hidden keep their layout. n_input = x.shape[1] (x.shape[0]
//   when feature_major) in 1..width. T in {float, half}: float16 x and params are read as float32, every
//   sum accumulates in float32, y is rounded to T once.
//   hidden: the post-activation values h_1 .. h_{n_hidden_layers} in float32, what FusedMlpGrad reads, when the
//   device's kernel keeps them: when training on the GPU; when training at width 128 with float32 products on the
//   CPU (otherwise the CPU's gradient computes them again: csrc/cpu/fused_mlp_cpu.cc, KeepActivations). Otherwise
//   [0, N, width], no values.
//
// FusedMlpGrad(dy [N, n_output] T, x, params, y, hidden) -> (dx T like x, dparams [P] T)
//   The gradients of sum(dy * y) w.r.t. x and params, y and hidden being FusedMlp's outputs for (x, params) with
//   training; hidden [0, N, width] (none kept) only on the CPU, which computes them again. dparams sums over rows in a fixed order (row blocks, then the blocks' partial sums in block order):
//   bitwise the same for every thread count. Padding entries of params (csrc/ops/fused_mlp_args.h) get 0.
//
// Shape functions (graph mode only) check ranks: y [?, ?], hidden [?, ?, ?] (the attrs, feature_major among them,
// are not readable from the C API's shape context; the Python wrapper sets the static shapes), dx like x, dparams
// like params. The kernels check everything.
#include "common/op_names.h"
#include "common/shape_fns.h"
#include "common/tfc.h"

namespace {

using tfmo::Shape;

// [?]: a vector of one unknown dimension (-1 is TF's unknown-dim marker), distinct from every other one.
struct UnknownVector {
  TF_ShapeHandle* h;
  explicit UnknownVector(TF_ShapeInferenceContext* ctx)
      : h(TF_ShapeInferenceContextVectorFromSize(ctx, static_cast<size_t>(-1))) {}
  ~UnknownVector() { TF_DeleteShapeHandle(h); }
  UnknownVector(const UnknownVector&) = delete;
  UnknownVector& operator=(const UnknownVector&) = delete;
};

// x [?, ?], params [?] -> y [?, ?], hidden [?, ?, ?]: N is x's first or second dimension by the feature_major attr.
void ForwardShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  if (!tfmo::InputsWithRanks(ctx, 0, {2, 1}, status)) return;
  UnknownVector rows(ctx), cols(ctx), layers(ctx), width(ctx);  // rows: N in both outputs
  Shape y, hidden_head, hidden;
  if (tfmo::Concatenate(ctx, rows.h, cols.h, &y, status) &&
      tfmo::Concatenate(ctx, layers.h, rows.h, &hidden_head, status) &&
      tfmo::Concatenate(ctx, hidden_head.h, width.h, &hidden, status))
    tfmo::SetOutputs(ctx, {&y, &hidden}, status);
}

// dy, x, params, y, hidden -> dx like x, dparams like params.
void GradShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  if (tfmo::InputsWithRanks(ctx, 0, {2, 2, 1, 2, 3}, status)) tfmo::OutputsLikeInputs(ctx, {1, 2}, status);
}

const std::initializer_list<const char*> kConfigAttrs = {
    "n_hidden_layers: int", "width: int", "n_output: int", "activation: string", "output_activation: string",
    "use_bias: bool", "T: {float, half}", "products: string = \"float32\"", "feature_major: bool = false"};

static const tfmo::OnLoad kRegister([] {
  tfmo::DefineOp(TFMO_OP_FUSED_MLP,
                 {"n_hidden_layers: int", "width: int", "n_output: int", "activation: string",
                  "output_activation: string", "use_bias: bool", "T: {float, half}", "training: bool = false",
                  "products: string = \"float32\"", "feature_major: bool = false"},
                 {"x: T", "params: T"}, {"y: T", "hidden: float"}, &ForwardShape);
  tfmo::DefineOp(TFMO_OP_FUSED_MLP_GRAD, kConfigAttrs, {"dy: T", "x: T", "params: T", "y: T", "hidden: float"},
                 {"dx: T", "dparams: T"}, &GradShape);
});

}  // namespace
