// tiny-cuda-nn's own FullyFusedMLP (networks/fully_fused_mlp.h and src/fully_fused_mlp.cu, unchanged), driven through
// its public Network interface, for dev/gpu_proxy/run.py's side-by-side rows (`--tcnn`). Built with the hash-grid
// wrapper by `python3 dev/gpu_proxy/build.py tcnn --src <tiny-cuda-nn checkout> --out DIR`; tiny-cuda-nn's sources
// (and its CUTLASS submodule, which the weight-gradient products of its backward use) are read from that checkout
// at build time and are not part of this repository.
//
// Conventions: half precision (tiny-cuda-nn's network_precision_t with TCNN_HALF_PRECISION=1); no biases. params
// [n_params] in tiny-cuda-nn's layout, which is fused_mlp's with use_bias=False (docs/fused_mlp.md): matrices
// row-major [outputs, inputs], the first one's inputs and the last one's outputs padded to 16. x [N, n_input]
// row-major (a column-major GPUMatrix of n_input rows), or feature-major [n_input, N] where a function takes
// `feature_major` (dx then too), n_input a multiple of 16 (tiny-cuda-nn's requirement);
// y and dy [N, 16 * ceil(n_output / 16)] row-major, the padded output width, as FullyFusedMLP writes and reads
// them. N a multiple of 256 (BATCH_SIZE_GRANULARITY). Activations by fused_mlp's codes
// (csrc/shared/fused_mlp_math.h: 0 none, 1 relu, 2 leaky_relu, 3 sigmoid, 4 exponential, 5 softplus).
//
// tiny-cuda-nn's runtime-compiled fusion (`set_jit_fusion`, off by default and never turned on here) is not built:
// its code generators live in src/network.cu beside CutlassMLP, and its kernel class in the NVRTC part of
// src/rtc_kernel.cu. The definitions at the end of this file refuse, so that the library links without them.
//
// One network object per configuration is created on the first call and kept (its memory arena too), so the timed
// calls do no allocation. Each function runs on the legacy default stream and returns cudaGetLastError() (or -1 for
// a configuration FullyFusedMLP does not have).
#include <tiny-cuda-nn/networks/fully_fused_mlp.h>
#include <tiny-cuda-nn/rtc_kernel.h>

#include <cuda_fp16.h>

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>

namespace {

using T = tcnn::network_precision_t;
using Key = std::tuple<uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t>;

tcnn::Activation activation(uint32_t code) {
  switch (code) {
    case 1: return tcnn::Activation::ReLU;
    case 2: return tcnn::Activation::LeakyReLU;
    case 3: return tcnn::Activation::Sigmoid;
    case 4: return tcnn::Activation::Exponential;
    case 5: return tcnn::Activation::Softplus;
    default: return tcnn::Activation::None;
  }
}

template <uint32_t kWidth>
std::unique_ptr<tcnn::Network<T>> make(uint32_t n_input, uint32_t n_output, uint32_t n_hidden, uint32_t act,
                                       uint32_t out_act) {
  return std::make_unique<tcnn::FullyFusedMLP<T, kWidth>>(n_input, n_output, n_hidden, activation(act),
                                                          activation(out_act));
}

// The network of this configuration, parameters (and gradients, when given) bound.
tcnn::Network<T>* network(T* params, T* grads, uint32_t n_input, uint32_t width, uint32_t n_output,
                          uint32_t n_hidden, uint32_t act, uint32_t out_act) {
  static std::map<Key, std::unique_ptr<tcnn::Network<T>>> cache;
  auto& net = cache[Key{n_input, width, n_output, n_hidden, act, out_act}];
  if (!net) {
    switch (width) {
      case 16: net = make<16>(n_input, n_output, n_hidden, act, out_act); break;
      case 32: net = make<32>(n_input, n_output, n_hidden, act, out_act); break;
      case 64: net = make<64>(n_input, n_output, n_hidden, act, out_act); break;
      case 128: net = make<128>(n_input, n_output, n_hidden, act, out_act); break;
      default: return nullptr;
    }
  }
  net->set_params(params, params, grads);
  return net.get();
}

// The layout of x and dx: 0 row-major [N, n_input] (a column-major GPUMatrix), 1 feature-major [n_input, N] (a
// row-major one: the hash grid's SoA output, as tiny-cuda-nn's NeRF feeds its density network).
tcnn::MatrixLayout layout_of(uint32_t feature_major) { return feature_major ? tcnn::RM : tcnn::CM; }

// The training forward's context of each configuration, kept from tfmo_tcnn_mlp_forward for tfmo_tcnn_mlp_backward.
std::map<Key, std::unique_ptr<tcnn::Context>>& contexts() {
  static std::map<Key, std::unique_ptr<tcnn::Context>> c;
  return c;
}

}  // namespace

