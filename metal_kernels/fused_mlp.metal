// Metal kernels of the fully fused MLP: FusedMlp and FusedMlpGrad (semantics: csrc/ops/fused_mlp_op.cc; parameter
// layout: csrc/ops/fused_mlp_args.h; activations, FmArgs and the threadgroup shape: csrc/shared/fused_mlp_math.h).
// Host: csrc/gpu/fused_mlp_gpu.cc.
//
// Kernels (templates over T = float | half and the width W, instantiated by name below each:
// fused_mlp_forward_w{16,32,64,128}_{float32,float16}, fused_mlp_backward_w..._..., and
// fused_mlp_reduce_{float32,float16}):
//   fused_mlp_forward   x(0) params(1) args(2) -> y(3) hidden(4); args.parts threadgroups of 32 S threads (S =
//                       FM_GPU_SIMDGROUPS(W, T is half)); threadgroup p handles the blocks of 8 S rows
//                       [p blocks / parts, (p + 1) blocks / parts); threadgroup memory: rows(0), weights(1)
//                       (FM_GPU_*_BYTES). hidden [n_matrices - 1, N, W] float is written only when
//                       args.training (else a stand-in buffer is bound).
//   fused_mlp_backward  dy(0) x(1) params(2) y(3) hidden(4) args(5) -> dx(6) partial(7); args.parts threadgroups of
//                       32 S threads; threadgroup memory: g(0), prev(1), weights(2). Threadgroup p handles
//                       the blocks [p blocks / parts, (p + 1) blocks / parts) in order and writes its own partial
//                       parameter gradient, partial[p P .. p P + P) float32 (every value written: no zeroing pass).
//   fused_mlp_reduce    partial(0) args(1) -> dparams(2); grid P: dparams[k] = the parts' partial[p P + k] summed in
//                       part order (0, 1, ...) from 0, rounded to T once.
// Function constants: 0 the hidden layers' activation, 1 the output activation (FM_ACT_*), forward and backward.
//
// Structure:
//  - SIMD group s of a threadgroup owns rows [8 s, 8 s + 8) of the block. Every product is made of 8x8
//    simdgroup_matrix tiles (simdgroup_load / simdgroup_multiply_accumulate / simdgroup_store) with float32
//    accumulators (simdgroup_float8x8): half operands for float16 (half products summed in float), float operands for
//    float32. The activations of a block stay in threadgroup memory across the layers, as T. Bias and activation
//    (fm_activate, the CPU kernel's math) are applied to the accumulators in registers, each lane on its own two
//    elements of every tile (thread_elements(): lane l holds row fm_lane_row(l), columns fm_lane_col(l) and the
//    next, the layout of Apple's GPUs that MLX's GEMMs use; msl_emu and the GPU proxy implement the same), then
//    rounded to T and stored as a tile; hidden keeps the float value before that rounding, y and dx are written
//    from the registers.
//  - The threadgroup buffers' rows are padded by 16 bytes (FM_GPU_TG_PAD; as MLX pads its GEMM tiles), so that the
//    lanes of a tile load, plain or transposed, fall in different banks.
//  - Weights: for W <= 64 every matrix is copied into threadgroup memory once per threadgroup when they all fit next
//    to the row buffers (args.weights_resident; the host decides), else each layer's matrix once per block and layer
//    (params are already T, the product type); at W = 128 the matrix (32 KB as half, 64 KB as float) does not fit
//    Apple's 32 KB next to the activations, so simdgroup_load reads the tiles from device memory (params) directly.
//  - Padding as the CPU kernel: x is padded with zeros to in_pad columns (rows past N are zeros too and are never
//    stored); W_L's padding rows produce outputs that are never stored, and since g is 0 on those columns their
//    gradient is exactly 0, as is that of W_1's padding columns (their inputs are 0).
//  - Backward per block, last matrix first: g = dy f_out'(y) (0 outside the real rows and outputs); per matrix m,
//    dW_m += g^T h_prev (the tiles spread over the SIMD groups; each tile sums the block's rows 8 at a time, in row
//    order, and is loaded from, and stored back to, the threadgroup's partial, so it sums the blocks in block
//    order), db_m += the columns of g summed in row order (one thread per column), dh = g W_m (each SIMD group its
//    rows, in registers), then g_prev = dh f'(h_prev) from the kept hidden (fm_activation_derivative, the CPU
//    kernel's chain), or dx = dh for m = 0. Every sum has a fixed order and the number of parts depends on N and the
//    layout only, so dparams is bitwise the same run to run (always, without any determinism switch).
//  - x and dx are [N][n_input], or [n_input][N] with args.feature_major (fm_x_offset); their tiles are walked along
//    the layout's contiguous axis (fm_load_x).
//  - Offsets into hidden, x, y, dy and dx are 64-bit; rows are 32-bit (the host checks N).
#include <metal_stdlib>
#include <metal_simdgroup_matrix>
using namespace metal;

