// Host-side checks of RayMarch shared by the CPU kernel and the GPU host code: attrs (at kernel construction),
// input dtypes/shapes, the aabb and seed values (host memory on the GPU too), and the kernel parameters
// (RmParams) derived from them, computed here once so that every backend marches with the same float32 values.
// Per-ray value checks (finite origins/directions, NaN near/far) are the CPU kernel's; the Metal kernels give such
// rays no samples instead (ray_march_math.h). Every failure names the op and the argument (InvalidArgument).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/op_names.h"
#include "common/tfc.h"
#include "shared/ray_march_math.h"

namespace tfmo::ray_march {

constexpr int64_t kMaxResolution = 1024;  // G^3 must fit the kernels' 32-bit cell indices

struct Attrs {
  int64_t G = 0, max_samples = 0, K = 1;
  float step_size = 0.0f, cone_angle = 0.0f;
  bool jitter = true;
};

inline void* Create(TF_OpKernelConstruction* c) {
  const char* op = "ray_march";
  auto* a = new Attrs;
  bool ok = GetAttr(c, "resolution", &a->G) && GetAttr(c, "step_size", &a->step_size) &&
            GetAttr(c, "cone_angle", &a->cone_angle) && GetAttr(c, "max_samples", &a->max_samples) &&
            GetAttr(c, "jitter", &a->jitter) && GetAttr(c, "cascades", &a->K);
  if (ok && !(a->G >= 1 && a->G <= kMaxResolution))
    ok = ConstructionFail(c, TF_INVALID_ARGUMENT, "%s: resolution must be in [1, %lld], got %lld", op,
                          static_cast<long long>(kMaxResolution), static_cast<long long>(a->G));
  if (ok && !(a->K >= 1 && a->K <= static_cast<int64_t>(kRmMaxCascades)))
    ok = ConstructionFail(c, TF_INVALID_ARGUMENT, "%s: cascades must be in [1, %u], got %lld", op, kRmMaxCascades,
                          static_cast<long long>(a->K));
  if (ok && !(std::isfinite(a->step_size) && a->step_size > 0.0f))
    ok = ConstructionFail(c, TF_INVALID_ARGUMENT, "%s: step_size must be finite and > 0, got %g", op,
                          static_cast<double>(a->step_size));
  if (ok && !(std::isfinite(a->cone_angle) && a->cone_angle >= 0.0f))
    ok = ConstructionFail(c, TF_INVALID_ARGUMENT, "%s: cone_angle must be finite and >= 0, got %g", op,
                          static_cast<double>(a->cone_angle));
  if (ok && !(a->max_samples >= 1 && a->max_samples <= INT32_MAX))
    ok = ConstructionFail(c, TF_INVALID_ARGUMENT, "%s: max_samples must be in [1, 2^31 - 1], got %lld", op,
                          static_cast<long long>(a->max_samples));
  if (!ok) {
    delete a;
    return nullptr;
  }
  return a;
}
inline void Delete(void* p) { delete static_cast<Attrs*>(p); }

inline bool CheckType(TF_OpKernelContext* ctx, const char* name, const TensorRef& t, TF_DataType want) {
  return CheckDtype(ctx, "ray_march", name, t, want);
}

// in[0..6] = rays_o, rays_d, near, far, bits, aabb, seed. aabb and seed are read on the host. Sets *R and *p.
inline bool Validate(TF_OpKernelContext* ctx, const Attrs& a, const TensorRef* in, int64_t* R, RmParams* p) {
  const char* op = "ray_march";
  const TensorRef &o = in[0], &d = in[1], &near_t = in[2], &far_t = in[3], &bits = in[4], &aabb = in[5],
                  &seed = in[6];
  if (!CheckType(ctx, "rays_o", o, TF_FLOAT) || !CheckType(ctx, "rays_d", d, TF_FLOAT) ||
      !CheckType(ctx, "near", near_t, TF_FLOAT) || !CheckType(ctx, "far", far_t, TF_FLOAT) ||
      !CheckType(ctx, "bits", bits, TF_UINT8) || !CheckType(ctx, "aabb", aabb, TF_FLOAT) ||
      !CheckType(ctx, "seed", seed, TF_INT64))
    return false;
  if (o.rank() != 2 || o.dim(1) != 3)
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: rays_o must have shape [rays, 3], got %s", op, ShapeString(o).c_str());
  *R = o.dim(0);
  if (d.rank() != 2 || d.dim(0) != *R || d.dim(1) != 3)
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: rays_d must have shape [%lld, 3] like rays_o, got %s", op,
                static_cast<long long>(*R), ShapeString(d).c_str());
  if (near_t.rank() != 1 || near_t.dim(0) != *R || far_t.rank() != 1 || far_t.dim(0) != *R)
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: near and far must have shape [%lld] (one per ray), got %s and %s", op,
                static_cast<long long>(*R), ShapeString(near_t).c_str(), ShapeString(far_t).c_str());
  if (*R > INT32_MAX - 1)
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: %lld rays exceed the int32 row_splits limit", op,
                static_cast<long long>(*R));
  const int64_t cells = a.G * a.G * a.G, bytes = (cells + 7) / 8;
  const bool flat_ok = a.K == 1 && bits.rank() == 1 && bits.dim(0) == bytes;
  if (!flat_ok && !(bits.rank() == 2 && bits.dim(0) == a.K && bits.dim(1) == bytes)) {
    if (a.K == 1)
      return Fail(ctx, TF_INVALID_ARGUMENT,
                  "%s: bits must have shape [ceil(resolution^3 / 8)] = [%lld] (or [1, %lld]) for resolution %lld, "
                  "got %s",
                  op, static_cast<long long>(bytes), static_cast<long long>(bytes), static_cast<long long>(a.G),
                  ShapeString(bits).c_str());
    return Fail(ctx, TF_INVALID_ARGUMENT,
                "%s: bits must have shape [cascades, ceil(resolution^3 / 8)] = [%lld, %lld] for %lld cascades of "
                "resolution %lld, got %s",
                op, static_cast<long long>(a.K), static_cast<long long>(bytes), static_cast<long long>(a.K),
                static_cast<long long>(a.G), ShapeString(bits).c_str());
  }
  if (aabb.rank() != 2 || aabb.dim(0) != 2 || aabb.dim(1) != 3)
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: aabb must have shape [2, 3] (min, max), got %s", op,
                ShapeString(aabb).c_str());
  if (seed.rank() != 0)
    return Fail(ctx, TF_INVALID_ARGUMENT, "%s: seed must be a scalar, got shape %s", op, ShapeString(seed).c_str());
  const float* box = aabb.data<float>();
  for (int i = 0; i < 3; ++i) {
    if (!(std::isfinite(box[i]) && std::isfinite(box[3 + i]) && box[i] < box[3 + i]))
      return Fail(ctx, TF_INVALID_ARGUMENT, "%s: aabb must be finite with min < max on every axis, got axis %d: [%g, %g]",
                  op, i, static_cast<double>(box[i]), static_cast<double>(box[3 + i]));
  }
  int64_t s = 0;
  std::memcpy(&s, seed.raw(), sizeof s);
  uint64_t su = static_cast<uint64_t>(s);

  RmParams q;
  std::memset(&q, 0, sizeof q);
  q.R = static_cast<uint>(*R);
  q.G = static_cast<uint>(a.G);
  q.max_samples = static_cast<uint>(a.max_samples);
  q.jitter = a.jitter ? 1u : 0u;
  q.seed_lo = static_cast<uint>(su & 0xffffffffu);
  q.seed_hi = static_cast<uint>(su >> 32);
  const float G = static_cast<float>(a.G);
  float* lo[3] = {&q.lo_x, &q.lo_y, &q.lo_z};
  float* hi[3] = {&q.hi_x, &q.hi_y, &q.hi_z};
  float* cs[3] = {&q.cs_x, &q.cs_y, &q.cs_z};
  float* inv[3] = {&q.inv_cs_x, &q.inv_cs_y, &q.inv_cs_z};
  float* inv_ext[3] = {&q.inv_ext_x, &q.inv_ext_y, &q.inv_ext_z};
  float max_cs = 0.0f;
  for (int i = 0; i < 3; ++i) {
    *lo[i] = box[i];
    *hi[i] = box[3 + i];
    const float size = box[3 + i] - box[i];
    if (!(std::isfinite(size) && size > 0.0f))
      return Fail(ctx, TF_INVALID_ARGUMENT, "%s: aabb axis %d has a size that is not finite and positive in float32", op, i);
    *cs[i] = size / G;
    *inv[i] = G / size;
    *inv_ext[i] = 1.0f / size;
    max_cs = std::fmax(max_cs, *cs[i]);
  }
  q.step_size = a.step_size;
  q.cone_angle = a.cone_angle;
  q.max_step = std::fmax(a.step_size, 1.7320508f * max_cs);
  q.K = static_cast<uint>(a.K);
  q.cascade_bytes = static_cast<uint>(bytes);
  q.max_skips = q.K * (kRmMaxSkipsPerCell * q.G) + kRmMaxSkipsExtra;
  // Cascade c: the box scaled by 2^c about its centre (ray_march_math.h); cascade 0's values are the ones above.
  for (uint c = 0; c < q.K; ++c) {
    const float scale = static_cast<float>(1u << c), grow = (scale - 1.0f) * 0.5f;
    float c_max_cs = 0.0f;
    for (int i = 0; i < 3; ++i) {
      const float size = box[3 + i] - box[i], size_c = size * scale;
      q.c_lo[3 * c + i] = box[i] - size * grow;
      q.c_hi[3 * c + i] = box[3 + i] + size * grow;
      if (!(std::isfinite(size_c) && std::isfinite(q.c_lo[3 * c + i]) && std::isfinite(q.c_hi[3 * c + i])))
        return Fail(ctx, TF_INVALID_ARGUMENT,
                    "%s: the box of cascade %u (the aabb scaled by 2^%u) is not finite in float32 on axis %d", op, c,
                    c, i);
      q.c_cs[3 * c + i] = size_c / G;
      q.c_inv_cs[3 * c + i] = G / size_c;
      c_max_cs = std::fmax(c_max_cs, q.c_cs[3 * c + i]);
      if (c == q.K - 1) *inv_ext[i] = 1.0f / size_c;
    }
    q.c_max_step[c] = std::fmax(a.step_size, 1.7320508f * c_max_cs);
  }
  rm_mip_layout(&q);
  *p = q;
  return true;
}

// Reads the seven inputs (rays_o, rays_d, near, far, bits, aabb, seed) into in[0..6] and validates them (Validate).
inline bool Prepare(TF_OpKernelContext* ctx, const void* attrs, TensorRef* in, int64_t* R, RmParams* p) {
  for (int i = 0; i < 7; ++i)
    if (!GetInput(ctx, i, &in[i])) return false;
  return Validate(ctx, *static_cast<const Attrs*>(attrs), in, R, p);
}

// Registers RayMarch's kernel on `device` ("CPU" or "GPU", where aabb and seed stay in host memory).
inline void RegisterKernels(const char* device, void (*compute)(void*, TF_OpKernelContext*)) {
  KernelSpec spec = KernelSpecFor(device);
  spec.op = TFMO_OP_RAY_MARCH;
  spec.create = &Create;
  spec.destroy = &Delete;
  spec.compute = compute;
  if (std::strcmp(device, "GPU") == 0) spec.host_memory = {"aabb", "seed"};
  RegisterKernel(spec);
}

}  // namespace tfmo::ray_march
