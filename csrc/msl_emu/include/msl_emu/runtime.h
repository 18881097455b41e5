// msl_emu: the launcher. Runs a grid of threadgroups on the CPU; the threads of one threadgroup are fibers
// (switched by msl_emu/fiber_switch.h) so that threadgroup_barrier is a real rendezvous. Part of <metal_stdlib>;
// README.md explains.
//
// Invariants:
//  - one threadgroup runs at a time per worker OS thread; all its threads are fibers on that OS thread, so
//    kernel-scope `threadgroup` variables (expanded to `static thread_local`) are shared by exactly the
//    threads of the group that is running on that worker;
//  - a fiber runs until it returns or calls threadgroup_barrier; a barrier releases only when every
//    thread of the group waits at it (at the same call site). A thread that returns while others wait,
//    or threads waiting at different barrier call sites, is reported as an error (UB in MSL);
//  - errors print "msl_emu: error: ..." on stderr and end the process with exit status 70;
//  - SIMD groups: threads [32 k, 32 k + 32) of a group in thread_index_in_threadgroup order (the last one partial
//    when the group size is not a multiple of 32). A SIMD-group function (simd_*, quad_*, simdgroup_barrier, the
//    SIMD-group matrix functions in <metal_stdlib>) parks the calling fiber with its argument (SimdCall); once every fiber of the group is parked
//    or done, each SIMD group with parked callers is resolved: its ACTIVE threads are the ones that have not
//    returned, and all of them must wait in the same function at the same call site, else the run ends with
//    "divergent SIMD-group function" (a thread of that SIMD group waiting at a threadgroup_barrier or at another
//    SIMD-group call). The results are written to each caller and the callers resume; barriers are resolved
//    only when no SIMD group has parked callers;
//  - fiber stacks are mmap'd with a guard page below, allocated once per worker and reused by every group; ASan
//    builds unpoison a stack when a fiber starts on it (frames of the fiber that finished there are not unwound);
//    fiber i starts (i % kStackColors) cache lines below its stack's top, so that the frames the switches save do
//    not all map to the same cache set (the stacks are a multiple of the page size apart);
//  - fiber-free fast path (Options::fiber_free, for kernels that reach neither threadgroup_barrier nor a
//    SIMD-group function, in their body or a function they call: tf_metal_ops/msl_emu.py): no fibers; a group's threads run one after another, to completion, directly on the
//    worker thread, in the MSL_EMU_ORDER order. A barrier or SIMD-group function reached in this mode is a fatal
//    error (the caller's detection was wrong), never a silent race or a wrong reduction.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <source_location>
#include <thread>
#include <vector>

#include "msl_emu/atomic_counts.h"
#include "msl_emu/types.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MSL_EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define MSL_EMU_ASAN 1
#endif
#if defined(MSL_EMU_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#include "msl_emu/fiber_switch.h"

namespace msl_emu {

inline constexpr int kErrorExitCode = 70;

[[noreturn]] inline void fatal(const char* fmt, ...) {
  std::fflush(stdout);
  std::fputs("msl_emu: error: ", stderr);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fputc('\n', stderr);
  std::fflush(stderr);
  std::_Exit(kErrorExitCode);
}

// Values of the MSL kernel-argument attributes for one thread ([[thread_position_in_grid]] etc.).
struct ThreadCtx {
  uint3 thread_position_in_grid;
  uint3 thread_position_in_threadgroup;
  uint3 threadgroup_position_in_grid;
  uint3 threads_per_threadgroup;           // actual size of this group (smaller at a non-uniform edge)
  uint3 dispatch_threads_per_threadgroup;  // size given at dispatch
  uint3 threadgroups_per_grid;
  uint3 threads_per_grid;
  uint thread_index_in_threadgroup;  // x fastest, over the actual group size
  uint threads_per_simdgroup;        // the SIMD width, 32 (also thread_execution_width)
  uint thread_execution_width;
  uint simdgroup_index_in_threadgroup;  // thread_index_in_threadgroup / 32
  uint thread_index_in_simdgroup;       // thread_index_in_threadgroup % 32
  uint simdgroups_per_threadgroup;      // ceil(actual group size / 32)
  uint dispatch_simdgroups_per_threadgroup;  // ceil(dispatch group size / 32)
  uint quadgroup_index_in_threadgroup;  // thread_index_in_threadgroup / 4
  uint thread_index_in_quadgroup;       // thread_index_in_threadgroup % 4
  uint quadgroups_per_threadgroup;      // ceil(actual group size / 4)
  uint dispatch_quadgroups_per_threadgroup;
};

enum class Order { forward, reverse, shuffle };

struct Options {
  unsigned workers = 1;            // OS threads running groups concurrently (MSL_EMU_WORKERS)
  Order order = Order::forward;    // order fibers are resumed in, per barrier phase (MSL_EMU_ORDER)
  uint64_t seed = 0;               // for Order::shuffle (MSL_EMU_SEED)
  size_t stack_bytes = 256 << 10;  // per fiber (MSL_EMU_STACK_KB)
  bool fiber_free = false;         // fast path: no fibers; barriers and SIMD-group calls are fatal (header comment)
  const char* kernel_name = nullptr;  // for error messages
  AtomicCounts* atomic_counts = nullptr;  // non-null: count this dispatch's atomics into it (atomic_counts.h)

