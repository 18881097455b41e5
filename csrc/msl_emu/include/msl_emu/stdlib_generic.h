// The target-independent part of <metal_stdlib> (csrc/msl_emu/include/metal_stdlib): every function whose definition
// is the same on each target, written once over the target's scalar primitives and atomic operations.
//
// Conventions:
//  - included by <metal_stdlib> between the target layer's two parts (see there): msl_emu/types.h and namespace
//    ::msl_emu::target are declared before it; what needs a target's threads (barriers, SIMD groups) comes after;
//  - arithmetic on float and half is done in float and rounded back to the element type E at the end (E(...));
//  - the transcendental functions call ::msl_emu::target::NAME(float) (libm on the CPU, the GPU's approximate
//    instructions on CUDA); a target may define one as a template whose static_assert names the missing function,
//    so only a kernel that uses it fails to compile. Everything else here is IEEE float and target-independent;
//  - math functions are templates, so that a libc non-template overload with the same exact signature wins a tie
//    (same semantics) instead of being ambiguous with these after `using namespace metal;`;
//  - a scalar argument next to a vector (or a double literal next to a float: MSL has no double, its 0.5 is a
//    float) is converted to T, as MSL's overloads allow (detail::Compatible, detail::as_t);
//  - atomics: metal::atomic<T> holds one ::msl_emu::target::atomic_storage<T> (the size and alignment of T, so a
//    device T buffer can be reinterpreted); each atomic_*_explicit calls ::msl_emu::target::atomic_OP(obj, ...).
//    memory_order_relaxed is the only order (MSL 2.4/3.0 support no other);
//  - no standard-library call here beyond <type_traits>: the same code compiles for the host and for CUDA devices.
#pragma once

#include <type_traits>

namespace msl_emu::detail {

template <class T, class F>
inline T map1(T x, F f) {
  if constexpr (is_vec_v<T>) {
    T r{};
    for (int i = 0; i < count_v<T>; ++i) r[i] = f(x[i]);
    return r;
  } else {
    return f(x);
  }
}
template <class T, class F>
inline T map2(T x, T y, F f) {
  if constexpr (is_vec_v<T>) {
    T r{};
    for (int i = 0; i < count_v<T>; ++i) r[i] = f(x[i], y[i]);
    return r;
  } else {
    return f(x, y);
  }
}
template <class T, class F>
inline T map3(T x, T y, T z, F f) {
  if constexpr (is_vec_v<T>) {
    T r{};
    for (int i = 0; i < count_v<T>; ++i) r[i] = f(x[i], y[i], z[i]);
    return r;
  } else {
    return f(x, y, z);
  }
}
template <class T, class U>
concept Compatible = std::is_same_v<std::remove_cvref_t<U>, T> ||
                     (!is_vec_v<U> && (std::is_arithmetic_v<std::remove_cvref_t<U>> || std::is_same_v<std::remove_cvref_t<U>, half>));
template <class T, class U>
inline T as_t(const U& u) {
  if constexpr (std::is_same_v<std::remove_cvref_t<U>, T>) return u;
  else return T(elem_t<T>(u));
}

}  // namespace msl_emu::detail

