// Host-side argument checks of the rendering ops (csrc/ops/render_op.cc), shared by the CPU kernels and the GPU host
// code (shapes and dtypes only: value checks such as sorted t happen per ray inside the kernels). The checks both
// rendering families use (dtypes, shapes, the background, the threshold attr and the kernel state) are here;
// csrc/ops/render_packed_args.h adds those of the packed ops.
// Every failure names the op and the argument, and fails the kernel with InvalidArgument.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "common/op_names.h"
#include "common/tfc.h"

namespace tfmo::render {

enum BackgroundMode : int { kNoBackground = 0, kSharedBackground = 1, kPerRayBackground = 2 };

// What every rendering op's validation finds: R rays of C channels and the background's mode.
struct RayDims {
  int64_t R = 0, C = 0;
  BackgroundMode bg = kNoBackground;
};
// VolumeRender(Grad): S samples per ray.
struct VrDims : RayDims {
  int64_t S = 0;
};

inline bool CheckFloat(TF_OpKernelContext* ctx, const char* op, const char* name, const TensorRef& t) {
  return CheckDtype(ctx, op, name, t, TF_FLOAT);
}

inline bool CheckShape(TF_OpKernelContext* ctx, const char* op, const char* name, const TensorRef& t,
                       std::initializer_list<int64_t> want, const char* spelled) {
  bool ok = t.rank() == static_cast<int>(want.size());
  int i = 0;
  for (int64_t d : want) ok = ok && t.dim(i++) == d;
  if (ok) return true;
  return Fail(ctx, TF_INVALID_ARGUMENT, "%s: %s must have shape %s, got %s", op, name, spelled,
              ShapeString(t).c_str());
}

inline std::string Dims(std::initializer_list<int64_t> d) {
  std::string s = "[";
  for (int64_t x : d) s += (s.size() > 1 ? ", " : "") + std::to_string(x);
  return s + "]";
}

// background: [0] (none), [C] (shared) or [R, C] (per ray); sets *mode.
inline bool ClassifyBackground(TF_OpKernelContext* ctx, const char* op, const TensorRef& bg, int64_t R, int64_t C,
                               BackgroundMode* mode) {
  if (bg.rank() == 1 && bg.dim(0) == 0) {
    *mode = kNoBackground;
  } else if (bg.rank() == 1 && bg.dim(0) == C) {
    *mode = kSharedBackground;
  } else if (bg.rank() == 2 && bg.dim(0) == R && bg.dim(1) == C) {
    *mode = kPerRayBackground;
  } else {
    return Fail(ctx, TF_INVALID_ARGUMENT,
                "%s: background must have shape [C] = [%lld], [rays, C] = [%lld, %lld], or [0] for none; got %s",
                op, static_cast<long long>(C), static_cast<long long>(R), static_cast<long long>(C),
                ShapeString(bg).c_str());
  }
  return true;
}

// The background row of ray r for a validated mode (nullptr: none).
inline const float* BackgroundRow(BackgroundMode mode, const float* bg, int64_t r, int64_t C) {
  switch (mode) {
    case kSharedBackground: return bg;
    case kPerRayBackground: return bg + r * C;
    default: return nullptr;
  }
}

// densities [R,S], colors [R,S,C] with C >= 1, t [R,S+1], background [C], [R,C] or [0].
inline bool ValidateVolumeRender(TF_OpKernelContext* ctx, const char* op, const TensorRef& dens,
                                 const TensorRef& cols, const TensorRef& t, const TensorRef& bg, VrDims* d) {
  if (!CheckFloat(ctx, op, "densities", dens) || !CheckFloat(ctx, op, "colors", cols) ||
      !CheckFloat(ctx, op, "t", t) || !CheckFloat(ctx, op, "background", bg))
    return false;
  if (dens.rank() != 2)
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: densities must have rank 2 [rays, samples], got shape %s", op,
                ShapeString(dens).c_str());
  d->R = dens.dim(0);
  d->S = dens.dim(1);
  if (cols.rank() != 3 || cols.dim(0) != d->R || cols.dim(1) != d->S || cols.dim(2) < 1)
    return Fail(ctx, TF_INVALID_ARGUMENT,
                "%s: colors must have shape [rays, samples, channels] = [%lld, %lld, C] with C >= 1 "
                "(matching densities), got %s",
                op, static_cast<long long>(d->R), static_cast<long long>(d->S), ShapeString(cols).c_str());
  d->C = cols.dim(2);
  if (!CheckShape(ctx, op, "t (interval edges, one more than samples)", t, {d->R, d->S + 1},
                  Dims({d->R, d->S + 1}).c_str()))
    return false;
  return ClassifyBackground(ctx, op, bg, d->R, d->C, &d->bg);
}

// The upstream gradients of the volume-render gradient ops: grad_color [R,C], grad_depth [R], grad_opacity [R] and
// grad_weights shaped like the weights (`weights`: [R,S] for VolumeRenderGrad, [N] for VolumeRenderPackedGrad).
inline bool ValidateUpstream(TF_OpKernelContext* ctx, const char* op, const RayDims& d,
                             std::initializer_list<int64_t> weights, const TensorRef& gc, const TensorRef& gd,
                             const TensorRef& go, const TensorRef& gw) {
  return CheckFloat(ctx, op, "grad_color", gc) && CheckFloat(ctx, op, "grad_depth", gd) &&
         CheckFloat(ctx, op, "grad_opacity", go) && CheckFloat(ctx, op, "grad_weights", gw) &&
         CheckShape(ctx, op, "grad_color", gc, {d.R, d.C}, Dims({d.R, d.C}).c_str()) &&
         CheckShape(ctx, op, "grad_depth", gd, {d.R}, Dims({d.R}).c_str()) &&
         CheckShape(ctx, op, "grad_opacity", go, {d.R}, Dims({d.R}).c_str()) &&
         CheckShape(ctx, op, "grad_weights", gw, weights, Dims(weights).c_str());
}

