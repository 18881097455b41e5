// msl_emu: MSL's SIMD-group and quad-group functions (simd_*, quad_*, simdgroup_barrier). Part of <metal_stdlib>;
// README.md ("SIMD-group functions") lists what Apple leaves undefined and what the emulation does there.
//
// Conventions:
//  - every call parks the calling fiber with a SimdCall (msl_emu/runtime.h); the runtime gathers the SIMD group's
//    active threads (those that have not returned), checks that they all wait at this call, and calls the
//    function's `resolve`, which computes every active lane's result at once, in lane order;
//  - a SIMD group is 32 lanes (lane = thread_index_in_simdgroup); a quad is 4 consecutive lanes of it. quad_*
//    functions compute within quads but rendezvous like the simd_* ones, over the whole SIMD group;
//  - types, as MSL allows: arithmetic functions (sum, product, min, max, prefix sums/products) take scalars and
//    vectors of float, half, int, uint, short, ushort, char, uchar; and/or/xor the integer ones; broadcast and
//    shuffles those and bool. Anything else (double, long, a struct, and/or/xor on floats) does not compile;
//  - an undefined read (a broadcast or shuffle from an inactive lane, a lane past the end of a partial SIMD group,
//    or a lane number out of range) gives the poison value: all bits set (NaN for float and half, -1, the
//    maximum unsigned value, true for bool), so that a kernel relying on it shows it;
//  - arithmetic is done in the argument's type, lane 0 first (half rounds per step, integers wrap).
#pragma once

#include <cstring>
#include <source_location>
#include <type_traits>

#include "msl_emu/runtime.h"
#include "msl_emu/types.h"

