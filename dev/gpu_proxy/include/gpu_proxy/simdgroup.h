// The GPU proxy's SIMD-group functions (part of <metal_stdlib> through the CUDA target layer, gpu_proxy/target.h,
// inside its host-device region; needs metal::mem_flags).
//
// Conventions: a SIMD group is a warp (32 lanes by the linear thread index in the block, as MSL's by
// thread_index_in_threadgroup). Lanes are Metal lanes (gpu_proxy/lanes.h: in files with SIMD-group matrices a full warp
// numbers them in the matrix layout): shuffle sources, lane order, ballot and active-mask bits are converted at each
// call, the CUDA shuffles and votes take the warp's own mask. The active lanes are __activemask() at the call: MSL
// requires the call to be uniform over them (the emulation reports it otherwise). With all 32 lanes active, sums,
// products, min and max run as a butterfly (every lane gets the same bits) and prefix sums as a Kogge-Stone scan, 5
// shuffles each, the cost class of Apple's SIMD-group instructions; with some lanes inactive they run in lane order
// over the active lanes (as msl_emu), one shuffle per lane. The order of floating-point additions differs between the
// two (and from msl_emu's lane order) — MSL leaves it unspecified. Scalar float, int and uint only: half (__fp16 cannot
// be passed by value), vectors and the quad functions have no counterpart here (a compile error).
#pragma once

