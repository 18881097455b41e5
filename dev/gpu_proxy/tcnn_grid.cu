// tiny-cuda-nn's own hash-grid kernels (kernel_grid, kernel_grid_backward from encodings/grid.h, unchanged), launched
// as GridEncodingTemplated launches them, for dev/gpu_proxy/run.py's side-by-side rows (`--tcnn`). Built on a CUDA
// machine by `python3 dev/gpu_proxy/build.py tcnn --src <tiny-cuda-nn checkout> --out DIR`; tiny-cuda-nn's sources are
// read from that checkout at build time and are not part of this repository.
//
// Configuration: D = 3, F = 2, linear interpolation, GridType::Hash, HashType::CoherentPrime, all levels
// (max_level 1000, tiny-cuda-nn's default), no position gradients. Positions [N, 3] row-major (tiny-cuda-nn's
// MatrixView(x, 1, 3): element (dim, i) at x[i * 3 + dim]); outputs and output gradients feature-major [L*F, N]
// (tiny-cuda-nn's SoA layout). `offsets`: host array of L + 1 row offsets (the level table's offsets, then the
// total). Each function launches on the legacy default stream and returns cudaGetLastError().
#include <tiny-cuda-nn/encodings/grid.h>

#include <cuda_fp16.h>
#include <cstdint>

namespace {

constexpr uint32_t kDims = 3, kFeatures = 2;

tcnn::ParamsOffsetTable offset_table(const uint32_t* offsets, uint32_t n_levels) {
  tcnn::ParamsOffsetTable t;
  for (uint32_t l = 0; l <= n_levels; ++l) t.data[l] = offsets[l];
  t.size = n_levels + 1;
  return t;
}

template <typename T>
int forward(const T* params, const float* x, T* out, const uint32_t* offsets, uint32_t n, uint32_t n_levels,
            uint32_t base_resolution, float log2_per_level_scale) {
  constexpr uint32_t kThreads = 512;  // N_THREADS_HASHGRID of GridEncodingTemplated::forward_impl
  const dim3 blocks = {tcnn::div_round_up(n, kThreads), n_levels, 1};
  tcnn::kernel_grid<T, kDims, kFeatures, tcnn::HashType::CoherentPrime><<<blocks, kThreads>>>(
      n, n_levels * kFeatures, offset_table(offsets, n_levels), base_resolution, log2_per_level_scale, 1000.0f,
      nullptr, tcnn::InterpolationType::Linear, tcnn::GridType::Hash, params, tcnn::MatrixView<const float>(x, 1, 3),
      out, nullptr);
  return (int)cudaGetLastError();
}

// grad_t as GridEncodingTemplated chooses it (T for F = 2 on sm_60+: half2 atomics for float16 tables).
template <typename T>
int backward(T* grad, const float* x, const T* dy, const uint32_t* offsets, uint32_t n, uint32_t n_levels,
             uint32_t base_resolution, float log2_per_level_scale) {
  constexpr uint32_t kThreads = 256, kPerThread = 2;  // backward_impl's N_THREADS_HASHGRID, N_FEATURES_PER_THREAD
  const dim3 blocks = {tcnn::div_round_up(n * kFeatures / kPerThread, kThreads), n_levels, 1};
  tcnn::kernel_grid_backward<T, T, kDims, kFeatures, kPerThread, tcnn::HashType::CoherentPrime><<<blocks, kThreads>>>(
      n, n_levels * kFeatures, offset_table(offsets, n_levels), base_resolution, log2_per_level_scale, 1000.0f,
      nullptr, false, tcnn::InterpolationType::Linear, tcnn::GridType::Hash, grad,
      tcnn::MatrixView<const float>(x, 1, 3), dy);
  return (int)cudaGetLastError();
}

}  // namespace

extern "C" {
int tfmo_tcnn_grid_forward_f32(const float* params, const float* x, float* out, const uint32_t* offsets, uint32_t n,
                               uint32_t n_levels, uint32_t base_resolution, float log2_per_level_scale) {
  return forward<float>(params, x, out, offsets, n, n_levels, base_resolution, log2_per_level_scale);
}
int tfmo_tcnn_grid_forward_f16(const __half* params, const float* x, __half* out, const uint32_t* offsets,
                               uint32_t n, uint32_t n_levels, uint32_t base_resolution, float log2_per_level_scale) {
  return forward<__half>(params, x, out, offsets, n, n_levels, base_resolution, log2_per_level_scale);
}
int tfmo_tcnn_grid_backward_f32(float* grad, const float* x, const float* dy, const uint32_t* offsets, uint32_t n,
                                uint32_t n_levels, uint32_t base_resolution, float log2_per_level_scale) {
  return backward<float>(grad, x, dy, offsets, n, n_levels, base_resolution, log2_per_level_scale);
}
int tfmo_tcnn_grid_backward_f16(__half* grad, const float* x, const __half* dy, const uint32_t* offsets, uint32_t n,
                                uint32_t n_levels, uint32_t base_resolution, float log2_per_level_scale) {
  return backward<__half>(grad, x, dy, offsets, n, n_levels, base_resolution, log2_per_level_scale);
}
}
