// Op definition of RayMarch (occupancy-grid ray marching). Math and conventions: csrc/shared/ray_march_math.h.
//
// RayMarch(rays_o [R,3], rays_d [R,3], near [R], far [R], bits uint8 [K, ceil(G^3/8)], aabb [2,3], seed int64 [])
//     -> t_starts [N], t_ends [N], row_splits int32 [R+1], ray_indices int32 [N], positions [N,3]
//   attrs: resolution G in [1, 1024], step_size > 0, cone_angle >= 0, max_samples >= 1, jitter, cascades K in
//   [1, 8] (cascade c covers the aabb scaled by 2^c about its centre; with K = 1 bits may also be [ceil(G^3/8)]).
//   Packed samples: sample k belongs to ray r for row_splits[r] <= k < row_splits[r+1] (ray_indices[k] = r),
//   covering [t_starts[k], t_ends[k]]; sorted and non-overlapping within a ray. N <= 2^31 - 1. positions[k]: the
//   sample's midpoint in the unit coordinates of the outermost cascade's box (the aabb when K = 1), clamped to
//   [0, 1] (ray_march_math.h rm_unit_coord).
//   No gradient (the outputs are sample positions). The shape function (graph mode only) checks ranks; the
//   kernels check everything (csrc/ops/ray_march_args.h).
#include "common/op_names.h"
#include "common/shape_fns.h"
#include "common/tfc.h"

namespace {

using tfmo::InputWithRank;
using tfmo::Shape;

void RayMarchShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  Shape o;  // rays_o, rays_d, near, far, bits, aabb, seed
  if (!InputWithRank(ctx, 0, 2, &o, status) || !tfmo::InputsWithRanks(ctx, 1, {2, 1, 1}, status) ||
      !tfmo::InputsWithRanks(ctx, 5, {2, 0}, status))
    return;
  Shape bits, bits_min, bits_max;  // [bytes] (one cascade) or [cascades, bytes]
  TF_ShapeInferenceContextGetInput(ctx, 4, bits.h, status);
  if (TF_GetCode(status) != TF_OK) return;
  TF_ShapeInferenceContextWithRankAtLeast(ctx, bits.h, 1, bits_min.h, status);
  if (TF_GetCode(status) != TF_OK) return;
  TF_ShapeInferenceContextWithRankAtMost(ctx, bits.h, 2, bits_max.h, status);
  if (TF_GetCode(status) != TF_OK) return;
  TF_ShapeInferenceContextSetUnknownShape(ctx, status);  // N is data-dependent
  if (TF_GetCode(status) != TF_OK) return;
  Shape unknown, vec;  // a default handle has unknown rank; WithRank(1) makes it [?]
  TF_ShapeInferenceContextWithRank(ctx, unknown.h, 1, vec.h, status);
  if (TF_GetCode(status) != TF_OK) return;
  TF_ShapeInferenceContextSetOutput(ctx, 0, vec.h, status);
  TF_ShapeInferenceContextSetOutput(ctx, 1, vec.h, status);
  TF_ShapeInferenceContextSetOutput(ctx, 3, vec.h, status);
  TF_ShapeHandle* three = TF_ShapeInferenceContextVectorFromSize(ctx, 3);
  Shape pos;  // [?, 3]
  TF_ShapeInferenceContextConcatenateShapes(ctx, vec.h, three, pos.h, status);
  TF_DeleteShapeHandle(three);
  if (TF_GetCode(status) != TF_OK) return;
  TF_ShapeInferenceContextSetOutput(ctx, 4, pos.h, status);
  TF_DimensionHandle* r = TF_NewDimensionHandle();
  TF_ShapeInferenceContextDim(ctx, o.h, 0, r);
  if (TF_DimensionHandleValueKnown(r)) {
    TF_ShapeHandle* splits = TF_ShapeInferenceContextVectorFromSize(ctx, TF_DimensionHandleValue(r) + 1);
    TF_ShapeInferenceContextSetOutput(ctx, 2, splits, status);
    TF_DeleteShapeHandle(splits);
  } else {
    TF_ShapeInferenceContextSetOutput(ctx, 2, vec.h, status);
  }
  TF_DeleteDimensionHandle(r);
}

static const tfmo::OnLoad kRegister([] {
  tfmo::DefineOp(TFMO_OP_RAY_MARCH,
                 {"resolution: int", "step_size: float", "cone_angle: float = 0.0", "max_samples: int = 1024",
                  "jitter: bool = true", "cascades: int = 1"},
                 {"rays_o: float", "rays_d: float", "near: float", "far: float", "bits: uint8", "aabb: float",
                  "seed: int64"},
                 {"t_starts: float", "t_ends: float", "row_splits: int32", "ray_indices: int32", "positions: float"},
                 &RayMarchShape);
});

}  // namespace
