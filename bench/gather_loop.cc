// Bare gather loop: the table reads of the hash-grid forward pass (tcnn indexing from hash_grid_math.h), with
// no interpolation and no output beyond a checksum. The speed limit the op's forward is compared with.
// Level by level over all points (like the op), points split evenly among std::threads. Built with
// -O3 -march=native by bench/hash_grid.py, so it is at least as well compiled as the op. float16 values are
// converted with the F16C instruction where the CPU has it (as the op's AVX2 build), else in software.
// Usage: gather_loop <n_points> <threads> <repeats> <fp16:0|1>; prints per-run milliseconds and the checksum.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "common/half.h"
#include "hash_grid_math.h"
#ifdef __F16C__
#include <immintrin.h>
inline float ToFloat(uint16_t h) { return _cvtsh_ss(h); }
#else
inline float ToFloat(uint16_t h) { return tfmo::HalfToFloat(h); }
#endif

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : (1 << 18);
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 7;
  const bool fp16 = argc > 4 && std::atoi(argv[4]) != 0;
  const int D = 3, L = 16, F = 2;
  HgLevel levels[L];
  const int64_t rows = hg_level_table(D, L, F, 19, 16, 1.5f, HG_GRID_HASH, levels);
  std::vector<float> table32(fp16 ? 0 : rows * F);
  std::vector<uint16_t> table16(fp16 ? rows * F : 0);
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (auto& v : table32) v = u(rng);
  for (auto& v : table16) v = (uint16_t)(rng() & 0x3BFF);  // finite halves in [0, 1)
  std::vector<float> pos(n * D);
  for (auto& v : pos) v = u(rng);
  for (int r = 0; r < repeats; ++r) {
    std::vector<double> sums(threads, 0.0);
    auto t0 = std::chrono::steady_clock::now();
    for (int l = 0; l < L; ++l) {
      const HgLevel lv = levels[l];
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
          const int64_t b = n * t / threads, e = n * (t + 1) / threads;
          float acc[8][F] = {};  // one accumulator per corner: no serial add chain
          // Tiles of kTile points: corner rows first (vectorisable index math, tcnn indexing), then the reads,
          // prefetched kAhead points ahead. The same structure as the op's forward, minus interpolation.
          constexpr int kTile = 256, kAhead = 16;
          uint rows[8][kTile];
          for (int64_t t0 = b; t0 < e; t0 += kTile) {
            const int cnt = (int)std::min<int64_t>(kTile, e - t0);
            uint gs[3][kTile];
            for (int i = 0; i < cnt; ++i)
              for (int d = 0; d < 3; ++d) gs[d][i] = (uint)hg_pos(pos[(t0 + i) * D + d], lv.scale);
            for (uint c = 0; c < 8; ++c) {
              if (lv.mode == HG_INDEX_HASH) {
                for (int i = 0; i < cnt; ++i)
                  rows[c][i] = lv.offset + hg_index_hash(lv, gs[0][i] + (c & 1), gs[1][i] + ((c >> 1) & 1),
                                                         gs[2][i] + ((c >> 2) & 1), 0);
              } else {
                for (int i = 0; i < cnt; ++i)
                  rows[c][i] = lv.offset + hg_index(lv, gs[0][i] + (c & 1), gs[1][i] + ((c >> 1) & 1),
                                                    gs[2][i] + ((c >> 2) & 1), 0);
              }
            }
            for (int i = 0; i < cnt; ++i) {
              if (i + kAhead < cnt)
                for (int c = 0; c < 8; ++c) {
                  if (fp16) __builtin_prefetch(&table16[(size_t)rows[c][i + kAhead] * F]);
                  else __builtin_prefetch(&table32[(size_t)rows[c][i + kAhead] * F]);
                }
              for (uint c = 0; c < 8; ++c) {
                const size_t row = rows[c][i];
                if (fp16) {
                  for (int f = 0; f < F; ++f) acc[c][f] += ToFloat(table16[row * F + f]);
                } else {
                  for (int f = 0; f < F; ++f) acc[c][f] += table32[row * F + f];
                }
              }
            }
          }
          for (int c = 0; c < 8; ++c)
            for (int f = 0; f < F; ++f) sums[t] += acc[c][f];
        });
      }
      for (auto& th : pool) th.join();
    }
    auto t1 = std::chrono::steady_clock::now();
    double s = 0;
    for (double v : sums) s += v;
    std::printf("%.3f %g\n", std::chrono::duration<double, std::milli>(t1 - t0).count(), s);
  }
  return 0;
}
