// Shape functions shared by op definitions (graph mode only: eager mode never calls them).
#pragma once

#include "tensorflow/c/ops.h"

namespace tfmo {

// Output 0 has the shape of input 0.
void UnchangedShape(TF_ShapeInferenceContext* ctx, TF_Status* status);

}  // namespace tfmo
