// The emulated GPU's streams: workers, FIFO items, the registry, creation and destruction (streams.h).
#include "streams.h"

#include <algorithm>
#include <exception>

#include "device_memory.h"
#include "device_messages.h"

namespace tfmo_emu __attribute__((visibility("hidden"))) {

StreamRegistry& Registry() {
  static StreamRegistry* r = new StreamRegistry;  // never destroyed: worker threads may outlive static destructors
  return *r;
}

void Enqueue(TfmoEmuStream* s, std::unique_ptr<Item> item) {
  std::lock_guard<std::mutex> l(s->mu);
  s->fifo.push_back(std::move(item));
  ++s->enqueued;
  s->cv_work.notify_one();
}

std::unique_ptr<Item> MakeItem(bool uses_memory, std::function<std::string()> fn) {
  auto item = std::make_unique<Item>();
  item->run = std::move(fn);
  if (uses_memory) {
    item->has_epoch = true;
    item->epoch = RegisterEpoch();
  }
  return item;
}

void DrainStream(TfmoEmuStream* s) {
  std::unique_lock<std::mutex> l(s->mu);
  uint64_t target = s->enqueued;
  s->cv_done.wait(l, [&] { return s->completed >= target; });
}

void SynchronizeAllStreams() {
  std::vector<std::shared_ptr<TfmoEmuStream>> streams;
  {
    StreamRegistry& r = Registry();
    std::lock_guard<std::mutex> l(r.mu);
    streams = r.streams;
  }
  for (auto& s : streams) {
    if (tls_running_stream == s.get() || tls_queue_sync_stream == s.get()) continue;
    DrainStream(s.get());
  }
}

TfmoEmuCommandBuffer* TakeOpenLocked(TfmoEmuStream* s) {
  TfmoEmuCommandBuffer* cb = s->open_cb;
  s->open_cb = nullptr;
  return cb;
}

namespace {

void WorkerLoop(TfmoEmuStream* s) {
  tls_running_stream = s;
  for (;;) {
    std::unique_ptr<Item> item;
    {
      std::unique_lock<std::mutex> l(s->mu);
      s->cv_work.wait(l, [&] { return s->stop || !s->fifo.empty(); });
      if (s->fifo.empty()) return;
      item = std::move(s->fifo.front());
      s->fifo.pop_front();
    }
    tls_work_epoch = item->has_epoch ? item->epoch : kNoWork;
    std::string err = item->run();
    tls_work_epoch = kNoWork;
    if (item->has_epoch) UnregisterEpoch(item->epoch);
    item.reset();
    std::lock_guard<std::mutex> l(s->mu);
    FinishItemLocked(s, err);
    if (!err.empty()) LogError("stream " + std::to_string(s->id) + ": " + err);
    s->cv_done.notify_all();
  }
}

}  // namespace

SP_Stream CreateStream(std::string* error) {
  auto impl = std::make_shared<TfmoEmuStream>();
  auto* sp = new SP_Stream_st;
  sp->header.magic = TFMO_EMU_STREAM_MAGIC;
  sp->header.api = StreamApi();
  sp->header.self = impl.get();
  sp->impl = impl.get();
  StreamRegistry& r = Registry();
  {
    std::lock_guard<std::mutex> l(r.mu);
    impl->id = static_cast<int>(r.streams_created++);
    r.streams.push_back(impl);
  }
  try {
    impl->worker = std::thread(WorkerLoop, impl.get());
  } catch (const std::exception& e) {
    {
      std::lock_guard<std::mutex> l(r.mu);
      r.streams.erase(std::find(r.streams.begin(), r.streams.end(), impl));
    }
    delete sp;
    *error = std::string("cannot start a stream thread: ") + e.what();
    return nullptr;
  }
  return sp;
}

void DestroyStream(SP_Stream stream) {
  TfmoEmuStream* s = Impl(stream);
  if (s == nullptr) return;
  StreamRegistry& r = Registry();
  std::shared_ptr<TfmoEmuStream> keep;
  {
    std::lock_guard<std::mutex> l(r.mu);
    for (auto it = r.streams.begin(); it != r.streams.end(); ++it) {
      if (it->get() == s) {
        keep = *it;
        r.streams.erase(it);
        break;
      }
    }
  }
  if (std::this_thread::get_id() != s->worker.get_id()) DrainStream(s);
  TfmoEmuCommandBuffer* open;
  {
    std::lock_guard<std::mutex> l(s->mu);
    s->stop = true;
    s->cv_work.notify_all();
    open = TakeOpenLocked(s);
  }
  if (open != nullptr) {  // encoded but never committed: discarded, each work released once
    for (EncodedWork& w : open->works) {
      if (w.work.release != nullptr) w.work.release(w.work.arg);
      UnregisterEpoch(w.epoch);
    }
    open->works.clear();
  }
  {
    std::lock_guard<std::mutex> l(r.mu);
    StreamStats& t = r.destroyed_streams;
    t.items_run += s->stats.items_run;
    t.item_failures += s->stats.item_failures;
    t.command_buffers += s->stats.command_buffers;
    t.work_items += s->stats.work_items;
    t.work_failures += s->stats.work_failures;
    t.queue_syncs += s->stats.queue_syncs;
  }
  s->magic = 0;
  stream->header.magic = 0;
  if (std::this_thread::get_id() == s->worker.get_id()) {
    s->worker.detach();  // destroyed from its own callback: leak the stream rather than self-join
    delete stream;
    return;
  }
  s->worker.join();
  delete stream;
  // `keep` drops the last reference here (unless SynchronizeAllStreams still holds one)
}

}  // namespace tfmo_emu
