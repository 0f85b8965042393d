"""Numbers from a simulation, with vLLM's benchmark definitions (benchmarks/benchmark_serving):

- TTFT = first token - arrival; E2E = last token - arrival;
- TPOT per request = (E2E - TTFT) / (output_tokens - 1), requests of one token left out;
- ITL = every gap between consecutive tokens of a request, pooled over requests;
- output throughput = output tokens / duration (first arrival at t=0 to the last finish);
- goodput = requests meeting every SLO, per second of the duration;
- percentiles by numpy's default (linear) rule, as vLLM computes them (`bstar.stats`);
- an SLO met or not per request by `Slo.met`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from bstar.sim.engine import SimRun
from bstar.slo import SLO_KEYS, Slo, parse_slo
from bstar.stats import per_request_tpot, percentiles_ms, weighted_percentiles

__all__ = ["SLO_KEYS", "SimSummary", "Slo", "parse_slo", "summarize"]

TIMELINE_POINTS = 100


@dataclass(frozen=True, slots=True)
class SimSummary:
    max_num_seqs: int
    requests: int  # finished
    requests_total: int
    duration_s: float
    throughput_tok_s: float
    request_throughput_req_s: float
    goodput_req_s: float | None
    slo: Slo
    ttft_ms: dict[str, float | None]
    tpot_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    e2e_ms: dict[str, float | None]
    preemptions: int
    preempted_requests: int
    num_steps: int
    kv_blocks: int
    block_size: int
    kv_utilization_max: float
    kv_utilization_mean: float
    queue_max: int
    queue_mean: float  # time-weighted mean number of requests waiting
    running_max: int
    truncated: bool
    timeline: dict[str, list[float]] = field(default_factory=dict)
    stop_reason: str = "done"  # "done", "time limit" or "step limit" (bstar.sim.engine)
    # Prompt tokens the prefix cache served and looked up (vLLM's vllm:prefix_cache_hits and
    # _queries); None when no cache was modelled.
    prefix_cache_hit_tokens: int | None = None
    prefix_cache_query_tokens: int | None = None
    # Energy (bstar.energy, docs/energy.md), when summarize was asked for it and the GPU has
    # a power model: the time-mean power per GPU over the run and the joules all the GPUs
    # spent per output token finished.
    power_w_mean: float | None = None
    joules_per_output_token: float | None = None

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        q = self.prefix_cache_query_tokens
        return None if not q or self.prefix_cache_hit_tokens is None \
            else self.prefix_cache_hit_tokens / q

    def to_dict(self) -> dict[str, Any]:
        """The simulate contract's keys first, then extras."""
        return {
            "max_num_seqs": self.max_num_seqs, "requests": self.requests,
            "throughput_tok_s": self.throughput_tok_s,
            "ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "e2e_ms": self.e2e_ms,
            "preemptions": self.preemptions,
            "itl_ms": self.itl_ms, "requests_total": self.requests_total,
            "request_throughput_req_s": self.request_throughput_req_s,
            "goodput_req_s": self.goodput_req_s, "slo": self.slo.to_dict(),
            "duration_s": self.duration_s, "preempted_requests": self.preempted_requests,
            "num_steps": self.num_steps, "kv_blocks": self.kv_blocks,
            "block_size": self.block_size,
            "kv_utilization_max": self.kv_utilization_max,
            "kv_utilization_mean": self.kv_utilization_mean,
            "queue_max": self.queue_max, "queue_mean": self.queue_mean,
            "running_max": self.running_max,
            "truncated": self.truncated, "stop_reason": self.stop_reason,
            "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
            "prefix_cache_hit_tokens": self.prefix_cache_hit_tokens,
            "prefix_cache_query_tokens": self.prefix_cache_query_tokens,
            "power_w_mean": self.power_w_mean,
            "joules_per_output_token": self.joules_per_output_token,
            "timeline": self.timeline,
        }


