// The Metal backend's device part: per MTLDevice, the kernel libraries (metallibs next to the op library, embedded
// .metal sources, inline kernel sources) and the compute pipelines, found by kernel function name and cached for the
// life of the process. Objective-C++ only. Conventions: docs/metal_host.md#libraries-and-pipelines.
//
// Library variants, best first: tf_metal_ops.metal3.metallib (Metal 3 GPUs), tf_metal_ops.metallib (MSL 2.4), then
// the embedded .metal source of the one file that defines the function (compiled at first use). A pipeline that
// fails in one variant is tried in the next. Fast math is off everywhere: the kernels rely on IEEE NaN/inf (NaN
// positions -> 0, NaN outputs for invalid rays, exp of large arguments).
#pragma once

#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu/gpu_host.h"

namespace tfmo::metal {

// True on GPUs of MTLGPUFamilyMetal3 (macOS 13+): MSL 3.0 and the Metal 3 metallib.
bool UseMetal3(id<MTLDevice> device);

// The directory of the op library (dladdr on our own code), or nil.
NSURL* LibraryDirectory();

// The metallibs to try on `device`, best first; none when TF_METAL_OPS_FORCE_SOURCE=1 (read once per process, to
// test the embedded sources). A device's list is fixed when the device is first used.
std::vector<NSURL*> MetallibCandidates(id<MTLDevice> device);

bool FileExists(NSURL* url);

// How many .metal files the op library embeds as source.
size_t NumEmbeddedSources();

// The pipeline of `pass` on `device`: its inline source, else the library variants in order. Called outside the
// stream's queue (compiling there would stall every GPU op of the process). nil with *error on failure; the errors
// are also kept for backend_info().
id<MTLComputePipelineState> GetPipeline(id<MTLDevice> device, const gpu::Pass& pass, std::string* error);

// What the device the op kernels last ran on loaded, for backend_info().
struct DeviceReport {
  uint64_t registry_id = 0;          // 0: no op kernel ran yet
  std::vector<std::string> origins;  // the libraries the cached pipelines came from, each once
  std::string errors;                // load / compile / pipeline errors
  double compile_seconds = 0;
};
// Waits while that device's libraries are being compiled.
DeviceReport LastDeviceReport();

}  // namespace tfmo::metal