namespace metal {

// The caller's Metal lane; the active lanes as CUDA's mask (for the CUDA shuffles and votes) and as Metal's.
inline uint gpu_proxy_lane() { return gpu_proxy::lanes::metal_lane(); }
inline uint gpu_proxy_warp_active() {
  uint mask;
  asm volatile("activemask.b32 %0;" : "=r"(mask));
  return mask;
}
inline uint gpu_proxy_active() { return gpu_proxy::lanes::metal_mask(gpu_proxy_warp_active()); }
// Metal lane `src`'s v (mask: the CUDA mask of the lanes taking part).
inline float gpu_proxy_shfl(uint mask, float v, uint src) {
  return __nvvm_shfl_sync_idx_f32(mask, v, int(gpu_proxy::lanes::cuda_lane(src)), 0x1f);
}
inline int gpu_proxy_shfl(uint mask, int v, uint src) {
  return __nvvm_shfl_sync_idx_i32(mask, v, int(gpu_proxy::lanes::cuda_lane(src)), 0x1f);
}
inline uint gpu_proxy_shfl(uint mask, uint v, uint src) {
  return uint(__nvvm_shfl_sync_idx_i32(mask, int(v), int(gpu_proxy::lanes::cuda_lane(src)), 0x1f));
}
inline float gpu_proxy_shfl_xor(float v, uint m) { return __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, int(m), 0x1f); }
inline int gpu_proxy_shfl_xor(int v, uint m) { return __nvvm_shfl_sync_bfly_i32(0xffffffffu, v, int(m), 0x1f); }
inline uint gpu_proxy_shfl_xor(uint v, uint m) {
  return uint(__nvvm_shfl_sync_bfly_i32(0xffffffffu, int(v), int(m), 0x1f));
}
// Over the full warp: Metal lane l gets lane l - d's value (its own for l < d).
template <class T>
inline T gpu_proxy_shfl_up(T v, uint d) {
  if (!gpu_proxy::lanes::renumbered()) {
    if constexpr (std::is_same_v<T, float>) return __nvvm_shfl_sync_up_f32(0xffffffffu, v, int(d), 0);
    else return T(__nvvm_shfl_sync_up_i32(0xffffffffu, int(v), int(d), 0));
  }
  const uint l = gpu_proxy_lane();
  return gpu_proxy_shfl(0xffffffffu, v, l >= d ? l - d : l);
}
// op over the active lanes l with lo <= l < hi, in lane order; `init` when there is none.
template <class T, class Op>
inline T gpu_proxy_fold(T v, uint lo, uint hi, T init, Op op) {
  const uint warp = gpu_proxy_warp_active(), mask = gpu_proxy::lanes::metal_mask(warp);
  T acc = init;
  for (uint l = 0; l < 32; ++l) {
    if (!(mask >> l & 1u)) continue;
    const T x = gpu_proxy_shfl(warp, v, l);  // every active lane takes part in every shuffle
    if (l >= lo && l < hi) acc = op(acc, x);
  }
  return acc;
}
// op over all active lanes: a butterfly when all 32 are, else gpu_proxy_fold. op must be commutative.
template <class T, class Op>
inline T gpu_proxy_reduce(T v, T init, Op op) {
  if (gpu_proxy_warp_active() != 0xffffffffu) return gpu_proxy_fold(v, 0, 32, init, op);
  for (uint m = 16; m > 0; m >>= 1) v = op(v, gpu_proxy_shfl_xor(v, m));
  return v;
}
// Inclusive prefix sum: a Kogge-Stone scan when all 32 lanes are active, else gpu_proxy_fold.
template <class T>
inline T gpu_proxy_scan(T v) {
  if (gpu_proxy_warp_active() != 0xffffffffu)
    return gpu_proxy_fold(v, 0, gpu_proxy_lane() + 1, T(0), [](T a, T b) { return T(a + b); });
  const uint lane = gpu_proxy_lane();
  for (uint d = 1; d < 32; d <<= 1) {
    const T y = gpu_proxy_shfl_up(v, d);
    if (lane >= d) v = T(y + v);
  }
  return v;
}
template <class T> inline T simd_sum(T v) { return gpu_proxy_reduce(v, T(0), [](T a, T b) { return T(a + b); }); }
template <class T> inline T simd_product(T v) { return gpu_proxy_reduce(v, T(1), [](T a, T b) { return T(a * b); }); }
template <class T> inline T simd_max(T v) { return gpu_proxy_reduce(v, v, [](T a, T b) { return b > a ? b : a; }); }
template <class T> inline T simd_min(T v) { return gpu_proxy_reduce(v, v, [](T a, T b) { return b < a ? b : a; }); }
template <class T> inline T simd_prefix_exclusive_sum(T v) {
  if (gpu_proxy_warp_active() != 0xffffffffu)
    return gpu_proxy_fold(v, 0, gpu_proxy_lane(), T(0), [](T a, T b) { return T(a + b); });
  const T incl = gpu_proxy_scan(v);
  const T prev = gpu_proxy_shfl_up(incl, 1u);
  return gpu_proxy_lane() == 0 ? T(0) : prev;
}
template <class T> inline T simd_prefix_inclusive_sum(T v) { return gpu_proxy_scan(v); }
template <class T> inline T simd_broadcast(T v, ushort lane) {
  return gpu_proxy_shfl(gpu_proxy_warp_active(), v, lane);
}
template <class T> inline T simd_shuffle(T v, ushort lane) { return gpu_proxy_shfl(gpu_proxy_warp_active(), v, lane); }
template <class T> inline T simd_broadcast_first(T v) {
  return gpu_proxy_shfl(gpu_proxy_warp_active(), v, uint(__builtin_ctz(gpu_proxy_active())));
}
// shuffle_up/down keep the caller's own value where the source lane is outside the SIMD group (MSL: no wrap).
template <class T> inline T simd_shuffle_down(T v, ushort delta) {
  const uint lane = gpu_proxy_lane();
  const T x = gpu_proxy_shfl(gpu_proxy_warp_active(), v, lane + delta < 32u ? lane + delta : lane);
  return x;
}
template <class T> inline T simd_shuffle_up(T v, ushort delta) {
  const uint lane = gpu_proxy_lane();
  return gpu_proxy_shfl(gpu_proxy_warp_active(), v, lane >= delta ? lane - delta : lane);
}
// simd_vote: bit k is lane k (32 lanes; vote_t is 64 bits wide as in MSL).
struct simd_vote {
  typedef ulong vote_t;
  explicit simd_vote(vote_t v) : v_(v) {}
  explicit operator vote_t() const { return v_; }
  bool all() const { return uint(v_) == gpu_proxy_active(); }
  bool any() const { return v_ != 0; }
  vote_t v_;
};
inline simd_vote simd_ballot(bool p) {
  return simd_vote(ulong(gpu_proxy::lanes::metal_mask(uint(__nvvm_vote_ballot_sync(gpu_proxy_warp_active(), p)))));
}
inline simd_vote simd_active_threads_mask() { return simd_vote(ulong(gpu_proxy_active())); }
inline bool simd_is_first() { return gpu_proxy_lane() == uint(__builtin_ctz(gpu_proxy_active())); }
inline bool simd_all(bool p) { return __nvvm_vote_all_sync(gpu_proxy_warp_active(), p); }
inline bool simd_any(bool p) { return __nvvm_vote_any_sync(gpu_proxy_warp_active(), p); }
inline void simdgroup_barrier(mem_flags) { __nvvm_bar_warp_sync(gpu_proxy_warp_active()); }

}  // namespace metal