def summarize(run: SimRun, slo: Slo | None = None, energy: bool = False) -> SimSummary:
    """The run's numbers; with `energy`, its power and joules per output token too
    (`run_energy`)."""
    slo = slo or Slo()
    r = run.requests
    done = r.done
    out_tok = r.output_tokens[done]
    arrival = r.arrival_s[done]
    ttft = r.first_token_s[done] - arrival
    e2e = r.finish_s[done] - arrival
    multi = out_tok > 1
    tpot = per_request_tpot(e2e[multi], ttft[multi], out_tok[multi])
    duration = run.duration_s
    n_done = int(done.sum())
    good: float | None = None
    if not slo.empty:
        tp = np.zeros(n_done)  # a one-token request has no TPOT: it meets the objective
        tp[multi] = tpot
        good = float(slo.met(ttft, tp, e2e).sum() / duration) if duration > 0 else 0.0
    tl = run.timeline
    t = np.asarray(tl.time_s)
    used = np.asarray(tl.kv_used_blocks, dtype=np.float64) / run.num_blocks
    dt = np.diff(t)

    def time_mean(x: npt.NDArray[np.float64]) -> float:
        return float((x[:-1] * dt).sum() / dt.sum()) if dt.size and dt.sum() > 0 \
            else float(x.mean())

    mean_util = time_mean(used)
    queue_mean = time_mean(np.asarray(tl.num_waiting, dtype=np.float64))
    itl = weighted_percentiles(run.itl_values_s * 1e3, run.itl_weights)
    return SimSummary(
        max_num_seqs=run.config.scheduler.max_num_seqs, requests=n_done,
        requests_total=len(r), duration_s=duration,
        throughput_tok_s=float(out_tok.sum() / duration) if duration > 0 else 0.0,
        request_throughput_req_s=n_done / duration if duration > 0 else 0.0,
        goodput_req_s=good, slo=slo, ttft_ms=percentiles_ms(ttft), tpot_ms=percentiles_ms(tpot),
        itl_ms=itl, e2e_ms=percentiles_ms(e2e), preemptions=run.num_preemptions,
        preempted_requests=int((r.num_preemptions > 0).sum()), num_steps=run.num_steps,
        kv_blocks=run.num_blocks, block_size=run.block_size,
        kv_utilization_max=float(used.max()), kv_utilization_mean=mean_util,
        queue_max=int(max(tl.num_waiting)), queue_mean=queue_mean,
        running_max=int(max(tl.num_running)),
        truncated=run.truncated, timeline=downsample(tl.time_s, used, tl.num_waiting,
                                                     tl.num_running),
        stop_reason=run.stop_reason, prefix_cache_hit_tokens=run.prefix_hit_tokens,
        prefix_cache_query_tokens=run.prefix_query_tokens,
        **(run_energy(run, int(out_tok.sum())) if energy else {}))


def run_energy(run: SimRun, output_tokens: int) -> dict[str, float | None]:
    """Power and joules per output token of a simulated run (bstar.energy.busy_energy_j):
    each step's time priced as a decode step of its size at the run's mean tokens held per
    running sequence (KV blocks in use x block size over the running sequences,
    time-weighted along the timeline), idle power for the time no step runs."""
    from bstar.energy import busy_energy_j

    tl = run.timeline
    t = np.asarray(tl.time_s, dtype=np.float64)
    end = run.duration_s
    dt = np.diff(np.append(t, max(end, float(t[-1])))) if t.size else np.zeros(0)
    running = np.asarray(tl.num_running, dtype=np.float64)
    held = np.asarray(tl.kv_used_blocks, dtype=np.float64) * run.block_size
    seq_s = float((running * dt).sum())
    ctx = max(1, round(float((held * dt).sum()) / seq_s)) if seq_s > 0 else 1
    joules = busy_energy_j(run.deployment, run.busy_s_by_seqs, end, ctx)
    if joules is None or not end > 0:
        return {}
    return {"power_w_mean": joules / end / run.deployment.num_gpus,
            "joules_per_output_token": joules / output_tokens if output_tokens else None}


def downsample(time_s: list[float], kv_util: npt.NDArray[np.float64], waiting: list[int],
               running: list[int], points: int = TIMELINE_POINTS) -> dict[str, list[float]]:
    """At most `points` time bins, each the peak of the bin (peaks are what bite)."""
    t = np.asarray(time_s)
    if t.size == 0:
        return {"time_s": [], "kv_utilization": [], "num_waiting": [], "num_running": []}
    edges = np.linspace(t[0], t[-1], points + 1) if t[-1] > t[0] else np.array([t[0], t[0]])
    idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, edges.size - 2)
    cols = {"kv_utilization": kv_util, "num_waiting": np.asarray(waiting, dtype=np.float64),
            "num_running": np.asarray(running, dtype=np.float64)}
    out: dict[str, list[float]] = {"time_s": []}
    for k in cols:
        out[k] = []
    for b in np.unique(idx):
        sel = idx == b
        out["time_s"].append(round(float(edges[b]), 6))
        for k, v in cols.items():
            out[k].append(float(v[sel].max()))
    return out
