"""Occupancy grid and ray marching that skips empty space (Instant-NGP / nerfacc style).

``OccupancyGrid`` keeps a decayed-max density estimate per cell of a G^3 grid over a box and a bitfield of the
occupied cells; ``ray_march`` (the compiled ``RayMarch`` op, CPU and Metal kernels) marches rays through the box and
returns packed samples only in occupied cells; ``ray_march_tf`` is the same march in plain TensorFlow (the oracle and
the speed baseline).

Packed samples: R rays, N samples. Sample k covers [t_starts[k], t_ends[k]] of ray ray_indices[k];
``row_splits`` [R+1] int32 (``tf.RaggedTensor.from_row_splits(values, row_splits)`` works). Within a ray samples are
sorted and non-overlapping; gaps are skipped empty space.

Unbounded scenes: ``OccupancyGrid(cascades=K)`` keeps K grids of the same resolution, cascade c over the box scaled
by 2^c about its centre (Instant-NGP's ``aabb_scale`` = 2^(K-1), nerfacc's ``OccGridEstimator`` levels; at most
``MAX_CASCADES`` = 8). The march then covers the outermost box; each candidate's cell is that of the finest cascade
containing its midpoint, a skip never passes the entry into a finer cascade's box, and ``cone_angle`` steps grow with
the distance up to one cell diagonal of the cascade they are in (so far samples are as coarse as the grid there).
``near``/``far`` per ray bound the march (e.g. from the data's depth range).

March (conventions in csrc/shared/ray_march_math.h): the ray o + t d covers
[max(near, t_box_enter), min(far, t_box_exit)]; steps dt(t) = clamp(t * cone_angle, step_size, max_step) with
max_step = max(step_size, sqrt(3) * largest cell size); the first sample starts at t_enter + u dt with u in [0, 1)
from a counter-based hash of (seed, ray index) (identical on every backend); a candidate [t, min(t + dt, t_exit)] is
kept when its midpoint lies in an occupied cell, otherwise t jumps to where the ray leaves the largest empty
block around that cell in the occupancy mip (levels of 2^m-cell blocks, each the OR of 2x2x2 blocks of the level
below, built by the kernels from the bitfield on every call): the same occupied cells as skipping cell by cell, in
a few steps instead of one per empty cell. At most ``max_samples`` samples per ray. Bad input: the CPU kernel raises InvalidArgumentError for non-finite origins or
directions and NaN near/far (near > far is fine: no samples); the Metal kernels give such a ray no samples.

The package: ``ops`` (the op wrapper and the bitfield format), ``pure_tf`` (the march in plain TensorFlow) and
``reference`` (NumPy float64, with the input makers of the tests). ``OccupancyGrid`` is in ``tf_metal_ops.occupancy``.
"""

from tf_metal_ops.ray_march import pure_tf, reference
from tf_metal_ops.ray_march.ops import (
    MAX_CASCADES,
    MAX_RESOLUTION,
    RayMarchResult,
    pack_bits,
    ray_march,
    unpack_bits,
)
from tf_metal_ops.ray_march.pure_tf import ray_march_tf

__all__ = ["MAX_CASCADES", "MAX_RESOLUTION", "RayMarchResult", "pack_bits", "pure_tf", "ray_march", "ray_march_tf",
           "reference", "unpack_bits"]
