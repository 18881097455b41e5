// Test double of <malloc/malloc.h> (macOS 13 SDK): zone lookup of heap blocks.
// The double knows the blocks of Objective-C objects (every instance +[NSObject allocWithZone:] creates); for any
// other pointer malloc_zone_from_ptr returns NULL, as Apple's does for a pointer no zone owns.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
typedef struct _malloc_zone_t malloc_zone_t;
malloc_zone_t* malloc_zone_from_ptr(const void* ptr);
size_t malloc_size(const void* ptr);
#ifdef __cplusplus
}
#endif
