// CPU kernel of RayMarch (semantics: csrc/ops/ray_march_op.cc; math: csrc/shared/ray_march_math.h).
// Builds the occupancy mip from the bitfield, then marches every ray in fixed chunks of consecutive rays (split
// over the project pool; the chunking does not depend on the thread count), each chunk writing its samples in ray
// order into its own buffer. A prefix sum of the per-ray counts gives row_splits, and each chunk's samples are then
// one contiguous run of the outputs, copied in parallel (with the samples' positions, computed there). Buffers hold at most ~kBufferedSamples samples in all:
// chunks that start past that only count their samples and march again to write them (so memory stays bounded
// and the int32 limit on the total is checked before anything of that size is allocated). Each ray's march is serial and depends only on
// its own inputs (a thread interleaves the steps of kLanes rays, or of 16 rays in the AVX2 march of
// csrc/cpu/ray_march_cpu_isa.h, which changes nothing per ray), so the outputs are bitwise independent of the thread
// count and of the path (scalar or AVX2, chosen once per process).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/op_names.h"
#include "common/tfc.h"
#include "common/thread_pool.h"
#include "cpu/ray_march_cpu_isa.h"
#include "ops/ray_march_args.h"
#include "shared/ray_march_math.h"

namespace {

using tfmo::TensorRef;

constexpr int64_t kRayGrain = 256;
constexpr int64_t kChunkRays = 1024;  // rays per march chunk (a unit of work and of sample buffering)
constexpr int64_t kBufferedSamples = int64_t{1} << 26;  // 512 MiB of t_start/t_end buffers

// Marches rays [r0, r0 + n) (n <= kLanes) in lockstep: one step of every unfinished ray per round, so the
// independent dependency chains (bitfield load -> branch -> next t) of several rays overlap in the CPU. Each ray's
// steps are exactly those of a lone march, so results do not depend on the grouping. Ray r0 + i's samples end up in
// t0s[i][0..counts[i]) and t1s[i] (grown as needed) when kStore, else only counted.
constexpr int kLanes = 4;

using tfmo::ray_march::cpu::kOccupiedCell;
using tfmo::ray_march::cpu::Occupancy;

template <bool kStore>
void MarchRays(const RmParams& p, const float* o, const float* d, const float* near_t, const float* far_t,
               int64_t r0, int n, const Occupancy& occ, int64_t* counts, std::vector<float>* t0s,
               std::vector<float>* t1s) {
  RmRay s[kLanes];
  uint k[kLanes] = {0, 0, 0, 0};
  bool live[kLanes] = {false, false, false, false};
  int n_live = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t r = r0 + i;
    live[i] = rm_begin(p, o[3 * r], o[3 * r + 1], o[3 * r + 2], d[3 * r], d[3 * r + 1], d[3 * r + 2], near_t[r],
                       far_t[r], static_cast<uint>(r), &s[i]);
    n_live += live[i];
  }
  while (n_live > 0) {
    for (int i = 0; i < n; ++i) {
      if (!live[i]) continue;
      if (!(k[i] < p.max_samples && rm_candidate(p, &s[i]))) {
        live[i] = false;
        --n_live;
        continue;
      }
      const uint level = tfmo::ray_march::cpu::CellLevel(p, occ, s[i]);
      if (level == kOccupiedCell) {
        if constexpr (kStore) {
          if (t0s[i].size() <= k[i]) {
            t0s[i].resize(2 * k[i] + 16);
            t1s[i].resize(2 * k[i] + 16);
          }
          t0s[i][k[i]] = s[i].t;
          t1s[i][k[i]] = s[i].t1;
        }
        ++k[i];
        rm_accept(&s[i]);
      } else {
        rm_skip(p, level, &s[i]);
      }
    }
  }
  for (int i = 0; i < n; ++i) counts[i] = k[i];
}

// Levels 1 .. L of the occupancy mip of every cascade (layout: RmParams.mip_offset, mip_stride), each pooled from
// the one below.
void BuildMip(const RmParams& p, const unsigned char* bits, unsigned char* mip) {
  for (uint k = 0; k < p.K; ++k) {
    unsigned char* own = mip + size_t{k} * p.mip_stride;
    for (uint m = 1; m <= p.mip_levels; ++m) {
      const unsigned char* src = m == 1 ? bits + size_t{k} * p.cascade_bytes : own + p.mip_offset[m - 2];
      const uint gs = rm_mip_res(p.G, m - 1), gm = rm_mip_res(p.G, m);
      unsigned char* dst = own + p.mip_offset[m - 1];
      const int64_t n = (static_cast<int64_t>(gm) * gm * gm + 7) / 8;
      tfmo::ParallelFor(n, 1024, [&](int64_t j0, int64_t j1) {
        for (int64_t j = j0; j < j1; ++j) dst[j] = static_cast<unsigned char>(rm_mip_byte(src, gs, gm, uint(j)));
      });
    }
  }
}

