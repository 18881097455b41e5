// A tensorflow-metal-like PluggableDevice over the Apple doubles (dev/apple_doubles/src/metal.mm): device type "GPU",
// platform "TFMO_METAL_DOUBLE", one device. What tensorflow-metal shows a custom op, and nothing more:
//  - SP_Stream is an Objective-C stream object answering -queue, -currentCommandBuffer, -commit, -commitAndWait;
//  - TF_TensorData of a device tensor is its id<MTLBuffer> (allocate() returns the retained buffer object);
//  - TFMO_MOCK_TF_METAL_STREAM=mps: the current command buffer is an MPSCommandBuffer-like wrapper, and -commit /
//    -commitAndWait commit-and-continue: the wrapper stays current and wraps a new command buffer afterwards;
//    TFMO_MOCK_TF_METAL_STREAM=deferred: -commit enqueues the current command buffer (-[MTLCommandBuffer enqueue]:
//    its place in the queue is fixed) without submitting it; the stream submits what it deferred, in order, at the
//    next -commitAndWait or when TensorFlow synchronizes the stream (copies, events, host callbacks, stream
//    teardown), as a stream that coalesces submissions could (nothing public says tensorflow-metal's does not);
//    default ("plain"): a plain command buffer, replaced by a new one after each commit;
//  - every stream method that touches command buffers (-currentCommandBuffer, -commit, -commitAndWait) asserts
//    that it runs on the stream's dispatch queue (dispatch_assert_queue): Apple's sample encodes only inside
//    dispatch_sync(stream.queue, ...), and a stream that hands out one current command buffer is not thread-safe
//    outside it;
//  - tfmo_mock_tf_metal_leave_encoder_open() (a test hook): every stream encodes work of its own (a blit) on its
//    current command buffer and leaves the encoder open until its next -commit, as a stream that coalesces its own
//    kernels into one encoder leaves it between ops (PyTorch's MPS stream does); the next op sees it open.
// Its allocator is assumed to take the stream's queue (as one that recycles buffers by stream order would), so
// deallocate() called from a Metal completion handler is a deadlock waiting to happen: the double ends the process
// with a message instead. Copies and fills wait for the GPU, then touch the buffer's contents (unified memory).
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>
#include <dispatch/dispatch.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "emulated_gpu/se_single_device.h"
#include "tensorflow/c/experimental/stream_executor/stream_executor.h"
#include "tensorflow/c/tf_status.h"

#define TFMO_EXPORT extern "C" __attribute__((visibility("default")))

extern "C" int tfmo_mock_metal_on_gpu_thread(void);
extern "C" void tfmo_mock_metal_wait_idle(void);
extern "C" void tfmo_mock_forget_heap_block(const void* ptr);

// ---- MPSCommandBuffer-like wrapper ----------------------------------------------------------------------------
@interface TFMOMockMPSCommandBuffer : NSObject <MTLCommandBuffer> {
 @public
  id<MTLCommandBuffer> _root;
  id<MTLCommandQueue> _queue;
}
@property (nullable, copy, atomic) NSString* label;
- (void)commitAndContinue;
@end

@implementation TFMOMockMPSCommandBuffer
@synthesize label;
- (id<MTLDevice>)device { return _root.device; }
- (id<MTLCommandQueue>)commandQueue { return _queue; }
- (void)enqueue { [_root enqueue]; }
- (void)commit { [_root commit]; }
- (void)commitAndContinue {  // MPSCommandBuffer: commits the root command buffer and makes a new one
  [_root commit];
  _root = [_queue commandBuffer];
}
- (void)addScheduledHandler:(MTLCommandBufferHandler)block { [_root addScheduledHandler:block]; }
- (void)addCompletedHandler:(MTLCommandBufferHandler)block { [_root addCompletedHandler:block]; }
- (void)waitUntilScheduled { [_root waitUntilScheduled]; }
- (void)waitUntilCompleted { [_root waitUntilCompleted]; }
- (MTLCommandBufferStatus)status { return _root.status; }
- (nullable NSError*)error { return _root.error; }
- (nullable id<MTLBlitCommandEncoder>)blitCommandEncoder { return [_root blitCommandEncoder]; }
- (nullable id<MTLComputeCommandEncoder>)computeCommandEncoder { return [_root computeCommandEncoder]; }
@end

