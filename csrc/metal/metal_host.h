// Metal host layer: what every Metal op's host code (csrc/metal/<op>_metal.mm) needs, so each op stays short.
// Objective-C++ only (built on macOS, with -fobjc-arc -fblocks). Conventions: docs/metal_host.md.
//
//  - Stream: TF_GetStream(ctx) is tensorflow-metal's stream object (protocol below, declared by us: no header
//    ships it). It is checked before use; a missing stream or selector fails the op with a message.
//  - Encoding happens only inside dispatch_sync(stream.queue, ...); the work is committed through the stream
//    ([stream commit]); nothing waits unless TF_METAL_OPS_SYNC=1 ([stream commitAndWait], for debugging).
//  - Library: tf_metal_ops.metal3.metallib (macOS 13+) or tf_metal_ops.metallib next to the op library, else the
//    .metal sources embedded at build time, compiled at first use (MSL 3.0 on macOS 13+, else 2.4).
//    One library set per device, created once; pipelines cached per (device, function, specialization).
//  - Errors never abort: every failure becomes an op error through TF_OpKernelContext_Failure.
//
// Typical op (see zero_out_metal.mm):
//   tfmo::metal::Dispatch(ctx, "zero_out_float32", {}, [&](tfmo::metal::Encoder& e) {
//     e.buffer(0, in.get()); e.buffer(1, out.get()); e.value<uint32_t>(2, n); e.threads(n);
//   });
#pragma once

#ifndef __OBJC__
#error "metal_host.h is Objective-C++: include it from .mm files only"
#endif

#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "common/tfc.h"

// tensorflow-metal's stream object, as returned by TF_GetStream (selectors checked at run time).
@protocol TFMOMetalStream <NSObject>
- (dispatch_queue_t)queue;
- (id<MTLCommandBuffer>)currentCommandBuffer;
- (void)commit;
- (void)commitAndWait;
@end

namespace tfmo::metal {

// Function-constant values for one pipeline, by index ([[function_constant(i)]] in MSL).
// Setting the same index twice keeps the last value. Part of the pipeline cache key.
class Specialization {
 public:
  Specialization& Int(uint32_t index, int32_t v);
  Specialization& UInt(uint32_t index, uint32_t v);
  Specialization& Bool(uint32_t index, bool v);
  Specialization& Float(uint32_t index, float v);

  bool empty() const { return constants_.empty(); }
  std::string Key() const;                        // canonical text, e.g. "0:u=16;3:b=1"
  MTLFunctionConstantValues* Values() const;      // nil when empty

  struct Constant {
    uint32_t index;
    MTLDataType type;  // MTLDataTypeInt, UInt, Bool or Float
    uint32_t bits;     // the value's bit pattern (bool: 0/1)
    bool operator==(const Constant& o) const { return index == o.index && type == o.type && bits == o.bits; }
  };
  const std::vector<Constant>& constants() const { return constants_; }  // sorted by index
  bool operator==(const Specialization& o) const { return constants_ == o.constants_; }

 private:
  Specialization& Set(uint32_t index, MTLDataType type, uint32_t bits);
  std::vector<Constant> constants_;
};

// Records the commands of one compute pass. Methods never throw; the first error is kept, later calls become
// no-ops, and Dispatch() reports the error through the op context.
class Encoder {
 public:
  Encoder(id<MTLComputeCommandEncoder> encoder, id<MTLComputePipelineState> pipeline);

  // Binds the MTLBuffer behind a tensor at `index`, offset 0: the C API gives no way to learn a tensor's
  // offset inside its buffer, and tensorflow-metal allocates one buffer per tensor (Apple's sample binds at 0).
  // An empty tensor without a buffer is an error: skip the dispatch for empty work instead.
  void buffer(uint32_t index, TF_Tensor* t);
  void buffer(uint32_t index, const TensorRef& t) { buffer(index, t.get()); }
  // Small constant data (setBytes: Metal allows at most 4096 bytes).
  void bytes(uint32_t index, const void* data, size_t length);
  template <class T>
  void value(uint32_t index, const T& v) {
    static_assert(std::is_trivially_copyable<T>::value, "value<T>: T must be trivially copyable");
    bytes(index, &v, sizeof(T));
  }
  void threadgroup_memory(uint32_t index, size_t length);

  // One thread per grid point (dispatchThreads; non-uniform groups are supported by every Mac GPU on
  // macOS 12+). `group` = threads per threadgroup, 0 = a default multiple of threadExecutionWidth; always
  // clamped to the pipeline's maxTotalThreadsPerThreadgroup. Empty grids dispatch nothing. Each dimension
  // must fit in 32 bits (thread_position_in_grid is uint).
  void threads(uint64_t n, uint32_t group = 0);
  void threads(std::array<uint64_t, 3> grid, std::array<uint32_t, 3> group = {0, 0, 0});
  // Whole threadgroups (dispatchThreadgroups) for kernels that depend on the group size (barriers,
  // threadgroup memory): the size is not clamped; more than max_threads_per_group() is an error.
  void threadgroups(std::array<uint64_t, 3> groups, std::array<uint32_t, 3> group);

  uint32_t max_threads_per_group() const;
  uint32_t execution_width() const;
  id<MTLDevice> device() const;
  id<MTLComputeCommandEncoder> raw() const { return encoder_; }  // for anything not wrapped here

  // Records an error (the first one wins); Dispatch() fails the op with it (default code: TF_INTERNAL).
  void fail(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  void fail(TF_Code code, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  TF_Code code() const { return code_; }

 private:
  id<MTLComputeCommandEncoder> encoder_;
  id<MTLComputePipelineState> pipeline_;
  std::string error_;
  TF_Code code_ = TF_OK;
};

// Runs `encode` inside dispatch_sync on the stream's queue, with a compute encoder of the stream's current
// command buffer whose pipeline is `function` specialised by `spec`, then commits through the stream.
// Returns false after failing ctx (with a message) on any error: no usable stream, library or pipeline,
// or an error recorded by `encode`. Call it only with work to do (skip empty tensors before).
bool Dispatch(TF_OpKernelContext* ctx, const char* function, const Specialization& spec,
              const std::function<void(Encoder&)>& encode);

// Fails ctx unless n fits in a 32-bit grid dimension / kernel index; `what` names the quantity in the message.
bool CheckGridSize(TF_OpKernelContext* ctx, const char* op, const char* what, uint64_t n);

}  // namespace tfmo::metal

// JSON for tf_metal_ops.backend_info(), read through ctypes: {"device_available", "device", "families",
// "metal3", "unified_memory", "os", "msl_runtime_version", "library": {"loaded", "origin", "path", "error",
// "metallib_candidates", "embedded_sources"}}. Cheap: does not load the library. The pointer stays valid until
// the calling thread's next call.
extern "C" __attribute__((visibility("default"))) const char* tfmo_metal_info(void);
