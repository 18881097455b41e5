// msl_emu: MSL's SIMD-group matrices (MSL 2.3+): simdgroup_matrix<T, 8, 8> (T = float or half),
// simdgroup_float8x8 / simdgroup_half8x8, make_filled_simdgroup_matrix, the diagonal constructor, simdgroup_load,
// simdgroup_store, simdgroup_multiply, simdgroup_multiply_accumulate and thread_elements(). Part of <metal_stdlib>;
// README.md ("SIMD-group matrices") lists what Apple leaves undefined and what the emulation does there.
//
// Conventions:
//  - a matrix is distributed over the 32 lanes of a SIMD group as on Apple GPUs (the layout MLX's steel GEMMs read
//    through thread_elements(); Apple does not document it): lane l holds the two consecutive elements
//    (row, col) and (row, col + 1) of one row, row = 4 * bit4(l) + 2 * bit2(l) + bit1(l), col = 4 * bit3(l) +
//    2 * bit0(l). Each thread's object holds only its lane's two elements (thread_elements());
//  - every operation except thread_elements() and copies is a SIMD-group function: it parks the calling fiber with a
//    SimdCall (msl_emu/runtime.h) and is resolved when every active thread of the SIMD group waits at the same call
//    site, else the run ends with runtime.h's "divergent SIMD-group function" error. Each thread's own arguments
//    (pointer, elements per row, origin, transpose, value) are used for its lane: MSL requires them uniform;
//  - elements held by an inactive lane (returned, or past the end of a partial SIMD group) read as the poison value
//    (all bits set: NaN) in a product, and a store does not write them; a default-constructed matrix holds poison;
//  - simdgroup_load/store: the 8x8 block read or written has its first element at column matrix_origin.x, row
//    matrix_origin.y of the memory matrix whose rows are elements_per_row apart; with transpose_matrix the block is
//    the matrix's transpose: element (r, c) of the matrix is memory element (origin.y + c, origin.x + r);
//  - products: the element types of d, a, b, c are float or half, independently; every d(r, c) is computed in float
//    as a(r, 0) b(0, c) + ... + a(r, 7) b(7, c), in k order, each product and sum rounded to float, then c(r, c)
//    added, and rounded once to d's type (a half product of halves is exact in float).
#pragma once

#include <cstring>
#include <source_location>
#include <type_traits>

#include "msl_emu/runtime.h"
#include "msl_emu/types.h"

