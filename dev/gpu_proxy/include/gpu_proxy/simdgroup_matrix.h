// The GPU proxy's SIMD-group matrices (MSL 2.3+): simdgroup_matrix<T, 8, 8> for T = float and half, on a warp (one
// SIMD group = 32 lanes). Included by the CUDA target layer (gpu_proxy/target.h) inside its host-device region; needs
// ::metal::gpu_proxy_lane() / ::metal::gpu_proxy_active() (gpu_proxy/simdgroup.h).
//
// Conventions:
//  - the lane layout is msl_emu's (csrc/msl_emu/include/msl_emu/simdgroup_matrix.h): lane l holds (row, col) and
//    (row, col + 1), row = 4 bit4(l) + 2 bit2(l) + bit1(l), col = 4 bit3(l) + 2 bit0(l); thread_elements() is
//    those two elements; loads and stores touch only the calling lane's two elements (no exchange);
//  - make_filled_simdgroup_matrix and the diagonal constructor take the value by const reference (clang's CUDA mode
//    does not pass __fp16, the proxy's half, by value), which MSL's by-value calls bind to unchanged;
//  - products with a and b both half and all 32 lanes active run on the tensor cores: one
//    mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 (a in rows 0-7 of the 16x8 A operand, rows 8-15 zero): half
//    products accumulated in float; c (converted to float) is added to that, and the sum rounded once to d's type; the operands move between
//    Apple's layout and the mma fragments with warp shuffles (a: 1, b: 2, c: 1 or 2, d: 2);
//  - every other product (a or b float, or some lanes inactive) runs as float FMAs, k = 0..7 in order, after
//    fetching a's row and b's columns with shuffles (float elements are never rounded to tf32); c is added last;
//  - inactive lanes' elements are whatever the shuffle returns (undefined, as in MSL); msl_emu reports divergence,
//    this header does not check it.
#pragma once

namespace gpu_proxy::matrix {

template <class T>
using pair = T __attribute__((ext_vector_type(2)));

inline uint lane_row(uint l) { return (l >> 4 & 1u) * 4 + (l >> 2 & 1u) * 2 + (l >> 1 & 1u); }
inline uint lane_col(uint l) { return (l >> 3 & 1u) * 4 + (l & 1u) * 2; }
// The lane holding element (r, c) (as its element c & 1).
inline uint lane_of(uint r, uint c) {
  return (r >> 2 & 1u) << 4 | (c >> 2 & 1u) << 3 | (r >> 1 & 1u) << 2 | (r & 1u) << 1 | (c >> 1 & 1u);
}

inline uint shfl(uint mask, uint v, uint src) { return uint(__nvvm_shfl_sync_idx_i32(mask, int(v), int(src), 0x1f)); }

// Lane `src`'s two elements, as float.
template <class T>
inline pair<float> fetch(uint mask, const pair<T>& mine, uint src) {
  if constexpr (sizeof(T) == 2) {
    const pair<T> h = __builtin_bit_cast(pair<T>, shfl(mask, __builtin_bit_cast(uint, mine), src));
    return pair<float>{float(h[0]), float(h[1])};
  } else {
    return pair<float>{__builtin_bit_cast(float, shfl(mask, __builtin_bit_cast(uint, float(mine[0])), src)),
                       __builtin_bit_cast(float, shfl(mask, __builtin_bit_cast(uint, float(mine[1])), src))};
  }
}

// This lane's d = a b (+ c) as float, FMAs in k order.
template <class A, class B>
inline pair<float> product_fma(uint mask, const pair<A>& a, const pair<B>& b) {
  const uint l = ::metal::gpu_proxy_lane(), r = lane_row(l), c0 = lane_col(l);
  float acc0 = 0.0f, acc1 = 0.0f;
  for (uint kp = 0; kp < 4; ++kp) {
    const pair<float> ar = fetch(mask, a, lane_of(r, 2 * kp));
    for (uint j = 0; j < 2; ++j) {
      const pair<float> bk = fetch(mask, b, lane_of(2 * kp + j, c0));
      acc0 = __builtin_fmaf(ar[j], bk[0], acc0);
      acc1 = __builtin_fmaf(ar[j], bk[1], acc1);
    }
  }
  return pair<float>{acc0, acc1};
}

// Both half, all lanes active: the tensor-core path (header comment).
template <class T>
inline pair<float> product_mma(const pair<T>& a, const pair<T>& b) {
  const uint full = 0xffffffffu, L = ::metal::gpu_proxy_lane(), g = L >> 2, t = L & 3u;
  const uint a01 = shfl(full, __builtin_bit_cast(uint, a), lane_of(g, 2 * t));
  const uint b_lo = shfl(full, __builtin_bit_cast(uint, b), lane_of(2 * t, g));
  const uint b_hi = shfl(full, __builtin_bit_cast(uint, b), lane_of(2 * t + 1, g));
  const uint shift = (g & 1u) * 16;  // which half of the source lane's pair holds column g
  const uint b01 = (b_lo >> shift & 0xffffu) | (b_hi >> shift & 0xffffu) << 16;
  float d0, d1, d2, d3;
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};"
      : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
      : "r"(a01), "r"(0u), "r"(b01), "f"(0.0f), "f"(0.0f), "f"(0.0f), "f"(0.0f));
  (void)d2, (void)d3;
  // Back to Apple's layout: lane l's (r, c0) and (r, c0 + 1) are PTX lane r * 4 + c0 / 2's d0, d1.
  const uint l = ::metal::gpu_proxy_lane(), src = lane_row(l) * 4 + lane_col(l) / 2;
  return pair<float>{__builtin_bit_cast(float, shfl(full, __builtin_bit_cast(uint, d0), src)),
                     __builtin_bit_cast(float, shfl(full, __builtin_bit_cast(uint, d1), src))};
}