#include "fused_mlp_math.h"

constant int fm_activation [[function_constant(0)]];
constant int fm_output_activation [[function_constant(1)]];

// The B operand tile (k0 .. k0 + 8) x (n0 .. n0 + 8) of a product with a matrix stored row-major [n][k] (the
// weights, rows = outputs) with `ld` elements per row: the stored matrix transposed. From threadgroup memory when
// TGW, else from device memory.
template <typename T, bool TGW>
TFMO_FN void fm_load_transposed(thread simdgroup_matrix<T, 8, 8>& m, const threadgroup T* tg,
                                const device T* dev, uint ld, uint k0, uint n0) {
  if (TGW) simdgroup_load(m, tg, ld, ulong2(k0, n0), true);
  else simdgroup_load(m, dev, ld, ulong2(k0, n0), true);
}

// The B operand tile (k0 .. k0 + 8) x (n0 .. n0 + 8) of a matrix stored row-major [k][n] with `ld` elements per row.
// x's (and dx's) offset of row `row`'s input i: [n][n_input] row-major, or [n_input][n] with args.feature_major.
TFMO_FN ulong fm_x_offset(constant FmArgs& args, uint row, uint i) {
  return args.feature_major != 0u ? ulong(i) * args.n + row : ulong(row) * args.n_input + i;
}

// (row, col) of the elements first, first + step, ... of a matrix with `cols` columns, stepped without a division.
struct FmWalk {
  uint row, col, drow, dcol, cols;
};
TFMO_FN FmWalk fm_walk(uint first, uint step, uint cols) {
  return FmWalk{first / cols, first % cols, step / cols, step % cols, cols};
}
TFMO_FN void fm_next(thread FmWalk& w) {
  w.row += w.drow;
  w.col += w.dcol;
  if (w.col >= w.cols) {
    w.col -= w.cols;
    ++w.row;
  }
}

// x as T into an R x LD threadgroup tile ([b][i], zeros past N and past n_input; columns below in_pad only), rows
// from row0, by `threads` threads from `first`. The elements are walked along x's contiguous axis (inputs when
// row-major, rows with args.feature_major), so that neighbouring threads touch neighbouring addresses of x.
template <typename T>
TFMO_FN void fm_load_x(threadgroup T* tile, uint LD, const device T* x, constant FmArgs& args, uint row0, uint R,
                       uint first, uint threads) {
  const bool fmaj = args.feature_major != 0u;
  for (FmWalk w = fm_walk(first, threads, fmaj ? R : args.in_pad); w.row < (fmaj ? args.in_pad : R); fm_next(w)) {
    const uint b = fmaj ? w.col : w.row, i = fmaj ? w.row : w.col, row = row0 + b;
    tile[b * LD + i] = row < args.n && i < args.n_input ? x[fm_x_offset(args, row, i)] : T(0);
  }
}

// The row and the first of the two columns of an 8x8 tile that lane l holds in thread_elements().
TFMO_FN uint fm_lane_row(uint l) { return (l >> 4 & 1u) * 4u + (l >> 2 & 1u) * 2u + (l >> 1 & 1u); }
TFMO_FN uint fm_lane_col(uint l) { return (l >> 3 & 1u) * 4u + (l & 1u) * 2u; }

