"""The cases of the GPU proxy benchmark (dev/gpu_proxy/run.py): inputs at NeRF sizes, the kernels' argument packing
(entry order of dev/gpu_proxy/build.py's launch contract), and NumPy float64 references. NumPy only: importable without a
GPU, CuPy or TensorFlow (tests/test_gpu_proxy_bench.py checks the references against the package's CPU ops and the
packing against the PTX entry signatures).

Conventions:
  - a Case is one timed row: `launches` run in order (each a kernel of one PTX module), after `setup` launches that
    run before every repetition outside the timed interval (zeroing an accumulator, restoring in-place data);
  - arrays live in Case.arrays by name; a Launch names them in its `args` (("buf", name) or ("u32", value)), in the
    entry's parameter order without the grid; MSL kernels get their dispatch as `threads` per grid (x, y, z) and
    `group` threads per threadgroup (dispatchThreads: blocks = ceil(threads / group)), baselines raw CUDA blocks;
  - Case.reference() maps an output array to (reference, tolerance[, index]): |got[index] - ref| <= tolerance
    elementwise (an array or a scalar; index: the part of the output the reference covers, e.g. the first 2^16 points
    of a per-point output); references are computed on demand, in float64 from the same float32/float16 inputs;
  - `bound`: ("copy", bytes) = the bytes the kernel must move at the GPU's measured copy bandwidth, or
    ("case", name) = another case's measured time (a bare CUDA gather/scatter).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

# ---- the shared structs (csrc/shared/*_math.h), as NumPy dtypes; dev/gpu_proxy/build.py's PTX carries their sizeof ----
HG_LEVEL = np.dtype([("offset", "<u4"), ("size", "<u4"), ("resolution", "<u4"), ("mode", "<u4"),
                     ("n_stride_dims", "<u4"), ("scale", "<f4"), ("stride", "<u4", (4,))])
HG_ARGS = np.dtype([(n, "<u4") for n in ("n", "dims", "n_features", "n_levels", "n_active", "interpolation", "count",
                                         "n_aggregate", "order", "slot", "level_group",
                                         "feature_major")])
VR_PARAMS = np.dtype([("R", "<u4"), ("S", "<u4"), ("C", "<u4"), ("bg_mode", "<u4"), ("threshold", "<f4")])
DL_PARAMS = np.dtype([("R", "<u4"), ("S", "<u4")])
VRP_PARAMS = np.dtype([("R", "<u4"), ("N", "<u4"), ("C", "<u4"), ("bg_mode", "<u4"), ("threshold", "<f4")])
DLP_PARAMS = np.dtype([("R", "<u4"), ("N", "<u4")])
VRP_LANES = 32  # threads per ray of the render kernels, dense and packed (kVrpLanes, csrc/shared/render_math.h)
RM_MAX_MIP_LEVELS = 9
RM_MAX_CASCADES = 8
RM_SCAN_BLOCK = 256
RM_PARAMS = np.dtype([(n, "<u4") for n in ("R", "G", "max_samples", "jitter", "seed_lo", "seed_hi")] +
                     [(n, "<f4") for n in ("lo_x", "lo_y", "lo_z", "cs_x", "cs_y", "cs_z", "inv_cs_x", "inv_cs_y",
                                           "inv_cs_z", "step_size", "cone_angle", "max_step")] +
                     [("max_skips", "<u4"), ("hi_x", "<f4"), ("hi_y", "<f4"), ("hi_z", "<f4"), ("mip_levels", "<u4"),
                      ("mip_offset", "<u4", (RM_MAX_MIP_LEVELS,)), ("mip_bytes", "<u4"),
                      ("inv_ext_x", "<f4"), ("inv_ext_y", "<f4"), ("inv_ext_z", "<f4"),
                      ("K", "<u4"), ("cascade_bytes", "<u4"), ("mip_stride", "<u4"),
                      ("c_lo", "<f4", (3 * RM_MAX_CASCADES,)), ("c_hi", "<f4", (3 * RM_MAX_CASCADES,)),
                      ("c_cs", "<f4", (3 * RM_MAX_CASCADES,)), ("c_inv_cs", "<f4", (3 * RM_MAX_CASCADES,)),
                      ("c_max_step", "<f4", (RM_MAX_CASCADES,))])
RM_SCAN_PARAMS = np.dtype([("n", "<u4"), ("offset", "<u4")])
FM_MAX_MATRICES = 9
FM_ARGS = np.dtype([(n, "<u4") for n in ("n", "n_input", "in_pad", "n_output", "out_pad", "n_matrices", "use_bias",
                                         "training", "feature_major", "blocks", "parts", "total",
                                         "weights_resident")] +
                   [(n, "<u4", (FM_MAX_MATRICES,)) for n in ("weight_offset", "bias_offset", "weight_tg_offset")])

# MSL element type of a buffer parameter -> the NumPy dtype a launcher binds (structs: the dtypes above).
MSL_DTYPES = {"float": np.float32, "half": np.float16, "int": np.int32, "uint": np.uint32, "long": np.int64,
              "ulong": np.uint64, "uchar": np.uint8, "char": np.int8, "short": np.int16, "ushort": np.uint16,
              "atomic_int": np.int32, "atomic_uint": np.uint32, "atomic_float": np.float32,
              "HgLevel": HG_LEVEL, "HgArgs": HG_ARGS, "VrParams": VR_PARAMS, "DlParams": DL_PARAMS,
              "VrpParams": VRP_PARAMS, "DlpParams": DLP_PARAMS, "RmParams": RM_PARAMS, "RmScanParams": RM_SCAN_PARAMS,
              "FmArgs": FM_ARGS}


def struct(dtype, **fields) -> np.ndarray:
    a = np.zeros(1, dtype)
    for k, v in fields.items():
        a[0][k] = v
    return a


@dataclasses.dataclass
class Launch:
    module: str  # PTX module path relative to the build dir, without .ptx: "hash_grid", "msl2.4/hash_grid", "baselines"
    kernel: str
    args: list  # ("buf", array name) | ("u32", value) | ("f32", value) | ("host", ndarray), entry order, without the grid
    threads: tuple  # MSL: threads per grid; baseline: blocks
    group: tuple  # threads per threadgroup / block
    shared: int = 0  # dynamic shared memory bytes (the rounded [[threadgroup(n)]] lengths)
    # module "tcnn": a host function of the --tcnn library (dev/gpu_proxy/tcnn_*.cu) instead; module "cupy": a
    # function of dev/gpu_proxy/unfused_mlp.py, args ("buf", name) or ("spec", a Python value)
    msl: bool = True
    constants: dict = dataclasses.field(default_factory=dict)  # function constants (name: int), set before the launch


@dataclasses.dataclass
class Case:
    name: str
    family: str
    launches: list[Launch]
    arrays: dict[str, np.ndarray]
    reference: Callable[[], dict]  # -> {array name: (expected, tolerance)}
    bound: tuple  # ("copy", bytes) | ("case", name)
    setup: list[Launch] = dataclasses.field(default_factory=list)
    restore: tuple = ()  # arrays re-uploaded from `arrays` before each repetition (in-place kernels)
    # extra checks on the outputs: a list of failures, or (failures, the largest |error| / tolerance they compared)
    check: Callable[[dict], list[str] | tuple[list[str], float]] | None = None
    note: str = ""
    # prepare(case, device): creates arrays that depend on an earlier pass on the device (device.launch(Launch),
    # device.download(name) -> ndarray); device None (a dry run): placeholders of the right dtypes.
    prepare: Callable | None = None

    def bound_bytes(self) -> int:
        kind, what = self.bound
        assert kind == "copy"
        return what if isinstance(what, int) else nbytes(self.arrays, *what)


def nbytes(arrays: dict, *names) -> int:
    return int(sum(arrays[n].nbytes for n in names))


def within(got, ref, tol) -> tuple[bool, float]:
    """Elementwise |got - ref| <= tol (NaN in the same places); returns (ok, max |got - ref| / tol)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    nan = np.isnan(ref)
    if not np.array_equal(np.isnan(got), nan):
        return False, float("inf")
    err = np.abs(got - ref)[~nan]
    t = np.broadcast_to(np.asarray(tol, np.float64), ref.shape)[~nan]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = float(np.max(np.where(err == 0, 0.0, err / t))) if err.size else 0.0  # tolerance 0: inf if any error
    return bool(np.all(err <= t)), ratio


# ==== hash grid ===================================================================================================
HG_PRIMES = np.array([1, 2654435761, 805459861, 3674653429], np.uint32)
HG_MAX_BASE = {1: 0xFFFFFFFF, 2: 0xFFFF, 3: 0x659, 4: 0xFF}


def hg_log2_scale(per_level_scale) -> np.float32:
    """log2(b) rounded once to float32 (tiny-cuda-nn's host: std::log2 of the float b)."""
    return np.float32(np.log2(np.float64(np.float32(per_level_scale))))


def hg_level_table(dims, n_levels, log2_hashmap_size, base_resolution, per_level_scale):
    """(levels [L] HG_LEVEL, rows): csrc/shared/hash_grid_math.h hg_level_table for hash grids (tcnn's float32
    level scales, every step rounded to float32)."""
    k_max = 0xFFFFFFFF // 2
    levels, offset = np.zeros(n_levels, HG_LEVEL), 0
    log2_b = hg_log2_scale(per_level_scale)
    for l in range(n_levels):
        x = np.float32(np.float64(l) * np.float64(log2_b))
        m = np.float32(np.float64(np.float32(np.exp2(np.float64(x)))) * base_resolution)
        scale = np.float32(np.float64(m) - 1.0)
        res = int(np.ceil(scale)) + 1
        dense = 1
        for _ in range(dims):
            dense = k_max + 1 if dense > k_max // res else dense * res
        size = (min(dense, k_max) + 7) // 8 * 8
        size = min(size, 1 << log2_hashmap_size)
        row_major = res <= HG_MAX_BASE[dims]
        stride, bound, st = [0, 0, 0, 0], 0, 1
        if row_major:
            for d in range(dims):
                stride[d] = st
                bound += res * st
                st *= res
        else:
            st = 0xFFFFFFFF
        mode = 0 if size < st else (1 if row_major and bound < 2 * size else 2)
        levels[l] = (offset, size, res, mode, dims if row_major else 0, scale, stride)
        offset += size
    return levels, offset


def hg_point(x, scale):
    """Per point of one level: grid coordinates (uint32), weights w and dw/dx (float64), as hg_coord (linear)."""
    inside = (x >= 0) & (x <= 1)
    xc = np.where(x >= 0, np.where(x <= 1, x, 1.0), 0.0).astype(np.float32)
    pos = (np.float64(scale) * xc.astype(np.float64) + 0.5).astype(np.float32)  # exact, then one rounding (fma)
    g = pos.astype(np.uint32)
    w = (pos - g.astype(np.float32)).astype(np.float64)
    dw = np.where(inside, np.float64(scale), 0.0)
    return g, w, dw


def hg_rows(lv, g):
    """Table rows [n, 2^D] (level offset included) of every corner."""
    n, dims = g.shape
    rows = np.empty((n, 1 << dims), np.int64)
    size = np.uint32(lv["size"])
    for c in range(1 << dims):
        gc = g + np.array([(c >> d) & 1 for d in range(dims)], np.uint32)
        if lv["mode"] == 0:
            h = np.zeros(n, np.uint32)
            for d in range(dims):
                h ^= gc[:, d] * HG_PRIMES[d]
            idx = h & (size - np.uint32(1))
        else:
            s = np.zeros(n, np.uint32)
            for d in range(dims):
                s += gc[:, d] * np.uint32(lv["stride"][d])
            idx = np.where(s >= size, s - size, s) if lv["mode"] == 1 else s % size
        rows[:, c] = int(lv["offset"]) + idx.astype(np.int64)
    return rows


def hg_weight(w, c, skip=()):
    """prod over dims d not in skip of (bit d of c ? w_d : 1 - w_d), per point."""
    r = np.ones(w.shape[0])
    for d in range(w.shape[1]):
        if d not in skip:
            r = r * (w[:, d] if (c >> d) & 1 else 1.0 - w[:, d])
    return r


