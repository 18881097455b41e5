// Host-side parts shared by the CPU kernels (csrc/cpu/hash_grid_cpu.cc) and the GPU host code
// (csrc/gpu/hash_grid_gpu.cc) of the hash-grid ops: attr parsing/validation, level tables, input validation,
// max_level and the kernel registrations.
// Semantics: csrc/ops/hash_grid_op.cc; per-point math: csrc/shared/hash_grid_math.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/op_names.h"
#include "common/tfc.h"
#include "shared/hash_grid_math.h"

namespace tfmo::hash_grid {

// Kernel state built once per kernel instance from the attrs.
struct Config {
  int n_levels = 0, n_features = 0, log2_hashmap_size = 0, base_resolution = 0;
  float per_level_scale = 0.0f;
  int grid_type = 0, interpolation = 0;
  std::string grid_type_name, interpolation_name;
  TF_DataType dtype = TF_FLOAT;
  bool deterministic = false;  // GPU table gradients as fixed-point sums (the CPU kernels always are deterministic)
  bool feature_major = false;  // encoded-shaped tensors are [L*F, N] (else [N, L*F]; hash_grid_op.cc)
  // Level tables for D = 1..4 (index D); total < 0 means the sizes overflow int32 for that D.
  std::vector<HgLevel> levels[HG_MAX_DIMS + 1];
  int64_t total[HG_MAX_DIMS + 1] = {0, 0, 0, 0, 0};
};

inline void* CreateConfig(TF_OpKernelConstruction* c) {
  auto* cfg = new Config;
  int64_t L = 0, F = 0, log2t = 0, nmin = 0;
  float b = 0.0f;
  const char* op = "hash_grid_encode";
  bool ok = GetAttr(c, "n_levels", &L) && GetAttr(c, "n_features_per_level", &F) &&
            GetAttr(c, "log2_hashmap_size", &log2t) && GetAttr(c, "base_resolution", &nmin) &&
            GetAttr(c, "per_level_scale", &b) && GetAttr(c, "grid_type", &cfg->grid_type_name) &&
            GetAttr(c, "interpolation", &cfg->interpolation_name) && GetAttr(c, "T", &cfg->dtype) &&
            GetAttr(c, "deterministic", &cfg->deterministic) && GetAttr(c, "feature_major", &cfg->feature_major);
  if (!ok) { delete cfg; return nullptr; }
  auto fail = [&](const char* fmt, auto... args) {
    ConstructionFail(c, TF_INVALID_ARGUMENT, fmt, args...);
    delete cfg;
    return nullptr;
  };
  if (L < 1 || L > HG_MAX_LEVELS) return fail("%s: n_levels must be in 1..%d, got %lld", op, HG_MAX_LEVELS, (long long)L);
  if (F != 1 && F != 2 && F != 4 && F != 8)
    return fail("%s: n_features_per_level must be 1, 2, 4 or 8, got %lld", op, (long long)F);
  if (log2t < 1 || log2t > 24) return fail("%s: log2_hashmap_size must be in 1..24, got %lld", op, (long long)log2t);
  if (nmin < 1 || nmin > (1 << 24)) return fail("%s: base_resolution must be in 1..2^24, got %lld", op, (long long)nmin);
  if (!(b >= 1.0f) || !std::isfinite(b)) return fail("%s: per_level_scale must be a finite number >= 1, got %g", op, b);
  const float finest = hg_level_scale((int)L - 1, b, (int)nmin);  // the scale the level table will hold
  if (!(finest <= 16777216.0))
    return fail("%s: the finest level's scale base_resolution * per_level_scale^(n_levels-1) - 1 = %g exceeds 2^24 "
                "(float32 positions cannot resolve it); lower per_level_scale or n_levels", op, finest);
  if (cfg->grid_type_name == "hash") cfg->grid_type = HG_GRID_HASH;
  else if (cfg->grid_type_name == "dense") cfg->grid_type = HG_GRID_DENSE;
  else if (cfg->grid_type_name == "tiled") cfg->grid_type = HG_GRID_TILED;
  else return fail("%s: grid_type must be \"hash\", \"dense\" or \"tiled\", got \"%s\"", op, cfg->grid_type_name.c_str());
  if (cfg->interpolation_name == "linear") cfg->interpolation = HG_INTERP_LINEAR;
  else if (cfg->interpolation_name == "smoothstep") cfg->interpolation = HG_INTERP_SMOOTHSTEP;
  else if (cfg->interpolation_name == "nearest") cfg->interpolation = HG_INTERP_NEAREST;
  else return fail("%s: interpolation must be \"linear\", \"smoothstep\" or \"nearest\", got \"%s\"", op,
                   cfg->interpolation_name.c_str());
  cfg->n_levels = (int)L; cfg->n_features = (int)F; cfg->log2_hashmap_size = (int)log2t;
  cfg->base_resolution = (int)nmin; cfg->per_level_scale = b;
  for (int d = 1; d <= HG_MAX_DIMS; ++d) {
    cfg->levels[d].resize(L);
    cfg->total[d] = hg_level_table(d, (int)L, (int)F, (int)log2t, (int)nmin, b, cfg->grid_type, cfg->levels[d].data());
  }
  return cfg;
}

inline void DeleteConfig(void* p) { delete static_cast<Config*>(p); }

// One call's validated inputs.
struct Inputs {
  const Config* cfg = nullptr;
  TensorRef grad, positions, params, max_level;  // grad only for the gradient ops
  int64_t n = 0;        // points
  int dims = 0;         // D
  int n_active = 0;     // active levels (l < n_active)
  int64_t rows = 0;     // table rows E
  const HgLevel* levels = nullptr;
  // Element (point i, column k = l*F + f) of the encoded-shaped tensors (encoded, grad, grad_grad) sits at
  // i * point_stride + k * column_stride: (L*F, 1) for [N, L*F]; (1, N) for feature_major's [L*F, N].
  int64_t point_stride = 0, column_stride = 0;