// Occupancy::levels for every grid cell of one cascade (its bitfield `bits` and mip `mip`), top-down: a cell of
// level l takes its parent's value when the parent's block is empty (the largest empty block around it is above),
// else l if it is empty itself, else kOccupiedCell.
void BuildLevels(const RmParams& p, const unsigned char* bits, const unsigned char* mip, unsigned char* out) {
  std::vector<unsigned char> above, cur;
  for (int l = static_cast<int>(p.mip_levels); l >= 0; --l) {
    const uint g = rm_mip_res(p.G, uint(l)), ga = rm_mip_res(p.G, uint(l) + 1);
    const unsigned char* src = l == 0 ? bits : mip + p.mip_offset[l - 1];
    unsigned char* dst = out;
    if (l > 0) {
      cur.resize(static_cast<size_t>(g) * g * g);
      dst = cur.data();
    }
    const bool top = l == static_cast<int>(p.mip_levels);
    tfmo::ParallelFor(g, std::max<int64_t>(1, 4096 / (int64_t(g) * g)), [&](int64_t z0, int64_t z1) {
      for (uint z = uint(z0); z < uint(z1); ++z)
        for (uint y = 0; y < g; ++y) {
          const unsigned char* up = top ? nullptr : above.data() + ga * ((y >> 1) + ga * (z >> 1));
          for (uint x = 0, c = g * (y + g * z); x < g; ++x, ++c) {
            const unsigned char u = top ? kOccupiedCell : up[x >> 1];
            dst[c] = u != kOccupiedCell ? u : rm_bit(src[c >> 3], c) ? kOccupiedCell : static_cast<unsigned char>(l);
          }
        }
    });
    if (l > 0) above.swap(cur);
  }
}

// Samples of one chunk of rays, in ray order (when buffered).
struct ChunkSamples {
  bool buffered = false;
  std::vector<float> t0, t1;
};

// Marches chunk q of the rays, storing the per-ray counts in counts[0..) (from the chunk's first ray) and, when
// kStore, the samples in *out.
// The march runs the build chosen once per process (tfmo::ray_march::cpu::IsaSelection): the scalar MarchRays above,
// or the AVX2 march of csrc/cpu/ray_march_cpu_isa.h (the same samples, bit for bit).
template <bool kStore>
void MarchChunk(const RmParams& p, const float* o, const float* d, const float* near_t, const float* far_t,
                const Occupancy& occ, int64_t R, int64_t q, int64_t* counts, ChunkSamples* out) {
  const int64_t r0 = q * kChunkRays, r1 = std::min(R, r0 + kChunkRays);
  // The AVX2 march covers one cascade (K = 1); cascaded marches run the scalar one on every CPU.
  [[maybe_unused]] int isa = tfmo::kIsaDefault;
  if (p.K == 1)
    isa = tfmo::CountIsaCall(tfmo::ray_march::cpu::IsaSelection(), tfmo::ray_march::cpu::g_isa_calls);
  else
    tfmo::ray_march::cpu::g_isa_calls[isa].fetch_add(1, std::memory_order_relaxed);
#ifdef TFMO_ISA_X86_BUILDS
  if (isa == tfmo::kIsaAvx2) {
    tfmo::ray_march::cpu::RmStage stage;
    tfmo::ray_march::cpu::MarchChunkAvx2(p, o, d, near_t, far_t, r0, static_cast<int>(r1 - r0), occ, kStore, counts,
                                 kStore ? &out->t0 : nullptr, kStore ? &out->t1 : nullptr, &stage);
    return;
  }
#endif
  std::vector<float> lane_t0[kLanes], lane_t1[kLanes];
  for (int64_t r = r0; r < r1; r += kLanes) {
    const int n = static_cast<int>(std::min<int64_t>(kLanes, r1 - r));
    int64_t* c = counts + (r - r0);
    MarchRays<kStore>(p, o, d, near_t, far_t, r, n, occ, c, lane_t0, lane_t1);
    if constexpr (kStore) {
      for (int i = 0; i < n; ++i) {
        out->t0.insert(out->t0.end(), lane_t0[i].begin(), lane_t0[i].begin() + c[i]);
        out->t1.insert(out->t1.end(), lane_t1[i].begin(), lane_t1[i].begin() + c[i]);
      }
    }
  }
}

