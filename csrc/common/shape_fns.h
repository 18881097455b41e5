// Op definitions: the one way every op of the package is defined (csrc/ops/<op>_op.cc), and the shape-function
// helpers they share (shape functions run in graph mode only: eager mode never calls them).
//
//   static const tfmo::OnLoad kRegister([] {
//     tfmo::DefineOp(TFMO_OP_MY_OP, {"T: {float, half}"}, {"x: T"}, {"y: T"}, &tfmo::UnchangedShape);
//   });
#pragma once

#include <cstdint>
#include <initializer_list>

#include "tensorflow/c/ops.h"

namespace tfmo {

using ShapeFn = void (*)(TF_ShapeInferenceContext*, TF_Status*);

// Builds and registers op `name`: attrs ("name: type [= default]"), inputs and outputs ("name: type"), and its shape
// function. Failures are reported on stderr (tfmo::RegisterOp).
void DefineOp(const char* name, std::initializer_list<const char*> attrs, std::initializer_list<const char*> inputs,
              std::initializer_list<const char*> outputs, ShapeFn shape_fn);

// The pieces of DefineOp, for a builder made by hand.
void AddAttrs(TF_OpDefinitionBuilder* b, std::initializer_list<const char*> specs);
void AddInputs(TF_OpDefinitionBuilder* b, std::initializer_list<const char*> specs);
void AddOutputs(TF_OpDefinitionBuilder* b, std::initializer_list<const char*> specs);

// Output 0 has the shape of input 0.
void UnchangedShape(TF_ShapeInferenceContext* ctx, TF_Status* status);

// An owned TF_ShapeHandle (a new one has unknown rank).
struct Shape {
  TF_ShapeHandle* h = TF_NewShapeHandle();
  Shape() = default;
  Shape(const Shape&) = delete;
  Shape& operator=(const Shape&) = delete;
  ~Shape() { TF_DeleteShapeHandle(h); }
};

// *out = input i, checked to have rank `rank`; false with status set otherwise.
bool InputWithRank(TF_ShapeInferenceContext* ctx, int i, int rank, Shape* out, TF_Status* status);

// Inputs first, first + 1, ... checked to have the ranks `ranks` (in order, stopping at the first mismatch).
bool InputsWithRanks(TF_ShapeInferenceContext* ctx, int first, std::initializer_list<int> ranks, TF_Status* status);

// *out = dims [begin, end) of s.
bool Subshape(TF_ShapeInferenceContext* ctx, const Shape& s, int64_t begin, int64_t end, Shape* out,
              TF_Status* status);

// *out = a ++ b.
bool Concatenate(TF_ShapeInferenceContext* ctx, TF_ShapeHandle* a, TF_ShapeHandle* b, Shape* out, TF_Status* status);

// Output o gets the shape of input i, for each (o, i) = (k, like[k]).
bool OutputsLikeInputs(TF_ShapeInferenceContext* ctx, std::initializer_list<int> like, TF_Status* status);

// Sets outputs 0, 1, ... to the given shapes (stopping at the first failure).
bool SetOutputs(TF_ShapeInferenceContext* ctx, std::initializer_list<const Shape*> shapes, TF_Status* status);

}  // namespace tfmo
