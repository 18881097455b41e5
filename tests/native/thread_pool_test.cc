// Stress test of csrc/common/thread_pool.cc, built by tests/test_thread_pool_native.py under TSan and ASan/UBSan.
// Exits non-zero (with a message) on any wrong result; the sanitizers abort on races and memory errors.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <thread>
#include <vector>

#include "common/thread_pool.h"

static int failures = 0;
#define EXPECT(cond)                                                        \
  do {                                                                      \
    if (!(cond)) {                                                          \
      std::fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                           \
    }                                                                       \
  } while (0)

// Every index visited exactly once, for sizes around the chunking boundaries.
static void CoversRange() {
  for (int64_t n : {0, 1, 2, 3, 7, 64, 1000, 4097}) {
    for (int64_t grain : {1, 3, 100, 5000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      tfmo::ParallelFor(n, grain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) EXPECT(hits[static_cast<size_t>(i)].load() == 1);
    }
  }
}

// Many callers at once, each with nested parallel loops: no deadlock, exact sums.
static void ConcurrentAndNested() {
  std::vector<std::thread> callers;
  std::atomic<int64_t> total{0};
  for (int c = 0; c < 8; ++c) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 20; ++rep) {
        tfmo::ParallelFor(64, 1, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i)
            tfmo::ParallelParts(4, [&](int64_t) { total.fetch_add(1, std::memory_order_relaxed); });
        });
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT(total.load() == 8 * 20 * 64 * 4);
}

// Results written by workers are visible to the caller after ParallelParts returns.
static void PublishesResults() {
  std::vector<int64_t> out(1000, 0);
  tfmo::ParallelParts(1000, [&](int64_t p) { out[static_cast<size_t>(p)] = p * p; });
  for (int64_t p = 0; p < 1000; ++p) EXPECT(out[static_cast<size_t>(p)] == p * p);
}

static void ThreadCountChanges() {
  tfmo::SetNumThreads(1);
  EXPECT(tfmo::NumThreads() == 1);
  std::atomic<int> n{0};
  tfmo::ParallelParts(10, [&](int64_t) { n.fetch_add(1); });
  EXPECT(n.load() == 10);
  tfmo::SetNumThreads(4);  // grows the pool
  EXPECT(tfmo::NumThreads() == 4);
  PublishesResults();
  tfmo::SetNumThreads(0);  // back to the default
  EXPECT(tfmo::NumThreads() >= 1);
}

// A forked child (threads do not survive fork) can still run parallel work.
static void SurvivesFork() {
  PublishesResults();  // the parent's pool exists
  pid_t pid = fork();
  if (pid == 0) {
    std::atomic<int> n{0};
    tfmo::ParallelParts(100, [&](int64_t) { n.fetch_add(1); });
    _exit(n.load() == 100 ? 0 : 3);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(int argc, char** argv) {
  bool with_fork = !(argc > 1 && std::string_view(argv[1]) == "--no-fork");
  tfmo::SetNumThreads(3);
  CoversRange();
  ConcurrentAndNested();
  PublishesResults();
  ThreadCountChanges();
  if (with_fork) SurvivesFork();
  std::printf("%s\n", failures ? "FAILED" : "thread pool: all checks passed");
  return failures ? 1 : 0;
}