bool RayInvalid(const float* o, const float* d, float near_t, float far_t) {
  bool finite = true;
  for (int i = 0; i < 3; ++i) finite = finite && std::isfinite(o[i]) && std::isfinite(d[i]);
  return !finite || std::isnan(near_t) || std::isnan(far_t);
}

void FailBadRay(TF_OpKernelContext* ctx, int64_t r, const float* o, const float* d, float near_t, float far_t) {
  tfmo::Fail(ctx, TF_INVALID_ARGUMENT,
             "ray_march: ray %lld has a non-finite origin or direction or a NaN near/far: rays_o = (%g, %g, %g), "
             "rays_d = (%g, %g, %g), near = %g, far = %g",
             static_cast<long long>(r), static_cast<double>(o[0]), static_cast<double>(o[1]),
             static_cast<double>(o[2]), static_cast<double>(d[0]), static_cast<double>(d[1]),
             static_cast<double>(d[2]), static_cast<double>(near_t), static_cast<double>(far_t));
}

// Exclusive prefix sum of counts[0..R) into splits[0..R] (splits[0] = 0), in fixed parts. Returns the total.
int64_t PrefixSum(const std::vector<int64_t>& counts, std::vector<int64_t>* splits) {
  const int64_t R = static_cast<int64_t>(counts.size());
  splits->assign(R + 1, 0);
  const int64_t part_len = 1 << 14, parts = (R + part_len - 1) / part_len;
  std::vector<int64_t> part_sum(parts, 0);
  tfmo::ParallelParts(parts, [&](int64_t q) {
    int64_t s = 0;
    for (int64_t r = q * part_len, e = std::min(R, r + part_len); r < e; ++r) s += counts[r];
    part_sum[q] = s;
  });
  int64_t base = 0;
  for (int64_t q = 0; q < parts; ++q) {
    const int64_t s = part_sum[q];
    part_sum[q] = base;
    base += s;
  }
  tfmo::ParallelParts(parts, [&](int64_t q) {
    int64_t s = part_sum[q];
    for (int64_t r = q * part_len, e = std::min(R, r + part_len); r < e; ++r) {
      s += counts[r];
      (*splits)[r + 1] = s;
    }
  });
  return base;
}

