"""Start-up of the `bstar` command against the interpreter's own (issue 12, item 12).

    python bench/startup.py [--runs 15]

Runs `python -c pass`, `bstar --help` and `bstar plan` interleaved (so all three see the same
machine load; these machines are shared and noisy), as whole processes on this interpreter
with this checkout's `src` first on the path, and prints each median and the two ratios:
`bstar --help` under 3x `python -c pass`, `bstar plan` under 8x. Exit status 0 when both
ratios are within their budgets. `python -X importtime -m bstar.cli plan` shows what costs.
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
            "bstar --help": [*bstar_cmd(), "--help"],
            "bstar plan": [*bstar_cmd(), "plan"]}
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in cmds}
    for c in cmds.values():
        wall_s(c, bytecode)
    for _ in range(runs):
        for k, c in cmds.items():
            times[k].append(wall_s(c, bytecode))
    return {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
            for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15, help="interleaved rounds (default 15)")
    ap.add_argument("--no-bytecode", action="store_true",
                    help="compile every module on every run (PYTHONDONTWRITEBYTECODE)")
    args = ap.parse_args(argv)
    med = measure(args.runs, bytecode=not args.no_bytecode)
    ok = True
    for i, what in ((0, "wall"), (1, "CPU")):
        base = med["python -c pass"][i]
        help_ratio = med["bstar --help"][i] / base
        plan_ratio = med["bstar plan"][i] / base
        print(f"{what} time, medians of {args.runs} interleaved runs: python -c pass "
              f"{base * 1e3:.1f} ms, bstar --help {med['bstar --help'][i] * 1e3:.1f} ms, "
              f"bstar plan {med['bstar plan'][i] * 1e3:.1f} ms")
        print(f"  bstar --help / python -c pass = {help_ratio:.2f} (budget {HELP_BUDGET:g}); "
              f"bstar plan / python -c pass = {plan_ratio:.2f} (budget {PLAN_BUDGET:g})")
        if what == "wall":  # the budgets are on wall time, as a user waits for it
            ok = help_ratio < HELP_BUDGET and plan_ratio < PLAN_BUDGET
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
