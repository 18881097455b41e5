// tfmo_metal_info(): the Metal backend's state as JSON for tf_metal_ops.backend_info(), read through ctypes.
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <cstdio>
#include <string>
#include <utility>

#include "metal/completion.h"
#include "metal/device.h"
#include "metal/objc_util.h"

namespace {

using namespace tfmo::metal;

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

const char* JsonBool(bool b) { return b ? "true" : "false"; }

std::string DeviceJson(id<MTLDevice> device) {
  std::string families;
  const std::pair<MTLGPUFamily, const char*> known[] = {
      {MTLGPUFamilyApple7, "Apple7"}, {MTLGPUFamilyApple8, "Apple8"}, {MTLGPUFamilyMac2, "Mac2"},
      {MTLGPUFamilyCommon3, "Common3"},
  };
  for (const auto& [family, name] : known)
    if ([device supportsFamily:family]) families += std::string(families.empty() ? "" : ", ") + JsonString(name);
  if (UseMetal3(device)) families += std::string(families.empty() ? "" : ", ") + JsonString("Metal3");
  return "{\"name\": " + JsonString(ToString(device.name)) + ", \"registry_id\": " + std::to_string(device.registryID) +
         ", \"unified_memory\": " + JsonBool(device.hasUnifiedMemory) + ", \"low_power\": " +
         JsonBool(device.lowPower) + ", \"families\": [" + families + "], \"metal3\": " + JsonBool(UseMetal3(device)) +
         "}";
}

}  // namespace

// Every Metal device (MTLCopyAllDevices: no CoreGraphics needed, and dual-GPU Macs list both), which one the op
// kernels last ran on (the stream's device), where the kernels came from and the errors met. Cheap: loads no
// library. The pointer stays valid until the calling thread's next call.
extern "C" __attribute__((visibility("default"))) const char* tfmo_metal_info(void) {
  static thread_local std::string json;
  @autoreleasepool {
    NSArray<id<MTLDevice>>* devices = MTLCopyAllDevices();
    std::string list;
    for (id<MTLDevice> d in devices) list += std::string(list.empty() ? "" : ", ") + DeviceJson(d);
    const DeviceReport state = LastDeviceReport();  // waits if that device's library is being compiled right now
    std::string origins;
    for (const std::string& origin : state.origins)
      origins += std::string(origins.empty() ? "" : ", ") + JsonString(origin);
    id<MTLDevice> first = devices.count > 0 ? devices[0] : nil;
    std::string candidates;
    for (NSURL* url : MetallibCandidates(first)) {
      candidates += std::string(candidates.empty() ? "" : ", ") + "{\"path\": " + JsonString(ToString(url.path)) +
                    ", \"exists\": " + JsonBool(FileExists(url)) + "}";
    }
    const GpuErrorReport gpu = GpuErrors();
    NSURL* dir = LibraryDirectory();
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.3f", state.compile_seconds);
    json = std::string("{\"device_available\": ") + JsonBool(devices.count > 0) + ", \"devices\": [" + list + "]" +
           ", \"device_in_use\": " + (state.registry_id ? std::to_string(state.registry_id) : "null") +
           ", \"os\": " + JsonString(ToString([[NSProcessInfo processInfo] operatingSystemVersionString])) +
           ", \"sync\": " + JsonBool(SyncRequested()) + ", \"gpu_errors\": " + std::to_string(gpu.count) +
           ", \"last_gpu_error\": " + (gpu.last.empty() ? "null" : JsonString(gpu.last)) +
           ", \"library\": {\"origins\": [" + origins + "]" +
           ", \"compile_seconds\": " + secs +
           ", \"error\": " + (state.errors.empty() ? "null" : JsonString(state.errors)) +
           ", \"directory\": " + (dir ? JsonString(ToString(dir.path)) : "null") +
           ", \"metallib_candidates\": [" + candidates + "]" +
           ", \"embedded_sources\": " + std::to_string(NumEmbeddedSources()) + "}}";
  }
  return json.c_str();
}
