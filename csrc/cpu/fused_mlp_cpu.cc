// CPU kernels of FusedMlp and FusedMlpGrad (semantics: csrc/ops/fused_mlp_op.cc; parameter layout:
// csrc/ops/fused_mlp_args.h; activations: csrc/shared/fused_mlp_math.h).
//
// Structure:
//  - rows in blocks of BlockRows(width) (16 KB of float32 activations per layer): a block goes through every
//    layer, forward or backward, before the next block starts, so its activations stay in L1/L2 and only x, y,
//    dy and, at width 128 with float32 products, the kept hidden activations cross memory (otherwise the backward
//    computes a block's hidden activations again first: KeepActivations); blocks split among the project pool's
//    threads;
//  - the parameters are converted to float32 once per call (and, for the forward, every matrix transposed to
//    [inputs, outputs] so that the inner loops run over consecutive outputs);
//  - every product is Dense: out[b][o] = bias[o] + sum_i in[b][i] M[i][o], a chain of fused multiply-adds in order
//    of i (register tiles; the widths are run-time values, so one build of each product serves every width; built
//    for the baseline ISA, AVX2+FMA and AVX-512, which give the same bits: csrc/cpu/fused_mlp_cpu_isa.h); the
//    activations and their derivatives are loops instantiated once per activation;
//  - products = "bfloat16": the same structure with DenseBf16 / AccumulateOuterBf16 (VDPBF16PS's definition on
//    every build but amx, whose AMX tiles round their sums their own way); their operands are rounded to bfloat16 (ToBf16) where they are made: the matrices once per call,
//    in pairs along the summed index; a layer's input rows when it starts; for the weight gradient, g and the layer's
//    input rows in pairs of rows. Biases are read flushed (FlushTiny); activations, their derivatives, bias
//    gradients and every stored value stay float32;
//  - backward per block, last matrix first: g = dL/d(pre-activation) of the layer's outputs, then
//    dW += g^T h_prev, db += column sums of g, dh_prev = g W, g_prev = dh_prev * f'(h_prev) (the activation
//    derivatives from the kept post-activation values, fused into the same pass);
//  - weight and bias gradients: sums over rows in a fixed order whatever the thread count. The blocks are cut into
//    Parts(blocks) contiguous parts (a function of N and width only); each part sums its blocks in row order into
//    its own float32 buffer of P values, and the parts are added in part order. The per-row outputs (y, hidden, dx)
//    depend on their own row only.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/half.h"
#include "common/huge_pages.h"
#include "common/op_names.h"
#include "common/tfc.h"
#include "common/thread_pool.h"
#include "cpu/fused_mlp_cpu_isa.h"
#include "ops/fused_mlp_args.h"
#include "shared/fused_mlp_math.h"