namespace metal {

template <class T, int N>
using vec = T __attribute__((ext_vector_type(N)));

inline namespace math_impl {

#define MSL_EMU_F1(name, expr)                                                                        \
  template <::msl_emu::FloatLike T>                                                                   \
  inline T name(T x) {                                                                                \
    return ::msl_emu::detail::map1(x, [](auto v) {                                                    \
      using E = decltype(v);                                                                          \
      const float a = float(v);                                                                       \
      return E(expr);                                                                                 \
    });                                                                                               \
  }
#define MSL_EMU_F1_BUILTIN(name) MSL_EMU_F1(name, __builtin_##name##f(a))
#define MSL_EMU_F1_TARGET(name) MSL_EMU_F1(name, ::msl_emu::target::name(a))
MSL_FLOAT1_BUILTIN(MSL_EMU_F1_BUILTIN)
MSL_FLOAT1_TARGET(MSL_EMU_F1_TARGET)
#undef MSL_EMU_F1_BUILTIN
#undef MSL_EMU_F1_TARGET
MSL_EMU_F1(rsqrt, 1.0f / __builtin_sqrtf(a))
MSL_EMU_F1(fract, __builtin_fminf(a - __builtin_floorf(a), 0x1.fffffep-1f))
MSL_EMU_F1(saturate, __builtin_fminf(__builtin_fmaxf(a, 0.0f), 1.0f))
MSL_EMU_F1(sign, a > 0.0f ? 1.0f : a < 0.0f ? -1.0f : a == a ? 0.0f * a : 0.0f)
#undef MSL_EMU_F1

#define MSL_EMU_F2(name, expr)                                                                        \
  template <::msl_emu::FloatLike T, class U>                                                          \
    requires ::msl_emu::detail::Compatible<T, U>                                                      \
  inline T name(T x, U y_) {                                                                          \
    return ::msl_emu::detail::map2(x, ::msl_emu::detail::as_t<T>(y_), [](auto v, auto w) {            \
      using E = decltype(v);                                                                          \
      const float a = float(v), b = float(w);                                                         \
      return E(expr);                                                                                 \
    });                                                                                               \
  }
#define MSL_EMU_F2_BUILTIN(name) MSL_EMU_F2(name, __builtin_##name##f(a, b))
#define MSL_EMU_F2_TARGET(name) MSL_EMU_F2(name, ::msl_emu::target::name(a, b))
MSL_FLOAT2_BUILTIN(MSL_EMU_F2_BUILTIN)
MSL_FLOAT2_TARGET(MSL_EMU_F2_TARGET)
#undef MSL_EMU_F2_BUILTIN
#undef MSL_EMU_F2_TARGET
MSL_EMU_F2(powr, ::msl_emu::target::pow(a, b))
#undef MSL_EMU_F2

// fma is one rounding (in float).
template <::msl_emu::FloatLike T>
inline T fma(T a, T b, T c) {
  return ::msl_emu::detail::map3(a, b, c, [](auto x, auto y, auto z) {
    using E = decltype(x);
    return E(__builtin_fmaf(float(x), float(y), float(z)));
  });
}

// min/max/clamp/abs work on integers too. MSL min/max on floats behave like fmin/fmax for NaN inputs.
#define MSL_EMU_MIN_MAX(name, float_builtin, integer_expr)                                             \
  template <::msl_emu::Arith T, class U>                                                              \
    requires ::msl_emu::detail::Compatible<T, U>                                                      \
  inline T name(T x, U y_) {                                                                          \
    return ::msl_emu::detail::map2(x, ::msl_emu::detail::as_t<T>(y_), [](auto a, auto b) {            \
      using E = decltype(a);                                                                          \
      if constexpr (::msl_emu::is_float_scalar_v<E>) return E(float_builtin(float(a), float(b)));     \
      else return integer_expr;                                                                       \
    });                                                                                               \
  }
MSL_EMU_MIN_MAX(min, __builtin_fminf, b < a ? b : a)
MSL_EMU_MIN_MAX(max, __builtin_fmaxf, a < b ? b : a)
#undef MSL_EMU_MIN_MAX
template <::msl_emu::Arith T, class U, class V>
  requires ::msl_emu::detail::Compatible<T, U> && ::msl_emu::detail::Compatible<T, V>
inline T clamp(T x, U lo, V hi) {
  return min(max(x, ::msl_emu::detail::as_t<T>(lo)), ::msl_emu::detail::as_t<T>(hi));
}
template <::msl_emu::Arith T>
inline T abs(T x) {
  return ::msl_emu::detail::map1(x, [](auto a) {
    using E = decltype(a);
    if constexpr (::msl_emu::is_float_scalar_v<E>) return E(__builtin_fabsf(float(a)));
    else return a < 0 ? E(-a) : a;
  });
}
// mix(x, y, a) = x + (y - x) * a; a may be a scalar for vector x, y.
template <::msl_emu::FloatLike T, class U>
  requires ::msl_emu::detail::Compatible<T, U>
inline T mix(T x, T y, U a) {
  return x + (y - x) * ::msl_emu::detail::as_t<T>(a);
}
template <::msl_emu::FloatLike T, class U>
  requires ::msl_emu::detail::Compatible<T, U>
inline T step(U edge, T x) {
  return ::msl_emu::detail::map2(::msl_emu::detail::as_t<T>(edge), x,
                                 [](auto e, auto v) { return decltype(v)(v < e ? 0.0f : 1.0f); });
}
template <::msl_emu::FloatLike T, class U, class V>
  requires ::msl_emu::detail::Compatible<T, U> && ::msl_emu::detail::Compatible<T, V>
inline T smoothstep(U e0, V e1, T x) {
  const T lo = ::msl_emu::detail::as_t<T>(e0), hi = ::msl_emu::detail::as_t<T>(e1);
  const T t = clamp((x - lo) / (hi - lo), 0.0f, 1.0f);
  return t * t * (T(3.0f) - T(2.0f) * t);
}

// Classification: bool for scalars, an integer vector (-1 true / 0 false) for vectors.
#define MSL_EMU_CLASSIFY(name, expr)                                                                  \
  template <::msl_emu::FloatLike T>                                                                   \
  inline auto name(T x) {                                                                             \
    if constexpr (::msl_emu::is_vec_v<T>) {                                                           \
      decltype(x == x) r{};                                                                           \
      for (int i = 0; i < ::msl_emu::count_v<T>; ++i) {                                               \
        const float a = float(x[i]);                                                                  \
        r[i] = (expr) ? -1 : 0;                                                                       \
      }                                                                                               \
      return r;                                                                                       \
    } else {                                                                                          \
      const float a = float(x);                                                                       \
      return bool(expr);                                                                              \
    }                                                                                                 \
  }
#define MSL_EMU_CLASSIFY_BUILTIN(name) MSL_EMU_CLASSIFY(name, __builtin_##name(a))
MSL_CLASSIFY(MSL_EMU_CLASSIFY_BUILTIN)
#undef MSL_EMU_CLASSIFY_BUILTIN
#undef MSL_EMU_CLASSIFY

// Geometric functions: sums in float, in component order.
template <::msl_emu::FloatLike T>
  requires ::msl_emu::is_vec_v<T>
inline ::msl_emu::elem_t<T> dot(T a, T b) {
  float s = 0.0f;
  for (int i = 0; i < ::msl_emu::count_v<T>; ++i) s += float(a[i]) * float(b[i]);
  return ::msl_emu::elem_t<T>(s);
}
template <::msl_emu::FloatLike T>
  requires(::msl_emu::count_v<T> == 3)
inline T cross(T a, T b) {
  return a.yzx * b.zxy - a.zxy * b.yzx;
}
template <::msl_emu::FloatLike T>
inline ::msl_emu::elem_t<T> length_squared(T a) {
  if constexpr (::msl_emu::is_vec_v<T>) return dot(a, a);
  else return a * a;
}
template <::msl_emu::FloatLike T>
inline ::msl_emu::elem_t<T> length(T a) {
  return ::msl_emu::elem_t<T>(__builtin_sqrtf(float(length_squared(a))));
}
template <::msl_emu::FloatLike T>
inline ::msl_emu::elem_t<T> distance(T a, T b) {
  return length(a - b);
}
template <::msl_emu::FloatLike T>
inline T normalize(T a) {
  return a * rsqrt(::msl_emu::elem_t<T>(length_squared(a)));
}

// Relational.
template <class T>
inline bool all(T v) {
  if constexpr (::msl_emu::is_vec_v<T>) {
    for (int i = 0; i < ::msl_emu::count_v<T>; ++i)
      if (!v[i]) return false;
    return true;
  } else {
    return bool(v);
  }
}
template <class T>
inline bool any(T v) {
  if constexpr (::msl_emu::is_vec_v<T>) {
    for (int i = 0; i < ::msl_emu::count_v<T>; ++i)
      if (v[i]) return true;
    return false;
  } else {
    return bool(v);
  }
}
// select(a, b, c) = c ? b : a, per component when c is a vector.
template <class T, class C>
inline T select(T a, T b, C c) {
  if constexpr (::msl_emu::is_vec_v<C>) {
    static_assert(::msl_emu::count_v<C> == ::msl_emu::count_v<T>, "select: condition size");
    T r = a;
    for (int i = 0; i < ::msl_emu::count_v<T>; ++i)
      if (c[i]) r[i] = b[i];
    return r;
  } else {
    return c ? b : a;
  }
}

// Integer bit functions, on the unsigned bits of each element; clz/ctz of 0 is the element's width.
template <::msl_emu::IntLike T>
inline T popcount(T x) {
  return ::msl_emu::detail::map1(x, [](auto a) {
    using E = decltype(a);
    return E(sizeof(E) == 8 ? __builtin_popcountll((unsigned long long)a) : __builtin_popcount(unsigned(std::make_unsigned_t<E>(a))));
  });
}
template <::msl_emu::IntLike T>
inline T clz(T x) {
  return ::msl_emu::detail::map1(x, [](auto a) {
    using E = decltype(a);
    using U = std::make_unsigned_t<E>;
    if (a == 0) return E(8 * sizeof(E));
    return E(sizeof(E) == 8 ? __builtin_clzll((unsigned long long)a)
                            : __builtin_clz(unsigned(U(a))) - int(8 * (sizeof(unsigned) - sizeof(E))));
  });
}
template <::msl_emu::IntLike T>
inline T ctz(T x) {
  return ::msl_emu::detail::map1(x, [](auto a) {
    using E = decltype(a);
    if (a == 0) return E(8 * sizeof(E));
    return E(sizeof(E) == 8 ? __builtin_ctzll((unsigned long long)a) : __builtin_ctz(unsigned(std::make_unsigned_t<E>(a))));
  });
}

}  // namespace math_impl

// metal::fast:: and metal::precise:: spell the same functions (each target has one precision per function).
namespace fast {
using namespace ::metal::math_impl;
}
namespace precise {
using namespace ::metal::math_impl;
}

// as_type<T>(x): reinterpret the bits; sizes must match (as in MSL).
template <class T, class U>
inline T as_type(const U& u) {
  static_assert(sizeof(T) == sizeof(U), "as_type: source and destination sizes differ");
  return __builtin_bit_cast(T, u);
}

// ---- atomics (see the header comment for the storage and the target's operations)
enum memory_order { memory_order_relaxed };

template <class T>
struct atomic {
  using value_type = T;
  ::msl_emu::target::atomic_storage<T> v;
};
using atomic_int = atomic<int>;
using atomic_uint = atomic<uint>;
using atomic_bool = atomic<bool>;
static_assert(sizeof(atomic_int) == 4 && alignof(atomic_int) == 4);
static_assert(sizeof(atomic_uint) == 4 && alignof(atomic_uint) == 4);
#if __METAL_VERSION__ >= 300
using atomic_float = atomic<float>;  // MSL 3.0+ only
static_assert(sizeof(atomic_float) == 4 && alignof(atomic_float) == 4);
#endif

namespace atomic_detail {
template <class A>
using value_t = typename std::remove_cv_t<A>::value_type;
template <class A>
using arg_t = std::type_identity_t<value_t<A>>;
template <class T>
inline constexpr bool is_int = std::is_same_v<T, int> || std::is_same_v<T, uint>;
template <class T>
inline constexpr bool is_num = is_int<T> || std::is_same_v<T, float>;
}  // namespace atomic_detail

template <class A>
inline void atomic_store_explicit(A* obj, atomic_detail::arg_t<A> desired, memory_order) {
  ::msl_emu::target::atomic_store(obj, desired);
}
template <class A>
inline atomic_detail::value_t<A> atomic_load_explicit(A* obj, memory_order) {
  return ::msl_emu::target::atomic_load(obj);
}
template <class A>
inline atomic_detail::value_t<A> atomic_exchange_explicit(A* obj, atomic_detail::arg_t<A> desired, memory_order) {
  return ::msl_emu::target::atomic_exchange(obj, desired);
}
template <class A>
inline bool atomic_compare_exchange_weak_explicit(A* obj, atomic_detail::value_t<A>* expected,
                                                  atomic_detail::arg_t<A> desired, memory_order, memory_order) {
  return ::msl_emu::target::atomic_compare_exchange_weak(obj, expected, desired);
}
#define MSL_EMU_ATOMIC_RMW(op, Requires)                                                                          \
  template <class A>                                                                                             \
    requires(atomic_detail::Requires<atomic_detail::value_t<A>>)                                                 \
  inline atomic_detail::value_t<A> atomic_##op##_explicit(A* obj, atomic_detail::arg_t<A> arg, memory_order) {  \
    return ::msl_emu::target::atomic_##op(obj, arg);                                                             \
  }
