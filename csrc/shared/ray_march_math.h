// Per-ray math of RayMarch (occupancy-grid ray marching), shared by the CPU kernel (csrc/cpu/ray_march_cpu.cc)
// and the Metal kernels (metal_kernels/ray_march.metal). Rules: device_compat.h. The kernels own the loops over rays
// and the reads of device memory (the occupancy bitfield); everything that decides a sample is here, so the CPU and
// the GPU give the same bits (float32 throughout, no transcendental functions, no fused multiply-adds).
//
// Conventions
//  - Grid: G^3 cells over the box [lo, hi]; cell (i, j, k) covers lo + [i, i+1] * cs per axis (cs = (hi - lo) / G,
//    inv_cs = G / (hi - lo), both computed once by the host in float32). Linear index x + G*(y + G*z); occupancy
//    bit (idx & 7) of byte idx >> 3, LSB first.
//  - Ray r: o + t d (d need not be unit length; t is in units of |d|). The march covers [t_lo, t_hi] with
//    t_lo = max(near, t_box_enter), t_hi = min(far, t_box_exit) (slab test; an axis with d = 0 constrains nothing
//    when o is within [lo, hi] on it (boundary included), else the ray misses). No samples unless t_lo < t_hi.
//  - Step rule: dt(t) = min(max(t * cone_angle, step_size), max_step); the host sets
//    max_step = max(step_size, sqrt(3) * largest cell size) (one cell diagonal, as Instant-NGP), so cone_angle = 0
//    gives the constant step_size.
//  - Jitter: the march starts at t = t_lo + u * dt(t_lo), u in [0, 1) from rm_jitter(seed, r) (a counter-based hash
//    of the 64-bit seed and the ray index: the same u on every backend; u = 0 without jitter).
//  - Occupancy mip: level 0 is the grid; level m >= 1 has G_m = ceil(G / 2^m) cells per axis, its cell
//    (X, Y, Z) covering the grid cells with (x >> m, y >> m, z >> m) = (X, Y, Z) (a block of 2^m cells per axis, cut
//    at the grid's far faces), occupied iff one of them is (OR pooling of level m - 1). Levels 1 .. L where
//    L = mip_levels is the largest m with 2^m < G; each stored like the grid (bit X + G_m*(Y + G_m*Z), LSB first)
//    from byte mip_offset[m - 1] of one mip buffer, which the kernels build from the bitfield on every call.
//  - Candidate sample: [t, t1] with t1 = min(t + dt(t), t_hi); its midpoint tm = (t + t1) / 2 selects the cell.
//    Occupied: the sample is emitted and t = t1. Unoccupied: let m be the largest level whose block containing the
//    cell is empty (levels are nested, so m = the number of empty levels above 0); t jumps to where the ray
//    leaves that block (DDA: the nearest block face ahead on the axes with d != 0, face index
//    min(((c >> m) + (d > 0)) << m, G) in cells), or to t1 if rounding puts that face at or behind t. With m = 0
//    this is the face of the cell itself; larger blocks only skip empty space in fewer steps.
//    The march ends when t >= t_hi, when t1 <= t (float precision exhausted), after max_samples samples, or after
//    kRmMaxSkipsPerCell * G + kRmMaxSkipsExtra skipped candidates (a ray crosses at most 3G cell faces; the cap
//    only bounds rounding corner cases, so a kernel loop always ends).
//  - Sample positions (the op's `positions` output): the midpoint tm = (t_start + t_end) / 2 (the point that
//    selected the sample's cell) in the box's unit coordinates, (o + tm d - lo) * inv_ext per axis with
//    inv_ext = 1 / (hi - lo) (float32, computed once by the host), clamped to [0, 1] (the midpoint lies in the box
//    up to rounding): the input of an encoding over the box, such as the hash grid's [0, 1]^3.
//  - Hence within a ray samples are sorted and non-overlapping (t_start <= t_end <= next t_start), every midpoint
//    lies in an occupied cell, and an all-occupied grid gives t_lo + u dt + k dt (last one cut at t_hi).
//  - Invalid input (NaN/inf origin or direction, NaN near/far): the CPU kernel rejects it before marching; the
//    Metal kernels give that ray no samples (rm_begin returns false for it).
#pragma once

