"""Turn a simulated sweep over max_num_seqs into a recommendation with its reason, using the
shared knee rules (`bstar.knee`): seed 000's 5%-per-step and seed 004's 15%-per-doubling on
throughput, then the latency SLA (largest level whose p99 TPOT / p99 E2E meets the SLO)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bstar import knee
from bstar.sim.metrics import SimSummary, Slo

FLAT = 1.02  # levels within 2% of the best throughput are on its plateau
KV_SLACK = 0.9  # below this peak KV use the pool did not shape the schedule
QUEUE_SLACK = 1.0  # fewer than one request waiting on average: arrivals are served, not queued


@dataclass(frozen=True, slots=True)
class SweepAdvice:
    max_num_seqs: int
    reason: str
    bound: str  # "knee", "load", "max-level", "sla", "sla-unmet", "single-level"
    knees: dict[str, knee.Knee]

    def to_dict(self) -> dict[str, Any]:
        return {"max_num_seqs": self.max_num_seqs, "reason": self.reason,
                "bound": self.bound, "knees": {k: v.to_dict() for k, v in self.knees.items()}}


def advise(levels: list[SimSummary], slo: Slo | None = None) -> SweepAdvice:
    slo = slo or Slo()
    rows = sorted(levels, key=lambda s: s.max_num_seqs)
    batch = [s.max_num_seqs for s in rows]
    by_batch = {s.max_num_seqs: s for s in rows}
    knees: dict[str, knee.Knee] = {}
    if len(rows) < 2:
        s = rows[0]
        return SweepAdvice(s.max_num_seqs, "one level simulated: give several --max-num-seqs "
                           "to find a knee", "single-level", knees)
    thr = [max(s.throughput_tok_s, 1e-12) for s in rows]
    knees["step"] = knee.step_knee(batch, thr)
    knees["doubling"] = knee.doubling_knee(batch, thr)
    fired = [k for k in (knees["step"], knees["doubling"]) if k.batch is not None]
    top = max(thr)
    # Levels on the throughput plateau where neither the cap nor the KV pool ever bound and
    # almost nobody waited: there the offered load, not the server, sets throughput, and knee
    # rules on a flat curve would only pick noise. The smallest such level serves the load.
    slack = [s for s in rows if s.throughput_tok_s * FLAT >= top
             and s.running_max < s.max_num_seqs and s.preemptions == 0
             and s.kv_utilization_max < KV_SLACK and s.queue_mean < QUEUE_SLACK]
    if slack:
        pick_row = slack[0]
        value, bound = pick_row.max_num_seqs, "load"
        reason = (f"the load, not the server, sets throughput: {value} serves "
                  f"{pick_row.throughput_tok_s:,.0f} tok/s (best level {top:,.0f}) with the cap "
                  f"never reached (at most {pick_row.running_max} running) and KV at most "
                  f"{pick_row.kv_utilization_max * 100:.0f}% used, {pick_row.queue_mean:.2f} "
                  "waiting on average; smaller caps make requests wait for a slot")
    elif fired:
        pick = min(fired, key=lambda k: k.batch or 0)
        assert pick.batch is not None
        value, bound = pick.batch, "knee"
        reason = f"throughput knee ({pick.rule} rule): {pick.reason}"
    else:
        value, bound = batch[-1], "max-level"
        reason = (f"throughput still rises at the largest level simulated ({batch[-1]}); "
                  "try larger --max-num-seqs")
    for key, what, limit in (("tpot_ms", "p99 TPOT", slo.tpot_ms),
                             ("e2e_ms", "p99 E2E", slo.e2e_ms)):
        if limit is None:
            continue
        lat = [getattr(s, key)["p99"] for s in rows]
        if any(v is None for v in lat):
            continue
        k = knee.sla_knee(batch, lat, limit, what)
        knees[f"sla_{key}"] = k
        if k.batch is None:
            return SweepAdvice(batch[0], f"no level meets {what} <= {limit:g} ms: {k.reason}",
                               "sla-unmet", knees)
        if k.batch < value:
            reason = f"latency SLA: {k.reason} (throughput alone would pick {value})"
            value, bound = k.batch, "sla"
    chosen = by_batch.get(value)
    if chosen is None:
        reason += f"; {value} lies between the simulated levels: simulate it to confirm"
    elif chosen.preemptions:
        reason += (f"; note: {chosen.preemptions} preemptions at this level (KV pool "
                   "exhausted), tails include recomputation")
    return SweepAdvice(value, reason, bound, knees)
