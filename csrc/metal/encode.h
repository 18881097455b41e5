// The Metal backend's encode part: a Call's passes resolved outside the stream's queue (buffers, pipelines, group
// sizes), then encoded inside it. Objective-C++ only. Conventions: docs/metal_host.md.
//
// Encoding happens only inside dispatch_sync(stream.queue, ...): [stream commit] first (it ends any encoder the
// stream keeps open for its own kernels: nothing public says tensorflow-metal never does), then one compute encoder
// on [stream currentCommandBuffer] for all passes of a Call (serial dispatch: each pass sees the previous one's
// writes). The caller adds the completion handler and commits.
#pragma once

#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <string>
#include <vector>

#include "common/tfc.h"
#include "gpu/gpu_host.h"
#include "metal/stream.h"

namespace tfmo::metal {

// One pass, resolved outside the queue: pipeline, buffers and group size.
struct Resolved {
  const gpu::Pass* pass;
  id<MTLComputePipelineState> pipeline;
  id<MTLBuffer> buffers[gpu::kMaxBufferSlots];
  MTLSize grid, group;
};

// The non-empty passes of `call`, resolved. *device: the Metal device of their tensors (when not nil on entry, every
// tensor must live on it). False with *error when a tensor is no MTLBuffer, tensors live on two devices, a pipeline
// is missing or a pass asks for more threads or threadgroup memory than its pipeline allows.
bool Resolve(gpu::Call& call, std::vector<Resolved>* out, id<MTLDevice>* device, std::string* error);

// The error code for a failed Resolve: the package's bug (TF_INTERNAL), except for a user's inline kernel source
// that does not compile or asks for more than the pipeline allows (TF_INVALID_ARGUMENT).
TF_Code ResolveFailureCode(const gpu::Call& call);

// Inside the stream's queue: `passes` in one compute encoder on a command buffer of the stream; the buffer, or nil
// with *err when the stream gives no buffer or encoder.
id<MTLCommandBuffer> EncodeCompute(id<TFMOMetalStream> stream, const std::vector<Resolved>& passes, std::string* err);

// Inside the stream's queue: `passes` as EncodeCompute (when there are any), then a blit of `length` bytes at
// `offset` of `source` into `staging` on the same command buffer; the buffer, or nil with *err.
id<MTLCommandBuffer> EncodeComputeAndCopy(id<TFMOMetalStream> stream, const std::vector<Resolved>& passes,
                                          id<MTLBuffer> source, NSUInteger offset, id<MTLBuffer> staging,
                                          NSUInteger length, std::string* err);

}  // namespace tfmo::metal
