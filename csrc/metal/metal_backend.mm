// Metal backend of the GPU host layer (csrc/gpu/gpu_host.h): the only code that knows about Metal and
// tensorflow-metal. Objective-C++, macOS builds only (-fobjc-arc -fblocks). Conventions: docs/metal_host.md.
//
//  - Stream: TF_GetStream(ctx) is tensorflow-metal's stream object (protocol below, declared by us: no header ships
//    it). Before the first message the pointer is checked to be an Objective-C object of a registered class
//    (skippable with TF_METAL_OPS_SKIP_OBJECT_CHECK=1); the verdict is cached per class.
//  - Tensors: TF_TensorData is the tensor's id<MTLBuffer> (undocumented; checked the same way), bound at offset 0.
//  - Libraries and pipelines are resolved before entering the stream's queue (compiling there would stall every GPU
//    op of the process). Variants, best first: tf_metal_ops.metal3.metallib (Metal 3 GPUs), tf_metal_ops.metallib
//    (MSL 2.4), then the embedded .metal source of the one file that defines the function (compiled at first use).
//    A pipeline that fails in one variant is tried in the next. Fast math is off everywhere: the kernels rely on
//    IEEE NaN/inf (NaN positions -> 0, NaN outputs for invalid rays, exp of large arguments).
//  - Encoding happens only inside dispatch_sync(stream.queue, ...): [stream commit] first (ends any encoder the
//    stream keeps open for its own kernels: nothing public says tensorflow-metal never does), then one compute
//    encoder on [stream currentCommandBuffer] for all passes of a Call (serial dispatch: each pass sees the
//    previous one's writes), then [stream commit]. The stream needs -queue, -currentCommandBuffer and -commit.
//  - Completion: a handler added before the commit records the command buffer's status and error. Waiting
//    (TF_METAL_OPS_SYNC=1, ExecuteAndRead) waits for that handler, outside the stream's queue, with a timeout
//    (TF_METAL_OPS_GPU_TIMEOUT seconds, default 300): never on the stream's current buffer, which an
//    MPSCommandBuffer-style stream commits-and-continues, wrapping a new buffer. A GPU error of an asynchronous
//    call is kept and fails the next call (and shows in backend_info).
//  - Scratch tensors are deleted on the op's thread once the passes that use them are encoded (after
//    dispatch_sync returns), as Apple's sample frees its temporaries: the command buffer retains the MTLBuffers it
//    references and later work on the stream is ordered after it. Never from Metal's completion thread, where
//    tensorflow-metal's allocator could contend for the stream's queue.
//  - Errors never abort: every failure becomes an op error through TF_OpKernelContext_Failure.
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>
#import <objc/runtime.h>

#include <dlfcn.h>
#include <malloc/malloc.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpu/gpu_host.h"
#include "metal/embedded_sources.h"

// tensorflow-metal's stream object, as returned by TF_GetStream (selectors checked at run time).
@protocol TFMOMetalStream <NSObject>
- (dispatch_queue_t)queue;
- (id<MTLCommandBuffer>)currentCommandBuffer;
- (void)commit;
@end

