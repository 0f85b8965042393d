"""`bstar fit` time against the number of points (issue 19, item 11).

    python bench/fit_scale.py [--sizes 2000,20000,200000] [--runs 3]

Writes a points file per size (batches 1..n, step = max(10 + b*B, c*B) ms with the roof at
0.6 n and 2% noise, seeded) and times `bstar fit FILE --json` as a whole process on this
interpreter with this checkout's `src` first on the path, `--runs` times each; prints the
median. The fit was O(n^2) (one least-squares solve per split point): 2k points 10.9 s,
20k more than 60 s. Now the solves are a bounded number and see at most 1,024 bins of the
points (bstar.fit.model.summarize), so the time is reading, sorting and scoring n points.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def write_points(path: Path, n: int, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    b = np.arange(1, n + 1, dtype=np.float64)
    slope = 0.02 * 2000 / n
    c = 10 / (0.6 * n) + slope
    step = np.maximum(10 + slope * b, c * b) * (1 + 0.02 * rng.standard_normal(n))
    with open(path, "w", encoding="utf-8") as f:
        f.write("batch,tpot_ms\n")
        f.writelines(f"{int(x)},{y:.6g}\n" for x, y in zip(b, step, strict=True))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2000,20000,200000")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            path = Path(tmp) / f"points-{n}.csv"
            write_points(path, n)
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "bstar", "fit", str(path), "--json"],
                               env=env, check=True, stdout=subprocess.DEVNULL)
                times.append(time.perf_counter() - t0)
            print(f"{n:>8,} points: median {statistics.median(times):6.2f} s "
                  f"(runs: {', '.join(f'{t:.2f}' for t in times)})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
