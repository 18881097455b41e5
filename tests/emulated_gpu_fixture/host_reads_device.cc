// Negative control for the emulated GPU: a GPU kernel whose host code reads a device tensor's memory (what a
// Metal host must never do: TF_TensorData is an MTLBuffer there). On the emulated GPU the read must fault
// loudly instead of working by accident. Built and loaded only by tests/test_emulated_gpu.py.
#include "common/tfc.h"

namespace {

void HostReadsDevice(void*, TF_OpKernelContext* ctx) {
  tfmo::TensorRef x;
  if (!tfmo::GetInput(ctx, 0, &x)) return;
  tfmo::TensorRef y;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, x.shape(), &y)) return;
  volatile float first = *x.data<float>();  // the bug under test
  (void)first;
}

const tfmo::OnLoad kRegister([] {
  TF_OpDefinitionBuilder* b = TF_NewOpDefinitionBuilder("TfmoTestHostReadsDevice");
  TF_OpDefinitionBuilderAddInput(b, "x: float");
  TF_OpDefinitionBuilderAddOutput(b, "y: float");
  tfmo::RegisterOp(b);
  tfmo::KernelSpec spec;
  spec.op = "TfmoTestHostReadsDevice";
  spec.device = "GPU";
  spec.compute = &HostReadsDevice;
  tfmo::RegisterKernel(spec);
});

}  // namespace