namespace msl_emu::simdgroup_matrix_detail {

using detail::kSimdWidth;
using detail::SimdCall;

template <class T>
inline constexpr bool is_element = std::is_same_v<T, float> || std::is_same_v<T, half>;

template <class T>
using pair = T __attribute__((ext_vector_type(2)));

// The row of lane l's elements and the column of its first one (header comment).
constexpr uint lane_row(uint l) { return (l >> 4 & 1u) * 4 + (l >> 2 & 1u) * 2 + (l >> 1 & 1u); }
constexpr uint lane_col(uint l) { return (l >> 3 & 1u) * 4 + (l & 1u) * 2; }

template <class T>
inline T poison() {
  T v;
  std::memset(static_cast<void*>(&v), 0xff, sizeof v);
  return v;
}

// The 8x8 matrix of float values whose lanes' elements `elems(i)` are given for the active lanes (poison elsewhere).
template <class T, class Get>
inline void gather(SimdCall* const* lanes, uint width, Get elems, float m[8][8]) {
  for (uint l = 0; l < width; ++l) {
    const uint r = lane_row(l), c = lane_col(l);
    if (lanes[l] == nullptr) {
      m[r][c] = m[r][c + 1] = float(poison<T>());
    } else {
      const pair<T> e = elems(lanes[l]);
      m[r][c] = float(e[0]);
      m[r][c + 1] = float(e[1]);
    }
  }
}

template <class T>
inline pair<T>* out_of(SimdCall* c) {
  return static_cast<pair<T>*>(c->out);
}

inline void run(const char* function, const void* in, void* out, uint arg, void (*resolve)(SimdCall* const*, uint),
                std::source_location site) {
  detail::GroupRunner* r = detail::tls_runner;
  if (r == nullptr) detail::no_group_runner(function, site);
  SimdCall c{function, in, out, arg, resolve, site};
  r->simd(c);
}

// make_filled_simdgroup_matrix (arg 0) and the diagonal constructor (arg 1): in = &value.
template <class T>
void resolve_fill(SimdCall* const* lanes, uint width) {
  for (uint l = 0; l < width; ++l) {
    if (lanes[l] == nullptr) continue;
    const T v = *static_cast<const T*>(lanes[l]->in);
    const uint r = lane_row(l), c = lane_col(l);
    pair<T>& e = *out_of<T>(lanes[l]);
    for (uint j = 0; j < 2; ++j) e[j] = lanes[l]->arg == 0 || r == c + j ? v : T(0);
  }
}

struct Origin {
  ulong x, y;
};

// Memory element of matrix element (r, c) (header comment).
inline ulong offset(ulong elements_per_row, Origin o, bool transpose, uint r, uint c) {
  return transpose ? (o.y + c) * elements_per_row + o.x + r : (o.y + r) * elements_per_row + o.x + c;
}

template <class P>
struct Access {
  P ptr;  // a pointer, or an inline kernel's bounds-checked buffer (msl_emu/inline_launch.h: checked<T>)
  ulong elements_per_row;
  Origin origin;
  bool transpose;
};

template <class T, class P>
void resolve_load(SimdCall* const* lanes, uint width) {
  for (uint l = 0; l < width; ++l) {
    if (lanes[l] == nullptr) continue;
    const auto& a = *static_cast<const Access<P>*>(lanes[l]->in);
    pair<T>& e = *out_of<T>(lanes[l]);
    for (uint j = 0; j < 2; ++j)
      e[j] = a.ptr[offset(a.elements_per_row, a.origin, a.transpose, lane_row(l), lane_col(l) + j)];
  }
}

template <class T, class P>
void resolve_store(SimdCall* const* lanes, uint width) {
  for (uint l = 0; l < width; ++l) {
    if (lanes[l] == nullptr) continue;
    const auto& a = *static_cast<const Access<P>*>(lanes[l]->in);
    const pair<T>& e = *static_cast<const pair<T>*>(lanes[l]->out);
    for (uint j = 0; j < 2; ++j)
      a.ptr[offset(a.elements_per_row, a.origin, a.transpose, lane_row(l), lane_col(l) + j)] = e[j];
  }
}

template <class A, class B, class C>
struct Operands {
  const pair<A>* a;
  const pair<B>* b;
  const pair<C>* c;  // nullptr: simdgroup_multiply
};

// d = a b (+ c when kAccumulate): every operand is gathered before any lane's d is written, so d may be one of them.
template <class D, class A, class B, class C, bool kAccumulate>
void resolve_multiply(SimdCall* const* lanes, uint width) {
  using Ops = Operands<A, B, C>;
  float a[8][8], b[8][8], c[8][8];
  gather<A>(lanes, width, [](SimdCall* s) { return *static_cast<const Ops*>(s->in)->a; }, a);
  gather<B>(lanes, width, [](SimdCall* s) { return *static_cast<const Ops*>(s->in)->b; }, b);
  if constexpr (kAccumulate) gather<C>(lanes, width, [](SimdCall* s) { return *static_cast<const Ops*>(s->in)->c; }, c);
  for (uint l = 0; l < width; ++l) {
    if (lanes[l] == nullptr) continue;
    const uint r = lane_row(l);
    pair<D>& e = *out_of<D>(lanes[l]);
    for (uint j = 0; j < 2; ++j) {
      const uint col = lane_col(l) + j;
      float acc = a[r][0] * b[0][col];
      for (uint k = 1; k < 8; ++k) {
        const float p = a[r][k] * b[k][col];
        acc = acc + p;
      }
      if constexpr (kAccumulate) acc = acc + c[r][col];
      e[j] = D(acc);
    }
  }
}

template <class P, class T>
concept Buffer = requires(P p, ulong i) {
  { p[i] };
} && std::is_same_v<std::remove_cvref_t<decltype(std::declval<P>()[ulong(0)])>, T>;

}  // namespace msl_emu::simdgroup_matrix_detail

namespace metal {

#define MSL_EMU_SITE std::source_location site = std::source_location::current()

template <class T>
struct simdgroup_matrix<T, 8, 8> : simdgroup_matrix_elements<T> {
  static_assert(::msl_emu::simdgroup_matrix_detail::is_element<T>,
                "simdgroup_matrix: the element type must be float or half (bfloat is not emulated)");