namespace tfmo::gpu {
namespace {

using tfmo::metal::EmbeddedSource;
using tfmo::metal::kEmbeddedMetalSources;

constexpr const char* kMetallibName = "tf_metal_ops.metallib";                // MSL 2.4, macOS 12+
constexpr const char* kMetal3MetallibName = "tf_metal_ops.metal3.metallib";  // MSL 3.0, Metal 3 GPUs

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

bool SyncRequested() {
  static const bool sync = EnvIs("TF_METAL_OPS_SYNC", "1");
  return sync;
}

// ---- Is an opaque pointer an Objective-C object? ---------------------------------------------------------
// TF_GetStream and TF_TensorData return opaque pointers that are Objective-C objects only under tensorflow-metal.
// Messaging anything else would crash, so before the first message: the pointer must be the start of a heap block
// (malloc_zone_from_ptr is defined for any pointer) large enough for an isa, and its class must be a registered one
// (compared by address against the runtime's class list). Verdicts are cached per class: registered classes, and
// per class whether it has the stream selectors / conforms to MTLBuffer.
struct ClassCache {
  std::mutex mu;
  std::unordered_map<const void*, bool> registered;  // class -> in the runtime's class list
  std::unordered_map<const void*, std::string> stream_missing;  // class -> missing selectors ("" = complete)
  std::unordered_map<const void*, bool> is_buffer;   // class -> conforms to MTLBuffer
};
ClassCache& Classes() {
  static auto* c = new ClassCache();  // never freed (process-long)
  return *c;
}

bool IsRegisteredClass(Class cls) {
  const void* key = (__bridge const void*)cls;
  ClassCache& c = Classes();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.registered.find(key);
  if (it != c.registered.end()) return it->second;
  unsigned int count = 0;
  Class* all = objc_copyClassList(&count);
  bool found = false;
  for (unsigned int i = 0; i < count && !found; ++i) found = (__bridge const void*)all[i] == key;
  std::free(all);
  if (found) c.registered.emplace(key, true);  // unknown values are not cached: they may be random words
  return found;
}

// `why` (may be null) receives what the check saw: the zone, the block size and the class, for a message that
// explains a rejection on the first run.
bool LooksLikeObject(const void* p, std::string* why = nullptr) {
  if (p == nullptr) {
    if (why) *why = "a null pointer";
    return false;
  }
  static const bool skip = EnvIs("TF_METAL_OPS_SKIP_OBJECT_CHECK", "1");
  if (skip) return true;
  malloc_zone_t* zone = malloc_zone_from_ptr(p);
  const size_t size = zone != nullptr ? malloc_size(p) : 0;
  char buf[160];
  if (zone == nullptr || size < 2 * sizeof(void*)) {
    std::snprintf(buf, sizeof buf, "%p: malloc_zone_from_ptr = %p, malloc_size = %zu (not the start of a heap block)",
                  p, static_cast<void*>(zone), size);
    if (why) *why = buf;
    return false;
  }
  Class cls = object_getClass((__bridge id)p);  // reads the block's first word only
  const bool ok = cls != Nil && IsRegisteredClass(cls);
  if (!ok && why) {
    std::snprintf(buf, sizeof buf, "%p: malloc_zone_from_ptr = %p, malloc_size = %zu, isa %p is no registered class", p,
                  static_cast<void*>(zone), size, (__bridge void*)cls);
    *why = buf;
  }
  return ok;
}

// The class name of an object that passed LooksLikeObject.
std::string ClassName(id obj) { return object_getClassName(obj) ?: "?"; }

// ---- Where the op library lives --------------------------------------------------------------------------
NSURL* LibraryDirectory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<const void*>(&Execute), &info) == 0 || info.dli_fname == nullptr) return nil;
  NSString* path = [[NSFileManager defaultManager] stringWithFileSystemRepresentation:info.dli_fname
                                                                               length:std::strlen(info.dli_fname)];
  if (path == nil) return nil;
  return [[[NSURL fileURLWithPath:path] URLByResolvingSymlinksInPath] URLByDeletingLastPathComponent];
}

