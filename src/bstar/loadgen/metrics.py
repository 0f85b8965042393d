"""Per-level statistics with vLLM's benchmark definitions. Pure: records in, numbers out.

- TTFT: send -> first streamed token.
- TPOT (per request): (E2E - TTFT) / (output_tokens - 1), over requests with >= 2 tokens.
- ITL: every gap between consecutive streamed chunks, pooled over requests.
- E2E: send -> end of stream.
- output throughput: output tokens of successful requests / wall time of the level's
  measured phase; total throughput adds their prompt tokens.
- goodput: successful requests meeting every SLO (per-request TTFT, TPOT, E2E) per second.
Percentiles interpolate linearly between order statistics (numpy's default, as vLLM;
`bstar.stats`); whether a request meets the SLO is `Slo.met`, as in the simulator.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bstar.loadgen.client import RequestRecord
from bstar.slo import Slo
from bstar.stats import percentiles_ms


def _or_nan(v: float | None) -> float:
    return math.nan if v is None else v


def slo_met(records: Sequence[RequestRecord], slo: Slo) -> int:
    """How many successful `records` meet every objective of `slo` (`Slo.met`): a time not
    measured fails its objective; a one-token answer has no TPOT, and the other objectives
    still apply."""
    ok = [r for r in records if r.ok]
    tpot = [0.0 if r.tpot_s is None and r.output_tokens < 2 else _or_nan(r.tpot_s) for r in ok]
    return int(slo.met([_or_nan(r.ttft_s) for r in ok], tpot,
                       [_or_nan(r.e2e_s) for r in ok]).sum())


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
    request_rate_req_s: float
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
            "request_rate_req_s": self.request_rate_req_s,
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
    objectives = Slo.coerce(slo)
    recs = [r for r in records if not r.warmup]
    ok = [r for r in recs if r.ok]
    kinds = Counter(r.error_kind or "unknown" for r in recs if not r.ok)
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens or r.expected_prompt_tokens or 0 for r in ok)
    sources = {r.token_source for r in ok}
    source = sources.pop() if len(sources) == 1 else ("mixed" if sources else "none")
    dur = duration_s if duration_s > 0 else math.nan
    goodput = None
    if not objectives.empty:
        goodput = slo_met(ok, objectives) / dur
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
        request_rate_req_s=len(ok) / dur,
        goodput_req_s=goodput,
        ttft_ms=percentiles_ms(r.ttft_s for r in ok if r.ttft_s is not None),
        tpot_ms=percentiles_ms(tpots),
        itl_ms=percentiles_ms(x for r in ok for x in r.itl_s),
        e2e_ms=percentiles_ms(r.e2e_s for r in ok if r.e2e_s is not None),
        token_source=source,
        mean_output_tokens=(out_tokens / len(ok)) if ok else None,
        slo=objectives.by_metric(),
    )
