// The C interface between the op library and a compiled inline kernel (tf_metal_ops.metal_kernel). The Python side
// (tf_metal_ops/inline_kernels/build.py) generates one C++ unit per kernel source, compiles it through csrc/msl_emu
// into a shared library, and the op library dlopens it (csrc/common/inline_library.h) and looks its
// kernels up by name with tfmo_inline_kernel(name).
//
// Conventions:
//  - slots[n] is the host address of what is bound at [[buffer(n)]] (null if nothing), slot_bytes[n] its size;
//  - grid = threads (dispatchThreads: the last group along each dimension is clipped), group = threads per
//    threadgroup; every dimension >= 1 (the caller skips empty grids);
//  - threadgroups run in parallel through `parallel_for` (the caller's thread pool); the threads of one group run on
//    one worker, as fibers when the kernel reaches threadgroup_barrier or a SIMD-group function (in its body or a
//    function it calls: tf_metal_ops/msl_emu.py), else one after another in an inlined loop;
//  - a library built with bounds checks ("checked") reports the first out-of-bounds access through a kernel buffer
//    parameter as an error (the access itself reads zero / writes to a discarded scratch element);
//  - every function returns 0 on success, else non-zero with a NUL-terminated message in error[0..error_len).
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TFMO_INLINE_ABI_VERSION 1u
#define TFMO_INLINE_MAX_SLOTS 31u

typedef void (*TfmoRangeFn)(void* arg, int64_t begin, int64_t end);
// Calls fn(arg, b, e) on disjoint ranges covering [0, n), each at least `grain` long, in parallel; returns when done.
typedef void (*TfmoParallelFor)(int64_t n, int64_t grain, TfmoRangeFn fn, void* arg);

typedef struct TfmoInlineLaunch {
  void* slots[TFMO_INLINE_MAX_SLOTS];
  uint64_t slot_bytes[TFMO_INLINE_MAX_SLOTS];
  uint32_t grid[3];
  uint32_t group[3];
  TfmoParallelFor parallel_for;
} TfmoInlineLaunch;

typedef struct TfmoInlineKernel {
  uint32_t abi_version;  // TFMO_INLINE_ABI_VERSION
  const char* kernel;    // the kernel function's name
  int needs_fibers;      // the kernel reaches threadgroup_barrier or a SIMD-group function (groups run as fibers)
  int checked;           // built with bounds checks
  // Runs the kernel over the grid on the CPU.
  int (*run)(const TfmoInlineLaunch* launch, char* error, size_t error_len);
  // The emulated GPU's binding contract (csrc/emulated_gpu/kernel_launch.h) for `desc`, a const tfmo::emu::LaunchDesc*.
  int (*check)(const void* desc, char* error, size_t error_len);
} TfmoInlineKernel;

// Exported by every compiled inline kernel library as `tfmo_inline_kernel`: the kernel function `name` of the
// source, or null when the source defines no such kernel.
typedef const TfmoInlineKernel* (*TfmoInlineKernelEntry)(const char* name);

// The compile options of TfmoInlineCompiler, or'ed: bounds checks, and the MTLCompileOptions a Metal host passes
// (fast math: clang's -ffast-math, i.e. finite-math-only and reassociation; the MSL version, 0 meaning 3.0).
#define TFMO_INLINE_CHECKED 1
#define TFMO_INLINE_FAST_MATH 2
#define TFMO_INLINE_MSL_VERSION(major, minor) (((major) * 100 + (minor) * 10) << 8)  // 3.0 -> 300 << 8
#define TFMO_INLINE_MSL_VERSION_OF(options) (((options) >> 8) & 0xffff)               // 0 when not given

// Compiles `source` (complete MSL, every kernel in it) with `options` (TFMO_INLINE_*; the op library passes only
// TFMO_INLINE_CHECKED) into a library and writes its path to path[0..path_len); registered by the Python side
// (tf_metal_ops/inline_kernels/build.py) through tfmo_set_inline_compiler. Returns 0, or TFMO_INLINE_FAILED (the
// source does not compile: the same source fails the same way for the rest of the process, callers may remember
// it), or TFMO_INLINE_REFUSED (the source is not allowed yet: the user has not consented to running it; callers
// ask again on the next use, as consent may be given meanwhile).
#define TFMO_INLINE_FAILED 1
#define TFMO_INLINE_REFUSED 2
typedef int (*TfmoInlineCompiler)(const char* source, int options, char* path, size_t path_len, char* error,
                                  size_t error_len);

#ifdef __cplusplus
}
#endif
