"""NumPy float64 reference of RayMarch (written from the conventions in csrc/shared/ray_march_math.h), plus input
makers shared by the CPU and emulated-GPU tests.

float64 and float32 may take different discrete decisions where a quantity lands within rounding of a threshold
(a midpoint on a cell face, t + dt on t_exit, ...). The reference records, per ray, the smallest distance (in t)
of any decision it took from its threshold: `margin`. Rays with a margin below MARGIN_EPS are "ambiguous" and are
compared only for sortedness, not for the exact sample count.
"""

import numpy as np

MARGIN_EPS = 1e-4  # t units; the float32 kernels drift ~1e-6 from float64 over a few hundred steps
T_ATOL = 5e-5
MAX_SKIPS_PER_CELL = 8
MAX_SKIPS_EXTRA = 64


def hash_u32(x):
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    x ^= x >> 16
    return x


def jitter_u(seed, ray):
    s = int(seed) & 0xFFFFFFFFFFFFFFFF
    lo, hi = s & 0xFFFFFFFF, s >> 32
    h = hash_u32(ray ^ hash_u32(lo ^ hash_u32((hi + 0x9E3779B9) & 0xFFFFFFFF)))
    return (h >> 8) / 16777216.0


def unpack(bits, G):
    return np.unpackbits(np.asarray(bits, np.uint8), bitorder="little")[: G**3].astype(bool)


def pack(occ):
    return np.packbits(np.asarray(occ, bool).reshape(-1), bitorder="little")


def mip_levels(occ, G):
    """Levels 1 .. L of the occupancy mip (ray_march_math.h): level m is a bool [G_m, G_m, G_m] array indexed
    [z, y, x], G_m = ceil(G / 2^m), each the OR of the 2x2x2 blocks of the level below; L the largest m with
    2^m < G."""
    level = np.asarray(occ, bool).reshape(G, G, G)
    levels = []
    while 2 ** (len(levels) + 1) < G:
        n = level.shape[0]
        h = (n + 1) // 2
        padded = np.zeros((2 * h,) * 3, bool)
        padded[:n, :n, :n] = level
        level = padded.reshape(h, 2, h, 2, h, 2).any(axis=(1, 3, 5))
        levels.append(level)
    return levels


def cascade_boxes(lo, hi, K):
    """Cascade c's box (ray_march_math.h, cascades): the box [lo, hi] scaled by 2^c about its centre -> (c_lo [K, 3],
    c_hi [K, 3]) in float64."""
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    grow = np.array([(2.0**c - 1.0) / 2.0 for c in range(K)])[:, None] * (hi - lo)
    return lo - grow, hi + grow


def cascade_of(p, c_lo, c_hi):
    """The finest cascade whose closed box contains point p, else the outermost."""
    for c in range(len(c_lo) - 1):
        if np.all(p >= c_lo[c]) and np.all(p <= c_hi[c]):
            return c
    return len(c_lo) - 1


def _cascade_margin(p, d, c_lo, c_hi):
    """Distance in t (x2, as for cell faces) of point p from the faces of the cascade boxes 0 .. K-2 that could
    change its cascade (a face counts where p is within the box on the other two axes, up to 1e-6)."""
    m = np.inf
    for c in range(len(c_lo) - 1):
        for i in range(3):
            if d[i] == 0.0:
                continue
            others = [j for j in range(3) if j != i]
            if np.all(p[others] >= c_lo[c][others] - 1e-6) and np.all(p[others] <= c_hi[c][others] + 1e-6):
                m = min(m, 2.0 * min(abs(p[i] - c_lo[c][i]), abs(p[i] - c_hi[c][i])) / abs(d[i]))
    return m


