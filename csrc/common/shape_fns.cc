#include "common/shape_fns.h"

#include "common/tfc.h"

namespace tfmo {

namespace {
bool Ok(TF_Status* status) { return TF_GetCode(status) == TF_OK; }
}  // namespace

void AddAttrs(TF_OpDefinitionBuilder* b, std::initializer_list<const char*> specs) {
  for (const char* s : specs) TF_OpDefinitionBuilderAddAttr(b, s);
}
void AddInputs(TF_OpDefinitionBuilder* b, std::initializer_list<const char*> specs) {
  for (const char* s : specs) TF_OpDefinitionBuilderAddInput(b, s);
}
void AddOutputs(TF_OpDefinitionBuilder* b, std::initializer_list<const char*> specs) {
  for (const char* s : specs) TF_OpDefinitionBuilderAddOutput(b, s);
}

void DefineOp(const char* name, std::initializer_list<const char*> attrs, std::initializer_list<const char*> inputs,
              std::initializer_list<const char*> outputs, ShapeFn shape_fn) {
  TF_OpDefinitionBuilder* b = TF_NewOpDefinitionBuilder(name);
  AddAttrs(b, attrs);
  AddInputs(b, inputs);
  AddOutputs(b, outputs);
  TF_OpDefinitionBuilderSetShapeInferenceFunction(b, shape_fn);
  RegisterOp(b);
}

void UnchangedShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeHandle* in = TF_NewShapeHandle();
  TF_ShapeInferenceContextGetInput(ctx, 0, in, status);
  if (Ok(status)) TF_ShapeInferenceContextSetOutput(ctx, 0, in, status);
  TF_DeleteShapeHandle(in);
}

bool InputWithRank(TF_ShapeInferenceContext* ctx, int i, int rank, Shape* out, TF_Status* status) {
  Shape in;
  TF_ShapeInferenceContextGetInput(ctx, i, in.h, status);
  if (!Ok(status)) return false;
  TF_ShapeInferenceContextWithRank(ctx, in.h, rank, out->h, status);
  return Ok(status);
}

bool InputsWithRanks(TF_ShapeInferenceContext* ctx, int first, std::initializer_list<int> ranks, TF_Status* status) {
  int i = first;
  for (int rank : ranks) {
    Shape s;
    if (!InputWithRank(ctx, i++, rank, &s, status)) return false;
  }
  return true;
}

bool Subshape(TF_ShapeInferenceContext* ctx, const Shape& s, int64_t begin, int64_t end, Shape* out,
              TF_Status* status) {
  TF_ShapeInferenceContextSubshape(ctx, s.h, begin, end, out->h, status);
  return Ok(status);
}

bool Concatenate(TF_ShapeInferenceContext* ctx, TF_ShapeHandle* a, TF_ShapeHandle* b, Shape* out, TF_Status* status) {
  TF_ShapeInferenceContextConcatenateShapes(ctx, a, b, out->h, status);
  return Ok(status);
}

bool OutputsLikeInputs(TF_ShapeInferenceContext* ctx, std::initializer_list<int> like, TF_Status* status) {
  int o = 0;
  for (int i : like) {
    Shape s;
    TF_ShapeInferenceContextGetInput(ctx, i, s.h, status);
    if (Ok(status)) TF_ShapeInferenceContextSetOutput(ctx, o++, s.h, status);
    if (!Ok(status)) return false;
  }
  return true;
}

bool SetOutputs(TF_ShapeInferenceContext* ctx, std::initializer_list<const Shape*> shapes, TF_Status* status) {
  int o = 0;
  for (const Shape* s : shapes) {
    TF_ShapeInferenceContextSetOutput(ctx, o++, s->h, status);
    if (!Ok(status)) return false;
  }
  return true;
}

}  // namespace tfmo
