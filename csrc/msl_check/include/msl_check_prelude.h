// msl_check's prelude: MSL's keywords and built-in types, force-included (`-include`) before every source that
// tf_metal_ops.msl_check compiles, so they exist without any #include, as in MSL.
//
// Conventions (read by tf_metal_ops/msl_check: rewrite.py, type_strings.py, rules.py; keep both in step):
//  - Address spaces (MSL spec "Address Spaces") are distinct clang address spaces: device = 1, constant = 2, threadgroup = 3,
//    threadgroup_imageblock = 4. Converting a pointer or reference between them is a compile error, as in MSL.
//    `constant` also makes the object const (constant memory is read-only, MSL spec "constant Address Space").
//  - `thread` is clang's default address space (local variables live in it, MSL spec "thread Address Space"). It carries clang's
//    noderef type attribute, which is type sugar (no conversion changes; its dereference warnings are off, -w) but
//    survives in the AST's type strings, so msl_check (type_strings.py) can tell `thread float*` (explicit) from
//    `float*` (no address space: "pointer type must have explicit address space qualifier" in MSL).
//  - `kernel`/`vertex`/`fragment` are annotate attributes; msl_check (rules.py) identifies which by the spelling
//    location of the attribute, i.e. by the line of the macro below.
//  - msl_check (rewrite.py) rewrites the checked source (same length, so lines and columns hold) before compiling it:
//    `[[kernel]]` -> `kernel`; `[[host_name(n)]]` -> `host_name(n)`; MSL attributes `[[buffer(0)]]`, `[[thread_position_in_grid]]`, ... are blanked and
//    read from the text instead; `threadgroup`/`constant` starting a variable definition (no pointer or reference)
//    become _MSL_TG_VAR / _MSL_CV_ / _MSL_FC_, because C++ forbids automatic variables in an address space.
//  - __METAL_VERSION__ comes from the command line (240 = MSL 2.4, 300 = MSL 3.0).
#pragma once
#define __MSL_CHECK__ 1

// The type and function names shared with msl_emu's <metal_stdlib> (preprocessor lists only; see there).
#include "../../msl_emu/include/msl_emu/stdlib_names.h"

// The empty __attribute__(()) first keeps clang from printing types with the macro's name (it does so for a
// macro that expands to exactly one attribute, including user macros such as `#define MY_DEVICE device`).
#define device __attribute__(()) __attribute__((address_space(1)))
#define constant const __attribute__((address_space(2)))
#define threadgroup __attribute__(()) __attribute__((address_space(3)))
#define threadgroup_imageblock __attribute__(()) __attribute__((address_space(4)))
#define thread __attribute__(()) __attribute__((noderef))
#define ray_data
#define object_data

#define kernel __attribute__((annotate("msl_kernel")))
#define vertex __attribute__((annotate("msl_vertex")))
#define fragment __attribute__((annotate("msl_fragment")))
// `[[host_name("k_float")]]` (the rewrite leaves `host_name("k_float")`): the entry point's name, on a kernel or on an
// explicit instantiation of a kernel template (where C++ allows a GNU attribute, and no [[...]] list).
// msl_check (signatures.py) reads the name from this annotation's argument, found by the line of the macro.
#define host_name(name) __attribute__((annotate("msl_host_name", name)))

// Variable definitions in threadgroup / constant memory (see above): static storage in that address space.
#define _MSL_TG_VAR static __attribute__((address_space(3)))
#define _MSL_CV_ static const __attribute__((address_space(2)))
// `constant T name [[function_constant(i)]];` (MSL spec "Function Constants"): no initializer, the value comes at pipeline creation.
#define _MSL_FC_ extern const __attribute__((address_space(2)))
#define is_function_constant_defined(name) true

