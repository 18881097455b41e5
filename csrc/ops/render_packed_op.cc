// Op definitions of the packed (ragged) rendering ops. Conventions and math: csrc/shared/render_math.h
// ("Packed"); the same quadrature as VolumeRender / DistortionLoss (csrc/ops/render_op.cc).
//
// R rays, N samples in total; ray r owns samples k in [row_splits[r], row_splits[r+1]) (int32 [R+1],
// row_splits[0] = 0, non-decreasing, row_splits[R] = N: tf.RaggedTensor.from_row_splits works). Sample k covers
// [t_starts[k], t_ends[k]]; within a ray t_starts[k] <= t_ends[k] <= t_starts[k+1] (gaps allowed).
//
// VolumeRenderPacked(densities [N], colors [N,C], t_starts [N], t_ends [N], row_splits [R+1], background) ->
//     color [R,C], depth [R], opacity [R], weights [N]
//   background: [C], [R,C] or [0] (none); attr termination_threshold in [0, 1] as VolumeRender. A ray with no
//   samples gives the background, depth 0 and opacity 0.
// VolumeRenderPackedGrad(densities, colors, t_starts, t_ends, row_splits, background, grad_color [R,C],
//     grad_depth [R], grad_opacity [R], grad_weights [N]) ->
//     grad_densities [N], grad_colors [N,C], grad_t_starts [N], grad_t_ends [N], grad_background [R,C]
//   grad_background is per ray, as VolumeRenderGrad's (the caller reduces it for a shared or no background).
// DistortionLossPacked(weights [N], t_starts [N], t_ends [N], row_splits [R+1]) -> loss [R]
// DistortionLossPackedGrad(weights, t_starts, t_ends, row_splits, grad_loss [R]) ->
//     grad_weights [N], grad_t_starts [N], grad_t_ends [N]
// Float tensors are float32, row_splits int32. The shape functions (graph mode only) check ranks; the kernels
// check everything (CPU: InvalidArgument; GPU: shapes on the host, values by the NaN policy of the kernels).
#include "common/op_names.h"
#include "common/shape_fns.h"
#include "common/tfc.h"

namespace {

using tfmo::InputWithRank;
using tfmo::Shape;

// *r = [R] from row_splits [R+1] at input i: [R] when R + 1 is known (and >= 1), else [?] (row_splits' own shape).
bool RaysFromSplits(TF_ShapeInferenceContext* ctx, int i, Shape* r, TF_Status* status) {
  Shape splits;
  if (!InputWithRank(ctx, i, 1, &splits, status)) return false;
  TF_DimensionHandle* d = TF_NewDimensionHandle();
  TF_ShapeInferenceContextDim(ctx, splits.h, 0, d);
  const bool known = TF_DimensionHandleValueKnown(d) != 0;
  const int64_t n = known ? TF_DimensionHandleValue(d) : -1;
  TF_DeleteDimensionHandle(d);
  if (known && n < 1) {
    TF_SetStatus(status, TF_INVALID_ARGUMENT, "row_splits must have R + 1 >= 1 entries, got 0");
    return false;
  }
  TF_ShapeHandle* v = known ? TF_ShapeInferenceContextVectorFromSize(ctx, static_cast<size_t>(n - 1)) : nullptr;
  TF_ShapeInferenceContextSubshape(ctx, v != nullptr ? v : splits.h, 0, 1, r->h, status);
  if (v != nullptr) TF_DeleteShapeHandle(v);
  return TF_GetCode(status) == TF_OK;
}

// densities [N], colors [N,C], t_starts [N], t_ends [N], row_splits [R+1]: *n = [N], *r = [R], *rc = [R,C].
bool VrpInputs(TF_ShapeInferenceContext* ctx, TF_Status* status, Shape* n, Shape* cols, Shape* r, Shape* rc) {
  Shape c;
  return InputWithRank(ctx, 0, 1, n, status) && InputWithRank(ctx, 1, 2, cols, status) &&
         tfmo::InputsWithRanks(ctx, 2, {1, 1}, status) && RaysFromSplits(ctx, 4, r, status) &&
         tfmo::Subshape(ctx, *cols, 1, 2, &c, status) && tfmo::Concatenate(ctx, r->h, c.h, rc, status);
}

void VrpShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  Shape n, cols, r, rc;
  if (VrpInputs(ctx, status, &n, &cols, &r, &rc)) tfmo::SetOutputs(ctx, {&rc, &r, &r, &n}, status);
}

void VrpGradShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  Shape n, cols, r, rc;
  if (VrpInputs(ctx, status, &n, &cols, &r, &rc)) tfmo::SetOutputs(ctx, {&n, &cols, &n, &n, &rc}, status);
}

// weights [N], t_starts [N], t_ends [N], row_splits [R+1]: *w = [N], *r = [R].
bool DlpInputs(TF_ShapeInferenceContext* ctx, TF_Status* status, Shape* w, Shape* r) {
  return InputWithRank(ctx, 0, 1, w, status) && tfmo::InputsWithRanks(ctx, 1, {1, 1}, status) &&
         RaysFromSplits(ctx, 3, r, status);
}

void DlpShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  Shape w, r;
  if (DlpInputs(ctx, status, &w, &r)) tfmo::SetOutputs(ctx, {&r}, status);
}

void DlpGradShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  Shape w, r;
  if (DlpInputs(ctx, status, &w, &r)) tfmo::SetOutputs(ctx, {&w, &w, &w}, status);
}

static const tfmo::OnLoad kRegister([] {
  const char* threshold = "termination_threshold: float = 0.0";
  tfmo::DefineOp(TFMO_OP_VOLUME_RENDER_PACKED, {threshold},
                 {"densities: float", "colors: float", "t_starts: float", "t_ends: float", "row_splits: int32",
                  "background: float"},
                 {"color: float", "depth: float", "opacity: float", "weights: float"}, &VrpShape);
  tfmo::DefineOp(TFMO_OP_VOLUME_RENDER_PACKED_GRAD, {threshold},
                 {"densities: float", "colors: float", "t_starts: float", "t_ends: float", "row_splits: int32",
                  "background: float", "grad_color: float", "grad_depth: float", "grad_opacity: float",
                  "grad_weights: float"},
                 {"grad_densities: float", "grad_colors: float", "grad_t_starts: float", "grad_t_ends: float",
                  "grad_background: float"},
                 &VrpGradShape);
  tfmo::DefineOp(TFMO_OP_DISTORTION_LOSS_PACKED, {},
                 {"weights: float", "t_starts: float", "t_ends: float", "row_splits: int32"}, {"loss: float"},
                 &DlpShape);
  tfmo::DefineOp(TFMO_OP_DISTORTION_LOSS_PACKED_GRAD, {},
                 {"weights: float", "t_starts: float", "t_ends: float", "row_splits: int32", "grad_loss: float"},
                 {"grad_weights: float", "grad_t_starts: float", "grad_t_ends: float"}, &DlpGradShape);
});

}  // namespace
