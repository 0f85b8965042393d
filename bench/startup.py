"""Start-up of the `bstar` command against the interpreter's own (issue 12, item 12).

    python bench/startup.py [--runs 15]

Runs `python -c pass`, `python -c 'import numpy'`, `bstar --help` and `bstar plan` interleaved
(so all see the same machine load; these machines are shared and noisy), as whole processes
on this interpreter with this checkout's `src` first on the path, and prints each median and
the ratios: `bstar --help` under 3x `python -c pass`, `bstar plan` under 8x, and `bstar plan`
under 2x `import numpy` (issue 21: the cost model needs numpy, the plan's text path should
add little to it). Exit status 0 when the ratios are within their budgets. `--importtime`
also prints the modules `bstar plan` spends most on (`python -X importtime`).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELP_BUDGET = 3.0
PLAN_BUDGET = 8.0
PLAN_NUMPY_BUDGET = 2.0  # bstar plan / python -c 'import numpy'
PLAN_ARGS = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm"]


def bstar_cmd() -> list[str]:
    """`bstar` as a process on this interpreter: the checkout's CLI module."""
    return [sys.executable, "-m", "bstar.cli"]


PYCACHE = Path(tempfile.gettempdir()) / "bstar-startup-pycache"


def env(bytecode: bool = True) -> dict[str, str]:
    """The children's environment. With `bytecode` (the default) Python may cache compiled
    modules, as `pip install` leaves them, in a private folder (PYTHONPYCACHEPREFIX) even
    where PYTHONDONTWRITEBYTECODE is set; without it every run compiles bstar's sources."""
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    out = {**os.environ, "PYTHONPATH": path}
    if bytecode:
        out.pop("PYTHONDONTWRITEBYTECODE", None)
        out["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return out


def wall_s(cmd: list[str], bytecode: bool = True) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one run of `cmd`. On a loaded machine the
    wall time also counts waiting for a core; the CPU time does not."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env(bytecode))
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def measure(runs: int, bytecode: bool = True) -> dict[str, tuple[float, float]]:
    """Median wall time of each command over `runs` interleaved rounds (after one warm-up
    round that fills the OS file cache and Python's bytecode cache)."""
    cmds = {"python -c pass": [sys.executable, "-c", "pass"],
            "import numpy": [sys.executable, "-c", "import numpy"],
            "bstar --help": [*bstar_cmd(), "--help"],
            "bstar plan": [*bstar_cmd(), *PLAN_ARGS]}
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in cmds}
    for c in cmds.values():
        wall_s(c, bytecode)
    for _ in range(runs):
        for k, c in cmds.items():
            times[k].append(wall_s(c, bytecode))
    return {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
            for k, v in times.items()}


def import_times(top: int = 12) -> list[tuple[int, int, str]]:
    """(self us, cumulative us, module) of the `top` largest cumulative imports, two levels
    deep, of one `bstar plan` run (`python -X importtime`, bytecode cached as `measure`)."""
    wall_s([*bstar_cmd(), *PLAN_ARGS])  # fill the bytecode cache first
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "bstar.cli", *PLAN_ARGS],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True, env=env())
    rows = []
    for line in r.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        # Two levels deep: what bstar and the command import, not numpy's insides.
        if len(parts) == 3 and parts[0].strip().isdigit() and not parts[2].startswith(" " * 6):
            rows.append((int(parts[0]), int(parts[1]), parts[2].rstrip()))
    return sorted(rows, key=lambda x: -x[1])[:top]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15, help="interleaved rounds (default 15)")
    ap.add_argument("--no-bytecode", action="store_true",
                    help="compile every module on every run (PYTHONDONTWRITEBYTECODE)")
    ap.add_argument("--importtime", action="store_true",
                    help="also print the largest imports of one `bstar plan`")
    args = ap.parse_args(argv)
    if args.importtime:
        print(f"largest imports of `bstar {' '.join(PLAN_ARGS)}` (self / cumulative ms):")
        for self_us, cum_us, name in import_times():
            print(f"  {self_us / 1e3:7.1f} {cum_us / 1e3:7.1f}  {name}")
    med = measure(args.runs, bytecode=not args.no_bytecode)
    ok = True
    for i, what in ((0, "wall"), (1, "CPU")):
        base = med["python -c pass"][i]
        help_ratio = med["bstar --help"][i] / base
        plan_ratio = med["bstar plan"][i] / base
        print(f"{what} time, medians of {args.runs} interleaved runs: python -c pass "
              f"{base * 1e3:.1f} ms, bstar --help {med['bstar --help'][i] * 1e3:.1f} ms, "
              f"bstar plan {med['bstar plan'][i] * 1e3:.1f} ms")
        numpy_ratio = med["bstar plan"][i] / med["import numpy"][i]
        print(f"  bstar --help / python -c pass = {help_ratio:.2f} (budget {HELP_BUDGET:g}); "
              f"bstar plan / python -c pass = {plan_ratio:.2f} (budget {PLAN_BUDGET:g})")
        print(f"  import numpy {med['import numpy'][i] * 1e3:.1f} ms; bstar plan / import "
              f"numpy = {numpy_ratio:.2f} (budget {PLAN_NUMPY_BUDGET:g})")
        if what == "wall":  # the budgets are on wall time, as a user waits for it
            ok = (help_ratio < HELP_BUDGET and plan_ratio < PLAN_BUDGET
                  and numpy_ratio <= PLAN_NUMPY_BUDGET)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
