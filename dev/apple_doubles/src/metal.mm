// Test double of Apple's Metal framework for Linux (declared by dev/apple_doubles/include/Metal/Metal.h), written from
// Apple's documentation. It executes what it is given on the CPU and asserts the rules Apple's validation layer
// enforces; a broken rule ends the process like the validation layer does ("failed assertion `...`"), because a
// program that breaks one has undefined behaviour on a real GPU.
//
//  - Device: one, "Apple M2 (tf-metal-ops Apple doubles)", unified memory, families Apple7/8, Mac2, Common3 and
//    Metal3 (TFMO_MOCK_METAL_NO_METAL3=1 drops Metal3: an MSL 2.4-only GPU), 32 KiB threadgroup memory.
//    Pipelines: 1024 threads per group at most (TFMO_MOCK_METAL_MAX_THREADS lowers it), no threadgroup memory of
//    their own (TFMO_MOCK_METAL_STATIC_TG_BYTES sets staticThreadgroupMemoryLength).
//    TFMO_MOCK_METAL_METALLIB_UNLOADABLE=1: every metallib fails to load ("Invalid library file"), as one built
//    for a newer macOS does, so the backend must compile its embedded sources.
//  - Libraries: the package's kernels exist precompiled (the msl_emu kernel table linked into this library). A
//    "metallib" of this double is a text file "TFMO-MOCK-METALLIB 1" naming table kernels. newLibraryWithSource:
//    binds a source identical to one of the package's embedded sources to the table; any other source is compiled
//    at run time through msl_emu by the compiler registered with tfmo_set_inline_compiler (an inline kernel), which
//    runs the strict Metal-language check first (what Apple's compiler rejects fails here too) and, as this double
//    compiles for the CPU, asks for the user's consent to a source loaded from a graph.
//    MTLCompileOptions are honoured (nil: Apple's defaults, fastMathEnabled YES and MSL 3.0): fast math compiles
//    with clang's -ffast-math (finite-math-only, reassociation), so a kernel that relies on NaN/inf or evaluation
//    order answers differently, as on a Mac; the language version sets __METAL_VERSION__ and the strict
//    Metal-language check, so a source needing a newer MSL than the options allow fails to compile. The
//    precompiled sources exist with IEEE semantics only: asked for fast math, the double stops.
//  - Command buffers run on one GPU thread in commit order. Completion: status and error are set, waiters are woken,
//    then the completed handlers run on the GPU thread (Apple documents no order between the two).
//  - A kernel failure (the emulated kernel's binding contract, an out-of-bounds access of a bounds-checked inline
//    kernel) ends the command buffer in MTLCommandBufferStatusError with an NSError, like a GPU fault.
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>
#import <objc/runtime.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/inline_kernel_abi.h"
#include "emulated_gpu/kernel_launch.h"
#include "metal/embedded_sources.h"

#define TFMO_MOCK_EXPORT extern "C" __attribute__((visibility("default")))

NSErrorDomain const MTLLibraryErrorDomain = @"MTLLibraryErrorDomain";
NSErrorDomain const MTLCommandBufferErrorDomain = @"MTLCommandBufferErrorDomain";

namespace {

constexpr NSUInteger kMaxBytes = 4096;              // setBytes: "data smaller than 4 KB"
constexpr NSUInteger kMaxBufferIndex = 30;          // argument table: indices 0..30
constexpr NSUInteger kMaxThreadgroupMemory = 32768;
constexpr NSUInteger kMaxThreads = 1024;            // maxTotalThreadsPerThreadgroup of every pipeline here
constexpr NSUInteger kExecutionWidth = 32;
constexpr const char* kMetallibMagic = "TFMO-MOCK-METALLIB 1";

[[noreturn]] __attribute__((format(printf, 2, 3))) void Violation(const char* where, const char* fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "-[%s] failed assertion `%s' (tf-metal-ops Apple doubles: a rule Apple's validation layer enforces)\n",
          where, msg);
  fflush(stderr);
  abort();
}

NSError* MakeError(NSErrorDomain domain, NSInteger code, const std::string& message) {
  return [NSError errorWithDomain:domain
                             code:code
                         userInfo:@{NSLocalizedDescriptionKey : [NSString stringWithUTF8String:message.c_str()]}];
}

std::string Str(NSString* s) { return s ? std::string(s.UTF8String) : std::string(); }

thread_local bool t_on_gpu_thread = false;

NSUInteger EnvCount(const char* name, NSUInteger fallback) {
  const char* v = getenv(name);
  return v != nullptr && *v != '\0' ? NSUInteger(strtoull(v, nullptr, 10)) : fallback;
}
// A pipeline's maximum threads per group is the kernel's, as compiled (register use lowers it below 1024);
// TFMO_MOCK_METAL_MAX_THREADS sets it for every pipeline.
NSUInteger PipelineMaxThreads() {
  static const NSUInteger n = std::max<NSUInteger>(1, std::min(kMaxThreads, EnvCount("TFMO_MOCK_METAL_MAX_THREADS", kMaxThreads)));
  return n;
}
// Threadgroup variables a kernel declares count against the 32 KiB with the lengths set on the encoder; the
// emulated kernels declare none the double can see, TFMO_MOCK_METAL_STATIC_TG_BYTES sets it for every pipeline.
NSUInteger StaticThreadgroupBytes() {
  static const NSUInteger n = EnvCount("TFMO_MOCK_METAL_STATIC_TG_BYTES", 0);
  return n;
}

