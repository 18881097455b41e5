// GPU kernel hosts of VolumeRenderPacked(Grad) and DistortionLossPacked(Grad) (semantics:
// csrc/ops/render_packed_op.cc; kernels and their NaN policy: metal_kernels/render_packed.metal).
// Shapes are validated here exactly as on the CPU (render_packed_args.h); row_splits and sample values live in
// device memory and are checked by the kernels: every call first runs render_packed_check_init and
// render_packed_check_splits (status scratch), then the op's kernel, in one encoder.
// Empty tensors have no MTLBuffer: an empty input or output is bound as a one-element float scratch buffer that the
// kernels never touch (their loops over it are empty). R == 0 (then N == 0, else InvalidArgument) skips the dispatch.
#include <cstdint>

#include "common/op_names.h"
#include "common/tfc.h"
#include "gpu/gpu_host.h"
#include "ops/render_packed_args.h"
#include "shared/render_math.h"

namespace {

using tfmo::TensorRef;
using tfmo::render_packed::VrAttrs;

// The kernels index rays and samples with 32-bit uints, and compare samples with int32 row_splits.
bool CheckDims(TF_OpKernelContext* ctx, const char* op, int64_t R, int64_t N, int64_t C) {
  if (!tfmo::render_packed::CheckSamplesWithoutRays(ctx, op, R, N)) return false;
  if (N > INT32_MAX)
    return tfmo::Fail(ctx, TF_INVALID_ARGUMENT,
                      "%s: %lld samples exceed 2147483647, the limit of int32 row_splits; split the batch", op,
                      static_cast<long long>(N));
  return tfmo::gpu::CheckGridSize(ctx, op, "the number of rays + 1", static_cast<uint64_t>(R + 1)) &&
         tfmo::gpu::CheckGridSize(ctx, op, "32 x the number of rays (one SIMD group per ray)",
                                  static_cast<uint64_t>(R) * kVrpLanes) &&
         tfmo::gpu::CheckGridSize(ctx, op, "the number of channels", static_cast<uint64_t>(C)) &&
         tfmo::gpu::CheckGridSize(ctx, op, "the number of sample values", static_cast<uint64_t>(N * C));
}

// Binds tensors of one call, standing in a one-element scratch buffer for empty ones (see the header comment).
class Binder {
 public:
  explicit Binder(tfmo::gpu::Call& call) : call_(call) {}
  bool Bind(tfmo::gpu::Pass& p, uint32_t slot, const TensorRef& t) {
    if (t.num_elements() > 0) {
      p.buffer(slot, t);
      return true;
    }
    if (stand_in_ == nullptr) stand_in_ = call_.scratch(TF_FLOAT, 1);
    if (stand_in_ == nullptr) return false;
    p.buffer(slot, *stand_in_);
    return true;
  }

 private:
  tfmo::gpu::Call& call_;
  const TensorRef* stand_in_ = nullptr;
};

// Appends the row_splits check passes; returns the status buffer (nullptr after an allocation failure).
const TensorRef* CheckSplits(tfmo::gpu::Call& call, const TensorRef& row_splits, int64_t R, int64_t N) {
  const TensorRef* status = call.scratch(TF_INT32, 1);
  if (status == nullptr) return nullptr;
  call.pass("render_packed_check_init").buffer(0, *status).threads(1);
  DlpParams p;
  p.R = static_cast<uint32_t>(R);
  p.N = static_cast<uint32_t>(N);
  call.pass("render_packed_check_splits").buffer(0, row_splits).buffer(1, *status).value(2, p).threads(
      static_cast<uint64_t>(R + 1));
  return status;
}

// One dispatch of a packed kernel after the row_splits checks, one SIMD group per ray: kVrpLanes * R threads in
// threadgroups of kVrpRayGroup (clipped to the grid, itself a multiple of kVrpLanes; Metal's per-pipeline maximum is a
// multiple of the SIMD width), the layout metal_kernels/render_packed.metal requires.
// Binds in[0, n_in) at slots 0.., the status buffer next, then out[0, n_out), then the params (the binding order of
// every kernel in metal_kernels/render_packed.metal).
template <class Params>
void RunRayKernel(TF_OpKernelContext* ctx, const char* op, const char* kernel, const TensorRef* in, int n_in,
                  const TensorRef* out, int n_out, const TensorRef& row_splits, int64_t R, int64_t N,
                  const Params& params) {
  tfmo::gpu::Call call(ctx, op);
  Binder bind(call);
  const TensorRef* status = CheckSplits(call, row_splits, R, N);
  if (status != nullptr) {
    tfmo::gpu::Pass& p = call.pass(kernel);
    for (int i = 0; i < n_in; ++i) bind.Bind(p, i, in[i]);
    p.buffer(n_in, *status);
    for (int i = 0; i < n_out; ++i) bind.Bind(p, n_in + 1 + i, out[i]);
    p.value(n_in + 1 + n_out, params);
    p.threads(static_cast<uint64_t>(R) * kVrpLanes, kVrpRayGroup);
  }
  call.Run();
}

// Reads the first n inputs of VolumeRenderPacked(Grad) and validates the six forward ones.
bool VrpInputs(TF_OpKernelContext* ctx, const char* op, int n, TensorRef* in, tfmo::render_packed::VrpDims* d) {
  for (int i = 0; i < n; ++i)
    if (!tfmo::GetInput(ctx, i, &in[i])) return false;
  return tfmo::render_packed::ValidateVolumeRenderPacked(ctx, op, in[0], in[1], in[2], in[3], in[4], in[5], d) &&
         CheckDims(ctx, op, d->R, d->N, d->C);
}

VrpParams MakeParams(const tfmo::render_packed::VrpDims& d, float threshold) {
  return VrpParams{static_cast<uint32_t>(d.R), static_cast<uint32_t>(d.N), static_cast<uint32_t>(d.C),
                   static_cast<uint32_t>(d.bg), threshold};
}

void VrpGpu(void* attrs, TF_OpKernelContext* ctx) {
  const char* op = "volume_render_packed";
  TensorRef in[6];
  tfmo::render_packed::VrpDims d;
  if (!VrpInputs(ctx, op, 6, in, &d)) return;
  TensorRef out[4];
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {d.R, d.C}, &out[0]) ||
      !tfmo::AllocateOutput(ctx, 1, TF_FLOAT, {d.R}, &out[1]) ||
      !tfmo::AllocateOutput(ctx, 2, TF_FLOAT, {d.R}, &out[2]) ||
      !tfmo::AllocateOutput(ctx, 3, TF_FLOAT, {d.N}, &out[3]))
    return;
  if (d.R == 0) return;
  RunRayKernel(ctx, op, "volume_render_packed_forward", in, 6, out, 4, in[4], d.R, d.N,
               MakeParams(d, static_cast<VrAttrs*>(attrs)->threshold));
}

