// GPU kernel host of TfmoMetalKernel (semantics: csrc/ops/metal_kernel_op.cc). The kernel's own MSL source goes to
// the backend with the pass (gpu_host.h KernelSource): compiled at first use, cached by its text.
//   init_value: one pass per non-empty output, `<kernel>_init<j>(out [[buffer(0)]], value [[buffer(1)]],
//   n [[buffer(2)]])` (generated into the same source by tf_metal_ops/inline_kernels/source.py);
//   then the kernel, with what `bindings` names at each buffer index; shape/strides/ndim go as bytes (int32).
// An empty tensor has no GPU buffer: a one-element scratch buffer stands in (a correct kernel never touches it).
#include <memory>
#include <string>
#include <vector>

#include "common/op_names.h"
#include "common/tfc.h"
#include "gpu/gpu_host.h"
#include "ops/metal_kernel_args.h"

namespace {

using tfmo::metal_kernel::Attrs;
using tfmo::metal_kernel::Launch;
using tfmo::metal_kernel::Slot;

struct State {
  std::shared_ptr<const Attrs> attrs;
  tfmo::gpu::KernelSource source;
  std::vector<std::string> init_kernels;  // by output
  void Init() {
    source.msl = attrs->source;
    for (size_t j = 0; j < attrs->tout.size(); ++j) init_kernels.push_back(attrs->kernel + "_init" + std::to_string(j));
  }
};

void Compute(void* state, TF_OpKernelContext* ctx) {
  const State& st = *static_cast<State*>(state);
  const Attrs& a = *st.attrs;
  const char* k = a.kernel.c_str();
  Launch l;
  std::vector<tfmo::TensorRef> in, out;
  if (!tfmo::metal_kernel::Prepare(ctx, a, &l, &in, &out)) return;
  tfmo::gpu::Call call(ctx, "metal_kernel");
  if (a.has_init) {
    for (size_t j = 0; j < out.size(); ++j) {
      const int64_t n = out[j].num_elements();
      if (n == 0) continue;
      if (!tfmo::gpu::CheckGridSize(ctx, k, "an output's element count (init_value)", static_cast<uint64_t>(n))) return;
      call.pass(st.init_kernels[j].c_str(), {}, &st.source)
          .buffer(0, out[j])
          .value(1, a.init_value)
          .value(2, static_cast<uint32_t>(n))
          .threads(static_cast<uint64_t>(n));
    }
  }
  if (!l.empty()) {
    tfmo::gpu::Pass& p = call.pass(k, {}, &st.source);
    for (size_t n = 0; n < a.slots.size(); ++n) {
      const Slot& s = a.slots[n];
      if (s.kind == Slot::Kind::kNone) continue;
      const tfmo::TensorRef& t = s.kind == Slot::Kind::kOutput ? out[s.index] : in[s.index];
      if (s.kind == Slot::Kind::kInput || s.kind == Slot::Kind::kOutput) {
        if (t.num_elements() > 0) {
          p.buffer(static_cast<uint32_t>(n), t);
        } else if (const tfmo::TensorRef* stand_in = call.scratch(t.dtype(), 1)) {
          p.buffer(static_cast<uint32_t>(n), *stand_in);
        }
      } else {
        std::vector<int32_t> v;
        if (!tfmo::metal_kernel::ShapeValues(ctx, a, t, s.kind, s.index, &v)) return;
        p.bytes(static_cast<uint32_t>(n), v.data(), v.size() * sizeof(int32_t));
      }
    }
    p.threads({l.grid[0], l.grid[1], l.grid[2]}, {l.group[0], l.group[1], l.group[2]});
  }
  call.Run();
}

const tfmo::OnLoad kRegister([] { tfmo::metal_kernel::RegisterKernels<State>("GPU", &Compute); });

}  // namespace