#include "device_compat.h"

TFMO_CONSTANT uint kRmMaxSkipsPerCell = 8;
TFMO_CONSTANT uint kRmMaxSkipsExtra = 64;
TFMO_CONSTANT uint kRmMaxMipLevels = 9;  // 2^9 < G <= 1024 (the largest resolution)

// Kernel parameters (one struct bound with setBytes; the same layout in C++ and MSL: 32-bit scalars and arrays).
struct RmParams {
  uint R;            // rays
  uint G;            // grid resolution per axis
  uint max_samples;  // per ray, >= 1
  uint jitter;       // 0 or 1
  uint seed_lo, seed_hi;
  float lo_x, lo_y, lo_z;
  float cs_x, cs_y, cs_z;              // cell size per axis
  float inv_cs_x, inv_cs_y, inv_cs_z;  // cells per unit length per axis
  float step_size, cone_angle, max_step;
  uint max_skips;  // kRmMaxSkipsPerCell * G + kRmMaxSkipsExtra
  float hi_x, hi_y, hi_z;
  uint mip_levels;                   // L: levels 1 .. L of the occupancy mip (0 when G <= 2)
  uint mip_offset[kRmMaxMipLevels];  // byte offset of level m at index m - 1; then the buffer's total length
  uint mip_bytes;                    // bytes of the mip buffer (>= 1, so a kernel can always bind it)
  float inv_ext_x, inv_ext_y, inv_ext_z;  // 1 / (hi - lo) per axis (sample positions in unit coordinates)
};

// Cells per axis of mip level m.
TFMO_FN uint rm_mip_res(uint G, uint m) { return (G + (1u << m) - 1u) >> m; }

// Fills mip_levels, mip_offset and mip_bytes for p->G.
TFMO_FN void rm_mip_layout(TFMO_THREAD RmParams* p) {
  uint off = 0, m = 0;
  while (m < kRmMaxMipLevels && (2u << m) < p->G) {
    p->mip_offset[m] = off;
    const uint g = rm_mip_res(p->G, m + 1);
    off += (g * g * g + 7u) / 8u;
    ++m;
  }
  p->mip_levels = m;
  for (uint i = m; i < kRmMaxMipLevels; ++i) p->mip_offset[i] = off;
  p->mip_bytes = off > 0u ? off : 1u;
}

// Byte j of mip level m >= 1 (its cells 8j .. 8j + 7, LSB first; bits past the level's cells are 0), pooled from
// level m - 1 stored at `src` with gs = rm_mip_res(G, m - 1) cells per axis.
TFMO_FN uint rm_mip_byte(TFMO_DEVICE const uchar* src, uint gs, uint gm, uint j) {
  const uint n = gm * gm * gm, first = 8u * j;
  uint X = first % gm, Y = (first / gm) % gm, Z = first / (gm * gm);
  uint out = 0;
  for (uint b = 0; b < 8u && first + b < n; ++b) {
    uint any = 0;
    for (uint k = 0; k < 8u && any == 0u; ++k) {
      const uint x = 2u * X + (k & 1u), y = 2u * Y + ((k >> 1) & 1u), z = 2u * Z + (k >> 2);
      if (x < gs && y < gs && z < gs) {
        const uint c = x + gs * (y + gs * z);
        any = (uint(src[c >> 3]) >> (c & 7u)) & 1u;
      }
    }
    out |= any << b;
    if (++X == gm) {
      X = 0;
      if (++Y == gm) {
        Y = 0;
        ++Z;
      }
    }
  }
  return out;
}

// Prefix sum of the per-ray counts on the GPU (metal_kernels/ray_march.metal): blocks of kRmScanBlock values
// (one threadgroup each) are scanned in place and their totals written to a sums array, which is scanned the same
// way (recursively, until one block), then each block adds the scanned total of the blocks before it.
TFMO_CONSTANT uint kRmScanBlock = 256;
struct RmScanParams {
  uint n;       // values to scan
  uint offset;  // first value's index in the bound buffer
};

