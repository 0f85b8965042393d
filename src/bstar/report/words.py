"""The page's words for what the results' JSON says with identifiers, and the notes every
report shares: a recommendation's bound, a knee rule, a regime, a fit's roof, a prediction's
basis and calibration. The JSON contract keeps its identifiers; none reaches the page."""

from __future__ import annotations

import re
from typing import Any

from bstar.report.views import AGREE_TOL
from bstar.units import fmt_ms, fmt_num

UNITS_NOTE = ("Bytes are exact integers; GB = 10^9 bytes and GiB = 2^30 bytes, and sizes are "
              "printed in both. GPU memory is what the device reports (an '80GB' A100 holds "
              "80 GiB); bandwidth and FLOP/s are decimal, dense datasheet figures.")
TPOT_NOTE = ("TPOT is per request: the time one user waits between two tokens, which equals "
             "the decode step time. Amortized time per token = step time / batch = "
             "1 / throughput; seed 000's 'TPOT' curve is the amortized one, vLLM's "
             "mean_tpot_ms is per request.")
CONTEXT_NOTE = ("Context = the KV tokens each running sequence holds (prompt plus tokens "
                "generated so far), the seeds' seq_len. All running sequences are assumed to "
                "hold the same context.")
REGIME_NOTE = ("Regimes: 1 weight-dominated (B < B*: the weights are most of the bytes read "
               "per step), 2 KV-dominated (B* ≤ B ≤ B_mem), 3 memory-exhausted (B > B_mem: "
               "the engine preempts and time-slices), and compute-bound wherever the FLOP "
               "term of the step exceeds the byte term.")

SIGNATURE_INTRO = (
    "The same curve four ways. Dashed: the cost model's prediction for this deployment, with "
    "its regimes shaded and B*, B_mem and its knee marked; the legend says whether it is "
    "calibrated and what its throughput counts, and where a calibration exists the "
    "uncalibrated prediction is the dotted grey line. Solid: the fit of the measured "
    "levels (dotted where it extrapolates, diamonds its predictions). Dots: the measured "
    "levels (median, whisker to p99). Squares: the simulator replaying the same levels "
    "through a continuous-batching scheduler stepped by the cost model.")


# What a recommendation's `bound`, a knee rule or a regime means, in the page's words (the
# identifiers are the JSON contract's; they never reach the page themselves).
BOUND_WORDS = {
    "knee": "bound: the knee", "b_mem": "bound: memory (B_mem)",
    "b_star": "bound: B* (KV read = weight read)", "compute": "bound: the compute crossover",
    "sla": "bound: the TPOT SLA", "sla-unmet": "the TPOT SLA is not met",
    "sweep_end": "bound: the last level swept", "max-level": "bound: the largest level",
    "none": "no knee found", "load": "bound: the offered load",
    "single-level": "one level only",
    "step": "rule: 5% per step (seed 000)", "doubling": "rule: 15% per doubling (seed 004)",
    "bca": "rule: BCA (Recasens et al. 2025)",
    "memory-bound": "memory-bound", "compute-bound": "compute-bound",
    "unknown": "regime past the data not known",
}
FIT_BOUND_WORDS = {"tpot_lower_bound": "the compute roof past the data is not known: the TPOT "
                                      "is a lower bound and the throughput an upper bound"}


def words(key: str | None) -> str:
    return "" if not key else BOUND_WORDS.get(key, key.replace("_", " "))


def collapse(messages: list[str]) -> list[str]:
    """Messages that differ only in their numbers, as one line with a count (the first
    one's numbers as the example)."""
    groups: dict[str, list[str]] = {}
    for m in messages:
        groups.setdefault(re.sub(r"[-+]?\d[\d,.]*(e[-+]?\d+)?", "#", m), []).append(m)
    return [ms[0] if len(ms) == 1 else f"{len(ms)} alike, e.g. {ms[0]}"
            for ms in groups.values()]


def fit_basis(f: dict[str, Any]) -> str:
    """What a fit's throughput counts, in the page's words."""
    return ("output tok/s incl. prefill"
            if str(f.get("throughput_kind") or "").startswith("output")
            else "decode only, B / TPOT")


ROOF_WORDS = {"data": "fitted from the data", "critical-batch": "from the critical batch given",
              "cost-model": "the cost model's compute term", "unknown": "not known"}
REGIME_CELL = {"unknown": "not known"}


def prediction_columns(series: dict[str, Any], first: bool) -> list[str]:
    """A predicted series' columns in the per-level table, named as the series is."""
    cal = "calibrated" if series["calibrated"] else "uncalibrated"
    basis = "incl. prefill" if series["throughput_basis"] == "incl_prefill" else "B / TPOT"
    cols = [f"{cal} pred. tok/s ({basis})", "vs measured"]
    return ([f"{cal} pred. TPOT", *cols] if first else cols)


def prediction_cells(q: dict[str, Any], first: bool) -> list[str]:
    # Only a calibrated prediction claims to agree; the uncalibrated one is labelled so.
    err = f"{q['error']:+.0%}" + ("" if q["agrees"] or not q["calibrated"] else " (misses)")
    cells = [fmt_num(q["throughput_tok_s"], 1), err]
    return [fmt_ms(q["tpot_ms"]), *cells] if first else cells


def calibration_note(cal: dict[str, Any]) -> str:
    """What the calibrated prediction rests on, from the calibration itself."""
    return (f"Calibrated: the cost model's efficiencies were fitted to this run's "
            f"{cal['levels']} levels ({cal['metric_words']}): median |error| "
            f"{cal['median_abs_error']:.1%}, against {cal['uncalibrated_median_abs_error']:.1%} "
            f"before (roof shape k = {cal['roof_sharpness']:g}). The uncalibrated prediction "
            "is drawn beside it, labelled. A calibrated throughput that misses its level by "
            f"more than {AGREE_TOL:.0%} says so at that level.")