// ---- the stream -----------------------------------------------------------------------------------------------
@interface TFMOMockMetalStream : NSObject {
 @public
  dispatch_queue_t _queue;
  id<MTLCommandQueue> _commandQueue;
  id<MTLCommandBuffer> _current;  // nil until asked for (plain), or the MPS-like wrapper
  bool _mps;
  bool _deferred;                          // TFMO_MOCK_TF_METAL_STREAM=deferred
  std::vector<id<MTLCommandBuffer>> _enqueued;  // deferred: enqueued by -commit, not yet submitted (strong)
  id<MTLBlitCommandEncoder> _openBlit;  // tfmo_mock_tf_metal_leave_encoder_open: the stream's own work, still open
}
- (dispatch_queue_t)queue;
- (id<MTLCommandBuffer>)currentCommandBuffer;
- (void)commit;
- (void)commitAndWait;
- (void)flush;
@end

@implementation TFMOMockMetalStream
- (dispatch_queue_t)queue { return _queue; }
- (id<MTLCommandBuffer>)currentCommandBuffer {
  dispatch_assert_queue(_queue);
  if (_current == nil) {
    if (_mps) {
      TFMOMockMPSCommandBuffer* w = [TFMOMockMPSCommandBuffer new];
      w->_queue = _commandQueue;
      w->_root = [_commandQueue commandBuffer];
      _current = w;
    } else {
      _current = [_commandQueue commandBuffer];
    }
  }
  return _current;
}
- (void)endOpenEncoder {
  [_openBlit endEncoding];
  _openBlit = nil;
}
- (void)commit {
  dispatch_assert_queue(_queue);
  [self endOpenEncoder];
  if (_current == nil) return;
  if (_mps) {
    [(TFMOMockMPSCommandBuffer*)_current commitAndContinue];
  } else if (_deferred) {
    [_current enqueue];
    _enqueued.push_back(_current);
    _current = nil;
  } else {
    [_current commit];
    _current = nil;
  }
}
- (void)flush {  // deferred: submits what -commit enqueued, in order
  dispatch_assert_queue(_queue);
  std::vector<id<MTLCommandBuffer>> pending;
  pending.swap(_enqueued);
  for (id<MTLCommandBuffer> cb : pending) [cb commit];
}
- (void)commitAndWait {  // waits for the buffer it commits (under mps: the wrapped one, not the next)
  dispatch_assert_queue(_queue);
  id<MTLCommandBuffer> committed = _mps && _current != nil ? ((TFMOMockMPSCommandBuffer*)_current)->_root : _current;
  [self commit];
  [self flush];
  [committed waitUntilCompleted];
}
@end

