"""The kernels of the SIMD-group matrix checks and what their outputs must be, in NumPy only (no TensorFlow): run
through inline kernels by support/simdgroup_matrix_checks.py (CPU, emulated GPU) and through the GPU proxy on an
NVIDIA GPU by dev/gpu_proxy/check_simdgroup_matrix.py.

One source holds every kernel. The model is csrc/msl_emu/README.md's "SIMD-group matrices": lane l holds elements
(row, col) and (row, col + 1), row = 4 bit4(l) + 2 bit2(l) + bit1(l), col = 4 bit3(l) + 2 bit0(l) (MLX's layout); an
inactive lane's elements read as NaN in a product and are not stored; a product is accumulated in float and rounded
once to the result's type.
Tolerances, against float64 on the same (rounded) inputs: float32 results rtol 1e-5 with atol 1e-5 * sum |a||b|
(sums of up to K = 40 float products); float16 results rtol 2e-3 (one rounding to half of a float sum);
copies, fills and layouts exact.
"""

from __future__ import annotations

import numpy as np

SOURCE = """
#include <metal_stdlib>
#include <metal_simdgroup_matrix>
using namespace metal;

// p: M, N, K, ta, tb, mode. One SIMD group per 8x8 tile of D (M x N) = A (M x K) B (K x N) [+ C]: tiles in row-major order over the grid's
// SIMD groups. ta: A is stored as its transpose (K x M), tb: B as its (N x K). mode 0: D starts as a filled 0
// matrix; 1: D starts as C (loaded); 2: the first step is simdgroup_multiply. lda/ldb/ldc: elements per row.
template <typename T, typename Acc>
void gemm_tiles(const device T* a, const device T* b, const device Acc* c, device Acc* d, const device uint* p,
                uint simd_global) {
  const uint M = p[0], N = p[1], K = p[2], ta = p[3], tb = p[4], mode = p[5];
  const uint tiles_n = N / 8;
  if (simd_global >= (M / 8) * tiles_n) return;  // the whole SIMD group: uniform
  const uint tm = simd_global / tiles_n * 8, tn = simd_global % tiles_n * 8;
  const ulong lda = ta ? M : K, ldb = tb ? K : N;
  simdgroup_matrix<Acc, 8, 8> acc;
  if (mode == 1) simdgroup_load(acc, c, N, ulong2(tn, tm));
  else acc = make_filled_simdgroup_matrix<Acc, 8, 8>(Acc(0));
  for (uint k0 = 0; k0 < K; k0 += 8) {
    simdgroup_matrix<T, 8, 8> ma, mb;
    simdgroup_load(ma, a, lda, ta ? ulong2(tm, k0) : ulong2(k0, tm), ta != 0);
    simdgroup_load(mb, b, ldb, tb ? ulong2(k0, tn) : ulong2(tn, k0), tb != 0);
    if (mode == 2 && k0 == 0) simdgroup_multiply(acc, ma, mb);
    else simdgroup_multiply_accumulate(acc, ma, mb, acc);
  }
  simdgroup_store(acc, d, N, ulong2(tn, tm));
}

kernel void gemm_f32(const device float* a [[buffer(0)]], const device float* b [[buffer(1)]],
                     const device float* c [[buffer(2)]], const device uint* p [[buffer(3)]],
                      device float* d [[buffer(5)]],
                     uint sg [[simdgroup_index_in_threadgroup]], uint3 tpt [[dispatch_threads_per_threadgroup]],
                     uint3 tg [[threadgroup_position_in_grid]]) {
  gemm_tiles<float, float>(a, b, c, d, p, tg.x * (tpt.x / 32) + sg);
}
kernel void gemm_f16(const device half* a [[buffer(0)]], const device half* b [[buffer(1)]],
                     const device half* c [[buffer(2)]], const device uint* p [[buffer(3)]],
                      device half* d [[buffer(5)]],
                     uint sg [[simdgroup_index_in_threadgroup]], uint3 tpt [[dispatch_threads_per_threadgroup]],
                     uint3 tg [[threadgroup_position_in_grid]]) {
  gemm_tiles<half, half>(a, b, c, d, p, tg.x * (tpt.x / 32) + sg);
}
kernel void gemm_f16_f32(const device half* a [[buffer(0)]], const device half* b [[buffer(1)]],
                         const device float* c [[buffer(2)]], const device uint* p [[buffer(3)]],
                          device float* d [[buffer(5)]],
                         uint sg [[simdgroup_index_in_threadgroup]], uint3 tpt [[dispatch_threads_per_threadgroup]],
                         uint3 tg [[threadgroup_position_in_grid]]) {
  gemm_tiles<half, float>(a, b, c, d, p, tg.x * (tpt.x / 32) + sg);
}

// The same product through threadgroup memory: each SIMD group copies its A and B tiles into threadgroup memory
// (A with 12 elements per row), loads them from there, stores the result there and copies it out. M = N = 8 * tiles,
// K = 8; one tile per SIMD group along the diagonal of D: d gets tile i at rows and columns 8 i.
kernel void gemm_threadgroup(const device float* a [[buffer(0)]], const device float* b [[buffer(1)]],
                             device float* d [[buffer(2)]], uint sg [[simdgroup_index_in_threadgroup]],
                             uint lane [[thread_index_in_simdgroup]], uint3 tg [[threadgroup_position_in_grid]],
                             uint3 tpt [[dispatch_threads_per_threadgroup]]) {
  threadgroup float sa[4][96];
  threadgroup float sb[4][64];
  threadgroup float sd[4][64];
  const uint tile = tg.x * (tpt.x / 32) + sg, n = 8 * 4 * 2;  // tiles along the diagonal of a 64 x 64 D
  for (uint j = 0; j < 2; ++j) {
    const uint e = lane * 2 + j, r = e / 8, col = e % 8;
    sa[sg][r * 12 + col] = a[(tile * 8 + r) * 8 + col];   // A: 64 x 8, row-major
    sb[sg][r * 8 + col] = b[r * n + tile * 8 + col];      // B: 8 x 64, row-major
  }
  simdgroup_barrier(mem_flags::mem_threadgroup);
  simdgroup_float8x8 ma, mb, md;
  simdgroup_load(ma, &sa[sg][0], 12);
  simdgroup_load(mb, &sb[sg][0]);
  simdgroup_multiply(md, ma, mb);
  simdgroup_store(md, &sd[sg][0], 8, ulong2(0, 0), false);
  simdgroup_barrier(mem_flags::mem_threadgroup);
  for (uint j = 0; j < 2; ++j) {
    const uint e = lane * 2 + j, r = e / 8, col = e % 8;
    d[(tile * 8 + r) * n + tile * 8 + col] = sd[sg][r * 8 + col];
  }
}

// x: 64 values (an 8x8 matrix). Per SIMD group s (8 groups): out[s][0..63]: this lane's thread_elements() of x
// loaded (2 per lane, by lane); [64..127]: a matrix whose lane l's elements were set to (2 l, 2 l + 1), stored;
// [128..191]: make_filled_simdgroup_matrix(3.5), stored; [192..255]: the diagonal constructor (2.5) times x;
// [256..355]: x stored transposed at origin (1, 2) of a region with 10 elements per row (its rows 2..9, columns
// 1..8); [384..447]: x loaded transposed from origin (0, 0), stored.
kernel void elements(const device float* x [[buffer(0)]], device float* out [[buffer(1)]],
                     uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
  device float* o = out + sg * 512;
  simdgroup_float8x8 m;
  simdgroup_load(m, x);
  o[lane * 2] = m.thread_elements()[0];
  o[lane * 2 + 1] = m.thread_elements()[1];
  simdgroup_float8x8 w;
  w.thread_elements() = float2(2 * lane, 2 * lane + 1);
  simdgroup_store(w, o + 64);
  simdgroup_float8x8 f = make_filled_simdgroup_matrix<float, 8, 8>(3.5f);
  simdgroup_store(f, o + 128);
  simdgroup_float8x8 diag(2.5f), p;
  simdgroup_multiply(p, diag, m);
  simdgroup_store(p, o + 192);
  simdgroup_store(m, o + 256, 10, ulong2(1, 2), true);
  simdgroup_matrix<float, 8, 8> t;
  simdgroup_load(t, x, 8, ulong2(0, 0), true);
  simdgroup_store(t, o + 384);
}

// The SIMD-group functions in a file with SIMD-group matrices (the GPU proxy numbers its warps' lanes in the matrix
// layout). Per thread t (n: its SIMD group's lanes), out[t][0..9]: its lane, its index in the threadgroup,
// simd_shuffle(t, (7 lane + 3) % n), the exclusive and inclusive prefix sums of lane + 1, the low 32 bits of
// simd_ballot(lane % 3 == 0), simd_broadcast_first(t), simd_shuffle_down(t, 3), simd_shuffle_up(t, 5), simd_sum(lane).
kernel void lanes(device uint* out [[buffer(0)]], uint t [[thread_position_in_grid]],
                  uint tid [[thread_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                  uint sg [[simdgroup_index_in_threadgroup]], uint tpg [[threads_per_threadgroup]]) {
  const uint n = min(32u, tpg - sg * 32u);
  device uint* o = out + t * 10u;
  o[0] = lane;
  o[1] = tid;
  o[2] = simd_shuffle(t, ushort((7u * lane + 3u) % n));
  o[3] = simd_prefix_exclusive_sum(lane + 1u);
  o[4] = simd_prefix_inclusive_sum(lane + 1u);
  o[5] = uint(ulong(simd_ballot(lane % 3u == 0u)));
  o[6] = simd_broadcast_first(t);
  o[7] = simd_shuffle_down(t, ushort(3));
  o[8] = simd_shuffle_up(t, ushort(5));
  o[9] = simd_sum(lane);
}
"""


