// Op definitions of the multiresolution hash-grid encoding (math and conventions: csrc/shared/hash_grid_math.h).
//
// HashGridEncode(positions [N, D] float32, params [E, F] T, max_level Tlevel) -> encoded [N, L*F] T
// HashGridEncodeGradParams(grad [N, L*F] T, positions, params, max_level) -> grad_params [E, F] T
// HashGridEncodeGradPositions(grad [N, L*F] T, positions, params, max_level) -> grad_positions [N, D] float32
//
// Attrs (validated by the kernels, which fail with InvalidArgument naming the attr): n_levels L in 1..32,
// n_features_per_level F in {1,2,4,8}, log2_hashmap_size in 1..24, base_resolution >= 1, per_level_scale >= 1
// (finest scale <= 2^24), grid_type "hash" | "dense" | "tiled", interpolation "linear" | "smoothstep" | "nearest".
// T in {float, half}: output in T, accumulation in float32. E must equal the config's total table rows.
//
// max_level (scalar, per call; coarse-to-fine training), which levels are active:
//   int32 k: levels l < k (a level count, clipped to 0..L);  float m: levels l < m*L + 1e-3 (tiny-cuda-nn's fraction:
//   m >= 1 keeps all, m = 0.5 keeps levels 0..L/2). Inactive levels output 0, get no param gradient and add
//   nothing to the position gradient.
//
// HashGridEncodeGradPositionsGrad(grad_grad_positions [N, D] float32, grad [N, L*F] T, positions, params,
//     max_level) -> (grad_grad [N, L*F] T, grad_params [E, F] T, grad_positions [N, D] float32):
//   the gradient of HashGridEncodeGradPositions w.r.t. its inputs grad, params and positions (second derivatives;
//   tiny-cuda-nn's kernel_grid_backward_input_backward_{dLdoutput,grid,input}) for the scalar
//   Phi = sum(grad_grad_positions * HashGridEncodeGradPositions(grad, positions, params)). Math:
//   csrc/shared/hash_grid_math.h ("Second order"). Nearest interpolation: all three are zero (the position
//   gradient is identically zero); linear: grad_positions has only the mixed partials (d^2/dx_k^2 = 0 in a cell).
//
// The two gradient ops are separate so a graph that needs only one of them runs only that one.
// Shape functions give [N, ?] for encoded (L is an attr and the C API shape context cannot read int attrs;
// the Python wrapper sets the static shape), params' shape for grad_params, positions' for grad_positions.
#include "common/op_names.h"
#include "common/tfc.h"

namespace {

const char* const kAttrs[] = {
    "n_levels: int", "n_features_per_level: int", "log2_hashmap_size: int", "base_resolution: int",
    "per_level_scale: float", "grid_type: string", "interpolation: string",
    "T: {float, half}", "Tlevel: {int32, float}",
};

bool Ok(TF_Status* s) { return TF_GetCode(s) == TF_OK; }

// Checks input ranks shared by all three ops: positions (input pos_index) rank 2, params rank 2, max_level
// scalar. Returns false (status set) on a mismatch.
bool CheckCommon(TF_ShapeInferenceContext* ctx, int pos_index, TF_Status* status) {
  TF_ShapeHandle* in = TF_NewShapeHandle();
  TF_ShapeHandle* out = TF_NewShapeHandle();
  const int ranks[3] = {2, 2, 0};
  for (int i = 0; i < 3 && Ok(status); ++i) {
    TF_ShapeInferenceContextGetInput(ctx, pos_index + i, in, status);
    if (Ok(status)) TF_ShapeInferenceContextWithRank(ctx, in, ranks[i], out, status);
  }
  TF_DeleteShapeHandle(in);
  TF_DeleteShapeHandle(out);
  return Ok(status);
}

void EncodeShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  if (!CheckCommon(ctx, 0, status)) return;
  TF_ShapeHandle* pos = TF_NewShapeHandle();
  TF_ShapeHandle* n = TF_NewShapeHandle();
  TF_ShapeHandle* out = TF_NewShapeHandle();
  TF_ShapeInferenceContextGetInput(ctx, 0, pos, status);
  if (Ok(status)) TF_ShapeInferenceContextSubshape(ctx, pos, 0, 1, n, status);
  // Vector(size_t(-1)) is a vector of one unknown dimension (-1 is TF's unknown-dim marker).
  TF_ShapeHandle* cols = TF_ShapeInferenceContextVectorFromSize(ctx, static_cast<size_t>(-1));
  if (Ok(status)) TF_ShapeInferenceContextConcatenateShapes(ctx, n, cols, out, status);
  if (Ok(status)) TF_ShapeInferenceContextSetOutput(ctx, 0, out, status);
  TF_DeleteShapeHandle(cols);
  TF_DeleteShapeHandle(pos);
  TF_DeleteShapeHandle(n);
  TF_DeleteShapeHandle(out);
}

