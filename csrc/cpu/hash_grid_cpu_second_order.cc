// The second-order gradients of HashGridEncode on the CPU: SecondOrder for every (D, F, T).
// Kernels and their structure: csrc/cpu/hash_grid_cpu_kernels.h.
#include "cpu/hash_grid_cpu_kernels.h"

namespace tfmo::hash_grid::cpu {

void SecondOrderCompute(void* state, TF_OpKernelContext* ctx) {
  tfmo::hash_grid::SecondOrderCall so;
  if (!tfmo::hash_grid::PrepareSecondOrder(ctx, state, &so)) return;
  auto& [op, call, ddx, out, elems] = so;
  const Config& cfg = *call.cfg;
  const bool half = cfg.dtype == TF_HALF;
  std::unique_ptr<float[]> tmp(half ? new (std::nothrow) float[elems] : nullptr);
  if (half && !tmp) {
    tfmo::Fail(ctx, TF_RESOURCE_EXHAUSTED, "%s: out of memory for the float32 accumulator", op);
    return;
  }
  float* acc = half ? tmp.get() : out.params.data<float>();
  try {
    Dispatch<SecondOrderK>(call, ddx.data<float>(), call.grad.raw(), out.dy.raw(), acc, out.dx.data<float>());
  } catch (const std::bad_alloc&) {
    tfmo::Fail(ctx, TF_RESOURCE_EXHAUSTED, "%s: out of memory for %lld points", op, (long long)call.n);
    return;
  }
  if (half) {
    uint16_t* o = out.params.data<uint16_t>();
    tfmo::ParallelFor(elems, 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = tfmo::FloatToHalf(acc[i]);
    });
  }
}

}  // namespace tfmo::hash_grid::cpu
