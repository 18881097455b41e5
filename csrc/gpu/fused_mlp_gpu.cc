// GPU kernel hosts of FusedMlp and FusedMlpGrad (semantics: csrc/ops/fused_mlp_op.cc; kernels and their structure:
// metal_kernels/fused_mlp.metal). Attrs and inputs are checked exactly as on the CPU (csrc/ops/fused_mlp_args.h:
// PrepareForward / PrepareGrad); the kernels index rows with 32-bit values, checked here.
//
// FusedMlp: one pass, fused_mlp_forward_w<W>_<T>, one threadgroup per block of 8 * FM_GPU_SIMDGROUPS rows, or per
// kForwardBlocks blocks when the weights are resident in threadgroup memory (PlaceWeights).
// FusedMlpGrad: fused_mlp_backward_w<W>_<T> over Parts() threadgroups, each writing its partial parameter gradient
// into a float32 scratch buffer [parts, P], then fused_mlp_reduce_<T> (one thread per parameter) sums the parts in
// part order into dparams: bitwise reproducible. N = 0: y, hidden and dx are empty (no pass); dparams is zeros
// (the reduce pass with 0 parts).
// The activations are the kernels' function constants 0 (hidden layers) and 1 (output).
#include <algorithm>
#include <cstdint>
#include <string>

#include "common/op_names.h"
#include "common/tfc.h"
#include "gpu/gpu_host.h"
#include "ops/fused_mlp_args.h"
#include "shared/fused_mlp_math.h"

