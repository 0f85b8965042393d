"""Score bstar's disaggregated plan against measured disaggregated runs.

    python bench/disagg_validate.py [data/inferencex-h200/disagg_runs.csv] [--simulate] [--json]

Per run: the plan at the run's concurrency and mean lengths (bstar.disagg_runs): predicted
TPOT (decode side) and TTFT against the measured means, and the median |error| over the
scored runs, all of them and apart for the runs without EP or attention DP (priced as tensor
parallel until bstar.step carries those terms). An MTP run is priced with a speculative
decode side at the acceptance the OTHER MTP runs of its engine and draft count imply (leave
one out; the acceptance it implies itself is printed beside it), in the plan and the
simulation alike. With --simulate, also the two-pool simulation of each run's own closed
loop (bstar.sim.disagg; about a minute on a laptop core).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bstar.disagg_runs import load_disagg_runs, score_disagg_runs, summary  # noqa: E402

DEFAULT = ROOT / "data" / "inferencex-h200" / "disagg_runs.csv"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.0%}"


def main(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return 0
    unknown = [a for a in argv if a.startswith("-") and a not in ("--json", "--simulate")]
    paths = [a for a in argv if not a.startswith("-")]
    if unknown or len(paths) > 1:
        print(f"disagg_validate: unexpected {' '.join(unknown or paths[1:])}\n{__doc__}",
              file=sys.stderr)
        return 2
    as_json = "--json" in argv
    sim = "--simulate" in argv
    scores = score_disagg_runs(load_disagg_runs(paths[0] if paths else DEFAULT), simulate=sim)
    s = summary(scores)
    if as_json:
        print(json.dumps({"runs": [x.to_dict() for x in scores], "summary": s}, indent=2))
        return 0
    print(f"{'run':48s} {'P/D dp':>7s} {'TPOT ms':>15s} {'err':>5s} {'TTFT ms':>17s} "
          f"{'err':>6s}  bound")
    for x in scores:
        r = x.run
        dp = f"{r.sides['prefill']['dp']}/{r.sides['decode']['dp']}"
        if x.skipped:
            print(f"{r.run:48s} {dp:>7s}  skipped: {x.skipped}")
            continue
        print(f"{r.run:48s} {dp:>7s} {x.predicted_tpot_ms:6.2f} / {r.tpot_mean_ms:6.2f} "
              f"{_pct(x.tpot_error):>5s} {x.predicted_ttft_ms:7.0f} / {r.ttft_mean_ms:7.0f} "
              f"{_pct(x.ttft_error):>6s}  {x.bound}"
              + (f"  acceptance {x.acceptance_used:.3f} (implies "
                 f"{'-' if x.acceptance_implied is None else f'{x.acceptance_implied:.3f}'})"
                 f", speedup {x.predicted_speedup:.2f}x predicted"
                 + (f", {x.measured_speedup:.2f}x measured against {x.twin}"
                    if x.twin else ", no run without MTP to measure it against")
                 if x.acceptance_used is not None and x.predicted_speedup else "")
              + (f"  simulated TPOT {x.simulated_tpot_ms:6.2f} {_pct(x.simulated_tpot_error)}"
                 f" TTFT {x.simulated_ttft_ms:6.0f} {_pct(x.simulated_ttft_error)}"
                 if x.simulated_tpot_ms is not None else ""))
    print(f"{s['scored']} of {s['runs']} runs scored ({s['skipped']} skipped); median "
          "|predicted / measured - 1| (targets: TPOT 15%, TTFT 30%):")
    for k in ("all", "tp_only", "with_ep_or_dp", "without_mtp", "mtp"):
        g = s[k]
        tp, tt = g["tpot_median_abs_error"], g["ttft_median_abs_error"]
        tm = g["ttft_vs_measured_median_abs_error"]
        print(f"  {k:14s} {g['runs']:3d} runs  plan: TPOT {'-' if tp is None else f'{tp:.1%}'}"
              f"  TTFT {'-' if tt is None else f'{tt:.1%}'} (vs the measured median "
              f"{'-' if tm is None else f'{tm:.1%}'})", end="")
        st, stt = g["simulated_tpot_median_abs_error"], g["simulated_ttft_median_abs_error"]
        sm = g["simulated_ttft_median_vs_measured_median_abs_error"]
        print(f"   simulated: TPOT {st:.1%}  TTFT {stt:.1%} (median vs median {sm:.1%})"
              if st is not None else "")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
