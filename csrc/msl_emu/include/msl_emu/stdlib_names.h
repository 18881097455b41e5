// The names of MSL's types and standard-library functions that every <metal_stdlib> of this project spells alike,
// as X-macro lists: msl_emu's (msl_emu/types.h, msl_emu/stdlib_generic.h; CPU and CUDA targets) and the strict
// check's declarations (csrc/msl_check/include, which includes this file by its relative path).
//
// Conventions:
//  - preprocessor only: no declaration, no #include, valid in C++14 (the check compiles as MSL's C++14 with
//    -nostdinc) and C++20 (msl_emu). A list LIST(X) expands X(name) per entry;
//  - the float function lists are grouped by how msl_emu computes them (a clang builtin NAME##f, or the target's
//    scalar primitive ::msl_emu::target::NAME); the check declares each of them, and more (the whole MSL list);
//  - MSL_MEM_FLAGS(MSL_ENUMERATOR) spells the enumerators of metal::mem_flags;
//  - MSL_VECTOR_ELEMENTS(X, BOOL) gives X(element type, type-name prefix) for the vector types; BOOL is the element
//    type of boolN (msl_emu: int, as clang's vector comparisons give; the check: bool, MSL's layout).
#pragma once

#define MSL_FLOAT1_BUILTIN(X) X(floor) X(ceil) X(trunc) X(round) X(rint) X(fabs) X(sqrt)
#define MSL_FLOAT1_TARGET(X) \
  X(exp) X(exp2) X(exp10) X(log) X(log2) X(log10) X(sin) X(cos) X(tan) X(asin) X(acos) X(atan) X(sinh) X(cosh) X(tanh)
#define MSL_FLOAT2_BUILTIN(X) X(fmin) X(fmax) X(copysign)
#define MSL_FLOAT2_TARGET(X) X(fmod) X(pow) X(atan2)
#define MSL_CLASSIFY(X) X(isnan) X(isinf) X(isfinite) X(signbit)
// metal::mem_flags: X(enumerator, value).
#define MSL_MEM_FLAGS(X) \
  X(mem_none, 0) X(mem_device, 1) X(mem_threadgroup, 2) X(mem_texture, 4) X(mem_threadgroup_imageblock, 8) X(mem_object_data, 16)
#define MSL_ENUMERATOR(name, value) name = value,

#define MSL_VECTOR_ELEMENTS(X, BOOL)                                                                        \
  X(BOOL, bool) X(char, char) X(uchar, uchar) X(short, short) X(ushort, ushort) X(int, int) X(uint, uint)    \
  X(long, long) X(ulong, ulong) X(half, half) X(float, float)
#define MSL_VECTOR_TYPEDEFS(T, P)                      \
  typedef T P##2 __attribute__((ext_vector_type(2))); \
  typedef T P##3 __attribute__((ext_vector_type(3))); \
  typedef T P##4 __attribute__((ext_vector_type(4)));