bool UseMetal3(id<MTLDevice> device) {
  if (@available(macOS 13.0, *)) return device != nil && [device supportsFamily:MTLGPUFamilyMetal3];
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

// The embedded source file that defines kernel `function` ("void <function>(" in its text), or null.
const EmbeddedSource* SourceDefining(const char* function) {
  const std::string needle = std::string("void ") + function + "(";
  for (const EmbeddedSource* e = kEmbeddedMetalSources; e->source != nullptr; ++e)
    if (std::strstr(e->source, needle.c_str()) != nullptr) return e;
  return nullptr;
}

MTLCompileOptions* CompileOptions(id<MTLDevice> device) {
  MTLCompileOptions* options = [MTLCompileOptions new];
  options.fastMathEnabled = NO;  // IEEE NaN/inf semantics (see the header comment)
  if (@available(macOS 13.0, *)) {
    options.languageVersion = UseMetal3(device) ? MTLLanguageVersion3_0 : MTLLanguageVersion2_4;
  } else {
    options.languageVersion = MTLLanguageVersion2_4;
  }
  return options;
}

// ---- Per-device state: library variants and pipelines --------------------------------------------------
struct Library {
  std::string origin;       // "metallib <path>", "embedded source <file> (MSL x.y)" or "inline kernel source #n"
  bool attempted = false;   // loading/compiling was tried (once)
  id<MTLLibrary> library = nil;
  std::string error;        // why library is nil
};

struct DeviceState {
  std::mutex mu;  // guards everything below; held while compiling, so each library/pipeline is built once
  std::vector<Library> metallibs;                      // candidates, best first
  std::unordered_map<std::string, Library> sources;    // embedded source file -> compiled library
  std::unordered_map<std::string, Library> inline_sources;  // a pass's own MSL (inline kernels) -> its library
  std::unordered_map<std::string, id<MTLComputePipelineState>> pipelines;  // function#constants
  std::unordered_map<std::string, std::string> pipeline_origin;            // same key -> library origin
  std::string errors;  // load / compile / pipeline errors, kept for later messages and backend_info()
  double compile_seconds = 0;
};

std::mutex g_devices_mu;
auto* g_devices = new std::unordered_map<uint64_t, DeviceState*>();  // by registryID; never freed (process-long)
uint64_t g_last_device = 0;                                           // registryID of the last device used

DeviceState* StateFor(id<MTLDevice> device) {
  std::lock_guard<std::mutex> lock(g_devices_mu);
  DeviceState*& s = (*g_devices)[device.registryID];
  if (s == nullptr) {
    s = new DeviceState();
    for (NSURL* url : MetallibCandidates(device)) {
      Library lib;
      lib.origin = "metallib " + ToString(url.path);
      s->metallibs.push_back(lib);
    }
  }
  g_last_device = device.registryID;
  return s;
}

void AppendError(std::string* all, const std::string& e) {
  if (all->find(e) != std::string::npos) return;
  if (!all->empty()) *all += "; ";
  *all += e;
}

id<MTLComputePipelineState> MakePipeline(id<MTLDevice> device, id<MTLLibrary> lib, const Library& origin,
                                         const char* function, const Pass& pass, std::string* error) {
  NSString* name = @(function);
  if (![lib.functionNames containsObject:name]) {
    *error = origin.origin + " has no function '" + function + "'";
    return nil;
  }
  NSError* err = nil;
  id<MTLFunction> fn = nil;
  const Specialization& spec = pass.specialization();
  if (spec.empty()) {
    fn = [lib newFunctionWithName:name];
  } else {
    MTLFunctionConstantValues* values = [MTLFunctionConstantValues new];
    for (const Specialization::Constant& c : spec.constants()) {
      switch (c.type) {
        case Specialization::Type::kBool: {
          const bool b = c.bits != 0;
          [values setConstantValue:&b type:MTLDataTypeBool atIndex:c.index];
          break;
        }
        case Specialization::Type::kInt: [values setConstantValue:&c.bits type:MTLDataTypeInt atIndex:c.index]; break;
        case Specialization::Type::kUInt: [values setConstantValue:&c.bits type:MTLDataTypeUInt atIndex:c.index]; break;
        case Specialization::Type::kFloat: [values setConstantValue:&c.bits type:MTLDataTypeFloat atIndex:c.index]; break;
      }
    }
    fn = [lib newFunctionWithName:name constantValues:values error:&err];
  }
  if (fn == nil) {
    *error = origin.origin + ": creating function '" + function + "' (constants " + spec.Key() + ") failed: " + Describe(err);
    return nil;
  }
  id<MTLComputePipelineState> pipeline = [device newComputePipelineStateWithFunction:fn error:&err];
  if (pipeline == nil) *error = origin.origin + ": creating the pipeline of '" + function + "' failed: " + Describe(err);
  return pipeline;
}

// The pipeline of a pass with its own source (inline kernels): the source compiled once per device (fast math off;
// the generated source turns FMA contraction off itself), pipelines cached by (source, function, constants).
id<MTLComputePipelineState> GetInlinePipeline(id<MTLDevice> device, DeviceState* s, const Pass& pass,
                                              std::string* error) {
  auto [lib_it, added] = s->inline_sources.try_emplace(pass.source()->msl);
  Library& lib = lib_it->second;
  if (added) lib.origin = "inline kernel source #" + std::to_string(s->inline_sources.size());
  const std::string key = lib.origin + "#" + pass.function() + "#" + pass.specialization().Key();
  auto it = s->pipelines.find(key);
  if (it != s->pipelines.end()) return it->second;
  NSDate* start = [NSDate date];
  if (!lib.attempted) {
    lib.attempted = true;
    NSError* err = nil;
    lib.library = [device newLibraryWithSource:@(pass.source()->msl.c_str()) options:CompileOptions(device) error:&err];
    if (lib.library == nil) lib.error = Describe(err);
  }
  id<MTLComputePipelineState> pipeline = nil;
  if (lib.library == nil) {
    *error = "compiling the kernel's Metal source failed: " + lib.error;
  } else {
    pipeline = MakePipeline(device, lib.library, lib, pass.function().c_str(), pass, error);
  }
  s->compile_seconds += -[start timeIntervalSinceNow];
  if (pipeline != nil) {
    s->pipelines.emplace(key, pipeline);
    s->pipeline_origin[key] = lib.origin;
  }
  return pipeline;
}

// The pipeline of a pass on `device`, trying each library variant in turn. Called outside the stream's queue.
id<MTLComputePipelineState> GetPipeline(id<MTLDevice> device, const Pass& pass, std::string* error) {
  DeviceState* s = StateFor(device);
  std::lock_guard<std::mutex> lock(s->mu);
  if (pass.source() != nullptr) return GetInlinePipeline(device, s, pass, error);
  const char* function = pass.function().c_str();
  const std::string key = pass.function() + "#" + pass.specialization().Key();
  auto it = s->pipelines.find(key);
  if (it != s->pipelines.end()) return it->second;
  NSDate* start = [NSDate date];
  std::string tried;
  auto attempt = [&](Library& lib) -> id<MTLComputePipelineState> {
    if (lib.library == nil) return nil;
    std::string e;
    id<MTLComputePipelineState> p = MakePipeline(device, lib.library, lib, function, pass, &e);
    if (p == nil) AppendError(&tried, e);
    if (p != nil) s->pipeline_origin[key] = lib.origin;
    return p;
  };
  id<MTLComputePipelineState> pipeline = nil;
  for (size_t i = 0; i < s->metallibs.size() && pipeline == nil; ++i) {
    Library& lib = s->metallibs[i];
    if (!lib.attempted) {
      lib.attempted = true;
      NSURL* url = MetallibCandidates(device)[i];
      if (Exists(url)) {
        NSError* err = nil;
        lib.library = [device newLibraryWithURL:url error:&err];
        if (lib.library == nil) AppendError(&s->errors, "loading " + lib.origin + " failed: " + Describe(err));
      }
    }
    pipeline = attempt(lib);
  }
  if (pipeline == nil) {
    const EmbeddedSource* src = SourceDefining(function);
    if (src == nullptr) {
      AppendError(&tried, std::string("no embedded source defines '") + function + "'");
    } else {
      Library& lib = s->sources[src->name];
      if (!lib.attempted) {
        lib.attempted = true;
        lib.origin = std::string("embedded source ") + src->name + " (MSL " + (UseMetal3(device) ? "3.0" : "2.4") + ")";
        NSError* err = nil;
        lib.library = [device newLibraryWithSource:@(src->source) options:CompileOptions(device) error:&err];
        if (lib.library == nil) AppendError(&s->errors, "compiling " + lib.origin + " failed: " + Describe(err));
      }
      pipeline = attempt(lib);
    }
  }
  s->compile_seconds += -[start timeIntervalSinceNow];
  if (pipeline == nil) {
    AppendError(&s->errors, tried);
    *error = std::string("no Metal pipeline for '") + function + "': " + tried +
             (s->errors.empty() || s->errors == tried ? "" : "; " + s->errors);
    return nil;
  }
  s->pipelines.emplace(key, pipeline);
  return pipeline;
}

// ---- The stream ---------------------------------------------------------------------------------------------
id<TFMOMetalStream> GetStream(TF_OpKernelContext* ctx, std::string* error) {
  Status status;
  SP_Stream sp = TF_GetStream(ctx, status);
  if (!status.ok() || sp == nullptr) {
    *error = std::string("tf_metal_ops: this GPU kernel got no device stream (TF_GetStream: ") +
             (status.ok() ? "returned null" : status.message()) + "); Metal kernels need tensorflow-metal's GPU device";
    return nil;
  }
  std::string why;
  if (!LooksLikeObject(sp, &why)) {
    *error = "tf_metal_ops: the GPU device's stream is not an Objective-C object (" + why + "), so the GPU plugin is "
             "not tensorflow-metal; tf_metal_ops' Metal kernels need tensorflow-metal's stream protocol (if it is "
             "tensorflow-metal, TF_METAL_OPS_SKIP_OBJECT_CHECK=1 skips this check; please report it)";
    return nil;
  }
  id obj = (__bridge id)(void*)sp;
  const void* cls = (__bridge const void*)object_getClass(obj);
  std::string missing;
  {
    ClassCache& c = Classes();
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.stream_missing.find(cls);
    if (it == c.stream_missing.end()) {
      std::string m;
      const std::pair<SEL, const char*> needed[] = {
          {@selector(queue), "-queue"},
          {@selector(currentCommandBuffer), "-currentCommandBuffer"},
          {@selector(commit), "-commit"},
      };
      for (const auto& [sel, label] : needed)
        if (![obj respondsToSelector:sel]) m += (m.empty() ? "" : ", ") + std::string(label);
      it = c.stream_missing.emplace(cls, m).first;
    }
    missing = it->second;
  }
  if (!missing.empty()) {
    *error = "tf_metal_ops: the GPU device's stream (class " + std::string(object_getClassName(obj)) + ") lacks " +
             missing + ": the GPU plugin is not tensorflow-metal or is an incompatible version of it";
    return nil;
  }
  return (id<TFMOMetalStream>)obj;
}

// The MTLBuffer behind a tensor bound to a pass, or nil with a message.
id<MTLBuffer> BufferOf(const Binding& b, uint32_t slot, std::string* error) {
  void* data = TF_TensorData(b.tensor);
  std::string why;
  id obj = LooksLikeObject(data, &why) ? (__bridge id)data : nil;
  bool is_buffer = false;
  if (obj != nil) {
    const void* cls = (__bridge const void*)object_getClass(obj);
    ClassCache& c = Classes();
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.is_buffer.find(cls);
    if (it == c.is_buffer.end()) it = c.is_buffer.emplace(cls, [obj conformsToProtocol:@protocol(MTLBuffer)]).first;
    is_buffer = it->second;
  }
  if (!is_buffer) {
    *error = "buffer " + std::to_string(slot) +
             ": the tensor's data is not an MTLBuffer (a tensor in host memory, a slice sharing another tensor's "
             "buffer, or a GPU plugin other than tensorflow-metal): " +
             (obj != nil ? "an object of class " + ClassName(obj)
                         : why + " (if the GPU plugin is tensorflow-metal, TF_METAL_OPS_SKIP_OBJECT_CHECK=1 skips this "
                                 "check; please report it)");
    return nil;
  }
  id<MTLBuffer> buf = (id<MTLBuffer>)obj;
  if (buf.length < b.size) {
    *error = "buffer " + std::to_string(slot) + ": MTLBuffer of " + std::to_string(buf.length) +
             " bytes is smaller than its tensor (" + std::to_string(b.size) + " bytes)";
    return nil;
  }
  return buf;
}

// One pass, resolved outside the queue: pipeline, buffers and group size.
struct Resolved {
  const Pass* pass;
  id<MTLComputePipelineState> pipeline;
  id<MTLBuffer> buffers[kMaxBufferSlots];
  MTLSize grid, group;
};

bool Resolve(Call& call, std::vector<Resolved>* out, id<MTLDevice>* device, std::string* error) {
  for (const auto& p : call.passes()) {
    if (p->empty()) continue;
    Resolved r{};
    r.pass = p.get();
    for (uint32_t i = 0; i < kMaxBufferSlots; ++i) {
      const Binding& b = p->buffers()[i];
      if (b.kind != Binding::Kind::kTensor) continue;
      r.buffers[i] = BufferOf(b, i, error);
      if (r.buffers[i] == nil) return false;
      if (*device == nil) *device = r.buffers[i].device;
      if (r.buffers[i].device != *device) {
        *error = "buffer " + std::to_string(i) + " lives on another Metal device than the op's other tensors";
        return false;
      }
    }
    out->push_back(r);
  }
  if (out->empty()) return true;
  if (*device == nil) {
    *error = "no pass binds a tensor, so the Metal device is unknown";
    return false;
  }
  for (Resolved& r : *out) {
    const Pass& p = *r.pass;
    r.pipeline = GetPipeline(*device, p, error);
    if (r.pipeline == nil) return false;
    const uint32_t max = static_cast<uint32_t>(std::max<NSUInteger>(1, r.pipeline.maxTotalThreadsPerThreadgroup));
    const uint32_t width = static_cast<uint32_t>(std::max<NSUInteger>(1, r.pipeline.threadExecutionWidth));
    std::array<uint32_t, 3> g = p.group();
    const uint64_t asked = uint64_t{g[0]} * g[1] * g[2];
    if (p.source() != nullptr && asked > max) {  // an inline kernel's explicit threadgroup is never shrunk
      *error = p.function() + ": a threadgroup of " + std::to_string(asked) +
               " threads exceeds this pipeline's maximum of " + std::to_string(max);
      return false;
    }
    if (p.grid_kind() == Pass::Grid::kThreads) {
      g = ResolveGroup(p.grid(), g, max, width);
    } else if (uint64_t{g[0]} * g[1] * g[2] > max) {
      *error = p.function() + ": " + std::to_string(uint64_t{g[0]} * g[1] * g[2]) +
               " threads per group exceed this pipeline's maximum of " + std::to_string(max);
      return false;
    }
    size_t tg_total = r.pipeline.staticThreadgroupMemoryLength;  // the kernel's own threadgroup variables
    for (size_t len : p.threadgroup_lengths()) tg_total += len;
    if (tg_total > (*device).maxThreadgroupMemoryLength) {
      *error = p.function() + ": " + std::to_string(tg_total) + " bytes of threadgroup memory (" +
               std::to_string(r.pipeline.staticThreadgroupMemoryLength) + " declared in the kernel) exceed the device's " +
               std::to_string((*device).maxThreadgroupMemoryLength);
      return false;
    }
    r.grid = MTLSizeMake(p.grid()[0], p.grid()[1], p.grid()[2]);
    r.group = MTLSizeMake(g[0], g[1], g[2]);
  }
  return true;
}

void EncodePasses(id<MTLComputeCommandEncoder> enc, const std::vector<Resolved>& passes) {
  for (const Resolved& r : passes) {
    const Pass& p = *r.pass;
    [enc setComputePipelineState:r.pipeline];
    for (uint32_t i = 0; i < kMaxBufferSlots; ++i) {
      const Binding& b = p.buffers()[i];
      if (b.kind == Binding::Kind::kTensor) [enc setBuffer:r.buffers[i] offset:0 atIndex:i];
      if (b.kind == Binding::Kind::kBytes) [enc setBytes:b.data.data() length:b.data.size() atIndex:i];
      if (p.threadgroup_lengths()[i] > 0) [enc setThreadgroupMemoryLength:p.threadgroup_lengths()[i] atIndex:i];
    }
    if (p.grid_kind() == Pass::Grid::kThreads) {
      [enc dispatchThreads:r.grid threadsPerThreadgroup:r.group];
    } else {
      [enc dispatchThreadgroups:r.grid threadsPerThreadgroup:r.group];
    }
  }
}

// A pass that fails to resolve is the package's bug (TF_INTERNAL), except for a user's inline kernel source that
// does not compile or asks for more than the pipeline allows.
TF_Code ResolveFailureCode(const Call& call) {
  for (const auto& p : call.passes())
    if (p->source() != nullptr) return TF_INVALID_ARGUMENT;
  return TF_INTERNAL;
}

// ---- Completion ---------------------------------------------------------------------------------------------
// What a command buffer's completed handler saw (the handler is added before the commit), for a waiter.
struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool failed = false;
  std::string error;
};