namespace msl_emu::simdgroup {

using detail::kSimdWidth;
using detail::SimdCall;

template <class E>
inline constexpr bool is_arith_elem =
    std::is_same_v<E, float> || std::is_same_v<E, half> || std::is_same_v<E, int> || std::is_same_v<E, uint> ||
    std::is_same_v<E, short> || std::is_same_v<E, ushort> || std::is_same_v<E, char> || std::is_same_v<E, uchar>;
template <class E>
inline constexpr bool is_int_elem = is_arith_elem<E> && std::is_integral_v<E>;

template <class T>
concept Arith = is_arith_elem<elem_t<T>> && !std::is_reference_v<T>;
template <class T>
concept Bitwise = is_int_elem<elem_t<T>> && !std::is_reference_v<T>;
template <class T>
concept Data = Arith<T> || std::is_same_v<T, bool>;

template <class T>
inline T poison() {
  if constexpr (std::is_same_v<T, bool>) {
    return true;
  } else {
    T v;
    std::memset(static_cast<void*>(&v), 0xff, sizeof v);
    return v;
  }
}

// One function over the lanes of a SIMD group: Op::group = 32 (simd_*) or 4 (quad_*). Op::apply(in, active, arg,
// out, base) fills out[i] for the active lanes i of the segment [base, base + Op::group).
template <class Op, class T, class R>
void resolve(SimdCall* const* lanes, uint width) {
  T in[kSimdWidth];
  R out[kSimdWidth];
  bool active[kSimdWidth];
  uint arg[kSimdWidth];
  for (uint i = 0; i < width; ++i) {
    active[i] = lanes[i] != nullptr;
    arg[i] = active[i] ? lanes[i]->arg : 0;
    if (active[i] && lanes[i]->in != nullptr) std::memcpy(static_cast<void*>(&in[i]), lanes[i]->in, sizeof(T));
    else std::memset(static_cast<void*>(&in[i]), 0, sizeof(T));
  }
  for (uint base = 0; base < width; base += Op::group) Op::apply(in, active, arg, out, base);
  for (uint i = 0; i < width; ++i)
    if (active[i] && lanes[i]->out != nullptr) std::memcpy(lanes[i]->out, static_cast<const void*>(&out[i]), sizeof(R));
}

template <class Op, class T, class R>
inline R call(const char* function, const T* data, uint arg, std::source_location site) {
  detail::GroupRunner* r = detail::tls_runner;
  if (r == nullptr) detail::no_group_runner(function, site);
  R out{};
  SimdCall c{function, data, &out, arg, &resolve<Op, T, R>, site};
  r->simd(c);
  return out;
}

// ---- the operations (G: lanes per segment, 32 or 4)
template <class T, uint G, class F, bool kPrefix, bool kInclusive>
struct Scan {
  static constexpr uint group = G;
  static void apply(const T* in, const bool* active, const uint*, T* out, uint base) {
    bool have = false;
    T acc{};
    for (uint i = base; i < base + G; ++i) {
      if (!active[i]) continue;
      if constexpr (kPrefix && !kInclusive) out[i] = have ? acc : F::identity();
      acc = have ? F::op(acc, in[i]) : in[i];
      have = true;
      if constexpr (kPrefix && kInclusive) out[i] = acc;
    }
    if constexpr (!kPrefix)
      for (uint i = base; i < base + G; ++i) out[i] = acc;
  }
};
template <class T>
struct Add {
  static T op(T a, T b) { return T(a + b); }
  static T identity() { return T(0); }
};
template <class T>
struct Mul {
  static T op(T a, T b) { return T(a * b); }
  static T identity() { return T(1); }
};
template <class T>  // the reductions below have no prefix form, hence no identity
struct Min {
  static T op(T a, T b) { return detail::map2(a, b, [](auto x, auto y) { return y < x ? y : x; }); }
};
template <class T>
struct Max {
  static T op(T a, T b) { return detail::map2(a, b, [](auto x, auto y) { return x < y ? y : x; }); }
};
template <class T>
struct And {
  static T op(T a, T b) { return T(a & b); }
};
template <class T>
struct Or {
  static T op(T a, T b) { return T(a | b); }
};
template <class T>
struct Xor {
  static T op(T a, T b) { return T(a ^ b); }
};

enum class Move { broadcast, broadcast_first, shuffle, up, down, xor_, rotate_up, rotate_down };

// Lane `i` reads lane src(i); an inactive source or one out of range is poison, except that shuffle_up/down keep
// the caller's own value where the source would be outside the segment (MSL: they do not wrap).
template <class T, uint G, Move M>
struct Permute {
  static constexpr uint group = G;
  static void apply(const T* in, const bool* active, const uint* arg, T* out, uint base) {
    uint first = base + G;
    for (uint i = base; i < base + G && first == base + G; ++i)
      if (active[i]) first = i;
    for (uint i = base; i < base + G; ++i) {
      if (!active[i]) continue;
      const uint lane = i - base, a = arg[i];
      int64_t src;
      switch (M) {
        case Move::broadcast:
        case Move::shuffle: src = a; break;
        case Move::broadcast_first: src = int64_t(first) - base; break;
        case Move::up: src = int64_t(lane) - a; break;
        case Move::down: src = int64_t(lane) + a; break;
        case Move::xor_: src = lane ^ a; break;
        case Move::rotate_up: src = (int64_t(lane) + G - a % G) % G; break;
        case Move::rotate_down: src = (lane + a % G) % G; break;
      }
      if ((M == Move::up || M == Move::down) && (src < 0 || src >= int64_t(G))) {
        out[i] = in[i];
      } else if (src < 0 || src >= int64_t(G) || !active[base + src]) {
        out[i] = poison<T>();
      } else {
        out[i] = in[base + src];
      }
    }
  }
};

// Votes: bit k = lane k (of the segment) is active and its argument is true.
template <uint G, int kWhat>  // 0: ballot bits, 1: all, 2: any, 3: is_first, 4: active mask
struct Vote {
  static constexpr uint group = G;
  template <class R>
  static void apply(const bool* in, const bool* active, const uint*, R* out, uint base) {
    uint64_t vote = 0, mask = 0;
    for (uint i = base; i < base + G; ++i) {
      if (active[i]) mask |= uint64_t(1) << (i - base);
      if (active[i] && in[i]) vote |= uint64_t(1) << (i - base);
    }
    for (uint i = base; i < base + G; ++i) {
      if (!active[i]) continue;
      if constexpr (kWhat == 0) out[i] = R(vote, mask);
      if constexpr (kWhat == 4) out[i] = R(mask, mask);
      if constexpr (kWhat == 1) out[i] = vote == mask;
      if constexpr (kWhat == 2) out[i] = vote != 0;
      if constexpr (kWhat == 3) out[i] = (mask & ((uint64_t(1) << (i - base)) - 1)) == 0;
    }
  }
};
struct Nothing {};
struct Rendezvous {
  static constexpr uint group = kSimdWidth;
  static void apply(const Nothing*, const bool*, const uint*, Nothing*, uint) {}
};

}  // namespace msl_emu::simdgroup

namespace metal {

// The result of simd_ballot / simd_active_threads_mask: bit k is lane k. all()/any() look at the lanes that were
// active at the call (MSL leaves inactive lanes' bits 0).
template <class V>
struct basic_vote {
  typedef V vote_t;
  basic_vote() = default;
  explicit constexpr basic_vote(vote_t v) : v_(v), active_(v) {}
  constexpr basic_vote(uint64_t v, uint64_t active) : v_(vote_t(v)), active_(vote_t(active)) {}
  explicit constexpr operator vote_t() const { return v_; }
  constexpr bool all() const { return (v_ & active_) == active_; }
  constexpr bool any() const { return v_ != 0; }