// ---- the inline compiler (msl_emu) ----------------------------------------------------------------------------
std::mutex g_compiler_mu;
TfmoInlineCompiler g_compiler = nullptr;

bool BoundsChecked() {
  const char* v = getenv("TF_METAL_OPS_BOUNDS_CHECK");
  return v == nullptr || strcmp(v, "0") != 0;
}

}  // namespace

// ---- resources ---------------------------------------------------------------------------------------------
@interface TFMOMockDevice : NSObject <MTLDevice>
@end

@interface TFMOMockBuffer : NSObject <MTLBuffer> {
 @public
  void* _data;
  NSUInteger _length;
  MTLStorageMode _mode;
}
@property (nullable, copy, atomic) NSString* label;
@end

@implementation TFMOMockBuffer
@synthesize label;
- (id<MTLDevice>)device { return MTLCreateSystemDefaultDevice(); }
- (MTLStorageMode)storageMode { return _mode; }
- (NSUInteger)length { return _length; }
- (void*)contents {
  // Apple: "the contents of a private buffer are not accessible to the CPU" (contents returns NULL).
  return _mode == MTLStorageModePrivate ? nullptr : _data;
}
- (void)dealloc { free(_data); }
@end

@implementation MTLFunctionConstantValues {
 @public
  std::map<NSUInteger, tfmo::emu::ConstantValue> _values;
}
- (void)setConstantValue:(const void*)value type:(MTLDataType)type atIndex:(NSUInteger)index {
  tfmo::emu::ConstantValue c;
  c.index = uint32_t(index);
  switch (type) {
    case MTLDataTypeBool: c.type = 'b'; c.bits = *static_cast<const bool*>(value) ? 1u : 0u; break;
    case MTLDataTypeInt: c.type = 'i'; memcpy(&c.bits, value, 4); break;
    case MTLDataTypeUInt: c.type = 'u'; memcpy(&c.bits, value, 4); break;
    case MTLDataTypeFloat: c.type = 'f'; memcpy(&c.bits, value, 4); break;
    default: Violation("MTLFunctionConstantValues setConstantValue:type:atIndex:", "type %lu is not a type this double models",
                       (unsigned long)type);
  }
  _values[index] = c;
}
- (void)reset { _values.clear(); }
- (id)copyWithZone:(NSZone*)zone {
  MTLFunctionConstantValues* c = [MTLFunctionConstantValues new];
  c->_values = _values;
  return c;
}
@end

@implementation MTLCompileOptions
@synthesize preprocessorMacros, fastMathEnabled, languageVersion;
- (instancetype)init {
  if ((self = [super init])) {
    fastMathEnabled = YES;  // Apple: "fastMathEnabled defaults to YES"
    languageVersion = MTLLanguageVersion3_0;
  }
  return self;
}
- (id)copyWithZone:(NSZone*)zone {
  MTLCompileOptions* c = [MTLCompileOptions new];
  c.fastMathEnabled = fastMathEnabled;
  c.languageVersion = languageVersion;
  c.preprocessorMacros = preprocessorMacros;
  return c;
}
@end

// A library: kernels of the precompiled table, or one compiled inline-kernel library.
@interface TFMOMockLibrary : NSObject <MTLLibrary> {
 @public
  std::vector<std::string> _names;
  TfmoInlineKernelEntry _entry;  // non-null: compiled at run time
}
@property (nullable, copy, atomic) NSString* label;
@end

@interface TFMOMockFunction : NSObject <MTLFunction> {
 @public
  std::string _name;
  const TfmoInlineKernel* _inline;  // null: a table kernel
  std::vector<tfmo::emu::ConstantValue> _constants;
}
@property (nullable, copy, atomic) NSString* label;
@end

@implementation TFMOMockFunction
@synthesize label;
- (id<MTLDevice>)device { return MTLCreateSystemDefaultDevice(); }
- (NSString*)name { return [NSString stringWithUTF8String:_name.c_str()]; }
@end

@implementation TFMOMockLibrary
@synthesize label;
- (id<MTLDevice>)device { return MTLCreateSystemDefaultDevice(); }
- (NSArray<NSString*>*)functionNames {
  NSMutableArray* a = [NSMutableArray array];
  for (const std::string& n : _names) [a addObject:[NSString stringWithUTF8String:n.c_str()]];
  return a;
}
- (BOOL)has:(const std::string&)name {
  return std::find(_names.begin(), _names.end(), name) != _names.end();
}
- (nullable id<MTLFunction>)newFunctionWithName:(NSString*)functionName {
  NSError* error = nil;
  return [self newFunctionWithName:functionName constantValues:[MTLFunctionConstantValues new] error:&error];
}
- (nullable id<MTLFunction>)newFunctionWithName:(NSString*)name
                                 constantValues:(MTLFunctionConstantValues*)constantValues
                                          error:(__autoreleasing NSError**)error {
  const std::string n = Str(name);
  if (![self has:n]) {
    if (error) *error = MakeError(MTLLibraryErrorDomain, MTLLibraryErrorFunctionNotFound, "Function " + n + " was not found in the library");
    return nil;
  }
  TFMOMockFunction* f = [TFMOMockFunction new];
  f->_name = n;
  for (const auto& [index, c] : constantValues->_values) f->_constants.push_back(c);
  if (_entry != nullptr) {
    f->_inline = _entry(n.c_str());
    if (f->_inline == nullptr) {
      if (error) *error = MakeError(MTLLibraryErrorDomain, MTLLibraryErrorFunctionNotFound, "Function " + n + " was not found in the library");
      return nil;
    }
    if (!f->_constants.empty()) {
      if (error) *error = MakeError(MTLLibraryErrorDomain, MTLLibraryErrorFunctionNotFound, "Function " + n + " declares no function constants");
      return nil;
    }
    return f;
  }
  // Apple: a constant value of the wrong type, or a missing value of a constant without a default, is an error.
  const std::string e = tfmo::emu::CheckConstants(n.c_str(), f->_constants);
  if (!e.empty()) {
    if (error) *error = MakeError(MTLLibraryErrorDomain, MTLLibraryErrorFunctionNotFound, "Function constants: " + e);
    return nil;
  }
  return f;
}
@end