  static Options from_env() {
    Options o;
    if (const char* s = std::getenv("MSL_EMU_WORKERS")) o.workers = unsigned(std::strtoul(s, nullptr, 10));
    if (o.workers == 0) o.workers = std::max(1u, std::thread::hardware_concurrency());
    if (const char* s = std::getenv("MSL_EMU_ORDER")) {
      if (!std::strcmp(s, "forward")) o.order = Order::forward;
      else if (!std::strcmp(s, "reverse")) o.order = Order::reverse;
      else if (!std::strcmp(s, "shuffle")) o.order = Order::shuffle;
      else fatal("MSL_EMU_ORDER=%s: expected forward, reverse or shuffle", s);
    }
    if (const char* s = std::getenv("MSL_EMU_SEED")) o.seed = std::strtoull(s, nullptr, 10);
    if (const char* s = std::getenv("MSL_EMU_STACK_KB")) o.stack_bytes = size_t(std::strtoul(s, nullptr, 10)) << 10;
    if (o.stack_bytes < (32u << 10)) fatal("fiber stack of %zu bytes is too small", o.stack_bytes);
    return o;
  }
};

namespace detail {

inline constexpr uint kMaxThreadsPerGroup = 1024;  // Metal's limit on Apple GPUs
inline constexpr uint kSimdWidth = 32;             // threads per SIMD group on Apple GPUs
inline constexpr uint kStackColors = 64;           // fiber start offsets, in 64-byte lines (GroupRunner::run_group)

using KernelFn = void (*)(void* user, const ThreadCtx& t);

// One thread's part in a SIMD-group function call (<metal_stdlib>'s simd_*, quad_*, simdgroup_barrier). While the
// thread is parked, `in` and `out` point into its fiber's stack.
struct SimdCall {
  const char* function;  // "simd_sum", for messages
  const void* in;        // the thread's data argument (nullptr when the function has none)
  void* out;             // where the thread's result goes (nullptr: none)
  uint arg;              // lane / delta / mask argument (0 when the function has none)
  // Computes the results of one SIMD group: lanes[i] is lane i's call, nullptr for an inactive lane (returned, or
  // past the end of a partial SIMD group); width = kSimdWidth.
  void (*resolve)(SimdCall* const* lanes, uint width);
  std::source_location site;
};

inline bool same_site(const std::source_location& a, const std::source_location& b) {
  return a.line() == b.line() && a.column() == b.column() && std::strcmp(a.file_name(), b.file_name()) == 0;
}

inline uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class GroupRunner;
inline thread_local GroupRunner* tls_runner = nullptr;

// A barrier or SIMD-group function (`function`, called at `site`) reached by a kernel launched on the fiber-free
// fast path, by thread t (null: not known). `kernel` may be null.
[[noreturn]] inline void fast_path_error(const char* kernel, const char* function, std::source_location site,
                                         const ThreadCtx* t) {
  char where[96] = "";
  if (t != nullptr)
    std::snprintf(where, sizeof where, " (threadgroup (%u,%u,%u), thread %u)", t->threadgroup_position_in_grid.x,
                  t->threadgroup_position_in_grid.y, t->threadgroup_position_in_grid.z, t->thread_index_in_threadgroup);
  fatal("%s%s%s%s at %s:%u:%u reached on the fiber-free fast path%s: the kernel was launched on the fast path "
        "because the analysis of its source found no call of threadgroup_barrier or a SIMD-group function; that "
        "analysis is wrong",
        kernel ? "kernel " : "", kernel ? kernel : "", kernel ? ": " : "", function, site.file_name(),
        unsigned(site.line()), unsigned(site.column()), where);
}

// Inline launches run a kernel on the fast path in a loop of their own, without a GroupRunner
// (msl_emu/inline_launch.h: run_direct); while it runs, that loop names its kernel here (only the name: the loop's
// ThreadCtx must not escape, or the compiler could no longer vectorise the kernel over it).
inline thread_local const char* tls_direct_kernel = nullptr;

// Called by a barrier or SIMD-group function when this thread runs no GroupRunner: never returns.
[[noreturn]] inline void no_group_runner(const char* function, std::source_location site) {
  if (tls_direct_kernel != nullptr) fast_path_error(tls_direct_kernel, function, site, nullptr);
  fatal("%s at %s:%u called outside msl_emu::dispatch_*", function, site.file_name(), unsigned(site.line()));
}

class GroupRunner {
 public:
  explicit GroupRunner(const Options& o) : opt_(o) {
    page_ = size_t(sysconf(_SC_PAGESIZE));
    stack_bytes_ = (o.stack_bytes + page_ - 1) / page_ * page_;
  }
  GroupRunner(const GroupRunner&) = delete;
  GroupRunner& operator=(const GroupRunner&) = delete;
  ~GroupRunner() {
    for (auto& f : fibers_)
      if (f.map) munmap(f.map, stack_bytes_ + page_);
  }

