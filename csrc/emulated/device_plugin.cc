// A PluggableDevice (TF StreamExecutor C API) that emulates a Metal GPU on any CPU: device type "GPU", platform
// "TFMO_EMULATED_METAL", one device. Its SP_Stream starts with a TfmoEmuStreamHeader (csrc/emulated/emu_stream.h), so
// the emulated backend drives it the way the Metal backend drives tensorflow-metal's stream.
//
// Device memory: a large PROT_NONE reservation; every allocation gets its own 256-byte aligned range in it (next-fit,
// never reused until the reservation wraps), backed by host memory recorded in a side table and filled with 0xFF.
// Host code that dereferences a device address faults; a SIGSEGV/SIGBUS handler names the allocation and kills the
// process (faults elsewhere go to the previously installed handler).
//
// Streams: one worker thread per stream draining a FIFO of items. Deallocation is stream-ordered: a deallocated
// range keeps its host backing until no work created before the deallocation is pending on any stream. Work created
// after the deallocation cannot map it (use after free is an error message, not a crash).
//
// Epochs: a global counter D is incremented by every deallocation. Each item (a FIFO copy/memset, an encoded work
// item) records D when it is created and stays registered as pending until it has run (or been discarded). A range
// deallocated at epoch d may be used by items with epoch <= d (they were created before the deallocation), and its
// host memory is freed once the smallest pending epoch is > d.
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "emu_stream.h"
#include "tensorflow/c/experimental/stream_executor/stream_executor.h"
#include "tensorflow/c/tf_status.h"

