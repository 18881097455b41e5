// The emulated GPU as a PluggableDevice (TF StreamExecutor C API): device type "GPU", platform
// "TFMO_EMULATED_METAL", one device (se_single_device.h), SE_InitPlugin. The callbacks here adapt the device's
// memory (device_memory.h) and streams (streams.h) to TF: allocation, stream lifetime and status, events,
// synchronization and host callbacks; copies and fills are in device_copies.cc. Its SP_Stream starts with a
// TfmoEmuStreamHeader (emu_stream.h), so the direct backend drives it the way the Metal backend drives
// tensorflow-metal's stream.
#include <stdlib.h>

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "device_memory.h"
#include "device_messages.h"
#include "fault_reporter.h"
#include "se_single_device.h"
#include "streams.h"

// A TF event: a generation counter that the recording stream completes when it reaches the record.
struct TfmoEmuEventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // generation of the latest record_event
  uint64_t completed = 0;  // generation reached by the recording stream
  void Complete(uint64_t gen) {
    std::lock_guard<std::mutex> l(mu);
    completed = std::max(completed, gen);
    cv.notify_all();
  }
  void WaitFor(uint64_t gen) {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return completed >= gen; });
  }
  uint64_t Record() {
    std::lock_guard<std::mutex> l(mu);
    return ++recorded;
  }
  uint64_t Recorded() {
    std::lock_guard<std::mutex> l(mu);
    return recorded;
  }
};

struct SP_Event_st {
  std::shared_ptr<TfmoEmuEventState> state;
};

