// HashGridEncode on the CPU: Encode for every (D, F, T).
// Kernels and their structure: csrc/cpu/hash_grid_cpu_kernels.h.
#include "cpu/hash_grid_cpu_kernels.h"

namespace tfmo::hash_grid::cpu {

void EncodeCompute(void* state, TF_OpKernelContext* ctx) {
  Inputs call;
  if (!tfmo::hash_grid::Prepare(ctx, state, false, "hash_grid_encode", &call)) return;
  const Config& cfg = *call.cfg;
  tfmo::TensorRef out;
  if (!tfmo::AllocateOutput(ctx, 0, cfg.dtype, call.encoded_shape(), &out)) return;
  tfmo::AdviseHugePages(out);
  if (call.n == 0) return;
  try {
    Dispatch<EncodeK>(call, out.raw());
  } catch (const std::bad_alloc&) {  // scratch memory (allocated on this thread, before any parallel work)
    tfmo::Fail(ctx, TF_RESOURCE_EXHAUSTED, "hash_grid_encode: out of memory for %lld points", (long long)call.n);
  }
}

}  // namespace tfmo::hash_grid::cpu
