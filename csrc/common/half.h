// IEEE 754 binary16 <-> float32 conversion for the CPU kernels (float16 tables are converted on load and
// results rounded back on store). Bit-exact: half->float is exact; float->half rounds to nearest even, keeps
// NaN a NaN and overflows to inf, like the hardware conversions TF uses. Branch-light so loops vectorise.
#pragma once

#include <cstdint>
#include <cstring>

namespace tfmo {

inline uint32_t Bits(float f) { uint32_t b; std::memcpy(&b, &f, 4); return b; }
inline float FromBits(uint32_t b) { float f; std::memcpy(&f, &b, 4); return f; }
// All-ones when c, else 0: selects without branches (table values are often a random mix of subnormal and
// normal halves, which would make a branch unpredictable).
inline uint32_t Mask(bool c) { return 0u - (uint32_t)c; }

inline float HalfToFloat(uint16_t h) {
  // Normal halves: shift exponent/mantissa into float position and rebias (+112 in the exponent field).
  // Subnormal halves: m * 2^-24 from the integer mantissa, so no float subnormal is involved (TF runs kernels
  // with flush-to-zero / denormals-are-zero set). Inf/NaN: all-ones exponent, payload kept.
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t em = (uint32_t)(h & 0x7FFFu);
  const uint32_t normal = (em << 13) + (112u << 23);
  const uint32_t special = 0x7F800000u | (em << 13);
  const uint32_t sub = Bits((float)em * 0x1p-24f);
  const uint32_t is_sub = Mask(em < 0x0400u), is_special = Mask(em >= 0x7C00u);
  return FromBits(sign | (normal & ~(is_sub | is_special)) | (sub & is_sub) | (special & is_special));
}

inline uint16_t FloatToHalf(float f) {
  uint32_t x = Bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7FFFFFFFu;
  // Normal result: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  const uint32_t normal = (x + 0xC8000FFFu + ((x >> 13) & 1u)) >> 13;  // -(112 << 23) + 0xFFF + odd, mod 2^32
  // Subnormal (or zero) result: let the float adder round at the 2^-24 quantum (2^-24 is float's ulp at 0.5).
  // A float-subnormal x, read as 0 under denormals-are-zero, rounds to 0 either way.
  const uint32_t sub = Bits(FromBits(x) + 0.5f) - 0x3F000000u;
  // Inf/NaN keep their class (NaN quiet); finite values that round to >= 65520 overflow to inf.
  const uint32_t special = 0x7C00u | (x > 0x7F800000u ? 0x200u : 0u);
  const uint32_t is_special = Mask(x >= 0x477FF000u), is_sub = Mask(x < 0x38800000u);
  return (uint16_t)(sign | (normal & ~(is_sub | is_special)) | (sub & is_sub) | (special & is_special));
}

// An element of a float32 (float) or float16 (uint16_t bits) tensor, read as and written from float32.
template <typename T> inline float Load(const T* p);
template <> inline float Load<float>(const float* p) { return *p; }
template <> inline float Load<uint16_t>(const uint16_t* p) { return HalfToFloat(*p); }
template <typename T> inline T Store(float v);
template <> inline float Store<float>(float v) { return v; }
template <> inline uint16_t Store<uint16_t>(float v) { return FloatToHalf(v); }

}  // namespace tfmo