namespace {

using tfmo::TensorRef;
using tfmo::fused_mlp::Config;
using tfmo::fused_mlp::Layout;

constexpr int64_t kMaxParts = 1024;                 // backward threadgroups at most
constexpr int64_t kForwardBlocks = 4;  // forward blocks per threadgroup when the weights are copied once for them
constexpr int64_t kMaxPartialValues = int64_t{1} << 24;  // 64 MB of float32 partial sums at most (when P allows)
constexpr uint32_t kThreadgroupMemoryLimit = 32768;  // Apple GPUs' threadgroup memory per threadgroup

// The kernels' shape for a call: SIMD groups per threadgroup, rows per block, element size of T.
struct Shape {
  uint32_t simdgroups = 0, block_rows = 0, element = 0, width = 0;
};

Shape ShapeOf(const Config& cfg) {
  Shape s;
  s.width = static_cast<uint32_t>(cfg.width);
  s.element = cfg.dtype == TF_HALF ? 2 : 4;
  s.simdgroups = FM_GPU_SIMDGROUPS(s.width, s.element == 2);
  s.block_rows = 8 * s.simdgroups;
  return s;
}

std::string KernelName(const char* kernel, const Config& cfg) {
  return std::string("fused_mlp_") + kernel + "_w" + std::to_string(cfg.width) +
         (cfg.dtype == TF_HALF ? "_float16" : "_float32");
}

tfmo::gpu::Specialization Activations(const Config& cfg) {
  tfmo::gpu::Specialization spec;
  spec.Int(0, cfg.activation).Int(1, cfg.output_activation);
  return spec;
}

// Parts of the backward's fixed-order sum (threadgroups; a function of N and the layout only).
int64_t Parts(int64_t blocks, int64_t P) {
  return std::max<int64_t>(1, std::min({blocks, kMaxParts, kMaxPartialValues / P}));
}

FmArgs MakeArgs(const tfmo::fused_mlp::Call& c, int64_t blocks, int64_t parts) {
  const Layout& l = c.layout;
  FmArgs a{};
  a.n = static_cast<uint>(c.n);
  a.n_input = static_cast<uint>(l.n_input);
  a.in_pad = static_cast<uint>(l.in_pad);
  a.n_output = static_cast<uint>(l.n_output);
  a.out_pad = static_cast<uint>(l.out_pad);
  a.n_matrices = static_cast<uint>(l.n_matrices);
  a.use_bias = l.use_bias ? 1u : 0u;
  a.training = c.cfg->training ? 1u : 0u;
  a.feature_major = c.cfg->feature_major ? 1u : 0u;
  a.blocks = static_cast<uint>(blocks);
  a.parts = static_cast<uint>(parts);
  a.total = static_cast<uint>(l.total);
  for (int m = 0; m < l.n_matrices; ++m) {
    a.weight_offset[m] = static_cast<uint>(l.weight_offset[m]);
    a.bias_offset[m] = static_cast<uint>(l.bias_offset[m]);
  }
  return a;
}

// The weights buffer of a pass with `row_buffers` row buffers: every matrix, rows padded, one after another when
// they fit next to the row buffers (the kernels then copy them once per threadgroup; a.weights_resident and
// a.weight_tg_offset say where), else one matrix at a time (FM_GPU_WEIGHT_BYTES). Its length in bytes.
uint32_t PlaceWeights(const Layout& l, const Shape& s, uint32_t row_buffers, FmArgs* a) {
  a->weights_resident = 0;
  if (!FM_GPU_TG_WEIGHTS(s.width)) return FM_GPU_WEIGHT_BYTES(s.width, s.element);
  uint32_t at = 0;
  for (int m = 0; m < l.n_matrices; ++m) {
    a->weight_tg_offset[m] = at;
    at += static_cast<uint32_t>(l.rows[m] * (l.cols[m] + FM_GPU_TG_PAD(s.element)));
  }
  const uint32_t bytes = at * s.element;
  if (row_buffers * FM_GPU_ROWS_BYTES(s.width, s.element, s.simdgroups) + bytes > kThreadgroupMemoryLimit)
    return FM_GPU_WEIGHT_BYTES(s.width, s.element);
  a->weights_resident = 1;
  return bytes;
}

// Binds the threadgroup buffers of a pass: `row_buffers` buffers of [block][W] T from 0, then the weights
// (`weights` bytes: PlaceWeights).
bool BindThreadgroupMemory(tfmo::gpu::Call& call, tfmo::gpu::Pass& p, const Shape& s, uint32_t row_buffers,
                           uint32_t weights) {
  const uint32_t rows = FM_GPU_ROWS_BYTES(s.width, s.element, s.simdgroups);
  if (row_buffers * rows + weights > kThreadgroupMemoryLimit) {
    call.fail(TF_INTERNAL, "%s: %u bytes of threadgroup memory exceed the limit", p.function().c_str(),
              row_buffers * rows + weights);
    return false;
  }
  for (uint32_t i = 0; i < row_buffers; ++i) p.threadgroup_memory(i, rows);
  p.threadgroup_memory(row_buffers, weights);
  return true;
}

void ForwardGpu(void* state, TF_OpKernelContext* ctx) {
  const char* op = "fused_mlp";
  tfmo::fused_mlp::Call c;
  if (!tfmo::fused_mlp::PrepareForward(ctx, state, &c)) return;
  const Config& cfg = *c.cfg;
  TensorRef y, hidden;
  const int64_t kept = cfg.training ? cfg.n_hidden_layers : 0;
  if (!tfmo::AllocateOutput(ctx, 0, cfg.dtype, {c.n, static_cast<int64_t>(cfg.n_output)}, &y) ||
      !tfmo::AllocateOutput(ctx, 1, TF_FLOAT, {kept, c.n, static_cast<int64_t>(cfg.width)}, &hidden))
    return;
  if (c.n == 0 || !tfmo::gpu::CheckGridSize(ctx, op, "the number of rows", static_cast<uint64_t>(c.n))) return;
  const Shape s = ShapeOf(cfg);
  const int64_t blocks = (c.n + s.block_rows - 1) / s.block_rows;
  tfmo::gpu::Call call(ctx, op);
  const std::string kernel = KernelName("forward", cfg);
  tfmo::gpu::Pass& p = call.pass(kernel.c_str(), Activations(cfg));
  FmArgs args = MakeArgs(c, blocks, 0);
  const uint32_t weights = PlaceWeights(c.layout, s, 1, &args);
  // With the weights resident each threadgroup takes kForwardBlocks blocks in a row (one copy serves them).
  const int64_t parts = args.weights_resident ? (blocks + kForwardBlocks - 1) / kForwardBlocks : blocks;
  args.parts = static_cast<uint>(parts);
  p.buffer(0, c.x).buffer(1, c.params).value(2, args).buffer(3, y);
  if (cfg.training) {
    p.buffer(4, hidden);
  } else if (const TensorRef* unused = call.scratch(TF_FLOAT, 1)) {  // never written without training
    p.buffer(4, *unused);
  }
  if (BindThreadgroupMemory(call, p, s, 1, weights))
    p.threadgroups({static_cast<uint64_t>(parts), 1, 1}, {32 * s.simdgroups, 1, 1});
  call.Run();
}

void GradGpu(void* state, TF_OpKernelContext* ctx) {
  const char* op = "fused_mlp (gradient)";
  tfmo::fused_mlp::Call c;
  if (!tfmo::fused_mlp::PrepareGrad(ctx, state, &c)) return;
  const Config& cfg = *c.cfg;
  const int64_t P = c.layout.total;
  if (!c.hidden_kept && c.n > 0) {
    tfmo::Fail(ctx, TF_INVALID_ARGUMENT,
               "%s: hidden must hold the kept activations [%d, %lld, %d] on the GPU (FusedMlp's hidden output "
               "with training=True on the GPU), got [0, %lld, %d]",
               op, cfg.n_hidden_layers, static_cast<long long>(c.n), cfg.width, static_cast<long long>(c.n), cfg.width);
    return;
  }
  TensorRef dx, dparams;
  if (!tfmo::AllocateOutput(ctx, 0, cfg.dtype, c.x_shape(), &dx) ||
      !tfmo::AllocateOutput(ctx, 1, cfg.dtype, {P}, &dparams))
    return;
  if (!tfmo::gpu::CheckGridSize(ctx, op, "the number of rows", static_cast<uint64_t>(c.n))) return;
  const Shape s = ShapeOf(cfg);
  const int64_t blocks = (c.n + s.block_rows - 1) / s.block_rows;
  const int64_t parts = c.n == 0 ? 0 : Parts(blocks, P);
  FmArgs args = MakeArgs(c, blocks, parts);
  const uint32_t weights = PlaceWeights(c.layout, s, 2, &args);
  tfmo::gpu::Call call(ctx, op);
  const TensorRef* partial = call.scratch(TF_FLOAT, std::max<int64_t>(parts * P, 1));
  if (partial == nullptr) {
    call.Run();
    return;
  }
  if (c.n > 0) {
    const std::string kernel = KernelName("backward", cfg);
    tfmo::gpu::Pass& p = call.pass(kernel.c_str(), Activations(cfg));
    p.buffer(0, c.dy).buffer(1, c.x).buffer(2, c.params).buffer(3, c.y).buffer(4, c.hidden).value(5, args);
    p.buffer(6, dx).buffer(7, *partial);
    if (BindThreadgroupMemory(call, p, s, 2, weights))
      p.threadgroups({static_cast<uint64_t>(parts), 1, 1}, {32 * s.simdgroups, 1, 1});
  }
  // The reduce reads no function constant; it gets the file's values like every kernel of the file.
  call.pass(cfg.dtype == TF_HALF ? "fused_mlp_reduce_float16" : "fused_mlp_reduce_float32", Activations(cfg))
      .buffer(0, *partial)
      .value(1, args)
      .buffer(2, dparams)
      .threads(static_cast<uint64_t>(P));
  call.Run();
}

const tfmo::OnLoad kRegister([] { tfmo::fused_mlp::RegisterKernels("GPU", &ForwardGpu, &GradGpu); });

}  // namespace
