// GPU kernel host of the hash-grid ops (semantics: csrc/ops/hash_grid_op.cc; kernels and their buffer layout:
// metal_kernels/hash_grid.metal; validation and level tables shared with the CPU kernels:
// csrc/ops/hash_grid_args.h). max_level lives in host memory (read here to get the active level count).
//
// Passes (empty work is skipped: Metal rejects empty grids and empty tensors have no buffer):
//   encode:          1-D grid, one thread per (point, level), G levels of 32 / G points per SIMD group, the
//                    level groups one after another (EncodeLevelGroup, hg_encode_thread), the kernel of the
//                    configuration (ConfigKernel); feature-major: grid (N, L), the _fm kernels;
//   grad_params:     float32 accumulator zeroed, grid (N, n_active) scatter with float atomics (ConfigKernel:
//                    the kernel of the configuration; SIMD-group run sums on every level), then (float16
//                    tables) a conversion pass into the output; the float32 output is its own accumulator;
//   grad_positions:  grid N, one thread per point looping over the active levels;
//   second order:    grid N per point (d/d(dy), d/dx), then zero + atomic scatter (N, n_active) for d/dparams;
//   fixed point:     the table gradients as fixed-point sums with integer atomics (FixedPointPasses): with the attr
//                    deterministic, and on devices whose float atomics are compare-and-swap loops (FixedPoint).
#include <cstdint>
#include <string>

#include "common/op_names.h"
#include "common/tfc.h"
#include "gpu/gpu_host.h"
#include "ops/hash_grid_args.h"

