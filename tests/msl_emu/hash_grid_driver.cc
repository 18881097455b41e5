// Runs metal_kernels/hash_grid.metal through the MSL emulation (csrc/msl_emu), mirroring
// csrc/gpu/hash_grid_gpu.cc: same level table (hg_level_table), same dispatch shapes (encode: one thread per (point, level),
// G levels of 32 / G points per SIMD group, [level_group=G], default the host's EncodeLevelGroup), same buffers.
// Args: kernel=encode|grad_params|grad_positions dtype=float32|float16 n_levels= n_features= log2_hashmap_size=
//       base_resolution= per_level_scale= grid_type=0|1|2 interpolation=0|1|2 n_active= [tg=64]
//       [n_aggregate=0] (grad_params: levels below it sum runs of equal rows in the SIMD group)
//       [d3f2=0] (every kernel: the D=3, F=2, linear one)
//       [feature_major=0] (out and dy [L*F, N] instead of [N, L*F]: the _fm encode kernels on grid (N, L))
//       in:positions:float32:N*D  in:params:DTYPE:ROWS*F  [in:dy:DTYPE:N*L*F]   scalar dims=D
//       out:out=PATH  (encode: [N*L*F] DTYPE; grad_params: [ROWS*F] DTYPE; grad_positions: [N*D] float32)
// Outputs are pre-filled with a poison value where the kernel must write every element.
#include "harness.h"  // first: standard headers before <metal_stdlib>'s keyword macros

#define HG_HOST_LEVEL_TABLE 1
#include "hash_grid.metal"

#include <cmath>
#include <cstring>