@interface TFMOMockPipeline : NSObject <MTLComputePipelineState> {
 @public
  TFMOMockFunction* _function;
}
@end

@implementation TFMOMockPipeline
- (NSString*)label { return nil; }
- (id<MTLDevice>)device { return MTLCreateSystemDefaultDevice(); }
- (NSUInteger)maxTotalThreadsPerThreadgroup { return PipelineMaxThreads(); }
- (NSUInteger)threadExecutionWidth { return kExecutionWidth; }
- (NSUInteger)staticThreadgroupMemoryLength { return StaticThreadgroupBytes(); }
@end

// ---- commands ------------------------------------------------------------------------------------------------
namespace {

struct Command {
  enum class Kind { kDispatch, kCopy } kind = Kind::kDispatch;
  // dispatch
  TFMOMockPipeline* pipeline = nil;
  TFMOMockBuffer* buffers[kMaxBufferIndex + 1] = {};
  NSUInteger offsets[kMaxBufferIndex + 1] = {};
  std::vector<unsigned char> bytes[kMaxBufferIndex + 1];
  bool has_bytes[kMaxBufferIndex + 1] = {};
  NSUInteger tg_lengths[kMaxBufferIndex + 1] = {};
  bool threadgroups = false;
  MTLSize grid{}, group{};
  // copy
  TFMOMockBuffer* src = nil;
  TFMOMockBuffer* dst = nil;
  NSUInteger src_offset = 0, dst_offset = 0, size = 0;
};

std::mutex g_counts_mu;
std::map<std::string, uint64_t>* g_counts = new std::map<std::string, uint64_t>();  // never freed

void CountDispatch(const std::string& kernel) {
  std::lock_guard<std::mutex> l(g_counts_mu);
  ++(*g_counts)[kernel];
}

void SerialFor(int64_t n, int64_t grain, TfmoRangeFn fn, void* arg) { fn(arg, 0, n); }

std::string RunDispatch(Command& c) {
  TFMOMockFunction* f = c.pipeline->_function;
  void* data[kMaxBufferIndex + 1] = {};
  size_t sizes[kMaxBufferIndex + 1] = {};
  // setBytes data, copied to 16-byte aligned storage as a GPU argument buffer would be
  std::vector<std::unique_ptr<unsigned char[], void (*)(void*)>> owned;
  for (NSUInteger i = 0; i <= kMaxBufferIndex; ++i) {
    if (c.buffers[i] != nil) {
      data[i] = static_cast<char*>(c.buffers[i]->_data) + c.offsets[i];
      sizes[i] = c.buffers[i]->_length - c.offsets[i];
    } else if (c.has_bytes[i]) {
      void* p = nullptr;
      if (posix_memalign(&p, 16, std::max<size_t>(16, c.bytes[i].size())) != 0) return "out of memory";
      memcpy(p, c.bytes[i].data(), c.bytes[i].size());
      owned.emplace_back(static_cast<unsigned char*>(p), free);
      data[i] = p;
      sizes[i] = c.bytes[i].size();
    }
  }
  tfmo::emu::LaunchDesc d;
  d.kernel = f->_name.c_str();
  d.untyped_buffers = true;
  d.persistent_argument_table = true;
  for (NSUInteger i = 0; i <= kMaxBufferIndex; ++i) {
    if (c.buffers[i] != nil) {
      d.buffers[i].kind = tfmo::emu::SlotBinding::Kind::kBuffer;
    } else if (c.has_bytes[i]) {
      d.buffers[i].kind = tfmo::emu::SlotBinding::Kind::kBytes;
    } else {
      continue;
    }
    d.buffers[i].bytes = sizes[i];
    d.buffers[i].data = data[i];
    d.threadgroup_memory[i] = c.tg_lengths[i];
  }
  for (NSUInteger i = 0; i <= kMaxBufferIndex; ++i) d.threadgroup_memory[i] = c.tg_lengths[i];
  d.constants = f->_constants;
  d.threadgroups = c.threadgroups;
  d.grid[0] = c.grid.width, d.grid[1] = c.grid.height, d.grid[2] = c.grid.depth;
  d.group[0] = uint32_t(c.group.width), d.group[1] = uint32_t(c.group.height), d.group[2] = uint32_t(c.group.depth);
  if (f->_inline == nullptr) return tfmo::emu::Launch(d);

  char error[1024] = {0};
  if (f->_inline->check(&d, error, sizeof error) != 0) return error;
  TfmoInlineLaunch l{};
  for (NSUInteger i = 0; i <= kMaxBufferIndex; ++i) {
    l.slots[i] = data[i];
    l.slot_bytes[i] = sizes[i];
  }
  for (int k = 0; k < 3; ++k) {
    l.grid[k] = uint32_t(d.grid[k]) * (c.threadgroups ? d.group[k] : 1u);
    l.group[k] = d.group[k];
  }
  l.parallel_for = SerialFor;
  if (f->_inline->run(&l, error, sizeof error) != 0) return error;
  return "";
}

}  // namespace

