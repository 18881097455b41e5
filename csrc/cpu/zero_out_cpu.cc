// CPU kernel of ZeroOut (semantics in csrc/ops/zero_out_op.cc).
#include <cstring>

#include "common/op_names.h"
#include "common/tfc.h"
#include "common/thread_pool.h"

namespace {

void ZeroOutCompute(void*, TF_OpKernelContext* ctx) {
  tfmo::TensorRef in;
  if (!tfmo::GetInput(ctx, 0, &in)) return;
  const TF_DataType dtype = in.dtype();
  if (dtype != TF_INT32 && dtype != TF_INT64 && dtype != TF_FLOAT && dtype != TF_HALF) {
    tfmo::Fail(ctx, TF_INVALID_ARGUMENT, "zero_out: to_zero must be int32, int64, float32 or float16, got %s",
               tfmo::DataTypeName(dtype));
    return;
  }
  tfmo::TensorRef out;
  if (!tfmo::AllocateOutput(ctx, 0, dtype, in.shape(), &out)) return;
  const int64_t n = in.num_elements();
  if (n == 0) return;
  const size_t elem = TF_DataTypeSize(dtype);
  char* dst = static_cast<char*>(out.raw());
  // Zeroing is memory-bound: split only when the tensor is large enough to amortise the hand-off.
  tfmo::ParallelFor(static_cast<int64_t>(n * elem), int64_t{1} << 20, [&](int64_t b, int64_t e) {
    std::memset(dst + b, 0, static_cast<size_t>(e - b));
  });
  std::memcpy(dst, in.raw(), elem);
}

static const tfmo::OnLoad kRegister([] {
  tfmo::KernelSpec spec;
  spec.op = TFMO_OP_ZERO_OUT;
  spec.device = "CPU";
  spec.compute = &ZeroOutCompute;
  spec.type_attr = "T";
  spec.types = {TF_INT32, TF_INT64, TF_FLOAT, TF_HALF};
  tfmo::RegisterKernel(spec);
});

}  // namespace