#define TFMO_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr const char* kPrefix = "tf_metal_ops emulated GPU: ";
constexpr const char* kPlatformName = "TFMO_EMULATED_METAL";
constexpr const char* kDeviceType = "GPU";
constexpr const char* kDeviceName = "Emulated Metal GPU (tf_metal_ops PluggableDevice, runs on the CPU)";
constexpr uint64_t kAlign = 256;
constexpr uint64_t kGuard = 4096;  // unmapped-to-anything gap after every allocation
constexpr uint64_t kLive = ~0ull;  // Alloc::freed_epoch of an allocation not deallocated
constexpr uint64_t kNoWork = ~0ull;
constexpr uint64_t kDefaultMemoryMb = 8192;
constexpr size_t kFreedRing = 1024;

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string Hex(uint64_t v) {
  char b[32];
  snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

void CopyError(char* error, size_t error_len, const std::string& msg) {
  if (error == nullptr || error_len == 0) return;
  size_t n = std::min(msg.size(), error_len - 1);
  memcpy(error, msg.data(), n);
  error[n] = '\0';
}

void LogError(const std::string& msg) {
  std::string line = std::string(kPrefix) + msg + "\n";
  fputs(line.c_str(), stderr);
  fflush(stderr);
}

// ---------------------------------------------------------------------------------------------------------------
// Device memory.
struct Alloc {
  uint64_t size = 0;
  uint64_t span = 0;  // reserved address bytes (size rounded up + guard)
  void* host = nullptr;
  uint64_t freed_epoch = kLive;
};

struct FreedRange {
  uintptr_t start = 0;
  uint64_t size = 0;
};

struct StreamStats {
  uint64_t items_run = 0, item_failures = 0, command_buffers = 0, work_items = 0, work_failures = 0,
           queue_syncs = 0;
};


// The reserved range, read by the signal handler (plain words written once before the handler is installed).
volatile uintptr_t g_reserve_base = 0;
volatile uint64_t g_reserve_size = 0;

struct Global {
  std::mutex mu;  // guards everything below (never held while taking a stream's mutex, nor vice versa)
  uint64_t limit = 0;
  uint64_t cursor = 0;  // next-fit offset into the reservation
  bool wrapped_warned = false;
  std::map<uintptr_t, Alloc> allocs;  // live and deallocated-but-not-yet-freed, by device start address
  std::deque<uintptr_t> pending_free; // deallocated, host memory held, in deallocation (epoch) order
  std::multiset<uint64_t> pending_epochs;
  uint64_t epoch = 0;
  FreedRange freed[kFreedRing];
  uint64_t freed_count = 0;
  // statistics
  uint64_t held_bytes = 0, peak_held_bytes = 0, live_allocs = 0, live_bytes = 0, total_allocs = 0,
           total_alloc_bytes = 0, failed_allocs = 0, bad_frees = 0, largest_alloc = 0, deferred_frees = 0,
           host_callback_errors = 0, reentrant_queue_syncs = 0, streams_created = 0;
  StreamStats destroyed_streams;  // totals of streams already destroyed
  std::vector<std::shared_ptr<TfmoEmuStream>> streams;
};

Global& G() {
  static Global* g = new Global;  // never destroyed: worker threads and TF may outlive static destructors
  return *g;
}

thread_local uint64_t tls_work_epoch = kNoWork;       // epoch of the work item this thread is running
thread_local TfmoEmuStream* tls_running_stream = nullptr;  // stream whose item this thread is running
thread_local TfmoEmuStream* tls_queue_sync_stream = nullptr;  // stream this thread holds through queue_sync

uint64_t RegisterEpoch() {
  Global& g = G();
  std::lock_guard<std::mutex> l(g.mu);
  g.pending_epochs.insert(g.epoch);
  return g.epoch;
}

void ReclaimLocked(Global& g) {
  uint64_t min_pending = g.pending_epochs.empty() ? kLive : *g.pending_epochs.begin();
  while (!g.pending_free.empty()) {
    auto it = g.allocs.find(g.pending_free.front());
    if (it == g.allocs.end()) {  // cannot happen; keep going rather than spin
      g.pending_free.pop_front();
      continue;
    }
    if (!(it->second.freed_epoch < min_pending)) break;
    free(it->second.host);
    g.held_bytes -= it->second.size;
    g.freed[g.freed_count % kFreedRing] = FreedRange{it->first, it->second.size};
    ++g.freed_count;
    ++g.deferred_frees;
    g.allocs.erase(it);
    g.pending_free.pop_front();
  }
}

void UnregisterEpoch(uint64_t epoch) {
  Global& g = G();
  std::lock_guard<std::mutex> l(g.mu);
  auto it = g.pending_epochs.find(epoch);
  if (it != g.pending_epochs.end()) g.pending_epochs.erase(it);
  ReclaimLocked(g);
}

// Translates [addr, addr+bytes) to host memory for work of the given epoch (kNoWork: only live allocations).
void* Resolve(uintptr_t addr, uint64_t bytes, uint64_t epoch, std::string* err) {
  Global& g = G();
  std::lock_guard<std::mutex> l(g.mu);
  auto it = g.allocs.upper_bound(addr);
  if (it != g.allocs.begin()) {
    --it;
    const Alloc& a = it->second;
    uint64_t off = addr - it->first;
    if (off < a.size || off == 0) {
      if (bytes > a.size - off) {
        *err = "device range [" + Hex(addr) + ", +" + std::to_string(bytes) + " bytes) overruns its allocation of " +
               std::to_string(a.size) + " bytes at " + Hex(it->first);
        return nullptr;
      }
      if (a.freed_epoch != kLive && (epoch == kNoWork || epoch > a.freed_epoch)) {
        *err = "use after free: device address " + Hex(addr) + " is in an allocation of " + std::to_string(a.size) +
               " bytes at " + Hex(it->first) + " that was deallocated before this work was created";
        return nullptr;
      }
      return static_cast<char*>(a.host) + off;
    }
  }
  uint64_t n = std::min<uint64_t>(g.freed_count, kFreedRing);
  for (uint64_t i = 0; i < n; ++i) {
    const FreedRange& f = g.freed[i];
    if (addr >= f.start && (addr - f.start < f.size || addr == f.start)) {
      *err = "use after free: device address " + Hex(addr) + " is in an allocation of " + std::to_string(f.size) +
             " bytes at " + Hex(f.start) + " that has been freed";
      return nullptr;
    }
  }
  if (addr >= g_reserve_base && addr - g_reserve_base < g_reserve_size) {
    *err = "device address " + Hex(addr) + " is not inside any live allocation (freed or never allocated)";
  } else {
    *err = "address " + Hex(addr) + " is not device memory of this device";
  }
  return nullptr;
}

// ---------------------------------------------------------------------------------------------------------------
// Signal handler: async-signal-safe (write(2), sigaction, a try_lock'ed look-up).
struct sigaction g_old_segv, g_old_bus;

size_t AppendStr(char* buf, size_t pos, size_t cap, const char* s) {
  while (*s && pos + 1 < cap) buf[pos++] = *s++;
  return pos;
}

size_t AppendHex(char* buf, size_t pos, size_t cap, uint64_t v) {
  char tmp[19];
  int n = 0;
  do {
    tmp[n++] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v);
  pos = AppendStr(buf, pos, cap, "0x");
  while (n > 0 && pos + 1 < cap) buf[pos++] = tmp[--n];
  return pos;
}

size_t AppendDec(char* buf, size_t pos, size_t cap, uint64_t v) {
  char tmp[21];
  int n = 0;
  do {
    tmp[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v);
  while (n > 0 && pos + 1 < cap) buf[pos++] = tmp[--n];
  return pos;
}

void WriteAll(const char* buf, size_t n) {
  while (n > 0) {
    ssize_t w = write(2, buf, n);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      return;
    }
    buf += w;
    n -= static_cast<size_t>(w);
  }
}

void FaultHandler(int sig, siginfo_t* info, void* ucontext) {
  uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  uintptr_t base = g_reserve_base;
  uint64_t size = g_reserve_size;
  if (base != 0 && addr >= base && addr - base < size) {
    int saved_errno = errno;
    char buf[512];
    size_t cap = sizeof buf, p = 0;
    p = AppendStr(buf, p, cap, kPrefix);
    p = AppendStr(buf, p, cap, "host code dereferenced device memory at ");
    p = AppendHex(buf, p, cap, addr);
    Global& g = G();
    if (g.mu.try_lock()) {
      auto it = g.allocs.upper_bound(addr);
      bool found = false;
      if (it != g.allocs.begin()) {
        --it;
        if (addr - it->first < std::max<uint64_t>(it->second.size, 1)) {
          found = true;
          p = AppendStr(buf, p, cap, " (an allocation of ");
          p = AppendDec(buf, p, cap, it->second.size);
          p = AppendStr(buf, p, cap, " bytes at ");
          p = AppendHex(buf, p, cap, it->first);
          p = AppendStr(buf, p, cap, it->second.freed_epoch == kLive ? ")" : ", already deallocated)");
        }
      }
      if (!found) p = AppendStr(buf, p, cap, " (not inside a live allocation)");
      g.mu.unlock();
    }
    p = AppendStr(buf, p, cap, ": GPU kernels must not read tensor data on the host; use the stream's map() inside "
                               "work, or copy the tensor to the host\n");
    WriteAll(buf, p);
    errno = saved_errno;
    // Default action, then return: the faulting instruction runs again and the process dies by `sig`.
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    return;
  }
  // Not ours: chain to the handler that was installed before.
  const struct sigaction& old = sig == SIGBUS ? g_old_bus : g_old_segv;
  if (old.sa_flags & SA_SIGINFO) {
    if (old.sa_sigaction != nullptr) {
      old.sa_sigaction(sig, info, ucontext);
      return;
    }
  } else if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN && old.sa_handler != nullptr) {
    old.sa_handler(sig);
    return;
  }
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);  // re-executes the fault with the default action
}