void RayMarchCompute(void* attrs, TF_OpKernelContext* ctx) {
  TensorRef in[7];
  int64_t R = 0;
  RmParams p;
  if (!tfmo::ray_march::Prepare(ctx, attrs, in, &R, &p)) return;
  const float* o = in[0].data<float>();
  const float* d = in[1].data<float>();
  const float* near_t = in[2].data<float>();
  const float* far_t = in[3].data<float>();
  const unsigned char* bits = in[4].data<unsigned char>();

  tfmo::FirstIndex bad;
  tfmo::ParallelFor(R, kRayGrain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      if (RayInvalid(o + 3 * r, d + 3 * r, near_t[r], far_t[r])) bad.Note(r);
  });
  if (bad.get() >= 0) {
    const int64_t r = bad.get();
    FailBadRay(ctx, r, o + 3 * r, d + 3 * r, near_t[r], far_t[r]);
    return;
  }
  std::vector<unsigned char> mip(p.mip_bytes, 0);
  BuildMip(p, bits, mip.data());
  // The per-cell levels cost ~1 ns per cell to build and save tens of ns per ray: worth it for enough rays.
  const int64_t cells = int64_t{p.G} * p.G * p.G, all_cells = cells * p.K;
  std::vector<unsigned char> levels;
  if (all_cells <= 32 * R && all_cells <= (int64_t{1} << 24)) {
    levels.resize(all_cells);
    for (uint k = 0; k < p.K; ++k)
      BuildLevels(p, bits + size_t{k} * p.cascade_bytes, mip.data() + size_t{k} * p.mip_stride,
                  levels.data() + k * cells);
  }
  const Occupancy occ{bits, mip.data(), levels.empty() ? nullptr : levels.data()};

  std::vector<int64_t> counts(R, 0);
  const int64_t n_chunks = (R + kChunkRays - 1) / kChunkRays;
  std::vector<ChunkSamples> chunks(n_chunks);
  std::atomic<int64_t> buffered{0};
  tfmo::ParallelParts(n_chunks, [&](int64_t q) {
    ChunkSamples& ch = chunks[q];
    if (buffered.load(std::memory_order_relaxed) < kBufferedSamples) {
      MarchChunk<true>(p, o, d, near_t, far_t, occ, R, q, &counts[q * kChunkRays], &ch);
      ch.buffered = true;
      buffered.fetch_add(static_cast<int64_t>(ch.t0.size()), std::memory_order_relaxed);
    } else {
      MarchChunk<false>(p, o, d, near_t, far_t, occ, R, q, &counts[q * kChunkRays], nullptr);
    }
  });
  std::vector<int64_t> splits;
  const int64_t N = PrefixSum(counts, &splits);
  if (N > INT32_MAX) {
    tfmo::Fail(ctx, TF_INVALID_ARGUMENT,
               "ray_march: %lld samples in total exceed the int32 limit of row_splits; march fewer rays or lower "
               "max_samples",
               static_cast<long long>(N));
    return;
  }
  TensorRef t_starts, t_ends, row_splits, ray_indices, positions;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {N}, &t_starts) || !tfmo::AllocateOutput(ctx, 1, TF_FLOAT, {N}, &t_ends) ||
      !tfmo::AllocateOutput(ctx, 2, TF_INT32, {R + 1}, &row_splits) ||
      !tfmo::AllocateOutput(ctx, 3, TF_INT32, {N}, &ray_indices) ||
      !tfmo::AllocateOutput(ctx, 4, TF_FLOAT, {N, 3}, &positions))
    return;
  int32_t* rs = row_splits.data<int32_t>();
  for (int64_t r = 0; r <= R; ++r) rs[r] = static_cast<int32_t>(splits[r]);
  if (N == 0) return;
  float* ts = t_starts.data<float>();
  float* te = t_ends.data<float>();
  int32_t* ri = ray_indices.data<int32_t>();
  float* pos = positions.data<float>();
  const uint outer = 3 * (p.K - 1);  // positions: unit coordinates of the outermost cascade's box
  tfmo::ParallelParts(n_chunks, [&](int64_t q) {
    const int64_t r0 = q * kChunkRays, r1 = std::min(R, r0 + kChunkRays);
    ChunkSamples& ch = chunks[q];
    if (!ch.buffered) {
      std::vector<int64_t> again(r1 - r0);
      MarchChunk<true>(p, o, d, near_t, far_t, occ, R, q, again.data(), &ch);
    }
    const int64_t at = splits[r0], n = static_cast<int64_t>(ch.t0.size());  // = splits[r1] - at
    if (n > 0) {
      std::memcpy(ts + at, ch.t0.data(), sizeof(float) * n);
      std::memcpy(te + at, ch.t1.data(), sizeof(float) * n);
    }
    for (int64_t r = r0; r < r1; ++r) {
      std::fill(ri + splits[r], ri + splits[r + 1], static_cast<int32_t>(r));
      const float* ro = o + 3 * r;
      const float* rd = d + 3 * r;
      for (int64_t k = splits[r]; k < splits[r + 1]; ++k) {
        const float tm = 0.5f * (ts[k] + te[k]);
        pos[3 * k] = rm_unit_coord(ro[0], rd[0], tm, p.c_lo[outer], p.inv_ext_x);
        pos[3 * k + 1] = rm_unit_coord(ro[1], rd[1], tm, p.c_lo[outer + 1], p.inv_ext_y);
        pos[3 * k + 2] = rm_unit_coord(ro[2], rd[2], tm, p.c_lo[outer + 2], p.inv_ext_z);
      }
    }
  });
}

static const tfmo::OnLoad kRegister([] { tfmo::ray_march::RegisterKernels("CPU", &RayMarchCompute); });

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// The builds (csrc/cpu/ray_march_cpu_isa.h) and the choice between them, once per process, by TF_METAL_OPS_RAY_MARCH_ISA
// (common/isa_choice.h); diagnostics (tf_metal_ops.diagnostics.cpu_paths) count chunk marches.
TFMO_ISA_FAMILY(tfmo::ray_march::cpu, tfmo_ray_march_cpu_paths, "TF_METAL_OPS_RAY_MARCH_ISA",
                "the ray-march CPU kernel uses", kIsaCount)
