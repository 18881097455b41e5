// Compiled inline kernels (tf_metal_ops.metal_kernel) for the CPU and the emulated GPU: one shared library per
// (source, bounds checks) holding every kernel of the source, compiled on first use by the compiler the Python side registers
// (tfmo_set_inline_compiler; `import tf_metal_ops` does it), loaded once and kept for the process.
//
// Invariants:
//  - Get() never holds a lock other than its entry's while compiling, so other kernels stay usable meanwhile; two
//    threads asking for the same entry compile it once;
//  - a failed compile is remembered for the process (the same source fails the same way) and reported on every call;
//    a refused one (TFMO_INLINE_REFUSED: no consent to run the source yet) is not, so the next use asks again;
//  - libraries are never unloaded: kernels may run on other threads until the process ends.
#pragma once

#include <string>

#include "common/inline_kernel_abi.h"

namespace tfmo::inline_kernels {

// The library of `kernel` in `source`, or null after writing *error.
const TfmoInlineKernel* Get(const std::string& source, const std::string& kernel, bool checked, std::string* error);

// Runs k over launch->grid with the package's thread pool (fills launch->parallel_for). False after writing *error.
bool Run(const TfmoInlineKernel* k, TfmoInlineLaunch* launch, std::string* error);

}  // namespace tfmo::inline_kernels

extern "C" {
__attribute__((visibility("default"))) void tfmo_set_inline_compiler(TfmoInlineCompiler compiler);
// Number of inline kernel libraries loaded in this process (diagnostics, tests).
__attribute__((visibility("default"))) int tfmo_inline_libraries_loaded(void);
}
