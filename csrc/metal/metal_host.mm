// Metal host layer (see metal_host.h for the contract, docs/metal_host.md for the conventions).
#include "metal/metal_host.h"

#import <objc/runtime.h>

#include <dlfcn.h>
#include <malloc/malloc.h>

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "metal/embedded_sources.h"

namespace tfmo::metal {
namespace {

constexpr const char* kMetallibName = "tf_metal_ops.metallib";                // MSL 2.4, macOS 12+
constexpr const char* kMetal3MetallibName = "tf_metal_ops.metal3.metallib";  // MSL 3.0, Metal 3 GPUs
constexpr NSUInteger kMaxBufferIndex = 30;                                    // Metal: 31 buffer slots
constexpr size_t kMaxSetBytes = 4096;                                         // Metal limit for setBytes

std::string Format(const char* fmt, va_list ap) {
  char buf[2048];
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  return buf;
}

std::string ToString(NSString* s) { return s ? std::string(s.UTF8String ?: "") : std::string(); }

std::string Describe(NSError* e) {
  if (!e) return "unknown error";
  std::string s = ToString(e.localizedDescription);
  constexpr size_t kMax = 4000;  // compiler logs can be long; the op error keeps the head
  if (s.size() > kMax) s = s.substr(0, kMax) + " [...]";
  return s;
}

bool EnvIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

// TF_METAL_OPS_SYNC=1: wait for every op's command buffer (debugging: errors surface at the op that caused them).
bool SyncRequested() {
  static const bool sync = EnvIs("TF_METAL_OPS_SYNC", "1");
  return sync;
}

// ---- Is an opaque pointer an Objective-C object? ---------------------------------------------------------
// TF_GetStream and TF_TensorData return opaque pointers that are Objective-C objects only under tensorflow-metal.
// Messaging anything else would crash, so before the first message: the pointer must be the start of a heap
// block (malloc_zone_from_ptr is defined for any pointer) large enough for an isa, and its class must be a
// registered one (compared by address against the runtime's class list). Verified classes are cached.
std::mutex g_classes_mu;
std::unordered_set<const void*>* g_known_classes = new std::unordered_set<const void*>();  // never freed

bool IsRegisteredClass(Class cls) {
  const void* key = (__bridge const void*)cls;
  std::lock_guard<std::mutex> lock(g_classes_mu);
  if (g_known_classes->count(key)) return true;
  unsigned int count = 0;
  Class* all = objc_copyClassList(&count);
  bool found = false;
  for (unsigned int i = 0; i < count && !found; ++i) found = (__bridge const void*)all[i] == key;
  std::free(all);
  if (found) g_known_classes->insert(key);
  return found;
}

bool LooksLikeObject(const void* p) {
  if (p == nullptr || malloc_zone_from_ptr(p) == nullptr || malloc_size(p) < 2 * sizeof(void*)) return false;
  Class cls = object_getClass((__bridge id)p);  // reads the block's first word only
  return cls != Nil && IsRegisteredClass(cls);
}

// ---- Where the op library lives --------------------------------------------------------------------------
NSURL* LibraryDirectory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<const void*>(&tfmo_metal_info), &info) == 0 || info.dli_fname == nullptr) return nil;
  NSString* path = [[NSFileManager defaultManager] stringWithFileSystemRepresentation:info.dli_fname
                                                                               length:std::strlen(info.dli_fname)];
  if (path == nil) return nil;
  return [[[NSURL fileURLWithPath:path] URLByResolvingSymlinksInPath] URLByDeletingLastPathComponent];
}

bool UseMetal3(id<MTLDevice> device) {
  if (@available(macOS 13.0, *)) return [device supportsFamily:MTLGPUFamilyMetal3];
  return false;
}

// Metallibs to try, best first (none when TF_METAL_OPS_FORCE_SOURCE=1, to test the embedded sources).
std::vector<NSURL*> MetallibCandidates(id<MTLDevice> device) {
  std::vector<NSURL*> out;
  NSURL* dir = LibraryDirectory();
  if (dir == nil || EnvIs("TF_METAL_OPS_FORCE_SOURCE", "1")) return out;
  if (device == nil || UseMetal3(device)) out.push_back([dir URLByAppendingPathComponent:@(kMetal3MetallibName)]);
  out.push_back([dir URLByAppendingPathComponent:@(kMetallibName)]);
  return out;
}

bool Exists(NSURL* url) { return [[NSFileManager defaultManager] fileExistsAtPath:url.path]; }

