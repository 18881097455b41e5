// IEEE 754 binary16 <-> float32 conversion for the CPU kernels (float16 tables are converted on load and
// results rounded back on store). Bit-exact: half->float is exact; float->half rounds to nearest even, keeps
// NaN a NaN and overflows to inf, like the hardware conversions TF uses. Branch-light so loops vectorise.
#pragma once

#include <cstdint>
#include <cstring>

namespace tfmo {

inline float HalfToFloat(uint16_t h) {
  // Normal halves: shift exponent/mantissa into float position and rebias (+112 in the exponent field).
  // Subnormal halves: m * 2^-24, computed from the integer mantissa so that no float subnormal is involved
  // (TF runs kernels with flush-to-zero / denormals-are-zero set).
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t em = (uint32_t)(h & 0x7FFFu);
  uint32_t bits = (em << 13) + (112u << 23);
  if (em >= 0x7C00u) bits = 0x7F800000u | (em << 13);  // inf / NaN (payload kept)
  float f;
  std::memcpy(&f, &bits, 4);
  if (em < 0x0400u) f = (float)em * 0x1p-24f;  // zero / subnormal
  std::memcpy(&bits, &f, 4);
  bits |= sign;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) return (uint16_t)(sign | 0x7C00u | (x > 0x7F800000u ? 0x200u : 0u));  // inf / NaN
  if (x >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);  // rounds to >= 65520: overflow to inf
  if (x < 0x38800000u) {
    // Result is subnormal (or zero): let the float adder do the rounding at the 2^-24 quantum. (A float-subnormal
    // x, read as 0 under denormals-are-zero, rounds to 0 either way.)
    float a;
    std::memcpy(&a, &x, 4);
    a += 0.5f;  // 0.5 = 2^-1: aligns the half-subnormal quantum 2^-24 with float's ulp at 0.5
    uint32_t b;
    std::memcpy(&b, &a, 4);
    return (uint16_t)(sign | (b - 0x3F000000u));
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  const uint32_t odd = (x >> 13) & 1u;
  x += 0xC8000FFFu + odd;  // -(112 << 23) + 0xFFF + odd, mod 2^32
  return (uint16_t)(sign | (x >> 13));
}

}  // namespace tfmo