// Reserves the address range and installs the handler, once. Returns an error message or "".
std::string InitMemory() {
  static std::once_flag once;
  static std::string error;
  std::call_once(once, [] {
    Global& g = G();
    uint64_t mb = kDefaultMemoryMb;
    if (const char* env = getenv("TF_METAL_OPS_EMU_MEMORY_MB")) {
      char* end = nullptr;
      errno = 0;
      unsigned long long v = strtoull(env, &end, 10);
      if (errno != 0 || end == env || *end != '\0' || v == 0 || v > (1ull << 30)) {
        LogError(std::string("ignoring TF_METAL_OPS_EMU_MEMORY_MB=\"") + env + "\" (want a positive number of MiB)");
      } else {
        mb = v;
      }
    }
    g.limit = mb << 20;
    // Several TiB of address space (nothing is committed); smaller if the address space is limited.
    for (uint64_t gib : {4096ull, 1024ull, 256ull, 64ull, 16ull}) {
      uint64_t bytes = gib << 30;
      if (bytes < g.limit * 2 && gib != 16) continue;
      void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p != MAP_FAILED) {
        g_reserve_base = reinterpret_cast<uintptr_t>(p);
        g_reserve_size = bytes;
        break;
      }
    }
    if (g_reserve_base == 0) {
      error = "could not reserve address space for device memory";
      return;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = FaultHandler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
    sigaction(SIGBUS, &sa, &g_old_bus);
  });
  return error;
}

void* AllocateDevice(uint64_t size) {
  Global& g = G();
  uint64_t host_bytes = AlignUp(std::max<uint64_t>(size, 1), 64);
  uint64_t span = AlignUp(std::max<uint64_t>(size, 1), kAlign) + kGuard;
  {
    std::lock_guard<std::mutex> l(g.mu);
    if (size > g.limit || g.held_bytes > g.limit - size) {
      ++g.failed_allocs;
      return nullptr;
    }
  }
  void* host = nullptr;
  if (posix_memalign(&host, 64, host_bytes) != 0) {
    std::lock_guard<std::mutex> l(g.mu);
    ++g.failed_allocs;
    return nullptr;
  }
  memset(host, 0xFF, host_bytes);
  std::lock_guard<std::mutex> l(g.mu);
  if (size > g.limit || g.held_bytes > g.limit - size || span > g_reserve_size) {
    ++g.failed_allocs;
    free(host);
    return nullptr;
  }
  // Next fit from the cursor; wrap around once when the end of the reservation is reached.
  uint64_t found = kLive;
  for (int pass = 0; pass < 2 && found == kLive; ++pass) {
    uint64_t cand = AlignUp(pass == 0 ? g.cursor : 0, kAlign);
    while (cand + span <= g_reserve_size) {
      uintptr_t a = g_reserve_base + cand;
      auto it = g.allocs.lower_bound(a);
      if (it != g.allocs.begin()) {
        auto prev = std::prev(it);
        if (prev->first + prev->second.span > a) {
          cand = AlignUp(prev->first + prev->second.span - g_reserve_base, kAlign);
          continue;
        }
      }
      if (it != g.allocs.end() && it->first < a + span) {
        cand = AlignUp(it->first + it->second.span - g_reserve_base, kAlign);
        continue;
      }
      found = cand;
      break;
    }
    if (found == kLive && pass == 0 && !g.wrapped_warned) {
      g.wrapped_warned = true;
      LogError("device address space exhausted once; reusing freed ranges from now on");
    }
  }
  if (found == kLive) {
    ++g.failed_allocs;
    free(host);
    return nullptr;
  }
  g.cursor = found + span;
  uintptr_t dev = g_reserve_base + found;
  Alloc& al = g.allocs[dev];
  al.size = size;
  al.span = span;
  al.host = host;
  al.freed_epoch = kLive;
  g.held_bytes += size;
  g.peak_held_bytes = std::max(g.peak_held_bytes, g.held_bytes);
  ++g.live_allocs;
  g.live_bytes += size;
  ++g.total_allocs;
  g.total_alloc_bytes += size;
  g.largest_alloc = std::max(g.largest_alloc, size);
  return reinterpret_cast<void*>(dev);
}

