"""`bstar simulate --from-run`: the hit rate the sweep measured beside the simulated one."""

from __future__ import annotations

from typing import Any


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def print_measured_hit_rates(measured: Any, rows: list[Any]) -> None:
    """One line on the measured traffic, one per level: measured vs simulated hit rate."""
    from bstar.report.text._common import clean_text

    # The run's id comes from the store or a profile's [workload]: data, not terminal codes.
    print(f"traffic from {clean_text(measured.describe(), 1000)}")
    for r in rows:
        print(f"  prefix-cache hit rate at max_num_seqs {r.max_num_seqs}: measured "
              f"{_pct(measured.hit_rate)}, simulated {_pct(r.prefix_cache_hit_rate)}")
