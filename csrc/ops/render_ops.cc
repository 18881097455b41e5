// Op definitions of the NeRF rendering ops. Math and conventions: csrc/shared/volume_render_math.h.
//
// VolumeRender(densities [R,S], colors [R,S,C], t [R,S+1], background) ->
//     color [R,C], depth [R], opacity [R], weights [R,S]
//   background: [C] (shared), [R,C] (per ray) or [0] (none: composite over black). C >= 1, S >= 1, R >= 0.
//   attr termination_threshold in [0, 1]: a ray stops before the first sample whose transmittance is below it.
// VolumeRenderGrad(densities, colors, t, background, grad_color, grad_depth, grad_opacity, grad_weights) ->
//     grad_densities [R,S], grad_colors [R,S,C], grad_t [R,S+1], grad_background
//   grad_background is always per ray, [R,C] = T_final * grad_color (the gradient w.r.t. a per-ray background,
//   whatever background was given). The caller sums it over rays for a shared [C] background and drops it for
//   none (tf_metal_ops/render.py does): that keeps the kernels one-thread-per-ray and deterministic, with no
//   cross-ray reduction or atomics.
// DistortionLoss(weights [R,S], t [R,S+1]) -> loss [R]
// DistortionLossGrad(weights, t, grad_loss [R]) -> grad_weights [R,S], grad_t [R,S+1]
// All tensors float32. The shape functions (graph mode only) check ranks; the kernels check everything.
#include "common/op_names.h"
#include "common/shape_fns.h"
#include "common/tfc.h"

namespace {

using tfmo::InputWithRank;
using tfmo::Shape;

// out = dims [begin, end) of s.
bool Sub(TF_ShapeInferenceContext* ctx, const Shape& s, int64_t begin, int64_t end, Shape* out, TF_Status* status) {
  TF_ShapeInferenceContextSubshape(ctx, s.h, begin, end, out->h, status);
  return TF_GetCode(status) == TF_OK;
}

// Inputs densities [R,S], colors [R,S,C], t [R,S+1] of both VolumeRender ops, plus [R] and [R,C].
bool VolumeRenderInputs(TF_ShapeInferenceContext* ctx, TF_Status* status, Shape* dens, Shape* cols, Shape* t,
                        Shape* r, Shape* rc) {
  Shape c;
  if (!InputWithRank(ctx, 0, 2, dens, status) || !InputWithRank(ctx, 1, 3, cols, status) ||
      !InputWithRank(ctx, 2, 2, t, status) || !Sub(ctx, *dens, 0, 1, r, status) || !Sub(ctx, *cols, 2, 3, &c, status))
    return false;
  TF_ShapeInferenceContextConcatenateShapes(ctx, r->h, c.h, rc->h, status);
  return TF_GetCode(status) == TF_OK;
}

void VolumeRenderShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  Shape dens, cols, t, r, rc;
  if (!VolumeRenderInputs(ctx, status, &dens, &cols, &t, &r, &rc)) return;
  TF_ShapeInferenceContextSetOutput(ctx, 0, rc.h, status);
  TF_ShapeInferenceContextSetOutput(ctx, 1, r.h, status);
  TF_ShapeInferenceContextSetOutput(ctx, 2, r.h, status);
  TF_ShapeInferenceContextSetOutput(ctx, 3, dens.h, status);
}

void VolumeRenderGradShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  Shape dens, cols, t, r, rc;
  if (!VolumeRenderInputs(ctx, status, &dens, &cols, &t, &r, &rc)) return;
  TF_ShapeInferenceContextSetOutput(ctx, 0, dens.h, status);
  TF_ShapeInferenceContextSetOutput(ctx, 1, cols.h, status);
  TF_ShapeInferenceContextSetOutput(ctx, 2, t.h, status);
  TF_ShapeInferenceContextSetOutput(ctx, 3, rc.h, status);
}

void DistortionLossShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  Shape w, t, r;
  if (!InputWithRank(ctx, 0, 2, &w, status) || !InputWithRank(ctx, 1, 2, &t, status)) return;
  if (!Sub(ctx, w, 0, 1, &r, status)) return;
  TF_ShapeInferenceContextSetOutput(ctx, 0, r.h, status);
}

void DistortionLossGradShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  Shape w, t;
  if (!InputWithRank(ctx, 0, 2, &w, status) || !InputWithRank(ctx, 1, 2, &t, status)) return;
  TF_ShapeInferenceContextSetOutput(ctx, 0, w.h, status);
  TF_ShapeInferenceContextSetOutput(ctx, 1, t.h, status);
}

const char* const kThresholdAttr = "termination_threshold: float = 0.0";

static const tfmo::OnLoad kRegister([] {
  TF_OpDefinitionBuilder* b = TF_NewOpDefinitionBuilder(TFMO_OP_VOLUME_RENDER);
  TF_OpDefinitionBuilderAddAttr(b, kThresholdAttr);
  TF_OpDefinitionBuilderAddInput(b, "densities: float");
  TF_OpDefinitionBuilderAddInput(b, "colors: float");
  TF_OpDefinitionBuilderAddInput(b, "t: float");
  TF_OpDefinitionBuilderAddInput(b, "background: float");
  TF_OpDefinitionBuilderAddOutput(b, "color: float");
  TF_OpDefinitionBuilderAddOutput(b, "depth: float");
  TF_OpDefinitionBuilderAddOutput(b, "opacity: float");
  TF_OpDefinitionBuilderAddOutput(b, "weights: float");
  TF_OpDefinitionBuilderSetShapeInferenceFunction(b, &VolumeRenderShape);
  tfmo::RegisterOp(b);

  b = TF_NewOpDefinitionBuilder(TFMO_OP_VOLUME_RENDER_GRAD);
  TF_OpDefinitionBuilderAddAttr(b, kThresholdAttr);
  TF_OpDefinitionBuilderAddInput(b, "densities: float");
  TF_OpDefinitionBuilderAddInput(b, "colors: float");
  TF_OpDefinitionBuilderAddInput(b, "t: float");
  TF_OpDefinitionBuilderAddInput(b, "background: float");
  TF_OpDefinitionBuilderAddInput(b, "grad_color: float");
  TF_OpDefinitionBuilderAddInput(b, "grad_depth: float");
  TF_OpDefinitionBuilderAddInput(b, "grad_opacity: float");
  TF_OpDefinitionBuilderAddInput(b, "grad_weights: float");
  TF_OpDefinitionBuilderAddOutput(b, "grad_densities: float");
  TF_OpDefinitionBuilderAddOutput(b, "grad_colors: float");
  TF_OpDefinitionBuilderAddOutput(b, "grad_t: float");
  TF_OpDefinitionBuilderAddOutput(b, "grad_background: float");
  TF_OpDefinitionBuilderSetShapeInferenceFunction(b, &VolumeRenderGradShape);
  tfmo::RegisterOp(b);

  b = TF_NewOpDefinitionBuilder(TFMO_OP_DISTORTION_LOSS);
  TF_OpDefinitionBuilderAddInput(b, "weights: float");
  TF_OpDefinitionBuilderAddInput(b, "t: float");
  TF_OpDefinitionBuilderAddOutput(b, "loss: float");
  TF_OpDefinitionBuilderSetShapeInferenceFunction(b, &DistortionLossShape);
  tfmo::RegisterOp(b);

  b = TF_NewOpDefinitionBuilder(TFMO_OP_DISTORTION_LOSS_GRAD);
  TF_OpDefinitionBuilderAddInput(b, "weights: float");
  TF_OpDefinitionBuilderAddInput(b, "t: float");
  TF_OpDefinitionBuilderAddInput(b, "grad_loss: float");
  TF_OpDefinitionBuilderAddOutput(b, "grad_weights: float");
  TF_OpDefinitionBuilderAddOutput(b, "grad_t: float");
  TF_OpDefinitionBuilderSetShapeInferenceFunction(b, &DistortionLossGradShape);
  tfmo::RegisterOp(b);
});

}  // namespace
