// HostLayerProbe(x: float; mode: string) -> y: float, a test-only op whose GPU kernel (probe_gpu.cc) drives the GPU
// host layer through one scenario per `mode`. The CPU kernel exists so the op is complete; it copies x.
#include <cstring>

#include "common/tfc.h"

namespace {

void ProbeCpu(void*, TF_OpKernelContext* ctx) {
  tfmo::TensorRef x, y;
  if (!tfmo::GetInput(ctx, 0, &x) || !tfmo::AllocateOutput(ctx, 0, TF_FLOAT, x.shape(), &y)) return;
  if (x.num_elements() > 0) std::memcpy(y.raw(), x.raw(), TF_TensorByteSize(x.get()));
}

const tfmo::OnLoad kRegister([] {
  TF_OpDefinitionBuilder* op = TF_NewOpDefinitionBuilder("HostLayerProbe");
  TF_OpDefinitionBuilderAddInput(op, "x: float");
  TF_OpDefinitionBuilderAddOutput(op, "y: float");
  TF_OpDefinitionBuilderAddAttr(op, "mode: string");
  tfmo::RegisterOp(op);
  tfmo::KernelSpec spec;
  spec.op = "HostLayerProbe";
  spec.device = "CPU";
  spec.compute = &ProbeCpu;
  tfmo::RegisterKernel(spec);
});

}  // namespace
