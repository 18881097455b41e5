// Test double of libdispatch's serial queues for Linux (declared by dev/apple_doubles/include/dispatch/dispatch.h).
// Each queue has one worker thread that runs its asynchronous blocks in FIFO order. dispatch_sync enqueues a
// barrier and, once the worker reaches it, runs the block on the calling thread while the worker waits, as
// libdispatch does; calling it from a thread that is running the same queue is the deadlock libdispatch crashes on.
// A block "runs on" a queue while the worker runs it or while dispatch_sync runs it on the caller: what
// dispatch_assert_queue and dispatch_assert_queue_not check.
#import <Foundation/Foundation.h>

#include <stdio.h>
#include <stdlib.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

struct QueueState {
  std::string label;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<dispatch_block_t> blocks;
  bool stopping = false;
};

// The queues the current thread is running (an async block on the worker, or a sync block on the caller).
thread_local std::vector<const QueueState*> t_running;

bool Running(const QueueState* q) {
  for (const QueueState* r : t_running)
    if (r == q) return true;
  return false;
}

struct RunningScope {
  explicit RunningScope(const QueueState* q) { t_running.push_back(q); }
  ~RunningScope() { t_running.pop_back(); }
};

void Worker(std::shared_ptr<QueueState> q) {
  for (;;) {
    dispatch_block_t block;
    {
      std::unique_lock<std::mutex> lock(q->mu);
      q->cv.wait(lock, [&] { return q->stopping || !q->blocks.empty(); });
      if (q->blocks.empty()) return;  // stopping, and drained
      block = q->blocks.front();
      q->blocks.pop_front();
    }
    RunningScope scope(q.get());
    @autoreleasepool {
      block();
    }
  }
}

}  // namespace

@interface TFMODispatchQueue : NSObject <OS_dispatch_queue> {
 @public
  std::shared_ptr<QueueState> _state;
}
@end

@implementation TFMODispatchQueue
- (void)dealloc {
  std::lock_guard<std::mutex> lock(_state->mu);
  _state->stopping = true;  // the worker drains what is queued, then exits
  _state->cv.notify_all();
}
@end

namespace {
QueueState* StateOf(dispatch_queue_t queue, const char* function) {
  if (queue == nil) {
    fprintf(stderr, "BUG IN CLIENT OF LIBDISPATCH: %s called with a NULL queue\n", function);
    abort();
  }
  return static_cast<TFMODispatchQueue*>(queue)->_state.get();
}
}  // namespace

DISPATCH_EXPORT dispatch_queue_t dispatch_queue_create(const char* label, dispatch_queue_attr_t attr) {
  TFMODispatchQueue* q = [[TFMODispatchQueue alloc] init];
  q->_state = std::make_shared<QueueState>();
  q->_state->label = label ? label : "";
  std::thread(Worker, q->_state).detach();
  return q;
}

DISPATCH_EXPORT void dispatch_async(dispatch_queue_t queue, dispatch_block_t block) {
  QueueState* q = StateOf(queue, "dispatch_async");
  std::lock_guard<std::mutex> lock(q->mu);
  q->blocks.push_back([block copy]);
  q->cv.notify_all();
}

DISPATCH_EXPORT void dispatch_sync(dispatch_queue_t queue, __attribute__((noescape)) dispatch_block_t block) {
  QueueState* q = StateOf(queue, "dispatch_sync");
  if (Running(q)) {
    fprintf(stderr, "BUG IN CLIENT OF LIBDISPATCH: dispatch_sync called on queue already owned by current thread "
                    "(queue \"%s\")\n", q->label.c_str());
    fflush(stderr);
    abort();
  }
  // The barrier: when the worker reaches it, it hands the queue to this thread and waits until the block is done.
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool reached = false, done = false;
  };
  auto gate = std::make_shared<Gate>();
  {
    std::lock_guard<std::mutex> lock(q->mu);
    q->blocks.push_back(^{
      std::unique_lock<std::mutex> g(gate->mu);
      gate->reached = true;
      gate->cv.notify_all();
      gate->cv.wait(g, [&] { return gate->done; });
    });
    q->cv.notify_all();
  }
  {
    std::unique_lock<std::mutex> g(gate->mu);
    gate->cv.wait(g, [&] { return gate->reached; });
  }
  {
    RunningScope scope(q);
    block();
  }
  std::lock_guard<std::mutex> g(gate->mu);
  gate->done = true;
  gate->cv.notify_all();
}

DISPATCH_EXPORT void dispatch_assert_queue(dispatch_queue_t queue) {
  QueueState* q = StateOf(queue, "dispatch_assert_queue");
  if (!Running(q)) {
    fprintf(stderr, "BUG IN CLIENT OF LIBDISPATCH: Assertion failed: Block was expected to execute on queue [%s]\n",
            q->label.c_str());
    fflush(stderr);
    abort();
  }
}

DISPATCH_EXPORT void dispatch_assert_queue_not(dispatch_queue_t queue) {
  QueueState* q = StateOf(queue, "dispatch_assert_queue_not");
  if (Running(q)) {
    fprintf(stderr, "BUG IN CLIENT OF LIBDISPATCH: Assertion failed: Block was not expected to execute on queue [%s]\n",
            q->label.c_str());
    fflush(stderr);
    abort();
  }
}
