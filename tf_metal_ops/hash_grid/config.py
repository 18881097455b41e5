"""Hash-grid configuration and table layout (pure Python: importable without TensorFlow).

Coordinate convention (Instant-NGP / tiny-cuda-nn, "tcnn"), stated once for the package:

* Inputs are positions ``x`` in ``[0, 1]^D`` (D = 1..4), float32. Out-of-range policy: every coordinate is first
  clamped to ``[0, 1]`` (+inf -> 1, -inf -> 0) and NaN becomes 0, so no input can index outside the table.
  The position gradient is the derivative of that clamp: zero where ``x < 0``, ``x > 1`` or ``x`` is NaN;
  ``0 <= x <= 1`` (endpoints included) gets the analytic gradient.
* Level ``l`` (0-based) has ``scale_l = N_min * b**l - 1`` and ``resolution_l = ceil(scale_l) + 1``.
  ``scale_l`` is tcnn's float32 sequence ``exp2f(float(l) * log2f(b)) * N_min - 1.0f`` with each of its five steps
  rounded to nearest float32 (``log2`` and ``exp2`` correctly rounded): ``level_scale``. ``b`` is a float32
  attribute of the op; the host computes the per-level scales (csrc/shared/hash_grid_math.h ``hg_level_scale``,
  the same steps), so CPU, GPU, pure TF and the NumPy reference agree bitwise.
* ``pos = fma(scale_l, x, 0.5)``: float32 with ONE rounding of ``x * scale_l + 0.5`` (tcnn's ``fmaf``; every backend
  uses a fused multiply-add or emulates it exactly), ``grid = floor(pos)`` (a non-negative integer vector),
  ``frac = pos - grid``. Linear interpolation blends the ``2^D`` corners ``grid + c`` (c in {0,1}^D) with weights
  ``prod_i (c_i ? w_i : 1-w_i)``, ``w = frac``; smoothstep uses ``w = frac^2 (3 - 2 frac)``; nearest reads only the
  corner ``grid`` (zero position gradient).
* Corner ``g`` of level ``l`` reads row ``offsets[l] + index_l(g)`` of the flat table ``[total_entries, F]``, with
  tcnn's current ``grid_index`` (``common_device.h``). ``MAX_BASE[D]`` is the largest base whose D-th power fits in
  uint32 (``MAX_BASE``):

  - if ``resolution_l <= MAX_BASE[D]``: ``index = sum_{i<D} g_i * resolution_l^i`` over ALL D dims (uint32
    arithmetic) and ``stride = resolution_l^D``; otherwise ``index = 0`` and ``stride = 0xFFFFFFFF``
    (``index_stride``, ``dense_strides``);
  - grid_type "hash" and ``size_l < stride``: the level is hashed, ``index = XOR_i (g_i * pi_i mod 2^32)`` with
    ``pi = (1, 2654435761, 805459861, 3674653429)``;
  - then ``index mod size_l``.

  So a tiled level finer than its tile (``resolution^D > size``) wraps the full row-major index (older tcnn
  summed only the leading dims whose stride fit in the level), and a tiled level with
  ``resolution > MAX_BASE[D]`` reads row 0 for every corner, as tcnn does. For ``resolution <= MAX_BASE[D]`` the
  uint32 sum cannot wrap (even with ``g_i = resolution``), so the exact integer sum is the same number.
  ``g_i`` can equal ``resolution_l`` at the upper edge; like tcnn, that corner aliases through the modulo.
* Output ``[N, L*F]``, level-major: level ``l``'s F features at columns ``l*F .. l*F+F-1``.

Table layout per level (tcnn ``GridEncodingTemplated``): ``dense = next_multiple(min(resolution^D, 2^31 - 1), 8)``;
``size = dense`` for grid_type "dense", ``min(dense, base_resolution^D)`` for "tiled" and ``min(dense, 2^log2_hashmap_size)``
for "hash". A level is hashed iff grid_type is "hash" and ``size < stride`` (the ``grid_index`` rule above; the same as
``resolution^D > size``). ``offsets`` are the cumulative sizes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import struct
from typing import Optional, Tuple

GRID_TYPES = ("hash", "dense", "tiled")
INTERPOLATIONS = ("linear", "smoothstep", "nearest")
FEATURES_PER_LEVEL = (1, 2, 4, 8)
MAX_INPUT_DIMS = 4
MAX_LEVELS = 32
MAX_LOG2_HASHMAP_SIZE = 24
# Table rows and params elements are indexed with int32 (tf.gather, the kernels): both must fit.
MAX_TOTAL_PARAMS = 2**31 - 1
# float32 positions in [0, 1] cannot tell cells of finer grids apart; this bound also keeps float32 `pos`,
# int32 grid coordinates and int64 products coordinate*prime exact. (Same bound as the op.)
MAX_SCALE = 2.0**24
HASH_PRIMES = (1, 2654435761, 805459861, 3674653429, 2097192037, 1434869437, 2165219737)
# tcnn's MAX_BASES (common_device.h, grid_index): for D = 0..10, the largest base whose D-th power fits in uint32.
MAX_BASE = (0, 0xFFFFFFFF, 0xFFFF, 0x659, 0xFF, 0x54, 0x28, 0x17, 0xF, 0xB, 0x9)
_DENSE_CAP = 2**31 - 1  # tcnn: uint32 max / 2


def _f32(v: float) -> float:
    """Rounds a Python float to the nearest float32 value (returned as a Python float; overflow gives +-inf)."""
    try:
        return struct.unpack("f", struct.pack("f", v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


# Correctly rounded float32 exp2/log2 of the level-scale arguments (x in [0, 24.5], b in [1, 2^24 + 2]): the
# double libm value rounded to float, except for the arguments whose exact value lies within 4 double ulps of a
# midpoint between floats (all of them, from an exhaustive search: dev/check_level_scale_rounding.py); the same
# table as hg_exp2_f32 / hg_log2_f32 in csrc/shared/hash_grid_math.h.
_EXP2_HARD = {float.fromhex(a): float.fromhex(b) for a, b in (
    ("0x1.853a6ep-9", "0x1.00870ap+0"), ("0x1.0f0af8p-11", "0x1.00177cp+0"), ("0x1.05535ap-7", "0x1.016b46p+0"),
    ("0x1.0f39eep-18", "0x1.00003p+0"))}
_LOG2_HARD = {float.fromhex("0x1.40f572p+1"): float.fromhex("0x1.5384bcp+0")}
_exp2 = getattr(math, "exp2", lambda v: 2.0 ** v)  # math.exp2: Python >= 3.11


def _exp2_f32(x: float) -> float:
    """float32 2^x, correctly rounded, for a float32 ``x`` in [0, 24.5]."""
    if x in _EXP2_HARD:
        return _EXP2_HARD[x]
    return _f32(_exp2(x)) if x < 1024.0 else math.inf  # beyond 128 the float32 result is inf anyway


def _log2_f32(b: float) -> float:
    """float32 log2(b), correctly rounded, for a float32 ``b`` in [1, 2^24 + 2]."""
    return _LOG2_HARD[b] if b in _LOG2_HARD else _f32(math.log2(b))


def level_scale(level: int, per_level_scale: float, base_resolution: int) -> float:
    """tcnn's level scale ``exp2f(float(level) * log2f(b)) * N_min - 1.0f``, every step rounded to float32:
    ``log2_b = fl(log2 fl(b))``, ``x = fl(level * log2_b)``, ``p = fl(2^x)``, ``m = fl(p * N_min)``,
    ``fl(m - 1)``. The products and the difference are exact in double, so rounding them once is the float32
    operation. Returned as a Python float holding a float32 value."""
    log2_b = _log2_f32(_f32(float(per_level_scale)))
    x = _f32(float(level) * log2_b)
    m = _f32(_exp2_f32(x) * float(base_resolution))
    return _f32(m - 1.0)


def _next_multiple(v: int, m: int) -> int:
    return -(-v // m) * m


def per_level_scale_from_finest_resolution(base_resolution, finest_resolution, n_levels) -> float:
    """Per-level growth factor ``b`` so that level ``L-1`` has resolution ~``finest_resolution``.

    ``b = exp(log(N_max / N_min) / (L - 1))`` (the Instant-NGP paper's formula); ``L == 1`` gives 1.0.
    """
    if not (isinstance(n_levels, int) and n_levels >= 1):
        raise ValueError(f"n_levels must be an int >= 1, got {n_levels!r}")
    if not (base_resolution >= 1):
        raise ValueError(f"base_resolution must be >= 1, got {base_resolution!r}")
    if not (finest_resolution >= base_resolution):
        raise ValueError(
            f"finest_resolution ({finest_resolution!r}) must be >= base_resolution ({base_resolution!r})"
        )
    if n_levels == 1:
        return 1.0
    return math.exp(math.log(finest_resolution / base_resolution) / (n_levels - 1))


@dataclasses.dataclass(frozen=True)
class HashGridConfig:
    """Options of a multiresolution hash-grid encoding, validated, with the derived table layout.

    All derived quantities are computed from the validated fields and are plain Python ints/floats/tuples.
    """

    n_input_dims: int
    n_levels: int = 16
    n_features_per_level: int = 2
    log2_hashmap_size: int = 19
    base_resolution: int = 16
    per_level_scale: float = 2.0
    grid_type: str = "hash"
    interpolation: str = "linear"

    def __post_init__(self):
        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        def check_int(name, lo, hi=None):
            v = getattr(self, name)
            if hasattr(v, "__index__") and not isinstance(v, bool) and not is_int(v):
                v = int(v.__index__())  # numpy ints
                object.__setattr__(self, name, v)
            if not is_int(v) or v < lo or (hi is not None and v > hi):
                rng = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
                raise ValueError(f"{name} must be an int {rng}, got {v!r}")

        check_int("n_input_dims", 1, MAX_INPUT_DIMS)
        check_int("n_levels", 1, MAX_LEVELS)
        check_int("log2_hashmap_size", 1, MAX_LOG2_HASHMAP_SIZE)
        check_int("base_resolution", 1)
        check_int("n_features_per_level", 1)
        if self.n_features_per_level not in FEATURES_PER_LEVEL:
            raise ValueError(
                f"n_features_per_level must be one of {FEATURES_PER_LEVEL}, got {self.n_features_per_level!r}"
            )
        b = self.per_level_scale
        if isinstance(b, bool) or not isinstance(b, (int, float)) and not hasattr(b, "__float__"):
            raise ValueError(f"per_level_scale must be a number >= 1, got {b!r}")
        b = float(b)
        if not (math.isfinite(b) and b >= 1.0):
            raise ValueError(f"per_level_scale must be a finite number >= 1, got {b!r}")
        object.__setattr__(self, "per_level_scale", b)
        for name, allowed in (("grid_type", GRID_TYPES), ("interpolation", INTERPOLATIONS)):
            v = getattr(self, name)
            if not isinstance(v, str) or v.lower() not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {v!r}")
            object.__setattr__(self, name, v.lower())
        if self.scales[-1] > MAX_SCALE:
            raise ValueError(
                f"per_level_scale={self.per_level_scale} with base_resolution={self.base_resolution} and "
                f"n_levels={self.n_levels} gives a finest scale of {self.scales[-1]:.6g} (> 2^24); "
                "reduce per_level_scale, base_resolution or n_levels"
            )
        if self.n_params > MAX_TOTAL_PARAMS:
            raise ValueError(
                f"the {self.grid_type} grid needs {self.total_entries} table entries x {self.n_features_per_level} "
                f"features (> {MAX_TOTAL_PARAMS} parameters); "
                "reduce n_levels/per_level_scale/base_resolution or use grid_type='hash'"
            )

    @classmethod
    def from_finest_resolution(cls, n_input_dims, finest_resolution, *, n_levels=16, base_resolution=16, **kwargs):
        """Config whose per_level_scale makes the finest level's resolution ~``finest_resolution``."""
        b = per_level_scale_from_finest_resolution(base_resolution, finest_resolution, n_levels)
        return cls(n_input_dims, n_levels=n_levels, base_resolution=base_resolution, per_level_scale=b, **kwargs)

    # ---- per-level quantities -------------------------------------------------------------------------------
    def scale(self, level: int) -> float:
        """``scale_l`` as a float32 value (``level_scale``: tcnn's float32 steps)."""
        return level_scale(level, self.per_level_scale, self.base_resolution)

    def resolution(self, level: int) -> int:
        return int(math.ceil(self.scale(level))) + 1

    def params_in_level(self, level: int) -> int:
        """Number of table entries (rows of F features) of one level."""
        dense = _next_multiple(min(self.resolution(level) ** self.n_input_dims, _DENSE_CAP), 8)
        if self.grid_type == "dense":
            return dense
        if self.grid_type == "tiled":
            return min(dense, self.base_resolution**self.n_input_dims)
        return min(dense, 1 << self.log2_hashmap_size)

    def index_stride(self, level: int) -> int:
        """tcnn ``grid_index``'s ``stride``: ``resolution^D`` when ``resolution <= MAX_BASE[D]``, else ``0xFFFFFFFF``."""
        res, d = self.resolution(level), self.n_input_dims
        return res**d if res <= MAX_BASE[d] else 0xFFFFFFFF

    def is_hashed(self, level: int) -> bool:
        """grid_type "hash" and ``size < index_stride`` (tcnn ``grid_index``)."""
        return self.grid_type == "hash" and self.params_in_level(level) < self.index_stride(level)

    def dense_strides(self, level: int) -> Tuple[int, ...]:
        """Per-dim strides of the non-hashed (row-major) index, tcnn ``grid_index``: ``resolution^i`` for all D dims
        when ``resolution <= MAX_BASE[D]``, else all 0 (every corner reads row 0 of the level)."""
        res, d = self.resolution(level), self.n_input_dims
        if res > MAX_BASE[d]:
            return (0,) * d
        return tuple(res**i for i in range(d))

    # ---- whole-table quantities (cached: the dataclass is frozen) --------------------------------------------
    @functools.cached_property
    def scales(self) -> Tuple[float, ...]:
        return tuple(self.scale(l) for l in range(self.n_levels))

    @functools.cached_property
    def resolutions(self) -> Tuple[int, ...]:
        return tuple(self.resolution(l) for l in range(self.n_levels))

    @functools.cached_property
    def level_sizes(self) -> Tuple[int, ...]:
        return tuple(self.params_in_level(l) for l in range(self.n_levels))

    @functools.cached_property
    def hashed_levels(self) -> Tuple[bool, ...]:
        return tuple(self.is_hashed(l) for l in range(self.n_levels))

    @functools.cached_property
    def offsets(self) -> Tuple[int, ...]:
        """``L + 1`` cumulative level sizes: level ``l`` owns table rows ``offsets[l] .. offsets[l+1]-1``."""
        out = [0]
        for s in self.level_sizes:
            out.append(out[-1] + s)
        return tuple(out)

    @property
    def total_entries(self) -> int:
        """Rows of the flat parameter table ``[total_entries, F]``."""
        return self.offsets[-1]

    @property
    def n_params(self) -> int:
        """Scalar parameters: ``total_entries * F``."""
        return self.total_entries * self.n_features_per_level

    @property
    def n_output_dims(self) -> int:
        return self.n_levels * self.n_features_per_level

    @property
    def params_shape(self) -> Tuple[int, int]:
        return (self.total_entries, self.n_features_per_level)

    def op_kwargs(self) -> dict:
        """The keyword arguments of ``hash_grid_encode`` (everything except n_input_dims)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "n_input_dims"}

    def layout(self) -> "HashGridTableLayout":
        return HashGridTableLayout(
            n_input_dims=self.n_input_dims,
            n_levels=self.n_levels,
            n_features_per_level=self.n_features_per_level,
            scales=self.scales,
            resolutions=self.resolutions,
            level_sizes=self.level_sizes,
            offsets=self.offsets,
            hashed=self.hashed_levels,
            total_entries=self.total_entries,
            n_params=self.n_params,
            n_output_dims=self.n_output_dims,
        )


@dataclasses.dataclass(frozen=True)
class HashGridTableLayout:
    """Table size and per-level layout of a hash-grid config (see ``hash_grid_table_layout``)."""

    n_input_dims: int
    n_levels: int
    n_features_per_level: int
    scales: Tuple[float, ...]
    resolutions: Tuple[int, ...]
    level_sizes: Tuple[int, ...]
    offsets: Tuple[int, ...]
    hashed: Tuple[bool, ...]
    total_entries: int
    n_params: int
    n_output_dims: int

    @property
    def params_shape(self) -> Tuple[int, int]:
        return (self.total_entries, self.n_features_per_level)


def hash_grid_table_layout(n_input_dims, *, finest_resolution: Optional[float] = None, **options) -> HashGridTableLayout:
    """Table size, per-level sizes/offsets/resolutions of a hash-grid config.

    ``options`` are ``HashGridConfig``'s keyword arguments (``n_levels``, ``n_features_per_level``,
    ``log2_hashmap_size``, ``base_resolution``, ``per_level_scale``, ``grid_type``, ``interpolation``), with its
    defaults. ``params`` for ``hash_grid_encode`` must have shape ``layout.params_shape == (total_entries, F)``.
    Pass ``finest_resolution`` instead of ``per_level_scale`` to derive the scale from it.
    ``n_input_dims`` may also be a ``HashGridConfig`` (then the other arguments are ignored).

    >>> hash_grid_table_layout(3, n_levels=2, log2_hashmap_size=10, base_resolution=4).params_shape
    (576, 2)
    """
    if isinstance(n_input_dims, HashGridConfig):
        return n_input_dims.layout()
    if finest_resolution is not None:
        options["per_level_scale"] = per_level_scale_from_finest_resolution(
            options.get("base_resolution", HashGridConfig.base_resolution), finest_resolution,
            options.get("n_levels", HashGridConfig.n_levels))
    return HashGridConfig(n_input_dims, **options).layout()