def lane_coords():
    """(row, col) of lane l's first element, for l = 0..31 (MLX's BaseMMAFrag layout)."""
    lanes = np.arange(32)
    row = (lanes >> 4 & 1) * 4 + (lanes >> 2 & 1) * 2 + (lanes >> 1 & 1)
    col = (lanes >> 3 & 1) * 4 + (lanes & 1) * 2
    return row, col


def gemm_inputs(dt, acc_dt, M, N, K, seed):
    """a [M, K] and b [K, N] of dtype dt, c [M, N] of the accumulator's dtype, uniform in [-1, 1]."""
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, (M, K)).astype(dt), rng.uniform(-1, 1, (K, N)).astype(dt),
            rng.uniform(-1, 1, (M, N)).astype(acc_dt))


def gemm_reference(a, b, c, mode):
    """a b (+ c when mode is 1) in float64, and the sum of the magnitudes of its terms (the error scale)."""
    a64, b64, c64 = a.astype(np.float64), b.astype(np.float64), c.astype(np.float64)
    ref = a64 @ b64 + (c64 if mode == 1 else 0)
    scale = np.abs(a64) @ np.abs(b64) + (np.abs(c64) if mode == 1 else 0)
    return ref, scale


def assert_product(got, ref, scale, dt):
    if got.dtype == np.float16:
        np.testing.assert_allclose(got.astype(np.float64), ref, rtol=2e-3, atol=2e-3 * scale.max())
    else:
        np.testing.assert_allclose(got.astype(np.float64), ref, rtol=1e-5, atol=1e-5 * scale.max())


