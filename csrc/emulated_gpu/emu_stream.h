// The emulated GPU device's stream protocol: what TF_GetStream returns on the Metal-emulating PluggableDevice
// (csrc/emulated_gpu/se_plugin.cc; the device side is emu_stream.cc over streams.h), playing the role of
// tensorflow-metal's stream object for the direct backend (csrc/emulated_gpu/direct_backend.cc). A C ABI, so that any op
// library (this package's, or a user's built with the op kit) can drive the device without linking against it.
//
// Mapping to tensorflow-metal's protocol (csrc/metal/stream.h):
//   -queue + dispatch_sync(queue, ^{...})  ->  api->queue_sync(stream, fn, arg)
//   -currentCommandBuffer                  ->  api->current_command_buffer(stream)
//   [MTLComputeCommandEncoder dispatch...] ->  api->encode(command_buffer, work)
//   -commit / -commitAndWait               ->  api->commit(stream) / api->commit_and_wait(stream, ...)
//   the MTLBuffer behind TF_TensorData     ->  api->map(stream, device_address, bytes, ...) (only inside work)
//
// Invariants:
//  - The header below is the first member of the plugin's SP_Stream_st; a backend checks `magic` and
//    `api->struct_size` before anything else.
//  - Each stream is a serial queue: work of committed command buffers runs in commit order, one item at a time,
//    on the stream's own thread, after everything enqueued on that stream before (copies, events, callbacks).
//  - queue_sync must not be called from inside work or another queue_sync of the same stream (it would deadlock,
//    as dispatch_sync on a serial queue does); encode/current_command_buffer/commit are only called inside
//    queue_sync, like Metal encoding under tensorflow-metal's queue.
//  - Device memory lives at addresses that fault when the host dereferences them. `map` translates a device
//    address range to the host memory backing it; it fails (returns null, message in `error`) for a range that
//    is not inside one live allocation. Mapped pointers are valid until the work item returns.
//  - Work reports failure by returning non-zero with a message: the command buffer's remaining work is skipped,
//    commit_and_wait returns the message, and the stream's status (TF's get_stream_status) becomes an error.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TFMO_EMU_STREAM_MAGIC 0x31554d454f4d4654ull /* "TFMOEMU1" little-endian */
#define TFMO_EMU_ERROR_BYTES 1024

typedef struct TfmoEmuStream TfmoEmuStream;                /* opaque: the plugin's stream */
typedef struct TfmoEmuCommandBuffer TfmoEmuCommandBuffer;  /* opaque: the plugin's command buffer */

/* One item of work in a command buffer. run() executes on the stream's thread; release() is called exactly
 * once afterwards (also when run() was skipped because an earlier item failed, or the buffer was discarded). */
typedef struct TfmoEmuWork {
  int (*run)(void* arg, TfmoEmuStream* stream, char* error, size_t error_len); /* 0 = ok */
  void (*release)(void* arg);                                                    /* may be null */
  void* arg;
} TfmoEmuWork;

typedef struct TfmoEmuStreamApi {
  size_t struct_size; /* sizeof(TfmoEmuStreamApi) of the plugin */
  void (*queue_sync)(TfmoEmuStream* stream, void (*fn)(void* arg), void* arg);
  TfmoEmuCommandBuffer* (*current_command_buffer)(TfmoEmuStream* stream);
  void (*encode)(TfmoEmuCommandBuffer* command_buffer, TfmoEmuWork work);
  void (*commit)(TfmoEmuStream* stream);
  /* Commits and waits until the buffer has run; returns 0, or non-zero with the failing work's message. */
  int (*commit_and_wait)(TfmoEmuStream* stream, char* error, size_t error_len);
  void* (*map)(TfmoEmuStream* stream, const void* device_address, size_t bytes, char* error, size_t error_len);
  const char* (*device_name)(TfmoEmuStream* stream); /* e.g. "Emulated Metal GPU (msl_emu on the CPU)" */
} TfmoEmuStreamApi;

typedef struct TfmoEmuStreamHeader {
  uint64_t magic; /* TFMO_EMU_STREAM_MAGIC */
  const TfmoEmuStreamApi* api;
  TfmoEmuStream* self; /* the handle to pass to api functions */
} TfmoEmuStreamHeader;

#ifdef __cplusplus
}
#endif