// GPU errors of calls nobody waited for: the first unreported one fails the next call; all are counted.
std::mutex g_gpu_error_mu;
std::string* g_pending_gpu_error = new std::string();  // never freed (process-long)
std::string* g_last_gpu_error = new std::string();
uint64_t g_gpu_errors = 0;

void AddCompletionHandler(id<MTLCommandBuffer> cb, std::shared_ptr<Completion> c, bool report_async, std::string op) {
  [cb addCompletedHandler:^(id<MTLCommandBuffer> done) {
    // `done` is the command buffer that ran (an MPSCommandBuffer's root), so its status is the real one.
    const bool failed = done.status == MTLCommandBufferStatusError;
    const std::string message = failed ? op + ": the GPU command buffer failed: " + Describe(done.error) : "";
    if (failed) {
      std::lock_guard<std::mutex> lock(g_gpu_error_mu);
      ++g_gpu_errors;
      *g_last_gpu_error = message;
      if (report_async && g_pending_gpu_error->empty()) *g_pending_gpu_error = message;
    }
    {
      std::lock_guard<std::mutex> lock(c->mu);
      c->done = true;
      c->failed = failed;
      c->error = message;
    }
    c->cv.notify_all();
  }];
}

double TimeoutSeconds() {
  static const double t = [] {
    const char* v = std::getenv("TF_METAL_OPS_GPU_TIMEOUT");
    const double s = v != nullptr ? std::atof(v) : 0;
    return s > 0 ? s : 300.0;
  }();
  return t;
}

