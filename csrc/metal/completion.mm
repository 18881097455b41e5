// The Metal backend's completion part (completion.h): completed handlers, waiting, and GPU errors kept for later.
#import <Metal/Metal.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include "metal/completion.h"
#include "metal/objc_util.h"

namespace tfmo::metal {
namespace {

// GPU errors of calls nobody waited for: the first unreported one fails the next call; all are counted.
std::mutex g_gpu_error_mu;
std::string* g_pending_gpu_error = new std::string();  // never freed (process-long)
std::string* g_last_gpu_error = new std::string();
uint64_t g_gpu_errors = 0;

double TimeoutSeconds() {
  static const double t = [] {
    const char* v = std::getenv("TF_METAL_OPS_GPU_TIMEOUT");
    const double s = v != nullptr ? std::atof(v) : 0;
    return s > 0 ? s : 300.0;
  }();
  return t;
}

}  // namespace

bool SyncRequested() {
  static const bool sync = EnvIs("TF_METAL_OPS_SYNC", "1");
  return sync;
}

void AddCompletionHandler(id<MTLCommandBuffer> cb, std::shared_ptr<Completion> c, bool report_async, std::string op) {
  [cb addCompletedHandler:^(id<MTLCommandBuffer> done) {
    // `done` is the command buffer that ran (an MPSCommandBuffer's root), so its status is the real one.
    const bool failed = done.status == MTLCommandBufferStatusError;
    const std::string message = failed ? op + ": the GPU command buffer failed: " + Describe(done.error) : "";
    if (failed) {
      std::lock_guard<std::mutex> lock(g_gpu_error_mu);
      ++g_gpu_errors;
      *g_last_gpu_error = message;
      if (report_async && g_pending_gpu_error->empty()) *g_pending_gpu_error = message;
    }
    {
      std::lock_guard<std::mutex> lock(c->mu);
      c->done = true;
      c->failed = failed;
      c->error = message;
    }
    c->cv.notify_all();
  }];
}

bool WaitFor(Completion& c, TF_Code* code, std::string* error) {
  std::unique_lock<std::mutex> lock(c.mu);
  const auto limit = std::chrono::duration<double>(TimeoutSeconds());
  if (!c.cv.wait_for(lock, limit, [&] { return c.done; })) {
    *code = TF_DEADLINE_EXCEEDED;
    *error = "the GPU did not finish the command buffer within " + std::to_string(int(TimeoutSeconds())) +
             " s (TF_METAL_OPS_GPU_TIMEOUT)";
    return false;
  }
  if (c.failed) {
    *code = TF_INTERNAL;
    *error = c.error;
    return false;
  }
  return true;
}

std::string TakePendingGpuError() {
  std::lock_guard<std::mutex> lock(g_gpu_error_mu);
  std::string e;
  e.swap(*g_pending_gpu_error);
  return e;
}

GpuErrorReport GpuErrors() {
  std::lock_guard<std::mutex> lock(g_gpu_error_mu);
  return {g_gpu_errors, *g_last_gpu_error};
}

}  // namespace tfmo::metal