  // Uninitialised in MSL: the poison value here (all bits set, NaN), so that a product that reads it shows it.
  simdgroup_matrix() { this->e_ = ::msl_emu::simdgroup_matrix_detail::poison<T>(); }
  // The diagonal matrix with `value` on the diagonal, 0 elsewhere (a SIMD-group function).
  explicit simdgroup_matrix(T value, MSL_EMU_SITE) {
    ::msl_emu::simdgroup_matrix_detail::run("simdgroup_matrix (diagonal constructor)", &value, &this->e_, 1,
                                            &::msl_emu::simdgroup_matrix_detail::resolve_fill<T>, site);
  }
};

template <class T, int Cols, int Rows>
  requires(Cols == 8 && Rows == 8)
inline simdgroup_matrix<T, 8, 8> make_filled_simdgroup_matrix(const T value, MSL_EMU_SITE) {
  simdgroup_matrix<T, 8, 8> m;
  ::msl_emu::simdgroup_matrix_detail::run("make_filled_simdgroup_matrix", &value, &m.thread_elements(), 0,
                                          &::msl_emu::simdgroup_matrix_detail::resolve_fill<T>, site);
  return m;
}

// src/dst: a device or threadgroup pointer to T (any pointer-like value indexed by ulong whose elements are T).
template <class T, class P>
  requires ::msl_emu::simdgroup_matrix_detail::Buffer<P, T>
inline void simdgroup_load(simdgroup_matrix<T, 8, 8>& d, P src, ulong elements_per_row = 8,
                           ulong2 matrix_origin = ulong2{0, 0}, bool transpose_matrix = false, MSL_EMU_SITE) {
  namespace sm = ::msl_emu::simdgroup_matrix_detail;
  const sm::Access<P> a{src, elements_per_row, {matrix_origin.x, matrix_origin.y}, transpose_matrix};
  sm::run("simdgroup_load", &a, &d.thread_elements(), 0, &sm::resolve_load<T, P>, site);
}

template <class T, class P>
  requires ::msl_emu::simdgroup_matrix_detail::Buffer<P, T> &&
           (!std::is_const_v<std::remove_reference_t<decltype(std::declval<P>()[ulong(0)])>>)
inline void simdgroup_store(const simdgroup_matrix<T, 8, 8>& a, P dst, ulong elements_per_row = 8,
                            ulong2 matrix_origin = ulong2{0, 0}, bool transpose_matrix = false, MSL_EMU_SITE) {
  namespace sm = ::msl_emu::simdgroup_matrix_detail;
  const sm::Access<P> acc{dst, elements_per_row, {matrix_origin.x, matrix_origin.y}, transpose_matrix};
  const vec<T, 2> e = a.thread_elements();
  sm::run("simdgroup_store", &acc, const_cast<vec<T, 2>*>(&e), 0, &sm::resolve_store<T, P>, site);
}

template <class D, class A, class B>
inline void simdgroup_multiply(simdgroup_matrix<D, 8, 8>& d, const simdgroup_matrix<A, 8, 8>& a,
                               const simdgroup_matrix<B, 8, 8>& b, MSL_EMU_SITE) {
  namespace sm = ::msl_emu::simdgroup_matrix_detail;
  const sm::Operands<A, B, float> ops{&a.thread_elements(), &b.thread_elements(), nullptr};
  sm::run("simdgroup_multiply", &ops, &d.thread_elements(), 0, &sm::resolve_multiply<D, A, B, float, false>, site);
}

template <class D, class A, class B, class C>
inline void simdgroup_multiply_accumulate(simdgroup_matrix<D, 8, 8>& d, const simdgroup_matrix<A, 8, 8>& a,
                                          const simdgroup_matrix<B, 8, 8>& b, const simdgroup_matrix<C, 8, 8>& c,
                                          MSL_EMU_SITE) {
  namespace sm = ::msl_emu::simdgroup_matrix_detail;
  const sm::Operands<A, B, C> ops{&a.thread_elements(), &b.thread_elements(), &c.thread_elements()};
  sm::run("simdgroup_multiply_accumulate", &ops, &d.thread_elements(), 0, &sm::resolve_multiply<D, A, B, C, true>, site);
}

#undef MSL_EMU_SITE

}  // namespace metal
