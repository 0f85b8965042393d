"""What a search is asked: traffic, SLO, candidate axes, memory settings. Plain data; the
workload every evaluation simulates is drawn here, once per spec, from the seed.

Rates are found by bisection, so the workload is drawn at one request per second and
stretched in time for each rate tried (`at_rate`): every rate sees the same requests in the
same order, only closer together (common random numbers), which keeps "meets the SLO" close
to monotone in the rate.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bstar.deployment import Efficiency, EngineBehaviour
from bstar.engine_defaults import BLOCK_SIZE, DEFAULT_RESERVE_GIB, GPU_MEMORY_UTILIZATION
from bstar.errors import BstarError
from bstar.sim import Lengths, Poisson, Slo, Trace, Workload, make_workload
from bstar.units import GiB

DEFAULT_NUM_GPUS = (1, 2, 4, 8)
DEFAULT_NUM_REQUESTS = 400
LAYOUTS = ("aggregated", "disaggregated", "both")
MAX_NUM_REQUESTS = 100_000


def parse_profiles(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """--profile items, `[GPU=]FILE` each, as (gpu id lower-cased or "" for the GPU the
    profile names, file)."""
    out = []
    for item in items:
        gpu, sep, path = item.partition("=")
        out.append((gpu.strip().lower(), path.strip()) if sep else ("", item))
    return tuple(out)


def demand_and_requests(rate_req_s: float | None, trace: Trace | None,
                        num_requests: int | None) -> tuple[float, int]:
    """The fleet's demand, requests/s: `rate_req_s` as given, else the trace's mean arrival
    rate over its span ((n - 1) / span). The requests each simulation runs: `num_requests`
    as given, else the trace's (at most MAX_NUM_REQUESTS), else DEFAULT_NUM_REQUESTS."""
    demand = rate_req_s
    if demand is None:
        if trace is None:
            raise BstarError("give the demand: --rate R (requests/s over the fleet) or --trace")
        span = max(trace.arrival_s) - min(trace.arrival_s)
        if span <= 0:
            raise BstarError("the trace spans no time: give --rate")
        demand = (len(trace.arrival_s) - 1) / span
    if num_requests is None:
        num_requests = (min(len(trace.arrival_s), MAX_NUM_REQUESTS) if trace is not None
                        else DEFAULT_NUM_REQUESTS)
    return demand, num_requests


