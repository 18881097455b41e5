// Native checks of the emulated Metal GPU PluggableDevice (csrc/emulated_gpu/se_plugin.cc) through the StreamExecutor
// C API and the TfmoEmuStreamApi (csrc/emulated_gpu/emu_stream.h), without TensorFlow's runtime.
//
//   emulated_device_test <plugin.so> <scenario>    scenarios: memory fault ordering failure deferred_free events
//
// Prints "PASS <scenario>" and exits 0, or prints the failed check and exits 1. The tests/ driver runs every
// scenario in its own process (tests/test_emulated_gpu_device.py).
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "emu_stream.h"
#include "tensorflow/c/experimental/stream_executor/stream_executor.h"
#include "tensorflow/c/tf_status.h"

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stdout, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                \
      fflush(stdout);                                                                \
      _exit(1);                                                                      \
    }                                                                                \
  } while (0)
#define CHECK_MSG(cond, msg)                                                         \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stdout, "FAIL %s:%d: %s (%s)\n", __FILE__, __LINE__, #cond,            \
              std::string(msg).c_str());                                             \
      fflush(stdout);                                                                \
      _exit(1);                                                                      \
    }                                                                                \
  } while (0)

namespace {

using InitFn = void (*)(SE_PlatformRegistrationParams*, TF_Status*);
using StatsFn = const char* (*)();

struct Plugin {
  SP_Platform platform{};
  SP_PlatformFns pfns{};
  SP_Device device{};
  SP_DeviceFns dfns{};
  SP_StreamExecutor se{};
  StatsFn stats = nullptr;
  TF_Status* st = TF_NewStatus();

  void Ok() { CHECK_MSG(TF_GetCode(st) == TF_OK, TF_Message(st)); }

  SP_Stream NewStream() {
    SP_Stream s = nullptr;
    se.create_stream(&device, &s, st);
    Ok();
    CHECK(s != nullptr);
    return s;
  }

  void* Alloc(uint64_t size) {
    SP_DeviceMemoryBase m{SP_DEVICE_MEMORY_BASE_STRUCT_SIZE, nullptr, nullptr, 0, 0};
    se.allocate(&device, size, 0, &m);
    return m.opaque;
  }

  void Free(void* p, uint64_t size) {
    SP_DeviceMemoryBase m{SP_DEVICE_MEMORY_BASE_STRUCT_SIZE, nullptr, p, size, 0};
    se.deallocate(&device, &m);
  }

  // A JSON number of the stats ("key": value).
  long long Stat(const char* key) {
    std::string js = stats();
    std::string k = std::string("\"") + key + "\": ";
    size_t pos = js.find(k);
    CHECK_MSG(pos != std::string::npos, key);
    return atoll(js.c_str() + pos + k.size());
  }
};

Plugin* Load(const char* path) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  CHECK_MSG(h != nullptr, dlerror());
  auto init = reinterpret_cast<InitFn>(dlsym(h, "SE_InitPlugin"));
  CHECK(init != nullptr);
  auto* p = new Plugin;
  p->stats = reinterpret_cast<StatsFn>(dlsym(h, "tfmo_emu_device_stats"));
  CHECK(p->stats != nullptr);
  CHECK(dlsym(h, "tfmo_emu_device_check_leaks") != nullptr);
  SE_PlatformRegistrationParams params{};
  params.struct_size = SE_PLATFORM_REGISTRATION_PARAMS_STRUCT_SIZE;
  params.platform = &p->platform;
  params.platform_fns = &p->pfns;
  p->platform.struct_size = SP_PLATFORM_STRUCT_SIZE;
  p->pfns.struct_size = SP_PLATFORM_FNS_STRUCT_SIZE;
  init(&params, p->st);
  p->Ok();
  CHECK(params.destroy_platform != nullptr && params.destroy_platform_fns != nullptr);
  CHECK(p->platform.struct_size == SP_PLATFORM_STRUCT_SIZE);
  CHECK(strcmp(p->platform.type, "GPU") == 0);
  CHECK(strcmp(p->platform.name, "GPU") != 0);
  CHECK(p->platform.use_bfc_allocator == 0);
  SP_PlatformFns& f = p->pfns;
  CHECK(f.struct_size == SP_PLATFORM_FNS_STRUCT_SIZE);
  CHECK(f.get_device_count && f.create_device && f.destroy_device && f.create_device_fns && f.destroy_device_fns &&
        f.create_stream_executor && f.destroy_stream_executor);
  int n = 0;
  f.get_device_count(&p->platform, &n, p->st);
  p->Ok();
  CHECK(n == 1);
  SE_CreateDeviceParams dp{SE_CREATE_DEVICE_PARAMS_STRUCT_SIZE, nullptr, 0, &p->device};
  p->device.struct_size = SP_DEVICE_STRUCT_SIZE;
  f.create_device(&p->platform, &dp, p->st);
  p->Ok();
  SE_CreateDeviceFnsParams dfp{SE_CREATE_DEVICE_FNS_PARAMS_STRUCT_SIZE, nullptr, &p->dfns};
  f.create_device_fns(&p->platform, &dfp, p->st);
  p->Ok();
  CHECK(p->dfns.struct_size == SP_DEVICE_FNS_STRUCT_SIZE);
  SE_CreateStreamExecutorParams sep{SE_CREATE_STREAM_EXECUTOR_PARAMS_STRUCT_SIZE, nullptr, &p->se};
  p->se.struct_size = SP_STREAMEXECUTOR_STRUCT_SIZE;
  f.create_stream_executor(&p->platform, &sep, p->st);
  p->Ok();
  SP_StreamExecutor& s = p->se;
  CHECK(s.struct_size == SP_STREAMEXECUTOR_STRUCT_SIZE);
  CHECK(s.allocate && s.deallocate && s.host_memory_allocate && s.host_memory_deallocate && s.get_allocator_stats &&
        s.device_memory_usage && s.create_stream && s.destroy_stream && s.create_stream_dependency &&
        s.get_stream_status && s.create_event && s.destroy_event && s.get_event_status && s.record_event &&
        s.wait_for_event && s.memcpy_dtoh && s.memcpy_htod && s.sync_memcpy_dtoh && s.sync_memcpy_htod &&
        s.block_host_for_event && s.synchronize_all_activity && s.host_callback && s.mem_zero && s.memset &&
        s.memset32 && s.memcpy_dtod && s.block_host_until_done);
  return p;
}