namespace {

using tfmo::fused_mlp::Call;
using tfmo::fused_mlp::Config;
using tfmo::fused_mlp::Layout;

using tfmo::fused_mlp::cpu::AccumulateOuter;
using tfmo::fused_mlp::cpu::AccumulateOuterBf16;
using tfmo::fused_mlp::cpu::Dense;
using tfmo::fused_mlp::cpu::DenseBf16;
using tfmo::fused_mlp::cpu::FlushTiny;
using tfmo::fused_mlp::cpu::kRowPad;
using tfmo::fused_mlp::cpu::PairBlockRows;
using tfmo::fused_mlp::cpu::RoundBf16;
using tfmo::fused_mlp::cpu::ToBf16;

constexpr int64_t kMaxParts = 64;

// Rows per block: 16 KB of float32 activations per layer buffer (8 KB at width 16).
int BlockRows(int width) { return width <= 32 ? 128 : (width == 64 ? 64 : 32); }

// Parts of the fixed-order weight-gradient sum for `blocks` row blocks (independent of the thread count).
int64_t Parts(int64_t blocks) { return std::min(blocks, kMaxParts); }

// f(r0, n, rows_pad) for the row blocks of part `part` of `parts` (blocks of rows_per_block of the N rows, in
// order): the block's first row, its rows and its rows padded to a multiple of kRowPad.
template <class F>
void ForPartBlocks(int64_t part, int64_t parts, int64_t blocks, int64_t rows_per_block, int64_t N, const F& f) {
  for (int64_t blk = part * blocks / parts; blk < (part + 1) * blocks / parts; ++blk) {
    const int64_t r0 = blk * rows_per_block;
    const int n = static_cast<int>(std::min<int64_t>(rows_per_block, N - r0));
    f(r0, n, (n + kRowPad - 1) / kRowPad * kRowPad);
  }
}

using tfmo::Load;
using tfmo::Store;

// v[i] = fm_activate(kAct, v[i]) for i < count (the activation a compile-time constant inside the loop).
template <int kAct>
void ActivateLoop(float* v, int64_t count) {
  for (int64_t i = 0; i < count; ++i) v[i] = fm_activate(kAct, v[i]);
}
void Activate(int act, float* v, int64_t count) {
  switch (act) {
    case FM_ACT_RELU: return ActivateLoop<FM_ACT_RELU>(v, count);
    case FM_ACT_LEAKY_RELU: return ActivateLoop<FM_ACT_LEAKY_RELU>(v, count);
    case FM_ACT_SIGMOID: return ActivateLoop<FM_ACT_SIGMOID>(v, count);
    case FM_ACT_EXPONENTIAL: return ActivateLoop<FM_ACT_EXPONENTIAL>(v, count);
    case FM_ACT_SOFTPLUS: return ActivateLoop<FM_ACT_SOFTPLUS>(v, count);
    default: return;
  }
}

// dh[b][i] *= f'(h[b][i]) for b < n, i < width (h rows of stride ld); rows n .. rows_pad of dh are zeroed.
template <int kAct>
void ChainLoop(float* dh, const float* h, int64_t ld, int width, int n, int rows_pad) {
  for (int b = 0; b < n; ++b)
    for (int i = 0; i < width; ++i)
      dh[static_cast<int64_t>(b) * width + i] *= fm_activation_derivative(kAct, h[b * ld + i]);
  std::fill(dh + static_cast<int64_t>(n) * width, dh + static_cast<int64_t>(rows_pad) * width, 0.0f);
}
void Chain(int act, float* dh, const float* h, int64_t ld, int width, int n, int rows_pad) {
  switch (act) {
    case FM_ACT_RELU: return ChainLoop<FM_ACT_RELU>(dh, h, ld, width, n, rows_pad);
    case FM_ACT_LEAKY_RELU: return ChainLoop<FM_ACT_LEAKY_RELU>(dh, h, ld, width, n, rows_pad);
    case FM_ACT_SIGMOID: return ChainLoop<FM_ACT_SIGMOID>(dh, h, ld, width, n, rows_pad);
    case FM_ACT_EXPONENTIAL: return ChainLoop<FM_ACT_EXPONENTIAL>(dh, h, ld, width, n, rows_pad);
    case FM_ACT_SOFTPLUS: return ChainLoop<FM_ACT_SOFTPLUS>(dh, h, ld, width, n, rows_pad);
    default: return ChainLoop<FM_ACT_NONE>(dh, h, ld, width, n, rows_pad);
  }
}

// g[b][o] = dy[b][o] * f_out'(y[b][o]) for b < n, o < n_out (dy and y rows of n_out values), g [rows_pad][out_pad]
// zero outside the real rows and outputs.
template <int kAct, typename T>
void OutputGradLoop(const T* dy, const T* y, int n_out, int out_pad, int n, int rows_pad, float* g) {
  for (int b = 0; b < n; ++b) {
    float* row = g + static_cast<int64_t>(b) * out_pad;
    const int64_t k = static_cast<int64_t>(b) * n_out;
    for (int o = 0; o < n_out; ++o) row[o] = Load(dy + k + o) * fm_activation_derivative(kAct, Load(y + k + o));
    std::fill(row + n_out, row + out_pad, 0.0f);
  }
  std::fill(g + static_cast<int64_t>(n) * out_pad, g + static_cast<int64_t>(rows_pad) * out_pad, 0.0f);
}
template <typename T>
void OutputGrad(int act, const T* dy, const T* y, int n_out, int out_pad, int n, int rows_pad, float* g) {
  switch (act) {
    case FM_ACT_RELU: return OutputGradLoop<FM_ACT_RELU>(dy, y, n_out, out_pad, n, rows_pad, g);
    case FM_ACT_LEAKY_RELU: return OutputGradLoop<FM_ACT_LEAKY_RELU>(dy, y, n_out, out_pad, n, rows_pad, g);
    case FM_ACT_SIGMOID: return OutputGradLoop<FM_ACT_SIGMOID>(dy, y, n_out, out_pad, n, rows_pad, g);
    case FM_ACT_EXPONENTIAL: return OutputGradLoop<FM_ACT_EXPONENTIAL>(dy, y, n_out, out_pad, n, rows_pad, g);
    case FM_ACT_SOFTPLUS: return OutputGradLoop<FM_ACT_SOFTPLUS>(dy, y, n_out, out_pad, n, rows_pad, g);
    default: return OutputGradLoop<FM_ACT_NONE>(dy, y, n_out, out_pad, n, rows_pad, g);
  }
}

// db[o] += g[b][o] for b < n in order (one float32 sum per column, rows in order), o < cols <= kMaxWidth; g is
// [n][ld]. The sums run in a local copy: in place, the compiler must assume that db may alias g, and the loop over
// columns stays scalar.
constexpr int kMaxWidth = 128;
void AddColumnSums(const float* g, int ld, int n, int cols, float* db) {
  float s[kMaxWidth];
  std::copy_n(db, cols, s);
  for (int b = 0; b < n; ++b) {
    const float* row = g + static_cast<int64_t>(b) * ld;
    for (int o = 0; o < cols; ++o) s[o] += row[o];
  }
  std::copy_n(s, cols, db);
}

// Rows [r0, r0 + n) of x (row r's input i at r * row_stride + i * input_stride: Call::row_stride) as float32
// [rows_pad][in_pad], zero-padded (columns and rows).
template <typename T>
void LoadRows(const T* x, const Call& call, int64_t r0, int n, int rows_pad, float* out) {
  const Layout& l = call.layout;
  const int64_t rs = call.row_stride(), is = call.input_stride();
  if (is == 1) {
    for (int b = 0; b < n; ++b) {
      float* o = out + static_cast<int64_t>(b) * l.in_pad;
      const T* src = x + (r0 + b) * rs;
      for (int i = 0; i < l.n_input; ++i) o[i] = Load(src + i);
      std::fill(o + l.n_input, o + l.in_pad, 0.0f);
    }
  } else {  // feature-major: each input's n values are consecutive
    std::fill(out, out + static_cast<int64_t>(n) * l.in_pad, 0.0f);
    for (int i = 0; i < l.n_input; ++i)
      for (int b = 0; b < n; ++b) out[b * l.in_pad + i] = Load(x + i * is + r0 + b);
  }
  std::fill(out + static_cast<int64_t>(n) * l.in_pad, out + static_cast<int64_t>(rows_pad) * l.in_pad, 0.0f);
}

// Rows [r0, r0 + rows) of x read in place as the float32 [rows][in_pad] block LoadRows would make, or null where
// they are not laid out so (float16, feature-major, or an input width that is not a multiple of 16).
template <typename T>
const float* RowsInPlace(const T* x, const Call& call, int64_t r0) {
  if constexpr (std::is_same_v<T, float>) {
    if (call.input_stride() == 1 && call.layout.n_input == call.layout.in_pad) return x + r0 * call.layout.in_pad;
  }
  (void)x, (void)call, (void)r0;
  return nullptr;
}

// dx's rows [r0, r0 + n) from dh [rows][in_pad] (dx strided like x).
template <typename T>
void StoreInputRows(const float* dh, const Call& call, int64_t r0, int n, T* dx) {
  const Layout& l = call.layout;
  const int64_t rs = call.row_stride(), is = call.input_stride();
  if (is == 1) {
    for (int b = 0; b < n; ++b)
      for (int i = 0; i < l.n_input; ++i) dx[(r0 + b) * rs + i] = Store<T>(dh[b * l.in_pad + i]);
  } else {
    for (int i = 0; i < l.n_input; ++i)
      for (int b = 0; b < n; ++b) dx[i * is + r0 + b] = Store<T>(dh[b * l.in_pad + i]);
  }
}

// The parameters as float32, in their layout.
template <typename T>
std::vector<float> ParamsAsFloat(const T* p, int64_t count) {
  std::vector<float> out(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) out[k] = Load(p + k);
  return out;
}

// Matrix m (row-major [rows][cols] at w) as bfloat16 pairs along its rows (the summed index when m multiplies from
// the right, x m: dh = g W): element (2p + e, c) at out[(p * cols + c) * 2 + e]. rows is even.
void PairRows(const float* w, int64_t rows, int64_t cols, uint16_t* out) {
  for (int64_t p = 0; p < rows / 2; ++p)
    for (int64_t c = 0; c < cols; ++c)
      for (int e = 0; e < 2; ++e) out[(p * cols + c) * 2 + e] = ToBf16(w[(2 * p + e) * cols + c]);
}

// ---- forward ------------------------------------------------------------------------------------------------

// What a block's forward reads besides x: every matrix transposed to [cols][rows] at its offset, the biases padded
// to the matrix's rows (zeros without bias; flushed for bfloat16 products) and, for bfloat16 products, the
// transposed matrices in bfloat16 pairs along their inputs.
struct ForwardWeights {
  std::vector<float> wt, bias;
  std::vector<uint16_t> wp;
  bool bf16 = false;