def assert_threadgroup_products(d, a, b):
    """gemm_threadgroup's output: the diagonal 8x8 tiles of a b."""
    ref = a.astype(np.float64) @ b.astype(np.float64)
    for i in range(8):
        s = slice(8 * i, 8 * i + 8)
        np.testing.assert_allclose(d[s, s], ref[s, s], rtol=1e-5, atol=1e-5 * 8)


ELEMENTS_INPUT = np.arange(64, dtype=np.float32).reshape(8, 8) * 0.5 - 7


def assert_elements(out, x=ELEMENTS_INPUT):
    """elements' output [8, 512] for the input x: per SIMD group, thread_elements() in the lane layout, a matrix
    written through thread_elements(), a fill, the diagonal constructor's product, transposed stores and loads."""
    row, col = lane_coords()
    written = np.empty((8, 8), np.float32)
    for lane in range(32):
        written[row[lane], col[lane]:col[lane] + 2] = [2 * lane, 2 * lane + 1]
    for o in out:
        layout = o[:64].reshape(32, 2)
        np.testing.assert_array_equal(layout[:, 0], x[row, col])
        np.testing.assert_array_equal(layout[:, 1], x[row, col + 1])
        np.testing.assert_array_equal(o[64:128].reshape(8, 8), written)
        np.testing.assert_array_equal(o[128:192], np.full(64, 3.5, np.float32))
        np.testing.assert_allclose(o[192:256].reshape(8, 8), 2.5 * x.astype(np.float64), rtol=1e-6)
        region = o[256:256 + 100].reshape(10, 10)  # x^T at column 1, rows 2..9 of a 10-wide block
        np.testing.assert_array_equal(region[2:10, 1:9], x.T)
        np.testing.assert_array_equal(o[384:448].reshape(8, 8), x.T)


# lanes' launches (threads, threadgroup size): whole SIMD groups; a 16-lane SIMD group in each threadgroup of 48; a
# grid whose last threadgroup is clipped to 16 threads.
LANES_LAUNCHES = ((128, 64), (96, 48), (80, 64))


def assert_lanes(out, threads, group):
    """lanes' output [threads, 10] for a launch of `threads` threads in threadgroups of `group`."""
    for start in range(0, threads, group):
        size = min(group, threads - start)
        for s in range(0, size, 32):
            n = min(32, size - s)
            base = start + s
            for lane in range(n):
                t = base + lane
                o = [int(v) for v in out[t]]
                want = [lane, s + lane, base + (7 * lane + 3) % n, lane * (lane + 1) // 2,
                        (lane + 1) * (lane + 2) // 2, sum(1 << k for k in range(0, n, 3)), base, None,
                        t - 5 if lane >= 5 else t, n * (n - 1) // 2]
                if lane + 3 < n:
                    want[7] = t + 3
                elif lane + 3 >= 32:
                    want[7] = t  # the source is outside the SIMD group: its own value
                got = [g if w is not None else None for g, w in zip(o, want)]
                assert got == want, (f"thread {t} (threadgroup of {size}, SIMD group of {n}, lane {lane}): "
                                     f"got {got}, want {want}")