const TfmoEmuStreamHeader* Header(SP_Stream s) {
  auto* h = reinterpret_cast<const TfmoEmuStreamHeader*>(s);
  CHECK(h->magic == TFMO_EMU_STREAM_MAGIC);
  CHECK(h->api != nullptr && h->api->struct_size == sizeof(TfmoEmuStreamApi));
  CHECK(h->self != nullptr);
  return h;
}

// queue_sync with a std::function.
void QueueSync(const TfmoEmuStreamHeader* h, const std::function<void()>& fn) {
  h->api->queue_sync(
      h->self, [](void* a) { (*static_cast<const std::function<void()>*>(a))(); },
      const_cast<std::function<void()>*>(&fn));
}

// A work item backed by a std::function; counts runs and releases.
struct TestWork {
  std::function<int(TfmoEmuStream*, char*, size_t)> fn;
  std::atomic<int> runs{0}, releases{0};
  TfmoEmuWork Make() {
    TfmoEmuWork w;
    w.run = [](void* a, TfmoEmuStream* s, char* e, size_t n) {
      auto* t = static_cast<TestWork*>(a);
      ++t->runs;
      return t->fn ? t->fn(s, e, n) : 0;
    };
    w.release = [](void* a) { ++static_cast<TestWork*>(a)->releases; };
    w.arg = this;
    return w;
  }
};

// A latch the test opens; items wait on it.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void Open() {
    std::lock_guard<std::mutex> l(mu);
    open = true;
    cv.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return open; });
  }
};

// Ordered log of events.
struct Log {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> v;
  void Add(const std::string& s) {
    std::lock_guard<std::mutex> l(mu);
    v.push_back(s);
    cv.notify_all();
  }
  bool Has(const std::string& s) {
    std::lock_guard<std::mutex> l(mu);
    for (auto& x : v)
      if (x == s) return true;
    return false;
  }
  // Waits at most `ms` for `s` to appear (used only to check that something does NOT happen).
  bool WaitFor(const std::string& s, int ms) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, std::chrono::milliseconds(ms), [&] {
      for (auto& x : v)
        if (x == s) return true;
      return false;
    });
  }
  std::string Joined() {
    std::lock_guard<std::mutex> l(mu);
    std::string r;
    for (auto& x : v) r += x + ",";
    return r;
  }
};

// host_callback with a std::function (deleted after it runs).
void HostCallback(Plugin* p, SP_Stream s, std::function<void(TF_Status*)> fn) {
  auto* heap = new std::function<void(TF_Status*)>(std::move(fn));
  TF_Bool ok = p->se.host_callback(
      &p->device, s,
      [](void* a, TF_Status* st) {
        auto* f = static_cast<std::function<void(TF_Status*)>*>(a);
        (*f)(st);
        delete f;
      },
      heap);
  CHECK(ok);
}

SP_DeviceMemoryBase Mem(void* p, uint64_t size) {
  return SP_DeviceMemoryBase{SP_DEVICE_MEMORY_BASE_STRUCT_SIZE, nullptr, p, size, 0};
}