void VrpGradGpu(void* attrs, TF_OpKernelContext* ctx) {
  const char* op = "volume_render_packed_grad";
  TensorRef in[10];
  tfmo::render_packed::VrpDims d;
  if (!VrpInputs(ctx, op, 10, in, &d) ||
      !tfmo::render_packed::ValidateVolumeRenderPackedUpstream(ctx, op, d, in[6], in[7], in[8], in[9]))
    return;
  TensorRef out[5];
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {d.N}, &out[0]) ||
      !tfmo::AllocateOutput(ctx, 1, TF_FLOAT, {d.N, d.C}, &out[1]) ||
      !tfmo::AllocateOutput(ctx, 2, TF_FLOAT, {d.N}, &out[2]) ||
      !tfmo::AllocateOutput(ctx, 3, TF_FLOAT, {d.N}, &out[3]) ||
      !tfmo::AllocateOutput(ctx, 4, TF_FLOAT, {d.R, d.C}, &out[4]))
    return;
  if (d.R == 0) return;
  RunRayKernel(ctx, op, "volume_render_packed_backward", in, 10, out, 5, in[4], d.R, d.N,
               MakeParams(d, static_cast<VrAttrs*>(attrs)->threshold));
}

// Reads the first n inputs of DistortionLossPacked(Grad) and validates the four forward ones.
bool DlpInputs(TF_OpKernelContext* ctx, const char* op, int n, TensorRef* in, DlpParams* p) {
  for (int i = 0; i < n; ++i)
    if (!tfmo::GetInput(ctx, i, &in[i])) return false;
  int64_t R = 0, N = 0;
  if (!tfmo::render_packed::ValidateDistortionLossPacked(ctx, op, in[0], in[1], in[2], in[3], &R, &N) ||
      !CheckDims(ctx, op, R, N, 1))
    return false;
  p->R = static_cast<uint32_t>(R);
  p->N = static_cast<uint32_t>(N);
  return true;
}

void DlpGpu(void*, TF_OpKernelContext* ctx) {
  const char* op = "distortion_loss_packed";
  TensorRef in[4];
  DlpParams p;
  if (!DlpInputs(ctx, op, 4, in, &p)) return;
  TensorRef loss;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {p.R}, &loss) || p.R == 0) return;
  RunRayKernel(ctx, op, "distortion_loss_packed_forward", in, 4, &loss, 1, in[3], p.R, p.N, p);
}

void DlpGradGpu(void*, TF_OpKernelContext* ctx) {
  const char* op = "distortion_loss_packed_grad";
  TensorRef in[5];
  DlpParams p;
  if (!DlpInputs(ctx, op, 5, in, &p) || !tfmo::render_packed::CheckFloat(ctx, op, "grad_loss", in[4]) ||
      !tfmo::render_packed::CheckShape(ctx, op, "grad_loss", in[4], {p.R}, tfmo::render_packed::Dims({p.R}).c_str()))
    return;
  TensorRef out[3];
  for (int i = 0; i < 3; ++i)
    if (!tfmo::AllocateOutput(ctx, i, TF_FLOAT, {p.N}, &out[i])) return;
  if (p.R == 0) return;
  RunRayKernel(ctx, op, "distortion_loss_packed_backward", in, 5, out, 3, in[3], p.R, p.N, p);
}

const tfmo::OnLoad kRegister([] {
  tfmo::render_packed::RegisterKernels("GPU", &VrpGpu, &VrpGradGpu, &DlpGpu, &DlpGradGpu);
});

}  // namespace