 private:
  vote_t v_ = 0, active_ = 0;
};
using simd_vote = basic_vote<ulong>;
using quad_vote = basic_vote<ushort>;

#define MSL_EMU_SITE std::source_location site = std::source_location::current()
#define MSL_EMU_SCAN(prefix, G, name, F, Concept, kPrefix, kInclusive)                                        \
  template <class T>                                                                                            \
    requires ::msl_emu::simdgroup::Concept<T>                                                                   \
  inline T prefix##name(T data, MSL_EMU_SITE) {                                                              \
    using Op = ::msl_emu::simdgroup::Scan<T, G, ::msl_emu::simdgroup::F<T>, kPrefix, kInclusive>;               \
    return ::msl_emu::simdgroup::call<Op, T, T>(#prefix #name, &data, 0, site);                             \
  }
#define MSL_EMU_MOVE(prefix, G, name, M)                                                                        \
  template <class T>                                                                                            \
    requires ::msl_emu::simdgroup::Data<T>                                                                      \
  inline T prefix##name(T data, ushort arg, MSL_EMU_SITE) {                                                  \
    using Op = ::msl_emu::simdgroup::Permute<T, G, ::msl_emu::simdgroup::Move::M>;                              \
    return ::msl_emu::simdgroup::call<Op, T, T>(#prefix #name, &data, arg, site);                           \
  }
#define MSL_EMU_VOTE(prefix, G, name, What, R, Params, Arg)                                                     \
  inline R prefix##name(Params MSL_EMU_SITE) {                                                               \
    using Op = ::msl_emu::simdgroup::Vote<G, What>;                               \
    const bool data = Arg;                                                                                      \
    return ::msl_emu::simdgroup::call<Op, bool, R>(#prefix #name, &data, 0, site);                          \
  }
#define MSL_EMU_COMMA ,
#define MSL_EMU_GROUP_FUNCTIONS(prefix, G, Vote)                                                                \
  MSL_EMU_SCAN(prefix, G, _sum, Add, Arith, false, false)                                                        \
  MSL_EMU_SCAN(prefix, G, _product, Mul, Arith, false, false)                                                    \
  MSL_EMU_SCAN(prefix, G, _min, Min, Arith, false, false)                                                        \
  MSL_EMU_SCAN(prefix, G, _max, Max, Arith, false, false)                                                        \
  MSL_EMU_SCAN(prefix, G, _and, And, Bitwise, false, false)                                                      \
  MSL_EMU_SCAN(prefix, G, _or, Or, Bitwise, false, false)                                                        \
  MSL_EMU_SCAN(prefix, G, _xor, Xor, Bitwise, false, false)                                                      \
  MSL_EMU_SCAN(prefix, G, _prefix_inclusive_sum, Add, Arith, true, true)                                         \
  MSL_EMU_SCAN(prefix, G, _prefix_exclusive_sum, Add, Arith, true, false)                                        \
  MSL_EMU_SCAN(prefix, G, _prefix_inclusive_product, Mul, Arith, true, true)                                     \
  MSL_EMU_SCAN(prefix, G, _prefix_exclusive_product, Mul, Arith, true, false)                                    \
  MSL_EMU_MOVE(prefix, G, _broadcast, broadcast)                                                                 \
  MSL_EMU_MOVE(prefix, G, _shuffle, shuffle)                                                                     \
  MSL_EMU_MOVE(prefix, G, _shuffle_up, up)                                                                       \
  MSL_EMU_MOVE(prefix, G, _shuffle_down, down)                                                                   \
  MSL_EMU_MOVE(prefix, G, _shuffle_xor, xor_)                                                                    \
  MSL_EMU_MOVE(prefix, G, _shuffle_rotate_up, rotate_up)                                                         \
  MSL_EMU_MOVE(prefix, G, _shuffle_rotate_down, rotate_down)                                                     \
  template <class T>                                                                                            \
    requires ::msl_emu::simdgroup::Data<T>                                                                      \
  inline T prefix##_broadcast_first(T data, MSL_EMU_SITE) {                                                     \
    using Op = ::msl_emu::simdgroup::Permute<T, G, ::msl_emu::simdgroup::Move::broadcast_first>;                \
    return ::msl_emu::simdgroup::call<Op, T, T>(#prefix "_broadcast_first", &data, 0, site);                    \
  }                                                                                                             \
  MSL_EMU_VOTE(prefix, G, _ballot, 0, Vote, bool expr MSL_EMU_COMMA, expr)                                       \
  MSL_EMU_VOTE(prefix, G, _all, 1, bool, bool expr MSL_EMU_COMMA, expr)                                          \
  MSL_EMU_VOTE(prefix, G, _any, 2, bool, bool expr MSL_EMU_COMMA, expr)                                          \
  MSL_EMU_VOTE(prefix, G, _is_first, 3, bool, , true)                                                            \
  MSL_EMU_VOTE(prefix, G, _active_threads_mask, 4, Vote, , true)
MSL_EMU_GROUP_FUNCTIONS(simd, 32u, simd_vote)
MSL_EMU_GROUP_FUNCTIONS(quad, 4u, quad_vote)
#undef MSL_EMU_GROUP_FUNCTIONS
#undef MSL_EMU_COMMA
#undef MSL_EMU_VOTE
#undef MSL_EMU_MOVE
#undef MSL_EMU_SCAN

// A rendezvous of the SIMD group's active threads (memory is coherent here, so the flags change nothing).
inline void simdgroup_barrier(mem_flags, MSL_EMU_SITE) {
  using Op = ::msl_emu::simdgroup::Rendezvous;
  ::msl_emu::simdgroup::call<Op, ::msl_emu::simdgroup::Nothing, ::msl_emu::simdgroup::Nothing>("simdgroup_barrier",
                                                                                             nullptr, 0, site);
}
#undef MSL_EMU_SITE

}  // namespace metal