// ------------------------------------------------------------------------------------------------------------------
void ScenarioMemory(Plugin* p) {
  const uint64_t limit = 64ull << 20;  // the driver sets TF_METAL_OPS_EMULATED_GPU_MEMORY_MB=64
  int64_t free0 = 0, total = 0;
  CHECK(p->se.device_memory_usage(&p->device, &free0, &total));
  CHECK(total == static_cast<int64_t>(limit));
  CHECK(free0 == total);
  SP_Stream s = p->NewStream();
  const TfmoEmuStreamHeader* h = Header(s);
  CHECK(strlen(h->api->device_name(h->self)) > 0);

  // Distinct, 256-byte aligned, non-overlapping ranges; fresh memory reads as 0xFF.
  std::vector<std::pair<void*, uint64_t>> allocs;
  for (uint64_t size : {1ull, 7ull, 256ull, 1000ull, 4096ull, 100000ull, 0ull}) {
    void* d = p->Alloc(size);
    CHECK(d != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(d) % 256 == 0);
    for (auto& a : allocs) {
      uintptr_t x = reinterpret_cast<uintptr_t>(d), y = reinterpret_cast<uintptr_t>(a.first);
      CHECK(x + std::max<uint64_t>(size, 1) <= y || y + std::max<uint64_t>(a.second, 1) <= x);
    }
    allocs.push_back({d, size});
    if (size > 0) {
      std::vector<unsigned char> host(size, 0);
      SP_DeviceMemoryBase m = Mem(d, size);
      p->se.sync_memcpy_dtoh(&p->device, host.data(), &m, size, p->st);
      p->Ok();
      for (unsigned char c : host) CHECK(c == 0xFF);
    }
  }
  CHECK(p->Stat("live_allocations") == 7);
  CHECK(p->Stat("live_bytes") == 1 + 7 + 256 + 1000 + 4096 + 100000);
  int64_t free1 = 0;
  CHECK(p->se.device_memory_usage(&p->device, &free1, &total));
  CHECK(free0 - free1 == 1 + 7 + 256 + 1000 + 4096 + 100000);
  SP_AllocatorStats as{};
  as.struct_size = SP_ALLOCATORSTATS_STRUCT_SIZE;
  CHECK(p->se.get_allocator_stats(&p->device, &as));
  CHECK(as.num_allocs == 7 && as.bytes_in_use == free0 - free1 && as.largest_alloc_size == 100000);
  CHECK(as.has_bytes_limit && as.bytes_limit == static_cast<int64_t>(limit));

  // map: inside one allocation only.
  char err[TFMO_EMU_ERROR_BYTES];
  char* d1000 = static_cast<char*>(allocs[3].first);
  void* h0 = h->api->map(h->self, d1000, 1000, err, sizeof err);
  CHECK_MSG(h0 != nullptr, err);
  CHECK(h->api->map(h->self, d1000 + 10, 990, err, sizeof err) == static_cast<char*>(h0) + 10);
  CHECK(h->api->map(h->self, d1000 + 999, 0, err, sizeof err) == static_cast<char*>(h0) + 999);
  CHECK(h->api->map(h->self, d1000, 0, err, sizeof err) == h0);
  CHECK(h->api->map(h->self, allocs[6].first, 0, err, sizeof err) != nullptr);  // 0-byte allocation, 0 bytes
  CHECK(h->api->map(h->self, d1000 + 10, 991, err, sizeof err) == nullptr);
  CHECK_MSG(strstr(err, "overruns") != nullptr, err);
  CHECK(h->api->map(h->self, d1000 + 1000, 1, err, sizeof err) == nullptr);
  int host_var = 0;
  CHECK(h->api->map(h->self, &host_var, 4, err, sizeof err) == nullptr);
  CHECK_MSG(strstr(err, "not device memory") != nullptr, err);
  err[0] = 'x';
  CHECK(h->api->map(h->self, d1000 + 1000, 1, err, 1) == nullptr && err[0] == '\0');  // truncated, terminated

  // Round trips: sync and async copies, memsets, dtod.
  std::vector<unsigned char> src(100000), dst(100000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 31 + 7);
  SP_DeviceMemoryBase big = Mem(allocs[5].first, 100000);
  p->se.sync_memcpy_htod(&p->device, &big, src.data(), 100000, p->st);
  p->Ok();
  p->se.sync_memcpy_dtoh(&p->device, dst.data(), &big, 100000, p->st);
  p->Ok();
  CHECK(src == dst);
  CHECK(memcmp(h->api->map(h->self, allocs[5].first, 100000, err, sizeof err), src.data(), 100000) == 0);
  SP_DeviceMemoryBase m4096 = Mem(allocs[4].first, 4096);
  std::vector<unsigned char> out(4096);
  p->se.memcpy_htod(&p->device, s, &m4096, src.data() + 5, 4096, p->st);
  p->Ok();
  p->se.memcpy_dtoh(&p->device, s, out.data(), &m4096, 4096, p->st);
  p->Ok();
  p->se.block_host_until_done(&p->device, s, p->st);
  p->Ok();
  CHECK(memcmp(out.data(), src.data() + 5, 4096) == 0);
  SP_DeviceMemoryBase m256 = Mem(allocs[2].first, 256);
  p->se.memset(&p->device, s, &m256, 0xAB, 256, p->st);
  p->Ok();
  p->se.memcpy_dtoh(&p->device, s, out.data(), &m256, 256, p->st);
  p->se.block_host_until_done(&p->device, s, p->st);
  p->Ok();
  for (int i = 0; i < 256; ++i) CHECK(out[i] == 0xAB);
  p->se.memset32(&p->device, s, &m256, 0x01020304u, 256, p->st);
  p->se.memcpy_dtoh(&p->device, s, out.data(), &m256, 256, p->st);
  p->se.block_host_until_done(&p->device, s, p->st);
  p->Ok();
  for (int i = 0; i < 64; ++i) {
    uint32_t v;
    memcpy(&v, out.data() + 4 * i, 4);
    CHECK(v == 0x01020304u);
  }
  p->se.memset32(&p->device, s, &m256, 0, 255, p->st);  // not a multiple of 4: an error, not a crash
  CHECK(TF_GetCode(p->st) != TF_OK);
  TF_SetStatus(p->st, TF_OK, "");
  p->se.mem_zero(&p->device, s, &m256, 256, p->st);
  SP_DeviceMemoryBase big_off = Mem(static_cast<char*>(allocs[5].first) + 1000, 4096);
  p->se.memcpy_dtod(&p->device, s, &m4096, &big_off, 4096, p->st);
  p->se.memcpy_dtoh(&p->device, s, out.data(), &m4096, 4096, p->st);
  p->se.block_host_until_done(&p->device, s, p->st);
  p->Ok();
  CHECK(memcmp(out.data(), src.data() + 1000, 4096) == 0);
  p->se.sync_memcpy_dtoh(&p->device, out.data(), &m256, 256, p->st);
  p->Ok();
  for (int i = 0; i < 256; ++i) CHECK(out[i] == 0);
  // Out-of-range copies are errors at enqueue time.
  SP_DeviceMemoryBase over = Mem(allocs[2].first, 257);
  p->se.memcpy_htod(&p->device, s, &over, src.data(), 257, p->st);
  CHECK(TF_GetCode(p->st) != TF_OK);
  TF_SetStatus(p->st, TF_OK, "");
  p->se.sync_memcpy_htod(&p->device, &over, src.data(), 257, p->st);
  CHECK(TF_GetCode(p->st) != TF_OK);
  TF_SetStatus(p->st, TF_OK, "");

  // Free with no work pending: freed at once; map fails; the range is never handed out again.
  p->Free(d1000, 1000);
  CHECK(p->Stat("deferred_frees_pending") == 0);
  CHECK(p->Stat("live_allocations") == 6);
  CHECK(h->api->map(h->self, d1000, 4, err, sizeof err) == nullptr);
  CHECK_MSG(strstr(err, "use after free") != nullptr, err);
  p->Free(d1000, 1000);  // double free: reported, not a crash
  CHECK(p->Stat("bad_frees") == 1);
  p->Free(d1000 + 8, 1000);
  CHECK(p->Stat("bad_frees") == 2);
  for (int i = 0; i < 2000; ++i) {
    void* d = p->Alloc(1000);
    CHECK(d != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(d) + 1000 <= reinterpret_cast<uintptr_t>(d1000) ||
          reinterpret_cast<uintptr_t>(d) >= reinterpret_cast<uintptr_t>(d1000) + 1000);
    p->Free(d, 1000);
  }
  CHECK(p->Stat("deferred_frees_pending") == 0);

  // Beyond the limit: null, nothing held.
  CHECK(p->Alloc(limit + 1) == nullptr);
  void* half = p->Alloc(limit / 2);
  CHECK(half != nullptr);
  CHECK(p->Alloc(limit / 2) == nullptr);
  CHECK(p->Stat("failed_allocations") == 2);
  p->Free(half, limit / 2);
  void* again = p->Alloc(limit / 2);
  CHECK(again != nullptr);
  p->Free(again, limit / 2);

  SP_StreamExecutor& se = p->se;
  void* hm = se.host_memory_allocate(&p->device, 1234);
  CHECK(hm != nullptr);
  memset(hm, 1, 1234);  // plain host memory
  se.host_memory_deallocate(&p->device, hm);
  se.get_stream_status(&p->device, s, p->st);
  p->Ok();
  se.destroy_stream(&p->device, s);
  for (size_t i = 0; i < allocs.size(); ++i)
    if (i != 3) p->Free(allocs[i].first, allocs[i].second);
}

