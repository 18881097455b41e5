// The GPU proxy's SIMD-group matrices (MSL 2.3+): simdgroup_matrix<T, 8, 8> for T = float and half, on a warp (one
// SIMD group = 32 lanes). Included by the CUDA target layer (gpu_proxy/target.h) inside its host-device region; needs
// ::metal::gpu_proxy_lane() / ::metal::gpu_proxy_warp_active() (gpu_proxy/simdgroup.h) and gpu_proxy/lanes.h.
//
// Conventions:
//  - the lane layout is msl_emu's (csrc/msl_emu/include/msl_emu/simdgroup_matrix.h): lane l holds (row, col) and
//    (row, col + 1), row = 4 bit4(l) + 2 bit2(l) + bit1(l), col = 4 bit3(l) + 2 bit0(l); thread_elements() is
//    those two elements; loads and stores touch only the calling lane's two elements (no exchange);
//  - make_filled_simdgroup_matrix and the diagonal constructor take the value by const reference (clang's CUDA mode
//    does not pass __fp16, the proxy's half, by value), which MSL's by-value calls bind to unchanged;
//  - products with a and b both half and all 32 lanes active run on the tensor cores: one
//    mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 (a in rows 0-7 of the 16x8 A operand, rows 8-15 zero) with c
//    (converted to float) as its accumulator: half products summed in float, rounded once to d's type. The file's
//    warps are renumbered (gpu_proxy/lanes.h), so a, c and d are the mma fragments as they lie and b becomes its
//    fragment by one movmatrix transpose: no shuffle;
//  - every other product (a or b float, or some lanes inactive) runs as float FMAs, k = 0..7 in order, after
//    fetching a's row and b's columns with shuffles (float elements are never rounded to tf32); c is added last;
//  - loads and stores compute the tile's origin in 64 bits once and the lane's offset from it in 32 bits when the
//    row stride allows (below 2^28 elements), as the hardware's address units do;
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

// Metal lane src's v; mask is the warp's CUDA mask.
inline uint shfl(uint mask, uint v, uint src) {
  return uint(__nvvm_shfl_sync_idx_i32(mask, int(v), int(::gpu_proxy::lanes::cuda_lane(src)), 0x1f));
}

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

// Both half, all 32 lanes active, so the warp is renumbered: the tensor-core path (header comment).
template <class T>
inline pair<float> product_mma(const pair<T>& a, const pair<T>& b, const pair<float>& c) {
  static_assert(GPU_PROXY_MATRIX_LANES && sizeof(T) == 2,
                "gpu_proxy: a file with SIMD-group matrices must be built with GPU_PROXY_MATRIX_LANES "
                "(dev/gpu_proxy/build.py defines it when the source names them)");
  uint bt;  // b as the B fragment: lane L holds (2 (L % 4), L / 4) and (2 (L % 4) + 1, L / 4)
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(bt) : "r"(__builtin_bit_cast(uint, b)));
  float d0, d1, d2, d3;
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};"
      : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
      : "r"(__builtin_bit_cast(uint, a)), "r"(0u), "r"(bt), "f"(c[0]), "f"(c[1]), "f"(0.0f), "f"(0.0f));
  (void)d2, (void)d3;
  return pair<float>{d0, d1};
}

// This lane's a b + c as float.
template <class A, class B>
inline pair<float> product(const pair<A>& a, const pair<B>& b, const pair<float>& c) {
  const uint mask = ::metal::gpu_proxy_warp_active();
  if constexpr (sizeof(A) == 2 && sizeof(B) == 2 && std::is_same_v<A, B>) {
    if (mask == 0xffffffffu) return product_mma<A>(a, b, c);
  }
  const pair<float> p = product_fma<A, B>(mask, a, b);
  return pair<float>{p[0] + c[0], p[1] + c[1]};
}

// Element (r, c) of the tile at origin o (column, row), as an offset from the memory matrix's first element.
inline ulong offset(ulong elements_per_row, ulong2 o, bool transpose, uint r, uint c) {
  const ulong origin = o.y * elements_per_row + o.x;
  const uint i = transpose ? c : r, j = transpose ? r : c;
  if (elements_per_row < (1ul << 28)) return origin + (i * uint(elements_per_row) + j);
  return origin + (i * elements_per_row + j);
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
  const vec<float, 2> p =
      ::gpu_proxy::matrix::product<A, B>(a.thread_elements(), b.thread_elements(), ::gpu_proxy::matrix::pair<float>{});
  d.thread_elements()[0] = D(p[0]);
  d.thread_elements()[1] = D(p[1]);
}

template <class D, class A, class B, class C>
inline void simdgroup_multiply_accumulate(simdgroup_matrix<D, 8, 8>& d, const simdgroup_matrix<A, 8, 8>& a,
                                          const simdgroup_matrix<B, 8, 8>& b, const simdgroup_matrix<C, 8, 8>& c) {
  const vec<float, 2> p = ::gpu_proxy::matrix::product<A, B>(  // c's layout is d's
      a.thread_elements(), b.thread_elements(),
      ::gpu_proxy::matrix::pair<float>{float(c.thread_elements()[0]), float(c.thread_elements()[1])});
  d.thread_elements()[0] = D(p[0]);
  d.thread_elements()[1] = D(p[1]);
}

}  // namespace metal
