// Per-ray math of RayMarch (occupancy-grid ray marching), shared by the CPU kernel (csrc/cpu/ray_march_cpu.cc)
// and the Metal kernels (metal_kernels/ray_march.metal). Rules: device_compat.h. The kernels own the loops over rays
// and the reads of device memory (the occupancy bitfield); everything that decides a sample is here, so the CPU and
// the GPU give the same bits (float32 throughout, no transcendental functions, no fused multiply-adds).
//
// Conventions
//  - Grid: G^3 cells over the box [lo, hi]; cell (i, j, k) covers lo + [i, i+1] * cs per axis (cs = (hi - lo) / G,
//    inv_cs = G / (hi - lo), both computed once by the host in float32). Linear index x + G*(y + G*z); occupancy
//    bit (idx & 7) of byte idx >> 3, LSB first.
//  - Cascades (Instant-NGP's aabb_scale, nerfacc's OccGridEstimator levels): K >= 1 grids of the same G^3 cells;
//    cascade c covers the box scaled by 2^c about its centre, lo_c = lo - ext (2^c - 1) / 2, hi_c = hi + ext (2^c -
//    1) / 2 (ext = hi - lo), cells cs_c = ext 2^c / G, inv_cs_c = G / (ext 2^c) (all float32, computed once by the
//    host; cascade 0 is the box itself with exactly the values above). The bitfield holds the K cascades one after
//    the other, cascade c from byte c * ceil(G^3 / 8). A point belongs to the finest cascade whose closed box
//    contains it (the outermost one for points outside all, which rounding alone produces): rm_cascade. Cells of a
//    cascade c >= 1 that overlap box c - 1 are never a sample's cell (finer data exists there); their bits only make
//    blocks of the occupancy mip of cascade c non-empty. With K = 1 every rule below is the single grid's.
//  - Ray r: o + t d (d need not be unit length; t is in units of |d|). The march covers [t_lo, t_hi] with
//    t_lo = max(near, t_box_enter), t_hi = min(far, t_box_exit) of the outermost cascade's box (slab test; an axis
//    with d = 0 constrains nothing when o is within [lo, hi] on it (boundary included), else the ray misses). No
//    samples unless t_lo < t_hi.
//  - Step rule: dt(t) = min(max(t * cone_angle, step_size), max_step_c), c the cascade of the point
//    o + (t + step_size / 2) d (the midpoint of the shortest step from t: a skip often lands exactly on a cascade
//    box's face, where the cascade of o + t d itself would be a matter of rounding); the host sets
//    max_step_c = max(step_size, sqrt(3) * largest cell size of cascade c) (one cell diagonal, as Instant-NGP), so
//    cone_angle = 0 gives the constant step_size, and with cone_angle > 0 the steps grow with the distance up to one
//    cell of the cascade they are in.
//  - Jitter: the march starts at t = t_lo + u * dt(t_lo), u in [0, 1) from rm_jitter(seed, r) (a counter-based hash
//    of the 64-bit seed and the ray index: the same u on every backend; u = 0 without jitter).
//  - Occupancy mip: level 0 is the grid; level m >= 1 has G_m = ceil(G / 2^m) cells per axis, its cell
//    (X, Y, Z) covering the grid cells with (x >> m, y >> m, z >> m) = (X, Y, Z) (a block of 2^m cells per axis, cut
//    at the grid's far faces), occupied iff one of them is (OR pooling of level m - 1). Levels 1 .. L where
//    L = mip_levels is the largest m with 2^m < G; each stored like the grid (bit X + G_m*(Y + G_m*Z), LSB first)
//    from byte c * mip_stride + mip_offset[m - 1] of one mip buffer for cascade c (each cascade has its own mip),
//    which the kernels build from the bitfield on every call.
//  - Candidate sample: [t, t1] with t1 = min(t + dt(t), t_hi); its midpoint tm = (t + t1) / 2 selects the cascade
//    c and the cell in it. Occupied: the sample is emitted and t = t1. Unoccupied: let m be the largest level whose
//    block (of cascade c's mip) containing the cell is empty (levels are nested, so m = the number of empty levels
//    above 0); t jumps to where the ray leaves that block (DDA: the nearest block face ahead on the axes with
//    d != 0, face index min(((c >> m) + (d > 0)) << m, G) in cells), but not past the point where the ray enters
//    box c - 1 ahead of t (when c >= 1: the finer cascade decides there), or to t1 if rounding puts that point at
//    or behind t. With m = 0 this is the face of the cell itself; larger blocks only skip empty space in fewer
//    steps. The march ends when t >= t_hi, when t1 <= t (float precision exhausted), after max_samples samples, or
//    after K * kRmMaxSkipsPerCell * G + kRmMaxSkipsExtra skipped candidates (a ray crosses at most 3G cell faces
//    per cascade; the cap only bounds rounding corner cases, so a kernel loop always ends).
//  - Sample positions (the op's `positions` output): the midpoint tm = (t_start + t_end) / 2 (the point that
//    selected the sample's cell) in the outermost cascade box's unit coordinates, (o + tm d - lo_{K-1}) * inv_ext
//    per axis with inv_ext = 1 / (ext 2^(K-1)) (float32, computed once by the host), clamped to [0, 1] (the
//    midpoint lies in the box up to rounding): the input of an encoding over that box, such as the hash grid's
//    [0, 1]^3 (with K = 1, the box [lo, hi] itself).
//  - Hence within a ray samples are sorted and non-overlapping (t_start <= t_end <= next t_start), every midpoint
//    lies in an occupied cell, and an all-occupied grid gives t_lo + u dt + k dt (last one cut at t_hi).
//  - Invalid input (NaN/inf origin or direction, NaN near/far): the CPU kernel rejects it before marching; the
//    Metal kernels give that ray no samples (rm_begin returns false for it).
#pragma once