// ---- scalar types (MSL spec "Scalar Data Types"): the 32-bit int/uint, 64-bit long/ulong of MSL, half = IEEE binary16.
typedef _Float16 half;
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef __SIZE_TYPE__ size_t;
typedef __PTRDIFF_TYPE__ ptrdiff_t;
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long int64_t;
typedef unsigned long uint64_t;

// ---- vector types (MSL spec "Vector Data Types"): ext_vector_type gives swizzles and MSL's sizes (a 3-vector is the size of a
// 4-vector). Implicit conversions between vectors of different element types do not compile (clang errors;
// msl_check reports them as implicit-vector-conversion), as in MSL.
MSL_VECTOR_ELEMENTS(MSL_VECTOR_TYPEDEFS, bool)

namespace __msl {
template <class T> struct identity { typedef T type; };
template <bool B, class T = void> struct enable_if {};
template <class T> struct enable_if<true, T> { typedef T type; };
template <class T> struct remove_cv { typedef T type; };
template <class T> struct remove_cv<const T> { typedef T type; };
template <class T> struct remove_cv<volatile T> { typedef T type; };
template <class T> struct remove_cv<const volatile T> { typedef T type; };
template <class T, class U> struct is_same { static constexpr bool value = false; };
template <class T> struct is_same<T, T> { static constexpr bool value = true; };

// Element type and component count: scalars count 1, vectors their length; `value` false for other types.
template <class T> struct vec_info { static constexpr bool value = false; static constexpr int count = 0; };
#define _MSL_SCALAR(T) template <> struct vec_info<T> { static constexpr bool value = true; static constexpr int count = 1; typedef T elem; };
#define _MSL_VEC(T, N) template <> struct vec_info<T __attribute__((ext_vector_type(N)))> { static constexpr bool value = true; static constexpr int count = N; typedef T elem; };
#define _MSL_ALL(T) _MSL_SCALAR(T) _MSL_VEC(T, 2) _MSL_VEC(T, 3) _MSL_VEC(T, 4)
_MSL_ALL(bool) _MSL_ALL(char) _MSL_ALL(signed char) _MSL_ALL(uchar) _MSL_ALL(short) _MSL_ALL(ushort) _MSL_ALL(int)
_MSL_ALL(uint) _MSL_ALL(long) _MSL_ALL(ulong) _MSL_ALL(half) _MSL_ALL(float)
_MSL_SCALAR(double)  // a floating literal such as 0.5 (MSL treats it as float; see msl_check's rule "double")
#undef _MSL_ALL
#undef _MSL_VEC
#undef _MSL_SCALAR

template <class... A> struct count_sum { static constexpr int value = 0; };
template <class A, class... R> struct count_sum<A, R...> {
  static constexpr int value = vec_info<typename remove_cv<A>::type>::count + count_sum<R...>::value;
};
template <class... A> struct all_components { static constexpr bool value = true; };
template <class A, class... R> struct all_components<A, R...> {
  static constexpr bool value = vec_info<typename remove_cv<A>::type>::value && all_components<R...>::value;
};
template <class T> T any_value();

// MSL vector constructors (MSL spec "Vector Data Types"): V(scalar) splats; otherwise the components of the arguments, in
// order, must add up to exactly V's length; a single vector of the same length converts element-wise.
template <class V, class... A>
V make_vector(A... a) {
  static_assert(all_components<A...>::value, "msl_check[compile]: a vector constructor takes scalars and vectors");
  static_assert(sizeof...(A) == 1 ? (count_sum<A...>::value == 1 || count_sum<A...>::value == vec_info<V>::count)
                                  : count_sum<A...>::value == vec_info<V>::count,
                "msl_check[compile]: the vector constructor's arguments do not have the vector's number of components");
  return any_value<V>();
}
}  // namespace __msl

