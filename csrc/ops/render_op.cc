// Op definitions of the NeRF rendering ops. Math and conventions: csrc/shared/render_math.h.
//
// VolumeRender(densities [R,S], colors [R,S,C], t [R,S+1], background) ->
//     color [R,C], depth [R], opacity [R], weights [R,S]
//   background: [C] (shared), [R,C] (per ray) or [0] (none: composite over black). C >= 1, S >= 1, R >= 0.
//   attr termination_threshold in [0, 1]: a ray stops before the first sample whose transmittance is below it.
// VolumeRenderGrad(densities, colors, t, background, grad_color, grad_depth, grad_opacity, grad_weights) ->
//     grad_densities [R,S], grad_colors [R,S,C], grad_t [R,S+1], grad_background
//   grad_background is always per ray, [R,C] = T_final * grad_color (the gradient w.r.t. a per-ray background,
//   whatever background was given). The caller sums it over rays for a shared [C] background and drops it for
//   none (tf_metal_ops/render/ops.py does): that keeps the kernels one-thread-per-ray and deterministic, with no
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
using tfmo::Subshape;

// Inputs densities [R,S], colors [R,S,C], t [R,S+1] of both VolumeRender ops, plus [R] and [R,C].
bool VolumeRenderInputs(TF_ShapeInferenceContext* ctx, TF_Status* status, Shape* dens, Shape* cols, Shape* t,
                        Shape* r, Shape* rc) {
  Shape c;
  return InputWithRank(ctx, 0, 2, dens, status) && InputWithRank(ctx, 1, 3, cols, status) &&
         InputWithRank(ctx, 2, 2, t, status) && Subshape(ctx, *dens, 0, 1, r, status) &&
         Subshape(ctx, *cols, 2, 3, &c, status) && tfmo::Concatenate(ctx, r->h, c.h, rc, status);
}

void VolumeRenderShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  Shape dens, cols, t, r, rc;
  if (VolumeRenderInputs(ctx, status, &dens, &cols, &t, &r, &rc))
    tfmo::SetOutputs(ctx, {&rc, &r, &r, &dens}, status);
}

void VolumeRenderGradShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  Shape dens, cols, t, r, rc;
  if (VolumeRenderInputs(ctx, status, &dens, &cols, &t, &r, &rc))
    tfmo::SetOutputs(ctx, {&dens, &cols, &t, &rc}, status);
}

void DistortionLossShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  Shape w, t, r;
  if (InputWithRank(ctx, 0, 2, &w, status) && InputWithRank(ctx, 1, 2, &t, status) &&
      Subshape(ctx, w, 0, 1, &r, status))
    tfmo::SetOutputs(ctx, {&r}, status);
}

void DistortionLossGradShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  Shape w, t;
  if (InputWithRank(ctx, 0, 2, &w, status) && InputWithRank(ctx, 1, 2, &t, status))
    tfmo::SetOutputs(ctx, {&w, &t}, status);
}

static const tfmo::OnLoad kRegister([] {
  const char* threshold = "termination_threshold: float = 0.0";
  tfmo::DefineOp(TFMO_OP_VOLUME_RENDER, {threshold},
                 {"densities: float", "colors: float", "t: float", "background: float"}, {"color: float", "depth: float", "opacity: float", "weights: float"}, &VolumeRenderShape);
  tfmo::DefineOp(TFMO_OP_VOLUME_RENDER_GRAD, {threshold},
                 {"densities: float", "colors: float", "t: float", "background: float", "grad_color: float",
                  "grad_depth: float", "grad_opacity: float", "grad_weights: float"},
                 {"grad_densities: float", "grad_colors: float", "grad_t: float", "grad_background: float"},
                 &VolumeRenderGradShape);
  tfmo::DefineOp(TFMO_OP_DISTORTION_LOSS, {}, {"weights: float", "t: float"}, {"loss: float"}, &DistortionLossShape);
  tfmo::DefineOp(TFMO_OP_DISTORTION_LOSS_GRAD, {}, {"weights: float", "t: float", "grad_loss: float"},
                 {"grad_weights: float", "grad_t: float"}, &DistortionLossGradShape);
});

}  // namespace