// Gradient ops: input 0 is the incoming gradient [N, L*F]; output = shape of input `like`.
template <int kLike>
void GradShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeHandle* g = TF_NewShapeHandle();
  TF_ShapeHandle* r = TF_NewShapeHandle();
  TF_ShapeInferenceContextGetInput(ctx, 0, g, status);
  if (Ok(status)) TF_ShapeInferenceContextWithRank(ctx, g, 2, r, status);
  if (Ok(status) && CheckCommon(ctx, 1, status)) {
    TF_ShapeInferenceContextGetInput(ctx, kLike, g, status);
    if (Ok(status)) TF_ShapeInferenceContextSetOutput(ctx, 0, g, status);
  }
  TF_DeleteShapeHandle(g);
  TF_DeleteShapeHandle(r);
}

// Second-order op: inputs ddx, grad, positions, params, max_level; outputs like grad, params, positions.
void SecondOrderShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeHandle* h = TF_NewShapeHandle();
  TF_ShapeHandle* r = TF_NewShapeHandle();
  for (int i = 0; i < 2 && Ok(status); ++i) {  // ddx and grad: rank 2
    TF_ShapeInferenceContextGetInput(ctx, i, h, status);
    if (Ok(status)) TF_ShapeInferenceContextWithRank(ctx, h, 2, r, status);
  }
  if (Ok(status) && CheckCommon(ctx, 2, status)) {
    const int like[3] = {1, 3, 2};
    for (int o = 0; o < 3 && Ok(status); ++o) {
      TF_ShapeInferenceContextGetInput(ctx, like[o], h, status);
      if (Ok(status)) TF_ShapeInferenceContextSetOutput(ctx, o, h, status);
    }
  }
  TF_DeleteShapeHandle(h);
  TF_DeleteShapeHandle(r);
}

TF_OpDefinitionBuilder* NewBuilder(const char* name) {
  TF_OpDefinitionBuilder* b = TF_NewOpDefinitionBuilder(name);
  for (const char* a : kAttrs) TF_OpDefinitionBuilderAddAttr(b, a);
  return b;
}

static const tfmo::OnLoad kRegister([] {
  TF_OpDefinitionBuilder* b = NewBuilder(TFMO_OP_HASH_GRID_ENCODE);
  TF_OpDefinitionBuilderAddInput(b, "positions: float");
  TF_OpDefinitionBuilderAddInput(b, "params: T");
  TF_OpDefinitionBuilderAddInput(b, "max_level: Tlevel");
  TF_OpDefinitionBuilderAddOutput(b, "encoded: T");
  TF_OpDefinitionBuilderSetShapeInferenceFunction(b, &EncodeShape);
  tfmo::RegisterOp(b);

  b = NewBuilder(TFMO_OP_HASH_GRID_ENCODE_GRAD_PARAMS);
  TF_OpDefinitionBuilderAddInput(b, "grad: T");
  TF_OpDefinitionBuilderAddInput(b, "positions: float");
  TF_OpDefinitionBuilderAddInput(b, "params: T");
  TF_OpDefinitionBuilderAddInput(b, "max_level: Tlevel");
  TF_OpDefinitionBuilderAddOutput(b, "grad_params: T");
  TF_OpDefinitionBuilderSetShapeInferenceFunction(b, &GradShape<2>);
  tfmo::RegisterOp(b);

  b = NewBuilder(TFMO_OP_HASH_GRID_ENCODE_GRAD_POSITIONS);
  TF_OpDefinitionBuilderAddInput(b, "grad: T");
  TF_OpDefinitionBuilderAddInput(b, "positions: float");
  TF_OpDefinitionBuilderAddInput(b, "params: T");
  TF_OpDefinitionBuilderAddInput(b, "max_level: Tlevel");
  TF_OpDefinitionBuilderAddOutput(b, "grad_positions: float");
  TF_OpDefinitionBuilderSetShapeInferenceFunction(b, &GradShape<1>);
  tfmo::RegisterOp(b);

  b = NewBuilder(TFMO_OP_HASH_GRID_ENCODE_GRAD_POSITIONS_GRAD);
  TF_OpDefinitionBuilderAddInput(b, "grad_grad_positions: float");
  TF_OpDefinitionBuilderAddInput(b, "grad: T");
  TF_OpDefinitionBuilderAddInput(b, "positions: float");
  TF_OpDefinitionBuilderAddInput(b, "params: T");
  TF_OpDefinitionBuilderAddInput(b, "max_level: Tlevel");
  TF_OpDefinitionBuilderAddOutput(b, "grad_grad: T");
  TF_OpDefinitionBuilderAddOutput(b, "grad_params: T");
  TF_OpDefinitionBuilderAddOutput(b, "grad_positions: float");
  TF_OpDefinitionBuilderSetShapeInferenceFunction(b, &SecondOrderShape);
  tfmo::RegisterOp(b);
});

}  // namespace