def march_ray(o, d, near, far, occ, G, lo, hi, step, cone, max_samples, u, mip=None, cascades=1):
    """One ray in float64 -> (list of (t0, t1), margin). ``occ``: bool [K * G^3] (cascade c's cells from c * G^3);
    ``mip``: one mip_levels(...) list per cascade (computed if None)."""
    K = int(cascades)
    occ = np.asarray(occ, bool).reshape(K, G**3)
    if mip is None:
        mip = [mip_levels(occ[c], G) for c in range(K)]
    o, d = np.asarray(o, np.float64), np.asarray(d, np.float64)
    c_lo, c_hi = cascade_boxes(lo, hi, K)
    c_cs = (c_hi - c_lo) / G
    max_step = np.maximum(step, np.sqrt(3.0) * c_cs.max(axis=1))
    margin = np.inf
    t_lo, t_hi = float(near), float(far)
    for i in range(3):
        if d[i] == 0.0:
            if o[i] < c_lo[-1][i] or o[i] > c_hi[-1][i]:
                return [], margin
            continue
        ta, tb = (c_lo[-1][i] - o[i]) / d[i], (c_hi[-1][i] - o[i]) / d[i]
        t_lo, t_hi = max(t_lo, min(ta, tb)), min(t_hi, max(ta, tb))
    if not t_lo < t_hi:
        if np.isfinite(t_lo) and np.isfinite(t_hi):
            margin = min(margin, abs(t_hi - t_lo))
        return [], margin
    margin = min(margin, t_hi - t_lo)

    def dt_of(t):
        """dt at t (max_step of the cascade of o + (t + step / 2) d), with the distance of t * cone from the
        clamp's thresholds."""
        ph = o + (t + 0.5 * step) * d
        c = cascade_of(ph, c_lo, c_hi) if np.isfinite(t) else K - 1
        raw = t * cone
        m = min(abs(raw - step), abs(raw - max_step[c])) / max(cone, 1e-30) if cone > 0 else np.inf
        near_c = max_step[max(c - 1, 0):c + 2]
        if K > 1 and np.isfinite(t) and np.ptp(np.minimum(max(raw, step), near_c)) > 0:
            m = min(m, _cascade_margin(ph, d, c_lo, c_hi))  # the cascade choice changes dt here
        return min(max(raw, step), max_step[c]), m

    dt0, m0 = dt_of(t_lo)
    margin = min(margin, m0 * max(u, 1e-30) if u > 0 else np.inf)
    t = t_lo + u * dt0
    samples = []
    skips = 0
    max_skips = K * MAX_SKIPS_PER_CELL * G + MAX_SKIPS_EXTRA
    while len(samples) < max_samples:
        if not t < t_hi or skips >= max_skips:
            break
        margin = min(margin, t_hi - t)
        dt, m = dt_of(t)
        margin = min(margin, m)
        t1 = min(t + dt, t_hi)
        margin = min(margin, abs(t + dt - t_hi))
        tm = 0.5 * (t + t1)
        p = o + tm * d
        k = cascade_of(p, c_lo, c_hi)
        if K > 1:
            margin = min(margin, _cascade_margin(p, d, c_lo, c_hi))
        x = (p - c_lo[k]) / c_cs[k]
        c = np.clip(np.floor(x), 0, G - 1).astype(np.int64)
        # distance (in t) of the midpoint from the nearest cell face it could be confused with
        for i in range(3):
            if d[i] != 0.0:
                frac = x[i] - np.floor(x[i])
                margin = min(margin, 2.0 * min(frac, 1.0 - frac) * c_cs[k][i] / abs(d[i]))
        cell = c[0] + G * (c[1] + G * c[2])
        if occ[k][cell]:
            samples.append((t, t1))
            t = t1
        else:
            m = 0  # the largest mip level whose block around the cell is empty
            mk = mip[k]
            while m < len(mk) and not mk[m][c[2] >> (m + 1), c[1] >> (m + 1), c[0] >> (m + 1)]:
                m += 1
            t_next = t_hi
            for i in range(3):
                if d[i] != 0.0:
                    kf = min(((c[i] >> m) + (1 if d[i] > 0 else 0)) << m, G)
                    face = c_lo[k][i] + kf * c_cs[k][i]
                    t_next = min(t_next, (face - o[i]) / d[i])
            if k > 0:  # not past the entry into the next finer cascade's box
                t_in, t_out, hit = t, t_hi, True
                for i in range(3):
                    if d[i] == 0.0:
                        hit &= c_lo[k - 1][i] <= o[i] <= c_hi[k - 1][i]
                        continue
                    ta, tb = (c_lo[k - 1][i] - o[i]) / d[i], (c_hi[k - 1][i] - o[i]) / d[i]
                    t_in, t_out = max(t_in, min(ta, tb)), min(t_out, max(ta, tb))
                if hit and t_in <= t_out and t_in > t:
                    t_next = min(t_next, t_in)
            t = t_next if t_next > t else t1
            skips += 1
    return samples, margin


