"""The fit of a sweep's levels in the quantity the sweep measured: a closed loop's output
throughput with each request's prefill (`with_prefill`), applied to the sweeps that measured
it (`prefill_aware`); `fit_sweep` fits a stored sweep's levels that way."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from bstar.errors import BstarError
from bstar.fit.points import points_from_sweep
from bstar.fit.result import FitResult
from bstar.fit.run import fit_points


def with_prefill(result: FitResult, batch: Sequence[float], ttft_ms: Sequence[float],
                 output_len: int) -> FitResult:
    """`result` predicting the output throughput a closed loop of B streams measures, prefill
    included: each request waits TTFT (fitted as a line in B over the measured levels: the
    prompts of the other streams queue ahead of it) and then O - 1 steps of TPOT (the fit),
    so throughput = B x O / (TTFT + (O - 1) x TPOT). A sweep's measured throughput is this
    quantity, not B / TPOT: extrapolating B / TPOT against it compares unlike things."""
    b = np.asarray(batch, dtype=np.float64)
    y = np.asarray(ttft_ms, dtype=np.float64)
    if b.size < 2 or output_len < 1 or not np.all(np.isfinite(y)):
        raise BstarError("the prefill-aware throughput needs TTFT at two or more batches")
    slope, intercept = np.polyfit(b, y, 1)
    if slope < 0:  # noise: TTFT cannot fall as more prompts queue; hold it flat
        slope, intercept = 0.0, float(np.mean(y))
    out = replace(result, ttft_line=(float(intercept), float(slope)), output_len=output_len)
    preds = []
    for p in result.predictions:
        preds.append(replace(
            p, throughput_tok_s=float(out.throughput_at(p.batch, p.tpot_ms)),
            throughput_low_tok_s=float(out.throughput_at(p.batch, p.tpot_high_ms)),
            throughput_high_tok_s=float(out.throughput_at(p.batch, p.tpot_low_ms))))
    return replace(out, predictions=tuple(preds))



def prefill_aware(fit: FitResult, sweep: dict[str, Any]) -> FitResult:
    """The fit of a closed-loop (concurrency) sweep, predicting output throughput with each
    request's prefill (`with_prefill`): the quantity the sweep measured. Other sweeps
    (rates, max_num_seqs) keep B / TPOT."""
    out_len = int((sweep.get("options") or {}).get("output_len") or 0)
    rows = [(lv["concurrency"], (lv.get("ttft_ms") or {}).get("mean"))
            for lv in sweep.get("levels", [])
            if lv.get("concurrency") and not lv.get("max_num_seqs") and lv.get("requests")]
    rows = [(b, t) for b, t in rows if t]
    if out_len < 1 or len(rows) < 2:
        return fit
    return with_prefill(fit, [b for b, _ in rows], [t for _, t in rows], out_len)


def fit_sweep(sweep: dict[str, Any], predict: list[int] | None = None) -> FitResult | None:
    """`bstar fit` on a sweep's levels (through the fit's own sweep reader), prefill-aware,
    predicting 2x and 4x the largest level by default; None when the levels cannot be
    fitted (too few)."""
    try:
        points = points_from_sweep(sweep["levels"], "sweep.json")
        top = max(points.batch)
        return prefill_aware(fit_points(points, predict=predict or [2 * top, 4 * top]),
                             sweep)
    except BstarError:
        return None