  ForwardWeights(const Call& call, const float* pf) {
    const Layout& l = call.layout;
    const int W = l.width, M = l.n_matrices;
    wt.resize(static_cast<size_t>(l.weight_offset[M - 1] + l.rows[M - 1] * l.cols[M - 1]));
    bias.assign(static_cast<size_t>(M) * W, 0.0f);
    for (int m = 0; m < M; ++m) {
      const float* w = pf + l.weight_offset[m];
      float* t = wt.data() + l.weight_offset[m];
      for (int64_t o = 0; o < l.rows[m]; ++o)
        for (int64_t i = 0; i < l.cols[m]; ++i) t[i * l.rows[m] + o] = w[o * l.cols[m] + i];
      const int64_t real = m == M - 1 ? l.n_output : W;
      if (l.use_bias) std::copy_n(pf + l.bias_offset[m], real, bias.data() + static_cast<int64_t>(m) * W);
    }
    bf16 = call.cfg->products == tfmo::fused_mlp::kProductsBfloat16;
    if (!bf16) return;
    wp.resize(wt.size());
    for (int m = 0; m < M; ++m)
      PairRows(wt.data() + l.weight_offset[m], l.cols[m], l.rows[m], wp.data() + l.weight_offset[m]);
    for (float& b : bias) b = FlushTiny(b);
  }

