// GPU kernels' host code of the robust photometric loss (backend-neutral: the Metal backend on macOS, the emulated
// GPU on Linux). Validates exactly as the CPU kernels, allocates the outputs, describes one pass per op.
#include <cstdint>

#include "common/tfc.h"
#include "gpu/gpu_host.h"
#include "robust_loss_host.h"
#include "robust_loss_math.h"

namespace {

bool Prepare(TF_OpKernelContext* ctx, void* state, int first, tfmo::TensorRef* p, tfmo::TensorRef* t, RlArgs* args) {
  if (!tfmo::GetInput(ctx, first, p) || !tfmo::GetInput(ctx, first + 1, t) || !robust_loss::Validate(ctx, *p, *t))
    return false;
  if (!tfmo::gpu::CheckGridSize(ctx, "robust_loss", "the number of rows", p->dim(0)) ||
      !tfmo::gpu::CheckGridSize(ctx, "robust_loss", "the number of channels", p->dim(1)))
    return false;
  *args = RlArgs{static_cast<uint32_t>(p->dim(0)), static_cast<uint32_t>(p->dim(1)), robust_loss::Eps(state)};
  return true;
}

void LossGpu(void* state, TF_OpKernelContext* ctx) {
  tfmo::TensorRef p, t, loss;
  RlArgs args;
  if (!Prepare(ctx, state, 0, &p, &t, &args)) return;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {p.dim(0)}, &loss)) return;
  if (p.num_elements() == 0) {  // no buffers to bind; rows of zero channels sum to 0
    if (args.rows == 0) return;
    tfmo::gpu::Call call(ctx, "robust_loss");
    call.pass("robust_loss_forward").buffer(0, loss).buffer(1, loss).value(2, args).buffer(3, loss).threads(args.rows);
    call.Run();
    return;
  }
  tfmo::gpu::Call call(ctx, "robust_loss");
  call.pass("robust_loss_forward").buffer(0, p).buffer(1, t).value(2, args).buffer(3, loss).threads(args.rows);
  call.Run();
}

void GradGpu(void* state, TF_OpKernelContext* ctx) {
  tfmo::TensorRef g, p, t, gp;
  RlArgs args;
  if (!tfmo::GetInput(ctx, 0, &g) || !Prepare(ctx, state, 1, &p, &t, &args)) return;
  if (!robust_loss::ValidateGrad(ctx, g, p.dim(0))) return;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, p.shape(), &gp)) return;
  if (p.num_elements() == 0) return;  // nothing to write
  tfmo::gpu::Call call(ctx, "robust_loss_grad");
  call.pass("robust_loss_backward").buffer(0, g).buffer(1, p).buffer(2, t).value(3, args).buffer(4, gp)
      .threads(args.rows);
  call.Run();
}

const tfmo::OnLoad kRegister([] {
  tfmo::RegisterKernelPair(robust_loss::KernelSpec("GPU"), "RobustLoss", &LossGpu, "RobustLossGrad", &GradGpu);
});

}  // namespace
