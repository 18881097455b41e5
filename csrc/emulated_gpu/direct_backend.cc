// Emulated GPU backend: executes tfmo::gpu::Call passes on the Metal-emulating TF device (se_plugin.cc),
// running the unchanged metal_kernels/*.metal through csrc/msl_emu (kernel_launch.h). The counterpart of
// csrc/metal/backend.mm, step for step:
//   TF_GetStream -> the device's stream protocol (emu_stream.h), checked by its magic before use;
//   binding contract checked for every pass on the op's thread (an error fails the op, nothing is enqueued);
//   inside queue_sync: the stream's current command buffer gets one work item holding all passes (one encoder),
//   then one commit (commit_and_wait under TF_METAL_OPS_SYNC=1);
//   on the stream's thread: device addresses are mapped to host memory and the kernels run; scratch tensors are
//   released after the work ran (never earlier).
// A pass with its own source (inline kernels) runs the library compiled from that source
// (csrc/common/inline_library.h), bounds-checked unless TF_METAL_OPS_BOUNDS_CHECK=0, after the same binding-contract
// check against the kernel's signature; a bounds-checked call is waited for, so an out-of-bounds access fails it.
// Every kernel that ran is counted (tfmo_emu_dispatch_counts), so tests can tell the GPU path ran.
// Atomic counting (tfmo_emu_atomic_counting, tfmo_emu_atomic_counts; tf_metal_ops.emulated_gpu.count_atomics): off
// unless switched on; while on, every kernel launched by name records its atomic operations per buffer parameter
// (kernel_launch.h LaunchAtomics), in the order the launches ran; a pass with its own source (inline kernels) is
// recorded as not counted.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/inline_library.h"
#include "common/tfc.h"
#include "emulated_gpu/emu_stream.h"
#include "emulated_gpu/kernel_launch.h"
#include "gpu/gpu_host.h"