def hg_reference(x, params, levels, dy, ddx, F, parts, n_points=None):
    """Float64 hash-grid references (linear interpolation, all levels active) of `parts`:
      per point, for the first n_points points (all by default): "out" (encode), "dx" (position gradient),
        "ddy" and "dx2" (second order: d/d(dy), d/dx);
      scattered over all points: "grad_params" and "grad2_params" (and "abs_grad_params"/"abs_grad2_params", the sums
        of |term| per entry: the scale of float32 summation error)."""
    m = len(x) if n_points is None else min(len(x), n_points)
    if not {"grad_params", "grad2_params"} & set(parts):
        x, dy, ddx = x[:m], dy[:m], ddx[:m]  # per-point parts only: the other points are not needed
    n, dims = x.shape
    L, rows_total = len(levels), params.shape[0]
    p64 = params.astype(np.float64)
    dy64 = dy.astype(np.float64).reshape(n, L, F)
    dd = ddx.astype(np.float64)
    per_point = {"out", "dx", "ddy", "dx2"} & set(parts)
    res = {k: np.zeros((m, L, F)) for k in ("out", "ddy") if k in parts}
    res.update({k: np.zeros((m, dims)) for k in ("dx", "dx2") if k in parts})
    for k in ("grad_params", "grad2_params"):
        if k in parts:
            res[k], res["abs_" + k] = np.zeros(rows_total * F), np.zeros(rows_total * F)
    nc = 1 << dims

    def second_weights(w, dw, k_points):  # v[c] = sum_k ddx_k sign_k(c) dw_k W_c^{-k}
        v = np.zeros((k_points, nc))
        for c in range(nc):
            for k in range(dims):
                sign = 1.0 if (c >> k) & 1 else -1.0
                v[:, c] += dd[:k_points, k] * sign * dw[:, k] * hg_weight(w, c, (k,))
        return v

    for l, lv in enumerate(levels):
        g, w, dw = hg_point(x, lv["scale"])
        rows = hg_rows(lv, g)
        W = np.stack([hg_weight(w, c) for c in range(nc)], axis=1)
        if per_point:
            vals = p64[rows[:m]]  # [m, nc, F]
            wm, dwm = w[:m], dw[:m]
            if "out" in parts:
                res["out"][:, l] = np.einsum("nc,ncf->nf", W[:m], vals)
            s = np.einsum("nf,ncf->nc", dy64[:m, l], vals)
            if "ddy" in parts:
                res["ddy"][:, l] = np.einsum("nc,ncf->nf", second_weights(wm, dwm, m), vals)
            for k in range(dims):
                bk = 1 << k
                if "dx" in parts:
                    acc = sum(hg_weight(wm, c, (k,)) * (s[:, c | bk] - s[:, c]) for c in range(nc) if not c & bk)
                    res["dx"][:, k] += dwm[:, k] * acc
                if "dx2" not in parts:
                    continue
                for j in range(dims):
                    if j == k:
                        continue  # linear: d2w/dx2 = 0
                    bj = 1 << j
                    acc2 = sum(hg_weight(wm, c, (k, j)) * (s[:, c | bk | bj] - s[:, c | bk] - s[:, c | bj] + s[:, c])
                               for c in range(nc) if not (c & bk or c & bj))
                    res["dx2"][:, j] += dd[:m, k] * dwm[:, k] * dwm[:, j] * acc2
        # Scatter into this level's rows only: one bincount per output over all (point, corner, feature).
        lo, size = int(lv["offset"]) * F, int(lv["size"]) * F
        idx = (((rows - int(lv["offset"])) * F)[:, :, None] + np.arange(F)).reshape(-1)
        for key, weights in (("grad_params", lambda: W), ("grad2_params", lambda: second_weights(w, dw, n))):
            if key in parts:
                term = (weights()[:, :, None] * dy64[:, l, None, :]).reshape(-1)
                res[key][lo:lo + size] += np.bincount(idx, term, size)
                res["abs_" + key][lo:lo + size] += np.bincount(idx, np.abs(term), size)
    for k in ("out", "ddy"):
        if k in res:
            res[k] = res[k].reshape(m, L * F)
    return res


