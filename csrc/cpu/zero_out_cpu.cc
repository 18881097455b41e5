// CPU kernel of ZeroOut (semantics in csrc/ops/zero_out_op.cc; input check and registration: csrc/ops/zero_out_args.h).
#include <cstring>

#include "common/tfc.h"
#include "common/thread_pool.h"
#include "ops/zero_out_args.h"

namespace {

void ZeroOutCompute(void*, TF_OpKernelContext* ctx) {
  tfmo::TensorRef in;
  if (!tfmo::GetInput(ctx, 0, &in)) return;
  if (!tfmo::zero_out::CheckInput(ctx, in)) return;
  const TF_DataType dtype = in.dtype();
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

static const tfmo::OnLoad kRegister([] { tfmo::zero_out::RegisterKernels("CPU", &ZeroOutCompute); });

}  // namespace