void DeallocateDevice(void* ptr) {
  if (ptr == nullptr) return;
  Global& g = G();
  std::lock_guard<std::mutex> l(g.mu);
  auto it = g.allocs.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == g.allocs.end() || it->second.freed_epoch != kLive) {
    ++g.bad_frees;
    LogError("deallocate of " + Hex(reinterpret_cast<uintptr_t>(ptr)) +
             (it == g.allocs.end() ? ", which is not the start of an allocation" : ", which was already deallocated"));
    return;
  }
  it->second.freed_epoch = g.epoch++;
  --g.live_allocs;
  g.live_bytes -= it->second.size;
  g.pending_free.push_back(it->first);
  ReclaimLocked(g);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Streams, command buffers, events.
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
};

struct SP_Event_st {
  std::shared_ptr<TfmoEmuEventState> state;
};

namespace {
struct EncodedWork {
  TfmoEmuWork work;
  uint64_t epoch;
};

struct Item {
  bool has_epoch = false;
  uint64_t epoch = 0;
  std::function<std::string()> run;  // returns "" or an error message
};
}  // namespace

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

struct TfmoEmuCommandBuffer {
  TfmoEmuStream* stream = nullptr;
  std::vector<EncodedWork> works;
  // commit_and_wait from another thread waits for these (guarded by the stream's mutex)
  bool done = false;
  std::string error;
};

struct TfmoEmuStream {
  uint64_t magic = TFMO_EMU_STREAM_MAGIC;
  int id = 0;
  std::mutex mu;
  std::condition_variable cv_work, cv_done;
  std::deque<std::unique_ptr<Item>> fifo;
  uint64_t enqueued = 0, completed = 0;
  bool stop = false;
  std::thread worker;
  TfmoEmuCommandBuffer* open_cb = nullptr;
  std::vector<TfmoEmuCommandBuffer*> cb_pool;  // recycled command buffers (handles stay valid memory)
  std::vector<std::unique_ptr<TfmoEmuCommandBuffer>> cb_owned;
  // Buffers committed inside the current queue_sync (the worker is parked at its gate): they run first when the
  // gate opens, or inline, before the buffer of a commit_and_wait inside the same queue_sync.
  std::vector<TfmoEmuCommandBuffer*> session_commits;
  std::shared_ptr<TfmoEmuSyncGate> session_gate;  // the gate of the current queue_sync (its owner's use only)
  bool failed = false;
  std::string error;
  StreamStats stats;
};

struct SP_Stream_st {
  TfmoEmuStreamHeader header;  // first member: what the emulated backend reads through TF_GetStream
  TfmoEmuStream* impl;
};

namespace {

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
    ++s->completed;
    ++s->stats.items_run;
    if (!err.empty()) {
      ++s->stats.item_failures;
      if (!s->failed) {
        s->failed = true;
        s->error = err;
      }
      LogError("stream " + std::to_string(s->id) + ": " + err);
    }
    s->cv_done.notify_all();
  }
}

// Waits until everything enqueued on `s` so far has completed.
void DrainStream(TfmoEmuStream* s) {
  std::unique_lock<std::mutex> l(s->mu);
  uint64_t target = s->enqueued;
  s->cv_done.wait(l, [&] { return s->completed >= target; });
}

TfmoEmuStream* CheckStream(TfmoEmuStream* s) {
  return s != nullptr && s->magic == TFMO_EMU_STREAM_MAGIC ? s : nullptr;
}

std::unique_ptr<Item> CommandBufferItem(TfmoEmuStream* s, TfmoEmuCommandBuffer* cb);