template <typename T, bool TGW>
TFMO_FN void fm_load(thread simdgroup_matrix<T, 8, 8>& m, const threadgroup T* tg, const device T* dev, uint ld,
                     uint k0, uint n0) {
  if (TGW) simdgroup_load(m, tg, ld, ulong2(n0, k0));
  else simdgroup_load(m, dev, ld, ulong2(n0, k0));
}

// Matrix m [rows][cols] from device memory into threadgroup memory with rows `ld` elements apart, by `threads`
// threads from `tid`.
template <typename T>
TFMO_FN void fm_copy_weights(threadgroup T* tg, const device T* wm, uint rows, uint cols, uint ld, uint tid,
                             uint threads) {
  for (FmWalk w = fm_walk(tid, threads, cols); w.row < rows; fm_next(w))
    tg[w.row * ld + w.col] = wm[w.row * cols + w.col];
}

// With args.weights_resident: every matrix into threadgroup memory at args.weight_tg_offset[m], rows padded.
template <typename T>
TFMO_FN void fm_copy_all_weights(threadgroup T* tg, const device T* params, constant FmArgs& args, uint W, uint tid,
                                 uint threads) {
  for (uint m = 0; m < args.n_matrices; ++m) {
    const uint rows = m + 1u == args.n_matrices ? args.out_pad : W, cols = m == 0u ? args.in_pad : W;
    fm_copy_weights(tg + args.weight_tg_offset[m], params + args.weight_offset[m], rows, cols,
                    cols + FM_GPU_TG_PAD(sizeof(T)), tid, threads);
  }
}

// ---- forward ----------------------------------------------------------------------------------------------------

