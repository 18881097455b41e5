// Bare CUDA limits for the hash-grid kernels of metal_kernels/hash_grid.metal, timed beside them by
// dev/gpu_proxy/run.py (dev/gpu_proxy/build.py compiles this file to baselines.ptx). Plain CUDA, launched the way
// tiny-cuda-nn launches its forward (encodings/grid.h): one thread per (point, level), levels along the grid's y,
// 512 threads per block, F and D compile-time constants. Each does the reads (and, for the scatter, the atomic adds)
// that the kernel it bounds must do, and nothing else: the same level table (HgLevel layout of
// csrc/shared/hash_grid_math.h, bound as a buffer), the same corner indices (hash / dense / tiled modes), linear
// weights, float accumulation.
//
// Entries (T = f32 | f16 table, positions float [n*D], levels [n_levels] HgLevel):
//   hg_gather_T_F2_D3(positions, params, levels, n, n_levels, out)        out [n, n_levels*F] (our op's layout)
//   hg_gather_T_F2_D3_feature_major(..., out)                            out [n_levels*F, n] (tcnn's layout)
//   hg_gather_T_F2_D3_level_fastest(..., out)       out [n, n_levels*F]; one thread per (point, level) with the
//                                                   level fastest (grid ceil(n * n_levels / 512) blocks, 1-D)
//   hg_scatter_T_F2_D3(dy, positions, levels, n, n_levels, acc)          dy [n, n_levels*F] T, acc float [rows*F]
//                                                                        (float atomics: red.global.add.f32)
//   hg_scatter_T_F2_D3_feature_major(dy, ...)                            dy [n_levels*F, n] (tcnn's layout)
// Grid: (ceil(n / 512), n_levels), block (512, 1, 1).
//   launch_floor()                                                       does nothing: k launches of it in a row
//                                                                        are the least time k dependent passes
//                                                                        can take (dev/gpu_proxy/run.py)
#include "gpu_proxy/cuda.h"

typedef __fp16 half;

struct Level {  // HgLevel
  unsigned offset, size, resolution, mode, n_stride_dims;
  float scale;
  unsigned stride[4];
};

