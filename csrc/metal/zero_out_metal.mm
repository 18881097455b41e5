// GPU (Metal) kernel host of Zero_out (semantics in csrc/ops/zero_out_op.cc; kernels in
// metal_kernels/zero_out.metal: zero_out_<dtype>(in [[buffer(0)]], out [[buffer(1)]], n [[buffer(2)]])).
#include "common/op_names.h"
#include "common/tfc.h"
#include "metal/metal_host.h"

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

void ZeroOutMetal(void*, TF_OpKernelContext* ctx) {
  tfmo::TensorRef in;
  if (!tfmo::GetInput(ctx, 0, &in)) return;
  const char* kernel = KernelName(in.dtype());
  if (kernel == nullptr) {
    tfmo::Fail(ctx, TF_INVALID_ARGUMENT, "zero_out: to_zero must be int32, int64, float32 or float16, got %s",
               tfmo::DataTypeName(in.dtype()));
    return;
  }
  tfmo::TensorRef out;
  if (!tfmo::AllocateOutput(ctx, 0, in.dtype(), in.shape(), &out)) return;
  const int64_t n = in.num_elements();
  if (n == 0) return;  // nothing to encode (and no buffers to bind)
  if (!tfmo::metal::CheckGridSize(ctx, "zero_out", "the number of elements", static_cast<uint64_t>(n))) return;
  const uint32_t count = static_cast<uint32_t>(n);
  tfmo::metal::Dispatch(ctx, kernel, {}, [&](tfmo::metal::Encoder& e) {
    e.buffer(0, in);
    e.buffer(1, out);
    e.value(2, count);
    e.threads(count);
  });
}

const tfmo::OnLoad kRegister([] {
  tfmo::KernelSpec spec;
  spec.op = TFMO_OP_ZERO_OUT;
  spec.device = "GPU";
  spec.compute = &ZeroOutMetal;
  spec.type_attr = "T";
  spec.types = {TF_INT32, TF_FLOAT, TF_INT64, TF_HALF};
  tfmo::RegisterKernel(spec);
});

}  // namespace