namespace {

using tfmo::hash_grid::Inputs;
using tfmo::hash_grid::Config;

std::string Suffixed(const char* base, TF_DataType dtype) {
  return std::string(base) + (dtype == TF_HALF ? "_float16" : "_float32");
}

// The kernel `base` for this configuration: D = 3, F = 2, linear has kernels of its own (_d3f2: every per-point and
// scatter kernel); the scatters' fixed-point sums are _det.
std::string ConfigKernel(const char* base, const Inputs& call, bool fixed_point = false) {
  const bool d3f2 = call.dims == 3 && call.cfg->n_features == 2 && call.cfg->interpolation == HG_INTERP_LINEAR;
  const std::string name = std::string(base) + (fixed_point ? "_det" : "") + (d3f2 ? "_d3f2" : "");
  return Suffixed(name.c_str(), call.cfg->dtype);
}

HgArgs MakeArgs(const Inputs& call) {
  HgArgs a{};
  a.n = static_cast<uint32_t>(call.n);
  a.dims = static_cast<uint32_t>(call.dims);
  a.n_features = static_cast<uint32_t>(call.cfg->n_features);
  a.n_levels = static_cast<uint32_t>(call.cfg->n_levels);
  a.n_active = static_cast<uint32_t>(call.n_active);
  a.interpolation = static_cast<uint32_t>(call.cfg->interpolation);
  a.feature_major = call.cfg->feature_major ? 1u : 0u;
  // The table-gradient scatters sum runs of equal rows in the SIMD group on every level: as fast as plain atomics
  // on uncorrelated points, several times faster on ray-ordered ones, with native atomics and with the CAS loop
  // (bench/gpu_proxy.md, latest-run table: the hash_grid_grad_params rows, "plain atomics" against "run sums").
  a.n_aggregate = a.n_levels;
  return a;
}

// The encode's levels per SIMD group (hg_encode_thread). Point-major output [N, L*F]: G = 8 / F (a point's G levels
// are 8 values, 32 bytes of float32), at least 1, at most the power of two >= L (no idle lanes for a level that
// does not exist). The level groups run one after another, so G also sets how many levels' tables are read at a
// time. For F = 2 this G = 4 is the fastest for float32 tables and within a few percent of the fastest for float16
// ones (bench/gpu_proxy.md, latest-run table: the hash_grid_encode_d3f2_* rows at G = 1 to 16). (The feature-major
// encode needs none: a SIMD group of 32 consecutive points of one level writes contiguous row segments.)
uint32_t EncodeLevelGroup(const Config& cfg) {
  uint32_t g = 8u / static_cast<uint32_t>(cfg.n_features);
  if (g < 1u) g = 1u;
  while (g > 1u && g / 2u >= static_cast<uint32_t>(cfg.n_levels)) g /= 2u;
  return g;
}

// Threads per threadgroup of the encode: 256, or 512 (tiny-cuda-nn's block) for the feature-major encode of a
// float32 table, where 512 is at least as fast as 256; for float16 tables 256 is the faster (bench/gpu_proxy.md,
// latest-run table: the hash_grid_encode_fm_d3f2_* rows, threadgroup 256 and 512). The backend clips it to the
// pipeline's maximum.
uint32_t EncodeThreadgroup(const Config& cfg) { return cfg.feature_major && cfg.dtype == TF_FLOAT ? 512u : 256u; }

// Level table bytes for setBytes (<= 32 levels * 40 bytes).
size_t LevelBytes(const Inputs& call) { return sizeof(HgLevel) * static_cast<size_t>(call.cfg->n_levels); }

// Threads of a grid-stride pass over `count` values: whole threadgroups, at most 256 of them.
uint64_t StrideThreads(uint64_t count) { return count < 65536 ? (count + 255) / 256 * 256 : 65536; }

// The fixed-point table gradient (metal_kernels/hash_grid.metal, HgFixedSink) of order 1 (grad_params: inputs
// dy, positions) or 2 (grad2_params: ddx, dy, positions) into `out` (rows * F values of T): fixed-point sums
// initialised and header zeroed, the bounds (max |dy|; max |ddx|), the exponents per level, the scatter, the conversion.
// Returns false after failing ctx (the table is too large); else Run() executes the passes or reports an error.
// `terms`: false when every term is zero (second order, nearest): only the zeros are converted.
bool FixedPointPasses(tfmo::gpu::Call& gpu, const char* scatter_base, const Inputs& call, HgArgs args,
                      const tfmo::TensorRef* ddx, const tfmo::TensorRef& out, int64_t elems, bool terms = true) {
  const Config& cfg = *call.cfg;
  const uint64_t word_count = 3 * static_cast<uint64_t>(elems);
  if (!tfmo::gpu::CheckGridSize(gpu.ctx(), gpu.op(), "3 * table values (the fixed-point gradient's sums)",
                                word_count))
    return false;
  const tfmo::TensorRef* words = gpu.scratch(TF_UINT32, static_cast<int64_t>(word_count));
  const tfmo::TensorRef* meta = gpu.scratch(TF_UINT32, 2 + cfg.n_levels);
  if (words == nullptr || meta == nullptr) return true;  // Run() reports the allocation failure
  args.count = static_cast<uint32_t>(elems);
  args.order = ddx != nullptr ? 2 : 1;
  gpu.pass("hash_grid_fixed_init").buffer(0, *words).value(1, args).threads(word_count);
  HgArgs fill = args;
  fill.count = static_cast<uint32_t>(2 + cfg.n_levels);
  gpu.pass("hash_grid_fill_zero_uint").buffer(0, *meta).value(1, fill).threads(static_cast<uint64_t>(fill.count));
  const bool has_points = terms && call.n > 0 && call.n_active > 0;
  if (has_points) {
    HgArgs bound = args;
    bound.count = static_cast<uint32_t>(call.n * cfg.n_levels * cfg.n_features);
    bound.slot = HG_FIXED_DY_MAX;
    gpu.pass(Suffixed("hash_grid_abs_max", cfg.dtype).c_str()).buffer(0, call.grad).value(1, bound).buffer(2, *meta)
        .threads(StrideThreads(bound.count));
    if (ddx != nullptr) {
      bound.count = static_cast<uint32_t>(call.n * call.dims);
      bound.slot = HG_FIXED_DDX_MAX;
      gpu.pass("hash_grid_abs_max_float32").buffer(0, *ddx).value(1, bound).buffer(2, *meta)
          .threads(StrideThreads(bound.count));
    }
  }
  gpu.pass("hash_grid_fixed_exponents").bytes(0, call.levels, LevelBytes(call)).value(1, args).buffer(2, *meta)
      .threads(static_cast<uint64_t>(cfg.n_levels));
  if (has_points) {
    auto& pass = gpu.pass(ConfigKernel(scatter_base, call, true).c_str());
    const int k = ddx != nullptr ? 1 : 0;
    if (ddx != nullptr) pass.buffer(0, *ddx);
    pass.buffer(k + 0, call.grad)
        .buffer(k + 1, call.positions)
        .bytes(k + 2, call.levels, LevelBytes(call))
        .value(k + 3, args)
        .buffer(k + 4, *words)
        .buffer(k + 5, *meta)
        .threads({static_cast<uint64_t>(call.n), static_cast<uint64_t>(call.n_active), 1}, {256, 1, 1});
  }
  gpu.pass(Suffixed("hash_grid_fixed_to", cfg.dtype).c_str())
      .buffer(0, *words)
      .buffer(1, *meta)
      .bytes(2, call.levels, LevelBytes(call))
      .value(3, args)
      .buffer(4, out)
      .threads(static_cast<uint64_t>(elems));
  return true;
}

// Whether the table gradients run as fixed-point sums: asked for (the attr deterministic), or on a device whose float
// atomics are compare-and-swap loops (MSL 2.4). There the integer sums are also the faster path, several times
// faster than the CAS loop on random and on ray-ordered points (bench/gpu_proxy.md, latest-run table: the
// hash_grid_grad_params_det rows against the "CAS loop (MSL 2.4)" ones), and their result does not depend on the
// order of the adds.
bool FixedPoint(tfmo::gpu::Call& gpu, const Config& cfg, const tfmo::TensorRef& out) {
  return cfg.deterministic || !tfmo::gpu::NativeFloatAtomics(gpu, out);
}

bool CheckSizes(TF_OpKernelContext* ctx, const char* op, const Inputs& call) {
  const uint64_t n = static_cast<uint64_t>(call.n);
  const uint64_t cols = static_cast<uint64_t>(call.cfg->n_levels) * call.cfg->n_features;
  return tfmo::gpu::CheckGridSize(ctx, op, "the number of points", n) &&
         tfmo::gpu::CheckGridSize(ctx, op, "points * output columns", n * cols) &&
         tfmo::gpu::CheckGridSize(ctx, op, "points * D", n * static_cast<uint64_t>(call.dims));
}

void EncodeGpu(void* state, TF_OpKernelContext* ctx) {
  const char* op = "hash_grid_encode";
  Inputs call;
  if (!tfmo::hash_grid::Prepare(ctx, state, false, op, &call)) return;
  const Config& cfg = *call.cfg;
  tfmo::TensorRef out;
  if (!tfmo::AllocateOutput(ctx, 0, cfg.dtype, call.encoded_shape(), &out)) return;
  if (call.n == 0 || !CheckSizes(ctx, op, call)) return;
  HgArgs args = MakeArgs(call);
  std::string kernel;
  uint64_t grid[2];
  if (cfg.feature_major) {  // grid (N, L): a SIMD group is 32 consecutive points of one level
    kernel = ConfigKernel("hash_grid_encode_fm", call);
    grid[0] = static_cast<uint64_t>(call.n);
    grid[1] = static_cast<uint64_t>(cfg.n_levels);
  } else {  // 1-D: G levels of 32 / G points per SIMD group, the level groups one after another
    args.level_group = EncodeLevelGroup(cfg);
    const uint64_t G = args.level_group, level_groups = (static_cast<uint64_t>(cfg.n_levels) + G - 1) / G;
    grid[0] = (static_cast<uint64_t>(call.n) * G + 31) / 32 * level_groups * 32;
    grid[1] = 1;
    if (!tfmo::gpu::CheckGridSize(ctx, op, "the encode's threads", grid[0])) return;
    kernel = ConfigKernel("hash_grid_encode", call);
  }
  tfmo::gpu::Call gpu(ctx, op);
  gpu.pass(kernel.c_str())
      .buffer(0, call.positions)
      .buffer(1, call.params)
      .bytes(2, call.levels, LevelBytes(call))
      .value(3, args)
      .buffer(4, out)
      .threads({grid[0], grid[1], 1}, {EncodeThreadgroup(cfg), 1, 1});
  gpu.Run();
}

void GradParamsGpu(void* state, TF_OpKernelContext* ctx) {
  const char* op = "hash_grid_encode (gradient w.r.t. params)";
  Inputs call;
  if (!tfmo::hash_grid::Prepare(ctx, state, true, op, &call)) return;
  const Config& cfg = *call.cfg;
  tfmo::TensorRef out;
  if (!tfmo::AllocateOutput(ctx, 0, cfg.dtype, {call.rows, static_cast<int64_t>(cfg.n_features)}, &out)) return;
  const int64_t elems = call.rows * cfg.n_features;  // >= 8 rows: never empty
  if (!CheckSizes(ctx, op, call)) return;
  tfmo::gpu::Call gpu(ctx, op);
  if (FixedPoint(gpu, cfg, out)) {  // Run() reports an error of the device query
    if (!gpu.ok() || FixedPointPasses(gpu, "hash_grid_grad_params", call, MakeArgs(call), nullptr, out, elems))
      gpu.Run();
    return;
  }
  // float32 accumulator: the output itself, or a scratch buffer for float16 tables.
  const tfmo::TensorRef* acc = cfg.dtype == TF_HALF ? gpu.scratch(TF_FLOAT, elems) : &out;
  if (acc == nullptr) return (void)gpu.Run();  // reports the allocation failure
  HgArgs args = MakeArgs(call);
  args.count = static_cast<uint32_t>(elems);
  gpu.pass("hash_grid_fill_zero").buffer(0, *acc).value(1, args).threads(static_cast<uint64_t>(elems));
  if (call.n > 0 && call.n_active > 0) {
    gpu.pass(ConfigKernel("hash_grid_grad_params", call, false).c_str())
        .buffer(0, call.grad)
        .buffer(1, call.positions)
        .bytes(2, call.levels, LevelBytes(call))
        .value(3, args)
        .buffer(4, *acc)
        .threads({static_cast<uint64_t>(call.n), static_cast<uint64_t>(call.n_active), 1}, {256, 1, 1});
  }
  if (cfg.dtype == TF_HALF) {
    gpu.pass("hash_grid_float_to_half").buffer(0, *acc).buffer(1, out).value(2, args).threads(static_cast<uint64_t>(elems));
  }
  gpu.Run();
}

void GradPositionsGpu(void* state, TF_OpKernelContext* ctx) {
  const char* op = "hash_grid_encode (gradient w.r.t. positions)";
  Inputs call;
  if (!tfmo::hash_grid::Prepare(ctx, state, true, op, &call)) return;
  tfmo::TensorRef out;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {call.n, static_cast<int64_t>(call.dims)}, &out)) return;
  if (call.n == 0 || !CheckSizes(ctx, op, call)) return;
  tfmo::gpu::Call gpu(ctx, op);
  gpu.pass(ConfigKernel("hash_grid_grad_positions", call).c_str())
      .buffer(0, call.grad)
      .buffer(1, call.positions)
      .buffer(2, call.params)
      .bytes(3, call.levels, LevelBytes(call))
      .value(4, MakeArgs(call))
      .buffer(5, out)
      .threads(static_cast<uint64_t>(call.n));
  gpu.Run();
}

