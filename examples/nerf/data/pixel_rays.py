"""Training rays made per batch from the images' pixels: nothing per ray is stored.

A training ray is a pixel of a training view, numbered ``view * H * W + row * W + column``. :class:`PixelRays`
makes the rays of a batch of such numbers (origin, unit direction through the pixel centre by the view's camera,
distortion included, colour and view index) and drops the pixels without a ray or masked out, so that memory is the
images (8-bit for real captures) and the batch. :func:`shuffled` is a seeded permutation of ``[0, n)`` evaluated at
any positions, without materialising it (a Feistel network on the next power of two, cycle-walked into range), so
an epoch's order costs no memory whatever ``n``.
"""

from __future__ import annotations

import numpy as np

from nerf.data.cameras import Camera
from nerf.data.dataset import Views, to_float

_ROUNDS = 4
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """A 64-bit hash of ``x`` (uint64) and ``key`` (splitmix64's finaliser)."""
    with np.errstate(over="ignore"):
        z = (x + key * np.uint64(0x9E3779B97F4A7C15)) & _M64
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _M64
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _M64
        return z ^ (z >> np.uint64(31))


def _feistel(x: np.ndarray, half_bits: int, keys) -> np.ndarray:
    mask = np.uint64((1 << half_bits) - 1)
    left, right = x >> np.uint64(half_bits), x & mask
    for k in keys:
        left, right = right, left ^ (_mix(right, k) & mask)
    return (left << np.uint64(half_bits)) | right


def shuffled(positions, n: int, seed) -> np.ndarray:
    """Element ``positions`` (int64 array in ``[0, n)``) of a pseudo-random permutation of ``[0, n)`` chosen by
    ``seed`` (an int or a sequence of ints), as int64.

    >>> p = shuffled(np.arange(10), 10, [0, 1])
    >>> sorted(p.tolist()) == list(range(10))
    True
    """
    n = int(n)
    pos = np.asarray(positions, np.int64)
    if n <= 1:
        return np.zeros_like(pos)
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    keys = [np.uint64(int(k)) for k in np.random.SeedSequence(np.atleast_1d(seed).tolist()).generate_state(
        _ROUNDS, np.uint64)]
    x = pos.astype(np.uint64)
    todo = np.ones(x.shape, bool)
    while todo.any():  # cycle walking: the domain 4^half is below 4n, so under 4 rounds on average
        x[todo] = _feistel(x[todo], half, keys)
        todo = x >= np.uint64(n)
    return x.astype(np.int64)


class PixelRays:
    """The training rays of ``views`` (images ``[N, H, W, 3]`` uint8 or float32, camera-to-world ``poses``,
    ``cameras`` or else one pinhole camera of focal length ``focal`` centred in the image, optional ``masks``).

    >>> v = Views(np.zeros((2, 4, 6, 3), np.uint8), np.tile(np.eye(4, dtype=np.float32), (2, 1, 1)))
    >>> o, d, rgb, view = PixelRays(v, focal=5.0).rays(np.array([0, 30]))
    >>> d.shape, view.tolist()
    ((2, 3), [0, 1])
    """

    def __init__(self, views: Views, focal: float | None = None):
        self.images = views.images
        self.N, self.H, self.W = (int(s) for s in views.images.shape[:3])
        self.n = self.N * self.H * self.W
        self._pixels = views.images.reshape(-1, 3)  # a view, not a copy
        self.poses = np.asarray(views.poses, np.float64)
        cams = views.cameras if views.cameras is not None else \
            [Camera.pinhole(self.W, self.H, focal, focal, self.W / 2, self.H / 2)] * self.N
        self.cameras = list(dict.fromkeys(cams))
        index = {c: k for k, c in enumerate(self.cameras)}
        self.camera_of_view = np.array([index[c] for c in cams], np.int64)
        self.masks = None if views.masks is None else views.masks.reshape(-1)

    def local_rays(self, idx) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rays ``idx`` (int array) → unit directions in their camera's frame (OpenGL axes, ``[M, 3]`` float32),
        colours (``[M, 3]`` float32) and views (``[M]`` int32) of those that have a ray and are not masked out (``M`` ≤
        ``len(idx)``, in ``idx``'s order). The world ray is the view's pose applied to it (:meth:`rays`)."""
        idx = np.asarray(idx, np.int64)
        if self.masks is not None:
            idx = idx[self.masks[idx]]
        view, pix = np.divmod(idx, self.H * self.W)
        row, col = np.divmod(pix, self.W)
        if len(self.cameras) == 1:
            local, ok = self.cameras[0].directions(col + 0.5, row + 0.5)
        else:
            local = np.empty((len(idx), 3), np.float64)
            ok = np.ones(len(idx), bool)
            cam = self.camera_of_view[view]
            for c in np.unique(cam):
                sel = np.flatnonzero(cam == c)
                local[sel], ok[sel] = self.cameras[c].directions(col[sel] + 0.5, row[sel] + 0.5)
        if not ok.all():
            idx, view, local = idx[ok], view[ok], local[ok]
        return local.astype(np.float32), to_float(self._pixels[idx]), view.astype(np.int32)

    def rays(self, idx) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Rays ``idx`` → world origins, unit directions and colours (``[M, 3]`` float32 each) and views (``[M]``
        int32), as :meth:`local_rays` keeps them."""
        local, rgb, view = self.local_rays(idx)
        R = self.poses[view, :3, :3]
        d = np.einsum("nij,nj->ni", R, local.astype(np.float64))
        d /= np.linalg.norm(d, axis=-1, keepdims=True)
        return self.poses[view, :3, 3].astype(np.float32), d.astype(np.float32), rgb, view
