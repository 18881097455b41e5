// The StreamExecutor copies and fills of the emulated GPU (memcpy_*, sync_memcpy_*, mem_zero, memset, memset32).
// Stream-ordered ones are validated when enqueued and resolve their device ranges when they run (stream-ordered
// frees keep the ranges alive until then); sync ones run at once on live allocations.
#include <string.h>

#include <functional>
#include <string>
#include <vector>

#include "device_memory.h"
#include "device_messages.h"
#include "se_single_device.h"
#include "streams.h"

namespace tfmo_emu __attribute__((visibility("hidden"))) {
namespace {

// Validates a device range at enqueue time (live allocations only).
bool CheckRange(const void* addr, uint64_t size, TF_Status* status, const char* what) {
  if (size == 0) return true;
  std::string err;
  if (Resolve(reinterpret_cast<uintptr_t>(addr), size, kNoWork, &err) == nullptr) {
    SetError(status, TF_INVALID_ARGUMENT, std::string(what) + ": " + err);
    return false;
  }
  return true;
}

// A copy or fill of `size` bytes touching one or two device ranges (`ranges[0]` first, e.g. destination then
// source), performed by `op` on the host memory behind them.
struct DeviceRange {
  const void* address;
  const char* role;  // "source" / "destination"
};
using MemoryOp = std::function<void(void* const host[2])>;

std::string ResolveRanges(const std::vector<DeviceRange>& ranges, uint64_t size, uint64_t epoch, void* host[2]) {
  for (size_t i = 0; i < ranges.size(); ++i) {
    std::string err;
    host[i] = Resolve(reinterpret_cast<uintptr_t>(ranges[i].address), size, epoch, &err);
    if (host[i] == nullptr) return std::string(ranges[i].role) + ": " + err;
  }
  return "";
}

void EnqueueMemoryOp(TfmoEmuStream* s, TF_Status* status, const std::string& what, uint64_t size,
                     std::vector<DeviceRange> ranges, MemoryOp op) {
  if (s == nullptr) return SetError(status, TF_INVALID_ARGUMENT, "invalid stream");
  if (size == 0) return;
  for (const DeviceRange& r : ranges)
    if (!CheckRange(r.address, size, status, (what + " " + r.role).c_str())) return;
  auto item = MakeItem(true, nullptr);
  const uint64_t epoch = item->epoch;
  item->run = [what, size, ranges = std::move(ranges), op = std::move(op), epoch]() -> std::string {
    void* host[2] = {nullptr, nullptr};
    const std::string err = ResolveRanges(ranges, size, epoch, host);
    if (!err.empty()) return what + " " + err;
    op(host);
    return "";
  };
  Enqueue(s, std::move(item));
}

void RunMemoryOp(TF_Status* status, const std::string& what, uint64_t size, const std::vector<DeviceRange>& ranges,
                 const MemoryOp& op) {
  if (size == 0) return;
  void* host[2] = {nullptr, nullptr};
  const std::string err = ResolveRanges(ranges, size, kNoWork, host);
  if (!err.empty()) return SetError(status, TF_INVALID_ARGUMENT, what + " " + err);
  op(host);
}

void EnqueueFill(TfmoEmuStream* s, SP_DeviceMemoryBase* loc, uint64_t size, uint32_t pattern, int width,
                 TF_Status* status, const char* what) {
  if (width == 4 && size % 4 != 0)
    return SetError(status, TF_INVALID_ARGUMENT, std::string(what) + ": size " + std::to_string(size) +
                                                     " is not a multiple of 4");
  EnqueueMemoryOp(s, status, what, size, {{loc->opaque, "destination"}}, [size, pattern, width](void* const h[2]) {
    if (width == 1) {
      memset(h[0], static_cast<int>(pattern & 0xFF), size);
    } else {
      for (uint64_t i = 0; i < size / 4; ++i) memcpy(static_cast<char*>(h[0]) + 4 * i, &pattern, 4);
    }
  });
}

}  // namespace
}  // namespace tfmo_emu

namespace tfmo_se __attribute__((visibility("hidden"))) {

using tfmo_emu::EnqueueFill;
using tfmo_emu::EnqueueMemoryOp;
using tfmo_emu::Impl;
using tfmo_emu::RunMemoryOp;

void SeMemcpyDtoH(const SP_Device*, SP_Stream stream, void* host_dst, const SP_DeviceMemoryBase* src, uint64_t size,
                  TF_Status* status) {
  EnqueueMemoryOp(Impl(stream), status, "memcpy_dtoh", size, {{src->opaque, "source"}},
                  [host_dst, size](void* const h[2]) { memcpy(host_dst, h[0], size); });
}

void SeMemcpyHtoD(const SP_Device*, SP_Stream stream, SP_DeviceMemoryBase* dst, const void* host_src, uint64_t size,
                  TF_Status* status) {
  EnqueueMemoryOp(Impl(stream), status, "memcpy_htod", size, {{dst->opaque, "destination"}},
                  [host_src, size](void* const h[2]) { memcpy(h[0], host_src, size); });
}

void SeMemcpyDtoD(const SP_Device*, SP_Stream stream, SP_DeviceMemoryBase* dst, const SP_DeviceMemoryBase* src,
                  uint64_t size, TF_Status* status) {
  EnqueueMemoryOp(Impl(stream), status, "memcpy_dtod", size, {{dst->opaque, "destination"}, {src->opaque, "source"}},
                  [size](void* const h[2]) { memmove(h[0], h[1], size); });
}

void SeSyncMemcpyDtoH(const SP_Device*, void* host_dst, const SP_DeviceMemoryBase* src, uint64_t size,
                      TF_Status* status) {
  RunMemoryOp(status, "sync_memcpy_dtoh", size, {{src->opaque, "source"}},
              [host_dst, size](void* const h[2]) { memcpy(host_dst, h[0], size); });
}

void SeSyncMemcpyHtoD(const SP_Device*, SP_DeviceMemoryBase* dst, const void* host_src, uint64_t size,
                      TF_Status* status) {
  RunMemoryOp(status, "sync_memcpy_htod", size, {{dst->opaque, "destination"}},
              [host_src, size](void* const h[2]) { memcpy(h[0], host_src, size); });
}

void SeSyncMemcpyDtoD(const SP_Device*, SP_DeviceMemoryBase* dst, const SP_DeviceMemoryBase* src, uint64_t size,
                      TF_Status* status) {
  RunMemoryOp(status, "sync_memcpy_dtod", size, {{dst->opaque, "destination"}, {src->opaque, "source"}},
              [size](void* const h[2]) { memmove(h[0], h[1], size); });
}

void SeMemZero(const SP_Device*, SP_Stream stream, SP_DeviceMemoryBase* loc, uint64_t size, TF_Status* status) {
  EnqueueFill(Impl(stream), loc, size, 0, 1, status, "mem_zero");
}

void SeMemset(const SP_Device*, SP_Stream stream, SP_DeviceMemoryBase* loc, uint8_t pattern, uint64_t size,
              TF_Status* status) {
  EnqueueFill(Impl(stream), loc, size, pattern, 1, status, "memset");
}

void SeMemset32(const SP_Device*, SP_Stream stream, SP_DeviceMemoryBase* loc, uint32_t pattern, uint64_t size,
                TF_Status* status) {
  EnqueueFill(Impl(stream), loc, size, pattern, 4, status, "memset32");
}

}  // namespace tfmo_se
