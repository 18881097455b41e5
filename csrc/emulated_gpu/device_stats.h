// The emulated GPU's diagnostics, exported from the device library for tf_metal_ops.emulated_gpu (ctypes) and the
// native tests: statistics as JSON, a synchronize, and a leak check.
#pragma once

#include <stdint.h>

#define TFMO_EMU_DEVICE_EXPORT extern "C" __attribute__((visibility("default")))

// Memory counters and one record per live stream, as one JSON object (valid until the next call on this thread).
TFMO_EMU_DEVICE_EXPORT const char* tfmo_emu_device_stats(void);

// Waits until every stream has run everything enqueued so far (tf_metal_ops.emulated_gpu.synchronize()).
TFMO_EMU_DEVICE_EXPORT void tfmo_emu_device_synchronize(void);

// Waits for every stream to drain, then returns how many allocations are still not freed (live or deferred),
// listing up to 20 of them on stderr.
TFMO_EMU_DEVICE_EXPORT int64_t tfmo_emu_device_check_leaks(void);