#include "device_compat.h"

TFMO_CONSTANT uint kRmMaxSkipsPerCell = 8;
TFMO_CONSTANT uint kRmMaxSkipsExtra = 64;
TFMO_CONSTANT uint kRmMaxMipLevels = 9;  // 2^9 < G <= 1024 (the largest resolution)
TFMO_CONSTANT uint kRmMaxCascades = 8;   // Instant-NGP's largest aabb_scale, 128 = 2^7

// Kernel parameters (one struct bound with setBytes; the same layout in C++ and MSL: 32-bit scalars and arrays).
// The functions below take it by thread reference (572 bytes: a copy per call would cost more than the march step).
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
  float inv_ext_x, inv_ext_y, inv_ext_z;  // 1 / (hi - lo) of the outermost cascade (sample positions)
  uint K;              // cascades, 1 .. kRmMaxCascades (lo_*, hi_*, cs_*, inv_cs_*, max_step above: cascade 0's)
  uint cascade_bytes;  // bytes of one cascade's bitfield: ceil(G^3 / 8)
  uint mip_stride;     // bytes of one cascade's mip levels (mip_bytes = max(K * mip_stride, 1))
  float c_lo[3 * kRmMaxCascades];      // cascade c's box min, axis i at 3c + i
  float c_hi[3 * kRmMaxCascades];      // its box max
  float c_cs[3 * kRmMaxCascades];      // its cell size
  float c_inv_cs[3 * kRmMaxCascades];  // cells per unit length
  float c_max_step[kRmMaxCascades];    // max(step_size, sqrt(3) * its largest cell size)
};

// Cells per axis of mip level m.
TFMO_FN uint rm_mip_res(uint G, uint m) { return (G + (1u << m) - 1u) >> m; }

// Fills mip_levels, mip_offset, mip_stride and mip_bytes for p->G and p->K.
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
  p->mip_stride = off;
  p->mip_bytes = off > 0u ? off * p->K : 1u;
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

