// The device side of the stream protocol (emu_stream.h): queue_sync and its gate, command buffers, commit,
// commit_and_wait and map, over the streams of streams.h.
#include <string.h>

#include <algorithm>
#include <utility>

#include "device_memory.h"
#include "device_messages.h"
#include "emu_stream.h"
#include "streams.h"

// What a queue_sync enqueues: the worker parks here while the caller runs fn, and runs the tasks the caller posts
// (commit_and_wait inside fn), so that work always runs on the stream's own thread.
struct TfmoEmuSyncGate {
  std::mutex mu;
  std::condition_variable cv;
  bool reached = false, released = false;
  std::deque<std::function<void()>> tasks;
  uint64_t posted = 0, done = 0;

  void ParkWorker() {
    std::unique_lock<std::mutex> l(mu);
    reached = true;
    cv.notify_all();
    for (;;) {
      cv.wait(l, [&] { return released || !tasks.empty(); });
      if (tasks.empty()) return;
      std::function<void()> task = std::move(tasks.front());
      tasks.pop_front();
      l.unlock();
      task();
      l.lock();
      ++done;
      cv.notify_all();
    }
  }
  // Called by the queue_sync owner: runs task on the parked worker and waits for it.
  void RunOnWorker(std::function<void()> task) {
    std::unique_lock<std::mutex> l(mu);
    tasks.push_back(std::move(task));
    uint64_t ticket = ++posted;
    cv.notify_all();
    cv.wait(l, [&] { return done >= ticket; });
  }
};