  // Layer m of a block: out [rows_pad][rows_m] = f(in [rows_pad][cols_m] W_m^T + b_m) (f on the first n rows: the
  // others are padding, which no real row reads); a16 is bfloat16 scratch of rows_pad * cols_m values.
  void Layer(const Call& call, int m, const float* in, int n, int rows_pad, uint16_t* a16, float* out) const {
    const Layout& l = call.layout;
    const int cols = static_cast<int>(l.cols[m]), r = static_cast<int>(l.rows[m]);
    const float* b = bias.data() + static_cast<int64_t>(m) * l.width;
    if (bf16) {
      RoundBf16(in, static_cast<int64_t>(rows_pad) * cols, a16);
      DenseBf16(a16, cols, wp.data() + l.weight_offset[m], r, b, out, rows_pad);
    } else {
      Dense(in, cols, wt.data() + l.weight_offset[m], r, b, out, rows_pad);
    }
    const Config& cfg = *call.cfg;
    Activate(m == l.n_matrices - 1 ? cfg.output_activation : cfg.activation, out, static_cast<int64_t>(n) * r);
  }
};

template <typename T>
void Forward(const Call& call, T* y, float* hidden) {
  const Layout& l = call.layout;
  const int64_t N = call.n;
  const int W = l.width, M = l.n_matrices;
  const std::vector<float> pf = ParamsAsFloat(call.params.data<T>(), l.total);
  const ForwardWeights fw(call, pf.data());
  const bool bf16 = fw.bf16;
  const int rows_per_block = BlockRows(W);
  const int64_t blocks = (N + rows_per_block - 1) / rows_per_block;
  // Contiguous runs of blocks, a few per thread; their scratch is allocated here, before any parallel work (an
  // allocation failure then surfaces on this thread).
  const int64_t chunks = std::min<int64_t>(blocks, 4 * static_cast<int64_t>(tfmo::NumThreads()));
  const size_t buf = static_cast<size_t>(rows_per_block) * W;
  std::vector<float> scratch(static_cast<size_t>(chunks) * 2 * buf);
  std::vector<uint16_t> scratch16(bf16 ? static_cast<size_t>(chunks) * buf : 0);
  tfmo::ParallelParts(chunks, [&](int64_t chunk) {
    float* a = scratch.data() + chunk * 2 * buf;
    float* c = a + buf;
    uint16_t* a16 = bf16 ? scratch16.data() + chunk * buf : nullptr;
    ForPartBlocks(chunk, chunks, blocks, rows_per_block, N, [&](int64_t r0, int n, int rows_pad) {
      // The first layer reads x in place where it can (a whole block: the products read rows_pad rows).
      const float* in = n == rows_pad ? RowsInPlace(call.x.data<T>(), call, r0) : nullptr;
      if (!in) {
        LoadRows(call.x.data<T>(), call, r0, n, rows_pad, a);
        in = a;
      }
      for (int m = 0; m < M; ++m) {
        float* out = in == c ? a : c;
        fw.Layer(call, m, in, n, rows_pad, a16, out);
        if (hidden && m < M - 1)
          std::memcpy(hidden + (static_cast<int64_t>(m) * N + r0) * W, out, sizeof(float) * n * W);
        in = out;
      }
      for (int b = 0; b < n; ++b)
        for (int o = 0; o < l.n_output; ++o) y[(r0 + b) * l.n_output + o] = Store<T>(in[b * l.out_pad + o]);
    });
  });
}

// Whether a training forward keeps the hidden activations for the gradient. Without them (hidden [0, N, width]) the
// gradient kernel computes each block's activations again, in cache, instead of this kernel writing them to memory
// and the gradient reading them back: that is the faster but at width 128 with float32 products
// (bench/fused_mlp_activations.py; docs/fused_mlp.md, "Kept activations"). TF_METAL_OPS_FUSED_MLP_KEEP_ACTIVATIONS
// (read once): "auto" (the default: keep at width 128 with float32 products), "always" or "never".
bool KeepActivations(const Config& cfg) {
  static const int mode = [] {
    const char* v = std::getenv("TF_METAL_OPS_FUSED_MLP_KEEP_ACTIVATIONS");
    if (v == nullptr || v[0] == '\0' || std::strcmp(v, "auto") == 0) return 0;
    if (std::strcmp(v, "always") == 0) return 1;
    if (std::strcmp(v, "never") == 0) return 2;
    std::fprintf(stderr,
                 "tf_metal_ops: error: TF_METAL_OPS_FUSED_MLP_KEEP_ACTIVATIONS=%s is not one of auto, always, never; "
                 "the fused-MLP CPU kernel uses auto\n",
                 v);
    return 0;
  }();
  return mode == 1 || (mode == 0 && cfg.width >= 128 && cfg.products != tfmo::fused_mlp::kProductsBfloat16);
}

void ForwardCompute(void* state, TF_OpKernelContext* ctx) {
  Call call;
  if (!tfmo::fused_mlp::PrepareForward(ctx, state, &call)) return;
  const Config& cfg = *call.cfg;
  tfmo::TensorRef y, hidden;
  const bool keep = cfg.training && KeepActivations(cfg);
  const int64_t kept = keep ? cfg.n_hidden_layers : 0;
  if (!tfmo::AllocateOutput(ctx, 0, cfg.dtype, {call.n, static_cast<int64_t>(cfg.n_output)}, &y) ||
      !tfmo::AllocateOutput(ctx, 1, TF_FLOAT, {kept, call.n, static_cast<int64_t>(cfg.width)}, &hidden))
    return;
  if (call.n == 0) return;
  float* h = keep ? hidden.data<float>() : nullptr;
  tfmo::AdviseHugePages(y);
  tfmo::AdviseHugePages(hidden);
  try {
    if (cfg.dtype == TF_HALF) Forward<uint16_t>(call, y.data<uint16_t>(), h);
    else Forward<float>(call, y.data<float>(), h);
  } catch (const std::bad_alloc&) {
    tfmo::Fail(ctx, TF_RESOURCE_EXHAUSTED, "fused_mlp: out of memory for %lld rows", static_cast<long long>(call.n));
  }
}

// ---- backward -----------------------------------------------------------------------------------------------

// dy, y, x, hidden -> dx and the float32 parameter gradient `grad` [P].
template <typename T>
void Backward(const Call& call, T* dx, float* grad) {
  const Config& cfg = *call.cfg;
  const Layout& l = call.layout;
  const int64_t N = call.n, P = l.total;
  const int W = l.width, M = l.n_matrices;
  const std::vector<float> pf = ParamsAsFloat(call.params.data<T>(), P);
  // Without kept activations (hidden [0, N, width]) every block computes its own again first, exactly as the
  // forward did (the same layers on the same block rows: the same bits), into `acts`.
  const bool recompute = !call.hidden_kept;
  std::optional<ForwardWeights> fw;
  if (recompute) fw.emplace(call, pf.data());
  // bfloat16 products: every matrix in pairs along its rows (dh = g W sums over them).
  const bool bf16 = cfg.products == tfmo::fused_mlp::kProductsBfloat16;
  std::vector<uint16_t> wp(bf16 ? static_cast<size_t>(l.weight_offset[M - 1] + l.rows[M - 1] * l.cols[M - 1]) : 0);
  for (int m = 0; bf16 && m < M; ++m)
    PairRows(pf.data() + l.weight_offset[m], l.rows[m], l.cols[m], wp.data() + l.weight_offset[m]);
  const T* dy = call.dy.data<T>();
  const T* y = call.y.data<T>();
  const float* hidden = call.hidden.data<float>();
  const int rows_per_block = BlockRows(W);
  const int64_t blocks = (N + rows_per_block - 1) / rows_per_block;
  const int64_t parts = Parts(blocks);
  // Per part: its P partial sums and three block buffers (x, g, dh), plus M - 1 for the activations computed again,
  // allocated before any parallel work.
  const size_t buf = static_cast<size_t>(rows_per_block) * W;
  const int act_buffers = recompute ? M - 1 : 0;
  // bfloat16 products: three more (g rounded; g and the layer's input in pairs of rows).
  std::vector<float> partial(static_cast<size_t>(parts) * P),
      scratch(static_cast<size_t>(parts) * (3 + act_buffers) * buf);
  std::vector<uint16_t> scratch16(bf16 ? static_cast<size_t>(parts) * 3 * buf : 0);
  tfmo::ParallelParts(parts, [&](int64_t part) {
    float* acc = partial.data() + part * P;
    std::fill(acc, acc + P, 0.0f);
    float* xb = scratch.data() + part * (3 + act_buffers) * buf;
    float* g = xb + buf;
    float* dh = g + buf;
    float* acts = dh + buf;  // recompute: layer m's activations at acts + (m - 1) * buf, m = 1 .. M - 1
    uint16_t* g16 = bf16 ? scratch16.data() + part * 3 * buf : nullptr;
    uint16_t* g_pairs = bf16 ? g16 + buf : nullptr;
    uint16_t* prev_pairs = bf16 ? g16 + 2 * buf : nullptr;
    ForPartBlocks(part, parts, blocks, rows_per_block, N, [&](int64_t r0, int n, int rows_pad) {
      // x's rows (the first matrix's gradient reads rows < n only, so x serves in place whenever it is laid out so;
      // the forward computed again reads rows_pad rows).
      const float* x_rows = !recompute || n == rows_pad ? RowsInPlace(call.x.data<T>(), call, r0) : nullptr;
      if (!x_rows) {
        LoadRows(call.x.data<T>(), call, r0, n, rows_pad, xb);
        x_rows = xb;
      }
      // Layer m's activations (m = 1 .. M - 1) at h_rows + (m - 1) * h_stride, rows of W values.
      const float* h_rows = recompute ? acts : hidden + r0 * W;
      const int64_t h_stride = recompute ? static_cast<int64_t>(buf) : N * W;
      for (int m = 0; recompute && m + 1 < M; ++m)
        fw->Layer(call, m, m == 0 ? x_rows : acts + (m - 1) * buf, n, rows_pad, g16, acts + m * buf);
      OutputGrad(cfg.output_activation, dy + r0 * l.n_output, y + r0 * l.n_output, l.n_output, l.out_pad, n,
                 rows_pad, g);
      for (int m = M - 1; m >= 0; --m) {
        const int r = static_cast<int>(l.rows[m]), cols = static_cast<int>(l.cols[m]);
        const float* prev = m > 0 ? h_rows + (m - 1) * h_stride : x_rows;
        const int64_t ld = m > 0 ? W : l.in_pad;
        if (bf16) {
          PairBlockRows(g, r, r, n, g_pairs);
          PairBlockRows(prev, ld, cols, n, prev_pairs);
          AccumulateOuterBf16(g_pairs, r, prev_pairs, cols, (n + 1) / 2, acc + l.weight_offset[m]);
        } else {
          AccumulateOuter(g, r, prev, ld, cols, n, acc + l.weight_offset[m]);
        }
        if (l.use_bias) AddColumnSums(g, r, n, m == M - 1 ? l.n_output : W, acc + l.bias_offset[m]);
        // dh = g W_m: Dense with W_m [r][cols] read as [inputs = r][outputs = cols].
        if (bf16) {
          RoundBf16(g, static_cast<int64_t>(rows_pad) * r, g16);
          DenseBf16(g16, r, wp.data() + l.weight_offset[m], cols, nullptr, dh, rows_pad);
        } else {
          Dense(g, r, pf.data() + l.weight_offset[m], cols, nullptr, dh, rows_pad);
        }
        if (m > 0) {
          Chain(cfg.activation, dh, prev, ld, W, n, rows_pad);
          std::swap(g, dh);
        } else {
          StoreInputRows(dh, call, r0, n, dx);
        }
      }
    });
  });
  // The parts in part order, for every parameter.
  tfmo::ParallelFor(P, 4096, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      float s = partial[k];
      for (int64_t part = 1; part < parts; ++part) s += partial[part * P + k];
      grad[k] = s;
    }
  });
}