namespace {

constexpr unsigned kBlock = 512;

template <int D>
__device__ inline unsigned corner_index(const Level& lv, const unsigned* g, unsigned c) {
  unsigned gc[D];
#pragma unroll
  for (int d = 0; d < D; ++d) gc[d] = g[d] + ((c >> d) & 1u);
  if (lv.mode == 0u) {  // hash
    const unsigned primes[4] = {1u, 2654435761u, 805459861u, 3674653429u};
    unsigned h = 0;
#pragma unroll
    for (int d = 0; d < D; ++d) h ^= gc[d] * primes[d];
    return h & (lv.size - 1u);
  }
  unsigned s = 0;
#pragma unroll
  for (int d = 0; d < D; ++d) s += gc[d] * lv.stride[d];
  if (lv.mode == 1u) return s >= lv.size ? s - lv.size : s;  // dense
  return s % lv.size;                                        // tiled
}

template <int D>
__device__ inline void locate(const float* positions, const Level& lv, unsigned i, unsigned* g, float* w) {
#pragma unroll
  for (int d = 0; d < D; ++d) {
    float x = positions[i * D + d];
    x = x >= 0.0f ? (x <= 1.0f ? x : 1.0f) : 0.0f;
    const float pos = __builtin_fmaf(lv.scale, x, 0.5f);
    g[d] = unsigned(pos);
    w[d] = pos - float(g[d]);
  }
}

template <int D>
__device__ inline float corner_weight(const float* w, unsigned c) {
  float r = 1.0f;
#pragma unroll
  for (int d = 0; d < D; ++d) r *= ((c >> d) & 1u) ? w[d] : 1.0f - w[d];
  return r;
}

template <class T, int F, int D, bool kFeatureMajor, bool kLevelFastest = false>
__device__ inline void gather(const float* __restrict__ positions, const T* __restrict__ params,
                              const Level* __restrict__ levels, unsigned n, unsigned n_levels, T* __restrict__ out) {
  const unsigned t = gpu_proxy::sreg::ctaid_x() * kBlock + gpu_proxy::sreg::tid_x();
  const unsigned i = kLevelFastest ? t / n_levels : t;
  const unsigned l = kLevelFastest ? t % n_levels : gpu_proxy::sreg::ctaid_y();
  if (i >= n) return;
  const Level lv = levels[l];
  unsigned g[D];
  float w[D];
  locate<D>(positions, lv, i, g, w);
  float acc[F] = {};
#pragma unroll
  for (unsigned c = 0; c < (1u << D); ++c) {
    const float cw = corner_weight<D>(w, c);
    const T* v = params + (unsigned long)(lv.offset + corner_index<D>(lv, g, c)) * F;
#pragma unroll
    for (int f = 0; f < F; ++f) acc[f] += cw * float(v[f]);
  }
#pragma unroll
  for (int f = 0; f < F; ++f) {
    if (kFeatureMajor) out[(unsigned long)(l * F + f) * n + i] = T(acc[f]);
    else out[(unsigned long)i * (n_levels * F) + l * F + f] = T(acc[f]);
  }
}

template <class T, int F, int D, bool kFeatureMajor>
__device__ inline void scatter(const T* __restrict__ dy, const float* __restrict__ positions,
                               const Level* __restrict__ levels, unsigned n, unsigned n_levels, float* acc) {
  const unsigned i = gpu_proxy::sreg::ctaid_x() * kBlock + gpu_proxy::sreg::tid_x();
  const unsigned l = gpu_proxy::sreg::ctaid_y();
  if (i >= n) return;
  const Level lv = levels[l];
  unsigned g[D];
  float w[D];
  locate<D>(positions, lv, i, g, w);
  float gf[F];
#pragma unroll
  for (int f = 0; f < F; ++f)
    gf[f] = float(kFeatureMajor ? dy[(unsigned long)(l * F + f) * n + i] : dy[(unsigned long)i * (n_levels * F) + l * F + f]);
#pragma unroll
  for (unsigned c = 0; c < (1u << D); ++c) {
    const float cw = corner_weight<D>(w, c);
    float* a = acc + (unsigned long)(lv.offset + corner_index<D>(lv, g, c)) * F;
#pragma unroll
    for (int f = 0; f < F; ++f) __atomic_fetch_add(a + f, cw * gf[f], __ATOMIC_RELAXED);
  }
}

}  // namespace

// One extern "C" entry point: kernel(a, b, levels, n, n_levels, out) calls body (a parenthesised specialization of
// gather or scatter) with the same arguments.
#define GPU_PROXY_ENTRY(kernel, body, A, B, OUT)                                                               \
  extern "C" __global__ void __launch_bounds__(kBlock) kernel(const A* a, const B* b, const Level* levels,      \
                                                               unsigned n, unsigned n_levels, OUT* out) {       \
    body(a, b, levels, n, n_levels, out);                                                                       \
  }
// Per table type T: the gathers (positions, params -> out) and scatters (dy, positions -> acc) the runner launches.
#define GPU_PROXY_KERNELS(T, name)                                                                             \
  GPU_PROXY_ENTRY(hg_gather_##name##_F2_D3, (gather<T, 2, 3, false>), float, T, T)                             \
  GPU_PROXY_ENTRY(hg_gather_##name##_F2_D3_feature_major, (gather<T, 2, 3, true>), float, T, T)                \
  GPU_PROXY_ENTRY(hg_gather_##name##_F2_D3_level_fastest, (gather<T, 2, 3, false, true>), float, T, T)         \
  GPU_PROXY_ENTRY(hg_scatter_##name##_F2_D3, (scatter<T, 2, 3, false>), T, float, float)                       \
  GPU_PROXY_ENTRY(hg_scatter_##name##_F2_D3_feature_major, (scatter<T, 2, 3, true>), T, float, float)
GPU_PROXY_KERNELS(float, f32)
GPU_PROXY_KERNELS(half, f16)

extern "C" __global__ void launch_floor() {}
