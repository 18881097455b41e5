// GPU kernel of HostLayerProbe: `mode` picks a scenario of the GPU host layer (csrc/gpu/gpu_host.h).
//   block_sum: y[g] = -(sum of x over group g of 64 * 2 - 1 + 0.5) in two passes through a scratch buffer, with
//              function constants of each type, threadgroup memory, barriers and dispatchThreadgroups;
//   every other mode is a misuse that must become a clear op error (never a crash).
#include <cstdint>
#include <string>
#include <vector>

#include "common/tfc.h"
#include "gpu/gpu_host.h"

namespace {

struct Mode {
  std::string name;
};

void* Create(TF_OpKernelConstruction* c) {
  auto* m = new Mode;
  if (!tfmo::GetAttr(c, "mode", &m->name)) {
    delete m;
    return nullptr;
  }
  return m;
}
void Delete(void* p) { delete static_cast<Mode*>(p); }

const tfmo::gpu::Specialization kSpec =
    tfmo::gpu::Specialization().UInt(0, 2).Int(1, -1).Bool(2, false).Float(3, 7.0f).Bool(2, true).Float(3, 0.5f);

void ProbeGpu(void* state, TF_OpKernelContext* ctx) {
  const std::string& mode = static_cast<Mode*>(state)->name;
  tfmo::TensorRef x, y;
  if (!tfmo::GetInput(ctx, 0, &x)) return;
  const uint32_t n = static_cast<uint32_t>(x.num_elements());
  const uint32_t group = 64, groups = (n + group - 1) / group;
  if (mode == "block_sum") {
    if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {groups}, &y) || n == 0) return;
    tfmo::gpu::Call call(ctx, "host_layer_probe");
    const tfmo::TensorRef* partial = call.scratch(TF_FLOAT, groups);
    if (partial == nullptr) return (void)call.Run();
    call.pass("probe_block_sum", kSpec)
        .buffer(0, x)
        .buffer(1, *partial)
        .value(2, n)
        .threadgroup_memory(0, group * sizeof(float))
        .threadgroups({groups, 1, 1}, {group, 1, 1});
    call.pass("probe_finish", kSpec).buffer(0, *partial).buffer(1, y).value(2, groups).threads(groups);
    call.Run();
    return;
  }
  const std::vector<int64_t> shape = mode == "empty_tensor" ? std::vector<int64_t>{0} : x.shape();
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, shape, &y)) return;
  tfmo::gpu::Call call(ctx, "host_layer_probe");
  const std::vector<unsigned char> big(5000, 0);
  if (mode == "missing_constants") {  // the kernel's file declares function constants; none given
    call.pass("probe_finish").buffer(0, x).buffer(1, y).value(2, n).threads(n);
  } else if (mode == "wrong_constant_type") {
    call.pass("probe_finish", tfmo::gpu::Specialization().Int(0, 2).Int(1, -1).Bool(2, true).Float(3, 0.5f))
        .buffer(0, x).buffer(1, y).value(2, n).threads(n);
  } else if (mode == "float_to_half") {  // a float32 tensor bound to `device const half*`
    call.pass("probe_half_input").buffer(0, x).buffer(1, y).threads(n);
  } else if (mode == "missing_slot") {
    call.pass("probe_finish", kSpec).buffer(0, x).buffer(1, y).threads(n);
  } else if (mode == "missing_threadgroup_memory") {
    call.pass("probe_block_sum", kSpec).buffer(0, x).buffer(1, y).value(2, n).threadgroups({1, 1, 1}, {64, 1, 1});
  } else if (mode == "unknown_kernel") {
    call.pass("probe_no_such_kernel").buffer(0, x).threads(n);
  } else if (mode == "slot_out_of_range") {
    call.pass("probe_finish", kSpec).buffer(31, x).threads(n);
  } else if (mode == "null_tensor") {
    tfmo::TensorRef none;
    call.pass("probe_finish", kSpec).buffer(0, none).threads(n);
  } else if (mode == "empty_tensor") {  // y is empty in this mode
    call.pass("probe_finish", kSpec).buffer(0, y).threads(n);
  } else if (mode == "bytes_too_big") {
    call.pass("probe_finish", kSpec).bytes(2, big.data(), big.size()).threads(n);
  } else if (mode == "bytes_empty") {
    call.pass("probe_finish", kSpec).bytes(2, big.data(), 0).threads(n);
  } else if (mode == "threadgroup_memory_zero") {
    call.pass("probe_block_sum", kSpec).threadgroup_memory(0, 0).threadgroups({1, 1, 1}, {64, 1, 1});
  } else if (mode == "threadgroup_memory_slot") {
    call.pass("probe_block_sum", kSpec).threadgroup_memory(40, 16).threadgroups({1, 1, 1}, {64, 1, 1});
  } else if (mode == "grid_too_big") {
    call.pass("probe_finish", kSpec).threads({uint64_t{1} << 33, 1, 1});
  } else if (mode == "group_dimension_zero") {
    call.pass("probe_block_sum", kSpec).threadgroups({1, 1, 1}, {0, 1, 1});
  } else if (mode == "too_many_groups") {
    call.pass("probe_block_sum", kSpec).threadgroups({uint64_t{1} << 31, 1, 1}, {64, 1, 1});
  } else if (mode == "no_grid") {
    call.pass("probe_finish", kSpec).buffer(0, x).buffer(1, y);
  } else if (mode == "read_unaligned_offset" || mode == "read_unaligned_size") {  // macOS blits: multiples of 4
    call.pass("probe_finish", kSpec).buffer(0, x).buffer(1, y).value(2, n).threads(n);
    unsigned char out[8];
    const bool offset = mode == "read_unaligned_offset";
    call.RunAndRead(y, offset ? 2 : 0, out, offset ? 4 : 6);
    return;
  } else if (mode == "check_grid_size") {
    tfmo::gpu::CheckGridSize(ctx, "host_layer_probe", "the test quantity", uint64_t{1} << 33);
    return;
  } else {
    tfmo::Fail(ctx, TF_INVALID_ARGUMENT, "host_layer_probe: unknown mode %s", mode.c_str());
    return;
  }
  call.Run();
}

const tfmo::OnLoad kRegister([] {
  tfmo::KernelSpec spec;
  spec.op = "HostLayerProbe";
  spec.device = "GPU";
  spec.create = &Create;
  spec.destroy = &Delete;
  spec.compute = &ProbeGpu;
  tfmo::RegisterKernel(spec);
});

}  // namespace