size_t NumEmbeddedSources() {
  size_t n = 0;
  while (kEmbeddedMetalSources[n].source != nullptr) ++n;
  return n;
}

// ---- Per-device state: libraries and pipelines ------------------------------------------------------------
struct DeviceState {
  std::mutex mu;  // guards everything below; held while compiling, so each library/pipeline is built once
  bool library_attempted = false;
  std::vector<id<MTLLibrary>> libraries;  // one metallib, or one per embedded source file that compiled
  std::string origin;                     // where the libraries came from
  std::string load_errors;                // metallib load / source compile errors (kept for later messages)
  std::unordered_map<std::string, id<MTLComputePipelineState>> pipelines;
};

std::mutex g_devices_mu;
auto* g_devices = new std::unordered_map<uint64_t, DeviceState*>();  // by registryID; never freed (process-long)
DeviceState* g_last_state = nullptr;                                  // for tfmo_metal_info

DeviceState* StateFor(id<MTLDevice> device) {
  std::lock_guard<std::mutex> lock(g_devices_mu);
  DeviceState*& s = (*g_devices)[device.registryID];
  if (s == nullptr) s = new DeviceState();
  g_last_state = s;
  return s;
}

void AppendError(std::string* all, const std::string& e) {
  if (!all->empty()) *all += "; ";
  *all += e;
}

// Loads the device's libraries once (caller holds s->mu). False, with a message, when there are none.
bool EnsureLibraries(id<MTLDevice> device, DeviceState* s, std::string* error) {
  if (!s->library_attempted) {
    s->library_attempted = true;
    for (NSURL* url : MetallibCandidates(device)) {
      if (!Exists(url)) continue;
      NSError* err = nil;
      id<MTLLibrary> lib = [device newLibraryWithURL:url error:&err];
      if (lib != nil) {
        s->libraries.push_back(lib);
        s->origin = "metallib " + ToString(url.path);
        break;
      }
      AppendError(&s->load_errors, "loading " + ToString(url.path) + " failed: " + Describe(err));
    }
    if (s->libraries.empty()) {
      MTLCompileOptions* options = [MTLCompileOptions new];
      const bool metal3 = UseMetal3(device);
      if (@available(macOS 13.0, *)) {
        options.languageVersion = metal3 ? MTLLanguageVersion3_0 : MTLLanguageVersion2_4;
      } else {
        options.languageVersion = MTLLanguageVersion2_4;
      }
      size_t compiled = 0;
      for (const EmbeddedSource* e = kEmbeddedMetalSources; e->source != nullptr; ++e) {
        NSError* err = nil;
        id<MTLLibrary> lib = [device newLibraryWithSource:@(e->source) options:options error:&err];
        if (lib == nil) {
          AppendError(&s->load_errors, std::string("compiling embedded ") + e->name + " failed: " + Describe(err));
          continue;
        }
        s->libraries.push_back(lib);
        ++compiled;
      }
      s->origin = "embedded source (" + std::to_string(compiled) + " of " + std::to_string(NumEmbeddedSources()) +
                  " files compiled, MSL " + (metal3 ? "3.0" : "2.4") + ")";
    }
  }
  if (!s->libraries.empty()) return true;
  std::string where;
  for (NSURL* url : MetallibCandidates(nil)) where += (where.empty() ? "" : ", ") + ToString(url.path);
  *error = "no Metal library: no loadable metallib (looked for " + (where.empty() ? std::string("none") : where) +
           ") and no embedded source compiled" + (s->load_errors.empty() ? "" : ": " + s->load_errors);
  return false;
}

id<MTLComputePipelineState> GetPipeline(id<MTLDevice> device, const char* function, const Specialization& spec,
                                        std::string* error) {
  DeviceState* s = StateFor(device);
  std::lock_guard<std::mutex> lock(s->mu);
  const std::string key = std::string(function) + "#" + spec.Key();
  auto it = s->pipelines.find(key);
  if (it != s->pipelines.end()) return it->second;
  if (!EnsureLibraries(device, s, error)) return nil;

  NSString* name = @(function);
  id<MTLLibrary> owner = nil;
  for (id<MTLLibrary> lib : s->libraries) {
    if ([lib.functionNames containsObject:name]) {
      owner = lib;
      break;
    }
  }
  if (owner == nil) {
    *error = std::string("Metal function '") + function + "' is not in the library (" + s->origin + ")" +
             (s->load_errors.empty() ? "" : "; " + s->load_errors);
    return nil;
  }
  NSError* err = nil;
  id<MTLFunction> fn = spec.empty() ? [owner newFunctionWithName:name]
                                    : [owner newFunctionWithName:name constantValues:spec.Values() error:&err];
  if (fn == nil) {
    *error = std::string("creating Metal function '") + function + "' (constants " + spec.Key() +
             ") failed: " + Describe(err);
    return nil;
  }
  id<MTLComputePipelineState> pipeline = [device newComputePipelineStateWithFunction:fn error:&err];
  if (pipeline == nil) {
    *error = std::string("creating the compute pipeline of '") + function + "' failed: " + Describe(err);
    return nil;
  }
  s->pipelines.emplace(key, pipeline);
  return pipeline;
}