// Waits (outside the stream's queue) for the completed handler. False with *error on a GPU error or timeout.
bool WaitFor(Completion& c, TF_Code* code, std::string* error) {
  std::unique_lock<std::mutex> lock(c.mu);
  const auto limit = std::chrono::duration<double>(TimeoutSeconds());
  if (!c.cv.wait_for(lock, limit, [&] { return c.done; })) {
    *code = TF_DEADLINE_EXCEEDED;
    *error = "the GPU did not finish the command buffer within " + std::to_string(int(TimeoutSeconds())) +
             " s (TF_METAL_OPS_GPU_TIMEOUT)";
    return false;
  }
  if (c.failed) {
    *code = TF_INTERNAL;
    *error = c.error;
    return false;
  }
  return true;
}

// The first GPU error of an earlier asynchronous call, once ("" when there is none).
std::string TakePendingGpuError() {
  std::lock_guard<std::mutex> lock(g_gpu_error_mu);
  std::string e;
  e.swap(*g_pending_gpu_error);
  return e;
}

// A compute or blit encoder on a command buffer of the stream that holds no open encoder (inside the stream's
// queue). tensorflow-metal documents no promise that its current command buffer has none: an MPS-style stream may
// keep one open for its own kernels (PyTorch's MPS stream does), and a second encoder on that buffer is a
// validation failure ("A command encoder is already encoding"). So the stream's pending work is committed first:
// its commit ends any encoder of its own, and the command buffer it hands out next is fresh. The cost is one
// commit per call, of an empty buffer when the previous call was ours.
template <class Make>
id EncoderOn(id<TFMOMetalStream> stream, id<MTLCommandBuffer>* cb, Make make) {
  [stream commit];
  *cb = [stream currentCommandBuffer];
  return *cb != nil ? make(*cb) : nil;
}

