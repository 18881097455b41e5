// Build facts for tf_metal_ops.backend_info(), read through ctypes.
#include "common/build_info.h"

#ifndef TFMO_VERSION
#define TFMO_VERSION "unknown"
#endif
#ifndef TFMO_BUILT_WITH_TF
#define TFMO_BUILT_WITH_TF "unknown"
#endif
#ifdef TFMO_WITH_METAL
#define TFMO_METAL_JSON "true"
#else
#define TFMO_METAL_JSON "false"
#endif

extern "C" const char* tfmo_build_info(void) {
  return "{\"version\": \"" TFMO_VERSION "\", \"built_with_tensorflow\": \"" TFMO_BUILT_WITH_TF
         "\", \"metal\": " TFMO_METAL_JSON ", \"compiler\": \"" __VERSION__ "\"}";
}
