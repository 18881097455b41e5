// How the emulated GPU device names itself, and its messages: every line it prints (LogError) and every error it
// returns (SetError) starts with kPrefix.
#pragma once

#include <stdint.h>
#include <stdio.h>

#include <string>

#include "tensorflow/c/tf_status.h"

namespace tfmo_emu __attribute__((visibility("hidden"))) {

constexpr const char* kPrefix = "tf_metal_ops emulated GPU: ";
constexpr const char* kPlatformName = "TFMO_EMULATED_METAL";
constexpr const char* kDeviceType = "GPU";
constexpr const char* kDeviceName = "Emulated Metal GPU (tf_metal_ops PluggableDevice, runs on the CPU)";

inline std::string Hex(uint64_t v) {
  char b[32];
  snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

// One line on stderr, written and flushed at once.
inline void LogError(const std::string& msg) {
  std::string line = std::string(kPrefix) + msg + "\n";
  fputs(line.c_str(), stderr);
  fflush(stderr);
}

inline void SetError(TF_Status* status, TF_Code code, const std::string& msg) {
  if (status != nullptr) TF_SetStatus(status, code, (std::string(kPrefix) + msg).c_str());
}

}  // namespace tfmo_emu
