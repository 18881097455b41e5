// Host-side parts shared by the CPU kernels (robust_loss_op.cc) and the GPU kernels' host code (robust_loss_gpu.cc):
// the epsilon attr, the kernel spec and the input checks. Every failure is an InvalidArgumentError naming the argument.
#pragma once

#include "common/tfc.h"

namespace robust_loss {

inline void* CreateEps(TF_OpKernelConstruction* c) {
  float eps = 0;
  if (!tfmo::GetAttr(c, "epsilon", &eps)) return nullptr;
  if (!(eps > 0.0f)) {
    tfmo::ConstructionFail(c, TF_INVALID_ARGUMENT, "robust_loss: epsilon must be > 0, got %g", eps);
    return nullptr;
  }
  return new float(eps);
}
inline void DeleteEps(void* p) { delete static_cast<float*>(p); }
inline float Eps(void* state) { return *static_cast<float*>(state); }

// The kernel spec both ops register on `device` ("CPU" or "GPU"): epsilon as the kernel state.
inline tfmo::KernelSpec KernelSpec(const char* device) {
  tfmo::KernelSpec spec = tfmo::KernelSpecFor(device);
  spec.create = &CreateEps;
  spec.destroy = &DeleteEps;
  return spec;
}

// predictions and targets: float32 [N, C] of one shape.
inline bool Validate(TF_OpKernelContext* ctx, const tfmo::TensorRef& p, const tfmo::TensorRef& t) {
  if (p.dtype() != TF_FLOAT || t.dtype() != TF_FLOAT)
    return tfmo::Fail(ctx, TF_INVALID_ARGUMENT, "robust_loss: predictions and targets must be float32, got %s and %s",
                      tfmo::DataTypeName(p.dtype()), tfmo::DataTypeName(t.dtype()));
  if (p.rank() != 2 || p.shape() != t.shape())
    return tfmo::Fail(ctx, TF_INVALID_ARGUMENT, "robust_loss: predictions and targets must be [N, C] of one shape, "
                      "got %s and %s", tfmo::ShapeString(p).c_str(), tfmo::ShapeString(t).c_str());
  return true;
}

// grad_loss: float32 [N].
inline bool ValidateGrad(TF_OpKernelContext* ctx, const tfmo::TensorRef& g, int64_t n) {
  if (g.dtype() == TF_FLOAT && g.rank() == 1 && g.dim(0) == n) return true;
  return tfmo::Fail(ctx, TF_INVALID_ARGUMENT, "robust_loss: grad_loss must be float32 [%lld], got %s %s",
                    static_cast<long long>(n), tfmo::DataTypeName(g.dtype()), tfmo::ShapeString(g).c_str());
}

}  // namespace robust_loss