// --- TfmoEmuStreamApi ---------------------------------------------------------------------------------------------
void ApiQueueSync(TfmoEmuStream* s, void (*fn)(void* arg), void* arg) {
  if (CheckStream(s) == nullptr || fn == nullptr) return;
  if (tls_queue_sync_stream == s || tls_running_stream == s) {
    // Re-entrant use (forbidden by the protocol; dispatch_sync would deadlock): this thread already owns the
    // queue, so running fn now keeps the serial order.
    {
      Global& g = G();
      std::lock_guard<std::mutex> l(g.mu);
      if (g.reentrant_queue_syncs++ == 0) LogError("queue_sync called re-entrantly on the same stream; ran inline");
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
    s->session_gate = gate;
  }
  fn(arg);
  tls_queue_sync_stream = saved;
  {
    // Buffers committed during fn go first, in commit order, right behind the gate (nothing ran in between).
    std::lock_guard<std::mutex> l(s->mu);
    s->session_gate.reset();
    ++s->stats.queue_syncs;
    std::vector<TfmoEmuCommandBuffer*> commits;
    commits.swap(s->session_commits);
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
    if (!s->failed) {
      s->failed = true;
      s->error = err;
    }
    l.unlock();
    LogError(err);
    if (work.release != nullptr) work.release(work.arg);
    UnregisterEpoch(epoch);
    return;
  }
  cb->works.push_back(EncodedWork{work, epoch});
}

// Detaches the open command buffer (null if none).
TfmoEmuCommandBuffer* TakeOpenLocked(TfmoEmuStream* s) {
  TfmoEmuCommandBuffer* cb = s->open_cb;
  s->open_cb = nullptr;
  return cb;
}

std::unique_ptr<Item> CommandBufferItem(TfmoEmuStream* s, TfmoEmuCommandBuffer* cb) {
  return MakeItem(false, [s, cb]() -> std::string {
    std::string err = RunCommandBuffer(s, cb);
    std::lock_guard<std::mutex> l(s->mu);
    RecycleLocked(s, cb);
    return err.empty() ? "" : "command buffer failed: " + err;
  });
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
      s->session_commits.push_back(cb);
      return;
    }
  }
  Enqueue(s, CommandBufferItem(s, cb));
}

// Runs a command buffer on the thread that owns the queue, accounted as one stream item.
std::string RunInline(TfmoEmuStream* s, TfmoEmuCommandBuffer* cb) {
  std::string err = RunCommandBuffer(s, cb);
  std::lock_guard<std::mutex> l(s->mu);
  RecycleLocked(s, cb);
  ++s->enqueued;
  ++s->completed;
  ++s->stats.items_run;
  if (!err.empty()) {
    ++s->stats.item_failures;
    if (!s->failed) {
      s->failed = true;
      s->error = "command buffer failed: " + err;
    }
  }
  return err;
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
        earlier.swap(s->session_commits);
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
      gate = s->session_gate;
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

// --- SP_StreamExecutor ---------------------------------------------------------------------------------------------
void SetError(TF_Status* status, TF_Code code, const std::string& msg) {
  if (status != nullptr) TF_SetStatus(status, code, (std::string(kPrefix) + msg).c_str());
}

TfmoEmuStream* Impl(SP_Stream stream) { return stream != nullptr ? CheckStream(stream->impl) : nullptr; }

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
  Global& g = G();
  std::lock_guard<std::mutex> l(g.mu);
  stats->struct_size = SP_ALLOCATORSTATS_STRUCT_SIZE;
  stats->num_allocs = static_cast<int64_t>(g.total_allocs);
  stats->bytes_in_use = static_cast<int64_t>(g.held_bytes);
  stats->peak_bytes_in_use = static_cast<int64_t>(g.peak_held_bytes);
  stats->largest_alloc_size = static_cast<int64_t>(g.largest_alloc);
  stats->has_bytes_limit = 1;
  stats->bytes_limit = static_cast<int64_t>(g.limit);
  stats->bytes_reserved = 0;
  stats->peak_bytes_reserved = 0;
  stats->has_bytes_reservable_limit = 0;
  stats->bytes_reservable_limit = 0;
  stats->largest_free_block_bytes = static_cast<int64_t>(g.limit - g.held_bytes);
  return 1;
}

TF_Bool SeMemoryUsage(const SP_Device*, int64_t* free_bytes, int64_t* total) {
  Global& g = G();
  std::lock_guard<std::mutex> l(g.mu);
  *free_bytes = static_cast<int64_t>(g.limit - g.held_bytes);
  *total = static_cast<int64_t>(g.limit);
  return 1;
}