def hash_grid_cases(n=1 << 20, n_levels=16, F=2, log2_T=19, base=16, per_level_scale=1.3819, seed=0,
                    tcnn=False) -> list[Case]:
    """Encode (float32/float16 tables), param gradient (native atomics, the MSL 2.4 CAS loop, float16 dy), position
    gradient and second order, each beside its bare CUDA bound (dev/gpu_proxy/baselines.cu), at
    Instant-NGP's NeRF configuration: 2^20 points, 16 levels, F = 2, D = 3, 2^19 rows per level, base 16, scale
    1.3819. tcnn: also tiny-cuda-nn's own forward and backward kernels (tcnn_cases), from the --tcnn library."""
    rng = np.random.default_rng(seed)
    D = 3
    levels, rows = hg_level_table(D, n_levels, log2_T, base, per_level_scale)
    x = rng.random((n, D), dtype=np.float32)
    params = rng.uniform(-1, 1, (rows, F)).astype(np.float32)
    dy = rng.uniform(-1, 1, (n, n_levels * F)).astype(np.float32)
    ddx = rng.uniform(-1, 1, (n, D)).astype(np.float32)
    args = struct(HG_ARGS, n=n, dims=D, n_features=F, n_levels=n_levels, n_active=n_levels, interpolation=1,
                  count=rows * F)
    arrays = {"x": x, "params": params, "params16": params.astype(np.float16), "dy": dy, "dy16": dy.astype(np.float16),
              "dy_fm": np.ascontiguousarray(dy.T),
              "ddx": ddx, "levels": levels, "args": args,
              "out": np.zeros((n, n_levels * F), np.float32), "out16": np.zeros((n, n_levels * F), np.float16),
              "out_fm": np.zeros((n_levels * F, n), np.float32), "out16_fm": np.zeros((n_levels * F, n), np.float16),
              "acc": np.zeros(rows * F, np.float32), "dx": np.zeros((n, D), np.float32),
              "ddy": np.zeros((n, n_levels * F), np.float32), "dx2": np.zeros((n, D), np.float32)}
    ref_cache = {}
    check_points = min(n, 1 << 16)  # per-point outputs are checked on the first 2^16 points of the timed run

    def ref(half=False, part="out"):
        key = (half, part)
        if key not in ref_cache:
            ref_cache[key] = hg_reference(x, arrays["params16"] if half else params, levels,
                                          arrays["dy16"] if half else dy, ddx, F, (part,), check_points)
        return ref_cache[key]

    def enc_tol(r, half):
        return (1e-3 if half else 2e-6) * (np.abs(r["out"]) + 1.0)

    def first(ref_arr, tol):  # compare the first rows of the output with a reference of those rows
        return ref_arr, tol, slice(0, len(ref_arr))

    def pp_tol(a):
        return 1e-4 * (np.abs(a) + 1e-2 * np.abs(a).max())

    grid2 = (n, n_levels, 1)  # the table-gradient scatters: threadgroups 1-D along the points, one level each
    tg = (256, 1, 1)
    enc_group = (256, 1, 1)  # encode: one thread per (point, level)
    blocks = ((n + 511) // 512, n_levels, 1)
    zero_acc = [Launch("hash_grid", "hash_grid_fill_zero", [("buf", "acc"), ("buf", "args")], (rows * F, 1, 1), (256, 1, 1))]
    table = nbytes(arrays, "params")  # read once at least (L2 may hold the coarse levels)
    cases = []
    for t, half in (("float32", False), ("float16", True)):
        p, o, ofm = ("params16", "out16", "out16_fm") if half else ("params", "out", "out_fm")
        bt = "f16" if half else "f32"
        io = nbytes(arrays, "x", o)
        cases += [
            Case(f"hg_gather_{bt} (bare, tcnn launch, our layout)", "hash_grid",
                 [Launch("baselines", f"hg_gather_{bt}_F2_D3", [("buf", "x"), ("buf", p), ("buf", "levels"),
                                                               ("u32", n), ("u32", n_levels), ("buf", o)],
                         blocks, (512, 1, 1), msl=False)],
                 arrays, lambda half=half: {("out16" if half else "out"): first(ref(half)["out"], enc_tol(ref(half), half))},
                 ("copy", io + table)),
            Case(f"hg_gather_{bt} (bare, tcnn launch, tcnn layout)", "hash_grid",
                 [Launch("baselines", f"hg_gather_{bt}_F2_D3_feature_major",
                         [("buf", "x"), ("buf", p), ("buf", "levels"), ("u32", n), ("u32", n_levels), ("buf", ofm)],
                         blocks, (512, 1, 1), msl=False)],
                 arrays, lambda half=half, ofm=ofm: {ofm: (ref(half)["out"].T, enc_tol(ref(half), half).T,
                                                          (slice(None), slice(0, check_points)))},
                 ("copy", io + table)),
            Case(f"hg_gather_{bt} (bare, level-fastest launch, our layout)", "hash_grid",
                 [Launch("baselines", f"hg_gather_{bt}_F2_D3_level_fastest",
                         [("buf", "x"), ("buf", p), ("buf", "levels"), ("u32", n), ("u32", n_levels), ("buf", o)],
                         ((n * n_levels + 511) // 512, 1, 1), (512, 1, 1), msl=False)],
                 arrays, lambda half=half: {("out16" if half else "out"): first(ref(half)["out"], enc_tol(ref(half), half))},
                 ("copy", io + table)),
        ]
        # The encode with G levels of 32 / G points per SIMD group (HgArgs.level_group; the host's choice
        # EncodeLevelGroup: 8 / F, at least 1, at most the power of two >= L).
        host_g = max(1, 8 // F)
        while host_g > 1 and host_g // 2 >= n_levels:
            host_g //= 2
        # The host launches the kernel of the configuration: hash_grid_encode_d3f2_T for D=3, F=2, linear (timed at
        # every G), the general kernel (every other configuration; timed at the host's G for comparison).
        for kernel, gs in (("d3f2", sorted({1, 2, 4, 8, 16, host_g})), ("general", [host_g])):
            name = "hash_grid_encode" + ("_d3f2" if kernel == "d3f2" else "") + f"_{t}"
            for g in gs:
                arrays[f"args_enc{g}"] = struct(HG_ARGS, n=n, dims=D, n_features=F, n_levels=n_levels,
                                                n_active=n_levels, interpolation=1, level_group=g)
                threads = (n * g + 31) // 32 * ((n_levels + g - 1) // g) * 32
                host = g == host_g and kernel == "d3f2"
                cases.append(Case(f"{name}, G={g}" + (" (host)" if host else ""), "hash_grid",
                                  [Launch("hash_grid", name,
                                          [("buf", "x"), ("buf", p), ("buf", "levels"), ("buf", f"args_enc{g}"),
                                           ("buf", o)], (threads, 1, 1), enc_group)],
                                  arrays, lambda half=half, o=o: {o: first(ref(half)["out"], enc_tol(ref(half), half))},
                                  ("case", f"hg_gather_{bt} (bare, tcnn launch, tcnn layout)"),
                                  note="bound: tiny-cuda-nn's launch and output layout"))
        # feature_major=True: out [L*F, N] (tiny-cuda-nn's layout), grid (N, L) (the host's) with the host's
        # threadgroup (EncodeThreadgroup: 512 for float32, 256 for float16), and the d3f2 kernel at both sizes.
        arrays["args_enc_fm"] = struct(HG_ARGS, n=n, dims=D, n_features=F, n_levels=n_levels, n_active=n_levels,
                                       interpolation=1, feature_major=1)
        host_tg = 256 if half else 512
        for kernel, tgx in (("d3f2", 256), ("d3f2", 512), ("general", host_tg)):
            name = "hash_grid_encode_fm" + ("_d3f2" if kernel == "d3f2" else "") + f"_{t}"
            host = kernel == "d3f2" and tgx == host_tg
            cases.append(Case(f"{name}, threadgroup {tgx}" + (" (host)" if host else ""), "hash_grid",
                              [Launch("hash_grid", name,
                                      [("buf", "x"), ("buf", p), ("buf", "levels"), ("buf", "args_enc_fm"),
                                       ("buf", ofm)], (n, n_levels, 1), (tgx, 1, 1))],
                              arrays, lambda half=half, ofm=ofm: {ofm: (ref(half)["out"].T, enc_tol(ref(half), half).T,
                                                                       (slice(None), slice(0, check_points)))},
                              ("case", f"hg_gather_{bt} (bare, tcnn launch, tcnn layout)"),
                              note="bound: tiny-cuda-nn's launch and output layout"))


    def gp_expect(half=False, second=False):
        key = "grad2_params" if second else "grad_params"
        r = ref(half, key)
        return {"acc": (r[key], 1e-4 * r["abs_" + key] + 1e-6)}

    def scatter_case(bt, dyname):
        return Case(f"hg_scatter_{bt} (bare, tcnn launch, float atomics)", "hash_grid",
                    [Launch("baselines", f"hg_scatter_{bt}_F2_D3", [("buf", dyname), ("buf", "x"), ("buf", "levels"),
                                                                   ("u32", n), ("u32", n_levels), ("buf", "acc")],
                            blocks, (512, 1, 1), msl=False)],
                    arrays, lambda: gp_expect(bt == "f16"), ("copy", nbytes(arrays, "x", dyname, "acc")),
                    setup=zero_acc)

    cases.append(scatter_case("f32", "dy"))
    cases.append(scatter_case("f16", "dy16"))
    cases.append(Case("hg_scatter_f32 (bare, tcnn launch, float atomics, tcnn layout)", "hash_grid",
                      [Launch("baselines", "hg_scatter_f32_F2_D3_feature_major",
                              [("buf", "dy_fm"), ("buf", "x"), ("buf", "levels"), ("u32", n), ("u32", n_levels),
                               ("buf", "acc")], blocks, (512, 1, 1), msl=False)],
                      arrays, gp_expect, ("copy", nbytes(arrays, "x", "dy_fm", "acc")), setup=zero_acc))
    # Aggregation policies of the table-gradient scatters (HgArgs.n_aggregate: levels l < n_aggregate sum runs of
    # equal rows in the SIMD group before their atomics): none, and all levels (the host's choice).
    policies = (("plain atomics", 0), ("run sums", n_levels))
    for _, k in policies:
        arrays[f"args_agg{k}"] = struct(HG_ARGS, n=n, dims=D, n_features=F, n_levels=n_levels, n_active=n_levels,
                                        interpolation=1, count=rows * F, n_aggregate=k)
    # NeRF-like points: 2^14 rays of 64 samples in order along each ray (the layout a NeRF batch has): adjacent
    # threads share the cells of the coarse levels.
    n_rays = max(1, n // 64)
    o_r = rng.uniform(0.3, 0.7, (n_rays, 1, D))
    d_r = rng.normal(size=(n_rays, 1, D))
    d_r /= np.linalg.norm(d_r, axis=2, keepdims=True)
    t_r = (np.arange(64) + rng.random((n_rays, 64))) * (0.3 / 64)
    arrays["x_rays"] = np.clip(o_r + t_r[:, :, None] * d_r, 0, 1).reshape(-1, D)[:n].astype(np.float32)

    def gp_expect_rays():
        if "rays" not in ref_cache:
            ref_cache["rays"] = hg_reference(arrays["x_rays"], params, levels, dy, ddx, F, ("grad_params",), 1)
        r = ref_cache["rays"]
        return {"acc": (r["grad_params"], 1e-4 * r["abs_grad_params"] + 1e-6)}

    for pts, xname, expect in (("random points", "x", gp_expect), ("rays", "x_rays", gp_expect_rays)):
        if xname == "x_rays":
            cases.append(Case("hg_scatter_f32 (bare, tcnn launch, float atomics), rays", "hash_grid",
                              [Launch("baselines", "hg_scatter_f32_F2_D3",
                                      [("buf", "dy"), ("buf", "x_rays"), ("buf", "levels"), ("u32", n),
                                       ("u32", n_levels), ("buf", "acc")], blocks, (512, 1, 1), msl=False)],
                              arrays, expect, ("copy", nbytes(arrays, "x", "dy", "acc")), setup=zero_acc))
        bare = "hg_scatter_f32 (bare, tcnn launch, float atomics)" + (", rays" if xname == "x_rays" else "")
        for module, label in (("hash_grid", "native float atomics (MSL 3.0)"), ("msl2.4/hash_grid", "CAS loop (MSL 2.4)")):
            # The kernel the host launches for D=3, F=2, linear (_d3f2), both policies; the general kernel with run
            # sums beside it (its registers: the cost of one kernel for every configuration).
            for kernel, policy, k in (("d3f2", *policies[0]), ("d3f2", *policies[1]), ("general", *policies[1])):
                name = "hash_grid_grad_params" + ("_d3f2" if kernel == "d3f2" else "") + "_float32"
                cases.append(Case(f"{name}, {label}, {pts}, {policy}", "hash_grid",
                                  [Launch(module, name,
                                          [("buf", "dy"), ("buf", xname), ("buf", "levels"), ("buf", f"args_agg{k}"),
                                           ("buf", "acc")], grid2, tg)],
                                  arrays, expect, ("case", bare), setup=zero_acc))
    # feature_major=True: dy [L*F, N], the host's kernel and policy (run sums).
    arrays["args_agg_fm"] = struct(HG_ARGS, n=n, dims=D, n_features=F, n_levels=n_levels, n_active=n_levels,
                                   interpolation=1, count=rows * F, n_aggregate=n_levels, feature_major=1)
    cases.append(Case("hash_grid_grad_params_d3f2_float32, native float atomics (MSL 3.0), random points, run sums, "
                      "feature-major", "hash_grid",
                      [Launch("hash_grid", "hash_grid_grad_params_d3f2_float32",
                              [("buf", "dy_fm"), ("buf", "x"), ("buf", "levels"), ("buf", "args_agg_fm"),
                               ("buf", "acc")], grid2, tg)],
                      arrays, gp_expect, ("case", "hg_scatter_f32 (bare, tcnn launch, float atomics, tcnn layout)"),
                      setup=zero_acc))
    cases.append(Case("hash_grid_grad_params_d3f2_float16 (float32 accumulation), random points, run sums", "hash_grid",
                      [Launch("hash_grid", "hash_grid_grad_params_d3f2_float16",
                              [("buf", "dy16"), ("buf", "x"), ("buf", "levels"), ("buf", f"args_agg{n_levels}"),
                               ("buf", "acc")], grid2, tg)],
                      arrays, lambda: gp_expect(True), ("case", "hg_scatter_f16 (bare, tcnn launch, float atomics)"),
                      setup=zero_acc))
    # The per-point kernels: the host's (_d3f2 for this configuration) and the general one it launches otherwise.
    for d3f2 in ("_d3f2", ""):
        cases.append(Case(f"hash_grid_grad_positions{d3f2}_float32", "hash_grid",
                          [Launch("hash_grid", f"hash_grid_grad_positions{d3f2}_float32",
                                  [("buf", "dy"), ("buf", "x"), ("buf", "params"), ("buf", "levels"), ("buf", "args"),
                                   ("buf", "dx")], (n, 1, 1), (256, 1, 1))],
                          arrays, lambda: {"dx": first(ref(part="dx")["dx"], pp_tol(ref(part="dx")["dx"]))},
                          ("case", "hg_gather_f32 (bare, tcnn launch, our layout)"),
                          note="bound: the encode's gather (the same table reads; dy is read instead of out written)"))
        cases.append(Case(f"hash_grid_grad2_points{d3f2}_float32", "hash_grid",
                          [Launch("hash_grid", f"hash_grid_grad2_points{d3f2}_float32",
                                  [("buf", "ddx"), ("buf", "dy"), ("buf", "x"), ("buf", "params"), ("buf", "levels"),
                                   ("buf", "args"), ("buf", "ddy"), ("buf", "dx2")], (n, 1, 1), (256, 1, 1))],
                          arrays, lambda: {k: first(ref(part=k)[k], pp_tol(ref(part=k)[k])) for k in ("ddy", "dx2")},
                          ("case", "hg_gather_f32 (bare, tcnn launch, our layout)")))
    for module, label in (("hash_grid", "native float atomics (MSL 3.0)"), ("msl2.4/hash_grid", "CAS loop (MSL 2.4)")):
        for policy, k in policies:
            cases.append(Case(f"hash_grid_grad2_params_d3f2_float32, {label}, random points, {policy}", "hash_grid",
                              [Launch(module, "hash_grid_grad2_params_d3f2_float32",
                                      [("buf", "ddx"), ("buf", "dy"), ("buf", "x"), ("buf", "levels"),
                                       ("buf", f"args_agg{k}"), ("buf", "acc")], grid2, tg)],
                              arrays, lambda: gp_expect(second=True),
                              ("case", "hg_scatter_f32 (bare, tcnn launch, float atomics)"), setup=zero_acc))
    # The deterministic table gradient (attr deterministic: fixed-point sums with integer atomics, the same passes
    # as csrc/gpu/hash_grid_gpu.cc FixedPointPasses): zeroing untimed, as the float path's; timed: the bounds
    # (max |dy|, max |ddx|), the exponents, the scatter, the conversion into acc.
    words = 3 * rows * F
    arrays["words"] = np.zeros(words, np.uint32)
    arrays["meta"] = np.zeros(2 + n_levels, np.uint32)
    common = dict(n=n, dims=D, n_features=F, n_levels=n_levels, n_active=n_levels, interpolation=1,
                  n_aggregate=n_levels)
    for order in (1, 2):
        arrays[f"args_det{order}"] = struct(HG_ARGS, **common, count=rows * F, order=order)
    arrays["args_meta"] = struct(HG_ARGS, **common, count=2 + n_levels)
    arrays["args_max_dy"] = struct(HG_ARGS, **common, count=n * n_levels * F, slot=0)
    arrays["args_max_ddx"] = struct(HG_ARGS, **common, count=n * D, slot=1)
    zero_det = [Launch("hash_grid", "hash_grid_fixed_init", [("buf", "words"), ("buf", "args_det1")],
                       (words, 1, 1), (256, 1, 1)),
                Launch("hash_grid", "hash_grid_fill_zero_uint", [("buf", "meta"), ("buf", "args_meta")],
                       (2 + n_levels, 1, 1), (32, 1, 1))]

    def max_pass(src, t, a):
        return Launch("hash_grid", f"hash_grid_abs_max_{t}", [("buf", src), ("buf", a), ("buf", "meta")],
                      (65536, 1, 1), (256, 1, 1))

    def det_tail(order):
        return Launch("hash_grid", "hash_grid_fixed_to_float32", [("buf", "words"), ("buf", "meta"), ("buf", "levels"),
                                                                  ("buf", f"args_det{order}"), ("buf", "acc")],
                      (rows * F, 1, 1), (256, 1, 1))

    exps = {order: Launch("hash_grid", "hash_grid_fixed_exponents", [("buf", "levels"), ("buf", f"args_det{order}"),
                                                                     ("buf", "meta")], (n_levels, 1, 1), (32, 1, 1))
            for order in (1, 2)}
    for pts, xname, expect, bare in (("random points", "x", gp_expect, "hg_scatter_f32 (bare, tcnn launch, float atomics)"),
                                     ("rays", "x_rays", gp_expect_rays,
                                      "hg_scatter_f32 (bare, tcnn launch, float atomics), rays")):
        cases.append(Case(f"hash_grid_grad_params_det_d3f2_float32 (deterministic, all passes), {pts}", "hash_grid",
                          [max_pass("dy", "float32", "args_max_dy"), exps[1],
                           Launch("hash_grid", "hash_grid_grad_params_det_d3f2_float32",
                                  [("buf", "dy"), ("buf", xname), ("buf", "levels"), ("buf", "args_det1"),
                                   ("buf", "words"), ("buf", "meta")], grid2, tg), det_tail(1)],
                          arrays, expect, ("case", bare), setup=zero_det))
    cases.append(Case("hash_grid_grad_params_det_d3f2_float16 (deterministic, all passes), random points", "hash_grid",
                      [max_pass("dy16", "float16", "args_max_dy"), exps[1],
                       Launch("hash_grid", "hash_grid_grad_params_det_d3f2_float16",
                              [("buf", "dy16"), ("buf", "x"), ("buf", "levels"), ("buf", "args_det1"),
                               ("buf", "words"), ("buf", "meta")], grid2, tg), det_tail(1)],
                      arrays, lambda: gp_expect(True), ("case", "hg_scatter_f16 (bare, tcnn launch, float atomics)"),
                      setup=zero_det))
    cases.append(Case("hash_grid_grad2_params_det_d3f2_float32 (deterministic, all passes), random points", "hash_grid",
                      [max_pass("dy", "float32", "args_max_dy"), max_pass("ddx", "float32", "args_max_ddx"), exps[2],
                       Launch("hash_grid", "hash_grid_grad2_params_det_d3f2_float32",
                              [("buf", "ddx"), ("buf", "dy"), ("buf", "x"), ("buf", "levels"), ("buf", "args_det2"),
                               ("buf", "words"), ("buf", "meta")], grid2, tg), det_tail(2)],
                      arrays, lambda: gp_expect(second=True),
                      ("case", "hg_scatter_f32 (bare, tcnn launch, float atomics)"), setup=zero_det))
    if tcnn:
        cases += tcnn_cases(arrays, enc_tol, check_points, levels, rows, n, n_levels, F, per_level_scale, base,
                            zero_acc)
    return cases


def tcnn_level_scales(levels, log2_b, base):
    """The level table with tiny-cuda-nn's level scales as its kernels compute them: exp2f on the
    device (the hardware ex2.approx, within 1 ulp of the correctly rounded 2^x our table holds) of the float32
    product level * log2(b), times the base, minus 1 (the product is exact for a power-of-two base, so fused or
    not). Imports cupy: call it on the device only."""
    import cupy as cp

    x = np.arange(len(levels), dtype=np.float32) * np.float32(log2_b)
    e = cp.ElementwiseKernel("float32 x", "float32 y", "y = exp2f(x)", "tfmo_tcnn_exp2f")(cp.asarray(x)).get()
    t = levels.copy()
    t["scale"] = e * np.float32(base) - np.float32(1.0)
    assert np.array_equal(np.ceil(t["scale"]).astype(np.int64) + 1, levels["resolution"]), "a resolution changed"
    print(f"tiny-cuda-nn's level scales: {int(np.sum(t['scale'] != levels['scale']))} of {len(levels)} differ from "
          "the correctly rounded ones (by 1 ulp of 2^x)", flush=True)
    return t


def tcnn_cases(arrays, enc_tol, check_points, levels, rows, n, n_levels, F, per_level_scale, base, zero_acc):
    """tiny-cuda-nn's kernel_grid and kernel_grid_backward (float32 and float16 tables), launched as tiny-cuda-nn
    launches them (dev/gpu_proxy/tcnn_grid.cu), on the hash_grid cases' inputs in tiny-cuda-nn's layouts, each beside
    the bare kernel of the same reads or atomics. Checked against the float64 reference computed with tiny-cuda-nn's
    own level scales (tcnn_level_scales: a point near a cell boundary can fall in another cell than with ours). The
    float16 backward accumulates in float16 (half2 atomics, as tiny-cuda-nn does for F = 2): its check is loose (10 %
    of the sum of the terms' magnitudes, which still catches a term in a wrong row), the others' are the encode's
    and the table gradient's."""
    assert F == 2
    log2_b = float(hg_log2_scale(per_level_scale))
    offsets = np.append(levels["offset"], rows).astype(np.uint32)
    cache = {}

    def ref(half=False, part="out"):
        if "levels" not in cache:
            cache["levels"] = tcnn_level_scales(levels, log2_b, base)
        key = (half, part)
        if key not in cache:
            cache[key] = hg_reference(arrays["x"], arrays["params16" if half else "params"], cache["levels"],
                                      arrays["dy16" if half else "dy"], arrays["ddx"], F, (part,), check_points)
        return cache[key]

    arrays.update(dy16_fm=np.ascontiguousarray(arrays["dy16"].T), acc16=np.zeros(rows * F, np.float16),
                  args_zero16=struct(HG_ARGS, count=rows * F // 2))
    zero16 = [Launch("hash_grid", "hash_grid_fill_zero", [("buf", "acc16"), ("buf", "args_zero16")],
                     (rows * F // 2, 1, 1), (256, 1, 1))]

    def call(fn, *bufs):
        return Launch("tcnn", fn, [("buf", b) for b in bufs] + [("host", offsets), ("u32", n), ("u32", n_levels),
                                                                 ("u32", base), ("f32", log2_b)], (), (), msl=False)

    def grad_expect(half):
        r = ref(half, "grad_params")
        tol = 0.1 * r["abs_grad_params"] + 1e-3 if half else 1e-4 * r["abs_grad_params"] + 1e-6
        return {"acc16" if half else "acc": (r["grad_params"], tol)}

    cases = []
    for bt, half, p, ofm in (("f32", False, "params", "out_fm"), ("f16", True, "params16", "out16_fm")):
        cases.append(Case(f"tiny-cuda-nn kernel_grid ({bt} table)", "hash_grid",
                          [call(f"tfmo_tcnn_grid_forward_{bt}", p, "x", ofm)], arrays,
                          lambda half=half, ofm=ofm: {ofm: (ref(half)["out"].T, enc_tol(ref(half), half).T,
                                                           (slice(None), slice(0, check_points)))},
                          ("case", f"hg_gather_{bt} (bare, tcnn launch, tcnn layout)"),
                          note="tiny-cuda-nn's own kernel; bound: the bare gather of the same reads and layout"))
    cases.append(Case("tiny-cuda-nn kernel_grid_backward (f32 table, float atomics)", "hash_grid",
                      [call("tfmo_tcnn_grid_backward_f32", "acc", "x", "dy_fm")], arrays,
                      lambda: grad_expect(False),
                      ("case", "hg_scatter_f32 (bare, tcnn launch, float atomics, tcnn layout)"), setup=zero_acc,
                      note="tiny-cuda-nn's own kernel; bound: the bare scatter of the same atomics and layout"))
    cases.append(Case("tiny-cuda-nn kernel_grid_backward (f16 table, half2 atomics: float16 sums)", "hash_grid",
                      [call("tfmo_tcnn_grid_backward_f16", "acc16", "x", "dy16_fm")], arrays,
                      lambda: grad_expect(True),
                      ("case", "hg_scatter_f16 (bare, tcnn launch, float atomics)"), setup=zero16,
                      note="tiny-cuda-nn's own kernel; check loose (float16 sums); bound: the bare float16-dy "
                           "scatter with float32 atomics"))
    return cases


# ==== volume rendering and distortion loss ===========================================================================
def _seg(splits):
    lengths = np.diff(splits)
    return np.repeat(np.arange(len(lengths)), lengths), lengths


def _excl(x, splits):
    """Exclusive cumulative sum of x along the flat samples, restarting at every ray (axis 0)."""
    c = np.cumsum(x, axis=0)
    c0 = np.concatenate([np.zeros((1,) + x.shape[1:]), c])
    ray, lengths = _seg(splits)
    return c - x - c0[splits[:-1]][ray]


def _segsum(x, splits):
    c0 = np.concatenate([np.zeros((1,) + x.shape[1:]), np.cumsum(x, axis=0)])
    return c0[splits[1:]] - c0[splits[:-1]]


def render_reference(sigma, colors, s, e, splits, bg, gC, gD, gO, gW, w_in, gl):
    """Float64 VolumeRender (threshold 0, shared background) and DistortionLoss, forward and backward, on packed rays
    (dense rays: splits = arange(R + 1) * S): csrc/shared/render_math.h's formulas, evaluated directly."""
    f = lambda a: np.asarray(a, np.float64)  # noqa: E731
    sigma, colors, s, e, bg, gC, gD, gO, gW, w_in, gl = map(f, (sigma, colors, s, e, bg, gC, gD, gO, gW, w_in, gl))
    ray, _ = _seg(splits)
    delta, mid = e - s, 0.5 * (s + e)
    tau = sigma * delta
    cum = _excl(tau, splits)
    T = np.exp(-cum)
    w = T * -np.expm1(-tau)
    tau_sum = _segsum(tau, splits)
    T_final = np.exp(-tau_sum)
    out = {"color": _segsum(w[:, None] * colors, splits) + T_final[:, None] * bg[None, :],
           "depth": _segsum(w * mid, splits), "opacity": -np.expm1(-tau_sum), "weights": w}
    v = np.einsum("kc,kc->k", colors, gC[ray]) + gD[ray] * mid + gO[ray] + gW
    wv = w * v
    suffix = _segsum(wv, splits)[ray] - (_excl(wv, splits) + wv)
    b = gC @ bg
    gtau = np.exp(-(cum + tau)) * v - suffix - (T_final * b)[ray]
    out.update(grad_densities=delta * gtau, grad_colors=w[:, None] * gC[ray],
               grad_s=-sigma * gtau + 0.5 * gD[ray] * w, grad_e=sigma * gtau + 0.5 * gD[ray] * w,
               grad_background=T_final[:, None] * gC)
    # DistortionLoss of the weights w_in.
    W_before, WM_before = _excl(w_in, splits), _excl(w_in * mid, splits)
    A = mid * W_before - WM_before
    out["loss"] = _segsum(2 * w_in * A + w_in ** 2 * delta / 3, splits)
    W_after = _segsum(w_in, splits)[ray] - W_before - w_in
    WM_after = _segsum(w_in * mid, splits)[ray] - WM_before - w_in * mid
    B = WM_after - mid * W_after
    g = gl[ray]
    out["dl_grad_w"] = g * (2 * (A + B) + 2.0 / 3.0 * w_in * delta)
    gm = 2 * w_in * (W_before - W_after)
    out["dl_grad_s"] = g * (gm / 2 - w_in ** 2 / 3)
    out["dl_grad_e"] = g * (gm / 2 + w_in ** 2 / 3)
    return out


def _dense_t(grad_s, grad_e, R, S):
    """grad w.r.t. the edges t[r, 0..S] from the per-sample interval-end gradients."""
    gt = np.zeros((R, S + 1))
    gt[:, :S] += grad_s.reshape(R, S)
    gt[:, 1:] += grad_e.reshape(R, S)
    return gt


def _tol(ref, rel=1e-4):
    ref = np.asarray(ref, np.float64)
    return rel * (np.abs(ref) + 1e-2 * (np.abs(ref).max() if ref.size else 0.0)) + 1e-7


def render_cases(R=8192, S=128, C=3, seed=1, packed=False) -> list[Case]:
    """VolumeRender and DistortionLoss forward and backward, dense [R, S] or packed (ragged rays of 0 .. 2S samples,
    with gaps), about R * S samples: 2^20 at the defaults. Bound: the bytes each kernel must move, at the measured
    copy bandwidth."""
    rng = np.random.default_rng(seed)
    if packed:
        lengths = rng.integers(0, 2 * S + 1, R)
        splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    else:
        splits = (np.arange(R + 1) * S).astype(np.int32)
    N = int(splits[-1])
    ray, _ = _seg(splits)
    # Multiples of 2^-12 below 16: every sum below is exact in float32, so intervals touch exactly (no overlap).
    q = lambda a: (np.round(a * 4096) / 4096).astype(np.float32)  # noqa: E731
    step = q(rng.uniform(0.005, 0.02, N))
    gap = q(np.where(rng.random(N) < 0.2, rng.uniform(0, 0.01, N), 0.0)) if packed else np.zeros(N, np.float32)
    # Intervals per ray from 2.0, sorted, non-overlapping (dense: contiguous edges t[r, 0..S]).
    start_off = _excl((step + gap).astype(np.float64), splits) + gap
    s = (2.0 + start_off).astype(np.float32)
    e = (s + step).astype(np.float32)
    if not packed:
        t = np.empty((R, S + 1), np.float32)
        t[:, :S] = s.reshape(R, S)
        t[:, S] = e.reshape(R, S)[:, -1]
        e = t[:, 1:].reshape(-1).copy()  # the kernel reads edges: e_i = t_{i+1} = s_{i+1}
        s = t[:, :S].reshape(-1).copy()
    sigma = rng.uniform(0, 5, N).astype(np.float32)
    colors = rng.random((N, C), dtype=np.float32)
    bg = rng.random(C, dtype=np.float32)
    gC = rng.uniform(-1, 1, (R, C)).astype(np.float32)
    gD, gO, gl = (rng.uniform(-1, 1, R).astype(np.float32) for _ in range(3))
    gW = rng.uniform(-1, 1, N).astype(np.float32)
    w_in = rng.uniform(0, 0.05, N).astype(np.float32)
    cache = {}

    def ref():
        if not cache:
            cache.update(render_reference(sigma, colors, s, e, splits, bg, gC, gD, gO, gW, w_in, gl))
        return cache

    arrays = {"sigma": sigma, "colors": colors, "bg": bg, "gC": gC, "gD": gD, "gO": gO, "gW": gW, "w_in": w_in,
              "gl": gl, "color": np.zeros((R, C), np.float32), "depth": np.zeros(R, np.float32),
              "opacity": np.zeros(R, np.float32), "weights": np.zeros(N, np.float32),
              "g_sigma": np.zeros(N, np.float32), "g_colors": np.zeros((N, C), np.float32),
              "g_bg": np.zeros((R, C), np.float32), "loss": np.zeros(R, np.float32), "g_w": np.zeros(N, np.float32)}
    fwd_out = {"color": lambda r: r["color"], "depth": lambda r: r["depth"], "opacity": lambda r: r["opacity"],
               "weights": lambda r: r["weights"]}
    one = (256, 1, 1)
    ray_groups = (VRP_LANES * R, 1, 1)  # one SIMD group per ray (csrc/gpu/render_gpu.cc, render_packed_gpu.cc)
    if not packed:
        arrays.update(t=np.concatenate([s.reshape(R, S), e.reshape(R, S)[:, -1:]], axis=1), g_t=np.zeros((R, S + 1), np.float32),
                      vr=struct(VR_PARAMS, R=R, S=S, C=C, bg_mode=1, threshold=0.0), dl=struct(DL_PARAMS, R=R, S=S))
        ins_f = ("sigma", "colors", "t", "bg")
        vr_f = Launch("render", "volume_render_forward",
                      [("buf", n) for n in ins_f + ("color", "depth", "opacity", "weights", "vr")], ray_groups, one)
        vr_b = Launch("render", "volume_render_backward",
                      [("buf", n) for n in ins_f + ("gC", "gD", "gO", "gW", "g_sigma", "g_colors", "g_t", "g_bg", "vr")],
                      ray_groups, one)
        dl_f = Launch("render", "distortion_loss_forward", [("buf", n) for n in ("w_in", "t", "loss", "dl")], ray_groups, one)
        dl_b = Launch("render", "distortion_loss_backward",
                      [("buf", n) for n in ("w_in", "t", "gl", "g_w", "g_t", "dl")], ray_groups, one)
        g_t = lambda r, a, b: _dense_t(r[a], r[b], R, S)  # noqa: E731
        back = {"g_sigma": lambda r: r["grad_densities"], "g_colors": lambda r: r["grad_colors"],
                "g_t": lambda r: g_t(r, "grad_s", "grad_e"), "g_bg": lambda r: r["grad_background"]}
        dl_back = {"g_w": lambda r: r["dl_grad_w"], "g_t": lambda r: g_t(r, "dl_grad_s", "dl_grad_e")}
        t_names = ("t",)
        prefix = ""
    else:
        arrays.update(ts=s, te=e, splits=splits, status=np.zeros(1, np.int32), g_ts=np.zeros(N, np.float32),
                      g_te=np.zeros(N, np.float32), vr=struct(VRP_PARAMS, R=R, N=N, C=C, bg_mode=1, threshold=0.0),
                      dl=struct(DLP_PARAMS, R=R, N=N))
        ins_f = ("sigma", "colors", "ts", "te", "splits", "bg")
        vr_f = Launch("render_packed", "volume_render_packed_forward",
                      [("buf", n) for n in ins_f + ("status", "color", "depth", "opacity", "weights", "vr")],
                      ray_groups, one)
        vr_b = Launch("render_packed", "volume_render_packed_backward",
                      [("buf", n) for n in ins_f + ("gC", "gD", "gO", "gW", "status", "g_sigma", "g_colors", "g_ts",
                                                     "g_te", "g_bg", "vr")], ray_groups, one)
        dl_f = Launch("render_packed", "distortion_loss_packed_forward",
                      [("buf", n) for n in ("w_in", "ts", "te", "splits", "status", "loss", "dl")], ray_groups, one)
        dl_b = Launch("render_packed", "distortion_loss_packed_backward",
                      [("buf", n) for n in ("w_in", "ts", "te", "splits", "gl", "status", "g_w", "g_ts", "g_te", "dl")],
                      ray_groups, one)
        back = {"g_sigma": lambda r: r["grad_densities"], "g_colors": lambda r: r["grad_colors"],
                "g_ts": lambda r: r["grad_s"], "g_te": lambda r: r["grad_e"], "g_bg": lambda r: r["grad_background"]}
        dl_back = {"g_w": lambda r: r["dl_grad_w"], "g_ts": lambda r: r["dl_grad_s"], "g_te": lambda r: r["dl_grad_e"]}
        t_names = ("ts", "te", "splits")
        prefix = "packed_"

    def expect(outs):
        return lambda: {k: (fn(ref()), _tol(fn(ref()))) for k, fn in outs.items()}

    def moved(*names):
        return ("copy", nbytes(arrays, *names))

    fam = "render_packed" if packed else "render"
    return [
        Case(f"volume_render_{prefix}forward", fam, [vr_f], arrays, expect(fwd_out),
             moved("sigma", "colors", *t_names, "color", "depth", "opacity", "weights")),
        Case(f"volume_render_{prefix}backward", fam, [vr_b], arrays, expect(back),
             moved("sigma", "colors", *t_names, "gC", "gD", "gO", "gW", *back)),
        Case(f"distortion_loss_{prefix}forward", fam, [dl_f], arrays, expect({"loss": lambda r: r["loss"]}),
             moved("w_in", *t_names, "loss")),
        Case(f"distortion_loss_{prefix}backward", fam, [dl_b], arrays, expect(dl_back),
             moved("w_in", *t_names, "gl", *dl_back)),
    ]


# ==== ray marching and the occupancy mip ============================================================================
def rm_mip_layout(G):
    offsets, off, m = [], 0, 0
    while m < RM_MAX_MIP_LEVELS and (2 << m) < G:
        offsets.append(off)
        g = (G + (1 << (m + 1)) - 1) >> (m + 1)
        off += (g ** 3 + 7) // 8
        m += 1
    return m, offsets + [off] * (RM_MAX_MIP_LEVELS - m), max(off, 1)


def rm_params(R, G, lo, hi, step_size, max_samples):
    levels, offsets, total = rm_mip_layout(G)
    size = np.float32(hi) - np.float32(lo)
    cs, inv, inv_ext = np.float32(size / np.float32(G)), np.float32(np.float32(G) / size), np.float32(np.float32(1) / size)
    max_step = max(np.float32(step_size), np.float32(1.7320508) * cs)
    pad = 3 * (RM_MAX_CASCADES - 1)  # one cascade: cascade 0 is the box itself
    return struct(RM_PARAMS, R=R, G=G, max_samples=max_samples, jitter=0, seed_lo=0, seed_hi=0,
                  lo_x=lo, lo_y=lo, lo_z=lo, hi_x=hi, hi_y=hi, hi_z=hi, cs_x=cs, cs_y=cs, cs_z=cs,
                  inv_cs_x=inv, inv_cs_y=inv, inv_cs_z=inv, inv_ext_x=inv_ext, inv_ext_y=inv_ext, inv_ext_z=inv_ext,
                  step_size=step_size, cone_angle=0.0, max_step=max_step,
                  max_skips=8 * G + 64, mip_levels=levels, mip_offset=offsets, mip_bytes=total,
                  K=1, cascade_bytes=(G**3 + 7) // 8, mip_stride=total if levels > 0 else 0,
                  c_lo=[lo] * 3 + [0] * pad, c_hi=[hi] * 3 + [0] * pad, c_cs=[cs] * 3 + [0] * pad,
                  c_inv_cs=[inv] * 3 + [0] * pad, c_max_step=[max_step] + [0] * (RM_MAX_CASCADES - 1))


def occupancy_bits(occ):
    """[G, G, G] bool (index x + G*(y + G*z): occ[z, y, x]) -> the bitfield, LSB first."""
    return np.packbits(occ.reshape(-1), bitorder="little")


def mip_reference(occ, G):
    """The mip buffer of the occupancy grid (levels 1 .. L, OR pooling, blocks cut at the far faces)."""
    levels, offsets, total = rm_mip_layout(G)
    out = np.zeros(total, np.uint8)
    cur = occ
    for m in range(1, levels + 1):
        gm = (G + (1 << m) - 1) >> m
        pad = np.zeros((2 * gm,) * 3, bool)
        pad[:cur.shape[0], :cur.shape[1], :cur.shape[2]] = cur
        cur = pad.reshape(gm, 2, gm, 2, gm, 2).any(axis=(1, 3, 5))
        b = occupancy_bits(cur)
        out[offsets[m - 1]:offsets[m - 1] + len(b)] = b
    return out


def ray_march_cases(R=1 << 16, G=128, seed=2, max_samples=1024) -> list[Case]:
    """The occupancy mip, the count pass, the scan (block + add), the fill pass, at G = 128 over [-1.5, 1.5]^3 and
    2^16 rays from outside the box: the sparse grid (about 10 % occupied) is timed; the count is checked on an
    all-occupied grid against the closed form (samples t_lo + k dt, the last cut at t_hi: float32 marching may differ
    by one sample at the end) and the fill by invariants. Bound: bytes moved at the copy bandwidth."""
    rng = np.random.default_rng(seed)
    lo, hi, step = -1.5, 1.5, np.float32(np.sqrt(3.0) * 3.0 / 1024)
    centers = rng.uniform(-1, 1, (12, 3))
    cell = (np.arange(G) + 0.5) / G * (hi - lo) + lo
    z, y, x = np.meshgrid(cell, cell, cell, indexing="ij")
    occ = np.zeros((G, G, G), bool)
    for c in centers:
        occ |= (x - c[0]) ** 2 + (y - c[1]) ** 2 + (z - c[2]) ** 2 < 0.3 ** 2
    dirs = rng.normal(size=(R, 3))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    target = rng.uniform(-1, 1, (R, 3))
    o = (target - 4.0 * dirs).astype(np.float32)
    d = dirs.astype(np.float32)
    params = rm_params(R, G, lo, hi, step, max_samples)
    _, offsets, mip_total = rm_mip_layout(G)
    arrays = {"o": o, "d": d, "near": np.zeros(R, np.float32), "far": np.full(R, 1e10, np.float32),
              "bits": occupancy_bits(occ), "bits_full": occupancy_bits(np.ones((G, G, G), bool)),
              "mip": mip_reference(occ, G), "mip_full": mip_reference(np.ones((G, G, G), bool), G),
              "mip_out": np.zeros(mip_total, np.uint8), "scan": np.zeros(R + 1, np.int64),
              "scan_full": np.zeros(R + 1, np.int64), "params": params}
    levels = int(params["mip_levels"][0])
    mip_launches = [Launch("ray_march", "ray_march_mip", [("buf", "bits"), ("buf", "mip_out"), ("buf", "params"),
                                                          ("buf", f"level{m}")], ((((G + (1 << m) - 1) >> m) ** 3 + 7) // 8, 1, 1),
                           (256, 1, 1)) for m in range(1, levels + 1)]
    for m in range(1, levels + 1):
        arrays[f"level{m}"] = np.array([m], np.uint32)
    count = lambda bits, mip, scan: Launch("ray_march", "ray_march_count",  # noqa: E731
                                           [("buf", n) for n in ("o", "d", "near", "far", bits, mip, scan, "params")],
                                           (R, 1, 1), (256, 1, 1))

    # Closed form on the all-occupied grid (float64 slab test).
    def full_counts():
        inv = 1.0 / d.astype(np.float64)
        t0, t1 = (lo - o) * inv, (hi - o) * inv
        t_lo = np.maximum(np.max(np.minimum(t0, t1), axis=1), 0.0)
        t_hi = np.min(np.maximum(t0, t1), axis=1)
        n = np.where(t_lo < t_hi, np.ceil((t_hi - t_lo) / np.float64(step)), 0)
        return np.minimum(n, max_samples)

    def check_full(out):
        ref = full_counts()
        got = out["scan_full"][1:]
        bad = np.abs(got - ref) > 1
        return [f"count on the all-occupied grid: {int(bad.sum())} rays off by more than one sample"] if bad.any() else []

    # Scan: level 0 over scan[1..R] (in place), level 1 over the block totals, then the add pass.
    groups0 = (R + RM_SCAN_BLOCK - 1) // RM_SCAN_BLOCK
    assert groups0 <= RM_SCAN_BLOCK, "two scan levels cover R <= 65536"
    counts = rng.integers(0, 200, R + 1).astype(np.int64)
    counts[0] = 0
    arrays.update(scan_in=counts.copy(), sums0=np.zeros(groups0, np.int64), sums1=np.zeros(1, np.int64),
                  sp0=struct(RM_SCAN_PARAMS, n=R, offset=1), sp1=struct(RM_SCAN_PARAMS, n=groups0, offset=0))
    shared = RM_SCAN_BLOCK * 8
    scan_launches = [
        Launch("ray_march", "ray_march_scan_block", [("buf", "scan_in"), ("buf", "sums0"), ("buf", "sp0"), ("u32", shared)],
               (groups0 * RM_SCAN_BLOCK, 1, 1), (RM_SCAN_BLOCK, 1, 1), shared),
        Launch("ray_march", "ray_march_scan_block", [("buf", "sums0"), ("buf", "sums1"), ("buf", "sp1"), ("u32", shared)],
               (RM_SCAN_BLOCK, 1, 1), (RM_SCAN_BLOCK, 1, 1), shared),
        Launch("ray_march", "ray_march_scan_add", [("buf", "scan_in"), ("buf", "sums0"), ("buf", "sp0")], (R, 1, 1),
               (256, 1, 1)),
    ]
    cases = [
        Case("ray_march_mip (all levels)", "ray_march", mip_launches, arrays,
             lambda: {"mip_out": (arrays["mip"], 0)}, ("copy", nbytes(arrays, "bits", "mip"))),
        Case("ray_march_count (sparse grid)", "ray_march", [count("bits", "mip", "scan")], arrays,
             lambda: {}, ("copy", nbytes(arrays, "o", "d", "near", "far", "scan")),
             check=lambda out: check_full(out) + rm_count_invariants(out["scan"][1:], max_samples),
             setup=[count("bits_full", "mip_full", "scan_full")],
             note="checked: the count on the all-occupied grid (closed form, +-1 sample) and 0 <= count <= max_samples"),
        Case("ray_march_scan (block + block + add)", "ray_march", scan_launches, arrays,
             lambda: {"scan_in": (np.cumsum(counts[1:]).astype(np.float64), 0)}, ("copy", 2 * nbytes(arrays, "scan_in")),
             restore=("scan_in",), check=None,
             note="checked on scan_in[1:] (scan_in[0] is the untouched 0)"),
    ]
    cases[-1].reference = lambda: {"scan_in": (np.concatenate([[0], np.cumsum(counts[1:])]).astype(np.float64), 0)}
    cases.append(ray_march_fill_case(arrays, R, count("bits", "mip", "scan"), G))
    return cases


def rm_count_invariants(n, max_samples):
    bad = (n < 0) | (n > max_samples)
    return [f"{int(bad.sum())} counts outside [0, max_samples]"] if bad.any() else []


def ray_march_fill_case(arrays, R, count: Launch, G) -> Case:
    """The fill pass after the count pass and a host scan of its counts (prepare: the outputs are sized from the
    total, as the op's host code does)."""
    fill = Launch("ray_march", "ray_march_fill",
                  [("buf", n) for n in ("o", "d", "near", "far", "bits", "mip", "scan_fill", "f_ts", "f_te", "f_ri",
                                        "f_pos", "params")], (R, 1, 1), (256, 1, 1))

    def invariants(out):
        scan, ts, te, ri, pos = (out[k] for k in ("scan_fill", "f_ts", "f_te", "f_ri", "f_pos"))
        fails = []
        ray = np.repeat(np.arange(R), np.diff(scan))
        if not np.array_equal(ri, ray):
            fails.append("ray_indices do not follow the scanned counts")
        if np.any(te < ts):
            fails.append("a sample with t_end < t_start")
        same = ray[1:] == ray[:-1]
        if np.any(ts[1:][same] < te[:-1][same]):
            fails.append("overlapping samples within a ray")
        cell = np.clip(np.floor(pos.astype(np.float64) * G), 0, G - 1).astype(np.int64)
        occ = np.unpackbits(arrays["bits"], bitorder="little")[:G ** 3].astype(bool)
        inside = occ[cell[:, 0] + G * (cell[:, 1] + G * cell[:, 2])]
        if inside.mean() < 0.999:  # a midpoint on a cell face may round into the empty neighbour
            fails.append(f"only {inside.mean():.4f} of the sample midpoints lie in occupied cells")
        return fails

    def prepare(case, device):
        if device is None:
            scan = np.zeros(R + 1, np.int64)
        else:
            device.upload(case.arrays, [v for kind, v in count.args if kind == "buf"])
            device.launch(count)
            scan = np.concatenate([[0], np.cumsum(device.download("scan")[1:])]).astype(np.int64)
        n = max(int(scan[-1]), 1)
        case.arrays.update(scan_fill=scan, f_ts=np.zeros(n, np.float32), f_te=np.zeros(n, np.float32),
                           f_ri=np.zeros(n, np.int32), f_pos=np.zeros((n, 3), np.float32))

    return Case("ray_march_fill (sparse grid)", "ray_march", [fill], arrays, lambda: {},
                ("copy", ("o", "d", "near", "far", "scan_fill", "f_ts", "f_te", "f_ri", "f_pos")),
                check=invariants, prepare=prepare, note="sized on the device from the count pass; checked by invariants "
                                       "(ray indices follow the scan, sorted non-overlapping samples, midpoints in "
                                       "occupied cells)")



# ==== fully fused MLP =============================================================================================
FM_ACTIVATIONS = {"none": 0, "relu": 1, "leaky_relu": 2, "sigmoid": 3, "exponential": 4, "softplus": 5}


FM_FORWARD_BLOCKS = 4  # kForwardBlocks (csrc/gpu/fused_mlp_gpu.cc)


def fm_simdgroups(width, half):
    """FM_GPU_SIMDGROUPS (csrc/shared/fused_mlp_math.h)."""
    return 8 if width <= 32 else (4 if width == 64 and half else 2)


def fm_weight_placement(mats, width, half, row_buffers):
    """PlaceWeights (csrc/gpu/fused_mlp_gpu.cc): (weights_resident, weight_tg_offset, the weights buffer's bytes)."""
    s, e = fm_simdgroups(width, half), 2 if half else 4
    one = width * (width + 16 // e) * e if width <= 64 else 16
    if width > 64:
        return 0, [], one
    offsets, at = [], 0
    for _, r, c in mats:
        offsets.append(at)
        at += r * (c + 16 // e)
    if row_buffers * 8 * s * (width + 16 // e) * e + at * e > 32768:
        return 0, [], one
    return 1, offsets, at * e


def fm_threadgroup_bytes(mats, width, half, row_buffers):
    """The kernels' [[threadgroup(n)]] lengths (csrc/gpu/fused_mlp_gpu.cc): row buffers, weights."""
    s, e = fm_simdgroups(width, half), 2 if half else 4
    ld = width + 16 // e  # rows padded by 16 bytes (FM_GPU_TG_PAD)
    return [8 * s * ld * e] * row_buffers + [fm_weight_placement(mats, width, half, row_buffers)[2]]


def fm_layout(n_input, n_output, width, layers):
    """[(offset, rows, cols)] of the weight matrices (no biases) and P (csrc/ops/fused_mlp_args.h)."""
    in_pad, out_pad = (n_input + 15) // 16 * 16, (n_output + 15) // 16 * 16
    mats, at = [], 0
    for m in range(layers + 1):
        r, c = (out_pad if m == layers else width), (in_pad if m == 0 else width)
        mats.append((at, r, c))
        at += r * c
    return mats, at


@dataclasses.dataclass
class FmNet:
    """A float16 FusedMlp network (no biases) at n rows, sized as csrc/gpu/fused_mlp_gpu.cc sizes its launches."""
    n: int
    n_input: int
    width: int
    layers: int
    n_output: int
    act: str
    out_act: str

    def __post_init__(self):
        self.mats, self.P = fm_layout(self.n_input, self.n_output, self.width, self.layers)
        simdgroups = fm_simdgroups(self.width, True)
        self.blocks = (self.n + 8 * simdgroups - 1) // (8 * simdgroups)
        self.parts = max(1, min(self.blocks, 1024, (1 << 24) // self.P))
        self.group = (32 * simdgroups, 1, 1)
        self.constants = {"fm_activation": FM_ACTIVATIONS[self.act],
                          "fm_output_activation": FM_ACTIVATIONS[self.out_act]}

    def forward_parts(self) -> int:
        """The forward's threadgroups (csrc/gpu/fused_mlp_gpu.cc, ForwardGpu)."""
        resident = fm_weight_placement(self.mats, self.width, True, 1)[0]
        return (self.blocks + FM_FORWARD_BLOCKS - 1) // FM_FORWARD_BLOCKS if resident else self.blocks

    def args(self, training, parts=0, feature_major=0) -> np.ndarray:
        """The forward's FmArgs (parts 0: forward_parts()) or the backward's."""
        pad = [0] * (FM_MAX_MATRICES - len(self.mats))
        resident, tg_offsets, _ = fm_weight_placement(self.mats, self.width, True, 2 if parts else 1)
        parts = parts or self.forward_parts()
        return struct(FM_ARGS, n=self.n, n_input=self.n_input, in_pad=self.mats[0][2], n_output=self.n_output,
                      out_pad=self.mats[-1][1], n_matrices=self.layers + 1, use_bias=0, training=training,
                      feature_major=feature_major, blocks=self.blocks, parts=parts, total=self.P,
                      weights_resident=resident, weight_offset=[m[0] for m in self.mats] + pad,
                      weight_tg_offset=(tg_offsets + pad) if resident else [0] * FM_MAX_MATRICES)

    def forward(self, x, params, args, y, hidden) -> Launch:
        tg = fm_threadgroup_bytes(self.mats, self.width, True, 1)
        return Launch("fused_mlp", f"fused_mlp_forward_w{self.width}_float16",
                      [("buf", v) for v in (x, params, args, y, hidden)] + [("u32", b) for b in tg],
                      (self.forward_parts() * self.group[0], 1, 1), self.group, shared=sum(round16(b) for b in tg),
                      constants=self.constants)

    def backward(self, dy, x, params, y, hidden, args, dx, partial) -> Launch:
        tg = fm_threadgroup_bytes(self.mats, self.width, True, 2)
        return Launch("fused_mlp", f"fused_mlp_backward_w{self.width}_float16",
                      [("buf", v) for v in (dy, x, params, y, hidden, args, dx, partial)] + [("u32", b) for b in tg],
                      (self.parts * self.group[0], 1, 1), self.group, shared=sum(round16(b) for b in tg),
                      constants=self.constants)

    def reduce(self, partial, args, dparams) -> Launch:
        return Launch("fused_mlp", "fused_mlp_reduce_float16", [("buf", partial), ("buf", args), ("buf", dparams)],
                      (self.P, 1, 1), (256, 1, 1), constants=self.constants)

    def tcnn_config(self) -> list:
        """The trailing arguments of dev/gpu_proxy/tcnn_mlp.cu's functions."""
        return [("u32", v) for v in (self.n, self.n_input, self.width, self.n_output, self.layers,
                                     FM_ACTIVATIONS[self.act], FM_ACTIVATIONS[self.out_act])]

    def init_params(self, rng) -> np.ndarray:
        return (rng.uniform(-1, 1, self.P) * np.sqrt(6.0 / self.width)).astype(np.float16)


def fm_reference(x, params, dy, mats, n_output, act, out_act, with_dx=False):
    """y, dparams (and dx, with_dx) and their tolerances in float64 (no biases): forward as csrc/ops/fused_mlp_op.cc,
    the gradient of sum(dy * y). Tolerances (float16 operands, float sums): 1e-2 |ref| + 4e-3 max |ref| for y; 1e-2
    of the sum of the terms' magnitudes plus 4e-3 max |ref| for dparams and dx. dx is not checked (tolerance inf) on
    the rows where a hidden pre-activation lies within 2e-3 of its terms' magnitudes of 0: the device's activations
    are rounded to T between layers, so its relu may pass a gradient there that the float64 one stops (or the
    reverse), which moves that row's dx by a whole term; dparams sums over rows and y is continuous, so they keep
    their tolerances."""
    f = {"none": lambda z: z, "relu": lambda z: np.maximum(z, 0), "sigmoid": lambda z: 1 / (1 + np.exp(-z))}
    df = {"none": lambda z: np.ones_like(z), "relu": lambda z: (z > 0) * 1.0,
          "sigmoid": lambda z: np.exp(-z) / (1 + np.exp(-z)) ** 2}
    p = params.astype(np.float64)
    h = np.zeros((x.shape[0], mats[0][2]))
    h[:, :x.shape[1]] = x
    ins, pre = [], []
    unsure = np.zeros(x.shape[0], bool)  # rows with a hidden pre-activation too close to 0 to tell its side
    for m, (o, r, c) in enumerate(mats):
        ins.append(h)
        z = h @ p[o:o + r * c].reshape(r, c).T
        if m < len(mats) - 1:
            unsure |= np.any(np.abs(z) <= 2e-3 * (np.abs(h) @ np.abs(p[o:o + r * c].reshape(r, c).T)), axis=1)
        pre.append(z)
        h = f[out_act if m == len(mats) - 1 else act](z)
    y = h[:, :n_output]
    g = np.zeros((x.shape[0], mats[-1][1]))
    g[:, :n_output] = dy.astype(np.float64)
    dp, mag = np.zeros(p.size), np.zeros(p.size)
    for m in range(len(mats) - 1, -1, -1):
        o, r, c = mats[m]
        g = g * df[out_act if m == len(mats) - 1 else act](pre[m])
        dp[o:o + r * c] = (g.T @ ins[m]).reshape(-1)
        mag[o:o + r * c] = (np.abs(g).T @ np.abs(ins[m])).reshape(-1)
        w = p[o:o + r * c].reshape(r, c)
        mag_dx = np.abs(g) @ np.abs(w)
        g = g @ w
    out = (y, 1e-2 * np.abs(y) + 4e-3 * np.abs(y).max()), (dp, 1e-2 * mag + 4e-3 * np.abs(dp).max())
    if with_dx:
        dx = g[:, :x.shape[1]]
        tol = 1e-2 * mag_dx[:, :x.shape[1]] + 4e-3 * np.abs(dx).max()
        out += ((dx, np.where(unsure[:, None], np.inf, tol)),)
    return out


def fused_mlp_cases(n=1 << 18, seed=3, tcnn=False) -> list[Case]:
    """The NeRF networks of instant-ngp as FusedMlp in float16 at n rows: the density network (32 -> 64 -> 16, relu,
    no output activation, 1 hidden layer) and the colour network (32 -> 64 -> 64 -> 3, relu, sigmoid output, 2 hidden
    layers); each forward (no training: hidden not written) and forward + backward (the training forward, the
    backward with its per-threadgroup partial sums, the fixed-order reduce), launched as csrc/gpu/fused_mlp_gpu.cc
    does. Bound: the bytes the op must move (x, params, y; training adds hidden written and read, dy, dx, dparams).
    Beside each, bound by it: the same network unfused (dev/gpu_proxy/unfused_mlp.py: cuBLAS products and elementwise
    kernels) and, with tcnn, tiny-cuda-nn's FullyFusedMLP (dev/gpu_proxy/tcnn_mlp.cu: its inference kernel; its
    training forward and backward), on the same x, params and dy (padded to 16 outputs, as both take them), checked
    against the same reference at twice the tolerances (other summation orders and roundings)."""
    rng = np.random.default_rng(seed)
    cases = []
    for name, n_in, width, layers, n_out, act, out_act in (("density", 32, 64, 1, 16, "relu", "none"),
                                                          ("colour", 32, 64, 2, 3, "relu", "sigmoid")):
        net = FmNet(n, n_in, width, layers, n_out, act, out_act)
        mats, P, parts = net.mats, net.P, net.parts
        x = rng.uniform(-1, 1, (n, n_in)).astype(np.float16)
        params = net.init_params(rng)
        dy = rng.standard_normal((n, n_out)).astype(np.float16)
        arrays = {"x": x, "params": params, "dy": dy, "y": np.zeros((n, n_out), np.float16),
                  "hidden": np.zeros((layers, n, width), np.float32), "hidden_unused": np.zeros(1, np.float32),
                  "dx": np.zeros((n, n_in), np.float16), "dparams": np.zeros(P, np.float16),
                  "partial": np.zeros(parts * P, np.float32), "args_fwd": net.args(0), "args_train": net.args(1),
                  "args_bwd": net.args(1, parts),
                  # feature_major: x and dx [n_in, n] (the hash grid's feature-major encoding as input)
                  "x_fm": np.ascontiguousarray(x.T), "dx_fm": np.zeros((n_in, n), np.float16),
                  "args_fwd_fm": net.args(0, 0, 1), "args_train_fm": net.args(1, 0, 1),
                  "args_bwd_fm": net.args(1, parts, 1)}

        def forward(args_name, hidden, x_name="x", net=net):
            return net.forward(x_name, "params", args_name, "y", hidden)

        def backward_pass(suffix="", net=net):
            return net.backward("dy", "x" + suffix, "params", "y", "hidden", "args_bwd" + suffix, "dx" + suffix,
                                "partial")

        backward = backward_pass()
        reduce = net.reduce("partial", "args_bwd", "dparams")
        cache = {}

        def ref(x=x, params=params, dy=dy, mats=mats, n_out=n_out, act=act, out_act=out_act, cache=cache):
            if not cache:
                cache["y"], cache["dparams"] = fm_reference(x, params, dy, mats, n_out, act, out_act)
            return cache

        fwd_name, train_name = f"fused_mlp_{name}_forward_float16", f"fused_mlp_{name}_forward_backward_float16"
        moved_fwd = nbytes(arrays, "x", "params", "y")
        moved_train = moved_fwd + 2 * nbytes(arrays, "hidden") + nbytes(arrays, "dy", "dx", "dparams")
        cases += [
            Case(fwd_name, "fused_mlp", [forward("args_fwd", "hidden_unused")], arrays,
                 lambda ref=ref: {"y": ref()["y"]}, ("copy", moved_fwd)),
            Case(train_name, "fused_mlp", [forward("args_train", "hidden"), backward, reduce], arrays,
                 lambda ref=ref: {"y": ref()["y"], "dparams": ref()["dparams"]}, ("copy", moved_train)),
            # the same passes on feature-major x, bound by the row-major case
            Case(f"{fwd_name} (feature-major x)", "fused_mlp",
                 [forward("args_fwd_fm", "hidden_unused", x_name="x_fm")], arrays,
                 lambda ref=ref: {"y": ref()["y"]}, ("case", fwd_name)),
            Case(f"{train_name} (feature-major x)", "fused_mlp",
                 [forward("args_train_fm", "hidden", x_name="x_fm"), backward_pass("_fm"), reduce], arrays,
                 lambda ref=ref: {"y": ref()["y"], "dparams": ref()["dparams"]}, ("case", train_name)),
        ]
        out_pad = mats[-1][1]
        dy_pad = np.zeros((n, out_pad), np.float16)
        dy_pad[:, :n_out] = dy
        arrays.update(dy_pad=dy_pad, y_pad=np.zeros((n, out_pad), np.float16), dx_base=np.zeros((n, n_in), np.float16),
                      dparams_base=np.zeros(P, np.float16))
        spec = (n_in, width, out_pad, layers, FM_ACTIVATIONS[act], FM_ACTIVATIONS[out_act])
        config = net.tcnn_config()
        cols = (slice(None), slice(0, n_out))

        def twice(name, index=None, ref=ref):
            expected, tol = ref()[name]
            return (expected, 2 * tol) + ((index,) if index else ())

        def host(module, fn, args):
            return Launch(module, fn, args, (1, 1, 1), (1, 1, 1), msl=False)

        baselines = [("unfused cuBLAS", [host("cupy", "forward", [("spec", spec), ("buf", "params"), ("buf", "x"),
                                                                 ("buf", "y_pad")])],
                      [host("cupy", "train", [("spec", spec), ("buf", "params"), ("buf", "dparams_base"),
                                              ("buf", "x"), ("buf", "dy_pad"), ("buf", "y_pad"),
                                              ("buf", "dx_base")])])]
        if tcnn:
            baselines.append(("tcnn FullyFusedMLP",
                              [host("tcnn", "tfmo_tcnn_mlp_inference",
                                    [("buf", "params"), ("buf", "x"), ("buf", "y_pad")] + config)],
                              [host("tcnn", "tfmo_tcnn_mlp_train",
                                    [("buf", v) for v in ("params", "dparams_base", "x", "dy_pad", "y_pad", "dx_base")]
                                    + config)]))
        for label, fwd, train in baselines:
            cases += [
                Case(f"{fwd_name} ({label})", "fused_mlp", fwd, arrays, lambda twice=twice, cols=cols: {"y_pad": twice("y", cols)},
                     ("case", fwd_name)),
                Case(f"{train_name} ({label})", "fused_mlp", train, arrays,
                     lambda twice=twice, cols=cols: {"y_pad": twice("y", cols), "dparams_base": twice("dparams")},
                     ("case", train_name)),
            ]
    return cases


# ==== one NeRF training step's kernels in sequence ==================================================================
def nerf_step_cases(n=1 << 18, R=4096, n_levels=16, log2_T=19, base=16, per_level_scale=1.3819, seed=4,
                    tcnn=False) -> list[Case]:
    """One NeRF training step's kernels in sequence at n samples on R rays (instant-ngp's network, float16 table and
    networks): the hash grid's feature-major encode, the density network (32 -> 64 -> 16) on it, the colour network
    (32 -> 64 -> 64 -> 3, sigmoid) on concat(its output, the view direction's SH), packed volume rendering, and the
    backward of all of it down to the table gradient. The elementwise steps between them (trunc_exp, concat, float
    conversions) are dev/gpu_proxy/nerf_glue.cu in both sequences.
      - ours: every kernel as the package's host code launches it (hash_grid_gpu.cc: the float32 table gradient,
        then converted to float16; fused_mlp_gpu.cc: the density network on feature-major x; render_packed_gpu.cc:
        the row_splits checks before each pass);
      - with tcnn, bound for ours: tiny-cuda-nn's kernel_grid and FullyFusedMLP (its training forward and backward,
        the density network on its encoding's SoA layout) with the package's rendering and the same glue.
    The samples lie in order along each ray (lengths about n / R, at random), inside the unit cube.
    Checked stage by stage, each stage against float64 on the inputs the device gave it (so an error does not hide
    behind the next stage): the encode (first 2^16 points), each network's y, dx and dparams (tiny-cuda-nn's at
    twice the tolerances, as in fused_mlp_cases), the glue, the rendering forward and backward, and the table
    gradient (tiny-cuda-nn's sums in float16 with half2 atomics: 10 % of the terms' magnitudes, as tcnn_cases)."""
    rng = np.random.default_rng(seed)
    D, F = 3, 2
    levels, rows = hg_level_table(D, n_levels, log2_T, base, per_level_scale)
    lengths = np.bincount(rng.integers(0, R, n), minlength=R)
    splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    ray, _ = _seg(splits)
    step = (np.round(rng.uniform(0.005, 0.02, n) * 4096) / 4096).astype(np.float32)  # exact sums (render_cases)
    ts = (2.0 + _excl(step.astype(np.float64), splits)).astype(np.float32)
    te = (ts + step).astype(np.float32)
    origin = rng.uniform(0.3, 0.7, (R, D))
    direction = rng.normal(size=(R, D))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    t_box = (0.5 * (ts + te) - 2.0) * 0.2
    x = np.clip(origin[ray] + t_box[:, None] * direction[ray], 0, 1).astype(np.float32)
    table = rng.uniform(-1, 1, (rows, F)).astype(np.float16)
    density = FmNet(n, n_levels * F, 64, 1, 16, "relu", "none")
    colour = FmNet(n, 32, 64, 2, 3, "relu", "sigmoid")
    arrays = {"x": x, "table": table, "levels": levels, "sh": rng.uniform(-1, 1, (n, 16)).astype(np.float16),
              "params_d": density.init_params(rng), "params_c": colour.init_params(rng),
              "ts": ts, "te": te, "splits": splits, "bg": rng.random(3, dtype=np.float32),
              "gC": rng.uniform(-1, 1, (R, 3)).astype(np.float32), "gD": np.zeros(R, np.float32),
              "gO": np.zeros(R, np.float32), "gW": np.zeros(n, np.float32),
              "vr": struct(VRP_PARAMS, R=R, N=n, C=3, bg_mode=1, threshold=0.0), "dl": struct(DLP_PARAMS, R=R, N=n),
              "args_enc": struct(HG_ARGS, n=n, dims=D, n_features=F, n_levels=n_levels, n_active=n_levels,
                                 interpolation=1, feature_major=1),
              "args_grad": struct(HG_ARGS, n=n, dims=D, n_features=F, n_levels=n_levels, n_active=n_levels,
                                  interpolation=1, count=rows * F, n_aggregate=n_levels, feature_major=1),
              "args_d_train": density.args(1, 0, 1), "args_d_bwd": density.args(1, density.parts, 1),
              "args_c_train": colour.args(1), "args_c_bwd": colour.args(1, colour.parts)}
    glue_grid = ((n + 255) // 256, 1, 1)

    def glue(kernel, *args):
        return Launch("nerf_glue", kernel, [a if isinstance(a, tuple) else ("buf", a) for a in args], glue_grid,
                      (256, 1, 1), msl=False)

    def outputs(sfx, y_stride, dy_stride):
        """The per-step arrays of one sequence, suffixed; the colour network's y and dy `*_stride` wide."""
        z = lambda *shape, t=np.float16: np.zeros(shape, t)  # noqa: E731
        arrays.update({k + sfx: v for k, v in {
            "enc": z(n_levels * F, n), "h": z(n, 16), "c_in": z(n, 32), "rgb": z(n, y_stride),
            "sigma": z(n, t=np.float32), "colors": z(n, 3, t=np.float32), "status": z(1, t=np.int32),
            "color": z(R, 3, t=np.float32), "depth": z(R, t=np.float32), "opacity": z(R, t=np.float32),
            "weights": z(n, t=np.float32), "g_sigma": z(n, t=np.float32), "g_colors": z(n, 3, t=np.float32),
            "g_ts": z(n, t=np.float32), "g_te": z(n, t=np.float32), "g_bg": z(R, 3, t=np.float32),
            "dy_c": z(n, dy_stride), "dc_in": z(n, 32), "dh": z(n, 16), "denc": z(n_levels * F, n),
            "dparams_d": z(density.P), "dparams_c": z(colour.P), "grad_table": z(rows * F)}.items()})

    def render(sfx):
        """The package's packed rendering, forward and backward, each after its row_splits checks."""
        checks = [Launch("render_packed", "render_packed_check_init", [("buf", "status" + sfx)], (1, 1, 1),
                         (32, 1, 1)),
                  Launch("render_packed", "render_packed_check_splits",
                         [("buf", "splits"), ("buf", "status" + sfx), ("buf", "dl")], (R + 1, 1, 1), (256, 1, 1))]
        ins = [("buf", v) for v in ("sigma" + sfx, "colors" + sfx, "ts", "te", "splits", "bg")]
        groups = (VRP_LANES * R, 1, 1)
        fwd = Launch("render_packed", "volume_render_packed_forward",
                     ins + [("buf", v + (sfx if v != "vr" else "")) for v in
                            ("status", "color", "depth", "opacity", "weights", "vr")], groups, (256, 1, 1))
        bwd = Launch("render_packed", "volume_render_packed_backward",
                     ins + [("buf", v) for v in ("gC", "gD", "gO", "gW")] +
                     [("buf", v + (sfx if v != "vr" else "")) for v in
                      ("status", "g_sigma", "g_colors", "g_ts", "g_te", "g_bg", "vr")], groups, (256, 1, 1))
        return checks + [fwd], checks + [bwd]

    # ours
    outputs("", 3, 3)
    arrays.update(hidden_d=np.zeros((1, n, 64), np.float32), hidden_c=np.zeros((2, n, 64), np.float32),
                  partial_d=np.zeros(density.parts * density.P, np.float32),
                  partial_c=np.zeros(colour.parts * colour.P, np.float32), acc=np.zeros(rows * F, np.float32),
                  args_count=struct(HG_ARGS, count=rows * F))
    render_fwd, render_bwd = render("")
    ours = ([Launch("hash_grid", "hash_grid_encode_fm_d3f2_float16",
                    [("buf", v) for v in ("x", "table", "levels", "args_enc", "enc")], (n, n_levels, 1), (256, 1, 1)),
             density.forward("enc", "params_d", "args_d_train", "h", "hidden_d"),
             glue("nerf_glue_forward", "h", "sh", ("u32", n), "sigma", "c_in"),
             colour.forward("c_in", "params_c", "args_c_train", "rgb", "hidden_c"),
             glue("nerf_glue_colors", "rgb", ("u32", n), ("u32", 3), "colors")] + render_fwd + render_bwd +
            [glue("nerf_glue_colors_backward", "g_colors", ("u32", n), ("u32", 3), "dy_c"),
             colour.backward("dy_c", "c_in", "params_c", "rgb", "hidden_c", "args_c_bwd", "dc_in", "partial_c"),
             colour.reduce("partial_c", "args_c_bwd", "dparams_c"),
             glue("nerf_glue_backward", "dc_in", "g_sigma", "h", ("u32", n), "dh"),
             density.backward("dh", "enc", "params_d", "h", "hidden_d", "args_d_bwd", "denc", "partial_d"),
             density.reduce("partial_d", "args_d_bwd", "dparams_d"),
             Launch("hash_grid", "hash_grid_fill_zero", [("buf", "acc"), ("buf", "args_count")], (rows * F, 1, 1),
                    (256, 1, 1)),
             Launch("hash_grid", "hash_grid_grad_params_d3f2_float16",
                    [("buf", v) for v in ("denc", "x", "levels", "args_grad", "acc")], (n, n_levels, 1),
                    (256, 1, 1)),
             Launch("hash_grid", "hash_grid_float_to_half", [("buf", "acc"), ("buf", "grad_table"),
                                                            ("buf", "args_count")], (rows * F, 1, 1), (256, 1, 1))])
    cache = {}

    def check(out, sfx="", tcnn_side=False):
        fails, worst = [], [0.0]

        def cmp(stage, got, ref_tol):
            ok, ratio = within(got, *ref_tol)
            worst[0] = max(worst[0], ratio)
            if not ok:
                fails.append(f"{stage}: max |error| / tolerance = {ratio:.3g}")

        def exact(stage, got, want):
            if not np.array_equal(np.asarray(got), np.asarray(want)):
                fails.append(f"{stage}: not the exact values")

        o = {k: out[k + sfx] for k in ("enc", "h", "c_in", "rgb", "sigma", "colors", "color", "weights", "g_sigma",
                                       "g_colors", "dy_c", "dc_in", "dh", "denc", "dparams_d", "dparams_c",
                                       "grad_table")}
        twice = (lambda rt: (rt[0], 2 * rt[1])) if tcnn_side else (lambda rt: rt)
        m = min(n, 1 << 16)
        key = "tcnn_levels" if tcnn_side else "levels"
        if key not in cache:
            cache[key] = tcnn_level_scales(levels, float(hg_log2_scale(per_level_scale)), base) if tcnn_side else levels
        lv = cache[key]
        zeros = np.zeros((n, n_levels * F), np.float32)
        enc = hg_reference(x, table, lv, zeros, np.zeros((n, D), np.float32), F, ("out",), m)["out"]
        cmp("encode", o["enc"][:, :m].T, (enc, 1e-3 * (np.abs(enc) + 1.0)))
        y, dp, dx = fm_reference(o["enc"].T, arrays["params_d"], o["dh"], density.mats, 16, "relu", "none", True)
        cmp("density network y", o["h"], twice(y))
        cmp("density network dparams", o["dparams_d"], twice(dp))
        cmp("density network dx", o["denc"].T, twice(dx))
        h0 = o["h"][:, 0].astype(np.float64)
        sigma = np.exp(np.clip(h0, -15, 15))
        cmp("glue: sigma", o["sigma"], (sigma, 1e-5 * sigma))
        exact("glue: colour input", o["c_in"], np.concatenate([o["h"], arrays["sh"]], axis=1))
        y, dp, dx = fm_reference(o["c_in"], arrays["params_c"], o["dy_c"][:, :3], colour.mats, 3, "relu", "sigmoid",
                                 True)
        cmp("colour network y", o["rgb"][:, :3], twice(y))
        cmp("colour network dparams", o["dparams_c"], twice(dp))
        cmp("colour network dx", o["dc_in"], twice(dx))
        exact("glue: colours", o["colors"], o["rgb"][:, :3].astype(np.float32))
        z = np.zeros(n, np.float32)
        r = render_reference(o["sigma"], o["colors"], ts, te, splits, arrays["bg"], arrays["gC"], arrays["gD"],
                             arrays["gO"], arrays["gW"], z, np.zeros(R, np.float32))
        for name, ref_name in (("color", "color"), ("weights", "weights"), ("g_sigma", "grad_densities"),
                               ("g_colors", "grad_colors")):
            cmp(f"rendering: {name}", o[name], (r[ref_name], _tol(r[ref_name])))
        dy_c = np.zeros_like(o["dy_c"])
        dy_c[:, :3] = o["g_colors"].astype(np.float16)
        exact("glue: colour gradient", o["dy_c"], dy_c)
        dh = o["dc_in"][:, :16].astype(np.float64)
        dh[:, 0] += o["g_sigma"] * np.where(np.abs(h0) < 15, np.exp(h0), 0.0)
        cmp("glue: density gradient", o["dh"], (dh, 1e-3 * np.abs(dh) + 1e-6))
        g = hg_reference(x, table, lv, o["denc"].T, np.zeros((n, D), np.float32), F, ("grad_params",))
        tol = (0.1 * g["abs_grad_params"] + 1e-3 if tcnn_side else
               1e-3 * np.abs(g["grad_params"]) + 1e-4 * g["abs_grad_params"] + 1e-6)
        cmp("table gradient", o["grad_table"], (g["grad_params"], tol))
        return fails, worst[0]

    per_sample = nbytes(arrays, "x", "sh", "ts", "te", "enc", "h", "c_in", "rgb", "sigma", "colors", "weights",
                        "g_sigma", "g_colors", "dy_c", "dc_in", "dh", "denc", "hidden_d", "hidden_c")
    name = f"nerf_step_float16, {n} samples on {R} rays"
    cases = []
    if tcnn:
        sfx = "_t"
        outputs(sfx, 16, 16)
        offsets = np.append(levels["offset"], rows).astype(np.uint32)
        grid_args = [("host", offsets), ("u32", n), ("u32", n_levels), ("u32", base),
                     ("f32", float(hg_log2_scale(per_level_scale)))]

        def host(fn, *args):
            return Launch("tcnn", fn, [a if isinstance(a, tuple) else ("buf", a) for a in args], (), (), msl=False)

        render_fwd_t, render_bwd_t = render(sfx)
        d_cfg, c_cfg = density.tcnn_config(), colour.tcnn_config()
        theirs = ([host("tfmo_tcnn_grid_forward_f16", "table", "x", "enc_t", *grid_args),
                   host("tfmo_tcnn_mlp_forward", "params_d", "dparams_d_t", "enc_t", "h_t", *d_cfg, ("u32", 1)),
                   glue("nerf_glue_forward", "h_t", "sh", ("u32", n), "sigma_t", "c_in_t"),
                   host("tfmo_tcnn_mlp_forward", "params_c", "dparams_c_t", "c_in_t", "rgb_t", *c_cfg, ("u32", 0)),
                   glue("nerf_glue_colors", "rgb_t", ("u32", n), ("u32", 16), "colors_t")] +
                  render_fwd_t + render_bwd_t +
                  [glue("nerf_glue_colors_backward", "g_colors_t", ("u32", n), ("u32", 16), "dy_c_t"),
                   host("tfmo_tcnn_mlp_backward", "params_c", "dparams_c_t", "c_in_t", "rgb_t", "dy_c_t", "dc_in_t",
                        *c_cfg, ("u32", 0)),
                   glue("nerf_glue_backward", "dc_in_t", "g_sigma_t", "h_t", ("u32", n), "dh_t"),
                   host("tfmo_tcnn_mlp_backward", "params_d", "dparams_d_t", "enc_t", "h_t", "dh_t", "denc_t",
                        *d_cfg, ("u32", 1)),
                   Launch("hash_grid", "hash_grid_fill_zero", [("buf", "grad_table_t"), ("buf", "args_half")],
                          (rows * F // 2, 1, 1), (256, 1, 1)),
                   host("tfmo_tcnn_grid_backward_f16", "grad_table_t", "x", "denc_t", *grid_args)])
        arrays["args_half"] = struct(HG_ARGS, count=rows * F // 2)  # float16 zeros as float32 pairs
        tcnn_name = f"{name} (tiny-cuda-nn grid and FullyFusedMLP, our rendering)"
        cases.append(Case(tcnn_name, "nerf_step", theirs, arrays, dict, ("copy", per_sample),
                          check=lambda out: check(out, "_t", True),
                          note="tiny-cuda-nn's kernel_grid, its backward and FullyFusedMLP; the glue and rendering ours"))
    cases.append(Case(f"{name} (ours)", "nerf_step", ours, arrays, dict,
                      ("case", tcnn_name) if tcnn else ("copy", per_sample), check=check,
                      note="bound: the same step with tiny-cuda-nn's grid and networks" if tcnn else
                      "bound: every per-sample array once at copy bandwidth"))
    return cases


def round16(n):
    return (int(n) + 15) // 16 * 16


def all_cases(small=False, tcnn=False) -> list[Case]:
    if small:
        return (hash_grid_cases(n=2048, log2_T=12, n_levels=8, tcnn=tcnn) + render_cases(R=64, S=16) +
                render_cases(R=64, S=16, packed=True) + ray_march_cases(R=512, G=32, max_samples=256) +
                fused_mlp_cases(n=1000) + nerf_step_cases(n=4096, R=64, n_levels=8, log2_T=12))
    return (hash_grid_cases(tcnn=tcnn) + render_cases() + render_cases(packed=True) + ray_march_cases() +
            fused_mlp_cases(tcnn=tcnn) + nerf_step_cases(tcnn=tcnn))