// The upstream gradients of VolumeRenderGrad (inputs 4..7).
inline bool ValidateVolumeRenderUpstream(TF_OpKernelContext* ctx, const char* op, const VrDims& d,
                                         const TensorRef& gc, const TensorRef& gd, const TensorRef& go,
                                         const TensorRef& gw) {
  return ValidateUpstream(ctx, op, d, {d.R, d.S}, gc, gd, go, gw);
}

// weights [R,S], t [R,S+1].
inline bool ValidateDistortionLoss(TF_OpKernelContext* ctx, const char* op, const TensorRef& w,
                                   const TensorRef& t, int64_t* R, int64_t* S) {
  if (!CheckFloat(ctx, op, "weights", w) || !CheckFloat(ctx, op, "t", t)) return false;
  if (w.rank() != 2)
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: weights must have rank 2 [rays, samples], got shape %s", op,
                ShapeString(w).c_str());
  *R = w.dim(0);
  *S = w.dim(1);
  return CheckShape(ctx, op, "t (interval edges, one more than samples)", t, {*R, *S + 1},
                    Dims({*R, *S + 1}).c_str());
}

// DistortionLoss: reads and validates (weights, t), allocates loss [R]. Returns false after failing ctx.
inline bool PrepareDistortionLoss(TF_OpKernelContext* ctx, const char* op, TensorRef* w, TensorRef* t,
                                  TensorRef* loss, int64_t* R, int64_t* S) {
  return GetInput(ctx, 0, w) && GetInput(ctx, 1, t) && ValidateDistortionLoss(ctx, op, *w, *t, R, S) &&
         AllocateOutput(ctx, 0, TF_FLOAT, {*R}, loss);
}

// DistortionLossGrad: reads and validates (weights, t, grad_loss), allocates (grad_weights [R,S], grad_t [R,S+1]).
// Returns false after failing ctx.
inline bool PrepareDistortionLossGrad(TF_OpKernelContext* ctx, const char* op, TensorRef* w, TensorRef* t,
                                      TensorRef* g, TensorRef* gw, TensorRef* gt, int64_t* R, int64_t* S) {
  if (!GetInput(ctx, 0, w) || !GetInput(ctx, 1, t) || !GetInput(ctx, 2, g)) return false;
  if (!ValidateDistortionLoss(ctx, op, *w, *t, R, S) || !CheckFloat(ctx, op, "grad_loss", *g) ||
      !CheckShape(ctx, op, "grad_loss", *g, {*R}, Dims({*R}).c_str()))
    return false;
  return AllocateOutput(ctx, 0, TF_FLOAT, {*R, *S}, gw) && AllocateOutput(ctx, 1, TF_FLOAT, {*R, *S + 1}, gt);
}

// termination_threshold attr: finite, in [0, 1].
inline bool ReadThreshold(TF_OpKernelConstruction* c, const char* op, float* thr) {
  if (!GetAttr(c, "termination_threshold", thr)) return false;
  if (!(*thr >= 0.0f && *thr <= 1.0f))
    return ConstructionFail(c, TF_INVALID_ARGUMENT, "%s: termination_threshold must be in [0, 1], got %g", op,
                            static_cast<double>(*thr));
  return true;
}

// Kernel state of VolumeRender and VolumeRenderGrad (CPU and GPU): the validated threshold attr.
struct VrAttrs {
  float threshold = 0.0f;
};
// Kernel state of a rendering op `op`: its VrAttrs, or nullptr after failing construction.
inline void* NewVrAttrs(TF_OpKernelConstruction* c, const char* op) {
  auto* a = new VrAttrs;
  if (!ReadThreshold(c, op, &a->threshold)) {
    delete a;
    return nullptr;
  }
  return a;
}
inline void* VrCreate(TF_OpKernelConstruction* c) { return NewVrAttrs(c, "volume_render"); }
inline void VrDelete(void* p) { delete static_cast<VrAttrs*>(p); }

// Kernel registration spec of the volume-render ops on `device`: state from `create` (VrCreate, VrpCreate).
inline KernelSpec VrKernelSpec(const char* device, void* (*create)(TF_OpKernelConstruction*)) {
  KernelSpec spec = KernelSpecFor(device);
  spec.create = create;
  spec.destroy = &VrDelete;
  return spec;
}

using Compute = void (*)(void*, TF_OpKernelContext*);

// Registers the kernels of the render family's four ops on `device` ("CPU" or "GPU").
inline void RegisterKernels(const char* device, Compute volume_render, Compute volume_render_grad,
                            Compute distortion_loss, Compute distortion_loss_grad) {
  RegisterKernelPair(VrKernelSpec(device, &VrCreate), TFMO_OP_VOLUME_RENDER, volume_render,
                     TFMO_OP_VOLUME_RENDER_GRAD, volume_render_grad);
  RegisterKernelPair(KernelSpecFor(device), TFMO_OP_DISTORTION_LOSS, distortion_loss, TFMO_OP_DISTORTION_LOSS_GRAD,
                     distortion_loss_grad);
}

}  // namespace tfmo::render
