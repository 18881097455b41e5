// The Metal backend's stream part: tensorflow-metal's stream object (TF_GetStream) and the MTLBuffer behind a
// tensor (TF_TensorData), each checked to be an Objective-C object of the expected kind before the first message.
// Objective-C++ only. Conventions: docs/metal_host.md#the-stream-protocol.
//
// Both pointers are opaque and are Objective-C objects only under tensorflow-metal; messaging anything else would
// crash. So a pointer must be the start of a heap block large enough for an isa whose class is registered with the
// runtime (TF_METAL_OPS_SKIP_OBJECT_CHECK=1 skips the heap-block check), then answer the selectors / conform to the
// protocol it is used for. Verdicts are cached per class.
#pragma once

#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <cstdint>
#include <string>

#include "common/tfc.h"
#include "gpu/gpu_host.h"

// tensorflow-metal's stream object, as returned by TF_GetStream (no header ships it; selectors checked at run time).
// Every message but -queue is sent inside dispatch_sync(queue, ...). -commit hands the current command buffer to the
// stream, which may submit it later (nothing public says it submits at once); -commitAndWait submits everything
// committed so far and waits for it, so a caller that waits for its own work uses it.
@protocol TFMOMetalStream <NSObject>
- (dispatch_queue_t)queue;
- (id<MTLCommandBuffer>)currentCommandBuffer;
- (void)commit;
- (void)commitAndWait;
@end

namespace tfmo::metal {

// The stream of the op's device, or nil with *error (no stream, not an Objective-C object, missing selectors).
id<TFMOMetalStream> GetStream(TF_OpKernelContext* ctx, std::string* error);

// The MTLBuffer behind the tensor bound at `slot` (at least b.size bytes long), or nil with *error.
id<MTLBuffer> BufferOf(const gpu::Binding& b, uint32_t slot, std::string* error);

}  // namespace tfmo::metal