void SeCreateStream(const SP_Device*, SP_Stream* stream, TF_Status* status) {
  auto impl = std::make_shared<TfmoEmuStream>();
  auto* sp = new SP_Stream_st;
  sp->header.magic = TFMO_EMU_STREAM_MAGIC;
  sp->header.api = &kApi;
  sp->header.self = impl.get();
  sp->impl = impl.get();
  {
    Global& g = G();
    std::lock_guard<std::mutex> l(g.mu);
    impl->id = static_cast<int>(g.streams_created++);
    g.streams.push_back(impl);
  }
  try {
    impl->worker = std::thread(WorkerLoop, impl.get());
  } catch (const std::exception& e) {
    {
      Global& g = G();
      std::lock_guard<std::mutex> l(g.mu);
      g.streams.erase(std::find(g.streams.begin(), g.streams.end(), impl));
    }
    delete sp;
    *stream = nullptr;
    SetError(status, TF_RESOURCE_EXHAUSTED, std::string("cannot start a stream thread: ") + e.what());
    return;
  }
  *stream = sp;
}

void SeDestroyStream(const SP_Device*, SP_Stream stream) {
  TfmoEmuStream* s = Impl(stream);
  if (s == nullptr) return;
  std::shared_ptr<TfmoEmuStream> keep;
  {
    Global& g = G();
    std::lock_guard<std::mutex> l(g.mu);
    for (auto it = g.streams.begin(); it != g.streams.end(); ++it) {
      if (it->get() == s) {
        keep = *it;
        g.streams.erase(it);
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
    Global& g = G();
    std::lock_guard<std::mutex> l(g.mu);
    StreamStats& t = g.destroyed_streams;
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
  // `keep` drops the last reference here (unless synchronize_all_activity still holds one)
}

void SeCreateStreamDependency(const SP_Device*, SP_Stream dependent, SP_Stream other, TF_Status* status) {
  TfmoEmuStream* d = Impl(dependent);
  TfmoEmuStream* o = Impl(other);
  if (d == nullptr || o == nullptr) return SetError(status, TF_INVALID_ARGUMENT, "invalid stream");
  if (d == o) return;
  auto ev = std::make_shared<TfmoEmuEventState>();
  Enqueue(o, MakeItem(false, [ev]() -> std::string {
            ev->Complete(1);
            return "";
          }));
  Enqueue(d, MakeItem(false, [ev]() -> std::string {
            ev->WaitFor(1);
            return "";
          }));
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
  std::shared_ptr<TfmoEmuEventState> ev = event->state;
  uint64_t gen;
  {
    std::lock_guard<std::mutex> l(ev->mu);
    gen = ++ev->recorded;
  }
  Enqueue(s, MakeItem(false, [ev, gen]() -> std::string {
            ev->Complete(gen);
            return "";
          }));
}

void SeWaitForEvent(const SP_Device*, SP_Stream stream, SP_Event event, TF_Status* status) {
  TfmoEmuStream* s = Impl(stream);
  if (s == nullptr || event == nullptr) return SetError(status, TF_INVALID_ARGUMENT, "invalid stream or event");
  std::shared_ptr<TfmoEmuEventState> ev = event->state;
  uint64_t gen;
  {
    std::lock_guard<std::mutex> l(ev->mu);
    gen = ev->recorded;
  }
  Enqueue(s, MakeItem(false, [ev, gen]() -> std::string {
            ev->WaitFor(gen);
            return "";
          }));
}

void SeBlockHostForEvent(const SP_Device*, SP_Event event, TF_Status* status) {
  if (event == nullptr) return SetError(status, TF_INVALID_ARGUMENT, "invalid event");
  std::shared_ptr<TfmoEmuEventState> ev = event->state;
  uint64_t gen;
  {
    std::lock_guard<std::mutex> l(ev->mu);
    gen = ev->recorded;
  }
  ev->WaitFor(gen);
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

void SeSynchronizeAllActivity(const SP_Device*, TF_Status*) {
  std::vector<std::shared_ptr<TfmoEmuStream>> streams;
  {
    Global& g = G();
    std::lock_guard<std::mutex> l(g.mu);
    streams = g.streams;
  }
  for (auto& s : streams) {
    if (tls_running_stream == s.get() || tls_queue_sync_stream == s.get()) continue;
    DrainStream(s.get());
  }
}

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
// source), performed by `op` on the host memory behind them. Async: validated now, enqueued on stream s, the
// addresses resolved when the item runs (stream-ordered frees keep them alive until then). Sync: done now.
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

TF_Bool SeHostCallback(const SP_Device*, SP_Stream stream, SE_StatusCallbackFn fn, void* arg) {
  TfmoEmuStream* s = Impl(stream);
  if (s == nullptr || fn == nullptr) return 0;
  Enqueue(s, MakeItem(false, [fn, arg]() -> std::string {
            TF_Status* st = TF_NewStatus();
            fn(arg, st);
            if (TF_GetCode(st) != TF_OK) {  // as TF's own executors do: log, the stream stays usable
              {
                Global& g = G();
                std::lock_guard<std::mutex> l(g.mu);
                ++g.host_callback_errors;
              }
              LogError(std::string("host callback failed: ") + TF_Message(st));
            }
            TF_DeleteStatus(st);
            return "";
          }));
  return 1;
}

// --- device, platform --------------------------------------------------------------------------------------------
int32_t DevNumaNode(const SP_Device*) { return -1; }
int64_t DevBandwidth(const SP_Device*) { return 50ll * 1000 * 1000 * 1000; }
double DevGflops(const SP_Device*) { return 100.0; }

void PlatGetDeviceCount(const SP_Platform*, int* count, TF_Status*) { *count = 1; }

void PlatCreateDevice(const SP_Platform*, SE_CreateDeviceParams* params, TF_Status* status) {
  if (params->ordinal != 0) return SetError(status, TF_INVALID_ARGUMENT, "only device 0 exists");
  SP_Device* d = params->device;
  d->struct_size = SP_DEVICE_STRUCT_SIZE;
  d->ext = nullptr;
  d->ordinal = 0;
  d->device_handle = nullptr;
  d->hardware_name = kDeviceName;
  d->device_vendor = "tf_metal_ops";
  d->pci_bus_id = "0000:00:00.0";
}

void PlatDestroyDevice(const SP_Platform*, SP_Device*) {}

void PlatCreateDeviceFns(const SP_Platform*, SE_CreateDeviceFnsParams* params, TF_Status*) {
  SP_DeviceFns* f = params->device_fns;
  f->struct_size = SP_DEVICE_FNS_STRUCT_SIZE;
  f->ext = nullptr;
  f->get_numa_node = DevNumaNode;
  f->get_memory_bandwidth = DevBandwidth;
  f->get_gflops = DevGflops;
}

void PlatDestroyDeviceFns(const SP_Platform*, SP_DeviceFns*) {}

void PlatCreateStreamExecutor(const SP_Platform*, SE_CreateStreamExecutorParams* params, TF_Status*) {
  SP_StreamExecutor* se = params->stream_executor;
  se->struct_size = SP_STREAMEXECUTOR_STRUCT_SIZE;
  se->ext = nullptr;
  se->allocate = SeAllocate;
  se->deallocate = SeDeallocate;
  se->host_memory_allocate = SeHostAllocate;
  se->host_memory_deallocate = SeHostDeallocate;
  se->unified_memory_allocate = nullptr;
  se->unified_memory_deallocate = nullptr;
  se->get_allocator_stats = SeAllocatorStats;
  se->device_memory_usage = SeMemoryUsage;
  se->create_stream = SeCreateStream;
  se->destroy_stream = SeDestroyStream;
  se->create_stream_dependency = SeCreateStreamDependency;
  se->get_stream_status = SeGetStreamStatus;
  se->create_event = SeCreateEvent;
  se->destroy_event = SeDestroyEvent;
  se->get_event_status = SeEventStatus;
  se->record_event = SeRecordEvent;
  se->wait_for_event = SeWaitForEvent;
  se->create_timer = nullptr;
  se->destroy_timer = nullptr;
  se->start_timer = nullptr;
  se->stop_timer = nullptr;
  se->memcpy_dtoh = SeMemcpyDtoH;
  se->memcpy_htod = SeMemcpyHtoD;
  se->memcpy_dtod = SeMemcpyDtoD;
  se->sync_memcpy_dtoh = SeSyncMemcpyDtoH;
  se->sync_memcpy_htod = SeSyncMemcpyHtoD;
  se->sync_memcpy_dtod = SeSyncMemcpyDtoD;
  se->block_host_for_event = SeBlockHostForEvent;
  se->block_host_until_done = SeBlockHostUntilDone;
  se->synchronize_all_activity = SeSynchronizeAllActivity;
  se->mem_zero = SeMemZero;
  se->memset = SeMemset;
  se->memset32 = SeMemset32;
  se->host_callback = SeHostCallback;
}

void PlatDestroyStreamExecutor(const SP_Platform*, SP_StreamExecutor*) {}
void DestroyPlatform(SP_Platform*) {}
void DestroyPlatformFns(SP_PlatformFns*) {}

std::string JsonEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += c;
    }
  }
  return o;
}

}  // namespace

