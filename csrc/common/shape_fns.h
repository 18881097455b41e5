// Shape functions shared by op definitions (graph mode only: eager mode never calls them).
#pragma once

#include "tensorflow/c/ops.h"

namespace tfmo {

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

}  // namespace tfmo