// ---- encoders -----------------------------------------------------------------------------------------------
@class TFMOMockCommandBuffer;

@interface TFMOMockCommandBuffer : NSObject <MTLCommandBuffer> {
 @public
  std::mutex _mu;
  std::condition_variable _cv;
  std::vector<Command> _commands;
  std::vector<MTLCommandBufferHandler> _completed;
  std::vector<MTLCommandBufferHandler> _scheduled;
  MTLCommandBufferStatus _status;
  NSError* _error;
  id _openEncoder;  // the encoder that has not ended yet, or nil
  id<MTLCommandQueue> _queue;
}
@property (nullable, copy, atomic) NSString* label;
- (void)encoderEnded:(id)encoder;
- (void)append:(Command&&)c;
- (void)execute;
@end

@interface TFMOMockComputeEncoder : NSObject <MTLComputeCommandEncoder> {
 @public
  TFMOMockCommandBuffer* _cb;
  bool _ended;
  Command _state;  // bindings carry over between dispatches, as in Metal's argument table
}
@property (nullable, copy, atomic) NSString* label;
@end

@implementation TFMOMockComputeEncoder
@synthesize label;
- (id<MTLDevice>)device { return MTLCreateSystemDefaultDevice(); }
- (void)live:(const char*)what {
  if (_ended) Violation(what, "Command encoder released or ended: encoding after endEncoding");
}
- (void)index:(NSUInteger)index what:(const char*)what {
  if (index > kMaxBufferIndex) Violation(what, "index(%lu) must be < 31", (unsigned long)index);
}
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state {
  [self live:"MTLComputeCommandEncoder setComputePipelineState:"];
  if (state == nil) Violation("MTLComputeCommandEncoder setComputePipelineState:", "state must not be nil");
  _state.pipeline = (TFMOMockPipeline*)state;
}
- (void)setBytes:(const void*)bytes length:(NSUInteger)length atIndex:(NSUInteger)index {
  const char* w = "MTLComputeCommandEncoder setBytes:length:atIndex:";
  [self live:w];
  [self index:index what:w];
  if (length == 0) Violation(w, "length(0) must be > 0");
  if (length > kMaxBytes) Violation(w, "length(%lu) must be <= 4096 (use a buffer for larger data)", (unsigned long)length);
  if (bytes == nullptr) Violation(w, "bytes must not be NULL");
  _state.buffers[index] = nil;
  _state.offsets[index] = 0;
  _state.bytes[index].assign(static_cast<const unsigned char*>(bytes), static_cast<const unsigned char*>(bytes) + length);
  _state.has_bytes[index] = true;
}
- (void)setBuffer:(nullable id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index {
  const char* w = "MTLComputeCommandEncoder setBuffer:offset:atIndex:";
  [self live:w];
  [self index:index what:w];
  if (buffer != nil) {
    if (offset >= buffer.length) Violation(w, "offset(%lu) must be < [buffer length](%lu)", (unsigned long)offset, (unsigned long)buffer.length);
    if (offset % 4 != 0) Violation(w, "offset(%lu) must be a multiple of 4 bytes", (unsigned long)offset);
  }
  _state.buffers[index] = (TFMOMockBuffer*)buffer;
  _state.offsets[index] = offset;
  _state.has_bytes[index] = false;
  _state.bytes[index].clear();
}
- (void)setThreadgroupMemoryLength:(NSUInteger)length atIndex:(NSUInteger)index {
  const char* w = "MTLComputeCommandEncoder setThreadgroupMemoryLength:atIndex:";
  [self live:w];
  [self index:index what:w];
  if (length % 16 != 0) Violation(w, "length(%lu) must be a multiple of 16 bytes", (unsigned long)length);
  if (length > kMaxThreadgroupMemory) Violation(w, "length(%lu) must be <= 32768", (unsigned long)length);
  _state.tg_lengths[index] = length;
}
- (void)dispatch:(MTLSize)grid group:(MTLSize)group threadgroups:(bool)tg what:(const char*)w {
  [self live:w];
  if (_state.pipeline == nil) Violation(w, "No compute pipeline state set");
  if (grid.width == 0 || grid.height == 0 || grid.depth == 0)
    Violation(w, "%s(%lu, %lu, %lu) must not have a zero dimension", tg ? "threadgroupsPerGrid" : "threadsPerGrid",
              (unsigned long)grid.width, (unsigned long)grid.height, (unsigned long)grid.depth);
  if (group.width == 0 || group.height == 0 || group.depth == 0)
    Violation(w, "threadsPerThreadgroup(%lu, %lu, %lu) must not have a zero dimension", (unsigned long)group.width,
              (unsigned long)group.height, (unsigned long)group.depth);
  const NSUInteger threads = group.width * group.height * group.depth;
  if (threads > _state.pipeline.maxTotalThreadsPerThreadgroup)
    Violation(w, "(threadsPerThreadgroup.width(%lu) * threadsPerThreadgroup.height(%lu) * threadsPerThreadgroup.depth(%lu))(%lu) "
              "must be <= %lu (maxTotalThreadsPerThreadgroup)", (unsigned long)group.width, (unsigned long)group.height,
              (unsigned long)group.depth, (unsigned long)threads, (unsigned long)_state.pipeline.maxTotalThreadsPerThreadgroup);
  NSUInteger tg_total = _state.pipeline.staticThreadgroupMemoryLength;
  for (NSUInteger len : _state.tg_lengths) tg_total += len;
  if (tg_total > kMaxThreadgroupMemory)
    Violation(w, "Threadgroup memory size (%lu) exceeds the maximum threadgroup memory allowed (32768)", (unsigned long)tg_total);
  Command c;
  c.kind = Command::Kind::kDispatch;
  c.pipeline = _state.pipeline;
  for (NSUInteger i = 0; i <= kMaxBufferIndex; ++i) {
    c.buffers[i] = _state.buffers[i];
    c.offsets[i] = _state.offsets[i];
    c.bytes[i] = _state.bytes[i];
    c.has_bytes[i] = _state.has_bytes[i];
    c.tg_lengths[i] = _state.tg_lengths[i];
  }
  c.threadgroups = tg;
  c.grid = grid;
  c.group = group;
  [_cb append:std::move(c)];
}
- (void)dispatchThreadgroups:(MTLSize)threadgroupsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup {
  [self dispatch:threadgroupsPerGrid group:threadsPerThreadgroup threadgroups:true
            what:"MTLComputeCommandEncoder dispatchThreadgroups:threadsPerThreadgroup:"];
}
- (void)dispatchThreads:(MTLSize)threadsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup {
  [self dispatch:threadsPerGrid group:threadsPerThreadgroup threadgroups:false
            what:"MTLComputeCommandEncoder dispatchThreads:threadsPerThreadgroup:"];
}
- (void)endEncoding {
  [self live:"MTLComputeCommandEncoder endEncoding"];
  _ended = true;
  [_cb encoderEnded:self];
}
- (void)dealloc {
  if (!_ended) Violation("MTLComputeCommandEncoder dealloc", "Command encoder released without endEncoding");
}
@end

@interface TFMOMockBlitEncoder : NSObject <MTLBlitCommandEncoder> {
 @public
  TFMOMockCommandBuffer* _cb;
  bool _ended;
}
@property (nullable, copy, atomic) NSString* label;
@end

@implementation TFMOMockBlitEncoder
@synthesize label;
- (id<MTLDevice>)device { return MTLCreateSystemDefaultDevice(); }
- (void)copyFromBuffer:(id<MTLBuffer>)sourceBuffer
          sourceOffset:(NSUInteger)sourceOffset
              toBuffer:(id<MTLBuffer>)destinationBuffer
     destinationOffset:(NSUInteger)destinationOffset
                  size:(NSUInteger)size {
  const char* w = "MTLBlitCommandEncoder copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:";
  if (_ended) Violation(w, "encoding after endEncoding");
  if (sourceBuffer == nil || destinationBuffer == nil) Violation(w, "buffers must not be nil");
  // Apple (macOS): "sourceOffset, destinationOffset and size must be a multiple of 4".
  if (sourceOffset % 4 || destinationOffset % 4 || size % 4)
    Violation(w, "sourceOffset(%lu), destinationOffset(%lu) and size(%lu) must be multiples of 4 bytes on macOS",
              (unsigned long)sourceOffset, (unsigned long)destinationOffset, (unsigned long)size);
  if (size == 0) Violation(w, "size(0) must be > 0");
  if (sourceOffset + size > sourceBuffer.length)
    Violation(w, "(sourceOffset + size)(%lu) must be <= [sourceBuffer length](%lu)", (unsigned long)(sourceOffset + size),
              (unsigned long)sourceBuffer.length);
  if (destinationOffset + size > destinationBuffer.length)
    Violation(w, "(destinationOffset + size)(%lu) must be <= [destinationBuffer length](%lu)",
              (unsigned long)(destinationOffset + size), (unsigned long)destinationBuffer.length);
  Command c;
  c.kind = Command::Kind::kCopy;
  c.src = (TFMOMockBuffer*)sourceBuffer;
  c.dst = (TFMOMockBuffer*)destinationBuffer;
  c.src_offset = sourceOffset;
  c.dst_offset = destinationOffset;
  c.size = size;
  [_cb append:std::move(c)];
}
- (void)endEncoding {
  if (_ended) Violation("MTLBlitCommandEncoder endEncoding", "endEncoding called twice");
  _ended = true;
  [_cb encoderEnded:self];
}
- (void)dealloc {
  if (!_ended) Violation("MTLBlitCommandEncoder dealloc", "Command encoder released without endEncoding");
}
@end

// ---- the GPU: one thread running committed command buffers in order --------------------------------------------
namespace {

struct Gpu {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<TFMOMockCommandBuffer*> queue;  // strong references (ARC in a C++ container under -fobjc-arc)
  uint64_t committed = 0, completed = 0;
  std::thread thread;
};

Gpu& TheGpu() {
  static Gpu* g = [] {
    Gpu* g = new Gpu();  // never freed: the thread runs for the process
    g->thread = std::thread([g] {
      t_on_gpu_thread = true;
      for (;;) {
        TFMOMockCommandBuffer* cb = nil;
        {
          std::unique_lock<std::mutex> l(g->mu);
          g->cv.wait(l, [g] { return !g->queue.empty(); });
          cb = g->queue.front();
          g->queue.pop_front();
        }
        @autoreleasepool {
          [cb execute];
        }
        cb = nil;
        {
          std::lock_guard<std::mutex> l(g->mu);
          ++g->completed;
        }
        g->cv.notify_all();
      }
    });
    g->thread.detach();
    return g;
  }();
  return *g;
}

}  // namespace

@implementation TFMOMockCommandBuffer
@synthesize label;
- (id<MTLDevice>)device { return MTLCreateSystemDefaultDevice(); }
- (id<MTLCommandQueue>)commandQueue { return _queue; }
- (void)append:(Command&&)c {
  std::lock_guard<std::mutex> l(_mu);
  _commands.push_back(std::move(c));
}
- (void)encoderEnded:(id)encoder {
  std::lock_guard<std::mutex> l(_mu);
  if (_openEncoder == encoder) _openEncoder = nil;
}
- (id)newEncoder:(bool)compute {
  const char* w = compute ? "MTLCommandBuffer computeCommandEncoder" : "MTLCommandBuffer blitCommandEncoder";
  std::lock_guard<std::mutex> l(_mu);
  if (_status != MTLCommandBufferStatusNotEnqueued && _status != MTLCommandBufferStatusEnqueued)
    Violation(w, "encoding into a command buffer that is already committed");
  if (_openEncoder != nil) Violation(w, "A command encoder is already encoding to this command buffer");
  id enc = nil;
  if (compute) {
    TFMOMockComputeEncoder* e = [TFMOMockComputeEncoder new];
    e->_cb = self;
    enc = e;
  } else {
    TFMOMockBlitEncoder* e = [TFMOMockBlitEncoder new];
    e->_cb = self;
    enc = e;
  }
  _openEncoder = enc;
  return enc;
}
- (nullable id<MTLComputeCommandEncoder>)computeCommandEncoder { return [self newEncoder:true]; }
- (nullable id<MTLBlitCommandEncoder>)blitCommandEncoder { return [self newEncoder:false]; }
- (void)addHandler:(MTLCommandBufferHandler)block to:(std::vector<MTLCommandBufferHandler>&)list what:(const char*)w {
  std::lock_guard<std::mutex> l(_mu);
  // Apple: handlers must be added before the command buffer is committed.
  if (_status >= MTLCommandBufferStatusCommitted) Violation(w, "Completed handler provided after commit call");
  if (block == nil) Violation(w, "block must not be nil");
  list.push_back(block);
}
- (void)addScheduledHandler:(MTLCommandBufferHandler)block {
  [self addHandler:block to:_scheduled what:"MTLCommandBuffer addScheduledHandler:"];
}
- (void)addCompletedHandler:(MTLCommandBufferHandler)block {
  [self addHandler:block to:_completed what:"MTLCommandBuffer addCompletedHandler:"];
}
- (void)enqueue {
  std::lock_guard<std::mutex> l(_mu);
  if (_status == MTLCommandBufferStatusNotEnqueued) _status = MTLCommandBufferStatusEnqueued;
}
- (void)commit {
  Gpu& g = TheGpu();
  {
    std::lock_guard<std::mutex> l(_mu);
    if (_status >= MTLCommandBufferStatusCommitted) Violation("MTLCommandBuffer commit", "commit an already committed command buffer");
    if (_openEncoder != nil) Violation("MTLCommandBuffer commit", "commit command buffer with uncommitted encoder");
    _status = MTLCommandBufferStatusCommitted;
  }
  {
    std::lock_guard<std::mutex> l(g.mu);
    g.queue.push_back(self);
    ++g.committed;
  }
  g.cv.notify_all();
}
- (void)execute {
  std::vector<MTLCommandBufferHandler> scheduled, completed;
  std::vector<Command> commands;
  {
    std::lock_guard<std::mutex> l(_mu);
    _status = MTLCommandBufferStatusScheduled;
    scheduled.swap(_scheduled);
    commands.swap(_commands);
  }
  for (MTLCommandBufferHandler h : scheduled) h(self);
  std::string error;
  for (Command& c : commands) {
    if (c.kind == Command::Kind::kCopy) {
      memcpy(static_cast<char*>(c.dst->_data) + c.dst_offset, static_cast<char*>(c.src->_data) + c.src_offset, c.size);
    } else {
      error = RunDispatch(c);
      if (error.empty()) CountDispatch(c.pipeline->_function->_name);
      if (!error.empty()) {
        error = c.pipeline->_function->_name + ": " + error;
        break;  // a faulting command buffer stops (later commands of it do not run)
      }
    }
  }
  commands.clear();  // releases the buffers the commands referenced
  {
    std::lock_guard<std::mutex> l(_mu);
    if (error.empty()) {
      _status = MTLCommandBufferStatusCompleted;
    } else {
      _status = MTLCommandBufferStatusError;
      _error = MakeError(MTLCommandBufferErrorDomain, MTLCommandBufferErrorInternal,
                         "Internal Error (0000000e:Internal Error): " + error);
    }
    completed.swap(_completed);
  }
  _cv.notify_all();
  for (MTLCommandBufferHandler h : completed) h(self);
}
- (void)waitUntilScheduled {
  [self waitUntilCompleted];
}
- (void)waitUntilCompleted {
  std::unique_lock<std::mutex> l(_mu);
  if (_status < MTLCommandBufferStatusCommitted) Violation("MTLCommandBuffer waitUntilCompleted", "waiting on a command buffer that was not committed");
  _cv.wait(l, [self] { return _status >= MTLCommandBufferStatusCompleted; });
}
- (MTLCommandBufferStatus)status {
  std::lock_guard<std::mutex> l(_mu);
  return _status;
}
- (nullable NSError*)error {
  std::lock_guard<std::mutex> l(_mu);
  return _error;
}
- (void)dealloc {
  if (_openEncoder != nil) Violation("MTLCommandBuffer dealloc", "command buffer released with an encoder still encoding");
}
@end

@interface TFMOMockCommandQueue : NSObject <MTLCommandQueue>
@property (nullable, copy, atomic) NSString* label;
@end

@implementation TFMOMockCommandQueue
@synthesize label;
- (id<MTLDevice>)device { return MTLCreateSystemDefaultDevice(); }
- (nullable id<MTLCommandBuffer>)commandBuffer {
  TFMOMockCommandBuffer* cb = [TFMOMockCommandBuffer new];
  cb->_status = MTLCommandBufferStatusNotEnqueued;
  cb->_queue = self;
  return cb;
}
@end

// ---- the device ---------------------------------------------------------------------------------------------
namespace {

std::vector<std::string> TableKernels() { return tfmo::emu::KernelNames(); }

// The functions a source defines: plain kernels (`kernel void name(`) and the instances of kernel templates named
// by [[host_name("name")]] (MSL: the function name of an explicit instantiation).
std::vector<std::string> KernelsDefinedBy(const std::string& source) {
  static const std::regex re(R"((?:\bkernel|\[\[\s*kernel\s*\]\])\s+void\s+([A-Za-z_][A-Za-z0-9_]*)\s*\()");
  static const std::regex host(R"re(\[\[\s*host_name\s*\(\s*"([^"]+)"\s*\)\s*\]\])re");
  std::vector<std::string> out;
  for (const std::regex* r : {&re, &host})
    for (auto it = std::sregex_iterator(source.begin(), source.end(), *r); it != std::sregex_iterator(); ++it)
      out.push_back((*it)[1].str());
  return out;
}

struct CompiledSource {
  std::string error;
  TfmoInlineKernelEntry entry = nullptr;
  bool retry = false;  // the compiler refused the source for want of the user's consent (TFMO_INLINE_REFUSED)
};
std::mutex g_sources_mu;
std::map<std::string, CompiledSource>* g_sources = new std::map<std::string, CompiledSource>();  // never freed

}  // namespace

