// The .metal sources embedded in the op library, for run-time compilation when no metallib ships with it.
// Defined by a file generated at build time (tf_metal_ops/metal_sources.py: write_embedded_source), one entry per
// metal_kernels/*.metal with its quoted #includes inlined; compiled as one MTLLibrary each.
#pragma once

namespace tfmo::metal {

struct EmbeddedSource {
  const char* name;    // file name, e.g. "zero_out.metal"
  const char* source;  // complete MSL translation unit
};

// Terminated by {nullptr, nullptr}.
extern const EmbeddedSource kEmbeddedMetalSources[];

}  // namespace tfmo::metal