  // The shape of encoded, grad and grad_grad.
  std::vector<int64_t> encoded_shape() const {
    const int64_t cols = static_cast<int64_t>(cfg->n_levels) * cfg->n_features;
    return cfg->feature_major ? std::vector<int64_t>{cols, n} : std::vector<int64_t>{n, cols};
  }
};

// Number of active levels for a max_level tensor (see hash_grid_op.cc). Returns false after failing ctx.
inline bool ActiveLevels(TF_OpKernelContext* ctx, const char* op, const TensorRef& m, int L, int* out) {
  if (m.rank() != 0) return Fail(ctx, TF_INVALID_ARGUMENT, "%s: max_level must be a scalar, got shape %s", op,
                                 ShapeString(m).c_str());
  if (m.dtype() == TF_INT32) {
    const int32_t k = *m.data<int32_t>();  // a level count, clipped to 0..L
    *out = k < 0 ? 0 : (k > L ? L : k);
    return true;
  }
  if (m.dtype() != TF_FLOAT)
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: max_level must be int32 or float32, got %s", op, DataTypeName(m.dtype()));
  const float f = *m.data<float>();
  if (std::isnan(f)) return Fail(ctx, TF_INVALID_ARGUMENT, "%s: a float max_level must not be NaN", op);
  const float limit = f * (float)L + 1e-3f;  // tcnn: level l active iff l < max_level * L + 1e-3
  int k = 0;
  while (k < L && (float)k < limit) ++k;
  *out = k;
  return true;
}

// Reads and validates the inputs. Input order: [grad,] positions, params, max_level.
// `first` = index of the first of these inputs (1 for the second-order op, whose input 0 is ddx).
inline bool Prepare(TF_OpKernelContext* ctx, void* state, bool has_grad, const char* op, Inputs* call, int first = 0) {
  const Config& cfg = *static_cast<const Config*>(state);
  call->cfg = &cfg;
  const int base = first + (has_grad ? 1 : 0);
  if (has_grad && !GetInput(ctx, first, &call->grad)) return false;
  if (!GetInput(ctx, base, &call->positions) || !GetInput(ctx, base + 1, &call->params) ||
      !GetInput(ctx, base + 2, &call->max_level))
    return false;
  const TensorRef& pos = call->positions;
  const TensorRef& par = call->params;
  const int L = cfg.n_levels, F = cfg.n_features;
  if (pos.dtype() != TF_FLOAT)
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: positions must be float32, got %s", op, DataTypeName(pos.dtype()));
  if (pos.rank() != 2)
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: positions must have rank 2 [N, D], got shape %s", op,
                ShapeString(pos).c_str());
  const int64_t D = pos.dim(1);
  if (D < 1 || D > HG_MAX_DIMS)
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: positions must have 1 to 4 columns (D), got shape %s", op,
                ShapeString(pos).c_str());
  if (par.dtype() != cfg.dtype)
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: params must be %s, got %s", op, DataTypeName(cfg.dtype),
                DataTypeName(par.dtype()));
  if (par.rank() != 2 || par.dim(1) != F)
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: params must have shape [table_rows, n_features_per_level=%d], got %s",
                op, F, ShapeString(par).c_str());
  const int64_t total = cfg.total[D];
  if (total < 0)
    return Fail(ctx, TF_INVALID_ARGUMENT,
                "%s: the table for D=%lld, n_levels=%d, n_features_per_level=%d, grid_type=%s, base_resolution=%d, "
                "per_level_scale=%g needs more than 2^31-1 values; use grid_type=\"hash\" or fewer/coarser levels",
                op, (long long)D, L, F, cfg.grid_type_name.c_str(), cfg.base_resolution, cfg.per_level_scale);
  if (par.dim(0) != total)
    return Fail(ctx, TF_INVALID_ARGUMENT,
                "%s: params has %lld rows, but the config needs %lld (D=%lld, n_levels=%d, log2_hashmap_size=%d, "
                "base_resolution=%d, per_level_scale=%g, grid_type=%s)",
                op, (long long)par.dim(0), (long long)total, (long long)D, L, cfg.log2_hashmap_size,
                cfg.base_resolution, cfg.per_level_scale, cfg.grid_type_name.c_str());
  if (pos.dim(0) > (int64_t{1} << 31) / L)  // keeps N*L and per-level indices within 32 bits on the GPU
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: too many points (%lld) for %d levels", op, (long long)pos.dim(0), L);
  if (has_grad) {
    const TensorRef& g = call->grad;
    if (g.dtype() != cfg.dtype)
      return Fail(ctx, TF_INVALID_ARGUMENT, "%s: grad must be %s, got %s", op, DataTypeName(cfg.dtype),
                  DataTypeName(g.dtype()));
    const int64_t rows_want = cfg.feature_major ? (int64_t)L * F : pos.dim(0);
    const int64_t cols_want = cfg.feature_major ? pos.dim(0) : (int64_t)L * F;
    if (g.rank() != 2 || g.dim(0) != rows_want || g.dim(1) != cols_want)
      return Fail(ctx, TF_INVALID_ARGUMENT, "%s: grad must have shape [%lld, %lld] (%s), got %s", op,
                  (long long)rows_want, (long long)cols_want,
                  cfg.feature_major ? "[L*F, N]: feature_major" : "[N, L*F]", ShapeString(g).c_str());
  }
  if (!ActiveLevels(ctx, op, call->max_level, L, &call->n_active)) return false;
  call->n = pos.dim(0);
  call->point_stride = cfg.feature_major ? 1 : (int64_t)L * F;
  call->column_stride = cfg.feature_major ? call->n : 1;
  call->dims = (int)D;
  call->rows = total;
  call->levels = cfg.levels[D].data();
  return true;
}