@implementation TFMOMockDevice
- (NSString*)name { return @"Apple M2 (tf-metal-ops Apple doubles)"; }
- (uint64_t)registryID { return 0x100000a1bULL; }
- (BOOL)isLowPower { return NO; }
- (BOOL)hasUnifiedMemory { return YES; }
- (NSUInteger)maxThreadgroupMemoryLength { return kMaxThreadgroupMemory; }
- (NSUInteger)maxBufferLength { return NSUInteger(1) << 34; }
- (nullable id<MTLCommandQueue>)newCommandQueue { return [TFMOMockCommandQueue new]; }
- (nullable id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options {
  if (length == 0) Violation("MTLDevice newBufferWithLength:options:", "length(0) must be > 0");
  TFMOMockBuffer* b = [TFMOMockBuffer new];
  void* p = nullptr;
  if (posix_memalign(&p, 16384, length) != 0) return nil;  // Apple GPUs: 16 KiB pages
  memset(p, 0, length);
  b->_data = p;
  b->_length = length;
  b->_mode = MTLStorageMode((options & MTLResourceStorageModeMask) >> MTLResourceStorageModeShift);
  return b;
}
- (nullable id<MTLLibrary>)newLibraryWithURL:(NSURL*)url error:(__autoreleasing NSError**)error {
  std::ifstream in(Str(url.path));
  if (!in) {
    if (error) *error = MakeError(MTLLibraryErrorDomain, MTLLibraryErrorFileNotFound, "file not found: " + Str(url.path));
    return nil;
  }
  std::string line;
  std::getline(in, line);
  static const bool unloadable = getenv("TFMO_MOCK_METAL_METALLIB_UNLOADABLE") != nullptr;  // e.g. built for a newer OS
  if (line != kMetallibMagic || unloadable) {
    if (error) *error = MakeError(MTLLibraryErrorDomain, MTLLibraryErrorInternal, "Invalid library file");
    return nil;
  }
  TFMOMockLibrary* lib = [TFMOMockLibrary new];
  const std::vector<std::string> table = TableKernels();
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (std::find(table.begin(), table.end(), line) == table.end()) {
      if (error) *error = MakeError(MTLLibraryErrorDomain, MTLLibraryErrorInternal, "Invalid library file: unknown function " + line);
      return nil;
    }
    lib->_names.push_back(line);
  }
  return lib;
}
- (nullable id<MTLLibrary>)newLibraryWithSource:(NSString*)source
                                        options:(nullable MTLCompileOptions*)options
                                          error:(__autoreleasing NSError**)error {
  const std::string text = Str(source);
  // Apple: options nil means the defaults (fastMathEnabled YES, the most recent language version).
  MTLCompileOptions* opts = options != nil ? options : [MTLCompileOptions new];
  int version = 0;  // MSL major * 100 + minor * 10
  switch (opts.languageVersion) {
    case MTLLanguageVersion2_4: version = 240; break;
    case MTLLanguageVersion3_0: version = 300; break;
  }
  if (version == 0) {
    if (error) *error = MakeError(MTLLibraryErrorDomain, MTLLibraryErrorCompileFailure,
                                  "Compilation failed: unsupported language version " +
                                      std::to_string(NSUInteger(opts.languageVersion)));
    return nil;
  }
  TFMOMockLibrary* lib = [TFMOMockLibrary new];
  lib->_names = KernelsDefinedBy(text);
  for (const tfmo::metal::EmbeddedSource* e = tfmo::metal::kEmbeddedMetalSources; e->source != nullptr; ++e) {
    if (text != e->source) continue;
    // The package's own sources are held precompiled (the kernel table, IEEE semantics; dev/check_msl.py and
    // test_msl_check check them at MSL 2.4 and 3.0). With fast math the double cannot run them as a Mac would
    // (differently, with NaN/inf not guaranteed), so it stops instead of answering with IEEE results.
    if (opts.fastMathEnabled) {
      fprintf(stderr, "tf-metal-ops Apple doubles: newLibraryWithSource: with fastMathEnabled = YES (Apple's default: "
                      "\"optimizations for floating-point arithmetic that may violate the IEEE 754 standard\") for "
                      "the package's own source %s; the doubles hold it compiled with IEEE semantics only, so they "
                      "cannot run it as a Mac would\n", e->name);
      fflush(stderr);
      abort();
    }
    // Its instances named through an instantiation macro (hash_grid.metal's HG_KERNEL("name", ...)): every kernel of
    // the table that the source names as a string literal, as the host finds the source (SourceDefining).
    for (const std::string& k : TableKernels())
      if (text.find("\"" + k + "\"") != std::string::npos && ![lib has:k]) lib->_names.push_back(k);
    return lib;  // precompiled: the package's own source
  }
  TfmoInlineCompiler compiler;
  {
    std::lock_guard<std::mutex> l(g_compiler_mu);
    compiler = g_compiler;
  }
  const bool checked = BoundsChecked();
  const int compile_options = (checked ? TFMO_INLINE_CHECKED : 0) | (opts.fastMathEnabled ? TFMO_INLINE_FAST_MATH : 0) |
                              (version << 8);
  const std::string key = std::to_string(compile_options) + "#" + text;
  std::lock_guard<std::mutex> l(g_sources_mu);
  auto [it, added] = g_sources->try_emplace(key);
  CompiledSource& cs = it->second;
  if (added) {
    if (compiler == nullptr) {
      cs.error = "no Metal compiler: tfmo_set_inline_compiler was not called";
    } else {
      char path[4096] = {0}, err[16384] = {0};
      if (const int rc = compiler(text.c_str(), compile_options, path, sizeof path, err, sizeof err); rc != 0) {
        cs.error = err;
        cs.retry = rc == TFMO_INLINE_REFUSED;
      } else if (void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL); h == nullptr) {
        cs.error = std::string("loading the compiled library failed: ") + dlerror();
      } else {
        cs.entry = reinterpret_cast<TfmoInlineKernelEntry>(dlsym(h, "tfmo_inline_kernel"));
        if (cs.entry == nullptr) cs.error = "the compiled library has no tfmo_inline_kernel";
      }
    }
  }
  if (cs.entry == nullptr) {
    if (error) *error = MakeError(MTLLibraryErrorDomain, MTLLibraryErrorCompileFailure, "Compilation failed: \n\n" + cs.error);
    if (cs.retry) g_sources->erase(it);  // refused for want of consent: asked again next time
    return nil;
  }
  lib->_entry = cs.entry;
  return lib;
}
- (nullable id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)computeFunction
                                                                      error:(__autoreleasing NSError**)error {
  if (computeFunction == nil) Violation("MTLDevice newComputePipelineStateWithFunction:error:", "function must not be nil");
  TFMOMockPipeline* p = [TFMOMockPipeline new];
  p->_function = (TFMOMockFunction*)computeFunction;
  return p;
}
- (BOOL)supportsFamily:(MTLGPUFamily)gpuFamily {
  const char* v = getenv("TFMO_MOCK_METAL_NO_METAL3");
  const bool metal3 = v == nullptr || strcmp(v, "1") != 0;
  switch (gpuFamily) {
    case MTLGPUFamilyApple7:
    case MTLGPUFamilyApple8:
    case MTLGPUFamilyMac2:
    case MTLGPUFamilyCommon3: return YES;
    case MTLGPUFamilyMetal3: return metal3 ? YES : NO;
  }
  return NO;
}
@end

