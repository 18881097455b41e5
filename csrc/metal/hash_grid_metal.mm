// GPU (Metal) kernel host of the hash-grid ops (semantics: csrc/ops/hash_grid_op.cc; kernels and their buffer
// layout: metal_kernels/hash_grid.metal; validation and level tables shared with the CPU kernels:
// csrc/ops/hash_grid_kernel.h). max_level lives in host memory (read here to get the active level count).
//
// Dispatches (empty work is skipped: Metal rejects empty grids and empty tensors have no buffer):
//   encode:          grid (N, L), threadgroups 1-D along the points so a group stays on one level;
//   grad_params:     float32 accumulator zeroed, grid (N, n_active) scatter with float atomics, then (float16
//                    tables) a conversion pass into the output; the float32 output is its own accumulator;
//   grad_positions:  grid N, one thread per point looping over the active levels.
#include <cstdint>

#include "common/op_names.h"
#include "common/tfc.h"
#include "metal/metal_host.h"
#include "ops/hash_grid_kernel.h"

namespace {

using tfmo::hash_grid::Call;
using tfmo::hash_grid::Config;

const char* Suffixed(const char* base, TF_DataType dtype, std::string* buf) {
  *buf = std::string(base) + (dtype == TF_HALF ? "_float16" : "_float32");
  return buf->c_str();
}

HgArgs MakeArgs(const Call& call) {
  HgArgs a{};
  a.n = static_cast<uint32_t>(call.n);
  a.dims = static_cast<uint32_t>(call.dims);
  a.n_features = static_cast<uint32_t>(call.cfg->n_features);
  a.n_levels = static_cast<uint32_t>(call.cfg->n_levels);
  a.n_active = static_cast<uint32_t>(call.n_active);
  a.interpolation = static_cast<uint32_t>(call.cfg->interpolation);
  return a;
}

// Level table bytes for setBytes (<= 32 levels * 40 bytes).
size_t LevelBytes(const Call& call) { return sizeof(HgLevel) * static_cast<size_t>(call.cfg->n_levels); }

bool CheckSizes(TF_OpKernelContext* ctx, const char* op, const Call& call) {
  const uint64_t n = static_cast<uint64_t>(call.n);
  const uint64_t cols = static_cast<uint64_t>(call.cfg->n_levels) * call.cfg->n_features;
  return tfmo::metal::CheckGridSize(ctx, op, "the number of points", n) &&
         tfmo::metal::CheckGridSize(ctx, op, "points * output columns", n * cols) &&
         tfmo::metal::CheckGridSize(ctx, op, "points * D", n * static_cast<uint64_t>(call.dims));
}

void EncodeMetal(void* state, TF_OpKernelContext* ctx) {
  const char* op = "hash_grid_encode";
  Call call;
  if (!tfmo::hash_grid::Prepare(ctx, state, false, op, &call)) return;
  const Config& cfg = *call.cfg;
  tfmo::TensorRef out;
  if (!tfmo::AllocateOutput(ctx, 0, cfg.dtype, {call.n, static_cast<int64_t>(cfg.n_levels) * cfg.n_features}, &out))
    return;
  if (call.n == 0 || !CheckSizes(ctx, op, call)) return;
  const HgArgs args = MakeArgs(call);
  std::string name;
  tfmo::metal::Dispatch(ctx, Suffixed("hash_grid_encode", cfg.dtype, &name), {}, [&](tfmo::metal::Encoder& e) {
    e.buffer(0, call.positions);
    e.buffer(1, call.params);
    e.bytes(2, call.levels, LevelBytes(call));
    e.value(3, args);
    e.buffer(4, out);
    e.threads({static_cast<uint64_t>(call.n), static_cast<uint64_t>(cfg.n_levels), 1}, {256, 1, 1});
  });
}

void GradParamsMetal(void* state, TF_OpKernelContext* ctx) {
  const char* op = "hash_grid_encode (gradient w.r.t. params)";
  Call call;
  if (!tfmo::hash_grid::Prepare(ctx, state, true, op, &call)) return;
  const Config& cfg = *call.cfg;
  tfmo::TensorRef out;
  if (!tfmo::AllocateOutput(ctx, 0, cfg.dtype, {call.rows, static_cast<int64_t>(cfg.n_features)}, &out)) return;
  const int64_t elems = call.rows * cfg.n_features;  // >= 8 rows: never empty
  if (!CheckSizes(ctx, op, call)) return;
  // float32 accumulator: the output itself, or a temporary for float16 tables.
  tfmo::TensorRef tmp;
  if (cfg.dtype == TF_HALF) {
    tfmo::Status s;
    TF_AllocatorAttributes attrs{TF_ALLOCATOR_ATTRIBUTES_STRUCT_SIZE, 0};
    const int64_t dims[1] = {elems};
    *tmp.out() = TF_AllocateTemp(ctx, TF_FLOAT, dims, 1, &attrs, s);
    if (!tfmo::Check(ctx, s)) return;
  }
  const tfmo::TensorRef& acc = cfg.dtype == TF_HALF ? tmp : out;
  HgArgs args = MakeArgs(call);
  args.count = static_cast<uint32_t>(elems);
  if (!tfmo::metal::Dispatch(ctx, "hash_grid_fill_zero", {}, [&](tfmo::metal::Encoder& e) {
        e.buffer(0, acc);
        e.value(1, args);
        e.threads(static_cast<uint64_t>(elems));
      }))
    return;
  if (call.n > 0 && call.n_active > 0) {
    std::string name;
    if (!tfmo::metal::Dispatch(ctx, Suffixed("hash_grid_grad_params", cfg.dtype, &name), {},
                               [&](tfmo::metal::Encoder& e) {
                                 e.buffer(0, call.grad);
                                 e.buffer(1, call.positions);
                                 e.bytes(2, call.levels, LevelBytes(call));
                                 e.value(3, args);
                                 e.buffer(4, acc);
                                 e.threads({static_cast<uint64_t>(call.n), static_cast<uint64_t>(call.n_active), 1},
                                           {256, 1, 1});
                               }))
      return;
  }
  if (cfg.dtype == TF_HALF) {
    tfmo::metal::Dispatch(ctx, "hash_grid_float_to_half", {}, [&](tfmo::metal::Encoder& e) {
      e.buffer(0, acc);
      e.buffer(1, out);
      e.value(2, args);
      e.threads(static_cast<uint64_t>(elems));
    });
  }
}

void GradPositionsMetal(void* state, TF_OpKernelContext* ctx) {
  const char* op = "hash_grid_encode (gradient w.r.t. positions)";
  Call call;
  if (!tfmo::hash_grid::Prepare(ctx, state, true, op, &call)) return;
  const Config& cfg = *call.cfg;
  tfmo::TensorRef out;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {call.n, static_cast<int64_t>(call.dims)}, &out)) return;
  if (call.n == 0 || !CheckSizes(ctx, op, call)) return;
  const HgArgs args = MakeArgs(call);
  std::string name;
  tfmo::metal::Dispatch(ctx, Suffixed("hash_grid_grad_positions", cfg.dtype, &name), {},
                        [&](tfmo::metal::Encoder& e) {
                          e.buffer(0, call.grad);
                          e.buffer(1, call.positions);
                          e.buffer(2, call.params);
                          e.bytes(3, call.levels, LevelBytes(call));
                          e.value(4, args);
                          e.buffer(5, out);
                          e.threads(static_cast<uint64_t>(call.n));
                        });
}

const tfmo::OnLoad kRegister([] {
  const struct {
    const char* op;
    void (*compute)(void*, TF_OpKernelContext*);
  } kernels[] = {
      {TFMO_OP_HASH_GRID_ENCODE, &EncodeMetal},
      {TFMO_OP_HASH_GRID_ENCODE_GRAD_PARAMS, &GradParamsMetal},
      {TFMO_OP_HASH_GRID_ENCODE_GRAD_POSITIONS, &GradPositionsMetal},
  };
  for (const auto& k : kernels) {
    tfmo::KernelSpec spec;
    spec.op = k.op;
    spec.device = "GPU";
    spec.create = &tfmo::hash_grid::CreateConfig;
    spec.compute = k.compute;
    spec.destroy = &tfmo::hash_grid::DeleteConfig;
    spec.type_attr = "T";
    spec.types = {TF_FLOAT, TF_HALF};
    spec.host_memory = {"max_level"};
    tfmo::RegisterKernel(spec);
  }
});

}  // namespace
