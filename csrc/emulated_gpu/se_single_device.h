// The StreamExecutor C API boilerplate of a PluggableDevice with exactly one device (ordinal 0). Plain C++ over TF's
// C header, shared by the emulated GPU (csrc/emulated_gpu/se_plugin.cc) and the tensorflow-metal double
// (dev/apple_doubles/src/tensorflow_metal_device.mm).
//
// A plugin defines, in namespace tfmo_se, `kDevice` and every Se* callback declared below (each has the exact type
// of its SP_StreamExecutor field; timers and unified memory are not offered), and its SE_InitPlugin calls
// FillRegistration(). Everything else of the platform (device count, the device and its functions, the destroy
// hooks) is here. One plugin per shared library: the callbacks have external linkage in tfmo_se.
#pragma once

#include <stdint.h>

#include <string>
#include <type_traits>

#include "tensorflow/c/experimental/stream_executor/stream_executor.h"
#include "tensorflow/c/tf_status.h"

namespace tfmo_se __attribute__((visibility("hidden"))) {

struct SingleDevice {
  const char* platform_name;   // SP_Platform::name
  const char* device_type;     // SP_Platform::type, e.g. "GPU"
  const char* hardware_name;   // SP_Device::hardware_name
  const char* message_prefix;  // starts every error message this header sets
  int64_t memory_bandwidth;    // bytes per second
  double gflops;
};
extern const SingleDevice kDevice;  // defined by the plugin

// The function type behind an SP_StreamExecutor field.
template <class FieldPointer>
using Callback = std::remove_pointer_t<FieldPointer>;

Callback<decltype(SP_StreamExecutor::allocate)> SeAllocate;
Callback<decltype(SP_StreamExecutor::deallocate)> SeDeallocate;
Callback<decltype(SP_StreamExecutor::host_memory_allocate)> SeHostAllocate;
Callback<decltype(SP_StreamExecutor::host_memory_deallocate)> SeHostDeallocate;
Callback<decltype(SP_StreamExecutor::get_allocator_stats)> SeAllocatorStats;
Callback<decltype(SP_StreamExecutor::device_memory_usage)> SeMemoryUsage;
Callback<decltype(SP_StreamExecutor::create_stream)> SeCreateStream;
Callback<decltype(SP_StreamExecutor::destroy_stream)> SeDestroyStream;
Callback<decltype(SP_StreamExecutor::create_stream_dependency)> SeCreateStreamDependency;
Callback<decltype(SP_StreamExecutor::get_stream_status)> SeGetStreamStatus;
Callback<decltype(SP_StreamExecutor::create_event)> SeCreateEvent;
Callback<decltype(SP_StreamExecutor::destroy_event)> SeDestroyEvent;
Callback<decltype(SP_StreamExecutor::get_event_status)> SeEventStatus;
Callback<decltype(SP_StreamExecutor::record_event)> SeRecordEvent;
Callback<decltype(SP_StreamExecutor::wait_for_event)> SeWaitForEvent;
Callback<decltype(SP_StreamExecutor::memcpy_dtoh)> SeMemcpyDtoH;
Callback<decltype(SP_StreamExecutor::memcpy_htod)> SeMemcpyHtoD;
Callback<decltype(SP_StreamExecutor::memcpy_dtod)> SeMemcpyDtoD;
Callback<decltype(SP_StreamExecutor::sync_memcpy_dtoh)> SeSyncMemcpyDtoH;
Callback<decltype(SP_StreamExecutor::sync_memcpy_htod)> SeSyncMemcpyHtoD;
Callback<decltype(SP_StreamExecutor::sync_memcpy_dtod)> SeSyncMemcpyDtoD;
Callback<decltype(SP_StreamExecutor::block_host_for_event)> SeBlockHostForEvent;
Callback<decltype(SP_StreamExecutor::block_host_until_done)> SeBlockHostUntilDone;
Callback<decltype(SP_StreamExecutor::synchronize_all_activity)> SeSynchronizeAllActivity;
Callback<decltype(SP_StreamExecutor::mem_zero)> SeMemZero;
Callback<decltype(SP_StreamExecutor::memset)> SeMemset;
Callback<decltype(SP_StreamExecutor::memset32)> SeMemset32;
Callback<decltype(SP_StreamExecutor::host_callback)> SeHostCallback;

namespace single_device {

inline int32_t NumaNode(const SP_Device*) { return -1; }
inline int64_t Bandwidth(const SP_Device*) { return kDevice.memory_bandwidth; }
inline double Gflops(const SP_Device*) { return kDevice.gflops; }

inline void GetDeviceCount(const SP_Platform*, int* count, TF_Status*) { *count = 1; }

inline void CreateDevice(const SP_Platform*, SE_CreateDeviceParams* params, TF_Status* status) {
  if (params->ordinal != 0) {
    if (status != nullptr)
      TF_SetStatus(status, TF_INVALID_ARGUMENT, (std::string(kDevice.message_prefix) + "only device 0 exists").c_str());
    return;
  }
  SP_Device* d = params->device;
  d->struct_size = SP_DEVICE_STRUCT_SIZE;
  d->ext = nullptr;
  d->ordinal = 0;
  d->device_handle = nullptr;
  d->hardware_name = kDevice.hardware_name;
  d->device_vendor = "tf_metal_ops";
  d->pci_bus_id = "0000:00:00.0";
}

inline void DestroyDevice(const SP_Platform*, SP_Device*) {}

inline void CreateDeviceFns(const SP_Platform*, SE_CreateDeviceFnsParams* params, TF_Status*) {
  *params->device_fns = SP_DeviceFns{SP_DEVICE_FNS_STRUCT_SIZE, /*ext=*/nullptr, NumaNode, Bandwidth, Gflops};
}

inline void DestroyDeviceFns(const SP_Platform*, SP_DeviceFns*) {}

inline void CreateStreamExecutor(const SP_Platform*, SE_CreateStreamExecutorParams* params, TF_Status*) {
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

inline void DestroyStreamExecutor(const SP_Platform*, SP_StreamExecutor*) {}
inline void DestroyPlatform(SP_Platform*) {}
inline void DestroyPlatformFns(SP_PlatformFns*) {}

}  // namespace single_device

// Fills what SE_InitPlugin returns: the platform (no BFC allocator, so kernels get exactly what allocate()
// returned), its functions and the destroy hooks.
inline void FillRegistration(SE_PlatformRegistrationParams* params) {
  params->struct_size = SE_PLATFORM_REGISTRATION_PARAMS_STRUCT_SIZE;
  params->major_version = SE_MAJOR;
  params->minor_version = SE_MINOR;
  params->patch_version = SE_PATCH;
  SP_Platform* p = params->platform;
  p->struct_size = SP_PLATFORM_STRUCT_SIZE;
  p->ext = nullptr;
  p->name = kDevice.platform_name;
  p->type = kDevice.device_type;
  p->supports_unified_memory = 0;
  p->use_bfc_allocator = 0;
  p->force_memory_growth = 0;
  SP_PlatformFns* f = params->platform_fns;
  f->struct_size = SP_PLATFORM_FNS_STRUCT_SIZE;
  f->ext = nullptr;
  f->get_device_count = single_device::GetDeviceCount;
  f->create_device = single_device::CreateDevice;
  f->destroy_device = single_device::DestroyDevice;
  f->create_device_fns = single_device::CreateDeviceFns;
  f->destroy_device_fns = single_device::DestroyDeviceFns;
  f->create_stream_executor = single_device::CreateStreamExecutor;
  f->destroy_stream_executor = single_device::DestroyStreamExecutor;
  f->create_timer_fns = nullptr;
  f->destroy_timer_fns = nullptr;
  params->destroy_platform = single_device::DestroyPlatform;
  params->destroy_platform_fns = single_device::DestroyPlatformFns;
}

}  // namespace tfmo_se