// ---- The stream ---------------------------------------------------------------------------------------------
id<TFMOMetalStream> GetStream(TF_OpKernelContext* ctx, bool wait, std::string* error) {
  Status status;
  SP_Stream sp = TF_GetStream(ctx, status);
  if (!status.ok() || sp == nullptr) {
    *error = std::string("tf_metal_ops: this GPU kernel got no device stream (TF_GetStream: ") +
             (status.ok() ? "returned null" : status.message()) + "); Metal kernels need tensorflow-metal's GPU device";
    return nil;
  }
  if (!LooksLikeObject(sp)) {
    *error = "tf_metal_ops: the GPU device's stream is not an Objective-C object, so the GPU plugin is not "
             "tensorflow-metal; tf_metal_ops' Metal kernels need tensorflow-metal's stream protocol";
    return nil;
  }
  id obj = (__bridge id)(void*)sp;
  std::string missing;
  const std::pair<SEL, const char*> needed[] = {
      {@selector(queue), "-queue"},
      {@selector(currentCommandBuffer), "-currentCommandBuffer"},
      {@selector(commit), "-commit"},
      {@selector(commitAndWait), "-commitAndWait (needed by TF_METAL_OPS_SYNC=1)"},
  };
  for (const auto& [sel, label] : needed) {
    if (sel == @selector(commitAndWait) && !wait) continue;
    if (![obj respondsToSelector:sel]) missing += (missing.empty() ? "" : ", ") + std::string(label);
  }
  if (!missing.empty()) {
    *error = "tf_metal_ops: the GPU device's stream (class " + std::string(object_getClassName(obj)) +
             ") lacks " + missing +
             ": the GPU plugin is not tensorflow-metal or is an incompatible version of it";
    return nil;
  }
  return (id<TFMOMetalStream>)obj;
}

struct Outcome {
  TF_Code code = TF_OK;
  std::string message;
  void Set(TF_Code c, std::string m) {
    if (code == TF_OK) { code = c; message = std::move(m); }
  }
};

// Body of Dispatch, on the stream's queue.
void EncodeOnQueue(id<TFMOMetalStream> stream, const char* function, const Specialization& spec,
                   const std::function<void(Encoder&)>& encode, bool wait, Outcome* out) {
  id<MTLCommandBuffer> cb = [stream currentCommandBuffer];
  if (cb == nil) return out->Set(TF_INTERNAL, "tf_metal_ops: the Metal stream has no current command buffer");
  std::string error;
  id<MTLComputePipelineState> pipeline = GetPipeline(cb.device, function, spec, &error);
  if (pipeline == nil) return out->Set(TF_INTERNAL, "tf_metal_ops: " + error);
  id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoder];
  if (enc == nil) return out->Set(TF_INTERNAL, "tf_metal_ops: could not create a Metal compute command encoder");
  [enc setComputePipelineState:pipeline];
  Encoder encoder(enc, pipeline);
  try {
    encode(encoder);
  } catch (const std::exception& e) {
    encoder.fail("exception while encoding: %s", e.what());
  } catch (...) {
    encoder.fail("unknown exception while encoding");
  }
  [enc endEncoding];  // always: an open encoder would break the stream's command buffer
  if (!encoder.ok()) return out->Set(encoder.code(), std::string("tf_metal_ops: ") + function + ": " + encoder.error());
  if (!wait) {
    [stream commit];
    return;
  }
  [stream commitAndWait];
  if (cb.status == MTLCommandBufferStatusError)
    out->Set(TF_INTERNAL, std::string("tf_metal_ops: ") + function + ": the command buffer failed: " + Describe(cb.error));
}

}  // namespace