@dataclass(frozen=True, slots=True)
class Traffic:
    """Demand (requests/s over the whole fleet) and the request mix each replica sees.

    Lengths come from the distributions, or with a trace from the trace, whose arrival
    pattern (burstiness) is kept and rescaled to each rate tried."""

    demand_req_s: float
    input_len: Lengths = field(default_factory=lambda: Lengths.fixed(512))
    output_len: Lengths = field(default_factory=lambda: Lengths.fixed(256))
    num_requests: int = DEFAULT_NUM_REQUESTS
    seed: int = 0
    trace: Trace | None = None
    # A rate meets the SLO only if it does on each of `draws` traffic draws (seeds seed,
    # seed+1, ...): the worst of K. A fresh draw then misses it with probability about
    # 1/(K+1) (order statistics), where one draw would leave it at a coin flip.
    draws: int = 3
    prefix_cached_tokens: int = 0  # of every prompt, already in the prefix cache
    # Which prompts share which tokens (bstar.sim.prefix.PromptShape); None: none shared
    # (a trace's own identity is kept either way, unless `prefix_caching` is off).
    prompt_shape: Any = None
    prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.prefix_cached_tokens < 0:
            raise BstarError("--prefix-cached-tokens must not be negative")
        if not (self.demand_req_s > 0 and np.isfinite(self.demand_req_s)):
            raise BstarError(f"--rate (the demand) must be a positive number of requests/s, "
                             f"got {self.demand_req_s}")
        if not 1 <= self.num_requests <= MAX_NUM_REQUESTS:
            raise BstarError(f"--num-requests must be in 1..{MAX_NUM_REQUESTS:,}, got "
                             f"{self.num_requests}")
        if not 1 <= self.draws <= 20:
            raise BstarError(f"--draws must be in 1..20, got {self.draws}")

    def unit_workloads(self) -> list[Workload]:
        """One unit workload per draw (a trace has one: its requests are given)."""
        n = 1 if self.trace is not None else self.draws
        return [self.unit_workload(self.seed + i) for i in range(n)]

    def unit_workload(self, seed: int | None = None) -> Workload:
        """The requests at a mean arrival rate of 1 request/s (deterministic in the seed)."""
        rng = np.random.default_rng(self.seed if seed is None else seed)
        if self.trace is None:
            return self._shaped(make_workload(Poisson(1.0), self.input_len,
                                              self.output_len, self.num_requests, rng))
        w = make_workload(self.trace, self.input_len, self.output_len, self.num_requests, rng)
        assert w.arrival_s is not None
        a = w.arrival_s - w.arrival_s[0]
        span = float(a[-1])
        if w.num_requests < 2 or span <= 0:
            raise BstarError("a trace for search needs at least 2 requests at distinct times "
                             "(its arrival pattern is rescaled to each rate tried)")
        # n - 1 gaps over the span: a mean rate of 1 request/s.
        return self._shaped(Workload(w.prompt_tokens, w.output_tokens,
                                     a * ((w.num_requests - 1) / span),
                                     prompt_ids=w.prompt_ids))

    def _shaped(self, w: Workload) -> Workload:
        from dataclasses import replace

        from bstar.sim.prefix import shape_workload

        if not self.prefix_caching:
            return replace(w, prompt_ids=None)
        if self.prompt_shape is not None:
            w = shape_workload(w, self.prompt_shape)
        return self._cached(w)

    def _cached(self, w: Workload) -> Workload:
        if not self.prefix_cached_tokens:
            return w
        return Workload(w.prompt_tokens, w.output_tokens, w.arrival_s,
                        cached_tokens=np.minimum(w.prompt_tokens, self.prefix_cached_tokens),
                        prompt_ids=w.prompt_ids)

    def describe(self) -> str:
        if self.trace is not None:
            return (f"trace ({len(self.trace.arrival_s)} requests, arrival pattern rescaled), "
                    f"demand {self.demand_req_s:g} req/s")
        return (f"Poisson, demand {self.demand_req_s:g} req/s; input "
                f"{self.input_len.describe()}, output {self.output_len.describe()}")

    def to_dict(self) -> dict[str, Any]:
        d = self._to_dict()
        # Added only when set: this dict is hashed into every stored search's name.
        if self.prompt_shape is not None:
            s = self.prompt_shape
            d["prompt_shape"] = {"shared_prefix_tokens": s.shared_prefix_tokens,
                                 "prefix_groups": s.prefix_groups,
                                 "distinct_prompts": s.distinct_prompts,
                                 "multi_turn": s.multi_turn}
        if not self.prefix_caching:
            d["prefix_caching"] = False
        return d

    def _to_dict(self) -> dict[str, Any]:
        return {"demand_req_s": self.demand_req_s, "input_len": _lengths_dict(self.input_len),
                "output_len": _lengths_dict(self.output_len),
                "num_requests": self.num_requests, "seed": self.seed, "draws": self.draws,
                "prefix_cached_tokens": self.prefix_cached_tokens,
                "trace": None if self.trace is None else {
                    "num_requests": len(self.trace.arrival_s),
                    "sha256": hashlib.sha256(json.dumps(
                        [self.trace.arrival_s, self.trace.prompt_tokens,
                         self.trace.output_tokens]).encode()).hexdigest()}}


def _lengths_dict(x: Lengths) -> dict[str, Any]:
    return {"kind": x.kind, "mean": x.mean, "std": x.std, "low": x.low, "high": x.high,
            "values": list(x.values), "describe": x.describe()}


def at_rate(unit: Workload, rate_req_s: float) -> Workload:
    """`unit` (1 request/s) with its arrival times compressed to `rate_req_s`."""
    assert unit.arrival_s is not None
    return Workload(unit.prompt_tokens, unit.output_tokens, unit.arrival_s / rate_req_s,
                    cached_tokens=unit.cached_tokens, prompt_ids=unit.prompt_ids)


@dataclass(frozen=True, slots=True)
class Memory:
    """Per-deployment memory settings shared by every candidate."""

    weight_dtype: str = ""
    kv_dtype: str = "bf16"
    gpu_util: float = GPU_MEMORY_UTILIZATION
    # None: each GPU's profile reserve, else DEFAULT_RESERVE_GIB (options.assemble); given
    # (--reserve-gib), it wins over the profile's.
    reserve_bytes: int | None = None
    block_size: int = BLOCK_SIZE

    def to_dict(self) -> dict[str, Any]:
        # None hashes as the default did before it could be None, so stored searches keep
        # their names (a profile's reserve applied to them then as now).
        reserve = round(DEFAULT_RESERVE_GIB * GiB) if self.reserve_bytes is None \
            else self.reserve_bytes
        return {"weight_dtype": self.weight_dtype, "kv_dtype": self.kv_dtype,
                "gpu_util": self.gpu_util, "reserve_bytes": reserve,
                # The key keeps its old name: this dict is hashed into the name of every
                # stored search, so a rename would orphan them.
                "block_tokens": self.block_size}


