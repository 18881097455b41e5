// Backend-neutral GPU host layer (contract in gpu_host.h).
#include "gpu/gpu_host.h"

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace tfmo::gpu {

// ---- Specialization -----------------------------------------------------------------------------------------
Specialization& Specialization::Set(uint32_t index, Type type, uint32_t bits) {
  auto it = std::lower_bound(constants_.begin(), constants_.end(), index,
                             [](const Constant& c, uint32_t i) { return c.index < i; });
  if (it != constants_.end() && it->index == index) {
    *it = {index, type, bits};
  } else {
    constants_.insert(it, {index, type, bits});
  }
  return *this;
}
Specialization& Specialization::Int(uint32_t index, int32_t v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return Set(index, Type::kInt, bits);
}
Specialization& Specialization::UInt(uint32_t index, uint32_t v) { return Set(index, Type::kUInt, v); }
Specialization& Specialization::Bool(uint32_t index, bool v) { return Set(index, Type::kBool, v ? 1u : 0u); }
Specialization& Specialization::Float(uint32_t index, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return Set(index, Type::kFloat, bits);
}

std::string Specialization::Key() const {
  static const char kTag[] = {'i', 'u', 'b', 'f'};
  std::string key;
  char buf[48];
  for (const Constant& c : constants_) {
    std::snprintf(buf, sizeof buf, "%s%u:%c=%08x", key.empty() ? "" : ";", c.index,
                  kTag[static_cast<int>(c.type)], c.bits);
    key += buf;
  }
  return key;
}

// ---- Pass -----------------------------------------------------------------------------------------------------
bool Pass::CheckSlot(uint32_t slot, const char* what) {
  if (slot < kMaxBufferSlots) return true;
  call_->fail(TF_INTERNAL, "%s: %s slot %u is out of range (0..%u)", function_.c_str(), what, slot,
              kMaxBufferSlots - 1);
  return false;
}

Pass& Pass::buffer(uint32_t slot, const TensorRef& t) {
  if (!CheckSlot(slot, "buffer")) return *this;
  if (!t) {
    call_->fail(TF_INTERNAL, "%s: buffer %u: null tensor", function_.c_str(), slot);
    return *this;
  }
  const size_t size = TF_TensorByteSize(t.get());
  if (size == 0) {
    call_->fail(TF_INTERNAL, "%s: buffer %u: an empty tensor has no GPU buffer; skip the pass for empty work",
                function_.c_str(), slot);
    return *this;
  }
  Binding& b = buffers_[slot];
  b = Binding{};
  b.kind = Binding::Kind::kTensor;
  b.tensor = t.get();
  b.dtype = t.dtype();
  b.size = size;
  return *this;
}

Pass& Pass::bytes(uint32_t slot, const void* data, size_t length) {
  if (!CheckSlot(slot, "bytes")) return *this;
  if (data == nullptr || length == 0 || length > kMaxBytes) {
    call_->fail(TF_INTERNAL, "%s: bytes %u: %zu bytes (setBytes takes 1 to %zu; use a buffer for more)",
                function_.c_str(), slot, length, kMaxBytes);
    return *this;
  }
  Binding& b = buffers_[slot];
  b = Binding{};
  b.kind = Binding::Kind::kBytes;
  b.size = length;
  b.data.assign(static_cast<const unsigned char*>(data), static_cast<const unsigned char*>(data) + length);
  return *this;
}

Pass& Pass::threadgroup_memory(uint32_t slot, size_t length) {
  if (!CheckSlot(slot, "threadgroup memory")) return *this;
  if (length == 0) {
    call_->fail(TF_INTERNAL, "%s: threadgroup memory %u: length 0", function_.c_str(), slot);
    return *this;
  }
  tg_lengths_[slot] = (length + 15) / 16 * 16;  // Metal wants multiples of 16
  return *this;
}

Pass& Pass::threads(uint64_t n, uint32_t group) { return threads({n, 1, 1}, {group, 1, 1}); }

Pass& Pass::threads(std::array<uint64_t, 3> grid, std::array<uint32_t, 3> group) {
  for (uint64_t d : grid) {
    if (d > UINT32_MAX) {
      call_->fail(TF_INVALID_ARGUMENT,
                  "%s: a grid of %" PRIu64 " x %" PRIu64 " x %" PRIu64 " threads exceeds the 32-bit limit per dimension",
                  function_.c_str(), grid[0], grid[1], grid[2]);
      return *this;
    }
  }
  grid_kind_ = Grid::kThreads;
  grid_ = grid;
  group_ = group;
  return *this;
}

Pass& Pass::threadgroups(std::array<uint64_t, 3> groups, std::array<uint32_t, 3> group) {
  for (int i = 0; i < 3; ++i) {
    if (group[i] == 0) {
      call_->fail(TF_INTERNAL, "%s: threadgroups: a threadgroup dimension is 0", function_.c_str());
      return *this;
    }
    if (groups[i] > UINT32_MAX / group[i]) {
      call_->fail(TF_INVALID_ARGUMENT, "%s: %" PRIu64 " threadgroups of %u threads exceed the 32-bit grid limit",
                  function_.c_str(), groups[i], group[i]);
      return *this;
    }
  }
  grid_kind_ = Grid::kThreadgroups;
  grid_ = groups;
  group_ = group;
  return *this;
}

bool Pass::empty() const { return grid_[0] == 0 || grid_[1] == 0 || grid_[2] == 0; }

// ---- Call -----------------------------------------------------------------------------------------------------
void Call::fail(TF_Code code, const char* fmt, ...) {
  if (code_ != TF_OK) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  code_ = code;
  error_ = buf;
}

const TensorRef* Call::scratch(TF_DataType dtype, int64_t elements) {
  if (!ok()) return nullptr;
  Status s;
  TF_AllocatorAttributes attrs{TF_ALLOCATOR_ATTRIBUTES_STRUCT_SIZE, 0};  // device memory
  const int64_t dims[1] = {elements};
  auto t = std::make_unique<TensorRef>();
  *t->out() = TF_AllocateTemp(ctx_, dtype, dims, 1, &attrs, s);
  if (!s.ok()) {
    fail(s.code(), "%s: allocating a scratch buffer of %lld %s values failed: %s", op_,
         static_cast<long long>(elements), DataTypeName(dtype), s.message());
    return nullptr;
  }
  scratch_.push_back(std::move(t));
  return scratch_.back().get();
}

Pass& Call::pass(const char* function, Specialization spec, const KernelSource* source) {
  passes_.push_back(std::unique_ptr<Pass>(new Pass(this, function, std::move(spec), source)));
  return *passes_.back();
}

std::vector<TF_Tensor*> Call::TakeScratch() {
  std::vector<TF_Tensor*> out;
  for (auto& t : scratch_) out.push_back(t->release());
  scratch_.clear();
  return out;
}

bool Call::CheckPasses() {
  for (const auto& p : passes_) {
    if (!ok()) break;
    if (p->grid_kind() == Pass::Grid::kNone) fail(TF_INTERNAL, "%s: %s: the pass has no grid", op_, p->function().c_str());
  }
  if (!ok()) return Fail(ctx_, code_, "%s", error_.c_str());
  return true;
}

bool Call::Run() { return CheckPasses() && Execute(*this); }

bool Call::RunAndRead(const TensorRef& t, size_t offset, void* out, size_t bytes) {
  if (!t || out == nullptr) {
    fail(TF_INTERNAL, "%s: RunAndRead: null tensor or destination", op_);
  } else {
    const size_t size = TF_TensorByteSize(t.get());
    if (bytes == 0 || bytes > kMaxReadBytes || offset > size || bytes > size - offset)
      fail(TF_INTERNAL, "%s: RunAndRead: %zu bytes at offset %zu of a %zu-byte tensor (1 to %zu bytes inside it)", op_,
           bytes, offset, size, kMaxReadBytes);
    else if (offset % kReadAlignment != 0 || bytes % kReadAlignment != 0)  // macOS blits: multiples of 4 bytes
      fail(TF_INTERNAL, "%s: RunAndRead: offset %zu and size %zu must be multiples of %zu bytes", op_, offset, bytes,
           kReadAlignment);
  }
  if (!CheckPasses()) return false;
  HostRead read;
  read.tensor = t.get();
  read.offset = offset;
  read.bytes = bytes;
  read.out = out;
  const bool done = ExecuteAndRead(*this, read);
  passes_.clear();
  return done;
}

std::array<uint32_t, 3> ResolveGroup(const std::array<uint64_t, 3>& grid, std::array<uint32_t, 3> group,
                                     uint32_t max_threads, uint32_t width) {
  const uint64_t max = std::max<uint32_t>(1, max_threads), w = std::max<uint32_t>(1, width);
  std::array<uint64_t, 3> g = {group[0], group[1], group[2]};
  if (g[0] == 0) g[0] = grid[1] == 1 && grid[2] == 1 ? std::max(w, std::min<uint64_t>(256, max) / w * w) : w;
  if (g[1] == 0) g[1] = std::max<uint64_t>(1, max / g[0]);
  if (g[2] == 0) g[2] = 1;
  for (int i = 0; i < 3; ++i) g[i] = std::max<uint64_t>(1, std::min(g[i], grid[i]));
  for (int i = 2; i >= 0 && g[0] * g[1] * g[2] > max; --i) g[i] = std::max<uint64_t>(1, max / (g[0] * g[1] * g[2] / g[i]));
  return {static_cast<uint32_t>(g[0]), static_cast<uint32_t>(g[1]), static_cast<uint32_t>(g[2])};
}

bool CheckGridSize(TF_OpKernelContext* ctx, const char* op, const char* what, uint64_t n) {
  if (n <= UINT32_MAX) return true;
  return Fail(ctx, TF_INVALID_ARGUMENT,
              "%s: %s = %" PRIu64 " exceeds 4294967295, the limit of the Metal kernels (32-bit grid and indices); "
              "split the input",
              op, what, n);
}

}  // namespace tfmo::gpu
