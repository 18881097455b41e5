"""Peak resident memory of ``examples/nerf/train.py`` on a capture of many large images, against the 8-bit size of
the images (training keeps them as 8-bit RGB and makes the rays of each batch from the sampled pixels).

The capture is the example's unbounded test scene (``nerf.data.unbounded_scene``) seen by its PINHOLE camera on a
ring of ``--views`` views, rendered at 64x48 and resampled (nearest) to ``--size``, written as a COLMAP binary model
with JPEG images by the package's scene writers (pycolmap). Then ``/usr/bin/time -v train.py --data DIR
--downscale 1 --minutes M --final-views 0`` (no test renders) and its "Maximum resident set size".

    python bench/nerf_capture_memory.py --views 130 --size 1200x900 --minutes 1
    python bench/nerf_capture_memory.py --views 185 --size 1297x840 --minutes 1   # mip-NeRF 360's garden at 1/4
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
sys.path.insert(0, EXAMPLES)
sys.path.insert(0, HERE)

from bench_util import cpu_model  # noqa: E402


def write_capture(root: str, views: int, size: tuple) -> int:
    """The capture at ``root`` → the images' 8-bit size in bytes."""
    from nerf.data import capture_writers as writers
    from nerf.data import unbounded_scene as scene

    pinhole = [k for k, (m, _) in enumerate(scene.CAMERAS) if m == "PINHOLE"][0]
    small = scene.render(n_views=views, ss=1, n_points=4 * views, cameras=[pinhole])
    W, H = size
    rows = np.arange(H) * small.images.shape[1] // H
    cols = np.arange(W) * small.images.shape[2] // W
    big = small.images[:, rows][:, :, cols]
    capture = scene.Capture(big, small.names, small.camera_index, small.c2w, small.points, small.colors, 1, (W, H))
    writers.write_colmap(root, capture, binary=True, ext="jpg")
    return int(big.nbytes)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--views", type=int, default=130)
    p.add_argument("--size", default="1200x900", help="WIDTHxHEIGHT")
    p.add_argument("--minutes", type=float, default=1.0)
    p.add_argument("--keep", default=None, help="folder for the capture (default: a temporary one, removed)")
    p.add_argument("--out", default=None, help="append the result as one JSON line to this file")
    args = p.parse_args(argv)
    W, H = (int(v) for v in args.size.lower().split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or os.path.join(tmp, "capture")
        t = time.perf_counter()
        nbytes = write_capture(root, args.views, (W, H))
        gen_s = time.perf_counter() - t
        cmd = ["/usr/bin/time", "-v", sys.executable, os.path.join(EXAMPLES, "nerf", "train.py"), "--data", root,
               "--downscale", "1", "--minutes", str(args.minutes), "--eval-every", "1e9", "--final-views", "0",
               "--no-progress", "--out", os.path.join(tmp, "run")]
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    steps = re.search(r"after (\d+) steps", r.stdout)
    budget = 1.5e9 + 1.5 * nbytes
    res = dict(cpu=cpu_model(), views=args.views, size=[W, H], images_bytes=nbytes, peak_rss_bytes=peak_kb * 1024,
               limit_bytes=int(budget), within=peak_kb * 1024 <= budget, minutes=args.minutes,
               steps=int(steps.group(1)) if steps else None, wall_s=round(wall, 1), generate_s=round(gen_s, 1),
               exit=r.returncode, load=list(os.getloadavg()))
    print(json.dumps(res))
    if r.returncode:
        print(r.stdout[-3000:], r.stderr[-3000:], file=sys.stderr)
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(res) + "\n")
    return res


if __name__ == "__main__":
    main()
