// Reads commands from stdin (one per line) and prints the results of csrc/shared/hash_grid_math.h's host code:
//   t dims n_levels log2_hashmap_size base_resolution per_level_scale(hex float) grid_type(0 hash, 1 dense, 2 tiled)
//     -> the total row count (-1: beyond int32), then per level "scale(hex float):resolution:size:offset"
//   e x(hex float) -> hg_exp2_f32(x);  l b(hex float) -> hg_log2_f32(b)
// Used by tests/test_hash_grid_level_scale.py (compiled there with -ffp-contract=fast: the scale's steps must
// round the same whatever the compiler fuses).
#include <cstdio>
#include <vector>

#include "shared/hash_grid_math.h"

int main() {
  char cmd[4], text[64];
  while (std::scanf("%3s", cmd) == 1) {
    if (cmd[0] == 'e' || cmd[0] == 'l') {
      float v = 0.0f;
      if (std::scanf("%63s", text) != 1 || std::sscanf(text, "%a", &v) != 1) return 2;
      std::printf("%a\n", (double)(cmd[0] == 'e' ? hg_exp2_f32(v) : hg_log2_f32(v)));
      continue;
    }
    int dims, levels, log2t, nmin, grid_type;
    if (cmd[0] != 't' || std::scanf("%d %d %d %d %63s %d", &dims, &levels, &log2t, &nmin, text, &grid_type) != 6)
      return 2;
    float b = 0.0f;
    if (std::sscanf(text, "%a", &b) != 1) return 2;
    std::vector<HgLevel> lv(levels);
    const long long total = (long long)hg_level_table(dims, levels, 1, log2t, nmin, b, grid_type, lv.data());
    std::printf("%lld", total);
    for (const HgLevel& l : lv) std::printf(" %a:%u:%u:%u", (double)l.scale, l.resolution, l.size, l.offset);
    std::printf("\n");
  }
  return 0;
}