// ---- Specialization -----------------------------------------------------------------------------------------
Specialization& Specialization::Set(uint32_t index, MTLDataType type, uint32_t bits) {
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
  return Set(index, MTLDataTypeInt, bits);
}
Specialization& Specialization::UInt(uint32_t index, uint32_t v) { return Set(index, MTLDataTypeUInt, v); }
Specialization& Specialization::Bool(uint32_t index, bool v) { return Set(index, MTLDataTypeBool, v ? 1u : 0u); }
Specialization& Specialization::Float(uint32_t index, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return Set(index, MTLDataTypeFloat, bits);
}

std::string Specialization::Key() const {
  std::string key;
  char buf[48];
  for (const Constant& c : constants_) {
    const char tag = c.type == MTLDataTypeInt ? 'i' : c.type == MTLDataTypeUInt ? 'u' : c.type == MTLDataTypeBool ? 'b' : 'f';
    std::snprintf(buf, sizeof buf, "%s%u:%c=%08x", key.empty() ? "" : ";", c.index, tag, c.bits);
    key += buf;
  }
  return key;
}

MTLFunctionConstantValues* Specialization::Values() const {
  if (constants_.empty()) return nil;
  MTLFunctionConstantValues* values = [MTLFunctionConstantValues new];
  for (const Constant& c : constants_) {
    if (c.type == MTLDataTypeBool) {
      const bool b = c.bits != 0;
      [values setConstantValue:&b type:MTLDataTypeBool atIndex:c.index];
    } else {
      [values setConstantValue:&c.bits type:c.type atIndex:c.index];  // 32-bit int/uint/float bit pattern
    }
  }
  return values;
}

// ---- Encoder ------------------------------------------------------------------------------------------------
Encoder::Encoder(id<MTLComputeCommandEncoder> encoder, id<MTLComputePipelineState> pipeline)
    : encoder_(encoder), pipeline_(pipeline) {}

void Encoder::fail(const char* fmt, ...) {
  if (!ok()) return;
  va_list ap;
  va_start(ap, fmt);
  error_ = Format(fmt, ap);
  va_end(ap);
  code_ = TF_INTERNAL;
}

void Encoder::fail(TF_Code code, const char* fmt, ...) {
  if (!ok()) return;
  va_list ap;
  va_start(ap, fmt);
  error_ = Format(fmt, ap);
  va_end(ap);
  code_ = code;
}

uint32_t Encoder::max_threads_per_group() const {
  return static_cast<uint32_t>(std::max<NSUInteger>(1, pipeline_.maxTotalThreadsPerThreadgroup));
}
uint32_t Encoder::execution_width() const {
  return static_cast<uint32_t>(std::max<NSUInteger>(1, pipeline_.threadExecutionWidth));
}
id<MTLDevice> Encoder::device() const { return pipeline_.device; }

void Encoder::buffer(uint32_t index, TF_Tensor* t) {
  if (!ok()) return;
  if (index > kMaxBufferIndex) return fail(TF_INVALID_ARGUMENT, "buffer index %u is out of range", index);
  if (t == nullptr) return fail("buffer %u: null tensor", index);
  void* data = TF_TensorData(t);
  const size_t bytes = TF_TensorByteSize(t);
  if (data == nullptr) {
    return bytes == 0 ? fail("buffer %u: an empty tensor has no MTLBuffer; skip the dispatch for empty work", index)
                      : fail("buffer %u: tensor of %zu bytes has no data", index, bytes);
  }
  // TF_TensorData is the tensor's id<MTLBuffer> under tensorflow-metal (undocumented): verify before use.
  id obj = LooksLikeObject(data) ? (__bridge id)data : nil;
  if (obj == nil || ![obj conformsToProtocol:@protocol(MTLBuffer)]) {
    return fail(TF_FAILED_PRECONDITION,
                "buffer %u: the tensor's data is not an MTLBuffer (a tensor in host memory, a slice sharing another "
                "tensor's buffer, or a GPU plugin other than tensorflow-metal)",
                index);
  }
  id<MTLBuffer> buf = (id<MTLBuffer>)obj;
  if (buf.length < bytes) {
    return fail("buffer %u: MTLBuffer of %lu bytes is smaller than its tensor (%zu bytes)", index,
                static_cast<unsigned long>(buf.length), bytes);
  }
  [encoder_ setBuffer:buf offset:0 atIndex:index];
}

