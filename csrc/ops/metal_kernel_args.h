// TfmoMetalKernel's attributes and launch description, parsed and validated once for the CPU and the GPU kernel
// (semantics: csrc/ops/metal_kernel_op.cc). Every check fails the op with InvalidArgument naming the kernel.
#pragma once

#include <cinttypes>
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

// Reads and checks the attributes (kernel construction); null after failing c.
inline std::unique_ptr<Attrs> ReadAttrs(TF_OpKernelConstruction* c) {
  auto a = std::make_unique<Attrs>();
  std::vector<std::string> bindings;
  std::vector<int64_t> nl;
  int64_t n_launch = 0;
  std::vector<float> init(2, 0.0f);
  if (!GetAttr(c, "source", &a->source) || !GetAttr(c, "kernel", &a->kernel) || !ReadTypes(c, "Tin", &a->tin) ||
      !ReadTypes(c, "Tout", &a->tout) || !ReadStrings(c, "bindings", &bindings) ||
      !ReadList(c, "output_ranks", &a->output_ranks) || !ReadList(c, "launch", &a->launch) ||
      !GetAttr(c, "NL", &n_launch))
    return nullptr;
  {
    Status s;
    int32_t n = 0, total = 0;
    TF_OpKernelConstruction_GetAttrSize(c, "init_value", &n, &total, s);
    if (s.ok() && n > 1) {
      ConstructionFail(c, TF_INVALID_ARGUMENT, "metal_kernel %s: init_value has %d values (0 or 1)", a->kernel.c_str(), n);
      return nullptr;
    }
    if (s.ok() && n == 1) TF_OpKernelConstruction_GetAttrFloatList(c, "init_value", init.data(), 1, s);
    if (!s.ok()) {
      TF_OpKernelConstruction_Failure(c, s);
      return nullptr;
    }
    a->has_init = n == 1;
    a->init_value = init[0];
  }
  const char* k = a->kernel.c_str();
  if (a->kernel.empty() || a->source.empty()) {
    ConstructionFail(c, TF_INVALID_ARGUMENT, "metal_kernel: empty kernel name or source");
    return nullptr;
  }
  if (bindings.size() > kMaxSlots) {
    ConstructionFail(c, TF_INVALID_ARGUMENT, "metal_kernel %s: %zu buffers, more than Metal's %u ([[buffer(0..30)]])", k,
                     bindings.size(), kMaxSlots);
    return nullptr;
  }
  std::vector<int> out_bound(a->tout.size(), 0), in_bound(a->tin.size(), 0);
  for (size_t n = 0; n < bindings.size(); ++n) {
    Slot s;
    if (!ParseSlot(bindings[n], &s)) {
      ConstructionFail(c, TF_INVALID_ARGUMENT, "metal_kernel %s: binding %zu '%s' is not in:i, out:j, shape:i, strides:i "
                       "or ndim:i", k, n, bindings[n].c_str());
      return nullptr;
    }
    const size_t limit = s.kind == Slot::Kind::kOutput ? a->tout.size() : a->tin.size();
    if (s.kind != Slot::Kind::kNone && static_cast<size_t>(s.index) >= limit) {
      ConstructionFail(c, TF_INVALID_ARGUMENT, "metal_kernel %s: binding %zu '%s' names a %s that does not exist "
                       "(%zu of them)", k, n, bindings[n].c_str(), s.kind == Slot::Kind::kOutput ? "output" : "input",
                       limit);
      return nullptr;
    }
    if (s.kind == Slot::Kind::kOutput) ++out_bound[s.index];
    if (s.kind == Slot::Kind::kInput) ++in_bound[s.index];
    a->slots.push_back(s);
  }
  for (size_t j = 0; j < out_bound.size(); ++j)
    if (out_bound[j] != 1) {
      ConstructionFail(c, TF_INVALID_ARGUMENT, "metal_kernel %s: output %zu is bound %d times (exactly once)", k, j,
                       out_bound[j]);
      return nullptr;
    }
  for (size_t i = 0; i < in_bound.size(); ++i)
    if (in_bound[i] > 1) {
      ConstructionFail(c, TF_INVALID_ARGUMENT, "metal_kernel %s: input %zu is bound %d times (at most once)", k, i,
                       in_bound[i]);
      return nullptr;
    }
  if (a->output_ranks.size() != a->tout.size()) {
    ConstructionFail(c, TF_INVALID_ARGUMENT, "metal_kernel %s: %zu output ranks for %zu outputs", k,
                     a->output_ranks.size(), a->tout.size());
    return nullptr;
  }
  size_t expected = 6;
  for (int64_t r : a->output_ranks) {
    if (r < 0 || r > 8) {
      ConstructionFail(c, TF_INVALID_ARGUMENT, "metal_kernel %s: output rank %" PRId64 " is not in 0..8", k, r);
      return nullptr;
    }
    expected += static_cast<size_t>(r);
  }
  a->dynamic = n_launch == 1;
  if (n_launch > 1) {
    ConstructionFail(c, TF_INVALID_ARGUMENT, "metal_kernel %s: NL = %" PRId64 " (0 or 1)", k, n_launch);
    return nullptr;
  }
  if (!a->dynamic && a->launch.size() != expected) {
    ConstructionFail(c, TF_INVALID_ARGUMENT, "metal_kernel %s: the launch attr has %zu values, expected %zu (grid, "
                     "threadgroup, output dims)", k, a->launch.size(), expected);
    return nullptr;
  }
  return a;
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

// The per-device kernels' state: the attributes, parsed once when TF creates the kernel, and what each device adds
// (State::Init). CreateState/DeleteState are the kernel's create/destroy functions.
template <class State>
void* CreateState(TF_OpKernelConstruction* c) {
  std::unique_ptr<Attrs> a = ReadAttrs(c);
  if (!a) return nullptr;
  auto* s = new State;
  s->attrs = std::move(a);
  s->Init();
  return s;
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

// Registers TfmoMetalKernel's kernel on `device` ("CPU" or "GPU", where launch_values stays in host memory), with
// kernel state State (CreateState / DeleteState).
template <class State>
void RegisterKernels(const char* device, void (*compute)(void*, TF_OpKernelContext*)) {
  KernelSpec spec = KernelSpecFor(device);
  spec.op = TFMO_OP_METAL_KERNEL;
  spec.create = &CreateState<State>;
  spec.compute = compute;
  spec.destroy = &DeleteState<State>;
  if (std::strcmp(device, "GPU") == 0) spec.host_memory = {"launch_values"};
  RegisterKernel(spec);
}

}  // namespace tfmo::metal_kernel
