// Positive control for dev/check_mac_host.py: the "Adding a GPU op" example of docs/metal_host.md, kept
// compiling so the documented host-layer usage stays true. Not built into the library (not under csrc/).
#include <algorithm>

#include "common/op_names.h"
#include "gpu/gpu_host.h"

#define TFMO_OP_MY_OP "MyOp"

namespace {

void MyOpGpu(void*, TF_OpKernelContext* ctx) {
  tfmo::TensorRef x;
  if (!tfmo::GetInput(ctx, 0, &x)) return;
  // validate dtype/rank/shape here: eager mode runs no shape function
  tfmo::TensorRef y;
  if (!tfmo::AllocateOutput(ctx, 0, x.dtype(), x.shape(), &y)) return;
  const int64_t n = x.num_elements();
  if (n == 0) return;  // no pass for empty work
  if (!tfmo::gpu::CheckGridSize(ctx, "my_op", "elements", n)) return;
  const uint32_t count = static_cast<uint32_t>(n);
  tfmo::gpu::Call call(ctx, "my_op");
  call.pass("my_op_float32").buffer(0, x).buffer(1, y).value(2, count).threads(count);
  call.Run();  // fails ctx itself on error
}

// The other Pass/Specialization entry points, as an op with scratch, threadgroup memory and constants uses them.
void MyTiledOpGpu(void*, TF_OpKernelContext* ctx) {
  struct Params {
    uint32_t n;
    float scale;
  } params = {1024, 0.5f};
  const uint32_t group = 256;
  tfmo::gpu::Call call(ctx, "my_tiled_op");
  const tfmo::TensorRef* partial = call.scratch(TF_FLOAT, (params.n + group - 1) / group);
  if (partial == nullptr) return (void)call.Run();  // reports the allocation failure
  call.pass("my_tiled_sum", tfmo::gpu::Specialization().UInt(0, group).Int(1, -2).Bool(2, true).Float(3, 1.5f))
      .value(0, params)
      .bytes(1, &params.scale, sizeof params.scale)
      .buffer(2, *partial)
      .threadgroup_memory(0, group * sizeof(float))
      .threadgroups({(params.n + group - 1) / group, 1, 1}, {group, 1, 1});
  call.pass("my_tiled_finish").buffer(0, *partial).threads({64, 64, 4});
  call.Run();
}

const tfmo::OnLoad kRegister([] {
  tfmo::KernelSpec spec;  // op name from common/op_names.h, device "GPU", one registration per dtype
  spec.op = TFMO_OP_MY_OP;
  spec.device = "GPU";
  spec.compute = &MyOpGpu;
  spec.type_attr = "T";
  spec.types = {TF_FLOAT};
  tfmo::RegisterKernel(spec);
  spec.compute = &MyTiledOpGpu;
  (void)spec;
});

}  // namespace