template <class T>
static void run(msl_emu::Harness& h, const std::string& which, uint tg) {
  HgArgs args{};
  args.dims = h.scalar<uint>("dims");
  args.n_levels = h.scalar<uint>("n_levels");
  args.n_features = h.scalar<uint>("n_features");
  args.interpolation = h.scalar<uint>("interpolation");
  args.n_active = h.scalar<uint>("n_active");
  args.n_aggregate = h.scalar<uint>("n_aggregate", 0);
  args.feature_major = h.scalar<uint>("feature_major", 0) != 0 ? 1u : 0u;
  // The D=3, F=2, linear scatter kernel (the host launches it for that configuration).
  const bool d3f2 = h.scalar<int>("d3f2", 0) != 0;
  if (d3f2 && !(args.dims == 3 && args.n_features == 2 && args.interpolation == HG_INTERP_LINEAR))
    msl_emu::Harness::fail("d3f2=1 needs dims=3 n_features=2 interpolation=1");
  const int log2t = h.scalar<int>("log2_hashmap_size");
  const int nmin = h.scalar<int>("base_resolution");
  const float b = h.scalar<float>("per_level_scale");
  const int grid_type = h.scalar<int>("grid_type");
  std::vector<HgLevel> levels(args.n_levels);
  const int64_t rows = hg_level_table((int)args.dims, (int)args.n_levels, (int)args.n_features, log2t, nmin, b,
                                      grid_type, levels.data());
  if (rows < 0) msl_emu::Harness::fail("table too large");
  const std::vector<float> positions = h.input<float>("positions");
  const std::vector<T> params = h.input<T>("params");
  if (params.size() != (size_t)rows * args.n_features) msl_emu::Harness::fail("params size mismatch");
  args.n = (uint)(positions.size() / args.dims);
  const uint n = args.n, L = args.n_levels, F = args.n_features;
  if (which == "encode") {
    std::vector<T> out((size_t)n * L * F);
    for (auto& v : out) v = T(12345.0f);  // poison: every element must be written
    uint host_g = 8 / F > 0 ? 8 / F : 1;  // the host's EncodeLevelGroup
    while (host_g > 1 && host_g / 2 >= L) host_g /= 2;
    args.level_group = h.scalar<uint>("level_group", host_g);
    const uint G = args.level_group;
    if (G == 0 || G > 32 || (G & (G - 1)) != 0) msl_emu::Harness::fail("level_group must be a power of two <= 32");
    if (n > 0 && args.feature_major) {  // the host's grid (N, L)
      msl_emu::dispatch_threads(uint2{n, L}, uint2{tg, 1}, [&](const msl_emu::ThreadCtx& t) {
        const uint2 gid = t.thread_position_in_grid.xy, tgp = t.threadgroup_position_in_grid.xy;
        if constexpr (sizeof(T) == 4) {
          if (d3f2) hash_grid_encode_fm<float, true>(positions.data(), params.data(), levels.data(), args, out.data(), gid, tgp);
          else hash_grid_encode_fm<float, false>(positions.data(), params.data(), levels.data(), args, out.data(), gid, tgp);
        } else {
          if (d3f2) hash_grid_encode_fm<half, true>(positions.data(), params.data(), levels.data(), args, out.data(), gid, tgp);
          else hash_grid_encode_fm<half, false>(positions.data(), params.data(), levels.data(), args, out.data(), gid, tgp);
        }
      });
    } else if (n > 0) {
      msl_emu::dispatch_threads((n * G + 31) / 32 * ((L + G - 1) / G) * 32, tg, [&](const msl_emu::ThreadCtx& t) {
        const uint gid = t.thread_position_in_grid.x;
        if constexpr (sizeof(T) == 4) {
          if (d3f2) hash_grid_encode<float, true>(positions.data(), params.data(), levels.data(), args, out.data(), gid);
          else hash_grid_encode<float, false>(positions.data(), params.data(), levels.data(), args, out.data(), gid);
        } else {
          if (d3f2) hash_grid_encode<half, true>(positions.data(), params.data(), levels.data(), args, out.data(), gid);
          else hash_grid_encode<half, false>(positions.data(), params.data(), levels.data(), args, out.data(), gid);
        }
      });
    }
    h.output("out", out);
  } else if (which == "grad_params") {
    const std::vector<T> dy = h.input<T>("dy");
    std::vector<float> acc(params.size(), 777.0f);  // the host zero-fills first, as here
    HgArgs fill = args;
    fill.count = (uint)acc.size();
    if (!acc.empty())
      msl_emu::dispatch_threads(fill.count, tg, [&](const msl_emu::ThreadCtx& t) {
        hash_grid_fill_zero<float>(acc.data(), fill, t.thread_position_in_grid.x);
      });
    if (n > 0 && args.n_active > 0) {
      msl_emu::dispatch_threads(uint2{n, args.n_active}, uint2{tg, 1}, [&](const msl_emu::ThreadCtx& t) {
        const uint2 gid = t.thread_position_in_grid.xy;
        const uint lane = t.thread_index_in_simdgroup;
        if constexpr (sizeof(T) == 4) {
          if (d3f2) hash_grid_grad_params<float, 3, 2, HG_INTERP_LINEAR>(dy.data(), positions.data(), levels.data(), args, acc.data(), gid, lane);
          else hash_grid_grad_params<float, 0, 0, -1>(dy.data(), positions.data(), levels.data(), args, acc.data(), gid, lane);
        } else {
          if (d3f2) hash_grid_grad_params<half, 3, 2, HG_INTERP_LINEAR>(dy.data(), positions.data(), levels.data(), args, acc.data(), gid, lane);
          else hash_grid_grad_params<half, 0, 0, -1>(dy.data(), positions.data(), levels.data(), args, acc.data(), gid, lane);
        }
      });
    }
    if constexpr (sizeof(T) == 4) {
      h.output("out", acc);
    } else {
      std::vector<half> out(acc.size(), half(5.0f));
      if (!out.empty())
        msl_emu::dispatch_threads(fill.count, tg, [&](const msl_emu::ThreadCtx& t) {
          hash_grid_float_to_half(acc.data(), out.data(), fill, t.thread_position_in_grid.x);
        });
      h.output("out", out);
    }
  } else if (which == "grad_positions") {
    const std::vector<T> dy = h.input<T>("dy");
    std::vector<float> dx((size_t)n * args.dims, 999.0f);
    if (n > 0) {
      msl_emu::dispatch_threads(n, tg, [&](const msl_emu::ThreadCtx& t) {
        const uint gid = t.thread_position_in_grid.x;
        if constexpr (sizeof(T) == 4) {
          if (d3f2) hash_grid_grad_positions<float, 3, 2, HG_INTERP_LINEAR>(dy.data(), positions.data(), params.data(), levels.data(), args, dx.data(), gid);
          else hash_grid_grad_positions<float, 0, 0, -1>(dy.data(), positions.data(), params.data(), levels.data(), args, dx.data(), gid);
        } else {
          if (d3f2) hash_grid_grad_positions<half, 3, 2, HG_INTERP_LINEAR>(dy.data(), positions.data(), params.data(), levels.data(), args, dx.data(), gid);
          else hash_grid_grad_positions<half, 0, 0, -1>(dy.data(), positions.data(), params.data(), levels.data(), args, dx.data(), gid);
        }
      });
    }
    h.output("out", dx);
  } else {
    msl_emu::Harness::fail("unknown kernel %s", which.c_str());
  }
}

int main(int argc, char** argv) {
  msl_emu::Harness h(argc, argv);
  const std::string which = h.scalar<std::string>("kernel");
  const std::string dtype = h.scalar<std::string>("dtype");
  const uint tg = h.scalar<uint>("tg", 64);
  if (dtype == "float32") run<float>(h, which, tg);
  else if (dtype == "float16") run<half>(h, which, tg);
  else msl_emu::Harness::fail("unsupported dtype %s", dtype.c_str());
  return h.finish();
}