void Encoder::bytes(uint32_t index, const void* data, size_t length) {
  if (!ok()) return;
  if (index > kMaxBufferIndex) return fail(TF_INVALID_ARGUMENT, "buffer index %u is out of range", index);
  if (data == nullptr || length == 0 || length > kMaxSetBytes)
    return fail("bytes %u: %zu bytes (setBytes takes 1 to %zu bytes; use a buffer for more)", index, length,
                kMaxSetBytes);
  [encoder_ setBytes:data length:length atIndex:index];
}

void Encoder::threadgroup_memory(uint32_t index, size_t length) {
  if (!ok()) return;
  const NSUInteger max = pipeline_.device.maxThreadgroupMemoryLength;
  if (length > max) return fail(TF_INVALID_ARGUMENT, "threadgroup memory of %zu bytes exceeds the device's %lu", length,
                                static_cast<unsigned long>(max));
  [encoder_ setThreadgroupMemoryLength:(length + 15) / 16 * 16 atIndex:index];  // Metal wants multiples of 16
}

void Encoder::threads(uint64_t n, uint32_t group) { threads({n, 1, 1}, {group, 1, 1}); }

void Encoder::threads(std::array<uint64_t, 3> grid, std::array<uint32_t, 3> group) {
  if (!ok()) return;
  for (uint64_t d : grid) {
    if (d == 0) return;  // empty work: nothing to dispatch
    if (d > UINT32_MAX)
      return fail(TF_INVALID_ARGUMENT, "a grid of %" PRIu64 " x %" PRIu64 " x %" PRIu64
                  " threads exceeds the 32-bit limit per dimension", grid[0], grid[1], grid[2]);
  }
  const uint64_t max = max_threads_per_group(), width = execution_width();
  std::array<uint64_t, 3> g = {group[0], group[1], group[2]};
  if (g[0] == 0) g[0] = grid[1] == 1 && grid[2] == 1 ? std::max(width, std::min<uint64_t>(256, max) / width * width)
                                                     : width;
  if (g[1] == 0) g[1] = std::max<uint64_t>(1, max / g[0]);
  if (g[2] == 0) g[2] = 1;
  for (int i = 0; i < 3; ++i) g[i] = std::max<uint64_t>(1, std::min(g[i], grid[i]));
  // Clamp to the pipeline's limit, shrinking z, then y, then x.
  for (int i = 2; i >= 0 && g[0] * g[1] * g[2] > max; --i) g[i] = std::max<uint64_t>(1, max / (g[0] * g[1] * g[2] / g[i]));
  [encoder_ dispatchThreads:MTLSizeMake(grid[0], grid[1], grid[2]) threadsPerThreadgroup:MTLSizeMake(g[0], g[1], g[2])];
}

void Encoder::threadgroups(std::array<uint64_t, 3> groups, std::array<uint32_t, 3> group) {
  if (!ok()) return;
  for (uint64_t d : groups)
    if (d == 0) return;  // empty work
  if (group[0] == 0 || group[1] == 0 || group[2] == 0) return fail("threadgroups: a threadgroup dimension is 0");
  const uint64_t total = uint64_t{group[0]} * group[1] * group[2];
  if (total > max_threads_per_group())
    return fail(TF_INVALID_ARGUMENT, "threadgroups: %" PRIu64 " threads per group exceed this pipeline's maximum of %u",
                total, max_threads_per_group());
  for (int i = 0; i < 3; ++i) {
    if (groups[i] > UINT32_MAX / group[i])
      return fail(TF_INVALID_ARGUMENT, "threadgroups: %" PRIu64 " groups of %u threads exceed the 32-bit grid limit",
                  groups[i], group[i]);
  }
  [encoder_ dispatchThreadgroups:MTLSizeMake(groups[0], groups[1], groups[2])
           threadsPerThreadgroup:MTLSizeMake(group[0], group[1], group[2])];
}