void GradCompute(void* state, TF_OpKernelContext* ctx) {
  Call call;
  if (!tfmo::fused_mlp::PrepareGrad(ctx, state, &call)) return;
  const Config& cfg = *call.cfg;
  const int64_t P = call.layout.total;
  tfmo::TensorRef dx, dparams;
  if (!tfmo::AllocateOutput(ctx, 0, cfg.dtype, call.x_shape(), &dx) ||
      !tfmo::AllocateOutput(ctx, 1, cfg.dtype, {P}, &dparams))
    return;
  const bool half = cfg.dtype == TF_HALF;
  tfmo::AdviseHugePages(dx);
  try {
    std::vector<float> tmp(half ? static_cast<size_t>(P) : 0);
    float* grad = half ? tmp.data() : dparams.data<float>();
    if (call.n == 0) {
      std::fill(grad, grad + P, 0.0f);
    } else if (half) {
      Backward<uint16_t>(call, dx.data<uint16_t>(), grad);
    } else {
      Backward<float>(call, dx.data<float>(), grad);
    }
    if (half) {
      uint16_t* o = dparams.data<uint16_t>();
      for (int64_t k = 0; k < P; ++k) o[k] = tfmo::FloatToHalf(grad[k]);
    }
  } catch (const std::bad_alloc&) {
    tfmo::Fail(ctx, TF_RESOURCE_EXHAUSTED, "fused_mlp (gradient): out of memory for %lld rows",
               static_cast<long long>(call.n));
  }
}

const tfmo::OnLoad kRegister([] { tfmo::fused_mlp::RegisterKernels("CPU", &ForwardCompute, &GradCompute); });

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// The builds (csrc/cpu/fused_mlp_cpu_isa.h) and the choice between them, once per process, by TF_METAL_OPS_FUSED_MLP_ISA
// (common/isa_choice.h); diagnostics (tf_metal_ops.diagnostics.cpu_paths) count product calls.
TFMO_ISA_FAMILY(tfmo::fused_mlp::cpu, tfmo_fused_mlp_cpu_paths, "TF_METAL_OPS_FUSED_MLP_ISA",
                "the fused-MLP CPU kernels use", kIsaCount)
