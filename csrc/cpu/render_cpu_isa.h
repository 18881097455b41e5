// The ISA builds of the volume-render CPU kernels (csrc/cpu/render_cpu.cc: [R,S] rays; csrc/cpu/render_packed_cpu.cc:
// packed rays) and their vectorised pieces; the choice between the builds is at the end of render_cpu.cc. The
// per-sample formulas are those of csrc/shared/render_math.h, run on arrays.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>

#include "common/isa_choice.h"
#include "shared/render_math.h"

#ifdef TFMO_ISA_X86_BUILDS
// The ray loops of both kernels are built three times from the same always-inline bodies (RenderBuild): avx512,
// avx2 and the baseline ISA (8-lane vectors there, split into SSE2 halves; 4 lanes elsewhere: NEON). One build is
// chosen once per process (IsaSelection): the best one the CPU supports, or the one named by
// TF_METAL_OPS_RENDER_ISA=avx512|avx2|default (tests run each and compare them). The library is built with
// -ffp-contract=off and the bodies never reassociate, and a vector lane computes exactly what the scalar tail
// computes, so the builds give bitwise identical results, whatever the split of an array into vectors and tail; the
// forward and gradient kernels always run the same build.
#define TFMO_VEC_BYTES 32
#pragma GCC diagnostic ignored "-Wpsabi"  // 32-byte vectors only ever live inside inlined helpers
#else
#define TFMO_VEC_BYTES 16
#endif

// Before a loop whose stores never alias its loads (lets the compiler vectorise without alias checks).
#if defined(__clang__)
#define TFMO_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define TFMO_IVDEP _Pragma("GCC ivdep")
#else
#define TFMO_IVDEP
#endif

namespace tfmo::render::cpu {

// exp(r) for |r| <= ln2/2: its degree-7 Taylor polynomial (Horner), on a float or a vector (the same operations).
template <class V>
TFMO_FN V ExpPoly(V r) {
  V p = V{} + 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  return p * r + 1.0f;
}

// exp(x) for x <= 0 (x > 0 is clamped to 0), in a form the compiler vectorises: x = n ln2 + r with
// |r| <= ln2/2, exp(r) by its degree-7 Taylor polynomial (truncation error < 1e-8 relative), times 2^n from the
// exponent bits. About 2 ulp; exp(x) = 0 below -87.3 (no denormals), NaN passes through.
TFMO_FN float NegExp(float x) {
  // NaN takes the clamped path too, so the int conversion and the shift below stay defined.
  const float xc = (x < -87.3f || x != x) ? -87.3f : (x > 0.0f ? 0.0f : x);
  const int n = static_cast<int>(xc * 1.44269504f - 0.5f);  // round to nearest for xc <= 0 (trunc toward 0)
  const float fn = static_cast<float>(n);
  const float p = ExpPoly((xc - fn * 0.693145752f) - fn * 1.42860677e-6f);  // ln2 split hi/lo
  uint32_t bits;
  const int32_t scale_bits = (n + 127) << 23;
  std::memcpy(&bits, &scale_bits, sizeof(bits));
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const float y = p * scale;
  return x < -87.3f ? 0.0f : (x != x ? x : y);
}

// The same computations on vectors (GCC/clang vector extensions; comparisons give all-ones lane masks).
typedef float VecF __attribute__((vector_size(TFMO_VEC_BYTES)));
typedef int32_t VecI __attribute__((vector_size(TFMO_VEC_BYTES)));
constexpr int64_t kLanes = TFMO_VEC_BYTES / 4;

TFMO_FN VecF Select(VecI mask, VecF a, VecF b) { return (VecF)((mask & (VecI)a) | (~mask & (VecI)b)); }

TFMO_FN VecF NegExpV(VecF x) {
  const VecI under = x < -87.3f;
  const VecI nan = x != x;
  VecF xc = Select(under | nan, VecF{} - 87.3f, x);  // NaN lanes too: conversion and shift stay defined
  xc = Select(xc > 0.0f, VecF{}, xc);
  const VecI n = __builtin_convertvector(xc * 1.44269504f - 0.5f, VecI);
  const VecF fn = __builtin_convertvector(n, VecF);
  const VecF p = ExpPoly((xc - fn * 0.693145752f) - fn * 1.42860677e-6f);
  const VecF y = p * (VecF)((n + 127) << 23);
  return Select(nan, x, Select(under, VecF{}, y));
}

// vr_alpha (shared header) on vectors: the same polynomial below 1/8, 1 - e above.
TFMO_FN VecF AlphaV(VecF tau, VecF e) {
  const VecI small = tau < 0.125f;
  const VecF x = Select(small, tau, VecF{});  // keeps the unused polynomial lanes finite
  const VecF poly = x * (1.0f - x * 0.5f * (1.0f - x * (1.0f / 3.0f) *
                         (1.0f - x * 0.25f * (1.0f - x * 0.2f * (1.0f - x * (1.0f / 6.0f))))));
  return Select(small, poly, 1.0f - e);
}

TFMO_FN VecF Load(const float* p) {
  VecF v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
TFMO_FN void Store(float* p, VecF v) { std::memcpy(p, &v, sizeof(v)); }

// out[i] = exp(-x[i]) for i < n (x >= 0; out may alias x).
TFMO_FN void ExpNegArray(const float* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) Store(out + i, NegExpV(-Load(x + i)));
  for (; i < n; ++i) out[i] = NegExp(-x[i]);
}

// w[i] = T[i] * alpha(tau[i]) for i < n.
TFMO_FN void WeightsArray(float* w, const float* T, const float* tau, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const VecF tv = Load(tau + i);
    Store(w + i, Load(T + i) * AlphaV(tv, NegExpV(-tv)));
  }
  for (; i < n; ++i) w[i] = T[i] * vr_alpha(tau[i], NegExp(-tau[i]));
}

// ---------------------------------------------------------------------------------------------------------
// default, avx2 and avx512, chosen at the end of render_cpu.cc (TF_METAL_OPS_RENDER_ISA); a call is a range of rays
// of any volume-render kernel.
TFMO_ISA_FAMILY_BUILDS(3);

// Runs body(std::integral_constant<int, build>) compiled for the selected build, counting the call: body is a
// generic lambda marked TFMO_FN_LAMBDA that calls a ray loop's always-inline body.
template <class Body>
void RenderBuild(const Body& body) {
  RunIsaBuild<kIsaCount>(CountIsaCall(IsaSelection(), g_isa_calls), body);
}

}  // namespace tfmo::render::cpu