// lowbias32 (C. Wellons): a 32-bit integer permutation with good avalanche.
TFMO_FN uint rm_hash(uint x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// u in [0, 1): 24 random bits of hash(seed, ray), exactly representable in float32.
TFMO_FN float rm_jitter(uint seed_lo, uint seed_hi, uint ray) {
  const uint h = rm_hash(ray ^ rm_hash(seed_lo ^ rm_hash(seed_hi + 0x9e3779b9u)));
  return float(h >> 8) * (1.0f / 16777216.0f);
}

// min/max as comparisons (cheaper than fmin/fmax calls on CPUs without an inline instruction for them); like
// fmin/fmax when `a` is NaN (the result is b), so callers put the operand that can be NaN first.
TFMO_FN float rm_min(float a, float b) { return a < b ? a : b; }
TFMO_FN float rm_max(float a, float b) { return a > b ? a : b; }
TFMO_FN uint rm_min_u(uint a, uint b) { return a < b ? a : b; }

TFMO_FN float rm_dt(float t, float step_size, float cone_angle, float max_step) {
  return rm_min(rm_max(t * cone_angle, step_size), max_step);  // t * cone_angle is NaN for t = -inf, cone 0
}

// Cell index along one axis of coordinate x: floor((x - lo) * inv_cs) clamped to [0, G-1] (rounding at the box
// faces), computed as the truncation of the value clamped first (equal for every x; no floor call on CPUs without
// SSE4.1). x is finite here.
TFMO_FN uint rm_axis_cell(float x, float lo, float inv_cs, uint G) {
  return uint(rm_min(rm_max((x - lo) * inv_cs, 0.0f), float(G - 1)));
}

// One unit coordinate of the midpoint tm of a sample (see the conventions): clamp((o + tm d - lo) * inv_ext, 0, 1).
TFMO_FN float rm_unit_coord(float o, float d, float tm, float lo, float inv_ext) {
  return rm_min(rm_max((o + tm * d - lo) * inv_ext, 0.0f), 1.0f);
}

// Is bit `cell` set, given the byte bits[cell >> 3]?
TFMO_FN bool rm_bit(uint byte_value, uint cell) { return ((byte_value >> (cell & 7u)) & 1u) != 0u; }

// Marching state of one ray.
struct RmRay {
  float o[3], d[3], inv_d[3];
  float t, t_hi;  // next candidate starts at t
  float t1;       // end of the current candidate
  uint c[3];      // cell of the current candidate's midpoint
  uint cell;      // its linear index
  uint skips;     // skipped candidates so far
};

// Slab test on one axis; false if the ray misses the box on it.
TFMO_FN bool rm_slab(float o, float d, float inv_d, float lo, float hi, TFMO_THREAD float* t_lo,
                     TFMO_THREAD float* t_hi) {
  if (d == 0.0f) return o >= lo && o <= hi;
  const float ta = (lo - o) * inv_d, tb = (hi - o) * inv_d;
  *t_lo = tfmo_fmax(*t_lo, tfmo_fmin(ta, tb));  // once per ray: keep IEEE fmin/fmax here
  *t_hi = tfmo_fmin(*t_hi, tfmo_fmax(ta, tb));
  return true;
}

// Starts ray `ray`; false when it gets no samples (misses the box, empty range, or invalid input).
TFMO_FN bool rm_begin(RmParams p, float ox, float oy, float oz, float dx, float dy, float dz,
                      float near_t, float far_t, uint ray, TFMO_THREAD RmRay* s) {
  if (!(tfmo_isfinite(ox) && tfmo_isfinite(oy) && tfmo_isfinite(oz) && tfmo_isfinite(dx) && tfmo_isfinite(dy) &&
        tfmo_isfinite(dz)) ||
      tfmo_isnan(near_t) || tfmo_isnan(far_t))
    return false;
  s->o[0] = ox; s->o[1] = oy; s->o[2] = oz;
  s->d[0] = dx; s->d[1] = dy; s->d[2] = dz;
  for (int i = 0; i < 3; ++i) s->inv_d[i] = s->d[i] != 0.0f ? 1.0f / s->d[i] : 0.0f;
  float t_lo = near_t, t_hi = far_t;
  if (!rm_slab(ox, dx, s->inv_d[0], p.lo_x, p.hi_x, &t_lo, &t_hi) ||
      !rm_slab(oy, dy, s->inv_d[1], p.lo_y, p.hi_y, &t_lo, &t_hi) ||
      !rm_slab(oz, dz, s->inv_d[2], p.lo_z, p.hi_z, &t_lo, &t_hi) || !(t_lo < t_hi))
    return false;
  const float u = p.jitter != 0u ? rm_jitter(p.seed_lo, p.seed_hi, ray) : 0.0f;
  s->t = t_lo + u * rm_dt(t_lo, p.step_size, p.cone_angle, p.max_step);
  s->t_hi = t_hi;
  s->skips = 0;
  return true;
}

// Sets up the next candidate [s->t, s->t1] and its cell; false when the march is over (see conventions; the
// caller also stops after max_samples emitted samples).
TFMO_FN bool rm_candidate(RmParams p, TFMO_THREAD RmRay* s) {
  if (!(s->t < s->t_hi) || s->skips >= p.max_skips) return false;
  const float t1 = rm_min(s->t + rm_dt(s->t, p.step_size, p.cone_angle, p.max_step), s->t_hi);
  if (!(t1 > s->t)) return false;
  s->t1 = t1;
  const float tm = 0.5f * (s->t + t1);
  s->c[0] = rm_axis_cell(s->o[0] + tm * s->d[0], p.lo_x, p.inv_cs_x, p.G);
  s->c[1] = rm_axis_cell(s->o[1] + tm * s->d[1], p.lo_y, p.inv_cs_y, p.G);
  s->c[2] = rm_axis_cell(s->o[2] + tm * s->d[2], p.lo_z, p.inv_cs_z, p.G);
  s->cell = s->c[0] + p.G * (s->c[1] + p.G * s->c[2]);
  return true;
}

// The candidate was emitted: continue at its end.
TFMO_FN void rm_accept(TFMO_THREAD RmRay* s) { s->t = s->t1; }

// The candidate's cell is empty: the largest m such that its block at mip level m is empty (`mip` holds levels
// 1 .. p.mip_levels, see the conventions).
TFMO_FN uint rm_empty_level(RmParams p, TFMO_DEVICE const uchar* mip, TFMO_THREAD const RmRay* s) {
  uint m = 0;
  while (m < p.mip_levels) {
    const uint l = m + 1, g = rm_mip_res(p.G, l);
    const uint cell = (s->c[0] >> l) + g * ((s->c[1] >> l) + g * (s->c[2] >> l));
    if (rm_bit(mip[p.mip_offset[m] + (cell >> 3)], cell)) break;
    m = l;
  }
  return m;
}

// Where the march continues after an empty candidate whose block at mip level m is empty: where the ray leaves
// that block (DDA), or t1 if rounding puts that point at or behind t.
TFMO_FN float rm_skip_to(RmParams p, uint m, TFMO_THREAD const RmRay* s) {
  const float lo[3] = {p.lo_x, p.lo_y, p.lo_z};
  const float cs[3] = {p.cs_x, p.cs_y, p.cs_z};
  float t_next = s->t_hi;
  for (int i = 0; i < 3; ++i) {
    if (s->d[i] == 0.0f) continue;
    const uint k = rm_min_u(((s->c[i] >> m) + (s->d[i] > 0.0f ? 1u : 0u)) << m, p.G);
    const float face = lo[i] + float(k) * cs[i];
    t_next = rm_min((face - s->o[i]) * s->inv_d[i], t_next);
  }
  return t_next > s->t ? t_next : s->t1;
}

TFMO_FN void rm_skip(RmParams p, uint m, TFMO_THREAD RmRay* s) {
  s->t = rm_skip_to(p, m, s);
  s->skips += 1;
}
