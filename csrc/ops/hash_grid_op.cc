// Op definitions of the multiresolution hash-grid encoding (math and conventions: csrc/shared/hash_grid_math.h).
//
// HashGridEncode(positions [N, D] float32, params [E, F] T, max_level Tlevel) -> encoded [N, L*F] T
// HashGridEncodeGradParams(grad [N, L*F] T, positions, params, max_level) -> grad_params [E, F] T
// HashGridEncodeGradPositions(grad [N, L*F] T, positions, params, max_level) -> grad_positions [N, D] float32
//
// Layout of encoded and of every tensor shaped like it (grad, grad_grad): [N, L*F], point-major (level l's F
// features at columns l*F .. l*F+F-1), or with feature_major (default false) its transpose [L*F, N]: row l*F + f
// holds feature f of level l for every point (tiny-cuda-nn's layout, which its fused MLP reads; a matmul takes it
// with transpose_a). The GPU encode then writes whole rows of consecutive points (metal_kernels/hash_grid.metal).
//
// Attrs (validated by the kernels, which fail with InvalidArgument naming the attr): n_levels L in 1..32,
// n_features_per_level F in {1,2,4,8}, log2_hashmap_size in 1..24, base_resolution >= 1, per_level_scale >= 1
// (finest scale <= 2^24), grid_type "hash" | "dense" | "tiled", interpolation "linear" | "smoothstep" | "nearest".
// T in {float, half}: output in T, accumulation in float32. E must equal the config's total table rows.
// deterministic (default false): the table gradients (grad_params of both gradient ops) are bitwise reproducible on
// the GPU too (fixed-point sums, metal_kernels/hash_grid.metal HgFixedSink); the CPU kernels always are. The
// other outputs are deterministic on every device.
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
// Shape functions give [?, ?] for encoded (L and feature_major are attrs, which the C API shape context cannot
// read; the Python wrapper sets the static shape), params' shape for grad_params, positions' for grad_positions,
// grad's for grad_grad.
#include "common/op_names.h"
#include "common/shape_fns.h"
#include "common/tfc.h"

namespace {

using tfmo::Shape;

const std::initializer_list<const char*> kAttrs = {
    "n_levels: int", "n_features_per_level: int", "log2_hashmap_size: int", "base_resolution: int",
    "per_level_scale: float", "grid_type: string", "interpolation: string",
    "T: {float, half}", "Tlevel: {int32, float}", "deterministic: bool = false",
    "feature_major: bool = false",
};

// Every op's inputs end with positions [N, D], params [E, F] and the scalar max_level; the gradient ops' inputs
// before them (the incoming gradients) have rank 2.

void EncodeShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  if (!tfmo::InputsWithRanks(ctx, 0, {2, 2, 0}, status)) return;
  Shape out;
  // Vector(size_t(-1)) is a vector of one unknown dimension (-1 is TF's unknown-dim marker). Two calls: two distinct
  // unknown dims (one handle twice tells Grappler that N == L*F: tests/test_documented_claims.py, the NeRF run).
  TF_ShapeHandle* rows = TF_ShapeInferenceContextVectorFromSize(ctx, static_cast<size_t>(-1));
  TF_ShapeHandle* cols = TF_ShapeInferenceContextVectorFromSize(ctx, static_cast<size_t>(-1));
  if (tfmo::Concatenate(ctx, rows, cols, &out, status)) tfmo::SetOutputs(ctx, {&out}, status);
  TF_DeleteShapeHandle(rows);
  TF_DeleteShapeHandle(cols);
}

// First-order gradient ops: grad [N, L*F], positions, params, max_level; the output has the shape of input kLike.
template <int kLike>
void GradShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  if (tfmo::InputsWithRanks(ctx, 0, {2, 2, 2, 0}, status)) tfmo::OutputsLikeInputs(ctx, {kLike}, status);
}

// Second-order op: inputs ddx, grad, positions, params, max_level; outputs like grad, params, positions.
void SecondOrderShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  if (tfmo::InputsWithRanks(ctx, 0, {2, 2, 2, 2, 0}, status)) tfmo::OutputsLikeInputs(ctx, {1, 3, 2}, status);
}

static const tfmo::OnLoad kRegister([] {
  tfmo::DefineOp(TFMO_OP_HASH_GRID_ENCODE, kAttrs, {"positions: float", "params: T", "max_level: Tlevel"},
                 {"encoded: T"}, &EncodeShape);
  tfmo::DefineOp(TFMO_OP_HASH_GRID_ENCODE_GRAD_PARAMS, kAttrs,
                 {"grad: T", "positions: float", "params: T", "max_level: Tlevel"}, {"grad_params: T"},
                 &GradShape<2>);
  tfmo::DefineOp(TFMO_OP_HASH_GRID_ENCODE_GRAD_POSITIONS, kAttrs,
                 {"grad: T", "positions: float", "params: T", "max_level: Tlevel"}, {"grad_positions: float"},
                 &GradShape<1>);
  tfmo::DefineOp(TFMO_OP_HASH_GRID_ENCODE_GRAD_POSITIONS_GRAD, kAttrs,
                 {"grad_grad_positions: float", "grad: T", "positions: float", "params: T", "max_level: Tlevel"},
                 {"grad_grad: T", "grad_params: T", "grad_positions: float"}, &SecondOrderShape);
});

}  // namespace
