// Lets one header of per-element math compile as C++ (CPU kernels, g++/clang) and as Metal Shading
// Language (metal_kernels/*.metal, and the MSL emulation in csrc/msl_emu which defines __METAL_VERSION__).
//
// TFMO_FN is the package's one always-inline marker, in shared headers, Metal kernels and CPU kernels alike: a call
// would pass a thread's arrays through memory (on a GPU, the thread's stack), and the CPU kernels' ISA builds
// (common/isa_choice.h) compile an always-inline body once per target. A lambda, which cannot be declared
// `inline`, takes the same attribute as TFMO_FN_LAMBDA (`[&](int i) TFMO_FN_LAMBDA { ... }`).
//
// Rules for shared headers (csrc/shared/*.h):
//  - functions are `TFMO_FN` and take scalars, small structs, or pointers qualified with TFMO_THREAD
//    (thread-private arrays) or, for read-only lookups, `TFMO_DEVICE const` (device buffers); a kernel's parameter
//    struct by `TFMO_UNIFORM T&`, read-only (Metal: a reference into the constant buffer, read in place: a copy into
//    thread memory would put its arrays on every thread's stack; C++: a const reference); never threadgroup memory, never globals;
//  - integer types: uint32_t / int32_t / uint64_t are not MSL spellings, so use `uint` and `int`
//    (32-bit in both) and `ulong` only when needed (typedef'd below for C++);
//  - math through the tfmo_* wrappers below, so both sides call the float overloads; a fused multiply-add only
//    through tfmo_fma (never rely on the compiler contracting a*b + c: it does so differently per target).
//
// Name prefixes. The shared math of each op family, and every name the kernels and host code derive from it, carry
// the family's prefix (types CamelCase, functions lower_case; HG_ for the macros):
//   Hg  / hg_   hash-grid encoding (HashGridEncode and its gradients)        csrc/shared/hash_grid_math.h
//   Vr  / vr_   volume rendering, [rays, samples] layout (VolumeRender)      csrc/shared/render_math.h
//   Vrp         volume rendering of packed (ragged) rays (VolumeRenderPacked) csrc/shared/render_math.h
//   Dl  / dl_   distortion loss (DistortionLoss)                             csrc/shared/render_math.h
//   Dlp         distortion loss of packed rays (DistortionLossPacked)        csrc/shared/render_math.h
//   Rm  / rm_   occupancy-grid ray marching (RayMarch)                       csrc/shared/ray_march_math.h
//   Fm  / fm_   fully fused MLP (FusedMlp, FusedMlpGrad)                     csrc/shared/fused_mlp_math.h
// e.g. HgLevel, VrpParams, rm_jitter; CPU-only helpers live in the namespaces tfmo::<family>::cpu.
#pragma once

#if defined(__METAL_VERSION__)
#include <metal_stdlib>
// No contraction of a*b + c into an FMA (Metal compilers contract by default, fast math on or off): results match
// the CPU kernels, built with -ffp-contract=off. The metallibs get -ffp-contract=off too (tf_metal_ops/metal_sources.py).
#pragma clang fp contract(off)
#define TFMO_MATH metal
#define TFMO_FN inline __attribute__((always_inline))
#define TFMO_FN_LAMBDA __attribute__((always_inline))
#define TFMO_THREAD thread
#define TFMO_DEVICE device
#define TFMO_CONSTANT constant
#define TFMO_UNIFORM constant
TFMO_FN float tfmo_fma(float a, float b, float c) { return metal::fma(a, b, c); }  // one rounding (MSL: exact)
#else
#include <cmath>
#include <cstdint>
typedef uint32_t uint;
typedef uint64_t ulong;
typedef unsigned char uchar;
#define TFMO_MATH std
#define TFMO_FN inline __attribute__((always_inline))
#define TFMO_FN_LAMBDA __attribute__((always_inline))
#define TFMO_THREAD
#define TFMO_DEVICE
#define TFMO_CONSTANT constexpr
#define TFMO_UNIFORM const
// a*b + c with one rounding (IEEE fusedMultiplyAdd): an FMA instruction where the function's target has one
// (e.g. the CPU kernels' target("avx2,fma") variants), else glibc's correctly rounded fmaf. Either way the same
// bits, so code using it may be compiled for several ISAs and stay bitwise equal. Build with -ffp-contract=off
// so that the compiler never fuses a*b + c on its own (which it would do only where the target has FMA).
TFMO_FN float tfmo_fma(float a, float b, float c) { return std::fma(a, b, c); }
#endif

// TFMO_UNROLL before a loop: unroll it completely where its trip count is a compile-time constant (e.g. over
// HG_MAX_DIMS, with an early exit at the runtime dims). Nested loops over dims and corners exceed the compilers'
// own unrolling limits; a loop left rolled indexes the thread arrays it touches at run time, which puts them in
// memory (on a GPU, the thread's stack in device memory) instead of registers. No effect on results: the same
// operations in the same order.
#if defined(__METAL_VERSION__) || defined(__clang__)
#define TFMO_UNROLL _Pragma("clang loop unroll(full)")
#elif defined(__GNUC__)
#define TFMO_UNROLL _Pragma("GCC unroll 16")
#else
#define TFMO_UNROLL
#endif

// The float overloads of the math library on either side (TFMO_MATH is metal:: or std::).
TFMO_FN float tfmo_floor(float x) { return TFMO_MATH::floor(x); }
TFMO_FN float tfmo_ceil(float x) { return TFMO_MATH::ceil(x); }
TFMO_FN float tfmo_fabs(float x) { return TFMO_MATH::fabs(x); }
TFMO_FN float tfmo_exp(float x) { return TFMO_MATH::exp(x); }
TFMO_FN float tfmo_log(float x) { return TFMO_MATH::log(x); }
TFMO_FN float tfmo_exp2(float x) { return TFMO_MATH::exp2(x); }
TFMO_FN float tfmo_log2(float x) { return TFMO_MATH::log2(x); }
TFMO_FN float tfmo_sqrt(float x) { return TFMO_MATH::sqrt(x); }
TFMO_FN float tfmo_fmin(float a, float b) { return TFMO_MATH::fmin(a, b); }
TFMO_FN float tfmo_fmax(float a, float b) { return TFMO_MATH::fmax(a, b); }
TFMO_FN bool tfmo_isfinite(float x) { return TFMO_MATH::isfinite(x); }
TFMO_FN bool tfmo_isnan(float x) { return TFMO_MATH::isnan(x); }