TFMO_EXPORT void SE_InitPlugin(SE_PlatformRegistrationParams* params, TF_Status* status) {
  std::string err = InitMemory();
  if (!err.empty()) return SetError(status, TF_RESOURCE_EXHAUSTED, err);
  params->struct_size = SE_PLATFORM_REGISTRATION_PARAMS_STRUCT_SIZE;
  params->major_version = SE_MAJOR;
  params->minor_version = SE_MINOR;
  params->patch_version = SE_PATCH;
  SP_Platform* p = params->platform;
  p->struct_size = SP_PLATFORM_STRUCT_SIZE;
  p->ext = nullptr;
  p->name = kPlatformName;
  p->type = kDeviceType;
  p->supports_unified_memory = 0;
  p->use_bfc_allocator = 0;  // kernels see exactly the addresses allocate() returned
  p->force_memory_growth = 0;
  SP_PlatformFns* f = params->platform_fns;
  f->struct_size = SP_PLATFORM_FNS_STRUCT_SIZE;
  f->ext = nullptr;
  f->get_device_count = PlatGetDeviceCount;
  f->create_device = PlatCreateDevice;
  f->destroy_device = PlatDestroyDevice;
  f->create_device_fns = PlatCreateDeviceFns;
  f->destroy_device_fns = PlatDestroyDeviceFns;
  f->create_stream_executor = PlatCreateStreamExecutor;
  f->destroy_stream_executor = PlatDestroyStreamExecutor;
  f->create_timer_fns = nullptr;
  f->destroy_timer_fns = nullptr;
  params->destroy_platform = DestroyPlatform;
  params->destroy_platform_fns = DestroyPlatformFns;
}