// ------------------------------------------------------------------------------------------------------------------
void PreviousHandler(int) {
  const char msg[] = "PREVIOUS HANDLER\n";
  ssize_t r = write(2, msg, sizeof msg - 1);
  (void)r;
  _exit(42);
}

// Runs fn in a forked child whose stderr is captured; returns (wait status, stderr).
std::pair<int, std::string> InChild(const std::function<void()>& fn) {
  int fds[2];
  CHECK(pipe(fds) == 0);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    fn();
    _exit(0);
  }
  close(fds[1]);
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  return {status, text};
}

std::string HexStr(const void* p) {
  char b[32];
  snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p)));
  return b;
}

void ScenarioFault(const char* path) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = PreviousHandler;
  sigemptyset(&sa.sa_mask);
  CHECK(sigaction(SIGSEGV, &sa, nullptr) == 0);  // installed before the plugin: it must chain to this one
  Plugin* p = Load(path);
  void* d = p->Alloc(4000);
  CHECK(d != nullptr);
  char* inner = static_cast<char*>(d) + 1234;
  auto r = InChild([&] {
    volatile char c = *reinterpret_cast<volatile char*>(inner);
    (void)c;
  });
  CHECK_MSG(WIFSIGNALED(r.first) && WTERMSIG(r.first) == SIGSEGV, r.second);
  std::string want = "tf_metal_ops emulated GPU: host code dereferenced device memory at " + HexStr(inner) +
                     " (an allocation of 4000 bytes at " + HexStr(d) + ")";
  CHECK_MSG(r.second.find(want) != std::string::npos, r.second);
  CHECK_MSG(r.second.find("GPU kernels must not read tensor data on the host") != std::string::npos, r.second);
  CHECK(r.second.find("PREVIOUS HANDLER") == std::string::npos);
  // A write faults the same way.
  r = InChild([&] { *reinterpret_cast<volatile int*>(d) = 1; });
  CHECK_MSG(WIFSIGNALED(r.first) && WTERMSIG(r.first) == SIGSEGV, r.second);
  CHECK_MSG(r.second.find("dereferenced device memory at " + HexStr(d)) != std::string::npos, r.second);
  // A fault outside the device range goes to the handler installed before.
  r = InChild([&] {
    volatile char c = *reinterpret_cast<volatile char*>(static_cast<uintptr_t>(64));
    (void)c;
  });
  CHECK_MSG(WIFEXITED(r.first) && WEXITSTATUS(r.first) == 42, r.second);
  CHECK_MSG(r.second.find("PREVIOUS HANDLER") != std::string::npos, r.second);
  CHECK(r.second.find("dereferenced device memory") == std::string::npos);
  // Freed device memory still traps (the range is reserved, not unmapped).
  p->Free(d, 4000);
  r = InChild([&] {
    volatile char c = *reinterpret_cast<volatile char*>(d);
    (void)c;
  });
  CHECK_MSG(WIFSIGNALED(r.first) && WTERMSIG(r.first) == SIGSEGV, r.second);
  CHECK_MSG(r.second.find("dereferenced device memory at " + HexStr(d)) != std::string::npos, r.second);
}

