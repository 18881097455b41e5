// The position gradient of HashGridEncode on the CPU: GradPositions for every (D, F, T).
// Kernels and their structure: csrc/cpu/hash_grid_cpu_kernels.h.
#include "cpu/hash_grid_cpu_kernels.h"

namespace tfmo::hash_grid::cpu {

void GradPositionsCompute(void* state, TF_OpKernelContext* ctx) {
  Inputs call;
  if (!tfmo::hash_grid::Prepare(ctx, state, true, "hash_grid_encode (gradient w.r.t. positions)", &call)) return;
  tfmo::TensorRef out;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {call.n, (int64_t)call.dims}, &out)) return;
  tfmo::AdviseHugePages(out);
  if (call.n == 0) return;
  try {
    Dispatch<GradPositionsK>(call, call.grad.raw(), out.data<float>());
  } catch (const std::bad_alloc&) {
    tfmo::Fail(ctx, TF_RESOURCE_EXHAUSTED, "hash_grid_encode gradient: out of memory for %lld points", (long long)call.n);
  }
}

}  // namespace tfmo::hash_grid::cpu
