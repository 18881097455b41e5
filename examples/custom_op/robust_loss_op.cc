// Op definitions and CPU kernels of the robust photometric loss (written with tf_metal_ops' op kit):
//   RobustLoss(predictions [N, C] float, targets [N, C] float; epsilon) -> loss [N] = sum_c rho(p - t)
//   RobustLossGrad(grad_loss [N], predictions, targets; epsilon) -> grad_predictions [N, C] = grad_loss * rho'(p - t)
// rho and rho' live in robust_loss_math.h, shared with the Metal kernel. The kernel validates its inputs itself:
// eager mode runs no shape function.
#include "common/tfc.h"
#include "common/thread_pool.h"
#include "robust_loss_host.h"
#include "robust_loss_math.h"

namespace {

void LossCpu(void* state, TF_OpKernelContext* ctx) {
  const float eps = robust_loss::Eps(state);
  tfmo::TensorRef p, t, loss;
  if (!tfmo::GetInput(ctx, 0, &p) || !tfmo::GetInput(ctx, 1, &t) || !robust_loss::Validate(ctx, p, t)) return;
  const int64_t n = p.dim(0), c = p.dim(1);
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {n}, &loss)) return;
  const float *pp = p.data<float>(), *tp = t.data<float>();
  float* out = loss.data<float>();
  tfmo::ParallelFor(n, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float sum = 0.0f;
      for (int64_t k = 0; k < c; ++k) sum += rl_penalty(pp[i * c + k] - tp[i * c + k], eps);
      out[i] = sum;
    }
  });
}

void GradCpu(void* state, TF_OpKernelContext* ctx) {
  const float eps = robust_loss::Eps(state);
  tfmo::TensorRef g, p, t, gp;
  if (!tfmo::GetInput(ctx, 0, &g) || !tfmo::GetInput(ctx, 1, &p) || !tfmo::GetInput(ctx, 2, &t) ||
      !robust_loss::Validate(ctx, p, t))
    return;
  const int64_t n = p.dim(0), c = p.dim(1);
  if (!robust_loss::ValidateGrad(ctx, g, n)) return;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {n, c}, &gp)) return;
  const float *gl = g.data<float>(), *pp = p.data<float>(), *tp = t.data<float>();
  float* out = gp.data<float>();
  tfmo::ParallelFor(n, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      for (int64_t k = 0; k < c; ++k) out[i * c + k] = gl[i] * rl_derivative(pp[i * c + k] - tp[i * c + k], eps);
  });
}

// loss has shape [N] (the first dimension of predictions).
void LossShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeHandle* in = TF_NewShapeHandle();
  TF_ShapeHandle* out = TF_NewShapeHandle();
  TF_ShapeInferenceContextGetInput(ctx, 0, in, status);
  if (TF_GetCode(status) == TF_OK) TF_ShapeInferenceContextWithRank(ctx, in, 2, in, status);
  if (TF_GetCode(status) == TF_OK) TF_ShapeInferenceContextSubshape(ctx, in, 0, 1, out, status);
  if (TF_GetCode(status) == TF_OK) TF_ShapeInferenceContextSetOutput(ctx, 0, out, status);
  TF_DeleteShapeHandle(out);
  TF_DeleteShapeHandle(in);
}

// grad_predictions has the shape of predictions (input 1).
void GradShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeHandle* in = TF_NewShapeHandle();
  TF_ShapeInferenceContextGetInput(ctx, 1, in, status);
  if (TF_GetCode(status) == TF_OK) TF_ShapeInferenceContextSetOutput(ctx, 0, in, status);
  TF_DeleteShapeHandle(in);
}

const tfmo::OnLoad kRegister([] {
  TF_OpDefinitionBuilder* op = TF_NewOpDefinitionBuilder("RobustLoss");
  TF_OpDefinitionBuilderAddInput(op, "predictions: float");
  TF_OpDefinitionBuilderAddInput(op, "targets: float");
  TF_OpDefinitionBuilderAddOutput(op, "loss: float");
  TF_OpDefinitionBuilderAddAttr(op, "epsilon: float = 0.001");
  TF_OpDefinitionBuilderSetShapeInferenceFunction(op, &LossShape);
  tfmo::RegisterOp(op);

  TF_OpDefinitionBuilder* grad = TF_NewOpDefinitionBuilder("RobustLossGrad");
  TF_OpDefinitionBuilderAddInput(grad, "grad_loss: float");
  TF_OpDefinitionBuilderAddInput(grad, "predictions: float");
  TF_OpDefinitionBuilderAddInput(grad, "targets: float");
  TF_OpDefinitionBuilderAddOutput(grad, "grad_predictions: float");
  TF_OpDefinitionBuilderAddAttr(grad, "epsilon: float = 0.001");
  TF_OpDefinitionBuilderSetShapeInferenceFunction(grad, &GradShape);
  tfmo::RegisterOp(grad);

  tfmo::KernelSpec spec;
  spec.device = "CPU";
  spec.create = &robust_loss::CreateEps;
  spec.destroy = &robust_loss::DeleteEps;
  spec.op = "RobustLoss";
  spec.compute = &LossCpu;
  tfmo::RegisterKernel(spec);
  spec.op = "RobustLossGrad";
  spec.compute = &GradCpu;
  tfmo::RegisterKernel(spec);
});

}  // namespace