// float4(...) etc.: function-like macros, so the type names stay usable where no '(' follows.
#define bool2(...) ::__msl::make_vector<::bool2>(__VA_ARGS__)
#define bool3(...) ::__msl::make_vector<::bool3>(__VA_ARGS__)
#define bool4(...) ::__msl::make_vector<::bool4>(__VA_ARGS__)
#define char2(...) ::__msl::make_vector<::char2>(__VA_ARGS__)
#define char3(...) ::__msl::make_vector<::char3>(__VA_ARGS__)
#define char4(...) ::__msl::make_vector<::char4>(__VA_ARGS__)
#define uchar2(...) ::__msl::make_vector<::uchar2>(__VA_ARGS__)
#define uchar3(...) ::__msl::make_vector<::uchar3>(__VA_ARGS__)
#define uchar4(...) ::__msl::make_vector<::uchar4>(__VA_ARGS__)
#define short2(...) ::__msl::make_vector<::short2>(__VA_ARGS__)
#define short3(...) ::__msl::make_vector<::short3>(__VA_ARGS__)
#define short4(...) ::__msl::make_vector<::short4>(__VA_ARGS__)
#define ushort2(...) ::__msl::make_vector<::ushort2>(__VA_ARGS__)
#define ushort3(...) ::__msl::make_vector<::ushort3>(__VA_ARGS__)
#define ushort4(...) ::__msl::make_vector<::ushort4>(__VA_ARGS__)
#define int2(...) ::__msl::make_vector<::int2>(__VA_ARGS__)
#define int3(...) ::__msl::make_vector<::int3>(__VA_ARGS__)
#define int4(...) ::__msl::make_vector<::int4>(__VA_ARGS__)
#define uint2(...) ::__msl::make_vector<::uint2>(__VA_ARGS__)
#define uint3(...) ::__msl::make_vector<::uint3>(__VA_ARGS__)
#define uint4(...) ::__msl::make_vector<::uint4>(__VA_ARGS__)
#define long2(...) ::__msl::make_vector<::long2>(__VA_ARGS__)
#define long3(...) ::__msl::make_vector<::long3>(__VA_ARGS__)
#define long4(...) ::__msl::make_vector<::long4>(__VA_ARGS__)
#define ulong2(...) ::__msl::make_vector<::ulong2>(__VA_ARGS__)
#define ulong3(...) ::__msl::make_vector<::ulong3>(__VA_ARGS__)
#define ulong4(...) ::__msl::make_vector<::ulong4>(__VA_ARGS__)
#define half2(...) ::__msl::make_vector<::half2>(__VA_ARGS__)
#define half3(...) ::__msl::make_vector<::half3>(__VA_ARGS__)
#define half4(...) ::__msl::make_vector<::half4>(__VA_ARGS__)
#define float2(...) ::__msl::make_vector<::float2>(__VA_ARGS__)
#define float3(...) ::__msl::make_vector<::float3>(__VA_ARGS__)
#define float4(...) ::__msl::make_vector<::float4>(__VA_ARGS__)

// Packed vectors (MSL spec "Packed Vector Types"): the components without padding (packed_float3 is 12 bytes), converting to and
// from the aligned vector.
#define _MSL_PACKED(T, N, V)                                                  \
  struct packed_##V {                                                         \
    T __c[N];                                                                 \
    typedef V vector_type;                                                    \
    packed_##V() = default;                                                   \
    packed_##V(vector_type v);                                                \
    operator vector_type() const;                                             \
    T& operator[](int i);                                                     \
    const T& operator[](int i) const;                                         \
  };
_MSL_PACKED(float, 2, float2) _MSL_PACKED(float, 3, float3) _MSL_PACKED(float, 4, float4)
_MSL_PACKED(half, 2, half2) _MSL_PACKED(half, 3, half3) _MSL_PACKED(half, 4, half4)
_MSL_PACKED(int, 2, int2) _MSL_PACKED(int, 3, int3) _MSL_PACKED(int, 4, int4)
_MSL_PACKED(uint, 2, uint2) _MSL_PACKED(uint, 3, uint3) _MSL_PACKED(uint, 4, uint4)
#undef _MSL_PACKED
