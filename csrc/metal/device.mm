// The Metal backend's device part (device.h): library loading and the pipeline cache, per MTLDevice.
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpu/gpu_host.h"
#include "metal/device.h"
#include "metal/embedded_sources.h"
#include "metal/objc_util.h"

namespace tfmo::metal {
namespace {

using gpu::Pass;
using gpu::Specialization;

constexpr const char* kMetallibName = "tf_metal_ops.metallib";                // MSL 2.4, macOS 12+
constexpr const char* kMetal3MetallibName = "tf_metal_ops.metal3.metallib";  // MSL 3.0, Metal 3 GPUs

bool ForceSource() {
  static const bool force = EnvIs("TF_METAL_OPS_FORCE_SOURCE", "1");
  return force;
}

// The embedded source file that defines kernel `function` ("void <function>(" in its text), or null.
// The embedded source that defines kernel `function`: a plain kernel's `void function(`, or the string literal
// "function", the [[host_name("function")]] of a kernel template's instantiation (written out, or an instantiation
// macro's argument).
const EmbeddedSource* SourceDefining(const char* function) {
  const std::string plain = std::string("void ") + function + "(";
  const std::string named = std::string("\"") + function + "\"";
  for (const EmbeddedSource* e = kEmbeddedMetalSources; e->source != nullptr; ++e)
    if (std::strstr(e->source, plain.c_str()) != nullptr || std::strstr(e->source, named.c_str()) != nullptr) return e;
  return nullptr;
}

MTLCompileOptions* CompileOptions(id<MTLDevice> device) {
  MTLCompileOptions* options = [MTLCompileOptions new];
  options.fastMathEnabled = NO;  // IEEE NaN/inf semantics (device.h)
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
  NSURL* url = nil;         // metallibs: the file
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
      lib.url = url;
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

}  // namespace

bool UseMetal3(id<MTLDevice> device) {
  if (@available(macOS 13.0, *)) return device != nil && [device supportsFamily:MTLGPUFamilyMetal3];
  return false;
}

NSURL* LibraryDirectory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<const void*>(&gpu::Execute), &info) == 0 || info.dli_fname == nullptr) return nil;
  NSString* path = [[NSFileManager defaultManager] stringWithFileSystemRepresentation:info.dli_fname
                                                                               length:std::strlen(info.dli_fname)];
  if (path == nil) return nil;
  return [[[NSURL fileURLWithPath:path] URLByResolvingSymlinksInPath] URLByDeletingLastPathComponent];
}

std::vector<NSURL*> MetallibCandidates(id<MTLDevice> device) {
  std::vector<NSURL*> out;
  NSURL* dir = LibraryDirectory();
  if (dir == nil || ForceSource()) return out;
  if (device == nil || UseMetal3(device)) out.push_back([dir URLByAppendingPathComponent:@(kMetal3MetallibName)]);
  out.push_back([dir URLByAppendingPathComponent:@(kMetallibName)]);
  return out;
}

bool FileExists(NSURL* url) { return [[NSFileManager defaultManager] fileExistsAtPath:url.path]; }

size_t NumEmbeddedSources() {
  size_t n = 0;
  while (kEmbeddedMetalSources[n].source != nullptr) ++n;
  return n;
}

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
      if (FileExists(lib.url)) {
        NSError* err = nil;
        lib.library = [device newLibraryWithURL:lib.url error:&err];
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

DeviceReport LastDeviceReport() {
  DeviceReport report;
  DeviceState* state = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_devices_mu);
    report.registry_id = g_last_device;
    auto it = g_devices->find(g_last_device);
    if (it != g_devices->end()) state = it->second;
  }
  if (state == nullptr) return report;
  std::lock_guard<std::mutex> lock(state->mu);
  for (const auto& [key, origin] : state->pipeline_origin)
    if (std::find(report.origins.begin(), report.origins.end(), origin) == report.origins.end())
      report.origins.push_back(origin);
  report.errors = state->errors;
  report.compile_seconds = state->compile_seconds;
  return report;
}

}  // namespace tfmo::metal
