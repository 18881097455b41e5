// Op definitions and CPU kernels of the robust photometric loss (written with tf_metal_ops' op kit):
//   RobustLoss(predictions [N, C] float, targets [N, C] float; epsilon) -> loss [N] = sum_c rho(p - t)
//   RobustLossGrad(grad_loss [N], predictions, targets; epsilon) -> grad_predictions [N, C] = grad_loss * rho'(p - t)
// rho and rho' live in robust_loss_math.h, shared with the Metal kernel. The kernel validates its inputs itself:
// eager mode runs no shape function.
#include "common/shape_fns.h"
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
  tfmo::Shape p, n;
  if (tfmo::InputWithRank(ctx, 0, 2, &p, status) && tfmo::Subshape(ctx, p, 0, 1, &n, status))
    tfmo::SetOutputs(ctx, {&n}, status);
}

// grad_predictions has the shape of predictions (input 1).
void GradShape(TF_ShapeInferenceContext* ctx, TF_Status* status) { tfmo::OutputsLikeInputs(ctx, {1}, status); }

const tfmo::OnLoad kRegister([] {
  tfmo::DefineOp("RobustLoss", {"epsilon: float = 0.001"}, {"predictions: float", "targets: float"},
                 {"loss: float"}, &LossShape);
  tfmo::DefineOp("RobustLossGrad", {"epsilon: float = 0.001"},
                 {"grad_loss: float", "predictions: float", "targets: float"}, {"grad_predictions: float"},
                 &GradShape);
  tfmo::RegisterKernelPair(robust_loss::KernelSpec("CPU"), "RobustLoss", &LossCpu, "RobustLossGrad", &GradCpu);
});

}  // namespace