  // Runs the n threads described by ctx[0..n) as one threadgroup; returns when all have returned.
  void run_group(const ThreadCtx* ctx, uint n, KernelFn fn, void* user, uint64_t group_linear) {
    ensure_fibers(n);
    fn_ = fn;
    user_ = user;
    n_ = n;
    for (uint i = 0; i < n; ++i) {
      Fiber& f = fibers_[i];
      f.ctx = &ctx[i];
      f.state = State::ready;
#if defined(MSL_EMU_ASAN)
      if (kFiberSwitchIsAsm) __asan_unpoison_memory_region(f.stack, stack_bytes_);
#endif
      fiber_prepare(f.context, f.stack, stack_bytes_ - (i % kStackColors) * 64, &GroupRunner::entry);
    }
    order_.resize(n);
    GroupRunner* saved = tls_runner;
    tls_runner = this;
    uint64_t rng = opt_.seed ^ (group_linear * 0x2545F4914F6CDD1Dull);
    for (uint phase = 0;;) {
      for (uint i = 0; i < n; ++i) order_[i] = opt_.order == Order::reverse ? n - 1 - i : i;
      if (opt_.order == Order::shuffle)
        for (uint i = n; i > 1; --i) std::swap(order_[i - 1], order_[splitmix64(rng) % i]);
      for (uint i : order_)
        if (fibers_[i].state == State::ready) resume(i);
      if (resolve_simd(ctx, n)) continue;  // SIMD groups first: their threads run on to the barrier
      uint waiting = 0, done = 0, first_wait = n, first_done = n;
      for (uint i = 0; i < n; ++i) {
        if (fibers_[i].state == State::waiting) waiting++, first_wait = first_wait == n ? i : first_wait;
        if (fibers_[i].state == State::done) done++, first_done = first_done == n ? i : first_done;
      }
      if (waiting == 0) break;  // every thread returned
      const Fiber& w = fibers_[first_wait];
      if (done > 0) {
        fatal("%sdivergent threadgroup_barrier: in threadgroup (%u,%u,%u), thread %u (index in group) returned "
              "while %u of %u threads wait at the barrier at %s:%u:%u (barrier phase %u); every thread of a "
              "threadgroup must reach every barrier",
              kernel_prefix().c, ctx[0].threadgroup_position_in_grid.x, ctx[0].threadgroup_position_in_grid.y,
              ctx[0].threadgroup_position_in_grid.z, ctx[first_done].thread_index_in_threadgroup, waiting, n,
              w.site.file_name(), unsigned(w.site.line()), unsigned(w.site.column()), phase);
      }
      for (uint i = 0; i < n; ++i) {
        const Fiber& f = fibers_[i];
        if (f.site.line() != w.site.line() || f.site.column() != w.site.column() ||
            std::strcmp(f.site.file_name(), w.site.file_name()) != 0) {
          fatal("%sdivergent threadgroup_barrier: threads of threadgroup (%u,%u,%u) wait at different barriers: "
                "thread %u at %s:%u:%u, thread %u at %s:%u:%u",
                kernel_prefix().c, ctx[0].threadgroup_position_in_grid.x, ctx[0].threadgroup_position_in_grid.y,
                ctx[0].threadgroup_position_in_grid.z, ctx[first_wait].thread_index_in_threadgroup,
                w.site.file_name(), unsigned(w.site.line()), unsigned(w.site.column()),
                ctx[i].thread_index_in_threadgroup, f.site.file_name(), unsigned(f.site.line()),
                unsigned(f.site.column()));
        }
      }
      for (uint i = 0; i < n; ++i) fibers_[i].state = State::ready;
      ++phase;
    }
    tls_runner = saved;
  }

