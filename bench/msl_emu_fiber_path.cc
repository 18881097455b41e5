// bench/msl_emu_fiber_path.py's runtime part: the hash-grid encoding, the position gradient and the zero fill of the
// table gradient's accumulator (hash_grid_fill_zero: one store per thread, where a thread's fiber costs the most) of
// metal_kernels/hash_grid.metal launched through msl_emu::dispatch_threads in one process, alternately on fibers
// (Options::fiber_free = false: every kernel of the file ran so while the fiber decision was made per file) and on
// the fiber-free fast path (what the kernels get now, decided per kernel), with the same inputs, workers and order.
// Build (the emulated GPU's flags for kernel units): clang++-16 -x c++ -std=c++20 -O2 -DNDEBUG
//   -Wno-unknown-attributes -I csrc/msl_emu/include -I csrc/msl_emu -I csrc/shared -I metal_kernels THIS_FILE
// Run: EXE POINTS REPEATS WORKERS; prints one line per (kernel, mode): "KERNEL MODE s1 s2 ..." (seconds per launch).
// The two modes must give bitwise equal outputs (the kernels call neither barriers nor SIMD-group functions);
// exit status 1 otherwise.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define HG_HOST_LEVEL_TABLE 1
#include "hash_grid.metal"

namespace {

// Deterministic uniform floats in [lo, hi) (splitmix64).
std::vector<float> uniform(size_t n, float lo, float hi, uint64_t seed) {
  std::vector<float> v(n);
  for (auto& x : v) {
    uint64_t z = (seed += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    x = lo + (hi - lo) * float(z >> 40) * (1.0f / 16777216.0f);
  }
  return v;
}

template <class F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s POINTS REPEATS WORKERS\n", argv[0]);
    return 2;
  }
  const uint n = uint(std::strtoul(argv[1], nullptr, 10));
  const int repeats = std::atoi(argv[2]);
  const unsigned workers = unsigned(std::strtoul(argv[3], nullptr, 10));
  // bench/msl_emu_fiber_path.py's configuration: D=3, L=16, F=2, log2 T=19, N_min=16, b=1.5, hash grid, linear.
  HgArgs args{};
  args.n = n;
  args.dims = 3;
  args.n_levels = 16;
  args.n_features = 2;
  args.interpolation = HG_INTERP_LINEAR;
  args.n_active = 16;
  args.level_group = 16;  // the host's EncodeLevelGroup for F = 2, L = 16: a SIMD group takes 16 levels of 2 points
  const uint G = args.level_group, encode_threads = (n * G + 31) / 32 * ((args.n_levels + G - 1) / G) * 32;
  std::vector<HgLevel> levels(args.n_levels);
  const int64_t rows = hg_level_table(3, 16, 2, 19, 16, 1.5f, 0, levels.data());
  const std::vector<float> positions = uniform(size_t(n) * 3, 0.0f, 1.0f, 1);
  const std::vector<float> params = uniform(size_t(rows) * 2, -1e-4f, 1e-4f, 2);
  const std::vector<float> dy = uniform(size_t(n) * 32, -1.0f, 1.0f, 3);
  std::vector<float> out(size_t(n) * 32), dx(size_t(n) * 3), acc(size_t(rows) * 2);
  std::vector<float> ref_out, ref_dx;
  HgArgs fill{};
  fill.count = uint(acc.size());
  msl_emu::Options opt = msl_emu::Options::from_env();
  opt.workers = workers;
  const char* modes[2] = {"fibers", "fast"};
  std::vector<double> t_encode[2], t_grad[2], t_fill[2];
  for (int r = 0; r < repeats + 1; ++r) {  // the first round warms up (fiber stacks, pages) and is not reported
    for (int m = 0; m < 2; ++m) {
      opt.fiber_free = m == 1;
      std::memset(out.data(), 0xFF, out.size() * sizeof(float));
      std::memset(dx.data(), 0xFF, dx.size() * sizeof(float));
      const double te = seconds([&] {
        msl_emu::dispatch_threads(encode_threads, 64u, [&](const msl_emu::ThreadCtx& t) {
          hash_grid_encode_float32(positions.data(), params.data(), levels.data(), args, out.data(),
                                   t.thread_position_in_grid.x);
        }, opt);
      });
      const double tg = seconds([&] {
        msl_emu::dispatch_threads(n, 64u, [&](const msl_emu::ThreadCtx& t) {
          hash_grid_grad_positions_float32(dy.data(), positions.data(), params.data(), levels.data(), args, dx.data(),
                                           t.thread_position_in_grid.x);
        }, opt);
      });
      std::memset(acc.data(), 0xFF, acc.size() * sizeof(float));
      const double tf = seconds([&] {
        msl_emu::dispatch_threads(fill.count, 256u, [&](const msl_emu::ThreadCtx& t) {
          hash_grid_fill_zero(acc.data(), fill, t.thread_position_in_grid.x);
        }, opt);
      });
      for (float v : acc)
        if (v != 0.0f) {
          std::fprintf(stderr, "hash_grid_fill_zero left a non-zero element (%s)\n", modes[m]);
          return 1;
        }
      if (ref_out.empty()) {
        ref_out = out, ref_dx = dx;
      } else if (std::memcmp(out.data(), ref_out.data(), out.size() * sizeof(float)) != 0 ||
                 std::memcmp(dx.data(), ref_dx.data(), dx.size() * sizeof(float)) != 0) {
        std::fprintf(stderr, "outputs differ between rounds or modes (round %d, %s)\n", r, modes[m]);
        return 1;
      }
      if (r > 0) t_encode[m].push_back(te), t_grad[m].push_back(tg), t_fill[m].push_back(tf);
    }
  }
  for (int m = 0; m < 2; ++m) {
    std::printf("hash_grid_encode_float32 %s", modes[m]);
    for (double s : t_encode[m]) std::printf(" %.6f", s);
    std::printf("\nhash_grid_grad_positions_float32 %s", modes[m]);
    for (double s : t_grad[m]) std::printf(" %.6f", s);
    std::printf("\nhash_grid_fill_zero %s", modes[m]);
    for (double s : t_fill[m]) std::printf(" %.6f", s);
    std::printf("\n");
  }
  return 0;
}