// ---- Dispatch -----------------------------------------------------------------------------------------------
bool Dispatch(TF_OpKernelContext* ctx, const char* function, const Specialization& spec,
              const std::function<void(Encoder&)>& encode) {
  const bool wait = SyncRequested();
  std::string error;
  id<TFMOMetalStream> stream = GetStream(ctx, wait, &error);
  if (stream == nil) return Fail(ctx, TF_FAILED_PRECONDITION, "%s", error.c_str());
  dispatch_queue_t queue = [stream queue];
  if (queue == nil) return Fail(ctx, TF_FAILED_PRECONDITION, "tf_metal_ops: the Metal stream has no dispatch queue");

  Outcome outcome;
  Outcome* out = &outcome;  // the block runs synchronously: stack pointers stay valid
  const std::function<void(Encoder&)>* body = &encode;
  const Specialization* specp = &spec;
  dispatch_sync(queue, ^{
    @autoreleasepool {
      @try {
        try {
          EncodeOnQueue(stream, function, *specp, *body, wait, out);
        } catch (const std::exception& e) {
          out->Set(TF_INTERNAL, std::string("tf_metal_ops: ") + function + ": exception " + e.what());
        }
      } @catch (NSException* e) {
        out->Set(TF_INTERNAL, std::string("tf_metal_ops: ") + function + ": Objective-C exception " +
                                  ToString(e.name) + ": " + ToString(e.reason));
      } @catch (...) {
        out->Set(TF_INTERNAL, std::string("tf_metal_ops: ") + function + ": unknown exception");
      }
    }
  });
  if (outcome.code != TF_OK) return Fail(ctx, outcome.code, "%s", outcome.message.c_str());
  return true;
}

bool CheckGridSize(TF_OpKernelContext* ctx, const char* op, const char* what, uint64_t n) {
  if (n <= UINT32_MAX) return true;
  return Fail(ctx, TF_INVALID_ARGUMENT, "%s: %s = %" PRIu64 " exceeds 4294967295, the limit of the Metal kernels "
              "(32-bit grid and indices); split the input", op, what, n);
}

}  // namespace tfmo::metal

// ---- Backend info -------------------------------------------------------------------------------------------
namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

const char* JsonBool(bool b) { return b ? "true" : "false"; }

}  // namespace

extern "C" const char* tfmo_metal_info(void) {
  using namespace tfmo::metal;
  static thread_local std::string json;
  @autoreleasepool {
    id<MTLDevice> device = MTLCreateSystemDefaultDevice();
    std::string families;
    bool metal3 = false;
    if (device != nil) {
      const std::pair<MTLGPUFamily, const char*> known[] = {
          {MTLGPUFamilyApple7, "Apple7"}, {MTLGPUFamilyApple8, "Apple8"}, {MTLGPUFamilyMac2, "Mac2"},
          {MTLGPUFamilyCommon3, "Common3"},
      };
      for (const auto& [family, name] : known) {
        if ([device supportsFamily:family]) families += std::string(families.empty() ? "" : ", ") + JsonString(name);
      }
      metal3 = UseMetal3(device);
      if (metal3) families += std::string(families.empty() ? "" : ", ") + JsonString("Metal3");
    }
    std::string candidates;
    for (NSURL* url : MetallibCandidates(device)) {
      candidates += std::string(candidates.empty() ? "" : ", ") + "{\"path\": " + JsonString(ToString(url.path)) +
                    ", \"exists\": " + JsonBool(Exists(url)) + "}";
    }
    bool loaded = false;
    std::string origin, errors;
    DeviceState* state = nullptr;
    {
      std::lock_guard<std::mutex> lock(g_devices_mu);
      state = g_last_state;
    }
    if (state != nullptr) {  // waits if that device's library is being compiled right now
      std::lock_guard<std::mutex> lock(state->mu);
      loaded = !state->libraries.empty();
      origin = state->origin;
      errors = state->load_errors;
    }
    NSURL* dir = LibraryDirectory();
    json = std::string("{\"device_available\": ") + JsonBool(device != nil) +
           ", \"device\": " + (device ? JsonString(ToString(device.name)) : "null") +
           ", \"unified_memory\": " + JsonBool(device != nil && device.hasUnifiedMemory) +
           ", \"families\": [" + families + "], \"metal3\": " + JsonBool(metal3) +
           ", \"os\": " + JsonString(ToString([[NSProcessInfo processInfo] operatingSystemVersionString])) +
           ", \"msl_runtime_version\": " + JsonString(metal3 ? "3.0" : "2.4") +
           ", \"sync\": " + JsonBool(SyncRequested()) +
           ", \"library\": {\"loaded\": " + JsonBool(loaded) +
           ", \"origin\": " + (origin.empty() ? "null" : JsonString(origin)) +
           ", \"error\": " + (errors.empty() ? "null" : JsonString(errors)) +
           ", \"directory\": " + (dir ? JsonString(ToString(dir.path)) : "null") +
           ", \"metallib_candidates\": [" + candidates + "]" +
           ", \"embedded_sources\": " + std::to_string(NumEmbeddedSources()) + "}}";
  }
  return json.c_str();
}