namespace tfmo_se {  // the Se* callbacks of se_single_device.h

constexpr const char* kPlatformName = "TFMO_METAL_DOUBLE";
constexpr const char* kDeviceType = "GPU";

struct Global {
  std::mutex mu;
  std::vector<TFMOMockMetalStream*> streams;  // strong
  int64_t live_bytes = 0, peak_bytes = 0, allocs = 0, live_buffers = 0, largest = 0;
  std::unordered_map<const void*, int64_t> sizes;  // live buffer -> its size (TF's deallocate may not carry it)
  std::atomic<int64_t> open_encoders_left{0};  // by tfmo_mock_tf_metal_leave_encoder_open
};
Global& G() {
  static Global* g = new Global();  // never freed
  return *g;
}

void SetError(TF_Status* status, TF_Code code, const std::string& msg) {
  if (status != nullptr) TF_SetStatus(status, code, ("tensorflow-metal double: " + msg).c_str());
}

TFMOMockMetalStream* StreamOf(SP_Stream s) { return (__bridge TFMOMockMetalStream*)(void*)s; }
id<MTLBuffer> BufferOf(const void* opaque) { return (__bridge id<MTLBuffer>)const_cast<void*>(opaque); }

// Commits the stream's pending work and waits until the GPU has run everything committed so far.
void Drain(TFMOMockMetalStream* s) {
  if (s != nil) dispatch_sync(s->_queue, ^{
      [s commit];
      [s flush];
    });
  tfmo_mock_metal_wait_idle();
}

void DrainAll() {
  std::vector<TFMOMockMetalStream*> streams;
  {
    std::lock_guard<std::mutex> l(G().mu);
    streams = G().streams;
  }
  for (TFMOMockMetalStream* s : streams) dispatch_sync(s->_queue, ^{
      [s commit];
      [s flush];
    });
  tfmo_mock_metal_wait_idle();
}

char* HostAddress(const SP_DeviceMemoryBase* m, uint64_t size, TF_Status* status, const char* what) {
  if (m == nullptr || m->opaque == nullptr) {
    SetError(status, TF_INVALID_ARGUMENT, std::string(what) + ": null device memory");
    return nullptr;
  }
  id<MTLBuffer> b = BufferOf(m->opaque);
  if (size > b.length) {
    SetError(status, TF_INVALID_ARGUMENT, std::string(what) + ": " + std::to_string(size) + " bytes exceed the buffer's " +
                                              std::to_string(b.length));
    return nullptr;
  }
  return static_cast<char*>(b.contents);
}

// TF_METAL_OPS_EMULATED_GPU_MEMORY_MB, as on the emulated GPU: the memory tensors may hold (default 4 GiB); an
// allocation past it fails as tensorflow-metal's does (no buffer; TensorFlow reports ResourceExhausted).
int64_t MemoryLimit() {
  static const int64_t limit = [] {
    const char* v = getenv("TF_METAL_OPS_EMULATED_GPU_MEMORY_MB");
    return (v != nullptr && atoll(v) > 0 ? atoll(v) : 4096) << 20;
  }();
  return limit;
}

void SeAllocate(const SP_Device*, uint64_t size, int64_t, SP_DeviceMemoryBase* mem) {
  mem->struct_size = SP_DEVICE_MEMORY_BASE_STRUCT_SIZE;
  mem->opaque = nullptr;
  mem->size = 0;
  mem->payload = 0;
  if (size == 0) return;
  {
    std::lock_guard<std::mutex> l(G().mu);  // reserve first: the device's memory is bounded
    if (G().live_bytes + int64_t(size) > MemoryLimit()) return;
    G().live_bytes += int64_t(size);
  }
  @autoreleasepool {
    id<MTLBuffer> b = [MTLCreateSystemDefaultDevice() newBufferWithLength:size options:MTLResourceStorageModeShared];
    if (b != nil) {
      mem->opaque = (__bridge_retained void*)b;
      mem->size = size;
      static const bool foreign = getenv("TFMO_MOCK_TF_METAL_FOREIGN_BUFFERS") != nullptr;
      if (foreign) tfmo_mock_forget_heap_block(mem->opaque);  // a real object that no malloc zone claims
    }
  }
  std::lock_guard<std::mutex> l(G().mu);
  Global& g = G();
  if (mem->opaque == nullptr) {
    g.live_bytes -= int64_t(size);
    return;
  }
  g.peak_bytes = std::max(g.peak_bytes, g.live_bytes);
  g.largest = std::max(g.largest, int64_t(size));
  ++g.allocs;
  ++g.live_buffers;
  g.sizes[mem->opaque] = int64_t(size);
}

void SeDeallocate(const SP_Device*, SP_DeviceMemoryBase* mem) {
  if (mem == nullptr || mem->opaque == nullptr) return;
  if (tfmo_mock_metal_on_gpu_thread()) {
    fprintf(stderr, "tensorflow-metal double: a device buffer was deallocated from a Metal completion handler; "
                    "tensorflow-metal's allocator may take the stream's queue there and deadlock\n");
    fflush(stderr);
    abort();
  }
  const void* key = mem->opaque;
  id<MTLBuffer> b = (__bridge_transfer id<MTLBuffer>)mem->opaque;  // the command buffers that use it hold their own
  b = nil;
  mem->opaque = nullptr;
  std::lock_guard<std::mutex> l(G().mu);
  auto it = G().sizes.find(key);
  if (it != G().sizes.end()) {
    G().live_bytes -= it->second;
    G().sizes.erase(it);
  }
  --G().live_buffers;
}

void* SeHostAllocate(const SP_Device*, uint64_t size) {
  void* p = nullptr;
  if (posix_memalign(&p, 64, std::max<uint64_t>(size, 64)) != 0) return nullptr;
  return p;
}
void SeHostDeallocate(const SP_Device*, void* mem) { free(mem); }

TF_Bool SeAllocatorStats(const SP_Device*, SP_AllocatorStats* stats) {
  std::lock_guard<std::mutex> l(G().mu);
  Global& g = G();
  stats->struct_size = SP_ALLOCATORSTATS_STRUCT_SIZE;
  stats->num_allocs = g.allocs;
  stats->bytes_in_use = g.live_bytes;
  stats->peak_bytes_in_use = g.peak_bytes;
  stats->largest_alloc_size = g.largest;
  stats->has_bytes_limit = 1;
  stats->bytes_limit = MemoryLimit();
  stats->bytes_reserved = 0;
  stats->peak_bytes_reserved = 0;
  stats->has_bytes_reservable_limit = 0;
  stats->bytes_reservable_limit = 0;
  stats->largest_free_block_bytes = MemoryLimit() - g.live_bytes;
  return 1;
}

TF_Bool SeMemoryUsage(const SP_Device*, int64_t* free_bytes, int64_t* total) {
  std::lock_guard<std::mutex> l(G().mu);
  *free_bytes = MemoryLimit() - G().live_bytes;
  *total = MemoryLimit();
  return 1;
}

void SeCreateStream(const SP_Device*, SP_Stream* stream, TF_Status*) {
  TFMOMockMetalStream* s = [TFMOMockMetalStream new];
  s->_queue = dispatch_queue_create("tfmo.metal-double.stream", DISPATCH_QUEUE_SERIAL);
  s->_commandQueue = [MTLCreateSystemDefaultDevice() newCommandQueue];
  const char* mode = getenv("TFMO_MOCK_TF_METAL_STREAM");
  if (mode != nullptr && *mode != '\0' && strcmp(mode, "plain") != 0 && strcmp(mode, "mps") != 0 &&
      strcmp(mode, "deferred") != 0) {
    fprintf(stderr, "tensorflow-metal double: TFMO_MOCK_TF_METAL_STREAM=%s is none of plain, mps, deferred\n", mode);
    fflush(stderr);
    abort();
  }
  s->_mps = mode != nullptr && strcmp(mode, "mps") == 0;
  s->_deferred = mode != nullptr && strcmp(mode, "deferred") == 0;
  std::lock_guard<std::mutex> l(G().mu);
  G().streams.push_back(s);
  *stream = (SP_Stream)(__bridge void*)s;  // the Global's strong reference keeps it alive
}

void SeDestroyStream(const SP_Device*, SP_Stream stream) {
  TFMOMockMetalStream* s = StreamOf(stream);
  Drain(s);
  std::lock_guard<std::mutex> l(G().mu);
  auto& v = G().streams;
  v.erase(std::remove(v.begin(), v.end(), s), v.end());
}

void SeCreateStreamDependency(const SP_Device*, SP_Stream, SP_Stream other, TF_Status*) { Drain(StreamOf(other)); }
void SeGetStreamStatus(const SP_Device*, SP_Stream, TF_Status* status) { TF_SetStatus(status, TF_OK, ""); }

// Events complete when recorded: recording drains the stream (the GPU runs command buffers in commit order).
void SeCreateEvent(const SP_Device*, SP_Event* event, TF_Status*) { *event = reinterpret_cast<SP_Event>(new int(0)); }
void SeDestroyEvent(const SP_Device*, SP_Event event) { delete reinterpret_cast<int*>(event); }
SE_EventStatus SeEventStatus(const SP_Device*, SP_Event) { return SE_EVENT_COMPLETE; }
void SeRecordEvent(const SP_Device*, SP_Stream stream, SP_Event, TF_Status*) { Drain(StreamOf(stream)); }
void SeWaitForEvent(const SP_Device*, SP_Stream, SP_Event, TF_Status*) {}
void SeBlockHostForEvent(const SP_Device*, SP_Event, TF_Status*) {}
void SeBlockHostUntilDone(const SP_Device*, SP_Stream stream, TF_Status*) { Drain(StreamOf(stream)); }
void SeSynchronizeAllActivity(const SP_Device*, TF_Status*) { DrainAll(); }

void SeMemcpyDtoH(const SP_Device*, SP_Stream stream, void* dst, const SP_DeviceMemoryBase* src, uint64_t size,
                  TF_Status* status) {
  if (size == 0) return;
  Drain(StreamOf(stream));
  if (char* p = HostAddress(src, size, status, "memcpy_dtoh")) memcpy(dst, p, size);
}
void SeMemcpyHtoD(const SP_Device*, SP_Stream stream, SP_DeviceMemoryBase* dst, const void* src, uint64_t size,
                  TF_Status* status) {
  if (size == 0) return;
  TFMOMockMetalStream* s = StreamOf(stream);
  Drain(s);
  if (char* p = HostAddress(dst, size, status, "memcpy_htod")) memcpy(p, src, size);
}
void SeMemcpyDtoD(const SP_Device*, SP_Stream stream, SP_DeviceMemoryBase* dst, const SP_DeviceMemoryBase* src,
                  uint64_t size, TF_Status* status) {
  if (size == 0) return;
  Drain(StreamOf(stream));
  char* d = HostAddress(dst, size, status, "memcpy_dtod");
  char* s = d ? HostAddress(src, size, status, "memcpy_dtod") : nullptr;
  if (s != nullptr) memmove(d, s, size);
}
void SeSyncMemcpyDtoH(const SP_Device* d, void* dst, const SP_DeviceMemoryBase* src, uint64_t size, TF_Status* st) {
  DrainAll();
  SeMemcpyDtoH(d, nullptr, dst, src, size, st);
}
void SeSyncMemcpyHtoD(const SP_Device* d, SP_DeviceMemoryBase* dst, const void* src, uint64_t size, TF_Status* st) {
  DrainAll();
  SeMemcpyHtoD(d, nullptr, dst, src, size, st);
}
void SeSyncMemcpyDtoD(const SP_Device* d, SP_DeviceMemoryBase* dst, const SP_DeviceMemoryBase* src, uint64_t size,
                      TF_Status* st) {
  DrainAll();
  SeMemcpyDtoD(d, nullptr, dst, src, size, st);
}

void Fill(SP_Stream stream, SP_DeviceMemoryBase* loc, uint64_t size, uint32_t pattern, int width, TF_Status* status) {
  if (size == 0) return;
  Drain(StreamOf(stream));
  char* p = HostAddress(loc, size, status, "memset");
  if (p == nullptr) return;
  if (width == 1) {
    memset(p, int(pattern & 0xff), size);
  } else {
    for (uint64_t i = 0; i + 4 <= size; i += 4) memcpy(p + i, &pattern, 4);
  }
}
void SeMemZero(const SP_Device*, SP_Stream s, SP_DeviceMemoryBase* loc, uint64_t size, TF_Status* st) {
  Fill(s, loc, size, 0, 1, st);
}
void SeMemset(const SP_Device*, SP_Stream s, SP_DeviceMemoryBase* loc, uint8_t pattern, uint64_t size, TF_Status* st) {
  Fill(s, loc, size, pattern, 1, st);
}
void SeMemset32(const SP_Device*, SP_Stream s, SP_DeviceMemoryBase* loc, uint32_t pattern, uint64_t size,
                TF_Status* st) {
  Fill(s, loc, size, pattern, 4, st);
}

// Runs on the stream's queue after the stream's work so far has completed.
TF_Bool SeHostCallback(const SP_Device*, SP_Stream stream, SE_StatusCallbackFn fn, void* arg) {
  TFMOMockMetalStream* s = StreamOf(stream);
  dispatch_async(s->_queue, ^{
    [s commit];
    [s flush];
    tfmo_mock_metal_wait_idle();
    TF_Status* st = TF_NewStatus();
    fn(arg, st);
    if (TF_GetCode(st) != TF_OK) fprintf(stderr, "tensorflow-metal double: host callback failed: %s\n", TF_Message(st));
    TF_DeleteStatus(st);
  });
  return 1;
}

const SingleDevice kDevice = {kPlatformName, kDeviceType, "Apple doubles (tf-metal-ops test double of tensorflow-metal)",
                               "tensorflow-metal double: ", 100ll * 1000 * 1000 * 1000, 1000.0};

TFMO_EXPORT void SE_InitPlugin(SE_PlatformRegistrationParams* params, TF_Status*) {
  FillRegistration(params);  // platform "TFMO_METAL_DOUBLE", no BFC allocator: kernels get whole MTLBuffers
}

// Device statistics as JSON (valid until the next call on the same thread).
TFMO_EXPORT const char* tfmo_emu_device_stats(void) {
  static thread_local std::string json;
  std::lock_guard<std::mutex> l(G().mu);
  const Global& g = G();
  json = "{\"backend\": \"metal\", \"live_buffers\": " + std::to_string(g.live_buffers) + ", \"live_bytes\": " +
         std::to_string(g.live_bytes) + ", \"peak_bytes\": " + std::to_string(g.peak_bytes) + ", \"allocations\": " +
         std::to_string(g.allocs) + ", \"streams\": " + std::to_string(g.streams.size()) +
         ", \"open_encoders_left\": " + std::to_string(g.open_encoders_left.load()) + "}";
  return json.c_str();
}

TFMO_EXPORT void tfmo_emu_device_synchronize(void) { DrainAll(); }

TFMO_EXPORT void tfmo_mock_tf_metal_leave_encoder_open(void) {
  std::vector<TFMOMockMetalStream*> streams;
  {
    std::lock_guard<std::mutex> l(G().mu);
    streams = G().streams;
  }
  for (TFMOMockMetalStream* s : streams) {
    dispatch_sync(s->_queue, ^{
      if (s->_openBlit != nil) return;
      id<MTLDevice> device = MTLCreateSystemDefaultDevice();
      id<MTLBuffer> a = [device newBufferWithLength:16 options:MTLResourceStorageModeShared];
      id<MTLBuffer> b = [device newBufferWithLength:16 options:MTLResourceStorageModeShared];
      s->_openBlit = [[s currentCommandBuffer] blitCommandEncoder];
      [s->_openBlit copyFromBuffer:a sourceOffset:0 toBuffer:b destinationOffset:0 size:16];
      ++G().open_encoders_left;
    });
  }
}

}  // namespace tfmo_se
