"""Turn a simulated sweep over max_num_seqs into a recommendation with its reason: the knee
rules (`bstar.knee`: seed 000's 5%-per-step and seed 004's 15%-per-doubling on throughput)
and the latency SLA (largest level whose p99 TPOT / p99 E2E meets the SLO), decided by
`bstar.recommend.Recommendation.from_curve`."""

from __future__ import annotations

from dataclasses import replace

from bstar import knee
from bstar.recommend import Recommendation, SloBound
from bstar.sim.metrics import SimSummary
from bstar.slo import Slo

FLAT = 1.02  # levels within 2% of the best throughput are on its plateau
KV_SLACK = 0.9  # below this peak KV use the pool did not shape the schedule
QUEUE_SLACK = 1.0  # fewer than one request waiting on average: arrivals are served, not queued


def advise(levels: list[SimSummary], slo: Slo | None = None) -> Recommendation:
    """The recommendation over simulated levels (`Recommendation.from_curve`, source
    "simulated"), with the facts only a simulation has: which levels the offered load, not
    the server, bounded, and the preemptions at the chosen level."""
    slo = slo or Slo()
    rows = sorted(levels, key=lambda s: s.max_num_seqs)
    batch = [s.max_num_seqs for s in rows]
    by_batch = {s.max_num_seqs: s for s in rows}
    if len(rows) < 2:
        s = rows[0]
        return Recommendation(s.max_num_seqs, "one level simulated: give several "
                              "--max-num-seqs to find a knee", "single-level", {})
    thr = [max(s.throughput_tok_s, 1e-12) for s in rows]
    knees = knee.all_knees(batch, thr)
    sla: list[SloBound] = []
    for key, what, limit in (("tpot_ms", "p99 TPOT", slo.tpot_ms),
                             ("e2e_ms", "p99 E2E", slo.e2e_ms)):
        if limit is None:
            continue
        lat = [getattr(s, key)["p99"] for s in rows]
        if any(v is None for v in lat):
            continue
        knees[f"sla_{key}"] = k = knee.slo_knee(batch, lat, limit, what)
        sla.append(SloBound(k, f"{what} <= {limit:g} ms"))
    rec = Recommendation.from_curve("simulated", batch, knees, sla, _load_bound(rows, thr))
    if rec.bound == "sla-unmet":
        return rec
    chosen = by_batch.get(rec.max_num_seqs)
    if chosen is None:
        return replace(rec, reason=rec.reason + f"; {rec.max_num_seqs} lies between the "
                       "simulated levels: simulate it to confirm")
    if chosen.preemptions:
        return replace(rec, reason=rec.reason + f"; note: {chosen.preemptions} preemptions at "
                       "this level (KV pool exhausted), tails include recomputation")
    return rec


def _load_bound(rows: list[SimSummary], thr: list[float]) -> tuple[int, str] | None:
    """Levels on the throughput plateau where neither the cap nor the KV pool ever bound
    and almost nobody waited: there the offered load, not the server, sets throughput, and
    knee rules on a flat curve would only pick noise. The smallest such level serves the
    load (None: no such level)."""
    top = max(thr)
    slack = [s for s in rows if s.throughput_tok_s * FLAT >= top
             and s.running_max < s.max_num_seqs and s.preemptions == 0
             and s.kv_utilization_max < KV_SLACK and s.queue_mean < QUEUE_SLACK]
    if not slack:
        return None
    r = slack[0]
    return r.max_num_seqs, (
        f"the load, not the server, sets throughput: {r.max_num_seqs} serves "
        f"{r.throughput_tok_s:,.0f} tok/s (best level {top:,.0f}) with the cap never reached "
        f"(at most {r.running_max} running) and KV at most "
        f"{r.kv_utilization_max * 100:.0f}% used, {r.queue_mean:.2f} waiting on average; "
        "smaller caps make requests wait for a slot")