def march(rays_o, rays_d, near, far, bits, aabb, G, step, cone=0.0, max_samples=1024, jitter=True, seed=0,
          use_mip=True, cascades=1):
    """All rays -> (counts [R], t0 list of arrays, t1 list of arrays, margins [R]). use_mip=False: skip one cell at
    a time (the rule without the mip: other landing points, the same occupied cells). bits: the ``cascades``
    bitfields, [K, ceil(G^3 / 8)] (or flat for K = 1)."""
    K = int(cascades)
    bits = np.asarray(bits, np.uint8).reshape(K, -1)
    occ = np.stack([unpack(bits[c], G) for c in range(K)])
    mip = [mip_levels(occ[c], G) if use_mip else [] for c in range(K)]
    aabb = np.asarray(aabb, np.float64)
    lo, hi = aabb[0], aabb[1]
    R = len(rays_o)
    near = np.broadcast_to(np.asarray(near, np.float64), (R,))
    far = np.broadcast_to(np.asarray(far, np.float64), (R,))
    counts, t0s, t1s, margins = [], [], [], []
    for r in range(R):
        u = jitter_u(seed, r) if jitter else 0.0
        s, m = march_ray(rays_o[r], rays_d[r], near[r], far[r], occ, G, lo, hi, float(step), float(cone),
                         max_samples, u, mip, cascades=K)
        counts.append(len(s))
        t0s.append(np.array([a for a, _ in s]))
        t1s.append(np.array([b for _, b in s]))
        margins.append(m)
    return np.array(counts), t0s, t1s, np.array(margins)


def make_rays(R, seed=0, aabb=((-1, -1, -1), (1, 1, 1)), kinds=("outside", "inside", "miss", "axis")):
    """Rays of several kinds, float32: aimed at the box from outside, starting inside, missing the box, and
    axis-parallel (two zero direction components) ones."""
    rng = np.random.default_rng(seed)
    lo, hi = np.asarray(aabb, np.float64)
    center, half = (lo + hi) / 2, (hi - lo) / 2
    o = np.zeros((R, 3))
    d = np.zeros((R, 3))
    for r in range(R):
        kind = kinds[r % len(kinds)]
        if kind == "outside":
            o[r] = center + _unit(rng) * 2.5 * half.max()
            target = center + rng.uniform(-0.8, 0.8, 3) * half
            d[r] = _normalise(target - o[r])
        elif kind == "inside":
            o[r] = center + rng.uniform(-0.9, 0.9, 3) * half
            d[r] = _unit(rng)
        elif kind == "miss":
            o[r] = center + np.array([0.0, 0.0, 3.0]) * half.max() + rng.uniform(-0.5, 0.5, 3)
            d[r] = _normalise(np.array([rng.uniform(0.5, 1.0), rng.uniform(-0.2, 0.2), 1.0]))  # away from the box
        else:  # axis-parallel: through the box along one axis
            axis = r % 3
            o[r] = center + rng.uniform(-0.9, 0.9, 3) * half
            o[r][axis] = center[axis] - 2.0 * half[axis]
            d[r] = 0.0
            d[r][axis] = 1.0 if rng.uniform() < 0.5 else -1.0
            if d[r][axis] < 0:
                o[r][axis] = center[axis] + 2.0 * half[axis]
    return o.astype(np.float32), d.astype(np.float32)


def _unit(rng):
    v = rng.normal(size=3)
    return v / np.linalg.norm(v)


def _normalise(v):
    return v / np.linalg.norm(v)


def random_bits(G, p, seed=0):
    rng = np.random.default_rng(seed)
    return pack(rng.uniform(size=G**3) < p)


def sphere_shell_bits(G, r_in, r_out, aabb=((-1, -1, -1), (1, 1, 1))):
    lo, hi = np.asarray(aabb, np.float64)
    cs = (hi - lo) / G
    idx = np.arange(G**3)
    ijk = np.stack([idx % G, (idx // G) % G, idx // (G * G)], axis=1)
    centers = lo + (ijk + 0.5) * cs
    rad = np.linalg.norm(centers - (lo + hi) / 2, axis=1)
    return pack((rad >= r_in) & (rad <= r_out))