template <typename T, uint W>
[[kernel]] void fused_mlp_forward(device const T* x [[buffer(0)]], device const T* params [[buffer(1)]],
                                  constant FmArgs& args [[buffer(2)]], device T* y [[buffer(3)]],
                                  device float* hidden [[buffer(4)]],
                                  threadgroup T* rows_tg [[threadgroup(0)]],
                                  threadgroup T* weights_tg [[threadgroup(1)]],
                                  uint group [[threadgroup_position_in_grid]],
                                  uint sg [[simdgroup_index_in_threadgroup]],
                                  uint lane [[thread_index_in_simdgroup]],
                                  uint tid [[thread_index_in_threadgroup]]) {
  const uint S = FM_GPU_SIMDGROUPS(W, sizeof(T) == 2);
  const bool TGW = FM_GPU_TG_WEIGHTS(W);
  const uint LD = W + FM_GPU_TG_PAD(sizeof(T));  // elements per row of the threadgroup buffers
  const uint n = args.n;
  const uint blk0 = uint(ulong(group) * args.blocks / args.parts);
  const uint blk1 = uint((ulong(group) + 1ul) * args.blocks / args.parts);
  const uint lcol = fm_lane_col(lane);  // this lane's first column of every tile
  const bool resident = TGW && args.weights_resident != 0u;
  threadgroup T* act = rows_tg + sg * 8u * LD;
  if (resident) {
    fm_copy_all_weights(weights_tg, params, args, W, tid, 32u * S);
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  for (uint blk = blk0; blk < blk1; ++blk) {
    const uint row0 = blk * (8u * S) + sg * 8u;  // this SIMD group's first row
    const uint lrow = row0 + fm_lane_row(lane);  // this lane's row of every tile
    fm_load_x(act, LD, x, args, row0, 8u, lane, 32u);
    for (uint m = 0; m < args.n_matrices; ++m) {
      const bool last = m + 1u == args.n_matrices;
      const uint rows = last ? args.out_pad : W, cols = m == 0u ? args.in_pad : W;
      const device T* wm = params + args.weight_offset[m];
      const uint wld = TGW ? cols + FM_GPU_TG_PAD(sizeof(T)) : cols;  // elements per row of the matrix as read
      const threadgroup T* wtg = weights_tg + (resident ? args.weight_tg_offset[m] : 0u);
      if (TGW && !resident) {
        threadgroup_barrier(mem_flags::mem_threadgroup);  // every SIMD group is done with the previous matrix
        fm_copy_weights(weights_tg, wm, rows, cols, wld, tid, 32u * S);
        threadgroup_barrier(mem_flags::mem_threadgroup);
      } else {
        simdgroup_barrier(mem_flags::mem_threadgroup);
      }
      // out [8][rows] = act [8][cols] W_m^T
      simdgroup_float8x8 acc[W / 8u];
      TFMO_UNROLL for (uint j = 0; j < W / 8u; ++j) acc[j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
      for (uint k = 0; k < cols / 8u; ++k) {
        simdgroup_matrix<T, 8, 8> a;
        simdgroup_load(a, act, LD, ulong2(k * 8u, 0));
        TFMO_UNROLL for (uint j = 0; j < W / 8u; ++j) {
          if (j * 8u < rows) {
            simdgroup_matrix<T, 8, 8> w;
            fm_load_transposed<T, TGW>(w, wtg, wm, wld, k * 8u, j * 8u);
            simdgroup_multiply_accumulate(acc[j], a, w, acc[j]);
          }
        }
      }
      simdgroup_barrier(mem_flags::mem_threadgroup);  // every lane has read act: the outputs replace it
      const int act_code = last ? fm_output_activation : fm_activation;
      const uint real = last ? args.n_output : W;  // outputs with a bias
      TFMO_UNROLL for (uint j = 0; j < W / 8u; ++j) {
        if (j * 8u >= rows) continue;
        simdgroup_matrix<T, 8, 8> out;
        TFMO_UNROLL for (uint e = 0; e < 2u; ++e) {
          const uint o = j * 8u + lcol + e;
          float v = acc[j].thread_elements()[e];
          if (args.use_bias != 0u && o < real) v += float(params[args.bias_offset[m] + o]);
          v = fm_activate(act_code, v);
          if (last) {
            if (lrow < n && o < args.n_output) y[ulong(lrow) * args.n_output + o] = T(v);
          } else {
            out.thread_elements()[e] = T(v);
            if (args.training != 0u && lrow < n) hidden[(ulong(m) * n + lrow) * W + o] = v;
          }
        }
        if (!last) simdgroup_store(out, act, LD, ulong2(j * 8u, 0));
      }
      simdgroup_barrier(mem_flags::mem_threadgroup);
    }
  }
}

#define FM_KERNEL(name, ...) template [[host_name(name)]] [[kernel]] decltype(__VA_ARGS__) __VA_ARGS__
FM_KERNEL("fused_mlp_forward_w16_float32", fused_mlp_forward<float, 16>);
FM_KERNEL("fused_mlp_forward_w32_float32", fused_mlp_forward<float, 32>);
FM_KERNEL("fused_mlp_forward_w64_float32", fused_mlp_forward<float, 64>);
FM_KERNEL("fused_mlp_forward_w128_float32", fused_mlp_forward<float, 128>);
FM_KERNEL("fused_mlp_forward_w16_float16", fused_mlp_forward<half, 16>);
FM_KERNEL("fused_mlp_forward_w32_float16", fused_mlp_forward<half, 32>);
FM_KERNEL("fused_mlp_forward_w64_float16", fused_mlp_forward<half, 64>);
FM_KERNEL("fused_mlp_forward_w128_float16", fused_mlp_forward<half, 128>);

// ---- backward ---------------------------------------------------------------------------------------------------

template <typename T, uint W>
[[kernel]] void fused_mlp_backward(device const T* dy [[buffer(0)]], device const T* x [[buffer(1)]],
                                   device const T* params [[buffer(2)]], device const T* y [[buffer(3)]],
                                   device const float* hidden [[buffer(4)]], constant FmArgs& args [[buffer(5)]],
                                   device T* dx [[buffer(6)]], device float* partial [[buffer(7)]],
                                   threadgroup T* g_tg [[threadgroup(0)]],
                                   threadgroup T* prev_tg [[threadgroup(1)]],
                                   threadgroup T* weights_tg [[threadgroup(2)]],
                                   uint group [[threadgroup_position_in_grid]],
                                   uint sg [[simdgroup_index_in_threadgroup]],
                                   uint lane [[thread_index_in_simdgroup]],
                                   uint tid [[thread_index_in_threadgroup]]) {
  const uint S = FM_GPU_SIMDGROUPS(W, sizeof(T) == 2);
  const bool TGW = FM_GPU_TG_WEIGHTS(W);
  const uint LD = W + FM_GPU_TG_PAD(sizeof(T));  // elements per row of the threadgroup buffers
  const uint B = 8u * S, threads = 32u * S, n = args.n;
  device float* part = partial + ulong(group) * args.total;
  const uint blk0 = uint(ulong(group) * args.blocks / args.parts);
  const uint blk1 = uint((ulong(group) + 1ul) * args.blocks / args.parts);
  const uint lrow = sg * 8u + fm_lane_row(lane), lcol = fm_lane_col(lane);  // this lane's elements of every tile
  const bool resident = TGW && args.weights_resident != 0u;
  if (resident) fm_copy_all_weights(weights_tg, params, args, W, tid, threads);  // read after the first barrier
  for (uint blk = blk0; blk < blk1; ++blk) {
    const bool first = blk == blk0;
    const uint r0 = blk * B;
    // g = dy * f_out'(y) on the real rows and outputs, else 0.
    for (uint e = tid; e < B * W; e += threads) {
      const uint b = e / W, o = e % W, row = r0 + b;
      float v = 0.0f;
      if (row < n && o < args.n_output) {
        const ulong k = ulong(row) * args.n_output + o;
        v = float(dy[k]) * fm_activation_derivative(fm_output_activation, float(y[k]));
      }
      g_tg[b * LD + o] = T(v);
    }
    for (uint mi = args.n_matrices; mi > 0u; --mi) {
      const uint m = mi - 1u;
      const bool last = m + 1u == args.n_matrices;
      const uint rows = last ? args.out_pad : W, cols = m == 0u ? args.in_pad : W;
      const device T* wm = params + args.weight_offset[m];
      const device float* hprev = m > 0u ? hidden + ulong(m - 1u) * n * W : hidden;  // m > 0 only
      const uint wld = TGW ? cols + FM_GPU_TG_PAD(sizeof(T)) : cols;  // elements per row of the matrix as read
      // The layer's inputs as T ([B][cols], zeros past N and past n_input), the matrix into threadgroup memory.
      if (m == 0u) {
        fm_load_x(prev_tg, LD, x, args, r0, B, tid, threads);
      } else {
        for (uint e = tid; e < B * W; e += threads) {
          const uint b = e / W, i = e % W, row = r0 + b;
          prev_tg[b * LD + i] = row < n ? T(hprev[ulong(row) * W + i]) : T(0);
        }
      }
      const threadgroup T* wtg = weights_tg + (resident ? args.weight_tg_offset[m] : 0u);
      if (TGW && !resident) fm_copy_weights(weights_tg, wm, rows, cols, wld, tid, threads);
      threadgroup_barrier(mem_flags::mem_threadgroup);
      // dW_m [rows][cols] += g^T [rows][B] prev [B][cols], tile by tile.
      const uint tiles_o = rows / 8u, tiles_i = cols / 8u;
      device float* dw = part + args.weight_offset[m];
      for (uint t = sg; t < tiles_o * tiles_i; t += S) {
        const uint to = t / tiles_i, ti = t % tiles_i;
        simdgroup_float8x8 acc;
        if (first) acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
        else simdgroup_load(acc, dw, cols, ulong2(ti * 8u, to * 8u));
        for (uint kb = 0; kb < B / 8u; ++kb) {
          simdgroup_matrix<T, 8, 8> ga, hb;
          simdgroup_load(ga, g_tg, LD, ulong2(to * 8u, kb * 8u), true);
          simdgroup_load(hb, prev_tg, LD, ulong2(ti * 8u, kb * 8u));
          simdgroup_multiply_accumulate(acc, ga, hb, acc);
        }
        simdgroup_store(acc, dw, cols, ulong2(ti * 8u, to * 8u));
      }
      // db_m += the column sums of g (rows in order).
      if (args.use_bias != 0u) {
        const uint real = last ? args.n_output : W;
        for (uint o = tid; o < real; o += threads) {
          float s = 0.0f;
          for (uint b = 0; b < B; ++b) s += float(g_tg[b * LD + o]);
          device float* db = part + args.bias_offset[m] + o;
          *db = first ? s : *db + s;
        }
      }
      // dh [8][cols] = g [8][rows] W_m [rows][cols] for this SIMD group's rows.
      simdgroup_float8x8 acc[W / 8u];
      TFMO_UNROLL for (uint j = 0; j < W / 8u; ++j) acc[j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
      for (uint k = 0; k < tiles_o; ++k) {
        simdgroup_matrix<T, 8, 8> ga;
        simdgroup_load(ga, g_tg, LD, ulong2(k * 8u, sg * 8u));
        TFMO_UNROLL for (uint j = 0; j < W / 8u; ++j) {
          if (j < tiles_i) {
            simdgroup_matrix<T, 8, 8> w;
            fm_load<T, TGW>(w, wtg, wm, wld, k * 8u, j * 8u);
            simdgroup_multiply_accumulate(acc[j], ga, w, acc[j]);
          }
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);  // every SIMD group has read g, prev and the weights
      const uint row = r0 + lrow;
      TFMO_UNROLL for (uint j = 0; j < W / 8u; ++j) {
        if (j >= tiles_i) continue;
        if (m > 0u) {  // g of the layer below, replacing this SIMD group's rows of g
          simdgroup_matrix<T, 8, 8> gp;
          TFMO_UNROLL for (uint e = 0; e < 2u; ++e) {
            const uint i = j * 8u + lcol + e;
            float v = 0.0f;
            if (row < n)
              v = acc[j].thread_elements()[e] * fm_activation_derivative(fm_activation, hprev[ulong(row) * W + i]);
            gp.thread_elements()[e] = T(v);
          }
          simdgroup_store(gp, g_tg, LD, ulong2(j * 8u, sg * 8u));
        } else {
          TFMO_UNROLL for (uint e = 0; e < 2u; ++e) {
            const uint i = j * 8u + lcol + e;
            if (row < n && i < args.n_input) dx[fm_x_offset(args, row, i)] = T(acc[j].thread_elements()[e]);
          }
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);  // the next matrix reads every SIMD group's g
    }
  }
}
FM_KERNEL("fused_mlp_backward_w16_float32", fused_mlp_backward<float, 16>);
FM_KERNEL("fused_mlp_backward_w32_float32", fused_mlp_backward<float, 32>);
FM_KERNEL("fused_mlp_backward_w64_float32", fused_mlp_backward<float, 64>);
FM_KERNEL("fused_mlp_backward_w128_float32", fused_mlp_backward<float, 128>);
FM_KERNEL("fused_mlp_backward_w16_float16", fused_mlp_backward<half, 16>);
FM_KERNEL("fused_mlp_backward_w32_float16", fused_mlp_backward<half, 32>);
FM_KERNEL("fused_mlp_backward_w64_float16", fused_mlp_backward<half, 64>);
FM_KERNEL("fused_mlp_backward_w128_float16", fused_mlp_backward<half, 128>);

// dparams[k] = sum of partial[p P + k] over the parts p = 0, 1, ... in order (0 parts: 0).
template <typename T>
[[kernel]] void fused_mlp_reduce(device const float* partial [[buffer(0)]], constant FmArgs& args [[buffer(1)]],
                                 device T* dparams [[buffer(2)]], uint k [[thread_position_in_grid]]) {
  if (k >= args.total) return;
  float s = 0.0f;
  for (uint p = 0; p < args.parts; ++p) s += partial[ulong(p) * args.total + k];
  dparams[k] = T(s);
}
FM_KERNEL("fused_mlp_reduce_float32", fused_mlp_reduce<float>);
FM_KERNEL("fused_mlp_reduce_float16", fused_mlp_reduce<half>);
