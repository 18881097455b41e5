// Host-side argument checks of the packed rendering ops (csrc/ops/render_packed_op.cc), shared by the CPU
// kernels and the GPU host code: dtypes and shapes. RowSplitsError reads row_splits values, so only the CPU
// kernels (host memory) call it; the GPU kernels apply the NaN policy instead (metal_kernels/render_packed.metal).
// Every failure names the op and the argument and fails the kernel with InvalidArgument.
#pragma once

#include <cstdint>

#include "common/op_names.h"
#include "common/tfc.h"
#include "ops/render_args.h"

namespace tfmo::render_packed {

// The packed ops build on the render family's checks and kernel state.
using namespace tfmo::render;

// VolumeRenderPacked(Grad): N samples in total.
struct VrpDims : RayDims {
  int64_t N = 0;
};

// row_splits int32 [R+1] with R + 1 >= 1; sets *R.
inline bool ValidateRowSplitsShape(TF_OpKernelContext* ctx, const char* op, const TensorRef& rs, int64_t* R) {
  if (!CheckDtype(ctx, op, "row_splits", rs, TF_INT32)) return false;
  if (rs.rank() != 1 || rs.dim(0) < 1)
    return Fail(ctx, TF_INVALID_ARGUMENT,
                "%s: row_splits must have shape [R + 1] (rank 1, at least one entry), got %s", op,
                ShapeString(rs).c_str());
  *R = rs.dim(0) - 1;
  return true;
}

// t_starts [N], t_ends [N] (float32).
inline bool ValidateIntervals(TF_OpKernelContext* ctx, const char* op, int64_t N, const TensorRef& ts,
                              const TensorRef& te) {
  return CheckFloat(ctx, op, "t_starts", ts) && CheckFloat(ctx, op, "t_ends", te) &&
         CheckShape(ctx, op, "t_starts", ts, {N}, Dims({N}).c_str()) &&
         CheckShape(ctx, op, "t_ends", te, {N}, Dims({N}).c_str());
}

// densities [N], colors [N,C] with C >= 1, t_starts [N], t_ends [N], row_splits [R+1], background [C]/[R,C]/[0].
inline bool ValidateVolumeRenderPacked(TF_OpKernelContext* ctx, const char* op, const TensorRef& dens,
                                       const TensorRef& cols, const TensorRef& ts, const TensorRef& te,
                                       const TensorRef& rs, const TensorRef& bg, VrpDims* d) {
  if (!CheckFloat(ctx, op, "densities", dens) || !CheckFloat(ctx, op, "colors", cols) ||
      !CheckFloat(ctx, op, "background", bg))
    return false;
  if (dens.rank() != 1)
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: densities must have rank 1 [samples], got shape %s", op,
                ShapeString(dens).c_str());
  d->N = dens.dim(0);
  if (cols.rank() != 2 || cols.dim(0) != d->N || cols.dim(1) < 1)
    return Fail(ctx, TF_INVALID_ARGUMENT,
                "%s: colors must have shape [samples, channels] = [%lld, C] with C >= 1 (matching densities), "
                "got %s",
                op, static_cast<long long>(d->N), ShapeString(cols).c_str());
  d->C = cols.dim(1);
  return ValidateIntervals(ctx, op, d->N, ts, te) && ValidateRowSplitsShape(ctx, op, rs, &d->R) &&
         ClassifyBackground(ctx, op, bg, d->R, d->C, &d->bg);
}

// The upstream gradients of VolumeRenderPackedGrad (inputs 6..9).
inline bool ValidateVolumeRenderPackedUpstream(TF_OpKernelContext* ctx, const char* op, const VrpDims& d,
                                               const TensorRef& gc, const TensorRef& gd, const TensorRef& go,
                                               const TensorRef& gw) {
  return ValidateUpstream(ctx, op, d, {d.N}, gc, gd, go, gw);
}

// weights [N], t_starts [N], t_ends [N], row_splits [R+1].
inline bool ValidateDistortionLossPacked(TF_OpKernelContext* ctx, const char* op, const TensorRef& w,
                                         const TensorRef& ts, const TensorRef& te, const TensorRef& rs, int64_t* R,
                                         int64_t* N) {
  if (!CheckFloat(ctx, op, "weights", w)) return false;
  if (w.rank() != 1)
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: weights must have rank 1 [samples], got shape %s", op,
                ShapeString(w).c_str());
  *N = w.dim(0);
  return ValidateIntervals(ctx, op, *N, ts, te) && ValidateRowSplitsShape(ctx, op, rs, R);
}

// A row_splits shape that no values can make valid: R = 0 rays but N > 0 samples (row_splits = [0] needs N = 0).
// Both backends reject it on the host (the GPU kernels have no ray thread to report it through).
inline bool CheckSamplesWithoutRays(TF_OpKernelContext* ctx, const char* op, int64_t R, int64_t N) {
  if (R > 0 || N == 0) return true;
  return Fail(ctx, TF_INVALID_ARGUMENT,
              "%s: row_splits has one entry (0 rays) but there are %lld samples; row_splits[R] must equal N", op,
              static_cast<long long>(N));
}

// Value checks of row_splits (host memory): row_splits[0] = 0, non-decreasing, row_splits[R] = N.
// Fails ctx and returns false on the first violation.
inline bool ValidateRowSplitsValues(TF_OpKernelContext* ctx, const char* op, const int32_t* rs, int64_t R,
                                    int64_t N) {
  if (rs[0] != 0)
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: row_splits[0] must be 0, got %d", op, static_cast<int>(rs[0]));
  for (int64_t r = 0; r < R; ++r)
    if (rs[r + 1] < rs[r])
      return Fail(ctx, TF_INVALID_ARGUMENT,
                  "%s: row_splits must be non-decreasing, got row_splits[%lld] = %d > row_splits[%lld] = %d", op,
                  static_cast<long long>(r), static_cast<int>(rs[r]), static_cast<long long>(r + 1),
                  static_cast<int>(rs[r + 1]));
  if (rs[R] != N)
    return Fail(ctx, TF_INVALID_ARGUMENT,
                "%s: row_splits[R] = row_splits[%lld] must equal the number of samples N = %lld, got %d", op,
                static_cast<long long>(R), static_cast<long long>(N), static_cast<int>(rs[R]));
  return true;
}

// Kernel state of VolumeRenderPacked(Grad) (CPU and GPU): the validated threshold attr (VrAttrs, deleted by VrDelete).
inline void* VrpCreate(TF_OpKernelConstruction* c) { return NewVrAttrs(c, "volume_render_packed"); }

// Registers the kernels of the render_packed family's four ops on `device` ("CPU" or "GPU").
inline void RegisterKernels(const char* device, Compute volume_render_packed, Compute volume_render_packed_grad,
                            Compute distortion_loss_packed, Compute distortion_loss_packed_grad) {
  RegisterKernelPair(VrKernelSpec(device, &VrpCreate), TFMO_OP_VOLUME_RENDER_PACKED, volume_render_packed,
                     TFMO_OP_VOLUME_RENDER_PACKED_GRAD, volume_render_packed_grad);
  RegisterKernelPair(KernelSpecFor(device), TFMO_OP_DISTORTION_LOSS_PACKED, distortion_loss_packed,
                     TFMO_OP_DISTORTION_LOSS_PACKED_GRAD, distortion_loss_packed_grad);
}

}  // namespace tfmo::render_packed
