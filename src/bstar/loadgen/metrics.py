"""Per-level statistics with vLLM's benchmark definitions. Pure: records in, numbers out.

- TTFT: send -> first streamed token.
- TPOT (per request): (E2E - TTFT) / (output_tokens - 1), over requests with >= 2 tokens.
- ITL: every gap between consecutive streamed chunks, pooled over requests.
- E2E: send -> end of stream.
- output throughput: output tokens of successful requests / wall time of the level's
  measured phase; total throughput adds their prompt tokens.
- goodput: successful requests meeting every SLO (per-request TTFT, TPOT, E2E) per second.
Percentiles interpolate linearly between order statistics (numpy's default, as vLLM).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bstar.loadgen.client import RequestRecord
from bstar.slo import Slo


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy 'linear'); q in [0, 100]."""
    n = len(sorted_values)
    if n == 0:
        return math.nan
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def dist_ms(values_s: Iterable[float]) -> dict[str, float | None]:
    """p50/p90/p99/mean of seconds, reported in milliseconds (None when empty)."""
    v = sorted(x * 1e3 for x in values_s)
    if not v:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    return {
        "p50": percentile(v, 50),
        "p90": percentile(v, 90),
        "p99": percentile(v, 99),
        "mean": sum(v) / len(v),
    }


def meets_slo(r: RequestRecord, slo: Mapping[str, float]) -> bool:
    if not r.ok:
        return False
    checks = {"ttft": r.ttft_s, "tpot": r.tpot_s, "e2e": r.e2e_s}
    for key, limit_ms in slo.items():
        v = checks[key]
        if key == "tpot" and v is None and r.output_tokens < 2:
            continue  # a one-token answer has no TPOT; the other SLOs still apply
        if v is None or v * 1e3 > limit_ms:
            return False
    return True


@dataclass(frozen=True)
class LevelStats:
    requests: int  # measured (warm-up excluded), successful or not
    completed: int
    errors: int
    error_kinds: dict[str, int]
    duration_s: float
    input_tokens: int
    output_tokens: int
    throughput_tok_s: float  # output tokens / s
    total_tok_s: float  # (input + output) tokens / s
    request_rate_s: float
    goodput_req_s: float | None  # None when no SLO was given
    ttft_ms: dict[str, float | None]
    tpot_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    e2e_ms: dict[str, float | None]
    token_source: str  # "usage", "counted" or "mixed"
    mean_output_tokens: float | None = None
    slo: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "completed": self.completed,
            "errors": self.errors,
            "error_kinds": dict(self.error_kinds),
            "duration_s": self.duration_s,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "throughput_tok_s": self.throughput_tok_s,
            "total_tok_s": self.total_tok_s,
            "request_rate_s": self.request_rate_s,
            "goodput_req_s": self.goodput_req_s,
            "ttft_ms": self.ttft_ms,
            "tpot_ms": self.tpot_ms,
            "itl_ms": self.itl_ms,
            "e2e_ms": self.e2e_ms,
            "token_source": self.token_source,
            "mean_output_tokens": self.mean_output_tokens,
            "slo": dict(self.slo),
        }


def summarize(records: Iterable[RequestRecord], duration_s: float,
              slo: Slo | Mapping[str, float] | None = None) -> LevelStats:
    """Statistics of one level's measured phase lasting `duration_s` seconds; goodput
    counts the requests meeting every objective of `slo` (an Slo, or {"ttft": ms, ...})."""
    slo = Slo.coerce(slo).by_metric()
    recs = [r for r in records if not r.warmup]
    ok = [r for r in recs if r.ok]
    kinds = Counter(r.error_kind or "unknown" for r in recs if not r.ok)
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens or r.expected_prompt_tokens or 0 for r in ok)
    sources = {r.token_source for r in ok}
    source = sources.pop() if len(sources) == 1 else ("mixed" if sources else "none")
    dur = duration_s if duration_s > 0 else math.nan
    goodput = None
    if slo:
        goodput = sum(1 for r in ok if meets_slo(r, slo)) / dur
    tpots = [t for r in ok if (t := r.tpot_s) is not None]
    return LevelStats(
        requests=len(recs),
        completed=len(ok),
        errors=len(recs) - len(ok),
        error_kinds=dict(kinds),
        duration_s=duration_s,
        input_tokens=in_tokens,
        output_tokens=out_tokens,
        throughput_tok_s=out_tokens / dur,
        total_tok_s=(in_tokens + out_tokens) / dur,
        request_rate_s=len(ok) / dur,
        goodput_req_s=goodput,
        ttft_ms=dist_ms(r.ttft_s for r in ok if r.ttft_s is not None),
        tpot_ms=dist_ms(tpots),
        itl_ms=dist_ms(x for r in ok for x in r.itl_s),
        e2e_ms=dist_ms(r.e2e_s for r in ok if r.e2e_s is not None),
        token_source=source,
        mean_output_tokens=(out_tokens / len(ok)) if ok else None,
        slo=dict(slo or {}),
    )
