// CPU kernel of TfmoMetalKernel (semantics: csrc/ops/metal_kernel_op.cc): the kernel's own MSL source, compiled as
// C++ through csrc/msl_emu on first use (csrc/common/inline_library.h), runs its threadgroups in parallel on the
// package's thread pool. TF_METAL_OPS_BOUNDS_CHECK=1 runs the bounds-checked build instead (slower: accesses
// through the kernel's buffer parameters are checked and the loop is not vectorised).
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/half.h"
#include "common/inline_library.h"
#include "common/op_names.h"
#include "common/tfc.h"
#include "common/thread_pool.h"
#include "ops/metal_kernel_args.h"

namespace {

using tfmo::metal_kernel::Attrs;
using tfmo::metal_kernel::Launch;
using tfmo::metal_kernel::Slot;

bool BoundsCheckRequested() {
  const char* v = std::getenv("TF_METAL_OPS_BOUNDS_CHECK");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

struct State {
  std::shared_ptr<const Attrs> attrs;
  bool checked = false;
  std::atomic<const TfmoInlineKernel*> kernel{nullptr};  // resolved on first use
  void Init() { checked = BoundsCheckRequested(); }
};

template <class T>
void FillAs(void* data, int64_t n, T v) {
  T* p = static_cast<T*>(data);
  tfmo::ParallelFor(n, int64_t{1} << 16, [p, v](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) p[i] = v;
  });
}

// Every element of t = v converted to t's type (as MSL's T(v) converts a float).
void Fill(const tfmo::TensorRef& t, float v) {
  const int64_t n = t.num_elements();
  void* d = t.raw();
  switch (t.dtype()) {
    case TF_FLOAT: FillAs<float>(d, n, v); break;
    case TF_HALF: FillAs<uint16_t>(d, n, tfmo::FloatToHalf(v)); break;
    case TF_INT32: FillAs<int32_t>(d, n, static_cast<int32_t>(v)); break;
    case TF_UINT32: FillAs<uint32_t>(d, n, static_cast<uint32_t>(v)); break;
    case TF_INT64: FillAs<int64_t>(d, n, static_cast<int64_t>(v)); break;
    case TF_UINT64: FillAs<uint64_t>(d, n, static_cast<uint64_t>(v)); break;
    case TF_INT16: FillAs<int16_t>(d, n, static_cast<int16_t>(v)); break;
    case TF_UINT16: FillAs<uint16_t>(d, n, static_cast<uint16_t>(v)); break;
    case TF_INT8: FillAs<int8_t>(d, n, static_cast<int8_t>(v)); break;
    case TF_UINT8: FillAs<uint8_t>(d, n, static_cast<uint8_t>(v)); break;
    case TF_BOOL: FillAs<bool>(d, n, v != 0.0f); break;
    default: break;  // the op's type list admits nothing else
  }
}

void Compute(void* state, TF_OpKernelContext* ctx) {
  State& st = *static_cast<State*>(state);
  const Attrs& a = *st.attrs;
  Launch l;
  std::vector<tfmo::TensorRef> in, out;
  if (!tfmo::metal_kernel::Prepare(ctx, a, &l, &in, &out)) return;
  if (a.has_init)
    for (const tfmo::TensorRef& y : out) Fill(y, a.init_value);
  if (l.empty()) return;  // a zero grid dimension: nothing to dispatch
  std::string error;
  const TfmoInlineKernel* k = st.kernel.load(std::memory_order_acquire);
  if (k == nullptr) {
    k = tfmo::inline_kernels::Get(a.source, a.kernel, st.checked, &error);
    if (k == nullptr) {
      tfmo::Fail(ctx, TF_INVALID_ARGUMENT, "metal_kernel %s: %s", a.kernel.c_str(), error.c_str());
      return;
    }
    st.kernel.store(k, std::memory_order_release);
  }
  alignas(16) static unsigned char empty[16] = {};  // stands in for empty tensors (read-only for a correct kernel)
  TfmoInlineLaunch launch{};
  std::vector<std::vector<int32_t>> shapes(a.slots.size());
  for (size_t n = 0; n < a.slots.size(); ++n) {
    const Slot& s = a.slots[n];
    const tfmo::TensorRef* t = s.kind == Slot::Kind::kOutput ? &out[s.index] : s.kind == Slot::Kind::kNone ? nullptr : &in[s.index];
    if (t == nullptr) continue;
    if (s.kind == Slot::Kind::kInput || s.kind == Slot::Kind::kOutput) {
      const size_t bytes = TF_TensorByteSize(t->get());
      launch.slots[n] = bytes > 0 ? t->raw() : empty;
      launch.slot_bytes[n] = bytes;
    } else {
      if (!tfmo::metal_kernel::ShapeValues(ctx, a, *t, s.kind, s.index, &shapes[n])) return;
      launch.slots[n] = shapes[n].data();
      launch.slot_bytes[n] = shapes[n].size() * sizeof(int32_t);
    }
  }
  for (int i = 0; i < 3; ++i) {
    launch.grid[i] = static_cast<uint32_t>(l.grid[i]);
    launch.group[i] = l.group[i];
  }
  if (!tfmo::inline_kernels::Run(k, &launch, &error))
    tfmo::Fail(ctx, TF_INVALID_ARGUMENT, "metal_kernel %s: %s", a.kernel.c_str(), error.c_str());
}

const tfmo::OnLoad kRegister([] { tfmo::metal_kernel::RegisterKernels<State>("CPU", &Compute); });

}  // namespace
