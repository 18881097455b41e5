// The Metal backend's encode part (encode.h): resolving a Call's passes and encoding them on the stream.
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu/gpu_host.h"
#include "metal/device.h"
#include "metal/encode.h"
#include "metal/stream.h"

namespace tfmo::metal {
namespace {

using gpu::Binding;
using gpu::kMaxBufferSlots;
using gpu::Pass;

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

}  // namespace

bool Resolve(gpu::Call& call, std::vector<Resolved>* out, id<MTLDevice>* device, std::string* error) {
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
      g = gpu::ResolveGroup(p.grid(), g, max, width);
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

TF_Code ResolveFailureCode(const gpu::Call& call) {
  for (const auto& p : call.passes())
    if (p->source() != nullptr) return TF_INVALID_ARGUMENT;
  return TF_INTERNAL;
}

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

id<MTLCommandBuffer> EncodeComputeAndCopy(id<TFMOMetalStream> stream, const std::vector<Resolved>& passes,
                                          id<MTLBuffer> source, NSUInteger offset, id<MTLBuffer> staging,
                                          NSUInteger length, std::string* err) {
  id<MTLCommandBuffer> cb = nil;
  if (!passes.empty() && (cb = EncodeCompute(stream, passes, err)) == nil) return nil;
  id<MTLBlitCommandEncoder> blit =
      cb != nil ? [cb blitCommandEncoder]
                : EncoderOn(stream, &cb, [](id<MTLCommandBuffer> b) -> id { return [b blitCommandEncoder]; });
  if (blit == nil) {
    *err = cb == nil ? "the Metal stream has no current command buffer" : "could not create a Metal blit command encoder";
    return nil;
  }
  [blit copyFromBuffer:source sourceOffset:offset toBuffer:staging destinationOffset:0 size:length];
  [blit endEncoding];
  return cb;
}

}  // namespace tfmo::metal
