// The table gradient of HashGridEncode on the CPU: GradParams for every (D, F, T).
// Kernels and their structure: csrc/cpu/hash_grid_cpu_kernels.h.
#include "cpu/hash_grid_cpu_kernels.h"

namespace tfmo::hash_grid::cpu {

void GradParamsCompute(void* state, TF_OpKernelContext* ctx) {
  Inputs call;
  if (!tfmo::hash_grid::Prepare(ctx, state, true, "hash_grid_encode (gradient w.r.t. params)", &call)) return;
  const Config& cfg = *call.cfg;
  tfmo::TensorRef out;
  if (!tfmo::AllocateOutput(ctx, 0, cfg.dtype, {call.rows, (int64_t)cfg.n_features}, &out)) return;
  tfmo::AdviseHugePages(out);
  const int64_t elems = call.rows * cfg.n_features;
  const bool half = cfg.dtype == TF_HALF;
  std::unique_ptr<float[]> tmp(half ? new (std::nothrow) float[elems] : nullptr);
  if (half && !tmp) {
    tfmo::Fail(ctx, TF_RESOURCE_EXHAUSTED, "hash_grid_encode gradient: out of memory for the float32 accumulator");
    return;
  }
  float* acc = half ? tmp.get() : out.data<float>();
  try {
    Dispatch<GradParamsK>(call, call.grad.raw(), acc);
  } catch (const std::bad_alloc&) {
    tfmo::Fail(ctx, TF_RESOURCE_EXHAUSTED, "hash_grid_encode gradient: out of memory for %lld points", (long long)call.n);
    return;
  }
  if (half) {
    uint16_t* o = out.data<uint16_t>();
    tfmo::ParallelFor(elems, 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = tfmo::FloatToHalf(acc[i]);
    });
  }
}

}  // namespace tfmo::hash_grid::cpu
