// The Metal backend's stream part (stream.h): TF_GetStream, TF_TensorData and the object checks before messaging them.
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>
#import <objc/runtime.h>

#include <malloc/malloc.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "gpu/gpu_host.h"
#include "metal/objc_util.h"
#include "metal/stream.h"

namespace tfmo::metal {
namespace {

// ---- Is an opaque pointer an Objective-C object? ---------------------------------------------------------
// The pointer must be the start of a heap block (malloc_zone_from_ptr is defined for any pointer) large enough for
// an isa, and its class must be a registered one (compared by address against the runtime's class list). Verdicts
// are cached per class: registered classes, and per class whether it has the stream selectors / conforms to
// MTLBuffer.
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

}  // namespace

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
          {@selector(commitAndWait), "-commitAndWait"},
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

id<MTLBuffer> BufferOf(const gpu::Binding& b, uint32_t slot, std::string* error) {
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

}  // namespace tfmo::metal
