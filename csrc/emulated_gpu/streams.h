// The emulated GPU's streams: the TfmoEmuStream behind emu_stream.h's opaque handle, its command buffers, its worker
// thread draining a FIFO of items, and the registry of live streams.
//
// Conventions:
//  - Each stream has one worker thread; items run one at a time in FIFO order on that thread. A commit_and_wait
//    inside queue_sync runs its buffers on the same thread, parked at the queue_sync's gate (emu_stream.cc).
//  - An item that touches device memory registers an epoch when it is created and unregisters it after it ran
//    (device_memory.h): that is what keeps a deallocated range alive until older work is done.
//  - Lock order: a stream's `mu` and the registry's `mu` are never held together, nor with device memory's lock.
#pragma once

#include <stdint.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "device_memory.h"
#include "emu_stream.h"
#include "tensorflow/c/experimental/stream_executor/stream_executor.h"

namespace tfmo_emu __attribute__((visibility("hidden"))) {

struct StreamStats {
  uint64_t items_run = 0, item_failures = 0, command_buffers = 0, work_items = 0, work_failures = 0,
           queue_syncs = 0;
};

struct EncodedWork {
  TfmoEmuWork work;
  uint64_t epoch;
};

struct Item {
  bool has_epoch = false;
  uint64_t epoch = 0;
  std::function<std::string()> run;  // returns "" or an error message
};

}  // namespace tfmo_emu

struct TfmoEmuSyncGate;  // what a queue_sync parks the worker at (emu_stream.cc)

struct __attribute__((visibility("hidden"))) TfmoEmuCommandBuffer {
  TfmoEmuStream* stream = nullptr;
  std::vector<tfmo_emu::EncodedWork> works;
  // commit_and_wait from another thread waits for these (guarded by the stream's mutex)
  bool done = false;
  std::string error;
};

struct __attribute__((visibility("hidden"))) TfmoEmuStream {
  uint64_t magic = TFMO_EMU_STREAM_MAGIC;
  int id = 0;
  std::mutex mu;
  std::condition_variable cv_work, cv_done;
  std::deque<std::unique_ptr<tfmo_emu::Item>> fifo;
  uint64_t enqueued = 0, completed = 0;
  bool stop = false;
  std::thread worker;
  TfmoEmuCommandBuffer* open_cb = nullptr;
  std::vector<TfmoEmuCommandBuffer*> cb_pool;  // recycled command buffers (handles stay valid memory)
  std::vector<std::unique_ptr<TfmoEmuCommandBuffer>> cb_owned;
  // Buffers committed inside the current queue_sync (the worker is parked at its gate): they run first when the
  // gate opens, or inline, before the buffer of a commit_and_wait inside the same queue_sync.
  std::vector<TfmoEmuCommandBuffer*> queue_sync_commits;
  std::shared_ptr<TfmoEmuSyncGate> queue_sync_gate;  // the gate of the current queue_sync (its owner's use only)
  bool failed = false;
  std::string error;
  tfmo_emu::StreamStats stats;
};

struct __attribute__((visibility("hidden"))) SP_Stream_st {
  TfmoEmuStreamHeader header;  // first member: what the direct backend reads through TF_GetStream
  TfmoEmuStream* impl;
};

namespace tfmo_emu __attribute__((visibility("hidden"))) {

// Streams alive, and the counters that outlive them.
struct StreamRegistry {
  std::mutex mu;  // guards everything below
  std::vector<std::shared_ptr<TfmoEmuStream>> streams;
  uint64_t streams_created = 0, host_callback_errors = 0, reentrant_queue_syncs = 0;
  StreamStats destroyed_streams;  // totals of streams already destroyed
};
StreamRegistry& Registry();

inline thread_local uint64_t tls_work_epoch = kNoWork;                // epoch of the work item this thread runs
inline thread_local TfmoEmuStream* tls_running_stream = nullptr;     // stream whose item this thread is running
inline thread_local TfmoEmuStream* tls_queue_sync_stream = nullptr;  // stream this thread holds through queue_sync

inline TfmoEmuStream* CheckStream(TfmoEmuStream* s) {
  return s != nullptr && s->magic == TFMO_EMU_STREAM_MAGIC ? s : nullptr;
}
inline TfmoEmuStream* Impl(SP_Stream stream) { return stream != nullptr ? CheckStream(stream->impl) : nullptr; }

// The first failure becomes the stream's error (its TF status); caller holds s->mu.
inline void FailLocked(TfmoEmuStream* s, const std::string& error) {
  if (!s->failed) {
    s->failed = true;
    s->error = error;
  }
}

// Accounts one item that has run, with its error or ""; caller holds s->mu.
inline void FinishItemLocked(TfmoEmuStream* s, const std::string& error) {
  ++s->completed;
  ++s->stats.items_run;
  if (error.empty()) return;
  ++s->stats.item_failures;
  FailLocked(s, error);
}

// An item running `fn`; with `uses_memory`, it registers an epoch now (device_memory.h).
std::unique_ptr<Item> MakeItem(bool uses_memory, std::function<std::string()> fn);
void Enqueue(TfmoEmuStream* s, std::unique_ptr<Item> item);
void DrainStream(TfmoEmuStream* s);  // waits until everything enqueued on `s` so far has completed
void SynchronizeAllStreams();        // drains every stream, except one this thread owns

// Detaches the stream's open command buffer (null if none); caller holds s->mu.
TfmoEmuCommandBuffer* TakeOpenLocked(TfmoEmuStream* s);

// A new stream with its worker running, or null with the reason in *error.
SP_Stream CreateStream(std::string* error);
// Drains the stream (unless called from its own worker), discards an uncommitted buffer, stops and frees it.
void DestroyStream(SP_Stream stream);

const TfmoEmuStreamApi* StreamApi();  // emu_stream.cc

}  // namespace tfmo_emu