// Inside the stream's queue: `passes` in one compute encoder on a command buffer of the stream (EncoderOn); the
// buffer, or nil with `*err` set when the stream gives no buffer or encoder.
id<MTLCommandBuffer> EncodeCompute(id<TFMOMetalStream> stream, const std::vector<Resolved>& passes, std::string* err) {
  id<MTLCommandBuffer> cb = nil;
  id<MTLComputeCommandEncoder> enc =
      EncoderOn(stream, &cb, [](id<MTLCommandBuffer> b) -> id { return [b computeCommandEncoder]; });
  if (enc == nil) {
    *err = cb == nil ? "the Metal stream has no current command buffer"
                     : "could not create a Metal compute command encoder";
    return nil;
  }
  EncodePasses(enc, passes);
  [enc endEncoding];
  return cb;
}

void DeleteTensors(std::vector<TF_Tensor*>* tensors) {
  for (TF_Tensor* t : *tensors) TF_DeleteTensor(t);
  tensors->clear();
}

}  // namespace

bool Execute(Call& call) {
  TF_OpKernelContext* ctx = call.ctx();
  const char* op = call.op();
  const bool wait = SyncRequested();
  TF_Code code = TF_OK;
  std::string error;
  if (std::string earlier = TakePendingGpuError(); !earlier.empty())
    return Fail(ctx, TF_INTERNAL, "tf_metal_ops: %s: an earlier GPU call failed: %s", op, earlier.c_str());
  auto completion = std::make_shared<Completion>();
  std::vector<TF_Tensor*> scratch;
  @autoreleasepool {  // TF's threads never drain a pool of their own
    @try {
      id<TFMOMetalStream> stream = GetStream(ctx, &error);
      if (stream == nil) return Fail(ctx, TF_FAILED_PRECONDITION, "%s", error.c_str());
      dispatch_queue_t queue = [stream queue];
      if (queue == nil) return Fail(ctx, TF_FAILED_PRECONDITION, "tf_metal_ops: the Metal stream has no dispatch queue");
      std::vector<Resolved> passes;
      id<MTLDevice> device = nil;
      if (!Resolve(call, &passes, &device, &error))
        return Fail(ctx, ResolveFailureCode(call), "tf_metal_ops: %s: %s", op, error.c_str());
      if (passes.empty()) return true;
      scratch = call.TakeScratch();
      std::string* err = &error;  // the block runs synchronously: stack pointers stay valid
      TF_Code* codep = &code;
      const std::vector<Resolved>* passesp = &passes;
      const std::string op_name = op;
      dispatch_sync(queue, ^{
        @autoreleasepool {
          @try {
            id<MTLCommandBuffer> cb = EncodeCompute(stream, *passesp, err);
            if (cb == nil) {
              *codep = TF_INTERNAL;
              return;
            }
            AddCompletionHandler(cb, completion, /*report_async=*/!wait, op_name);
            [stream commit];
          } @catch (NSException* e) {
            *codep = TF_INTERNAL;
            *err = "Objective-C exception " + ToString(e.name) + ": " + ToString(e.reason);
          }
        }
      });
    } @catch (NSException* e) {
      code = TF_INTERNAL;
      error = "Objective-C exception " + ToString(e.name) + ": " + ToString(e.reason);
    }
  }
  DeleteTensors(&scratch);  // encoded: the command buffer holds the buffers, later stream work is ordered after it
  if (code == TF_OK && wait) WaitFor(*completion, &code, &error);
  if (code != TF_OK) return Fail(ctx, code, "tf_metal_ops: %s: %s", op, error.c_str());
  return true;
}

