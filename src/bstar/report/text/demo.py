"""`bstar demo`: the sweep it ran, what was measured and fitted, and where the report is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bstar.units import sparkline


def print_demo(sweep: dict[str, Any], fit: Any, report: Path, calibrated_error: float,
               uncalibrated_error: float, profile: Path) -> None:
    lv = [x for x in sweep["levels"] if x.get("throughput_tok_s")]
    xs = ",".join(str(x.get("concurrency")) for x in lv)
    print(f"run {sweep['run_id']} in {sweep['db']}")
    print(f"throughput over concurrency {xs}: "
          f"{sparkline([float(x['throughput_tok_s']) for x in lv])} "
          + " ".join(f"{x['throughput_tok_s']:,.0f}" for x in lv) + " tok/s")
    rec = sweep.get("recommendation") or {}
    if rec:
        print(f"measured: max_num_seqs = {rec['max_num_seqs']} ({rec.get('reason', '')})")
    for p in fit.predictions:
        print(f"fit predicts batch {p.batch}: {p.throughput_tok_s:,.0f} tok/s output "
              f"(prefill included, as measured), TPOT {p.tpot_ms:.1f} ms ({p.regime})")
    print(f"report: {report.resolve()}")
    print(f"cost model calibrated on these levels (median ITL): median |error| "
          f"{calibrated_error:.1%}, uncalibrated {uncalibrated_error:.1%}; profile {profile}")
