"""Scene contraction for unbounded scenes (mip-NeRF 360, Barron et al. 2022, eq. 10):

    contract(x) = x                          if ||x|| <= 1
                  (2 - 1/||x||) x / ||x||    otherwise

maps all of R^3 into the ball of radius 2 (``norm="l2"``, mip-NeRF 360's choice) or the cube of radius 2
(``norm="inf"``, the option nerfstudio's nerfacto uses: the contracted scene then fills the hash grid's cube, with no
wasted corners). The unit region keeps its geometry; outside it a point at distance n lands at 2 - 1/n, so equal
steps in the contracted space are equal steps in disparity (1/distance), which is how a camera sees far content.
``contract_to_unit`` first maps a scene box onto [-1, 1]^3 and rescales the result into [0, 1]^3, the input of the
hash grid (``hash_grid_encode``).

It is elementwise per point (a handful of arithmetic operations), so it is plain TensorFlow: autodiff gives the
exact gradient, XLA fuses it, and every device runs it; a custom kernel would save nothing. ``reference`` holds the
NumPy float64 version and its Jacobian (the test oracles).

Instant-NGP handles unbounded scenes differently: cascades of occupancy grids, each twice the extent of the previous
(``OccupancyGrid(cascades=K)`` and ``ray_march``, ``tf_metal_ops.occupancy``). Both combine: the cascades say where
to sample, the contraction where those samples land in the encoding.
"""

from tf_metal_ops.contraction import reference
from tf_metal_ops.contraction.ops import NORMS, contract, contract_to_unit

__all__ = ["NORMS", "contract", "contract_to_unit", "reference"]