  // Fast path: runs the n threads of group `gp` (actual size `actual`) one after another on this OS thread, in
  // opt_.order; make_ctx(i, t) fills the context of the i-th thread (x fastest).
  template <class MakeCtx>
  void run_group_direct(uint n, KernelFn fn, void* user, uint64_t group_linear, MakeCtx&& make_ctx) {
    GroupRunner* saved = tls_runner;
    tls_runner = this;
    direct_ = true;
    ThreadCtx t;
    if (opt_.order == Order::shuffle) {
      order_.resize(n);
      for (uint i = 0; i < n; ++i) order_[i] = i;
      uint64_t rng = opt_.seed ^ (group_linear * 0x2545F4914F6CDD1Dull);
      for (uint i = n; i > 1; --i) std::swap(order_[i - 1], order_[splitmix64(rng) % i]);
      for (uint i = 0; i < n; ++i) make_ctx(order_[i], t), direct_ctx_ = &t, fn(user, t);
    } else if (opt_.order == Order::reverse) {
      for (uint i = n; i-- > 0;) make_ctx(i, t), direct_ctx_ = &t, fn(user, t);
    } else {
      for (uint i = 0; i < n; ++i) make_ctx(i, t), direct_ctx_ = &t, fn(user, t);
    }
    direct_ = false;
    tls_runner = saved;
  }

  // Called by threadgroup_barrier on a fiber: park until the whole group has arrived.
  void barrier(std::source_location site) {
    if (direct_) fast_path_error(opt_.kernel_name, "threadgroup_barrier", site, direct_ctx_);
    Fiber& f = fibers_[current_];
    f.site = site;
    f.state = State::waiting;
    switch_to_scheduler(f, /*dying=*/false);
  }

  // Called by a SIMD-group function on a fiber: park until the SIMD group is resolved (header comment).
  void simd(SimdCall& c) {
    if (direct_) fast_path_error(opt_.kernel_name, c.function, c.site, direct_ctx_);
    Fiber& f = fibers_[current_];
    f.call = &c;
    f.state = State::simd;
    switch_to_scheduler(f, /*dying=*/false);
  }

  void set_kernel_name(const char* name) { opt_.kernel_name = name; }

 private:
  enum class State { ready, waiting, simd, done };  // waiting: at a threadgroup_barrier; simd: in a SIMD call
  struct Fiber {
    void* map = nullptr;    // mapping incl. guard page
    void* stack = nullptr;  // usable stack (above the guard page)
    FiberContext context;   // while switched out
    const ThreadCtx* ctx = nullptr;
    State state = State::done;
    std::source_location site;
    SimdCall* call = nullptr;    // while State::simd
    void* fake_stack = nullptr;  // ASan fake-stack handle while switched out
  };