// ------------------------------------------------------------------------------------------------------------------
void ScenarioOrdering(Plugin* p) {
  SP_Stream s = p->NewStream();
  const TfmoEmuStreamHeader* h = Header(s);
  Log log;
  Gate gate;
  void* d = p->Alloc(64);
  std::vector<float> values(16, 2.5f);
  SP_DeviceMemoryBase m = Mem(d, 64);

  // 1. queue_sync runs after everything already enqueued (a blocked host callback), on the calling thread.
  HostCallback(p, s, [&](TF_Status*) {
    gate.Wait();
    log.Add("cb1");
  });
  p->se.memcpy_htod(&p->device, s, &m, values.data(), 64, p->st);
  p->Ok();
  std::atomic<bool> fn_started{false};
  pthread_t caller = pthread_self();
  std::atomic<bool> fn_on_caller{false};
  std::thread releaser([&] {
    // fn must not start while cb1 is blocked: wait a bounded time for a start that must not happen, then open.
    log.WaitFor("fn", 300);
    gate.Open();
  });
  TestWork w_read;
  float seen = 0;
  pthread_t worker_thread{};
  w_read.fn = [&](TfmoEmuStream* st, char* e, size_t n) {
    worker_thread = pthread_self();
    void* hp = h->api->map(st, d, 64, e, n);
    if (hp == nullptr) return 1;
    memcpy(&seen, hp, 4);
    log.Add("w_read");
    return 0;
  };
  QueueSync(h, [&] {
    fn_started = true;
    fn_on_caller = pthread_equal(pthread_self(), caller);
    log.Add("fn");
    TfmoEmuCommandBuffer* cb = h->api->current_command_buffer(h->self);
    CHECK(cb != nullptr);
    CHECK(h->api->current_command_buffer(h->self) == cb);
    h->api->encode(cb, w_read.Make());
    h->api->commit(h->self);  // async: runs after fn returns
    CHECK(!log.Has("w_read"));
  });
  releaser.join();
  CHECK(fn_on_caller);
  p->se.block_host_until_done(&p->device, s, p->st);
  p->Ok();
  CHECK_MSG(log.Joined() == "cb1,fn,w_read,", log.Joined());
  CHECK(seen == 2.5f);  // the htod copy enqueued before ran before the work
  CHECK(w_read.runs == 1 && w_read.releases == 1);

  // 2. commit_and_wait inside queue_sync: work ran when it returns, in order, after earlier async commits.
  TestWork a, b, c;
  a.fn = [&](TfmoEmuStream*, char*, size_t) { log.Add("a"); return 0; };
  std::atomic<bool> b_on_worker{false};
  b.fn = [&](TfmoEmuStream*, char*, size_t) {
    b_on_worker = pthread_equal(pthread_self(), worker_thread) && !pthread_equal(pthread_self(), caller);
    log.Add("b");
    return 0;
  };
  c.fn = [&](TfmoEmuStream*, char*, size_t) { log.Add("c"); return 0; };
  QueueSync(h, [&] {
    h->api->encode(h->api->current_command_buffer(h->self), a.Make());
    h->api->commit(h->self);
    TfmoEmuCommandBuffer* cb2 = h->api->current_command_buffer(h->self);
    h->api->encode(cb2, b.Make());
    h->api->encode(cb2, c.Make());
    char e[TFMO_EMU_ERROR_BYTES];
    int rc = h->api->commit_and_wait(h->self, e, sizeof e);
    CHECK_MSG(rc == 0, e);
    CHECK_MSG(log.Joined() == "cb1,fn,w_read,a,b,c,", log.Joined());
    // commit_and_wait with nothing encoded returns at once
    CHECK(h->api->commit_and_wait(h->self, e, sizeof e) == 0);
  });
  CHECK(b_on_worker);  // work runs on the stream's own thread, also under commit_and_wait inside queue_sync
  CHECK(a.runs == 1 && a.releases == 1 && b.runs == 1 && b.releases == 1 && c.runs == 1 && c.releases == 1);

  // 3. commit_and_wait from a thread outside queue_sync waits for the buffer and everything before it.
  TestWork e1;
  e1.fn = [&](TfmoEmuStream*, char*, size_t) { log.Add("e1"); return 0; };
  QueueSync(h, [&] { h->api->encode(h->api->current_command_buffer(h->self), e1.Make()); });  // left open
  Gate gate2;
  HostCallback(p, s, [&](TF_Status*) {
    gate2.Wait();
    log.Add("cb2");
  });
  std::atomic<int> outside_rc{-1};
  std::thread waiter([&] {
    char e[TFMO_EMU_ERROR_BYTES];
    int r = h->api->commit_and_wait(h->self, e, sizeof e);
    log.Add("returned");
    outside_rc = r;
  });
  CHECK(!log.WaitFor("returned", 200));  // cannot return before cb2 (blocked) and e1 have run
  gate2.Open();
  waiter.join();
  CHECK(outside_rc == 0);
  CHECK_MSG(log.Joined() == "cb1,fn,w_read,a,b,c,cb2,e1,returned,", log.Joined());
  CHECK(e1.runs == 1 && e1.releases == 1);

  // 4. Many interleaved items keep FIFO order.
  std::vector<TestWork> works(50);
  for (int i = 0; i < 50; ++i) {
    works[i].fn = [&, i](TfmoEmuStream*, char*, size_t) { log.Add("w" + std::to_string(i)); return 0; };
    HostCallback(p, s, [&, i](TF_Status*) { log.Add("h" + std::to_string(i)); });
    QueueSync(h, [&, i] {
      h->api->encode(h->api->current_command_buffer(h->self), works[i].Make());
      if (i % 2 == 0) h->api->commit(h->self);  // odd ones are committed together with the next even one
    });
  }
  QueueSync(h, [&] { h->api->commit(h->self); });
  p->se.synchronize_all_activity(&p->device, p->st);
  p->Ok();
  {
    std::string got = log.Joined();
    size_t start = got.find("h0,");
    CHECK(start != std::string::npos);
    got = got.substr(start);
    // odd i: w_i is committed with w_{i+1}, so it runs after h_{i+1}
    std::string expect;
    for (int i = 0; i < 50; ++i) {
      if (i % 2 == 0) {
        expect += "h" + std::to_string(i) + ",w" + std::to_string(i) + ",";
      } else {
        expect += "h" + std::to_string(i) + ",";
        if (i + 1 < 50) expect += "h" + std::to_string(i + 1) + ",";
        expect += "w" + std::to_string(i) + ",";
        if (i + 1 < 50) expect += "w" + std::to_string(i + 1) + ",";
        ++i;
      }
    }
    CHECK_MSG(got == expect, got + " != " + expect);
  }
  for (auto& w : works) CHECK(w.runs == 1 && w.releases == 1);

  // 5. A host callback returning an error is logged; the stream stays usable.
  HostCallback(p, s, [&](TF_Status* st) { TF_SetStatus(st, TF_INTERNAL, "callback says no"); });
  p->se.block_host_until_done(&p->device, s, p->st);
  p->Ok();
  CHECK(p->Stat("host_callback_errors") == 1);
  p->se.get_stream_status(&p->device, s, p->st);
  p->Ok();

  // 6. Uncommitted work is released (never run) when the stream is destroyed.
  TestWork orphan;
  QueueSync(h, [&] { h->api->encode(h->api->current_command_buffer(h->self), orphan.Make()); });
  p->Free(d, 64);
  CHECK(p->Stat("deferred_frees_pending") == 1);  // the orphan was encoded before the free
  p->se.destroy_stream(&p->device, s);
  CHECK(orphan.runs == 0 && orphan.releases == 1);
  CHECK(p->Stat("deferred_frees_pending") == 0);
  CHECK(p->Stat("pending_work_items") == 0);
}