extern "C" {
// y = the network's inference output (FullyFusedMLP::inference_mixed_precision: its inference kernel).
int tfmo_tcnn_mlp_inference(T* params, const T* x, T* y, uint32_t n, uint32_t n_input, uint32_t width,
                            uint32_t n_output, uint32_t n_hidden, uint32_t act, uint32_t out_act) {
  tcnn::Network<T>* net = network(params, nullptr, n_input, width, n_output, n_hidden, act, out_act);
  if (!net) return -1;
  const tcnn::GPUMatrixDynamic<T> in(const_cast<T*>(x), n_input, n, tcnn::CM);
  tcnn::GPUMatrixDynamic<T> out(y, net->padded_output_width(), n, tcnn::CM);
  net->inference_mixed_precision(nullptr, in, out, true);
  return (int)cudaGetLastError();
}

// The training forward alone (keeping what the backward reads), x in the given layout: y.
int tfmo_tcnn_mlp_forward(T* params, T* grads, const T* x, T* y, uint32_t n, uint32_t n_input, uint32_t width,
                          uint32_t n_output, uint32_t n_hidden, uint32_t act, uint32_t out_act,
                          uint32_t feature_major) {
  tcnn::Network<T>* net = network(params, grads, n_input, width, n_output, n_hidden, act, out_act);
  if (!net) return -1;
  const tcnn::GPUMatrixDynamic<T> in(const_cast<T*>(x), n_input, n, layout_of(feature_major));
  tcnn::GPUMatrixDynamic<T> out(y, net->padded_output_width(), n, tcnn::CM);
  contexts()[Key{n_input, width, n_output, n_hidden, act, out_act}] = net->forward(nullptr, in, &out, false, true);
  return (int)cudaGetLastError();
}

// The backward of the last tfmo_tcnn_mlp_forward of this configuration (on the same x and y): dx in x's layout and
// grads (overwritten).
int tfmo_tcnn_mlp_backward(T* params, T* grads, const T* x, const T* y, const T* dy, T* dx, uint32_t n,
                           uint32_t n_input, uint32_t width, uint32_t n_output, uint32_t n_hidden, uint32_t act,
                           uint32_t out_act, uint32_t feature_major) {
  tcnn::Network<T>* net = network(params, grads, n_input, width, n_output, n_hidden, act, out_act);
  auto ctx = contexts().find(Key{n_input, width, n_output, n_hidden, act, out_act});
  if (!net || ctx == contexts().end() || !ctx->second) return -1;
  const tcnn::GPUMatrixDynamic<T> in(const_cast<T*>(x), n_input, n, layout_of(feature_major));
  const tcnn::GPUMatrixDynamic<T> out(const_cast<T*>(y), net->padded_output_width(), n, tcnn::CM);
  const tcnn::GPUMatrixDynamic<T> d_out(const_cast<T*>(dy), net->padded_output_width(), n, tcnn::CM);
  tcnn::GPUMatrixDynamic<T> d_in(dx, n_input, n, layout_of(feature_major));
  net->backward(nullptr, *ctx->second, in, out, d_out, &d_in, false, tcnn::GradientMode::Overwrite);
  return (int)cudaGetLastError();
}

// The training forward (keeping what the backward reads) then the backward: y, dx and grads (overwritten).
int tfmo_tcnn_mlp_train(T* params, T* grads, const T* x, const T* dy, T* y, T* dx, uint32_t n, uint32_t n_input,
                        uint32_t width, uint32_t n_output, uint32_t n_hidden, uint32_t act, uint32_t out_act) {
  tcnn::Network<T>* net = network(params, grads, n_input, width, n_output, n_hidden, act, out_act);
  if (!net) return -1;
  const tcnn::GPUMatrixDynamic<T> in(const_cast<T*>(x), n_input, n, tcnn::CM);
  tcnn::GPUMatrixDynamic<T> out(y, net->padded_output_width(), n, tcnn::CM);
  const tcnn::GPUMatrixDynamic<T> d_out(const_cast<T*>(dy), net->padded_output_width(), n, tcnn::CM);
  tcnn::GPUMatrixDynamic<T> d_in(dx, n_input, n, tcnn::CM);
  auto ctx = net->forward(nullptr, in, &out, false, true);
  net->backward(nullptr, *ctx, in, out, d_out, &d_in, false, tcnn::GradientMode::Overwrite);
  return (int)cudaGetLastError();
}
}

namespace tcnn {
namespace {
[[noreturn]] void no_jit() { throw std::runtime_error{"tfmo_tcnn: tiny-cuda-nn's JIT fusion is not built"}; }
}  // namespace
CudaRtcKernel::CudaRtcKernel(const std::string&, const std::string&,
                             const std::vector<std::pair<std::string, const char*>>&) {
  no_jit();
}
CudaRtcKernel::~CudaRtcKernel() {}
void CudaRtcKernel::clear() {}
void CudaRtcKernel::set(CUfunction_attribute, int) { no_jit(); }
template <>
std::string generate_mlp_device_code<__half>(uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, Activation,
                                             Activation) {
  no_jit();
}
template <>
std::string generate_backward_mlp_device_code<__half>(uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t,
                                                      Activation, Activation) {
  no_jit();
}
template <>
std::unique_ptr<CudaRtcKernel> generate_mlp_convert_params_to_jit_layout_kernel<__half>(uint32_t, uint32_t, uint32_t,
                                                                                       uint32_t) {
  no_jit();
}
template <>
std::unique_ptr<CudaRtcKernel> generate_mlp_convert_params_from_jit_layout_kernel<__half>(uint32_t, uint32_t,
                                                                                         uint32_t, uint32_t) {
  no_jit();
}
}  // namespace tcnn