// The second-order op (HashGridEncodeGradPositionsGrad): input 0 is ddx [N, D] float32 (the incoming gradient of
// grad_positions), then grad, positions, params, max_level as for the first-order gradient ops.
inline bool ReadSecondOrder(TF_OpKernelContext* ctx, void* state, const char* op, Inputs* call, TensorRef* ddx) {
  if (!GetInput(ctx, 0, ddx)) return false;
  if (!Prepare(ctx, state, true, op, call, 1)) return false;
  if (ddx->dtype() != TF_FLOAT)
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: grad_grad_positions must be float32, got %s", op,
                DataTypeName(ddx->dtype()));
  if (ddx->rank() != 2 || ddx->dim(0) != call->n || ddx->dim(1) != call->dims)
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: grad_grad_positions must have shape [%lld, %d] (like positions), got %s",
                op, (long long)call->n, call->dims, ShapeString(*ddx).c_str());
  return true;
}

// One call of the second-order op: its inputs (Inputs, ddx) and outputs grad_grad (grad's shape) T, grad_params [E, F] T,
// grad_positions [N, D] float32; param_elems = E * F.
struct SecondOrderOutputs {
  TensorRef dy, params, dx;
};
struct SecondOrderCall {
  const char* op = "hash_grid_encode (second derivative: gradient of the position gradient)";
  Inputs call;
  TensorRef ddx;
  SecondOrderOutputs out;
  int64_t param_elems = 0;
};

// ReadSecondOrder, then allocates the outputs. Returns false after failing ctx.
inline bool PrepareSecondOrder(TF_OpKernelContext* ctx, void* state, SecondOrderCall* so) {
  Inputs* call = &so->call;
  if (!ReadSecondOrder(ctx, state, so->op, call, &so->ddx)) return false;
  const Config& cfg = *call->cfg;
  so->param_elems = call->rows * cfg.n_features;
  return AllocateOutput(ctx, 0, cfg.dtype, call->encoded_shape(), &so->out.dy) &&
         AllocateOutput(ctx, 1, cfg.dtype, {call->rows, static_cast<int64_t>(cfg.n_features)}, &so->out.params) &&
         AllocateOutput(ctx, 2, TF_FLOAT, {call->n, static_cast<int64_t>(call->dims)}, &so->out.dx);
}

// Registers the kernels of the four hash-grid ops on `device` ("CPU" or "GPU", where max_level stays in host memory):
// state from CreateConfig, T in {float, half}.
using Compute = void (*)(void*, TF_OpKernelContext*);
inline void RegisterKernels(const char* device, Compute encode, Compute grad_params, Compute grad_positions,
                            Compute second_order) {
  const struct {
    const char* op;
    Compute compute;
  } kernels[] = {
      {TFMO_OP_HASH_GRID_ENCODE, encode},
      {TFMO_OP_HASH_GRID_ENCODE_GRAD_PARAMS, grad_params},
      {TFMO_OP_HASH_GRID_ENCODE_GRAD_POSITIONS, grad_positions},
      {TFMO_OP_HASH_GRID_ENCODE_GRAD_POSITIONS_GRAD, second_order},
  };
  for (const auto& k : kernels) {
    KernelSpec spec = KernelSpecFor(device);
    spec.op = k.op;
    spec.create = &CreateConfig;
    spec.compute = k.compute;
    spec.destroy = &DeleteConfig;
    spec.type_attr = "T";
    spec.types = {TF_FLOAT, TF_HALF};
    if (std::strcmp(device, "GPU") == 0) spec.host_memory = {"max_level"};
    RegisterKernel(spec);
  }
}

}  // namespace tfmo::hash_grid