// RunAndRead's backend half: the passes and a blit of the requested bytes into a shared staging buffer, in the
// stream's current command buffer, one commit; then, outside the queue, a wait for the completed handler and a copy
// out of the staging buffer. The blit (not -contents of the tensor's own buffer) works whatever the storage mode of
// tensorflow-metal's buffers. Scratch tensors stay with the Call (they may be bound again by later passes).
bool ExecuteAndRead(Call& call, const HostRead& read) {
  TF_OpKernelContext* ctx = call.ctx();
  const char* op = call.op();
  TF_Code code = TF_OK;
  std::string error;
  if (std::string earlier = TakePendingGpuError(); !earlier.empty())
    return Fail(ctx, TF_INTERNAL, "tf_metal_ops: %s: an earlier GPU call failed: %s", op, earlier.c_str());
  auto completion = std::make_shared<Completion>();
  @autoreleasepool {
    @try {
      id<TFMOMetalStream> stream = GetStream(ctx, &error);
      if (stream == nil) return Fail(ctx, TF_FAILED_PRECONDITION, "%s", error.c_str());
      dispatch_queue_t queue = [stream queue];
      if (queue == nil) return Fail(ctx, TF_FAILED_PRECONDITION, "tf_metal_ops: the Metal stream has no dispatch queue");
      Binding target;
      target.kind = Binding::Kind::kTensor;
      target.tensor = read.tensor;
      target.size = TF_TensorByteSize(read.tensor);
      id<MTLBuffer> source = BufferOf(target, 0, &error);
      if (source == nil) return Fail(ctx, TF_INTERNAL, "tf_metal_ops: %s: reading back: %s", op, error.c_str());
      std::vector<Resolved> passes;
      id<MTLDevice> device = source.device;
      if (!Resolve(call, &passes, &device, &error))
        return Fail(ctx, ResolveFailureCode(call), "tf_metal_ops: %s: %s", op, error.c_str());
      if (device != source.device)
        return Fail(ctx, TF_INTERNAL, "tf_metal_ops: %s: the read-back tensor lives on another Metal device", op);
      id<MTLBuffer> staging = [device newBufferWithLength:read.bytes options:MTLResourceStorageModeShared];
      if (staging == nil)
        return Fail(ctx, TF_RESOURCE_EXHAUSTED, "tf_metal_ops: %s: could not allocate a %zu-byte staging buffer", op,
                    read.bytes);
      std::string* err = &error;
      TF_Code* codep = &code;
      const std::vector<Resolved>* passesp = &passes;
      const NSUInteger offset = read.offset, length = read.bytes;
      const std::string op_name = op;
      dispatch_sync(queue, ^{
        @autoreleasepool {
          @try {
            id<MTLCommandBuffer> cb = nil;
            if (!passesp->empty() && (cb = EncodeCompute(stream, *passesp, err)) == nil) {
              *codep = TF_INTERNAL;
              return;
            }
            id<MTLBlitCommandEncoder> blit =
                cb != nil ? [cb blitCommandEncoder]
                          : EncoderOn(stream, &cb, [](id<MTLCommandBuffer> b) -> id { return [b blitCommandEncoder]; });
            if (blit == nil) {
              *codep = TF_INTERNAL;
              *err = cb == nil ? "the Metal stream has no current command buffer"
                               : "could not create a Metal blit command encoder";
              return;
            }
            [blit copyFromBuffer:source sourceOffset:offset toBuffer:staging destinationOffset:0 size:length];
            [blit endEncoding];
            AddCompletionHandler(cb, completion, /*report_async=*/false, op_name);
            [stream commit];
          } @catch (NSException* e) {
            *codep = TF_INTERNAL;
            *err = "Objective-C exception " + ToString(e.name) + ": " + ToString(e.reason);
          }
        }
      });
      if (code == TF_OK && WaitFor(*completion, &code, &error)) std::memcpy(read.out, staging.contents, read.bytes);
    } @catch (NSException* e) {
      code = TF_INTERNAL;
      error = "Objective-C exception " + ToString(e.name) + ": " + ToString(e.reason);
    }
  }
  if (code != TF_OK) return Fail(ctx, code, "tf_metal_ops: %s: %s", op, error.c_str());
  return true;
}

}  // namespace tfmo::gpu

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

