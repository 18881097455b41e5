// The Metal backend's completion part: what a command buffer's completed handler saw, waiting for it, and the GPU
// errors of calls nobody waited for. Objective-C++ only. Conventions: docs/metal_host.md#the-stream-protocol.
//
// Every call adds a completion handler before its commit; the handler records the command buffer's own status and
// error. Waiting (TF_METAL_OPS_SYNC=1, ExecuteAndRead; the buffer submitted by [stream commitAndWait]) waits for
// that handler, outside the stream's queue, with a timeout (TF_METAL_OPS_GPU_TIMEOUT seconds, default 300): never
// on the stream's current buffer, which an MPSCommandBuffer-style stream commits-and-continues, wrapping a new buffer. A GPU error of an asynchronous call is
// kept and fails the next call (and shows in backend_info).
#pragma once

#import <Metal/Metal.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "common/tfc.h"

namespace tfmo::metal {

// TF_METAL_OPS_SYNC=1 (read once): every call waits for the GPU and reports its error at the op.
bool SyncRequested();

// What a command buffer's completed handler saw, for a waiter.
struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool failed = false;
  std::string error;
};

// Adds the completed handler to `cb` (before its commit). `report_async`: a GPU error is kept for the next call.
void AddCompletionHandler(id<MTLCommandBuffer> cb, std::shared_ptr<Completion> c, bool report_async, std::string op);

// Waits (outside the stream's queue) for the completed handler. False with *code and *error on a GPU error or timeout.
bool WaitFor(Completion& c, TF_Code* code, std::string* error);

// The first GPU error of an earlier asynchronous call, once ("" when there is none).
std::string TakePendingGpuError();

// All GPU errors of the process, for backend_info().
struct GpuErrorReport {
  uint64_t count = 0;
  std::string last;  // "" when there was none
};
GpuErrorReport GpuErrors();

}  // namespace tfmo::metal
