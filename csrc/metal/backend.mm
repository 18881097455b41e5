// Metal backend of the GPU host layer (csrc/gpu/gpu_host.h): Execute, ExecuteAndRead and NativeFloatAtomics (Metal 3
// GPUs run the MSL 3.0 kernels), composed of the backend's parts. csrc/metal/ is the only code that knows about Metal
// and tensorflow-metal. Objective-C++, macOS builds only (-fobjc-arc -fblocks). Conventions: docs/metal_host.md.
//
//   device.h      libraries and pipelines per MTLDevice, found by kernel name (resolved outside the stream's queue)
//   stream.h      TF_GetStream and TF_TensorData, checked to be tensorflow-metal's objects before the first message
//   encode.h      a Call's passes resolved, then encoded inside the stream's queue: one compute encoder
//   completion.h  completed handlers, waiting, GPU errors of asynchronous calls
//   backend_info.mm  tfmo_metal_info() for tf_metal_ops.backend_info()
//
//  - A call: the pending GPU error of an earlier asynchronous call fails it; then stream, Resolve, and inside
//    dispatch_sync(stream.queue, ...) the encoding, a completion handler and [stream commit]; a call that waits for
//    its work (TF_METAL_OPS_SYNC=1, ExecuteAndRead) ends with [stream commitAndWait] instead, because -commit may
//    only hand the buffer to the stream, which submits it later: waiting after a plain -commit could wait forever.
//  - Scratch tensors are deleted on the op's thread once the passes that use them are encoded (after dispatch_sync
//    returns), as Apple's sample frees its temporaries: the command buffer retains the MTLBuffers it references and
//    later work on the stream is ordered after it. Never from Metal's completion thread, where tensorflow-metal's
//    allocator could contend for the stream's queue.
//  - Each call's encoding runs inside @autoreleasepool (TF's threads never drain one) and @try: an Objective-C
//    exception becomes an op error. Errors never abort: every failure goes through TF_OpKernelContext_Failure.
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/tfc.h"
#include "gpu/gpu_host.h"
#include "metal/completion.h"
#include "metal/device.h"
#include "metal/encode.h"
#include "metal/objc_util.h"
#include "metal/stream.h"

