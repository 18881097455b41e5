// Positive control for tools/check_mac_host.py: the "Adding a Metal op" example of docs/metal_host.md, kept
// compiling so the documented host-layer usage stays true. Not built into the library (not under csrc/).
#include "common/op_names.h"
#include "metal/metal_host.h"

#define TFMO_OP_MY_OP "My_op"

namespace {

void MyOpMetal(void*, TF_OpKernelContext* ctx) {
  tfmo::TensorRef x;
  if (!tfmo::GetInput(ctx, 0, &x)) return;
  // validate dtype/rank/shape here: eager mode runs no shape function
  tfmo::TensorRef y;
  if (!tfmo::AllocateOutput(ctx, 0, x.dtype(), x.shape(), &y)) return;
  const int64_t n = x.num_elements();
  if (n == 0) return;  // no dispatch for empty work
  if (!tfmo::metal::CheckGridSize(ctx, "my_op", "elements", n)) return;
  const uint32_t count = static_cast<uint32_t>(n);
  tfmo::metal::Dispatch(ctx, "my_op_float32", {}, [&](tfmo::metal::Encoder& e) {
    e.buffer(0, x);
    e.buffer(1, y);
    e.value(2, count);
    e.threads(count);
  });  // fails ctx itself on error
}

// The other Encoder/Specialization entry points, as an op with threadgroup memory would use them.
void MyTiledOpMetal(void*, TF_OpKernelContext* ctx) {
  struct Params {
    uint32_t n;
    float scale;
  } params = {1024, 0.5f};
  const auto spec = tfmo::metal::Specialization().UInt(0, 16).Int(1, -2).Bool(2, true).Float(3, 1.5f);
  tfmo::metal::Dispatch(ctx, "my_tiled_op", spec, [&](tfmo::metal::Encoder& e) {
    const uint32_t group = std::min<uint32_t>(256, e.max_threads_per_group());
    e.value(0, params);
    e.bytes(1, &params.scale, sizeof params.scale);
    e.threadgroup_memory(0, group * sizeof(float));
    e.threadgroups({(params.n + group - 1) / group, 1, 1}, {group, 1, 1});
    e.threads({64, 64, 4});
    if (e.execution_width() == 0) e.fail(TF_INTERNAL, "unreachable: width %u", e.execution_width());
  });
}

const tfmo::OnLoad kRegister([] {
  tfmo::KernelSpec spec;  // op name from common/op_names.h, device "GPU", one registration per dtype
  spec.op = TFMO_OP_MY_OP;
  spec.device = "GPU";
  spec.compute = &MyOpMetal;
  spec.type_attr = "T";
  spec.types = {TF_FLOAT};
  tfmo::RegisterKernel(spec);
  spec.compute = &MyTiledOpMetal;
  (void)spec;
});

}  // namespace