  struct Prefix {
    char c[192];
  };
  Prefix kernel_prefix() const {
    Prefix p{};
    if (opt_.kernel_name != nullptr) std::snprintf(p.c, sizeof p.c, "kernel %s: ", opt_.kernel_name);
    return p;
  }

  // Resolves every SIMD group of the running threadgroup whose threads wait in a SIMD-group call; false if none.
  bool resolve_simd(const ThreadCtx* ctx, uint n) {
    bool any = false;
    constexpr uint w = kSimdWidth;
    for (uint base = 0; base < n; base += w) {
      const uint end = std::min(n, base + w);
      uint first = end;
      for (uint i = base; i < end && first == end; ++i)
        if (fibers_[i].state == State::simd) first = i;
      if (first == end) continue;
      const SimdCall& c0 = *fibers_[first].call;
      SimdCall* lanes[kSimdWidth] = {};
      for (uint i = base; i < end; ++i) {
        const Fiber& f = fibers_[i];
        if (f.state == State::waiting) {
          fatal("%sdivergent SIMD-group function: in threadgroup (%u,%u,%u), SIMD group %u, thread %u (index in "
                "group) waits at the threadgroup_barrier at %s:%u:%u while thread %u of its SIMD group is in %s at "
                "%s:%u:%u; the active threads of a SIMD group must reach each SIMD-group function together",
                kernel_prefix().c, ctx[0].threadgroup_position_in_grid.x, ctx[0].threadgroup_position_in_grid.y,
                ctx[0].threadgroup_position_in_grid.z, base / w, ctx[i].thread_index_in_threadgroup,
                f.site.file_name(), unsigned(f.site.line()), unsigned(f.site.column()),
                ctx[first].thread_index_in_threadgroup, c0.function, c0.site.file_name(), unsigned(c0.site.line()),
                unsigned(c0.site.column()));
        }
        if (f.state != State::simd) continue;  // done: inactive
        if (!same_site(f.call->site, c0.site) || f.call->resolve != c0.resolve) {
          fatal("%sdivergent SIMD-group function: in threadgroup (%u,%u,%u), SIMD group %u, thread %u (index in "
                "group) is in %s at %s:%u:%u while thread %u is in %s at %s:%u:%u; the active threads of a SIMD "
                "group must reach each SIMD-group function together",
                kernel_prefix().c, ctx[0].threadgroup_position_in_grid.x, ctx[0].threadgroup_position_in_grid.y,
                ctx[0].threadgroup_position_in_grid.z, base / w, ctx[first].thread_index_in_threadgroup,
                c0.function, c0.site.file_name(), unsigned(c0.site.line()), unsigned(c0.site.column()),
                ctx[i].thread_index_in_threadgroup, f.call->function, f.call->site.file_name(),
                unsigned(f.call->site.line()), unsigned(f.call->site.column()));
        }
        lanes[i - base] = f.call;
      }
      c0.resolve(lanes, w);
      for (uint i = base; i < end; ++i)
        if (fibers_[i].state == State::simd) fibers_[i].state = State::ready, fibers_[i].call = nullptr;
      any = true;
    }
    return any;
  }

  void ensure_fibers(uint n) {
    if (fibers_.size() >= n) return;
    const size_t old = fibers_.size();
    fibers_.resize(n);
    for (size_t i = old; i < n; ++i) {
      void* m = mmap(nullptr, stack_bytes_ + page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
      if (m == MAP_FAILED) fatal("mmap of a %zu-byte fiber stack failed", stack_bytes_);
      mprotect(m, page_, PROT_NONE);  // guard page: stack overflow faults instead of corrupting memory
      fibers_[i].map = m;
      fibers_[i].stack = static_cast<char*>(m) + page_;
    }
  }

  // First code of every fiber; the one being started is current_.
  static void entry() {
    GroupRunner* r = tls_runner;
#if defined(MSL_EMU_ASAN)
    __sanitizer_finish_switch_fiber(nullptr, &r->sched_bottom_, &r->sched_size_);
#endif
    Fiber& f = r->fibers_[r->current_];
    r->fn_(r->user_, *f.ctx);
    f.state = State::done;
    r->switch_to_scheduler(f, /*dying=*/true);
    __builtin_unreachable();
  }

  void resume(uint i) {
    Fiber& f = fibers_[i];
    current_ = i;
#if defined(MSL_EMU_ASAN)
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f.stack, stack_bytes_);
#endif
    fiber_switch(sched_context_, f.context);
#if defined(MSL_EMU_ASAN)
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  }