// Second order (gradient of grad_positions): d/d(dy) and d/dx per point (hash_grid_grad2_points, grid N), d/dparams
// zeroed then scattered with float atomics (hash_grid_grad2_params, grid (N, n_active)), converted for float16, or
// as fixed-point sums (FixedPoint).
void SecondOrderGpu(void* state, TF_OpKernelContext* ctx) {
  tfmo::hash_grid::SecondOrderCall so;
  if (!tfmo::hash_grid::PrepareSecondOrder(ctx, state, &so)) return;
  auto& [op, call, ddx, out, elems] = so;  // elems >= 8 rows: never empty
  const Config& cfg = *call.cfg;
  if (!CheckSizes(ctx, op, call)) return;
  tfmo::gpu::Call gpu(ctx, op);
  const bool det = FixedPoint(gpu, cfg, out.params);
  if (!gpu.ok()) return (void)gpu.Run();  // reports the error
  const tfmo::TensorRef* acc = det ? &out.params : cfg.dtype == TF_HALF ? gpu.scratch(TF_FLOAT, elems) : &out.params;
  if (acc == nullptr) return (void)gpu.Run();  // reports the allocation failure
  HgArgs args = MakeArgs(call);
  args.count = static_cast<uint32_t>(elems);
  if (call.n > 0) {  // empty tensors have no buffer
    gpu.pass(ConfigKernel("hash_grid_grad2_points", call).c_str())
        .buffer(0, ddx)
        .buffer(1, call.grad)
        .buffer(2, call.positions)
        .buffer(3, call.params)
        .bytes(4, call.levels, LevelBytes(call))
        .value(5, args)
        .buffer(6, out.dy)
        .buffer(7, out.dx)
        .threads(static_cast<uint64_t>(call.n));
  }
  if (det) {
    if (FixedPointPasses(gpu, "hash_grid_grad2_params", call, args, &ddx, out.params, elems,
                         cfg.interpolation != HG_INTERP_NEAREST))
      gpu.Run();
    return;
  }
  gpu.pass("hash_grid_fill_zero").buffer(0, *acc).value(1, args).threads(static_cast<uint64_t>(elems));
  if (call.n > 0 && call.n_active > 0 && cfg.interpolation != HG_INTERP_NEAREST) {
    gpu.pass(ConfigKernel("hash_grid_grad2_params", call, false).c_str())
        .buffer(0, ddx)
        .buffer(1, call.grad)
        .buffer(2, call.positions)
        .bytes(3, call.levels, LevelBytes(call))
        .value(4, args)
        .buffer(5, *acc)
        .threads({static_cast<uint64_t>(call.n), static_cast<uint64_t>(call.n_active), 1}, {256, 1, 1});
  }
  if (cfg.dtype == TF_HALF) {
    gpu.pass("hash_grid_float_to_half").buffer(0, *acc).buffer(1, out.params).value(2, args)
        .threads(static_cast<uint64_t>(elems));
  }
  gpu.Run();
}

const tfmo::OnLoad kRegister([] {
  tfmo::hash_grid::RegisterKernels("GPU", &EncodeGpu, &GradParamsGpu, &GradPositionsGpu, &SecondOrderGpu);
});

}  // namespace
