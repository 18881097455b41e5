// GPU kernel host of ZeroOut (semantics: csrc/ops/zero_out_op.cc; kernels: metal_kernels/zero_out.metal,
// zero_out_<dtype>(in [[buffer(0)]], out [[buffer(1)]], n [[buffer(2)]]): one thread per element; input check and
// registration: csrc/ops/zero_out_args.h).
#include "common/tfc.h"
#include "gpu/gpu_host.h"
#include "ops/zero_out_args.h"

namespace {

const char* KernelName(TF_DataType dtype) {
  switch (dtype) {
    case TF_INT32: return "zero_out_int32";
    case TF_FLOAT: return "zero_out_float32";
    case TF_INT64: return "zero_out_int64";
    case TF_HALF: return "zero_out_float16";
    default: return nullptr;
  }
}

void ZeroOutGpu(void*, TF_OpKernelContext* ctx) {
  tfmo::TensorRef in;
  if (!tfmo::GetInput(ctx, 0, &in)) return;
  if (!tfmo::zero_out::CheckInput(ctx, in)) return;
  const char* kernel = KernelName(in.dtype());
  tfmo::TensorRef out;
  if (!tfmo::AllocateOutput(ctx, 0, in.dtype(), in.shape(), &out)) return;
  const int64_t n = in.num_elements();
  if (n == 0) return;  // nothing to encode (and no buffers to bind)
  if (!tfmo::gpu::CheckGridSize(ctx, "zero_out", "the number of elements", static_cast<uint64_t>(n))) return;
  const uint32_t count = static_cast<uint32_t>(n);
  tfmo::gpu::Call call(ctx, "zero_out");
  call.pass(kernel).buffer(0, in).buffer(1, out).value(2, count).threads(count);
  call.Run();
}

const tfmo::OnLoad kRegister([] { tfmo::zero_out::RegisterKernels("GPU", &ZeroOutGpu); });

}  // namespace
