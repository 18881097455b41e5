#include "common/shape_fns.h"

namespace tfmo {

void UnchangedShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeHandle* in = TF_NewShapeHandle();
  TF_ShapeInferenceContextGetInput(ctx, 0, in, status);
  if (TF_GetCode(status) == TF_OK) TF_ShapeInferenceContextSetOutput(ctx, 0, in, status);
  TF_DeleteShapeHandle(in);
}

bool InputWithRank(TF_ShapeInferenceContext* ctx, int i, int rank, Shape* out, TF_Status* status) {
  Shape in;
  TF_ShapeInferenceContextGetInput(ctx, i, in.h, status);
  if (TF_GetCode(status) != TF_OK) return false;
  TF_ShapeInferenceContextWithRank(ctx, in.h, rank, out->h, status);
  return TF_GetCode(status) == TF_OK;
}

}  // namespace tfmo