// ------------------------------------------------------------------------------------------------------------------
void ScenarioFailure(Plugin* p) {
  SP_Stream s = p->NewStream();
  const TfmoEmuStreamHeader* h = Header(s);
  TestWork ok1, bad, skipped, later;
  ok1.fn = [](TfmoEmuStream*, char*, size_t) { return 0; };
  bad.fn = [](TfmoEmuStream*, char* e, size_t n) {
    snprintf(e, n, "boom: kernel exploded");
    return 7;
  };
  skipped.fn = [](TfmoEmuStream*, char*, size_t) { return 0; };
  later.fn = [](TfmoEmuStream*, char*, size_t) { return 0; };
  int rc = -1;
  char msg[TFMO_EMU_ERROR_BYTES] = "";
  QueueSync(h, [&] {
    TfmoEmuCommandBuffer* cb = h->api->current_command_buffer(h->self);
    h->api->encode(cb, ok1.Make());
    h->api->encode(cb, bad.Make());
    h->api->encode(cb, skipped.Make());
    rc = h->api->commit_and_wait(h->self, msg, sizeof msg);
  });
  CHECK(rc != 0);
  CHECK_MSG(strstr(msg, "boom: kernel exploded") != nullptr, msg);
  CHECK(ok1.runs == 1 && bad.runs == 1 && skipped.runs == 0);
  CHECK(ok1.releases == 1 && bad.releases == 1 && skipped.releases == 1);
  p->se.get_stream_status(&p->device, s, p->st);
  CHECK(TF_GetCode(p->st) != TF_OK);
  CHECK_MSG(strstr(TF_Message(p->st), "boom: kernel exploded") != nullptr, TF_Message(p->st));
  TF_SetStatus(p->st, TF_OK, "");
  // A later buffer still runs (a failed command buffer does not poison the queue).
  QueueSync(h, [&] {
    h->api->encode(h->api->current_command_buffer(h->self), later.Make());
    rc = h->api->commit_and_wait(h->self, msg, sizeof msg);
  });
  CHECK(rc == 0 && later.runs == 1 && later.releases == 1);

  // Async commit failing, work without a message, map failures inside work.
  SP_Stream s2 = p->NewStream();
  const TfmoEmuStreamHeader* h2 = Header(s2);
  void* d = p->Alloc(100);
  TestWork silent, mapper;
  silent.fn = [](TfmoEmuStream*, char*, size_t) { return 3; };
  std::string map_err;
  mapper.fn = [&](TfmoEmuStream* st, char* e, size_t n) {
    if (h2->api->map(st, static_cast<char*>(d) + 50, 51, e, n) != nullptr) return 0;
    map_err = e;
    return 1;
  };
  QueueSync(h2, [&] {
    h2->api->encode(h2->api->current_command_buffer(h2->self), mapper.Make());
    rc = h2->api->commit_and_wait(h2->self, msg, sizeof msg);
  });
  CHECK(rc != 0 && strstr(msg, "overruns") != nullptr && map_err == msg);
  QueueSync(h2, [&] {
    h2->api->encode(h2->api->current_command_buffer(h2->self), silent.Make());
    h2->api->commit(h2->self);
  });
  p->se.block_host_until_done(&p->device, s2, p->st);
  CHECK(TF_GetCode(p->st) != TF_OK);
  TF_SetStatus(p->st, TF_OK, "");
  CHECK(silent.runs == 1 && silent.releases == 1);
  // Encoding into a buffer that was already committed is an error (work released, not run).
  TestWork stale;
  QueueSync(h2, [&] {
    TfmoEmuCommandBuffer* cb = h2->api->current_command_buffer(h2->self);
    h2->api->commit(h2->self);
    h2->api->encode(cb, stale.Make());
  });
  p->se.block_host_until_done(&p->device, s2, p->st);
  TF_SetStatus(p->st, TF_OK, "");
  CHECK(stale.runs == 0 && stale.releases == 1);
  p->Free(d, 100);
  p->se.destroy_stream(&p->device, s2);
  p->se.destroy_stream(&p->device, s);
  CHECK(p->Stat("pending_work_items") == 0);
}