@dataclass(frozen=True, slots=True)
class SearchSpec:
    """Everything that decides the answer. Its hash names the search in the store, so the
    same question resumes the same rows."""

    models: tuple[str, ...]
    gpus: tuple[str, ...]
    traffic: Traffic
    slo: Slo
    num_gpus: tuple[int, ...] = DEFAULT_NUM_GPUS
    max_num_seqs: tuple[int, ...] = ()  # empty: around the predicted knee and B_mem
    max_num_batched_tokens: tuple[int, ...] = ()  # empty: vllm serve's default per GPU
    memory: Memory = field(default_factory=Memory)
    eff: Efficiency = field(default_factory=Efficiency)
    # The engine outside a step (its request overhead, scheduling lag): the engine
    # profile's; not in the search id, like the efficiencies beyond to_dict's five.
    behaviour: EngineBehaviour = field(default_factory=EngineBehaviour)
    profiles: tuple[tuple[str, str], ...] = ()  # (gpu id, profile path)
    rel_tol: float = 0.02  # bisection stops when hi / lo - 1 <= rel_tol
    max_utilization: float = 0.95  # rates at most this fraction of the replica's capacity
    # Speculative decoding: the K values each replica is tried with (0: off); empty: none
    # (the search as before). `acceptance_rate`, `drafter` as `bstar plan`'s flags.
    num_speculative_tokens: tuple[int, ...] = ()
    acceptance_rate: float = 0.7
    drafter: str = "auto"
    # The engine profile whose entries for each GPU's architecture and kernel path price it
    # (options.assemble); not in the search id: `eff` is.
    engine: str = ""
    # Each replica's parallel layout inside its tp GPUs (bstar.deployment.Deployment):
    # expert-parallel size and attention data-parallel ranks; 0: all of the replica's GPUs;
    # a size that does not divide a replica's GPUs leaves that replica at 1.
    expert_parallel: int = 1
    attention_dp: int = 1
    # Which layouts are candidates: "aggregated" (one engine serves both phases),
    # "disaggregated" (prefill and decode workers apart, bstar.search.disagg) or "both".
    layouts: str = "aggregated"

    def __post_init__(self) -> None:
        if self.layouts not in LAYOUTS:
            raise BstarError(f"--layouts must be one of {', '.join(LAYOUTS)}, got "
                             f"{self.layouts!r}")
        if not self.models or not self.gpus:
            raise BstarError("give at least one --model and one --gpu")
        if not self.num_gpus or min(self.num_gpus) < 1 or max(self.num_gpus) > 64:
            raise BstarError("--num-gpus values must be in 1..64")
        if self.max_num_seqs and min(self.max_num_seqs) < 1:
            raise BstarError("--max-num-seqs values must be at least 1")
        if self.max_num_batched_tokens and min(self.max_num_batched_tokens) < 1:
            raise BstarError("--max-num-batched-tokens values must be at least 1")
        if self.slo.ttft_ms is None and self.slo.e2e_ms is None:
            raise BstarError(
                "the SLO needs a ttft (or e2e) bound: a TPOT bound alone holds at any rate, "
                "since the engine caps the batch and the excess waits in the queue, e.g. "
                "--slo ttft:1000,tpot:50")
        if not 0.001 <= self.rel_tol <= 0.5:
            raise BstarError(f"--rel-tol must be in 0.001..0.5, got {self.rel_tol}")
        ks = self.num_speculative_tokens
        if ks and not all(0 <= k <= 16 for k in ks):
            raise BstarError("--num-speculative-tokens values must be in 0..16 (0: off)")
        if not 0 <= self.acceptance_rate <= 1:
            raise BstarError(f"--acceptance-rate must be in [0, 1], got {self.acceptance_rate}")
        if not 0 < self.max_utilization <= 1:
            raise BstarError(f"--max-utilization must be in (0, 1], got "
                             f"{self.max_utilization}")

    def to_dict(self) -> dict[str, Any]:
        e = self.eff
        return {"models": list(self.models), "gpus": list(self.gpus),
                "num_gpus": list(self.num_gpus), "traffic": self.traffic.to_dict(),
                "slo": self.slo.to_dict(), "max_num_seqs": list(self.max_num_seqs),
                "max_num_batched_tokens": list(self.max_num_batched_tokens),
                "memory": self.memory.to_dict(),
                "efficiency": {"bandwidth": e.bandwidth, "compute": e.compute,
                               "overhead_s": e.overhead_s,
                               "overhead_per_seq_s": e.overhead_per_seq_s,
                               "allreduce_latency_s": e.allreduce_latency_s},
                "profiles": [list(p) for p in self.profiles], "rel_tol": self.rel_tol,
                "max_utilization": self.max_utilization} | (
                    {} if not self.num_speculative_tokens else
                    {"num_speculative_tokens": list(self.num_speculative_tokens),
                     "acceptance_rate": self.acceptance_rate, "drafter": self.drafter}) | (
                    # added only when not the default: stored searches keep their names
                    {} if self.layouts == "aggregated" else {"layouts": self.layouts})

    @property
    def aggregated(self) -> bool:
        return self.layouts in ("aggregated", "both")

    @property
    def disaggregated(self) -> bool:
        return self.layouts in ("disaggregated", "both")

    def search_id(self) -> str:
        """Stable name of this question (prices excluded: they re-rank, never re-simulate)."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]