namespace tfmo_emu __attribute__((visibility("hidden"))) {
namespace {

void CopyError(char* error, size_t error_len, const std::string& msg) {
  if (error == nullptr || error_len == 0) return;
  size_t n = std::min(msg.size(), error_len - 1);
  memcpy(error, msg.data(), n);
  error[n] = '\0';
}

// Runs a command buffer's work in order on the current thread; returns the first failure's message or "".
std::string RunCommandBuffer(TfmoEmuStream* s, TfmoEmuCommandBuffer* cb) {
  std::string first_error;
  uint64_t ran = 0, failures = 0;
  for (EncodedWork& w : cb->works) {
    if (first_error.empty()) {
      char msg[TFMO_EMU_ERROR_BYTES];
      msg[0] = '\0';
      uint64_t saved_epoch = tls_work_epoch;
      TfmoEmuStream* saved_stream = tls_running_stream;
      tls_work_epoch = w.epoch;
      tls_running_stream = s;
      int rc = w.work.run != nullptr ? w.work.run(w.work.arg, s, msg, sizeof msg) : -1;
      tls_work_epoch = saved_epoch;
      tls_running_stream = saved_stream;
      ++ran;
      if (rc != 0) {
        ++failures;
        msg[sizeof msg - 1] = '\0';
        first_error = w.work.run == nullptr ? "work item without a run function"
                      : msg[0] != '\0'      ? std::string(msg)
                                            : "work item failed (returned " + std::to_string(rc) + ") without a message";
      }
    }
    if (w.work.release != nullptr) w.work.release(w.work.arg);
    UnregisterEpoch(w.epoch);
  }
  cb->works.clear();
  std::lock_guard<std::mutex> l(s->mu);
  ++s->stats.command_buffers;
  s->stats.work_items += ran;
  s->stats.work_failures += failures;
  return first_error;
}

void RecycleLocked(TfmoEmuStream* s, TfmoEmuCommandBuffer* cb) {
  cb->works.clear();
  cb->done = false;
  cb->error.clear();
  s->cb_pool.push_back(cb);
}

std::unique_ptr<Item> CommandBufferItem(TfmoEmuStream* s, TfmoEmuCommandBuffer* cb) {
  return MakeItem(false, [s, cb]() -> std::string {
    std::string err = RunCommandBuffer(s, cb);
    std::lock_guard<std::mutex> l(s->mu);
    RecycleLocked(s, cb);
    return err.empty() ? "" : "command buffer failed: " + err;
  });
}

// Runs a command buffer on the thread that owns the queue, accounted as one stream item.
std::string RunInline(TfmoEmuStream* s, TfmoEmuCommandBuffer* cb) {
  std::string err = RunCommandBuffer(s, cb);
  std::lock_guard<std::mutex> l(s->mu);
  RecycleLocked(s, cb);
  ++s->enqueued;
  FinishItemLocked(s, err.empty() ? "" : "command buffer failed: " + err);
  return err;
}

void ApiQueueSync(TfmoEmuStream* s, void (*fn)(void* arg), void* arg) {
  if (CheckStream(s) == nullptr || fn == nullptr) return;
  if (tls_queue_sync_stream == s || tls_running_stream == s) {
    // Re-entrant use (forbidden by the protocol; dispatch_sync would deadlock): this thread already owns the
    // queue, so running fn now keeps the serial order.
    {
      StreamRegistry& r = Registry();
      std::lock_guard<std::mutex> l(r.mu);
      if (r.reentrant_queue_syncs++ == 0) LogError("queue_sync called re-entrantly on the same stream; ran inline");
    }
    fn(arg);
    return;
  }
  auto gate = std::make_shared<TfmoEmuSyncGate>();
  Enqueue(s, MakeItem(false, [gate]() -> std::string {
            gate->ParkWorker();
            return "";
          }));
  {
    std::unique_lock<std::mutex> l(gate->mu);
    gate->cv.wait(l, [&] { return gate->reached; });
  }
  // The worker is parked at the gate: this thread owns the queue, after everything enqueued before.
  TfmoEmuStream* saved = tls_queue_sync_stream;
  tls_queue_sync_stream = s;
  {
    std::lock_guard<std::mutex> l(s->mu);
    s->queue_sync_gate = gate;
  }
  fn(arg);
  tls_queue_sync_stream = saved;
  {
    // Buffers committed during fn go first, in commit order, right behind the gate (nothing ran in between).
    std::lock_guard<std::mutex> l(s->mu);
    s->queue_sync_gate.reset();
    ++s->stats.queue_syncs;
    std::vector<TfmoEmuCommandBuffer*> commits;
    commits.swap(s->queue_sync_commits);
    for (size_t i = commits.size(); i-- > 0;) {
      s->fifo.push_front(CommandBufferItem(s, commits[i]));
      ++s->enqueued;
    }
  }
  std::lock_guard<std::mutex> l(gate->mu);
  gate->released = true;
  gate->cv.notify_all();
}

TfmoEmuCommandBuffer* ApiCurrentCommandBuffer(TfmoEmuStream* s) {
  if (CheckStream(s) == nullptr) return nullptr;
  std::lock_guard<std::mutex> l(s->mu);
  if (s->open_cb == nullptr) {
    if (!s->cb_pool.empty()) {
      s->open_cb = s->cb_pool.back();
      s->cb_pool.pop_back();
    } else {
      s->cb_owned.push_back(std::make_unique<TfmoEmuCommandBuffer>());
      s->open_cb = s->cb_owned.back().get();
      s->open_cb->stream = s;
    }
  }
  return s->open_cb;
}

void ApiEncode(TfmoEmuCommandBuffer* cb, TfmoEmuWork work) {
  if (cb == nullptr || CheckStream(cb->stream) == nullptr) {
    LogError("encode into a null or invalid command buffer; the work is dropped");
    if (work.release != nullptr) work.release(work.arg);
    return;
  }
  TfmoEmuStream* s = cb->stream;
  uint64_t epoch = RegisterEpoch();
  std::unique_lock<std::mutex> l(s->mu);
  if (s->open_cb != cb) {
    std::string err = "encode into a command buffer that is not the stream's current one (already committed?)";
    FailLocked(s, err);
    l.unlock();
    LogError(err);
    if (work.release != nullptr) work.release(work.arg);
    UnregisterEpoch(epoch);
    return;
  }
  cb->works.push_back(EncodedWork{work, epoch});
}

void ApiCommit(TfmoEmuStream* s) {
  if (CheckStream(s) == nullptr) return;
  TfmoEmuCommandBuffer* cb;
  {
    std::lock_guard<std::mutex> l(s->mu);
    cb = TakeOpenLocked(s);
    if (cb == nullptr) return;
    if (cb->works.empty()) {
      RecycleLocked(s, cb);
      return;
    }
    if (tls_queue_sync_stream == s) {  // the FIFO is parked behind this thread's gate: keep commit order
      s->queue_sync_commits.push_back(cb);
      return;
    }
  }
  Enqueue(s, CommandBufferItem(s, cb));
}

int ApiCommitAndWait(TfmoEmuStream* s, char* error, size_t error_len) {
  CopyError(error, error_len, "");
  if (CheckStream(s) == nullptr) {
    CopyError(error, error_len, "commit_and_wait on an invalid stream");
    return 1;
  }
  TfmoEmuCommandBuffer* cb;
  {
    std::lock_guard<std::mutex> l(s->mu);
    cb = TakeOpenLocked(s);
  }
  std::string err;
  if (tls_queue_sync_stream == s || tls_running_stream == s) {
    // Inside queue_sync (the worker is parked at this thread's gate) or on the worker itself: everything enqueued
    // before has run and nothing else can run, so the buffers run now, in commit order, on the stream's thread.
    auto run = [&] {
      std::vector<TfmoEmuCommandBuffer*> earlier;
      {
        std::lock_guard<std::mutex> l(s->mu);
        earlier.swap(s->queue_sync_commits);
      }
      for (TfmoEmuCommandBuffer* e : earlier) {  // committed earlier in this queue_sync: they run first
        std::string e_err = RunInline(s, e);
        if (!e_err.empty()) LogError("stream " + std::to_string(s->id) + ": command buffer failed: " + e_err);
      }
      if (cb != nullptr) err = RunInline(s, cb);
    };
    std::shared_ptr<TfmoEmuSyncGate> gate;
    if (tls_queue_sync_stream == s) {
      std::lock_guard<std::mutex> l(s->mu);
      gate = s->queue_sync_gate;
    }
    if (gate != nullptr && tls_running_stream != s) {
      gate->RunOnWorker(run);  // on the stream's own thread, parked at this queue_sync's gate
    } else {
      run();  // already on the stream's thread (re-entrant use from work)
    }
  } else {
    // From a thread that does not own the queue: enqueue (after everything before) and wait for it.
    if (cb == nullptr) {
      DrainStream(s);
      return 0;
    }
    auto done = std::make_shared<std::pair<bool, std::string>>(false, "");
    Enqueue(s, MakeItem(false, [s, cb, done]() -> std::string {
              std::string e = RunCommandBuffer(s, cb);
              std::lock_guard<std::mutex> l(s->mu);
              RecycleLocked(s, cb);
              done->first = true;
              done->second = e;  // cv_done is notified by the worker after this item
              return e.empty() ? "" : "command buffer failed: " + e;
            }));
    std::unique_lock<std::mutex> l(s->mu);
    s->cv_done.wait(l, [&] { return done->first; });
    err = done->second;
  }
  if (err.empty()) return 0;
  CopyError(error, error_len, err);
  return 1;
}

void* ApiMap(TfmoEmuStream* s, const void* device_address, size_t bytes, char* error, size_t error_len) {
  if (CheckStream(s) == nullptr) {
    CopyError(error, error_len, "map on an invalid stream");
    return nullptr;
  }
  std::string err;
  void* p = Resolve(reinterpret_cast<uintptr_t>(device_address), bytes, tls_work_epoch, &err);
  if (p == nullptr) CopyError(error, error_len, err);
  return p;
}

const char* ApiDeviceName(TfmoEmuStream*) { return kDeviceName; }

const TfmoEmuStreamApi kApi = {
    sizeof(TfmoEmuStreamApi), ApiQueueSync, ApiCurrentCommandBuffer, ApiEncode, ApiCommit,
    ApiCommitAndWait,         ApiMap,       ApiDeviceName,
};

}  // namespace

const TfmoEmuStreamApi* StreamApi() { return &kApi; }

}  // namespace tfmo_emu