id<MTLDevice> MTLCreateSystemDefaultDevice(void) {
  static TFMOMockDevice* device = [TFMOMockDevice new];  // one device for the process
  return device;
}

NSArray<id<MTLDevice>>* MTLCopyAllDevices(void) { return @[ MTLCreateSystemDefaultDevice() ]; }

// ---- for the tensorflow-metal double and tests ----------------------------------------------------------------
// The same signature as the op library's: the Python side registers its msl_emu compiler with both.
TFMO_MOCK_EXPORT void tfmo_set_inline_compiler(TfmoInlineCompiler compiler) {
  std::lock_guard<std::mutex> l(g_compiler_mu);
  g_compiler = compiler;
}

// True on the thread that runs command buffers and their completed handlers.
TFMO_MOCK_EXPORT int tfmo_mock_metal_on_gpu_thread(void) { return t_on_gpu_thread ? 1 : 0; }

// Waits until every command buffer committed so far has completed (its handlers included).
TFMO_MOCK_EXPORT void tfmo_mock_metal_wait_idle(void) {
  Gpu& g = TheGpu();
  std::unique_lock<std::mutex> l(g.mu);
  const uint64_t target = g.committed;
  g.cv.wait(l, [&] { return g.completed >= target; });
}

// Kernel name -> dispatches the GPU ran, as JSON (the direct backend's tfmo_emu_dispatch_counts, same format).
TFMO_MOCK_EXPORT const char* tfmo_emu_dispatch_counts(void) {
  static thread_local std::string json;
  std::lock_guard<std::mutex> l(g_counts_mu);
  json = "{";
  for (const auto& [k, n] : *g_counts) json += (json.size() > 1 ? ", \"" : "\"") + k + "\": " + std::to_string(n);
  json += "}";
  return json.c_str();
}
