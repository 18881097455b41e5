// The elementwise steps between the kernels of one NeRF training step (dev/gpu_proxy/cases.py: nerf_step_cases),
// the same in both of its sequences (the package's kernels, and tiny-cuda-nn's encoding and FullyFusedMLP with the
// package's rendering). They do what the example's TensorFlow ops do between the fused ops (examples/nerf/models.py,
// HashNeRF): sigma = trunc_exp(h[:, 0]) of the density network's output h [N, 16], the colour network's input
// concat(h, sh) with sh the view direction's spherical harmonics per sample [N, 16], the colours as float for the
// renderer, and their backward. Plain CUDA compiled by dev/gpu_proxy/build.py with the baselines; one thread per
// sample, 256 per block, grid ceil(N / 256) blocks.
//
// Entries (half: float16; y_stride, dy_stride: the colour network's row width, 3 for the package's FusedMlp and 16
// for FullyFusedMLP's padded output):
//   nerf_glue_forward(h, sh, n, sigma, c_in)       h, sh [n, 16] half -> sigma [n] float, c_in [n, 32] half
//   nerf_glue_colors(y, n, y_stride, colors)        y [n, y_stride] half -> colors [n, 3] float
//   nerf_glue_colors_backward(g_colors, n, dy_stride, dy)
//                                                   g_colors [n, 3] float -> dy [n, dy_stride] half (padding 0)
//   nerf_glue_backward(dc_in, g_sigma, h, n, dh)     dc_in [n, 32] half, g_sigma [n] float, h [n, 16] half ->
//                                                   dh [n, 16] half: dc_in's first 16 columns, plus
//                                                   g_sigma * trunc_exp'(h[:, 0]) in column 0
#include "gpu_proxy/cuda.h"

typedef __fp16 half;

namespace {

constexpr unsigned kBlock = 256;
constexpr float kExpClip = 15.0f;  // trunc_exp: exp(clip(x, -15, 15)), gradient 0 outside

// exp as the proxy's Metal target computes it (ex2.approx of x * log2(e)).
__device__ inline float approx_exp(float x) { return __nvvm_ex2_approx_f(x * 1.4426950408889634f); }

__device__ inline unsigned sample() { return gpu_proxy::sreg::ctaid_x() * kBlock + gpu_proxy::sreg::tid_x(); }

}  // namespace

extern "C" __global__ void __launch_bounds__(kBlock)
    nerf_glue_forward(const half* h, const half* sh, unsigned n, float* sigma, half* c_in) {
  const unsigned i = sample();
  if (i >= n) return;
  const float x = float(h[i * 16]);
  sigma[i] = approx_exp(x < -kExpClip ? -kExpClip : (x > kExpClip ? kExpClip : x));
  for (unsigned j = 0; j < 16; ++j) {
    c_in[i * 32 + j] = h[i * 16 + j];
    c_in[i * 32 + 16 + j] = sh[i * 16 + j];
  }
}

extern "C" __global__ void __launch_bounds__(kBlock)
    nerf_glue_colors(const half* y, unsigned n, unsigned y_stride, float* colors) {
  const unsigned i = sample();
  if (i >= n) return;
  for (unsigned c = 0; c < 3; ++c) colors[i * 3 + c] = float(y[i * y_stride + c]);
}

extern "C" __global__ void __launch_bounds__(kBlock)
    nerf_glue_colors_backward(const float* g_colors, unsigned n, unsigned dy_stride, half* dy) {
  const unsigned i = sample();
  if (i >= n) return;
  for (unsigned c = 0; c < dy_stride; ++c) dy[i * dy_stride + c] = half(c < 3 ? g_colors[i * 3 + c] : 0.0f);
}

extern "C" __global__ void __launch_bounds__(kBlock)
    nerf_glue_backward(const half* dc_in, const float* g_sigma, const half* h, unsigned n, half* dh) {
  const unsigned i = sample();
  if (i >= n) return;
  const float x = float(h[i * 16]);
  const float d_exp = (x > -kExpClip && x < kExpClip) ? approx_exp(x) : 0.0f;
  dh[i * 16] = half(float(dc_in[i * 32]) + g_sigma[i] * d_exp);
  for (unsigned j = 1; j < 16; ++j) dh[i * 16 + j] = dc_in[i * 32 + j];
}