namespace tfmo::gpu {
namespace {

std::mutex g_counts_mu;
auto* g_counts = new std::map<std::string, uint64_t>();  // kernel -> dispatches run; never freed (process-long)

void Count(const char* kernel) {
  std::lock_guard<std::mutex> lock(g_counts_mu);
  ++(*g_counts)[kernel];
}

// ---- atomic counting -------------------------------------------------------------------------------------------
std::mutex g_atomics_mu;
bool g_atomics_on = false;                                            // guarded by g_atomics_mu
auto* g_atomic_splits = new std::map<std::string, std::vector<uint64_t>>();  // parameter -> byte offsets
auto* g_atomic_records = new std::vector<std::string>();              // one JSON object per launch

// The splits to count with, or false when counting is off.
bool AtomicCountingOn(std::map<std::string, std::vector<uint64_t>>* splits) {
  std::lock_guard<std::mutex> lock(g_atomics_mu);
  if (g_atomics_on) *splits = *g_atomic_splits;
  return g_atomics_on;
}

std::string JsonCount(const emu::AtomicCount& c) {
  char buf[192];
  std::snprintf(buf, sizeof buf,
                "{\"rmw\": %" PRIu64 ", \"cas\": %" PRIu64 ", \"cas_failed\": %" PRIu64 ", \"load\": %" PRIu64
                ", \"store\": %" PRIu64 "}",
                c.rmw, c.cas, c.cas_failed, c.load, c.store);
  return buf;
}

// Kernel and parameter names are C identifiers and op names plain text without quotes: no escaping needed beyond
// dropping what JSON forbids.
std::string JsonText(const std::string& s) {
  std::string o;
  for (char c : s) o += (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20) ? '?' : c;
  return "\"" + o + "\"";
}

void RecordAtomics(const std::string& op, const emu::LaunchDesc& d, const emu::LaunchAtomics* a) {
  std::string r = "{\"op\": " + JsonText(op) + ", \"kernel\": " + JsonText(d.kernel) +
                  ", \"counted\": " + (a != nullptr ? "true" : "false");
  char buf[160];
  std::snprintf(buf, sizeof buf, ", \"grid\": [%" PRIu64 ", %" PRIu64 ", %" PRIu64 "], \"group\": [%u, %u, %u]",
                d.grid[0], d.grid[1], d.grid[2], d.group[0], d.group[1], d.group[2]);
  r += buf;
  r += std::string(", \"grid_is_threadgroups\": ") + (d.threadgroups ? "true" : "false");
  if (a != nullptr) {
    r += ", \"threadgroup\": " + JsonCount(a->threadgroup) + ", \"buffers\": [";
    for (size_t i = 0; i < a->buffers.size(); ++i) {
      const emu::LaunchAtomics::Buffer& b = a->buffers[i];
      r += (i ? ", " : "") + std::string("{\"slot\": ") + std::to_string(b.slot) + ", \"param\": " + JsonText(b.param) +
           ", \"bytes\": " + std::to_string(b.bytes) + ", \"total\": " + JsonCount(b.total) + ", \"parts\": [";
      for (size_t k = 0; k < b.parts.size(); ++k) {
        std::string part = JsonCount(b.parts[k]);
        part.insert(1, "\"begin\": " + std::to_string(b.part_begin[k]) + ", ");
        r += (k ? ", " : "") + part;
      }
      r += "]}";
    }
    r += "]";
  }
  r += "}";
  std::lock_guard<std::mutex> lock(g_atomics_mu);
  if (g_atomics_on) g_atomic_records->push_back(std::move(r));
}

bool BoundsChecked() {
  static const bool checked = [] {
    const char* v = std::getenv("TF_METAL_OPS_BOUNDS_CHECK");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return checked;
}

bool SyncRequested() {
  static const bool sync = [] {
    const char* v = std::getenv("TF_METAL_OPS_SYNC");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return sync;
}

const char* ScalarName(TF_DataType t) {
  switch (t) {
    case TF_FLOAT: return "float";
    case TF_HALF: return "half";
    case TF_INT32: return "int";
    case TF_UINT32: return "uint";
    case TF_INT64: return "long";
    case TF_UINT64: return "ulong";
    case TF_INT16: return "short";
    case TF_UINT16: return "ushort";
    case TF_INT8: return "char";
    case TF_UINT8: return "uchar";
    case TF_BOOL: return "bool";
    default: return nullptr;
  }
}

char ConstantTag(Specialization::Type t) {
  switch (t) {
    case Specialization::Type::kInt: return 'i';
    case Specialization::Type::kUInt: return 'u';
    case Specialization::Type::kBool: return 'b';
    case Specialization::Type::kFloat: return 'f';
  }
  return '?';
}

// One pass as the stream's thread will run it: the launch description plus what backs each slot.
struct EncodedPass {
  emu::LaunchDesc desc;
  const TfmoInlineKernel* inline_kernel = nullptr;                 // passes with their own source
  const void* device_address[emu::kMaxBufferSlots] = {};          // kBuffer slots: TF_TensorData
  std::vector<unsigned char> bytes[emu::kMaxBufferSlots];          // kBytes slots: owned copies
};

// The work item of one Call: every pass, in order, then the scratch tensors are released.
struct CallWork {
  std::string op;
  std::vector<EncodedPass> passes;
  std::vector<TF_Tensor*> scratch;

  static int Run(void* arg, TfmoEmuStream* stream, char* error, size_t error_len);
  static void Release(void* arg);
  const TfmoEmuStreamApi* api = nullptr;
};

int CallWork::Run(void* arg, TfmoEmuStream* stream, char* error, size_t error_len) {
  auto* w = static_cast<CallWork*>(arg);
  for (EncodedPass& p : w->passes) {
    for (uint32_t i = 0; i < emu::kMaxBufferSlots; ++i) {
      emu::SlotBinding& b = p.desc.buffers[i];
      if (b.kind == emu::SlotBinding::Kind::kBytes) {
        b.data = p.bytes[i].data();
      } else if (b.kind == emu::SlotBinding::Kind::kBuffer) {
        char map_error[TFMO_EMU_ERROR_BYTES] = {0};
        b.data = w->api->map(stream, p.device_address[i], b.bytes, map_error, sizeof map_error);
        if (b.data == nullptr) {
          std::snprintf(error, error_len, "tf_metal_ops: %s: %s: buffer(%u): %s", w->op.c_str(), p.desc.kernel, i,
                        map_error);
          return 1;
        }
      }
    }
    std::string message;
    if (p.inline_kernel != nullptr) {
      TfmoInlineLaunch launch{};
      for (uint32_t i = 0; i < emu::kMaxBufferSlots; ++i) {
        launch.slots[i] = p.desc.buffers[i].data;
        launch.slot_bytes[i] = p.desc.buffers[i].bytes;
      }
      for (int i = 0; i < 3; ++i) {
        launch.grid[i] = static_cast<uint32_t>(p.desc.grid[i]);
        launch.group[i] = p.desc.group[i];
      }
      inline_kernels::Run(p.inline_kernel, &launch, &message);
      std::map<std::string, std::vector<uint64_t>> unused;
      if (message.empty() && AtomicCountingOn(&unused)) RecordAtomics(w->op, p.desc, nullptr);
    } else {
      emu::LaunchAtomics atomics;
      const bool counting = AtomicCountingOn(&atomics.splits);
      message = emu::Launch(p.desc, counting ? &atomics : nullptr);
      if (message.empty() && counting) RecordAtomics(w->op, p.desc, &atomics);
    }
    if (!message.empty()) {
      std::snprintf(error, error_len, "tf_metal_ops: %s: %s: %s", w->op.c_str(), p.desc.kernel, message.c_str());
      return 1;
    }
    Count(p.desc.kernel);
  }
  return 0;
}

void CallWork::Release(void* arg) {
  auto* w = static_cast<CallWork*>(arg);
  for (TF_Tensor* t : w->scratch) TF_DeleteTensor(t);  // device memory is freed stream-ordered by the device
  delete w;
}

// The device's stream, or null after failing ctx.
const TfmoEmuStreamHeader* GetStream(TF_OpKernelContext* ctx, const char* op) {
  Status s;
  SP_Stream sp = TF_GetStream(ctx, s);
  if (!s.ok() || sp == nullptr) {
    Fail(ctx, TF_FAILED_PRECONDITION,
         "tf_metal_ops: %s: this GPU kernel got no device stream (TF_GetStream: %s); the emulated GPU kernels need "
         "the Metal-emulating GPU device (TF_METAL_OPS_EMULATED_GPU=1)",
         op, s.ok() ? "returned null" : s.message());
    return nullptr;
  }
  const auto* h = reinterpret_cast<const TfmoEmuStreamHeader*>(sp);
  if (h->magic != TFMO_EMU_STREAM_MAGIC || h->api == nullptr || h->api->struct_size < sizeof(TfmoEmuStreamApi)) {
    Fail(ctx, TF_FAILED_PRECONDITION,
         "tf_metal_ops: %s: the GPU device's stream is not the Metal-emulating device's (another GPU plugin is "
         "registered as \"GPU\"); the emulated GPU kernels run only on that device",
         op);
    return nullptr;
  }
  return h;
}

// Fills `out` from pass `p`, resolving default group sizes as the emulated pipeline would, and checks the binding
// contract (out->inline_kernel's for a pass with its own source). "" or an error.
std::string EncodePass(const Pass& p, EncodedPass* out) {
  emu::LaunchDesc& d = out->desc;
  d.kernel = p.function().c_str();  // the Call (and so the string) outlives nothing here: copied below
  for (uint32_t i = 0; i < kMaxBufferSlots; ++i) {
    const Binding& b = p.buffers()[i];
    emu::SlotBinding& s = d.buffers[i];
    if (b.kind == Binding::Kind::kTensor) {
      s.kind = emu::SlotBinding::Kind::kBuffer;
      s.scalar = ScalarName(b.dtype);
      if (s.scalar == nullptr) return "buffer(" + std::to_string(i) + "): unsupported tensor type " + DataTypeName(b.dtype);
      s.bytes = b.size;
      out->device_address[i] = TF_TensorData(b.tensor);
      if (out->device_address[i] == nullptr) return "buffer(" + std::to_string(i) + "): the tensor has no device memory";
    } else if (b.kind == Binding::Kind::kBytes) {
      s.kind = emu::SlotBinding::Kind::kBytes;
      s.bytes = b.size;
      // 16-byte aligned copy: a vector<unsigned char> from operator new is aligned to at least 16 on LP64.
      out->bytes[i] = b.data;
    }
    d.threadgroup_memory[i] = p.threadgroup_lengths()[i];
  }
  for (const Specialization::Constant& c : p.specialization().constants())
    d.constants.push_back({c.index, ConstantTag(c.type), c.bits});
  d.threadgroups = p.grid_kind() == Pass::Grid::kThreadgroups;
  for (int i = 0; i < 3; ++i) d.grid[i] = p.grid()[i];
  const std::array<uint32_t, 3> group =
      d.threadgroups ? p.group() : ResolveGroup(p.grid(), p.group(), emu::kMaxThreadsPerGroup, emu::kExecutionWidth);
  for (int i = 0; i < 3; ++i) d.group[i] = group[i];
  if (out->inline_kernel == nullptr) return emu::CheckLaunch(d);
  if (d.threadgroups) return "inline kernels take dispatchThreads grids only";
  char message[1024] = {0};
  return out->inline_kernel->check(&d, message, sizeof message) == 0 ? "" : message;
}

// A host read-back (ExecuteAndRead): encoded after the passes; maps the device range and copies it out.
struct ReadWork {
  std::string op;
  const TfmoEmuStreamApi* api = nullptr;
  const void* device_address = nullptr;  // TF_TensorData + offset
  size_t bytes = 0;
  void* out = nullptr;  // host memory of the op's thread, which waits for this work

  static int Run(void* arg, TfmoEmuStream* stream, char* error, size_t error_len) {
    auto* w = static_cast<ReadWork*>(arg);
    char map_error[TFMO_EMU_ERROR_BYTES] = {0};
    const void* src = w->api->map(stream, w->device_address, w->bytes, map_error, sizeof map_error);
    if (src == nullptr) {
      std::snprintf(error, error_len, "tf_metal_ops: %s: reading back %zu bytes: %s", w->op.c_str(), w->bytes,
                    map_error);
      return 1;
    }
    std::memcpy(w->out, src, w->bytes);
    return 0;
  }
  static void Release(void* arg) { delete static_cast<ReadWork*>(arg); }
};

struct QueueArgs {
  const TfmoEmuStreamHeader* stream;
  CallWork* work;       // null: no passes to run
  ReadWork* read;       // null: no read-back
  bool wait;
  int failed = 0;
  char error[TFMO_EMU_ERROR_BYTES] = {0};
};

// Body of Execute on the stream's queue (the Metal backend's dispatch_sync block).
void EncodeOnQueue(void* arg) {
  auto* q = static_cast<QueueArgs*>(arg);
  const TfmoEmuStreamApi* api = q->stream->api;
  TfmoEmuCommandBuffer* cb = api->current_command_buffer(q->stream->self);
  if (q->work != nullptr) api->encode(cb, TfmoEmuWork{&CallWork::Run, &CallWork::Release, q->work});
  if (q->read != nullptr) api->encode(cb, TfmoEmuWork{&ReadWork::Run, &ReadWork::Release, q->read});
  if (q->wait) {
    q->failed = api->commit_and_wait(q->stream->self, q->error, sizeof q->error);
  } else {
    api->commit(q->stream->self);
  }
}

// The call's non-empty passes, encoded and checked on the op's thread; *work stays null when there are none.
bool BuildWork(Call& call, std::unique_ptr<CallWork>* out) {
  TF_OpKernelContext* ctx = call.ctx();
  auto work = std::make_unique<CallWork>();
  work->op = call.op();
  for (const auto& p : call.passes()) {
    if (p->empty()) continue;
    const TfmoInlineKernel* inline_kernel = nullptr;
    if (p->source() != nullptr) {
      std::string error;
      inline_kernel = inline_kernels::Get(p->source()->msl, p->function(), BoundsChecked(), &error);
      if (inline_kernel == nullptr)
        return Fail(ctx, TF_INVALID_ARGUMENT, "tf_metal_ops: %s %s: %s", call.op(), p->function().c_str(),
                    error.c_str());
    } else if (!emu::HasKernel(p->function().c_str())) {
      return Fail(ctx, TF_INTERNAL, "tf_metal_ops: %s: Metal function '%s' is not in the emulated kernel library",
                  call.op(), p->function().c_str());
    }
    work->passes.emplace_back();
    work->passes.back().inline_kernel = inline_kernel;
    const std::string error = EncodePass(*p, &work->passes.back());
    if (!error.empty()) return Fail(ctx, TF_INTERNAL, "tf_metal_ops: %s: %s", call.op(), error.c_str());
  }
  if (work->passes.empty()) return true;
  // Kernel names: point the descriptions at strings owned by the work item.
  work->passes.shrink_to_fit();
  static std::mutex names_mu;
  static auto* interned = new std::map<std::string, std::string>();  // kernel names live for the process
  {
    std::lock_guard<std::mutex> lock(names_mu);
    for (EncodedPass& e : work->passes) {
      auto it = interned->emplace(e.desc.kernel, e.desc.kernel).first;
      e.desc.kernel = it->second.c_str();
    }
  }
  *out = std::move(work);
  return true;
}

}  // namespace

// The .metal files' __METAL_VERSION__ in this build: tf_metal_ops.emulated_gpu.build passes its MSL_EMU_VERSION
// (TF_METAL_OPS_EMULATED_GPU_MSL) to the host code too; msl_emu's default otherwise.
#ifndef MSL_EMU_VERSION
#define MSL_EMU_VERSION 300
#endif

bool NativeFloatAtomics(Call&, const TensorRef&) { return MSL_EMU_VERSION >= 300; }

bool Execute(Call& call) {
  TF_OpKernelContext* ctx = call.ctx();
  std::unique_ptr<CallWork> work;
  if (!BuildWork(call, &work)) return false;
  if (work == nullptr) return true;  // every pass was empty (the scratch tensors go with the Call)
  const TfmoEmuStreamHeader* stream = GetStream(ctx, call.op());
  if (stream == nullptr) return false;
  work->api = stream->api;
  work->scratch = call.TakeScratch();
  // A bounds-checked inline kernel is waited for, so that an out-of-bounds access fails this op.
  bool inline_checked = false;
  for (const EncodedPass& p : work->passes) inline_checked |= p.inline_kernel != nullptr && p.inline_kernel->checked;
  QueueArgs q{stream, work.release(), nullptr, SyncRequested() || inline_checked};
  stream->api->queue_sync(stream->self, &EncodeOnQueue, &q);
  if (q.failed) return Fail(ctx, inline_checked ? TF_INVALID_ARGUMENT : TF_INTERNAL, "%s", q.error);
  return true;
}

bool ExecuteAndRead(Call& call, const HostRead& read) {
  TF_OpKernelContext* ctx = call.ctx();
  std::unique_ptr<CallWork> work;
  if (!BuildWork(call, &work)) return false;
  const TfmoEmuStreamHeader* stream = GetStream(ctx, call.op());
  if (stream == nullptr) return false;
  const void* base = TF_TensorData(read.tensor);
  if (base == nullptr)
    return Fail(ctx, TF_INTERNAL, "tf_metal_ops: %s: reading back: the tensor has no device memory", call.op());
  auto rw = std::make_unique<ReadWork>();
  rw->op = call.op();
  rw->api = stream->api;
  rw->device_address = static_cast<const unsigned char*>(base) + read.offset;
  rw->bytes = read.bytes;
  rw->out = read.out;
  if (work != nullptr) work->api = stream->api;  // the scratch tensors stay with the Call: we wait below
  QueueArgs q{stream, work.release(), rw.release(), /*wait=*/true};
  stream->api->queue_sync(stream->self, &EncodeOnQueue, &q);
  if (q.failed) return Fail(ctx, TF_INTERNAL, "%s", q.error);
  return true;
}

}  // namespace tfmo::gpu

// {"kernel": dispatches, ...} of every kernel run so far in this process (tests check the GPU path really ran).
// The pointer stays valid until the calling thread's next call.
extern "C" __attribute__((visibility("default"))) const char* tfmo_emu_dispatch_counts(void) {
  static thread_local std::string json;
  std::lock_guard<std::mutex> lock(tfmo::gpu::g_counts_mu);
  json = "{";
  for (const auto& [name, n] : *tfmo::gpu::g_counts) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%" PRIu64, n);
    json += std::string(json.size() > 1 ? ", " : "") + "\"" + name + "\": " + buf;
  }
  json += "}";
  return json.c_str();
}

// Switches atomic counting on (on != 0) or off and clears the records. `splits`: "" or "PARAM:OFF,OFF,...;PARAM:..."
// (byte offsets into the buffer bound to that parameter, ascending; kernel_launch.h LaunchAtomics). Returns 0, or -1
// when `splits` is malformed (nothing changed).
extern "C" __attribute__((visibility("default"))) int tfmo_emu_atomic_counting(int on, const char* splits) {
  std::map<std::string, std::vector<uint64_t>> parsed;
  const std::string text = splits != nullptr ? splits : "";
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(';', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    const size_t colon = item.find(':');
    if (colon == std::string::npos || colon == 0) return -1;
    std::vector<uint64_t>& offsets = parsed[item.substr(0, colon)];
    size_t q = colon + 1;
    while (q < item.size()) {
      size_t comma = item.find(',', q);
      if (comma == std::string::npos) comma = item.size();
      const std::string num = item.substr(q, comma - q);
      if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos) return -1;
      offsets.push_back(std::strtoull(num.c_str(), nullptr, 10));
      q = comma + 1;
    }
    pos = end + 1;
  }
  std::lock_guard<std::mutex> lock(tfmo::gpu::g_atomics_mu);
  tfmo::gpu::g_atomics_on = on != 0;
  *tfmo::gpu::g_atomic_splits = std::move(parsed);
  tfmo::gpu::g_atomic_records->clear();
  return 0;
}

// The records of the launches counted since counting was switched on (a JSON list, in the order they ran; see
// RecordAtomics). The pointer stays valid until the calling thread's next call.
extern "C" __attribute__((visibility("default"))) const char* tfmo_emu_atomic_counts(void) {
  static thread_local std::string json;
  std::lock_guard<std::mutex> lock(tfmo::gpu::g_atomics_mu);
  json = "[";
  for (size_t i = 0; i < tfmo::gpu::g_atomic_records->size(); ++i)
    json += (i ? ", " : "") + (*tfmo::gpu::g_atomic_records)[i];
  json += "]";
  return json.c_str();
}