MSL_EMU_ATOMIC_RMW(fetch_add, is_num)
MSL_EMU_ATOMIC_RMW(fetch_sub, is_num)
MSL_EMU_ATOMIC_RMW(fetch_and, is_int)
MSL_EMU_ATOMIC_RMW(fetch_or, is_int)
MSL_EMU_ATOMIC_RMW(fetch_xor, is_int)
MSL_EMU_ATOMIC_RMW(fetch_min, is_int)
MSL_EMU_ATOMIC_RMW(fetch_max, is_int)
#undef MSL_EMU_ATOMIC_RMW

// ---- synchronisation flags (threadgroup_barrier and simdgroup_barrier are the target's)
enum class mem_flags : uint { MSL_MEM_FLAGS(MSL_ENUMERATOR) };
constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(uint(a) | uint(b)); }

// ---- SIMD-group matrices: the target defines simdgroup_matrix<T, 8, 8> and its functions. MSL has 8x8 only: other
// sizes are an incomplete type.
template <class T, int Cols, int Rows>
struct simdgroup_matrix;
// The base of each target's simdgroup_matrix<T, 8, 8>: the calling lane's two elements (the lane layout is
// msl_emu's, csrc/msl_emu/include/msl_emu/simdgroup_matrix.h's header comment, on every target).
template <class T>
struct simdgroup_matrix_elements {
  typedef T element_type;
  typedef vec<T, 2> elements_t;
  elements_t& thread_elements() { return e_; }
  const elements_t& thread_elements() const { return e_; }

 protected:
  elements_t e_;
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;

}  // namespace metal
