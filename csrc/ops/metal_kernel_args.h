// TfmoMetalKernel's attributes and launch description, parsed and validated once for the CPU and the GPU kernel
// (semantics: csrc/ops/metal_kernel_op.cc). Every check fails the op with InvalidArgument naming the kernel.
#pragma once

#include <dlfcn.h>

#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/op_names.h"
#include "common/tfc.h"

namespace tfmo::metal_kernel {

// The tensor types an inline kernel takes (MSL: float half int uint long ulong short ushort char uchar bool).
constexpr const char* kTypeList = "{float, half, int32, uint32, int64, uint64, int16, uint16, int8, uint8, bool}";
constexpr uint32_t kMaxSlots = 31;            // [[buffer(0..30)]]
constexpr uint64_t kMaxThreadsPerGroup = 1024;  // Metal's limit on Apple GPUs, applied on every device

// What one buffer slot holds.
struct Slot {
  enum class Kind : uint8_t { kNone, kInput, kOutput, kShape, kStrides, kNdim };
  Kind kind = Kind::kNone;
  int index = 0;  // input or output index
};

struct Attrs {
  std::string source, kernel;
  std::vector<TF_DataType> tin, tout;
  std::vector<Slot> slots;            // by buffer index
  std::vector<int64_t> output_ranks;  // by output
  std::vector<int64_t> launch;        // static launch description (dynamic: empty)
  bool dynamic = false;               // NL = 1
  bool has_init = false;
  float init_value = 0;
};

struct Launch {
  uint64_t grid[3] = {0, 0, 0};
  uint32_t group[3] = {1, 1, 1};
  std::vector<std::vector<int64_t>> output_shapes;
  bool empty() const { return grid[0] == 0 || grid[1] == 0 || grid[2] == 0; }
};

inline bool ReadList(TF_OpKernelConstruction* c, const char* name, std::vector<int64_t>* out) {
  Status s;
  int32_t n = 0, total = 0;
  TF_OpKernelConstruction_GetAttrSize(c, name, &n, &total, s);
  if (s.ok()) {
    out->assign(static_cast<size_t>(n), 0);
    TF_OpKernelConstruction_GetAttrInt64List(c, name, out->data(), n, s);
  }
  if (!s.ok()) TF_OpKernelConstruction_Failure(c, s);
  return s.ok();
}

inline bool ReadTypes(TF_OpKernelConstruction* c, const char* name, std::vector<TF_DataType>* out) {
  Status s;
  int32_t n = 0, total = 0;
  TF_OpKernelConstruction_GetAttrSize(c, name, &n, &total, s);
  if (s.ok()) {
    out->assign(static_cast<size_t>(n), TF_FLOAT);
    TF_OpKernelConstruction_GetAttrTypeList(c, name, out->data(), n, s);
  }
  if (!s.ok()) TF_OpKernelConstruction_Failure(c, s);
  return s.ok();
}

inline bool ReadStrings(TF_OpKernelConstruction* c, const char* name, std::vector<std::string>* out) {
  Status s;
  int32_t n = 0, total = 0;
  TF_OpKernelConstruction_GetAttrSize(c, name, &n, &total, s);
  if (s.ok()) {
    std::vector<char*> values(static_cast<size_t>(n));
    std::vector<size_t> lengths(static_cast<size_t>(n));
    std::string storage(static_cast<size_t>(total) + 1, '\0');
    TF_OpKernelConstruction_GetAttrStringList(c, name, values.data(), lengths.data(), n, storage.data(),
                                              storage.size(), s);
    if (s.ok())
      for (int32_t i = 0; i < n; ++i) out->emplace_back(values[i], lengths[i]);
  }
  if (!s.ok()) TF_OpKernelConstruction_Failure(c, s);
  return s.ok();
}

// Parses "in:3" etc.; false for anything else.
inline bool ParseSlot(const std::string& text, Slot* slot) {
  static const struct { const char* prefix; Slot::Kind kind; } kKinds[] = {
      {"in:", Slot::Kind::kInput}, {"out:", Slot::Kind::kOutput}, {"shape:", Slot::Kind::kShape},
      {"strides:", Slot::Kind::kStrides}, {"ndim:", Slot::Kind::kNdim}};
  for (const auto& k : kKinds) {
    const std::string p = k.prefix;
    if (text.compare(0, p.size(), p) != 0 || text.size() == p.size() || text.size() > p.size() + 4) continue;
    int v = 0;
    for (size_t i = p.size(); i < text.size(); ++i) {
      if (text[i] < '0' || text[i] > '9') return false;
      v = v * 10 + (text[i] - '0');
    }
    *slot = {k.kind, v};
    return true;
  }
  return text.empty();  // "": nothing bound at this slot
}

// The attributes as the graph (or a registered eager call) gives them, before any check.
struct Fields {
  std::string source, kernel;
  std::vector<TF_DataType> tin, tout;
  std::vector<std::string> bindings;
  std::vector<int64_t> output_ranks, launch;
  int64_t n_launch = 0;
  std::vector<float> init_value;  // empty, or the one value
};

// Sets `status` to InvalidArgument with a printf-style message; returns null (Build's failure).
inline std::nullptr_t Invalid(TF_Status* status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
inline std::nullptr_t Invalid(TF_Status* status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  SetStatusV(status, TF_INVALID_ARGUMENT, fmt, ap);
  va_end(ap);
  return nullptr;
}

// Checks `f` and parses it; null after setting `status` (InvalidArgument naming the kernel).
inline std::unique_ptr<Attrs> Build(Fields f, TF_Status* status) {
  auto a = std::make_unique<Attrs>();
  a->source = std::move(f.source);
  a->kernel = std::move(f.kernel);
  a->tin = std::move(f.tin);
  a->tout = std::move(f.tout);
  a->output_ranks = std::move(f.output_ranks);
  a->launch = std::move(f.launch);
  const char* k = a->kernel.c_str();
  if (f.init_value.size() > 1)
    return Invalid(status, "metal_kernel %s: init_value has %zu values (0 or 1)", k, f.init_value.size());
  a->has_init = f.init_value.size() == 1;
  a->init_value = a->has_init ? f.init_value[0] : 0.0f;
  if (a->kernel.empty() || a->source.empty()) return Invalid(status, "metal_kernel: empty kernel name or source");
  if (a->tout.empty()) return Invalid(status, "metal_kernel %s: no outputs", k);
  const std::vector<std::string>& bindings = f.bindings;
  if (bindings.size() > kMaxSlots)
    return Invalid(status, "metal_kernel %s: %zu buffers, more than Metal's %u ([[buffer(0..30)]])", k, bindings.size(),
                kMaxSlots);
  std::vector<int> out_bound(a->tout.size(), 0), in_bound(a->tin.size(), 0);
  for (size_t n = 0; n < bindings.size(); ++n) {
    Slot s;
    if (!ParseSlot(bindings[n], &s))
      return Invalid(status, "metal_kernel %s: binding %zu '%s' is not in:i, out:j, shape:i, strides:i or ndim:i", k, n,
                  bindings[n].c_str());
    const size_t limit = s.kind == Slot::Kind::kOutput ? a->tout.size() : a->tin.size();
    if (s.kind != Slot::Kind::kNone && static_cast<size_t>(s.index) >= limit)
      return Invalid(status, "metal_kernel %s: binding %zu '%s' names a %s that does not exist (%zu of them)", k, n,
                  bindings[n].c_str(), s.kind == Slot::Kind::kOutput ? "output" : "input", limit);
    if (s.kind == Slot::Kind::kOutput) ++out_bound[s.index];
    if (s.kind == Slot::Kind::kInput) ++in_bound[s.index];
    a->slots.push_back(s);
  }
  for (size_t j = 0; j < out_bound.size(); ++j)
    if (out_bound[j] != 1)
      return Invalid(status, "metal_kernel %s: output %zu is bound %d times (exactly once)", k, j, out_bound[j]);
  for (size_t i = 0; i < in_bound.size(); ++i)
    if (in_bound[i] > 1) return Invalid(status, "metal_kernel %s: input %zu is bound %d times (at most once)", k, i, in_bound[i]);
  if (a->output_ranks.size() != a->tout.size())
    return Invalid(status, "metal_kernel %s: %zu output ranks for %zu outputs", k, a->output_ranks.size(), a->tout.size());
  size_t expected = 6;
  for (int64_t r : a->output_ranks) {
    if (r < 0 || r > 8) return Invalid(status, "metal_kernel %s: output rank %" PRId64 " is not in 0..8", k, r);
    expected += static_cast<size_t>(r);
  }
  if (f.n_launch < 0 || f.n_launch > 1) return Invalid(status, "metal_kernel %s: NL = %" PRId64 " (0 or 1)", k, f.n_launch);
  a->dynamic = f.n_launch == 1;
  if (!a->dynamic && a->launch.size() != expected)
    return Invalid(status, "metal_kernel %s: the launch attr has %zu values, expected %zu (grid, threadgroup, output dims)", k,
                a->launch.size(), expected);
  return a;
}

// Reads and checks the attributes (kernel construction of TfmoMetalKernel); null after failing c.
inline std::unique_ptr<Attrs> ReadAttrs(TF_OpKernelConstruction* c) {
  Fields f;
  if (!GetAttr(c, "source", &f.source) || !GetAttr(c, "kernel", &f.kernel) || !ReadTypes(c, "Tin", &f.tin) ||
      !ReadTypes(c, "Tout", &f.tout) || !ReadStrings(c, "bindings", &f.bindings) ||
      !ReadList(c, "output_ranks", &f.output_ranks) || !ReadList(c, "launch", &f.launch) ||
      !GetAttr(c, "NL", &f.n_launch))
    return nullptr;
  Status s;
  int32_t n = 0, total = 0;
  TF_OpKernelConstruction_GetAttrSize(c, "init_value", &n, &total, s);
  if (s.ok() && n > 0) {
    f.init_value.assign(static_cast<size_t>(n), 0.0f);
    TF_OpKernelConstruction_GetAttrFloatList(c, "init_value", f.init_value.data(), n, s);
  }
  std::unique_ptr<Attrs> a = s.ok() ? Build(std::move(f), s) : nullptr;
  if (!a) TF_OpKernelConstruction_Failure(c, s);
  return a;
}

// The registered eager call that TfmoMetalKernelCall's `call` attr names, checked against its Tin / Tout; null after
// failing c. The calls live in the op library (csrc/ops/metal_kernel_op.cc); a kernel library built apart from it
// (the emulated GPU's) finds them through its extern "C" tfmo_metal_kernel_find_call, looked up in the process.
inline std::shared_ptr<const Attrs> ReadCall(TF_OpKernelConstruction* c) {
  int64_t id = 0;
  std::vector<TF_DataType> tin, tout;
  if (!GetAttr(c, "call", &id) || !ReadTypes(c, "Tin", &tin) || !ReadTypes(c, "Tout", &tout)) return nullptr;
  using Find = const void* (*)(int64_t);
  const auto find = reinterpret_cast<Find>(dlsym(RTLD_DEFAULT, "tfmo_metal_kernel_find_call"));
  const Attrs* a = find != nullptr ? static_cast<const Attrs*>(find(id)) : nullptr;
  if (a == nullptr) {
    ConstructionFail(c, TF_INVALID_ARGUMENT, "metal_kernel: call %" PRId64 " is not registered in this process "
                     "(TfmoMetalKernelCall runs eager calls of tf_metal_ops.metal_kernel; graphs hold TfmoMetalKernel)",
                     id);
    return nullptr;
  }
  if (tin != a->tin || tout != a->tout) {
    ConstructionFail(c, TF_INVALID_ARGUMENT, "metal_kernel %s: call %" PRId64 " was registered with %zu inputs and "
                     "%zu outputs of other dtypes than Tin / Tout", a->kernel.c_str(), id, a->tin.size(),
                     a->tout.size());
    return nullptr;
  }
  return std::shared_ptr<const Attrs>(a, [](const Attrs*) {});  // registered calls live for the process
}

// The launch description of this call (from the attr, or the launch_values input), checked; false after failing ctx.
// `group_limit`: the device's threads per threadgroup.
inline bool ReadLaunch(TF_OpKernelContext* ctx, const Attrs& a, Launch* out) {
  const char* k = a.kernel.c_str();
  std::vector<int64_t> values = a.launch;
  if (a.dynamic) {
    TensorRef t;
    if (!GetInput(ctx, static_cast<int>(a.tin.size()), &t)) return false;
    if (t.rank() != 1)
      return Fail(ctx, TF_INVALID_ARGUMENT, "metal_kernel %s: launch_values must be 1-D, got %s", k,
                  ShapeString(t).c_str());
    const int64_t* v = t.data<int64_t>();
    values.assign(v, v + t.num_elements());
    size_t expected = 6;
    for (int64_t r : a.output_ranks) expected += static_cast<size_t>(r);
    if (values.size() != expected)
      return Fail(ctx, TF_INVALID_ARGUMENT, "metal_kernel %s: launch_values has %zu values, expected %zu (grid 3, "
                  "threadgroup 3, output dims)", k, values.size(), expected);
  }
  for (int i = 0; i < 3; ++i) {
    if (values[i] < 0 || static_cast<uint64_t>(values[i]) > UINT32_MAX)
      return Fail(ctx, TF_INVALID_ARGUMENT, "metal_kernel %s: grid = (%" PRId64 ", %" PRId64 ", %" PRId64 "): each "
                  "dimension must be in 0 .. 4294967295 (Metal grids are 32-bit per dimension)", k, values[0],
                  values[1], values[2]);
    out->grid[i] = static_cast<uint64_t>(values[i]);
  }
  double threads = 1;  // exact up to 2^53, enough to tell "over the limit"
  for (int i = 0; i < 3; ++i) {
    if (values[3 + i] < 1)
      return Fail(ctx, TF_INVALID_ARGUMENT, "metal_kernel %s: threadgroup = (%" PRId64 ", %" PRId64 ", %" PRId64
                  "): each dimension must be >= 1", k, values[3], values[4], values[5]);
    threads *= static_cast<double>(values[3 + i]);
  }
  if (threads > static_cast<double>(kMaxThreadsPerGroup))
    return Fail(ctx, TF_INVALID_ARGUMENT, "metal_kernel %s: threadgroup = (%" PRId64 ", %" PRId64 ", %" PRId64
                ") is %.0f threads, over the limit of %" PRIu64 " threads per threadgroup", k, values[3], values[4],
                values[5], threads, kMaxThreadsPerGroup);
  for (int i = 0; i < 3; ++i) out->group[i] = static_cast<uint32_t>(values[3 + i]);
  size_t at = 6;
  out->output_shapes.assign(a.tout.size(), {});
  for (size_t j = 0; j < a.tout.size(); ++j) {
    int64_t elements = 1;
    for (int64_t d = 0; d < a.output_ranks[j]; ++d, ++at) {
      const int64_t v = values[at];
      if (v < 0 || (v > 0 && elements > (int64_t{1} << 48) / v))
        return Fail(ctx, TF_INVALID_ARGUMENT, "metal_kernel %s: output %zu: dimension %" PRId64 " is %" PRId64
                    " (must be >= 0, and the output at most 2^48 elements)", k, j, d, v);
      elements *= v;
      out->output_shapes[j].push_back(v);
    }
  }
  return true;
}

// The per-device kernels' state: the attributes, parsed once when TF creates the kernel (TfmoMetalKernel: from its
// attrs; TfmoMetalKernelCall: the registered call's), and what each device adds (State::Init). CreateState /
// CreateCallState / DeleteState are the kernels' create/destroy functions.
template <class State>
void* StateWith(std::shared_ptr<const Attrs> a) {
  auto* s = new State;
  s->attrs = std::move(a);
  s->Init();
  return s;
}
template <class State>
void* CreateState(TF_OpKernelConstruction* c) {
  std::unique_ptr<Attrs> a = ReadAttrs(c);
  return a ? StateWith<State>(std::move(a)) : nullptr;
}
template <class State>
void* CreateCallState(TF_OpKernelConstruction* c) {
  std::shared_ptr<const Attrs> a = ReadCall(c);
  return a ? StateWith<State>(std::move(a)) : nullptr;
}
template <class State>
void DeleteState(void* s) {
  delete static_cast<State*>(s);
}

// This call's launch description, inputs and outputs (allocated with their shapes). False after failing ctx.
inline bool Prepare(TF_OpKernelContext* ctx, const Attrs& a, Launch* l, std::vector<TensorRef>* in,
                    std::vector<TensorRef>* out) {
  if (!ReadLaunch(ctx, a, l)) return false;
  in->resize(a.tin.size());
  out->resize(a.tout.size());
  for (size_t i = 0; i < in->size(); ++i)
    if (!GetInput(ctx, static_cast<int>(i), &(*in)[i])) return false;
  for (size_t j = 0; j < out->size(); ++j)
    if (!AllocateOutput(ctx, static_cast<int>(j), a.tout[j], l->output_shapes[j], &(*out)[j])) return false;
  return true;
}

// Input i's dims / row-major element strides / rank as the int32 values bound for shape:i, strides:i, ndim:i
// (at least one value: a 0-d input binds a single 0). False after failing ctx (a dim over int32).
inline bool ShapeValues(TF_OpKernelContext* ctx, const Attrs& a, const TensorRef& t, Slot::Kind kind, int input,
                        std::vector<int32_t>* out) {
  const int rank = t.rank();
  out->clear();
  if (kind == Slot::Kind::kNdim) {
    out->push_back(rank);
    return true;
  }
  std::vector<int64_t> v(static_cast<size_t>(rank));
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    v[d] = kind == Slot::Kind::kShape ? t.dim(d) : stride;
    stride *= t.dim(d);
  }
  for (int64_t x : v) {
    if (x > INT32_MAX)
      return Fail(ctx, TF_INVALID_ARGUMENT, "metal_kernel %s: input %d: a %s value of %" PRId64 " does not fit the "
                  "int32 the kernel receives", a.kernel.c_str(), input, kind == Slot::Kind::kShape ? "dimension" : "stride", x);
    out->push_back(static_cast<int32_t>(x));
  }
  if (out->empty()) out->push_back(0);
  return true;
}

// Registers the kernels of TfmoMetalKernel and TfmoMetalKernelCall on `device` ("CPU" or "GPU", where
// launch_values stays in host memory), with kernel state State (CreateState / CreateCallState / DeleteState).
template <class State>
void RegisterKernels(const char* device, void (*compute)(void*, TF_OpKernelContext*)) {
  KernelSpec spec = KernelSpecFor(device);
  spec.op = TFMO_OP_METAL_KERNEL;
  spec.create = &CreateState<State>;
  spec.compute = compute;
  spec.destroy = &DeleteState<State>;
  if (std::strcmp(device, "GPU") == 0) spec.host_memory = {"launch_values"};
  RegisterKernel(spec);
  KernelSpec call = KernelSpecFor(device);
  call.op = TFMO_OP_METAL_KERNEL_CALL;
  call.create = &CreateCallState<State>;
  call.compute = compute;
  call.destroy = &DeleteState<State>;
  RegisterKernel(call);
}

}  // namespace tfmo::metal_kernel
