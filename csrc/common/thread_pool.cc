#include "common/thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace tfmo {
namespace {

int DefaultThreads() {
  if (const char* env = std::getenv("TF_METAL_OPS_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return std::min(n, 256);
  }
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(std::min(n, 256u)) : 1;
}

// One ParallelParts call: parts are claimed with an atomic counter by the caller and by workers.
struct Job {
  const std::function<void(int64_t)>* fn;
  int64_t parts;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable cv;

  // Runs parts until none is left. Returns after contributing; completion is signalled via `done`.
  void Work() {
    for (;;) {
      int64_t p = next.fetch_add(1, std::memory_order_relaxed);
      if (p >= parts) return;
      (*fn)(p);
      if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == parts) {
        std::lock_guard<std::mutex> l(mu);
        cv.notify_all();
      }
    }
  }
};

class Pool {
 public:
  explicit Pool(int workers) {
    for (int i = 0; i < workers; ++i) std::thread([this] { Loop(); }).detach();
  }

  // Offers the job to up to `helpers` workers; the caller runs it too.
  void Run(const std::shared_ptr<Job>& job, int helpers) {
    if (helpers > 0) {
      std::lock_guard<std::mutex> l(mu_);
      for (int i = 0; i < helpers; ++i) queue_.push_back(job);
    }
    cv_.notify_all();
    job->Work();
    std::unique_lock<std::mutex> l(job->mu);
    job->cv.wait(l, [&] { return job->done.load(std::memory_order_acquire) == job->parts; });
  }

 private:
  void Loop() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return !queue_.empty(); });
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      job->Work();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
};

std::atomic<int> g_threads{0};  // 0: not yet decided
std::mutex g_pool_mu;
Pool* g_pool = nullptr;         // leaked on purpose (see header)
int g_pool_workers = 0;

// What ParallelFor has run since the library loaded: ranges (fn calls) and the items they covered together.
std::atomic<int64_t> g_for_ranges{0};
std::atomic<int64_t> g_for_items{0};

void CountRange(int64_t begin, int64_t end) {
  g_for_ranges.fetch_add(1, std::memory_order_relaxed);
  g_for_items.fetch_add(end - begin, std::memory_order_relaxed);
}

void AfterForkChild() {
  // Worker threads do not exist in the child and the pool's mutexes may be held: start afresh.
  new (&g_pool_mu) std::mutex();
  g_pool = nullptr;
  g_pool_workers = 0;
}

Pool* GetPool(int workers) {
  static std::once_flag atfork_once;
  std::call_once(atfork_once, [] { pthread_atfork(nullptr, nullptr, AfterForkChild); });
  std::lock_guard<std::mutex> l(g_pool_mu);
  if (g_pool == nullptr || g_pool_workers < workers) {
    // Grow by creating a larger pool; the old one stays alive (its idle workers cost nothing).
    g_pool = new Pool(workers);
    g_pool_workers = workers;
  }
  return g_pool;
}

}  // namespace

int NumThreads() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n <= 0) {
    n = DefaultThreads();
    g_threads.store(n, std::memory_order_relaxed);
  }
  return n;
}

void SetNumThreads(int n) { g_threads.store(n > 0 ? std::min(n, 256) : DefaultThreads()); }

void ParallelParts(int64_t parts, const std::function<void(int64_t)>& fn) {
  if (parts <= 0) return;
  int threads = NumThreads();
  if (parts == 1 || threads == 1) {
    for (int64_t p = 0; p < parts; ++p) fn(p);
    return;
  }
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->parts = parts;
  int helpers = static_cast<int>(std::min<int64_t>(threads - 1, parts - 1));
  GetPool(threads - 1)->Run(job, helpers);
}

void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int threads = NumThreads();
  // A few chunks per thread balance uneven work without much overhead.
  int64_t max_chunks = static_cast<int64_t>(threads) * 4;
  int64_t chunks = std::min<int64_t>(max_chunks, (n + grain - 1) / grain);
  if (chunks <= 1 || threads == 1) {
    fn(0, n);
    CountRange(0, n);
    return;
  }
  int64_t size = (n + chunks - 1) / chunks;
  chunks = (n + size - 1) / size;
  ParallelParts(chunks, [&](int64_t c) {
    const int64_t begin = c * size, end = std::min(n, (c + 1) * size);
    fn(begin, end);
    CountRange(begin, end);
  });
}

}  // namespace tfmo

extern "C" {
int tfmo_get_num_threads(void) { return tfmo::NumThreads(); }
void tfmo_set_num_threads(int n) { tfmo::SetNumThreads(n); }
void tfmo_parallel_for_stats(long long* ranges, long long* items) {
  *ranges = tfmo::g_for_ranges.load();
  *items = tfmo::g_for_items.load();
}
}
