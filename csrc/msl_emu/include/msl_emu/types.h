// msl_emu: MSL scalar and vector types for clang (C++20). Part of <metal_stdlib>; see csrc/msl_emu/README.md.
//
// Conventions:
//  - scalar types: half = _Float16 (MSL_EMU_HALF), uint/ushort/uchar = unsigned 32/16/8 bit, ulong = 64 bit (LP64 Linux);
//  - vectors are clang ext_vector_type, so swizzles (.xy, .zyx, .rgba), element-wise operators, scalar
//    splat and the MSL sizes/alignments hold (float3 is 16 bytes, half3 is 8 bytes);
//  - MSL spells vector construction `float3(a, b, c)`; C++ cannot call a non-class type with several
//    arguments, so <metal_stdlib> (at its end) defines function-like macros float3(...) etc. that forward
//    to msl_emu::make_vec. The bare type name (not followed by '(') is untouched.
//  - boolN are int vectors (comparisons of ext vectors yield -1/0 integer vectors); they are not
//    storable with MSL's layout (MSL bool3 is 4 bytes of 0/1).
#pragma once

#include <cstdint>
#include <type_traits>

#include "msl_emu/stdlib_names.h"

#ifndef MSL_EMU_HALF
#define MSL_EMU_HALF _Float16  // the scalar type of `half` (dev/gpu_proxy sets __fp16: NVPTX in clang 16 has no _Float16)
#endif
typedef MSL_EMU_HALF half;
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;
static_assert(sizeof(ulong) == 8 && sizeof(long) == 8, "msl_emu needs an LP64 target (MSL long is 64-bit)");

MSL_VECTOR_ELEMENTS(MSL_VECTOR_TYPEDEFS, int)  // see header comment: bool vectors are int vectors here

static_assert(sizeof(float3) == 16 && alignof(float3) == 16, "MSL float3 is 16 bytes");
static_assert(sizeof(half3) == 8 && sizeof(uint2) == 8 && sizeof(float4) == 16, "MSL vector sizes");

namespace msl_emu {

template <class T>
struct vec_traits {
  static constexpr int size = 0;  // 0: not a vector
  using elem = T;
};
template <class E, int N>
struct vec_traits<E __attribute__((ext_vector_type(N)))> {
  static constexpr int size = N;
  using elem = E;
};
template <class T>
inline constexpr bool is_vec_v = vec_traits<std::remove_cvref_t<T>>::size > 0;
template <class T>
using elem_t = typename vec_traits<std::remove_cvref_t<T>>::elem;
template <class T>
inline constexpr int count_v = is_vec_v<T> ? vec_traits<std::remove_cvref_t<T>>::size : 1;

template <class T>
inline constexpr bool is_float_scalar_v = std::is_same_v<T, float> || std::is_same_v<T, half>;
template <class T>
concept FloatLike = is_float_scalar_v<elem_t<T>>;  // float, half and their vectors
template <class T>
concept Arith = std::is_arithmetic_v<elem_t<T>> || std::is_same_v<elem_t<T>, half>;
template <class T>
concept IntLike = std::is_integral_v<elem_t<T>>;

namespace detail {
template <class V, class A>
constexpr void put(V& r, int& i, const A& a) {
  using E = elem_t<V>;
  if constexpr (is_vec_v<A>) {
    for (int k = 0; k < count_v<A>; ++k) r[i++] = E(a[k]);
  } else {
    r[i++] = E(a);
  }
}
}  // namespace detail

// MSL vector constructor: V() is zero, V(scalar) splats, V(other vector of the same size) converts,
// otherwise the components of the arguments are concatenated and must add up to exactly the size of V.
template <class V, class... A>
constexpr V make_vec(const A&... a) {
  using E = elem_t<V>;
  constexpr int N = count_v<V>;
  if constexpr (sizeof...(A) == 0) {
    return V{};
  } else if constexpr (sizeof...(A) == 1 && !(is_vec_v<A> || ...)) {
    return V(E(a...));
  } else if constexpr (sizeof...(A) == 1 && ((count_v<A> == N) && ...)) {
    return [](const auto& v) {
      using S = elem_t<decltype(v)>;
      if constexpr (std::is_same_v<S, half> || std::is_same_v<E, half>) {
        // Element by element, as scalar conversions: clang 16's __builtin_convertvector converts vectors of __fp16
        // (the GPU proxy's half) as their raw 16-bit patterns, i.e. as integers.
        V r{};
        for (int i = 0; i < N; ++i) r[i] = E(v[i]);
        return r;
      } else {
        return __builtin_convertvector(v, V);
      }
    }(a...);
  } else {
    static_assert((count_v<A> + ...) == N, "MSL vector constructor: component count does not match");
    V r{};
    int i = 0;
    (detail::put(r, i, a), ...);
    return r;
  }
}

}  // namespace msl_emu