namespace tfmo::gpu {
namespace {

using metal::Completion;
using metal::Resolved;

void DeleteTensors(std::vector<TF_Tensor*>* tensors) {
  for (TF_Tensor* t : *tensors) TF_DeleteTensor(t);
  tensors->clear();
}

}  // namespace

bool NativeFloatAtomics(Call& call, const TensorRef& t) {
  Binding b;
  b.kind = Binding::Kind::kTensor;
  b.tensor = t.get();
  b.dtype = t.dtype();
  b.size = t ? TF_TensorByteSize(t.get()) : 0;
  std::string error = "an empty tensor has no buffer";
  @autoreleasepool {
    @try {
      id<MTLBuffer> buffer = b.size > 0 ? metal::BufferOf(b, 0, &error) : nil;
      if (buffer != nil) return metal::UseMetal3(buffer.device);  // the metallib / source at MSL 3.0
    } @catch (NSException* e) {
      error = metal::ExceptionMessage(e);
    }
  }
  call.fail(TF_FAILED_PRECONDITION, "tf_metal_ops: %s: cannot tell the tensor's Metal device: %s", call.op(),
            error.c_str());
  return false;
}

bool Execute(Call& call) {
  TF_OpKernelContext* ctx = call.ctx();
  const char* op = call.op();
  const bool wait = metal::SyncRequested();
  TF_Code code = TF_OK;
  std::string error;
  if (std::string earlier = metal::TakePendingGpuError(); !earlier.empty())
    return Fail(ctx, TF_INTERNAL, "tf_metal_ops: %s: an earlier GPU call failed: %s", op, earlier.c_str());
  auto completion = std::make_shared<Completion>();
  std::vector<TF_Tensor*> scratch;
  @autoreleasepool {  // TF's threads never drain a pool of their own
    @try {
      id<TFMOMetalStream> stream = metal::GetStream(ctx, &error);
      if (stream == nil) return Fail(ctx, TF_FAILED_PRECONDITION, "%s", error.c_str());
      dispatch_queue_t queue = [stream queue];
      if (queue == nil) return Fail(ctx, TF_FAILED_PRECONDITION, "tf_metal_ops: the Metal stream has no dispatch queue");
      std::vector<Resolved> passes;
      id<MTLDevice> device = nil;
      if (!metal::Resolve(call, &passes, &device, &error))
        return Fail(ctx, metal::ResolveFailureCode(call), "tf_metal_ops: %s: %s", op, error.c_str());
      if (passes.empty()) return true;
      scratch = call.TakeScratch();
      std::string* err = &error;  // the block runs synchronously: stack pointers stay valid
      TF_Code* codep = &code;
      const std::vector<Resolved>* passesp = &passes;
      const std::string op_name = op;
      dispatch_sync(queue, ^{
        @autoreleasepool {
          @try {
            id<MTLCommandBuffer> cb = metal::EncodeCompute(stream, *passesp, err);
            if (cb == nil) {
              *codep = TF_INTERNAL;
              return;
            }
            metal::AddCompletionHandler(cb, completion, /*report_async=*/!wait, op_name);
            if (wait) {
              [stream commitAndWait];
            } else {
              [stream commit];
            }
          } @catch (NSException* e) {
            *codep = TF_INTERNAL;
            *err = metal::ExceptionMessage(e);
          }
        }
      });
    } @catch (NSException* e) {
      code = TF_INTERNAL;
      error = metal::ExceptionMessage(e);
    }
  }
  DeleteTensors(&scratch);  // encoded: the command buffer holds the buffers, later stream work is ordered after it
  if (code == TF_OK && wait) metal::WaitFor(*completion, &code, &error);
  if (code != TF_OK) return Fail(ctx, code, "tf_metal_ops: %s: %s", op, error.c_str());
  return true;
}

// RunAndRead's backend half: the passes and a blit of the requested bytes into a shared staging buffer, in the
// stream's current command buffer, one commitAndWait; then, outside the queue, the completed handler's verdict and a
// copy out of the staging buffer. The blit (not -contents of the tensor's own buffer) works whatever the storage mode of
// tensorflow-metal's buffers. Scratch tensors stay with the Call (they may be bound again by later passes).
bool ExecuteAndRead(Call& call, const HostRead& read) {
  TF_OpKernelContext* ctx = call.ctx();
  const char* op = call.op();
  TF_Code code = TF_OK;
  std::string error;
  if (std::string earlier = metal::TakePendingGpuError(); !earlier.empty())
    return Fail(ctx, TF_INTERNAL, "tf_metal_ops: %s: an earlier GPU call failed: %s", op, earlier.c_str());
  auto completion = std::make_shared<Completion>();
  @autoreleasepool {
    @try {
      id<TFMOMetalStream> stream = metal::GetStream(ctx, &error);
      if (stream == nil) return Fail(ctx, TF_FAILED_PRECONDITION, "%s", error.c_str());
      dispatch_queue_t queue = [stream queue];
      if (queue == nil) return Fail(ctx, TF_FAILED_PRECONDITION, "tf_metal_ops: the Metal stream has no dispatch queue");
      Binding target;
      target.kind = Binding::Kind::kTensor;
      target.tensor = read.tensor;
      target.size = TF_TensorByteSize(read.tensor);
      id<MTLBuffer> source = metal::BufferOf(target, 0, &error);
      if (source == nil) return Fail(ctx, TF_INTERNAL, "tf_metal_ops: %s: reading back: %s", op, error.c_str());
      std::vector<Resolved> passes;
      id<MTLDevice> device = source.device;
      if (!metal::Resolve(call, &passes, &device, &error))
        return Fail(ctx, metal::ResolveFailureCode(call), "tf_metal_ops: %s: %s", op, error.c_str());
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
            id<MTLCommandBuffer> cb = metal::EncodeComputeAndCopy(stream, *passesp, source, offset, staging, length, err);
            if (cb == nil) {
              *codep = TF_INTERNAL;
              return;
            }
            metal::AddCompletionHandler(cb, completion, /*report_async=*/false, op_name);
            [stream commitAndWait];
          } @catch (NSException* e) {
            *codep = TF_INTERNAL;
            *err = metal::ExceptionMessage(e);
          }
        }
      });
      if (code == TF_OK && metal::WaitFor(*completion, &code, &error)) std::memcpy(read.out, staging.contents, read.bytes);
    } @catch (NSException* e) {
      code = TF_INTERNAL;
      error = metal::ExceptionMessage(e);
    }
  }
  if (code != TF_OK) return Fail(ctx, code, "tf_metal_ops: %s: %s", op, error.c_str());
  return true;
}

}  // namespace tfmo::gpu