// JSON diagnostics (valid until the next call on the same thread).
TFMO_EXPORT const char* tfmo_emu_device_stats(void) {
  static thread_local std::string out;
  Global& g = G();
  std::vector<std::shared_ptr<TfmoEmuStream>> streams;
  std::string s = "{";
  {
    std::lock_guard<std::mutex> l(g.mu);
    streams = g.streams;
    auto num = [&](const char* k, uint64_t v) { s += "\"" + std::string(k) + "\": " + std::to_string(v) + ", "; };
    num("live_allocations", g.live_allocs);
    num("live_bytes", g.live_bytes);
    num("held_bytes", g.held_bytes);
    num("peak_held_bytes", g.peak_held_bytes);
    num("total_allocations", g.total_allocs);
    num("total_allocated_bytes", g.total_alloc_bytes);
    num("failed_allocations", g.failed_allocs);
    num("bad_frees", g.bad_frees);
    num("deferred_frees_pending", g.pending_free.size());
    num("frees_completed", g.deferred_frees);
    num("pending_work_items", g.pending_epochs.size());
    num("host_callback_errors", g.host_callback_errors);
    num("reentrant_queue_syncs", g.reentrant_queue_syncs);
    num("memory_limit_bytes", g.limit);
    num("reserved_address_bytes", g_reserve_size);
    num("reserved_address_base", g_reserve_base);
    num("destroyed_streams_items_run", g.destroyed_streams.items_run);
    num("destroyed_streams_work_items", g.destroyed_streams.work_items);
    num("destroyed_streams_failures", g.destroyed_streams.item_failures + g.destroyed_streams.work_failures);
  }
  s += "\"streams\": [";
  bool first = true;
  for (auto& st : streams) {
    std::lock_guard<std::mutex> l(st->mu);
    if (!first) s += ", ";
    first = false;
    s += "{\"id\": " + std::to_string(st->id) + ", \"enqueued\": " + std::to_string(st->enqueued) +
         ", \"completed\": " + std::to_string(st->completed) + ", \"items_run\": " + std::to_string(st->stats.items_run) +
         ", \"item_failures\": " + std::to_string(st->stats.item_failures) +
         ", \"command_buffers\": " + std::to_string(st->stats.command_buffers) +
         ", \"work_items_run\": " + std::to_string(st->stats.work_items) +
         ", \"work_failures\": " + std::to_string(st->stats.work_failures) +
         ", \"queue_syncs\": " + std::to_string(st->stats.queue_syncs) +
         ", \"open_command_buffer_items\": " + std::to_string(st->open_cb ? st->open_cb->works.size() : 0) +
         ", \"error\": " + (st->failed ? "\"" + JsonEscape(st->error) + "\"" : std::string("null")) + "}";
  }
  s += "]}";
  out = s;
  return out.c_str();
}

// Waits until every stream has run everything enqueued so far (tf_metal_ops.emulated_gpu.synchronize()).
TFMO_EXPORT void tfmo_emu_device_synchronize(void) { SeSynchronizeAllActivity(nullptr, nullptr); }

// Waits for every stream to drain, then returns how many allocations are still not freed (live or deferred),
// listing up to 20 of them on stderr.
TFMO_EXPORT int64_t tfmo_emu_device_check_leaks(void) {
  SeSynchronizeAllActivity(nullptr, nullptr);
  Global& g = G();
  std::lock_guard<std::mutex> l(g.mu);
  int n = 0;
  for (auto& kv : g.allocs) {
    if (n++ >= 20) break;
    LogError("not freed: " + std::to_string(kv.second.size) + " bytes at " + Hex(kv.first) +
             (kv.second.freed_epoch == kLive ? " (live)" : " (deallocated, waiting for pending work)"));
  }
  return static_cast<int64_t>(g.allocs.size());
}