std::string DeviceJson(id<MTLDevice> device) {
  using namespace tfmo::gpu;
  std::string families;
  const std::pair<MTLGPUFamily, const char*> known[] = {
      {MTLGPUFamilyApple7, "Apple7"}, {MTLGPUFamilyApple8, "Apple8"}, {MTLGPUFamilyMac2, "Mac2"},
      {MTLGPUFamilyCommon3, "Common3"},
  };
  for (const auto& [family, name] : known)
    if ([device supportsFamily:family]) families += std::string(families.empty() ? "" : ", ") + JsonString(name);
  if (UseMetal3(device)) families += std::string(families.empty() ? "" : ", ") + JsonString("Metal3");
  return "{\"name\": " + JsonString(ToString(device.name)) + ", \"registry_id\": " + std::to_string(device.registryID) +
         ", \"unified_memory\": " + JsonBool(device.hasUnifiedMemory) + ", \"low_power\": " +
         JsonBool(device.lowPower) + ", \"families\": [" + families + "], \"metal3\": " + JsonBool(UseMetal3(device)) +
         "}";
}

}  // namespace

// JSON for tf_metal_ops.backend_info(), read through ctypes: every Metal device (MTLCopyAllDevices: no CoreGraphics
// needed, and dual-GPU Macs list both), which one the op kernels last ran on (the stream's device), where the
// kernels came from and the errors met. Cheap: loads no library. The pointer stays valid until the calling thread's
// next call.
extern "C" __attribute__((visibility("default"))) const char* tfmo_metal_info(void) {
  using namespace tfmo::gpu;
  static thread_local std::string json;
  @autoreleasepool {
    NSArray<id<MTLDevice>>* devices = MTLCopyAllDevices();
    std::string list;
    for (id<MTLDevice> d in devices) list += std::string(list.empty() ? "" : ", ") + DeviceJson(d);
    uint64_t in_use = 0;
    DeviceState* state = nullptr;
    {
      std::lock_guard<std::mutex> lock(g_devices_mu);
      in_use = g_last_device;
      auto it = g_devices->find(in_use);
      if (it != g_devices->end()) state = it->second;
    }
    std::string origins, errors;
    double seconds = 0;
    if (state != nullptr) {  // waits if that device's library is being compiled right now
      std::lock_guard<std::mutex> lock(state->mu);
      for (const auto& [key, origin] : state->pipeline_origin)
        if (origins.find(JsonString(origin)) == std::string::npos)
          origins += std::string(origins.empty() ? "" : ", ") + JsonString(origin);
      errors = state->errors;
      seconds = state->compile_seconds;
    }
    id<MTLDevice> first = devices.count > 0 ? devices[0] : nil;
    std::string candidates;
    for (NSURL* url : MetallibCandidates(first)) {
      candidates += std::string(candidates.empty() ? "" : ", ") + "{\"path\": " + JsonString(ToString(url.path)) +
                    ", \"exists\": " + JsonBool(Exists(url)) + "}";
    }
    uint64_t gpu_errors = 0;
    std::string last_gpu_error;
    {
      std::lock_guard<std::mutex> lock(g_gpu_error_mu);
      gpu_errors = g_gpu_errors;
      last_gpu_error = *g_last_gpu_error;
    }
    NSURL* dir = LibraryDirectory();
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.3f", seconds);
    json = std::string("{\"device_available\": ") + JsonBool(devices.count > 0) + ", \"devices\": [" + list + "]" +
           ", \"device_in_use\": " + (in_use ? std::to_string(in_use) : "null") +
           ", \"os\": " + JsonString(ToString([[NSProcessInfo processInfo] operatingSystemVersionString])) +
           ", \"sync\": " + JsonBool(SyncRequested()) + ", \"gpu_errors\": " + std::to_string(gpu_errors) +
           ", \"last_gpu_error\": " + (last_gpu_error.empty() ? "null" : JsonString(last_gpu_error)) +
           ", \"library\": {\"origins\": [" + origins + "]" +
           ", \"compile_seconds\": " + secs +
           ", \"error\": " + (errors.empty() ? "null" : JsonString(errors)) +
           ", \"directory\": " + (dir ? JsonString(ToString(dir.path)) : "null") +
           ", \"metallib_candidates\": [" + candidates + "]" +
           ", \"embedded_sources\": " + std::to_string(NumEmbeddedSources()) + "}}";
  }
  return json.c_str();
}