  void switch_to_scheduler(Fiber& f, bool dying) {
#if defined(MSL_EMU_ASAN)
    __sanitizer_start_switch_fiber(dying ? nullptr : &f.fake_stack, sched_bottom_, sched_size_);
#endif
    (void)dying;
    fiber_switch(f.context, sched_context_);
#if defined(MSL_EMU_ASAN)
    __sanitizer_finish_switch_fiber(f.fake_stack, &sched_bottom_, &sched_size_);
#endif
  }

  Options opt_;
  size_t page_ = 4096, stack_bytes_ = 0;
  std::vector<Fiber> fibers_;
  std::vector<uint> order_;
  FiberContext sched_context_;  // the worker thread's own context while a fiber runs
  [[maybe_unused]] const void* sched_bottom_ = nullptr;  // ASan builds only
  [[maybe_unused]] size_t sched_size_ = 0;
  KernelFn fn_ = nullptr;
  void* user_ = nullptr;
  uint n_ = 0, current_ = 0;
  bool direct_ = false;                     // inside run_group_direct
  const ThreadCtx* direct_ctx_ = nullptr;   // the thread running in direct mode (for the barrier error)
};

inline uint dim(uint3 v, int d) { return d == 0 ? v.x : d == 1 ? v.y : v.z; }

// Threads of group gp: tg, clipped at the grid's edge (non-uniform threadgroups).
inline uint3 group_extent(uint3 gp, uint3 tg, uint3 grid) {
  uint3 actual;
  for (int d = 0; d < 3; ++d) {
    const uint64_t base = uint64_t(dim(gp, d)) * dim(tg, d);
    actual[d] = uint(std::min<uint64_t>(dim(tg, d), dim(grid, d) - base));
  }
  return actual;
}

// The attribute values of thread i (x fastest) of group gp, whose actual size is `actual`.
inline void fill_ctx(ThreadCtx& t, uint i, uint3 gp, uint3 actual, uint3 tg, uint3 groups, uint3 grid) {
  constexpr uint simd = kSimdWidth;
  const uint x = i % actual.x, y = i / actual.x % actual.y, z = i / actual.x / actual.y;
  t.thread_position_in_threadgroup = uint3{x, y, z};
  t.threadgroup_position_in_grid = gp;
  t.thread_position_in_grid = gp * tg + uint3{x, y, z};
  t.threads_per_threadgroup = actual;
  t.dispatch_threads_per_threadgroup = tg;
  t.threadgroups_per_grid = groups;
  t.threads_per_grid = grid;
  t.thread_index_in_threadgroup = i;
  t.threads_per_simdgroup = simd;
  t.thread_execution_width = simd;
  t.simdgroup_index_in_threadgroup = i / simd;
  t.thread_index_in_simdgroup = i % simd;
  const uint n = actual.x * actual.y * actual.z, nd = tg.x * tg.y * tg.z;
  t.simdgroups_per_threadgroup = (n + simd - 1) / simd;
  t.dispatch_simdgroups_per_threadgroup = (nd + simd - 1) / simd;
  t.quadgroup_index_in_threadgroup = i / 4;
  t.thread_index_in_quadgroup = i % 4;
  t.quadgroups_per_threadgroup = (n + 3) / 4;
  t.dispatch_quadgroups_per_threadgroup = (nd + 3) / 4;
}

inline void check_group_size(uint3 tg) {
  if (tg.x == 0 || tg.y == 0 || tg.z == 0) fatal("threads_per_threadgroup has a zero dimension");
  if (uint64_t(tg.x) * tg.y * tg.z > kMaxThreadsPerGroup)
    fatal("threads_per_threadgroup (%u,%u,%u) exceeds %u threads", tg.x, tg.y, tg.z, kMaxThreadsPerGroup);
}

// Runs groups [0, groups) (3-D, x fastest); threads beyond `grid` (non-uniform edge) are not launched.
inline void run_grid(uint3 groups, uint3 tg, uint3 grid, KernelFn fn, void* user, const Options& opt) {
  const uint64_t total = uint64_t(groups.x) * groups.y * groups.z;
  if (total == 0) return;
  DispatchAtomicScope counting(opt.atomic_counts != nullptr);
  auto worker = [&](std::atomic<uint64_t>& next) {
    WorkerAtomicScope atomics(opt.atomic_counts);  // merges this worker's counts when its last group has run
    GroupRunner runner(opt);
    std::vector<ThreadCtx> ctx;
    for (uint64_t g; (g = next.fetch_add(1, std::memory_order_relaxed)) < total;) {
      const uint3 gp = {uint(g % groups.x), uint(g / groups.x % groups.y), uint(g / groups.x / groups.y)};
      const uint3 actual = group_extent(gp, tg, grid);
      const uint n = actual.x * actual.y * actual.z;
      auto make_ctx = [&](uint i, ThreadCtx& t) { fill_ctx(t, i, gp, actual, tg, groups, grid); };
      if (opt.fiber_free) {
        runner.run_group_direct(n, fn, user, g, make_ctx);
        continue;
      }
      ctx.resize(n);
      for (uint i = 0; i < n; ++i) make_ctx(i, ctx[i]);
      runner.run_group(ctx.data(), n, fn, user, g);
    }
  };
  std::atomic<uint64_t> next{0};
  const unsigned nw = unsigned(std::min<uint64_t>(opt.workers, total));
  if (nw <= 1) {
    worker(next);
    return;
  }
  std::vector<std::thread> pool;  // the calling thread is worker 0
  for (unsigned w = 1; w < nw; ++w) pool.emplace_back([&] { worker(next); });
  worker(next);
  for (auto& t : pool) t.join();
}

template <class F>
void trampoline(void* user, const ThreadCtx& t) {
  (*static_cast<F*>(user))(t);
}

inline uint3 to_uint3(uint3 v) { return v; }
inline uint3 to_uint3(uint v) { return uint3{v, 1, 1}; }
inline uint3 to_uint3(uint2 v) { return uint3{v.x, v.y, 1}; }

}  // namespace detail

// Metal's dispatchThreads: `grid` threads in total, groups of `threads_per_threadgroup`; the last group
// along each dimension is clipped (non-uniform threadgroups), its threads_per_threadgroup is the clipped size.
// An empty grid is an error, as in Metal's API validation: skip the dispatch on the host instead.
// `kernel_call(const ThreadCtx&)` is invoked once per thread.
template <class G, class T, class F>
void dispatch_threads(G grid_size, T threads_per_threadgroup, F&& kernel_call, const Options& opt = Options::from_env()) {
  const uint3 grid = detail::to_uint3(grid_size), tg = detail::to_uint3(threads_per_threadgroup);
  detail::check_group_size(tg);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0)
    fatal("dispatch_threads with an empty grid (%u,%u,%u): Metal rejects it, skip the dispatch", grid.x, grid.y, grid.z);
  const uint3 groups = (grid + tg - 1) / tg;
  using Fn = std::remove_reference_t<F>;
  detail::run_grid(groups, tg, grid, &detail::trampoline<Fn>, const_cast<void*>(static_cast<const void*>(&kernel_call)),
                   opt);
}

// Metal's dispatchThreadgroups: every group is full; threads_per_grid = groups * threads_per_threadgroup.
template <class G, class T, class F>
void dispatch_threadgroups(G threadgroups, T threads_per_threadgroup, F&& kernel_call,
                           const Options& opt = Options::from_env()) {
  const uint3 groups = detail::to_uint3(threadgroups), tg = detail::to_uint3(threads_per_threadgroup);
  detail::check_group_size(tg);
  if (groups.x == 0 || groups.y == 0 || groups.z == 0)
    fatal("dispatch_threadgroups with an empty grid (%u,%u,%u): Metal rejects it, skip the dispatch", groups.x,
          groups.y, groups.z);
  const uint3 grid = groups * tg;
  using Fn = std::remove_reference_t<F>;
  detail::run_grid(groups, tg, grid, &detail::trampoline<Fn>, const_cast<void*>(static_cast<const void*>(&kernel_call)),
                   opt);
}

}  // namespace msl_emu
