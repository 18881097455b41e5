// Test double of libdispatch's <dispatch/dispatch.h> (macOS 13 SDK): serial queues as Objective-C objects
// (OS_OBJECT_USE_OBJC, so ARC owns them), dispatch_sync and dispatch_async. Semantics asserted by the double:
// one queue runs its blocks one at a time in FIFO order; dispatch_sync runs its block on the calling thread after
// everything enqueued before it, and calling it on the queue the current thread is running crashes, as libdispatch
// does ("dispatch_sync called on queue already owned by current thread"); dispatch_assert_queue(_not) crash when the
// current block is not (is) running on the queue.
#pragma once
#import <objc/NSObject.h>

#define DISPATCH_EXPORT extern "C" __attribute__((visibility("default")))

@protocol OS_dispatch_object <NSObject>
@end
@protocol OS_dispatch_queue <OS_dispatch_object>
@end
@protocol OS_dispatch_queue_attr <OS_dispatch_object>
@end
typedef NSObject<OS_dispatch_queue>* dispatch_queue_t;
typedef NSObject<OS_dispatch_queue_attr>* dispatch_queue_attr_t;
typedef void (^dispatch_block_t)(void);

#define DISPATCH_QUEUE_SERIAL NULL

DISPATCH_EXPORT dispatch_queue_t dispatch_queue_create(const char* label, dispatch_queue_attr_t attr)
    __attribute__((ns_returns_retained));
DISPATCH_EXPORT void dispatch_sync(dispatch_queue_t queue, __attribute__((noescape)) dispatch_block_t block);
DISPATCH_EXPORT void dispatch_async(dispatch_queue_t queue, dispatch_block_t block);
// "Generates an assertion if the current block is not running on the specified dispatch queue."
DISPATCH_EXPORT void dispatch_assert_queue(dispatch_queue_t queue);
// "Generates an assertion if the current block is executing on the specified dispatch queue."
DISPATCH_EXPORT void dispatch_assert_queue_not(dispatch_queue_t queue);