namespace tfmo_se __attribute__((visibility("hidden"))) {

using namespace tfmo_emu;  // the device's internals

namespace {

// Stream items that complete an event generation, or wait for one.
std::unique_ptr<Item> CompleteEventItem(std::shared_ptr<TfmoEmuEventState> ev, uint64_t gen) {
  return MakeItem(false, [ev, gen]() -> std::string {
    ev->Complete(gen);
    return "";
  });
}

std::unique_ptr<Item> WaitEventItem(std::shared_ptr<TfmoEmuEventState> ev, uint64_t gen) {
  return MakeItem(false, [ev, gen]() -> std::string {
    ev->WaitFor(gen);
    return "";
  });
}

}  // namespace

const SingleDevice kDevice = {kPlatformName, kDeviceType, kDeviceName, kPrefix, 50ll * 1000 * 1000 * 1000, 100.0};

void SeAllocate(const SP_Device*, uint64_t size, int64_t, SP_DeviceMemoryBase* mem) {
  mem->struct_size = SP_DEVICE_MEMORY_BASE_STRUCT_SIZE;
  void* p = AllocateDevice(size);
  mem->opaque = p;
  mem->size = p != nullptr ? size : 0;
  mem->payload = 0;
}

void SeDeallocate(const SP_Device*, SP_DeviceMemoryBase* mem) {
  if (mem != nullptr) DeallocateDevice(mem->opaque);
}

void* SeHostAllocate(const SP_Device*, uint64_t size) {
  void* p = nullptr;
  if (posix_memalign(&p, 64, AlignUp(std::max<uint64_t>(size, 1), 64)) != 0) return nullptr;
  return p;
}

void SeHostDeallocate(const SP_Device*, void* mem) { free(mem); }

TF_Bool SeAllocatorStats(const SP_Device*, SP_AllocatorStats* stats) {
  const MemoryStats m = GetMemoryStats();
  stats->struct_size = SP_ALLOCATORSTATS_STRUCT_SIZE;
  stats->num_allocs = static_cast<int64_t>(m.total_allocs);
  stats->bytes_in_use = static_cast<int64_t>(m.held_bytes);
  stats->peak_bytes_in_use = static_cast<int64_t>(m.peak_held_bytes);
  stats->largest_alloc_size = static_cast<int64_t>(m.largest_alloc);
  stats->has_bytes_limit = 1;
  stats->bytes_limit = static_cast<int64_t>(m.limit);
  stats->bytes_reserved = 0;
  stats->peak_bytes_reserved = 0;
  stats->has_bytes_reservable_limit = 0;
  stats->bytes_reservable_limit = 0;
  stats->largest_free_block_bytes = static_cast<int64_t>(m.limit - m.held_bytes);
  return 1;
}

TF_Bool SeMemoryUsage(const SP_Device*, int64_t* free_bytes, int64_t* total) {
  const MemoryStats m = GetMemoryStats();
  *free_bytes = static_cast<int64_t>(m.limit - m.held_bytes);
  *total = static_cast<int64_t>(m.limit);
  return 1;
}

void SeCreateStream(const SP_Device*, SP_Stream* stream, TF_Status* status) {
  std::string err;
  *stream = CreateStream(&err);
  if (*stream == nullptr) SetError(status, TF_RESOURCE_EXHAUSTED, err);
}

void SeDestroyStream(const SP_Device*, SP_Stream stream) { DestroyStream(stream); }

void SeCreateStreamDependency(const SP_Device*, SP_Stream dependent, SP_Stream other, TF_Status* status) {
  TfmoEmuStream* d = Impl(dependent);
  TfmoEmuStream* o = Impl(other);
  if (d == nullptr || o == nullptr) return SetError(status, TF_INVALID_ARGUMENT, "invalid stream");
  if (d == o) return;
  auto ev = std::make_shared<TfmoEmuEventState>();
  Enqueue(o, CompleteEventItem(ev, 1));
  Enqueue(d, WaitEventItem(ev, 1));
}

void SeGetStreamStatus(const SP_Device*, SP_Stream stream, TF_Status* status) {
  TfmoEmuStream* s = Impl(stream);
  if (s == nullptr) return SetError(status, TF_INVALID_ARGUMENT, "invalid stream");
  std::lock_guard<std::mutex> l(s->mu);
  if (s->failed) SetError(status, TF_INTERNAL, s->error);
  else TF_SetStatus(status, TF_OK, "");
}

void SeCreateEvent(const SP_Device*, SP_Event* event, TF_Status*) {
  *event = new SP_Event_st{std::make_shared<TfmoEmuEventState>()};
}

void SeDestroyEvent(const SP_Device*, SP_Event event) { delete event; }

SE_EventStatus SeEventStatus(const SP_Device*, SP_Event event) {
  if (event == nullptr) return SE_EVENT_ERROR;
  std::lock_guard<std::mutex> l(event->state->mu);
  return event->state->completed >= event->state->recorded ? SE_EVENT_COMPLETE : SE_EVENT_PENDING;
}

void SeRecordEvent(const SP_Device*, SP_Stream stream, SP_Event event, TF_Status* status) {
  TfmoEmuStream* s = Impl(stream);
  if (s == nullptr || event == nullptr) return SetError(status, TF_INVALID_ARGUMENT, "invalid stream or event");
  const uint64_t gen = event->state->Record();
  Enqueue(s, CompleteEventItem(event->state, gen));
}

void SeWaitForEvent(const SP_Device*, SP_Stream stream, SP_Event event, TF_Status* status) {
  TfmoEmuStream* s = Impl(stream);
  if (s == nullptr || event == nullptr) return SetError(status, TF_INVALID_ARGUMENT, "invalid stream or event");
  Enqueue(s, WaitEventItem(event->state, event->state->Recorded()));
}

void SeBlockHostForEvent(const SP_Device*, SP_Event event, TF_Status* status) {
  if (event == nullptr) return SetError(status, TF_INVALID_ARGUMENT, "invalid event");
  event->state->WaitFor(event->state->Recorded());
}

void SeBlockHostUntilDone(const SP_Device*, SP_Stream stream, TF_Status* status) {
  TfmoEmuStream* s = Impl(stream);
  if (s == nullptr) return SetError(status, TF_INVALID_ARGUMENT, "invalid stream");
  if (tls_running_stream == s || tls_queue_sync_stream == s)
    return SetError(status, TF_FAILED_PRECONDITION, "block_host_until_done from the stream's own queue would deadlock");
  DrainStream(s);
  std::lock_guard<std::mutex> l(s->mu);
  if (s->failed) SetError(status, TF_INTERNAL, s->error);
}

void SeSynchronizeAllActivity(const SP_Device*, TF_Status*) { SynchronizeAllStreams(); }

TF_Bool SeHostCallback(const SP_Device*, SP_Stream stream, SE_StatusCallbackFn fn, void* arg) {
  TfmoEmuStream* s = Impl(stream);
  if (s == nullptr || fn == nullptr) return 0;
  Enqueue(s, MakeItem(false, [fn, arg]() -> std::string {
            TF_Status* st = TF_NewStatus();
            fn(arg, st);
            if (TF_GetCode(st) != TF_OK) {  // as TF's own executors do: log, the stream stays usable
              {
                StreamRegistry& r = Registry();
                std::lock_guard<std::mutex> l(r.mu);
                ++r.host_callback_errors;
              }
              LogError(std::string("host callback failed: ") + TF_Message(st));
            }
            TF_DeleteStatus(st);
            return "";
          }));
  return 1;
}

}  // namespace tfmo_se

extern "C" __attribute__((visibility("default"))) void SE_InitPlugin(SE_PlatformRegistrationParams* params,
                                                                     TF_Status* status) {
  std::string err = tfmo_emu::InitMemory();
  if (!err.empty()) return tfmo_emu::SetError(status, TF_RESOURCE_EXHAUSTED, err);
  tfmo_emu::InstallFaultReporter();
  tfmo_se::FillRegistration(params);
}
