"""InferenceX's aggregated H200 runs scored by kind (one command: python bench/inferencex_subsets.py
[RUNS.csv] [--from-json FILE]; issue 38).

`bstar validate data/inferencex-h200/runs.csv` prints one figure per engine. Issue 38 asks
about kinds that cut across the engines: the runs without MTP, those with expert parallel or
attention data parallel, the MTP runs (at the acceptance the other MTP runs of the same
engine imply), and all of them. This prints, per kind, the median |predicted / measured - 1|
of the mean TPOT, the mean TTFT and the median TTFT, profile way, from the same validation
(`bstar.validate_runs.score_runs`, as `bstar validate` runs it; about 3 minutes), or from the
JSON a `bstar validate RUNS.csv --json` already wrote (`--from-json`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

RUNS = ROOT / "data" / "inferencex-h200" / "runs.csv"
QUANTITIES = (("tpot_mean_ms", "TPOT"), ("ttft_mean_ms", "TTFT (mean)"),
              ("ttft_median_ms", "TTFT (median)"))
Kind = tuple[str, Callable[[str], bool]]

# Each kind read from the run's name, which bench/to_inferencex.py writes as
# h200-MODEL-ENGINE-tpN-epN[-dpa][-mtp]-ISLkOSLk-cCONC.
KINDS: tuple[Kind, ...] = (
    ("without MTP", lambda run: "-mtp-" not in run),
    ("with EP 8 or attention DP", lambda run: "-ep8" in run or "-dpa" in run),
    ("MTP (acceptance: the other MTP runs')", lambda run: "-mtp-" in run),
    ("SGLang", lambda run: "-sglang-" in run),
    ("TensorRT-LLM", lambda run: "-trt-llm-" in run),
    ("all", lambda run: True),
)


def table(validation: dict[str, Any]) -> str:
    """The markdown table of the kinds' median errors."""
    stages = [s for g in validation["groups"] for s in g["stages"]
              if s.get("latency_scored", True)]
    lines = ["| runs | n | " + " | ".join(q for _, q in QUANTITIES) + " |",
             "|---|---|" + "---|" * len(QUANTITIES)]
    for name, pick in KINDS:
        mine = [s for s in stages if pick(s["stage"])]
        cells = []
        for key, _ in QUANTITIES:
            errs = [abs(s["predicted"]["profile"]["errors"][key]) for s in mine
                    if key in s["predicted"]["profile"]["errors"]]
            cells.append(f"{statistics.median(errs):.1%}" if errs else "-")
        lines.append(f"| {name} | {len(mine)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description="InferenceX's runs scored by kind (module "
                                "docstring).")
    p.add_argument("runs", nargs="?", default=str(RUNS))
    p.add_argument("--from-json", default=None,
                   help="a `bstar validate RUNS.csv --json` output to read instead")
    args = p.parse_args(argv)
    if args.from_json:
        validation = json.loads(Path(args.from_json).read_text())
    else:
        from bstar.runs_table import load_runs
        from bstar.validate_runs import score_runs

        validation = score_runs(load_runs(args.runs), lomo=False, logo=False).to_dict()
    print(table(validation))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
