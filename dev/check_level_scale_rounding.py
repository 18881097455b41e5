#!/usr/bin/env python
"""Exhaustive check that the level scale's exp2 and log2 (csrc/shared/hash_grid_math.h hg_exp2_f32 / hg_log2_f32,
tf_metal_ops/hash_grid/config.py _exp2_f32 / _log2_f32) are correctly rounded float32 for every float32 argument
of their range: x in [0, 24.5] (2^x * N_min - 1 <= 2^24), b in [1, 2^24 + 2].

Method: for every argument, the double libm value y is compared with the midpoint between the two float32
neighbours; where y is at least 4 double ulps from it, y rounded to float32 is the correctly rounded value for
any libm within 3 ulps (the exact value is then > 3 ulps from the midpoint, on the same side). The arguments
closer than that are listed, their exact values computed with ``decimal`` at 60 digits, and the tables of both
implementations must hold exactly those arguments with exactly those values. Also prints how often this libm's
float32 exp2f/log2f differ from the rounded double (= the correctly rounded value away from the listed arguments;
tcnn calls log2f on the host).

    python dev/check_level_scale_rounding.py     # ~30 s on one core; exit status 0 when everything holds
"""

import os
import shutil
import subprocess
import sys
import tempfile
from decimal import Decimal, localcontext

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SOURCE = r"""
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include "shared/hash_grid_math.h"
static float from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
static uint32_t to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
// distance of y from the midpoint between the float32 nearest y and its neighbour on y's side, in double ulps
static double midpoint_distance(double y) {
  const float f = (float)y;
  const float g = (double)f <= y ? std::nextafter(f, INFINITY) : std::nextafter(f, -INFINITY);
  const double mid = ((double)f + (double)g) / 2;  // exact
  return std::fabs(y - mid) / (std::nextafter(y, INFINITY) - y);
}
int main() {
  unsigned long long n = 0, libm_f = 0, other = 0;
  for (uint32_t u = 0; u <= to_bits(24.5f); ++u, ++n) {
    const float x = from_bits(u);
    const double y = std::exp2((double)x);
    if (exp2f(x) != (float)y) ++libm_f;
    if (midpoint_distance(y) < 4) std::printf("exp2 %a %a %.3f\n", (double)x, (double)hg_exp2_f32(x), midpoint_distance(y));
    else if (hg_exp2_f32(x) != (float)y) ++other;
  }
  std::printf("exp2_summary %llu %llu %llu\n", n, libm_f, other);
  n = libm_f = other = 0;
  for (uint32_t u = to_bits(1.0f); u <= to_bits(16777218.0f); ++u, ++n) {
    const float b = from_bits(u);
    const double y = std::log2((double)b);
    if (log2f(b) != (float)y) ++libm_f;
    if (y != 0 && midpoint_distance(y) < 4) std::printf("log2 %a %a %.3f\n", (double)b, (double)hg_log2_f32(b), midpoint_distance(y));
    else if (hg_log2_f32(b) != (float)y) ++other;
  }
  std::printf("log2_summary %llu %llu %llu\n", n, libm_f, other);
}
"""


def round_f32(d):
    c = np.float32(float(d))
    cands = (np.nextafter(c, np.float32(-np.inf)), c, np.nextafter(c, np.float32(np.inf)))
    return float(min(cands, key=lambda f: abs(Decimal(float(f)) - d)))


def exact(kind, a):
    with localcontext() as ctx:
        ctx.prec = 60
        ln2 = Decimal(2).ln()
        return round_f32((Decimal(a) * ln2).exp() if kind == "exp2" else Decimal(a).ln() / ln2)


def main():
    from tf_metal_ops.hash_grid import config

    cxx = os.environ.get("CXX") or shutil.which("clang++-16") or shutil.which("c++")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "check.cc"), os.path.join(tmp, "check")
        with open(src, "w") as f:
            f.write(SOURCE)
        subprocess.run([cxx, "-std=c++17", "-O2", "-I", os.path.join(ROOT, "csrc"), src, "-o", exe], check=True)
        out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    ok = True
    hard = {"exp2": {}, "log2": {}}
    for line in out.splitlines():
        kind, *rest = line.split()
        if kind.endswith("_summary"):
            n, libm_f, other = map(int, rest)
            name = kind.split("_")[0]
            print(f"{name}: {n:,} float32 arguments; the libm's float32 {name}f differs from its double {name} "
                  f"rounded to float32 for {libm_f:,}; hg_{name}_f32 differs from that rounded double at an "
                  f"argument not listed below: {other}")
            ok &= other == 0
            continue
        a, got, dist = float.fromhex(rest[0]), float.fromhex(rest[1]), float(rest[2])
        want = exact(kind, a)
        hard[kind][a] = want
        py = config._exp2_f32(a) if kind == "exp2" else config._log2_f32(a)
        status = "ok" if got == want == py else "WRONG"
        ok &= status == "ok"
        print(f"  hard {kind}({a.hex()}): {dist:.3f} double ulps from a midpoint; exact {want.hex()}, C++ "
              f"{got.hex()}, Python {py.hex()}: {status}")
    for kind, table in (("exp2", config._EXP2_HARD), ("log2", config._LOG2_HARD)):
        if set(table) != set(hard[kind]):
            print(f"error: config's {kind} table {sorted(v.hex() for v in table)} != the hard arguments "
                  f"{sorted(v.hex() for v in hard[kind])}")
            ok = False
    print("all correctly rounded" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