// ------------------------------------------------------------------------------------------------------------------
void ScenarioDeferredFree(Plugin* p) {
  SP_Stream s = p->NewStream();
  SP_Stream t = p->NewStream();
  const TfmoEmuStreamHeader* h = Header(s);
  const TfmoEmuStreamHeader* ht = Header(t);
  const int n = 1000;
  std::vector<int32_t> vals(n);
  for (int i = 0; i < n; ++i) vals[i] = i * 3 - 7;
  void* a = p->Alloc(n * 4);
  void* b = p->Alloc(n * 4);
  SP_DeviceMemoryBase ma = Mem(a, n * 4), mb = Mem(b, n * 4);
  p->se.sync_memcpy_htod(&p->device, &ma, vals.data(), n * 4, p->st);
  p->se.sync_memcpy_htod(&p->device, &mb, vals.data(), n * 4, p->st);
  p->Ok();

  Gate gate;
  TestWork blocker, reader;
  blocker.fn = [&](TfmoEmuStream*, char*, size_t) { gate.Wait(); return 0; };
  std::vector<int32_t> read_back(n, 0);
  reader.fn = [&](TfmoEmuStream* st, char* e, size_t len) {
    void* hp = h->api->map(st, a, n * 4, e, len);
    if (hp == nullptr) return 1;
    memcpy(read_back.data(), hp, n * 4);
    return 0;
  };
  QueueSync(h, [&] {
    TfmoEmuCommandBuffer* cb = h->api->current_command_buffer(h->self);
    h->api->encode(cb, blocker.Make());
    h->api->encode(cb, reader.Make());
    h->api->commit(h->self);
  });
  std::vector<int32_t> copied(n, 0);
  p->se.memcpy_dtoh(&p->device, s, copied.data(), &mb, n * 4, p->st);  // queued behind the blocker
  p->Ok();
  // TF frees both while the work that uses them is still queued.
  p->Free(a, n * 4);
  p->Free(b, n * 4);
  CHECK(p->Stat("deferred_frees_pending") == 2);
  CHECK(p->Stat("live_allocations") == 0);
  CHECK(p->Stat("held_bytes") == 2 * n * 4);
  char err[TFMO_EMU_ERROR_BYTES];
  CHECK(h->api->map(h->self, a, 4, err, sizeof err) == nullptr);  // outside work: only live memory
  CHECK_MSG(strstr(err, "use after free") != nullptr, err);
  // Work created after the free must not use it, even though the memory is still held.
  TestWork late;
  late.fn = [&](TfmoEmuStream* st, char* e, size_t len) { return ht->api->map(st, a, 4, e, len) != nullptr ? 0 : 1; };
  int rc = 0;
  QueueSync(ht, [&] {
    ht->api->encode(ht->api->current_command_buffer(ht->self), late.Make());
    rc = ht->api->commit_and_wait(ht->self, err, sizeof err);
  });
  CHECK(rc != 0);
  CHECK_MSG(strstr(err, "use after free") != nullptr && strstr(err, "deallocated before this work") != nullptr, err);
  // An async copy from freed memory is refused at enqueue.
  p->se.memcpy_dtoh(&p->device, t, copied.data(), &ma, 4, p->st);
  CHECK(TF_GetCode(p->st) != TF_OK);
  TF_SetStatus(p->st, TF_OK, "");
  CHECK(p->Stat("deferred_frees_pending") == 2);
  gate.Open();
  p->se.synchronize_all_activity(&p->device, p->st);
  p->Ok();
  CHECK(reader.runs == 1 && reader.releases == 1);
  CHECK(read_back == vals);
  CHECK(copied == vals);
  CHECK(p->Stat("deferred_frees_pending") == 0);
  CHECK(p->Stat("held_bytes") == 0);
  CHECK(h->api->map(h->self, a, 4, err, sizeof err) == nullptr);
  CHECK_MSG(strstr(err, "freed") != nullptr, err);
  CHECK(h->api->map(h->self, b, 0, err, sizeof err) == nullptr);

  // Work on another stream also holds the free back until it has run.
  void* c = p->Alloc(16);
  Gate gate2;
  TestWork blocker2;
  blocker2.fn = [&](TfmoEmuStream*, char*, size_t) { gate2.Wait(); return 0; };
  QueueSync(ht, [&] {
    ht->api->encode(ht->api->current_command_buffer(ht->self), blocker2.Make());
    ht->api->commit(ht->self);
  });
  p->Free(c, 16);
  CHECK(p->Stat("deferred_frees_pending") == 1);
  p->se.block_host_until_done(&p->device, s, p->st);  // s is idle: not enough
  CHECK(p->Stat("deferred_frees_pending") == 1);
  gate2.Open();
  p->se.block_host_until_done(&p->device, t, p->st);
  CHECK(p->Stat("deferred_frees_pending") == 0);
  TF_SetStatus(p->st, TF_OK, "");
  p->se.destroy_stream(&p->device, s);
  p->se.destroy_stream(&p->device, t);
}