template <class A, class B>
inline pair<float> product(const pair<A>& a, const pair<B>& b) {
  const uint mask = ::metal::gpu_proxy_active();
  if constexpr (sizeof(A) == 2 && sizeof(B) == 2 && std::is_same_v<A, B>) {
    if (mask == 0xffffffffu) return product_mma<A>(a, b);
  }
  return product_fma<A, B>(mask, a, b);
}

inline ulong offset(ulong elements_per_row, ulong2 o, bool transpose, uint r, uint c) {
  return transpose ? (o.y + c) * elements_per_row + o.x + r : (o.y + r) * elements_per_row + o.x + c;
}

}  // namespace gpu_proxy::matrix

namespace metal {

template <class T>
struct simdgroup_matrix<T, 8, 8> : simdgroup_matrix_elements<T> {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, half>,
                "simdgroup_matrix: the element type must be float or half (bfloat has no counterpart here)");
  simdgroup_matrix() = default;  // uninitialised, as in MSL
  explicit simdgroup_matrix(const T& value) {  // the diagonal matrix
    const uint l = ::metal::gpu_proxy_lane(), r = ::gpu_proxy::matrix::lane_row(l), c = ::gpu_proxy::matrix::lane_col(l);
    this->e_[0] = r == c ? value : T(0.0f);
    this->e_[1] = r == c + 1 ? value : T(0.0f);
  }
};

template <class T, int Cols, int Rows>
  requires(Cols == 8 && Rows == 8)
inline simdgroup_matrix<T, 8, 8> make_filled_simdgroup_matrix(const T& value) {
  simdgroup_matrix<T, 8, 8> m;
  m.thread_elements()[0] = value;
  m.thread_elements()[1] = value;
  return m;
}

template <class T>
inline void simdgroup_load(simdgroup_matrix<T, 8, 8>& d, const T* src, ulong elements_per_row = 8,
                           ulong2 matrix_origin = ulong2{0, 0}, bool transpose_matrix = false) {
  const uint l = ::metal::gpu_proxy_lane(), r = ::gpu_proxy::matrix::lane_row(l), c = ::gpu_proxy::matrix::lane_col(l);
  for (uint j = 0; j < 2; ++j)
    d.thread_elements()[j] = src[::gpu_proxy::matrix::offset(elements_per_row, matrix_origin, transpose_matrix, r, c + j)];
}

template <class T>
inline void simdgroup_store(const simdgroup_matrix<T, 8, 8>& a, T* dst, ulong elements_per_row = 8,
                            ulong2 matrix_origin = ulong2{0, 0}, bool transpose_matrix = false) {
  const uint l = ::metal::gpu_proxy_lane(), r = ::gpu_proxy::matrix::lane_row(l), c = ::gpu_proxy::matrix::lane_col(l);
  for (uint j = 0; j < 2; ++j)
    dst[::gpu_proxy::matrix::offset(elements_per_row, matrix_origin, transpose_matrix, r, c + j)] = a.thread_elements()[j];
}

template <class D, class A, class B>
inline void simdgroup_multiply(simdgroup_matrix<D, 8, 8>& d, const simdgroup_matrix<A, 8, 8>& a,
                               const simdgroup_matrix<B, 8, 8>& b) {
  const vec<float, 2> p = ::gpu_proxy::matrix::product<A, B>(a.thread_elements(), b.thread_elements());
  d.thread_elements()[0] = D(p[0]);
  d.thread_elements()[1] = D(p[1]);
}

template <class D, class A, class B, class C>
inline void simdgroup_multiply_accumulate(simdgroup_matrix<D, 8, 8>& d, const simdgroup_matrix<A, 8, 8>& a,
                                          const simdgroup_matrix<B, 8, 8>& b, const simdgroup_matrix<C, 8, 8>& c) {
  const vec<float, 2> p = ::gpu_proxy::matrix::product<A, B>(a.thread_elements(), b.thread_elements());
  const float c0 = float(c.thread_elements()[0]), c1 = float(c.thread_elements()[1]);  // c's layout is d's
  d.thread_elements()[0] = D(p[0] + c0);
  d.thread_elements()[1] = D(p[1] + c1);
}

}  // namespace metal