// The cascade of point (x, y, z): the finest whose closed box contains it, else the outermost (see the conventions;
// NaN coordinates compare false: the outermost).
TFMO_FN uint rm_cascade(TFMO_UNIFORM RmParams& p, float x, float y, float z) {
  uint c = 0;
  while (c + 1u < p.K && !(x >= p.c_lo[3u * c] && x <= p.c_hi[3u * c] && y >= p.c_lo[3u * c + 1u] &&
                            y <= p.c_hi[3u * c + 1u] && z >= p.c_lo[3u * c + 2u] && z <= p.c_hi[3u * c + 2u]))
    ++c;
  return c;
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
  uint cell;      // its linear index within its cascade
  uint k;         // its cascade
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

// The cascade whose max_step bounds the step from s->t (the step rule): that of o + (t + step_size / 2) d.
TFMO_FN uint rm_step_cascade(TFMO_UNIFORM RmParams& p, TFMO_THREAD const RmRay* s) {
  if (p.K == 1u) return 0u;
  const float th = s->t + 0.5f * p.step_size;
  return rm_cascade(p, s->o[0] + th * s->d[0], s->o[1] + th * s->d[1], s->o[2] + th * s->d[2]);
}

// Starts ray `ray`; false when it gets no samples (misses the box, empty range, or invalid input).
TFMO_FN bool rm_begin(TFMO_UNIFORM RmParams& p, float ox, float oy, float oz, float dx, float dy, float dz,
                      float near_t, float far_t, uint ray, TFMO_THREAD RmRay* s) {
  if (!(tfmo_isfinite(ox) && tfmo_isfinite(oy) && tfmo_isfinite(oz) && tfmo_isfinite(dx) && tfmo_isfinite(dy) &&
        tfmo_isfinite(dz)) ||
      tfmo_isnan(near_t) || tfmo_isnan(far_t))
    return false;
  s->o[0] = ox; s->o[1] = oy; s->o[2] = oz;
  s->d[0] = dx; s->d[1] = dy; s->d[2] = dz;
  for (int i = 0; i < 3; ++i) s->inv_d[i] = s->d[i] != 0.0f ? 1.0f / s->d[i] : 0.0f;
  float t_lo = near_t, t_hi = far_t;
  const uint outer = 3u * (p.K - 1u);
  if (!rm_slab(ox, dx, s->inv_d[0], p.c_lo[outer], p.c_hi[outer], &t_lo, &t_hi) ||
      !rm_slab(oy, dy, s->inv_d[1], p.c_lo[outer + 1u], p.c_hi[outer + 1u], &t_lo, &t_hi) ||
      !rm_slab(oz, dz, s->inv_d[2], p.c_lo[outer + 2u], p.c_hi[outer + 2u], &t_lo, &t_hi) || !(t_lo < t_hi))
    return false;
  const float u = p.jitter != 0u ? rm_jitter(p.seed_lo, p.seed_hi, ray) : 0.0f;
  s->t = t_lo;
  s->t = t_lo + u * rm_dt(t_lo, p.step_size, p.cone_angle, p.c_max_step[rm_step_cascade(p, s)]);
  s->t_hi = t_hi;
  s->skips = 0;
  return true;
}

// Sets up the next candidate [s->t, s->t1] and its cell; false when the march is over (see conventions; the
// caller also stops after max_samples emitted samples).
TFMO_FN bool rm_candidate(TFMO_UNIFORM RmParams& p, TFMO_THREAD RmRay* s) {
  if (!(s->t < s->t_hi) || s->skips >= p.max_skips) return false;
  const float max_step = p.c_max_step[rm_step_cascade(p, s)];
  const float t1 = rm_min(s->t + rm_dt(s->t, p.step_size, p.cone_angle, max_step), s->t_hi);
  if (!(t1 > s->t)) return false;
  s->t1 = t1;
  const float tm = 0.5f * (s->t + t1);
  const float x = s->o[0] + tm * s->d[0], y = s->o[1] + tm * s->d[1], z = s->o[2] + tm * s->d[2];
  const uint k = p.K > 1u ? rm_cascade(p, x, y, z) : 0u;
  s->k = k;
  s->c[0] = rm_axis_cell(x, p.c_lo[3u * k], p.c_inv_cs[3u * k], p.G);
  s->c[1] = rm_axis_cell(y, p.c_lo[3u * k + 1u], p.c_inv_cs[3u * k + 1u], p.G);
  s->c[2] = rm_axis_cell(z, p.c_lo[3u * k + 2u], p.c_inv_cs[3u * k + 2u], p.G);
  s->cell = s->c[0] + p.G * (s->c[1] + p.G * s->c[2]);
  return true;
}

// Is the candidate's cell occupied? `bits`: the K cascades' bitfields.
TFMO_FN bool rm_occupied(TFMO_UNIFORM RmParams& p, TFMO_DEVICE const uchar* bits, TFMO_THREAD const RmRay* s) {
  return rm_bit(bits[s->k * p.cascade_bytes + (s->cell >> 3)], s->cell);
}

// The candidate was emitted: continue at its end.
TFMO_FN void rm_accept(TFMO_THREAD RmRay* s) { s->t = s->t1; }

// The candidate's cell is empty: the largest m such that its block at mip level m is empty (`mip` holds levels
// 1 .. p.mip_levels, see the conventions).
TFMO_FN uint rm_empty_level(TFMO_UNIFORM RmParams& p, TFMO_DEVICE const uchar* mip, TFMO_THREAD const RmRay* s) {
  uint m = 0;
  const uint base = s->k * p.mip_stride;
  while (m < p.mip_levels) {
    const uint l = m + 1, g = rm_mip_res(p.G, l);
    const uint cell = (s->c[0] >> l) + g * ((s->c[1] >> l) + g * (s->c[2] >> l));
    if (rm_bit(mip[base + p.mip_offset[m] + (cell >> 3)], cell)) break;
    m = l;
  }
  return m;
}

// Where the ray enters box c (a cascade's) ahead of t, that is after t and no later than t_hi; t_hi when it does
// not (slab test on [t, t_hi]: the entry is ahead iff the clipped interval is non-empty and starts after t).
TFMO_FN float rm_enter_ahead(TFMO_UNIFORM RmParams& p, uint c, TFMO_THREAD const RmRay* s) {
  float t_in = s->t, t_out = s->t_hi;
  for (uint i = 0; i < 3u; ++i) {
    const float lo = p.c_lo[3u * c + i], hi = p.c_hi[3u * c + i];
    if (s->d[i] == 0.0f) {
      if (!(s->o[i] >= lo && s->o[i] <= hi)) return s->t_hi;
      continue;
    }
    const float ta = (lo - s->o[i]) * s->inv_d[i], tb = (hi - s->o[i]) * s->inv_d[i];
    t_in = rm_max(rm_min(ta, tb), t_in);
    t_out = rm_min(rm_max(ta, tb), t_out);
  }
  return t_in <= t_out && t_in > s->t ? t_in : s->t_hi;
}

// Where the march continues after an empty candidate whose block at mip level m is empty: where the ray leaves
// that block (DDA), or where it enters the next finer cascade's box if that comes first, or t1 if rounding puts
// that point at or behind t.
TFMO_FN float rm_skip_to(TFMO_UNIFORM RmParams& p, uint m, TFMO_THREAD const RmRay* s) {
  const uint b = 3u * s->k;
  float t_next = s->t_hi;
  for (uint i = 0; i < 3u; ++i) {
    if (s->d[i] == 0.0f) continue;
    const uint k = rm_min_u(((s->c[i] >> m) + (s->d[i] > 0.0f ? 1u : 0u)) << m, p.G);
    const float face = p.c_lo[b + i] + float(k) * p.c_cs[b + i];
    t_next = rm_min((face - s->o[i]) * s->inv_d[i], t_next);
  }
  if (s->k > 0u) t_next = rm_min(rm_enter_ahead(p, s->k - 1u, s), t_next);
  return t_next > s->t ? t_next : s->t1;
}

TFMO_FN void rm_skip(TFMO_UNIFORM RmParams& p, uint m, TFMO_THREAD RmRay* s) {
  s->t = rm_skip_to(p, m, s);
  s->skips += 1;
}
