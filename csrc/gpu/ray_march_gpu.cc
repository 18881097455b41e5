// GPU kernel host of RayMarch (semantics: csrc/ops/ray_march_op.cc; kernels: metal_kernels/ray_march.metal;
// math: csrc/shared/ray_march_math.h). Shapes, attrs, aabb and seed are validated exactly as
// on the CPU (ray_march_args.h; aabb and seed are host-memory inputs). Per-ray values are not checked on the
// host (they live on the GPU): a ray with a non-finite origin/direction or a NaN near/far gets no samples.
//
// The output length N depends on the data, so the op runs in two steps on one Call:
//   1. the occupancy mip (scratch, one pass per level for all cascades), count (one thread per ray, into an int64
//      scratch `scan` [R + 1]), multi-level block scan of scan[1..R]
//      (levels until one block; kRmScanBlock values per threadgroup), then RunAndRead of scan[R] = N (the op's
//      thread waits for the GPU here);
//   2. allocate the outputs, write row_splits from scan, fill the samples and their positions (skipped when
//      N = 0).
// R = 0: row_splits = [0] through a one-thread pass (nothing else to do).
#include <cinttypes>
#include <vector>

#include "common/op_names.h"
#include "common/tfc.h"
#include "gpu/gpu_host.h"
#include "ops/ray_march_args.h"
#include "shared/ray_march_math.h"

namespace {

using tfmo::TensorRef;

void RayMarchGpu(void* attrs, TF_OpKernelContext* ctx) {
  const char* op = "ray_march";
  TensorRef in[7];
  int64_t R = 0;
  RmParams params;
  if (!tfmo::ray_march::Prepare(ctx, attrs, in, &R, &params)) return;
  if (!tfmo::gpu::CheckGridSize(ctx, op, "the number of rays + 1", static_cast<uint64_t>(R) + 1)) return;
  TensorRef t_starts, t_ends, row_splits, ray_indices, positions;
  if (R == 0) {
    if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {0}, &t_starts) || !tfmo::AllocateOutput(ctx, 1, TF_FLOAT, {0}, &t_ends) ||
        !tfmo::AllocateOutput(ctx, 2, TF_INT32, {1}, &row_splits) ||
        !tfmo::AllocateOutput(ctx, 3, TF_INT32, {0}, &ray_indices) ||
        !tfmo::AllocateOutput(ctx, 4, TF_FLOAT, {0, 3}, &positions))
      return;
    tfmo::gpu::Call call(ctx, op);
    call.pass("ray_march_zero").buffer(0, row_splits).threads(1);
    call.Run();
    return;
  }

  tfmo::gpu::Call call(ctx, op);
  const TensorRef* mip = call.scratch(TF_UINT8, params.mip_bytes);
  const TensorRef* scan = call.scratch(TF_INT64, R + 1);
  if (mip == nullptr || scan == nullptr) {
    call.Run();  // reports the allocation failure
    return;
  }
  for (uint32_t m = 1; m <= params.mip_levels; ++m) {
    const uint32_t gm = rm_mip_res(params.G, m);
    call.pass("ray_march_mip").buffer(0, in[4]).buffer(1, *mip).value(2, params).value(3, m)
        .threads(params.K * ((gm * gm * gm + 7) / 8));
  }
  const uint32_t rays = static_cast<uint32_t>(R);
  call.pass("ray_march_count")
      .buffer(0, in[0]).buffer(1, in[1]).buffer(2, in[2]).buffer(3, in[3]).buffer(4, in[4]).buffer(5, *mip)
      .buffer(6, *scan)
      .value(7, params)
      .threads(rays);

  // Scan levels: level 0 scans scan[1..R]; level l + 1 scans the block totals of level l.
  struct Level {
    const TensorRef* data;
    RmScanParams p;
    const TensorRef* sums;
  };
  std::vector<Level> levels;
  const TensorRef* data = scan;
  RmScanParams sp{rays, 1};
  while (true) {
    const uint32_t groups = (sp.n + kRmScanBlock - 1) / kRmScanBlock;
    const TensorRef* sums = call.scratch(TF_INT64, groups);
    if (sums == nullptr) {
      call.Run();
      return;
    }
    call.pass("ray_march_scan_block")
        .buffer(0, *data).buffer(1, *sums).value(2, sp)
        .threadgroup_memory(0, kRmScanBlock * sizeof(int64_t))
        .threadgroups({groups, 1, 1}, {kRmScanBlock, 1, 1});
    levels.push_back({data, sp, sums});
    if (groups == 1) break;
    data = sums;
    sp = RmScanParams{groups, 0};
  }
  // The top level is one block, complete after its scan; each level below adds the scanned totals of the one above.
  for (size_t l = levels.size() - 1; l-- > 0;) {
    call.pass("ray_march_scan_add").buffer(0, *levels[l].data).buffer(1, *levels[l].sums).value(2, levels[l].p)
        .threads(levels[l].p.n);
  }
  int64_t N = 0;
  if (!call.RunAndRead(*scan, static_cast<size_t>(R) * sizeof(int64_t), &N, sizeof N)) return;
  if (N < 0 || N > INT32_MAX) {
    tfmo::Fail(ctx, TF_INVALID_ARGUMENT,
               "ray_march: %" PRId64 " samples in total exceed the int32 limit of row_splits; march fewer rays or "
               "lower max_samples",
               N);
    return;
  }
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {N}, &t_starts) || !tfmo::AllocateOutput(ctx, 1, TF_FLOAT, {N}, &t_ends) ||
      !tfmo::AllocateOutput(ctx, 2, TF_INT32, {R + 1}, &row_splits) ||
      !tfmo::AllocateOutput(ctx, 3, TF_INT32, {N}, &ray_indices) ||
      !tfmo::AllocateOutput(ctx, 4, TF_FLOAT, {N, 3}, &positions))
    return;
  const uint32_t splits_n = rays + 1;
  call.pass("ray_march_splits").buffer(0, *scan).buffer(1, row_splits).value(2, splits_n).threads(splits_n);
  if (N > 0) {
    call.pass("ray_march_fill")
        .buffer(0, in[0]).buffer(1, in[1]).buffer(2, in[2]).buffer(3, in[3]).buffer(4, in[4]).buffer(5, *mip)
        .buffer(6, *scan)
        .buffer(7, t_starts).buffer(8, t_ends).buffer(9, ray_indices).buffer(10, positions)
        .value(11, params)
        .threads(rays);
  }
  call.Run();
}

const tfmo::OnLoad kRegister([] { tfmo::ray_march::RegisterKernels("GPU", &RayMarchGpu); });

}  // namespace