// ------------------------------------------------------------------------------------------------------------------
void ScenarioEvents(Plugin* p) {
  SP_Stream s = p->NewStream();
  SP_Stream t = p->NewStream();
  Log log;
  Gate gate;
  SP_Event ev = nullptr;
  p->se.create_event(&p->device, &ev, p->st);
  p->Ok();
  CHECK(p->se.get_event_status(&p->device, ev) == SE_EVENT_COMPLETE);  // never recorded
  HostCallback(p, s, [&](TF_Status*) {
    gate.Wait();
    log.Add("s1");
  });
  p->se.record_event(&p->device, s, ev, p->st);
  p->Ok();
  CHECK(p->se.get_event_status(&p->device, ev) == SE_EVENT_PENDING);
  p->se.wait_for_event(&p->device, t, ev, p->st);
  p->Ok();
  HostCallback(p, t, [&](TF_Status*) { log.Add("t1"); });
  CHECK(!log.WaitFor("t1", 200));  // t waits for the event, which waits for s1
  CHECK(p->se.get_event_status(&p->device, ev) == SE_EVENT_PENDING);
  gate.Open();
  p->se.block_host_for_event(&p->device, ev, p->st);
  p->Ok();
  CHECK(p->se.get_event_status(&p->device, ev) == SE_EVENT_COMPLETE);
  CHECK(log.Has("s1"));
  p->se.block_host_until_done(&p->device, t, p->st);
  p->Ok();
  CHECK_MSG(log.Joined() == "s1,t1,", log.Joined());

  // create_stream_dependency: t waits for what s had enqueued so far.
  Gate gate2;
  HostCallback(p, s, [&](TF_Status*) {
    gate2.Wait();
    log.Add("s2");
  });
  p->se.create_stream_dependency(&p->device, t, s, p->st);
  p->Ok();
  HostCallback(p, t, [&](TF_Status*) { log.Add("t2"); });
  CHECK(!log.WaitFor("t2", 200));
  gate2.Open();
  p->se.synchronize_all_activity(&p->device, p->st);
  p->Ok();
  CHECK_MSG(log.Joined() == "s1,t1,s2,t2,", log.Joined());
  // A stream depending on itself is a no-op (no deadlock).
  p->se.create_stream_dependency(&p->device, s, s, p->st);
  p->se.block_host_until_done(&p->device, s, p->st);
  p->Ok();
  p->se.destroy_event(&p->device, ev);
  p->se.destroy_stream(&p->device, s);
  p->se.destroy_stream(&p->device, t);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s <plugin.so> <scenario>\n", argv[0]);
    return 2;
  }
  std::string sc = argv[2];
  if (sc == "fault") {
    ScenarioFault(argv[1]);
  } else {
    Plugin* p = Load(argv[1]);
    if (sc == "memory") ScenarioMemory(p);
    else if (sc == "ordering") ScenarioOrdering(p);
    else if (sc == "failure") ScenarioFailure(p);
    else if (sc == "deferred_free") ScenarioDeferredFree(p);
    else if (sc == "events") ScenarioEvents(p);
    else {
      fprintf(stderr, "unknown scenario %s\n", sc.c_str());
      return 2;
    }
    // Nothing the scenario allocated is left behind.
    using LeakFn = int64_t (*)();
    void* h = dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD);
    auto leaks = reinterpret_cast<LeakFn>(dlsym(h, "tfmo_emu_device_check_leaks"));
    int64_t left = leaks();
    CHECK_MSG(left == 0, std::to_string(left) + " allocations not freed");
  }
  printf("PASS %s\n", sc.c_str());
  return 0;
}
