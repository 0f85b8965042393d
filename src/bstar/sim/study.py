"""`bstar simulate` as a library call: the load, the levels and the scheduler as plain
values (`StudyOptions`), one simulation per max_num_seqs level and, for several levels, the
knee advice (`run_study`). The command only maps its flags onto `StudyOptions`.
`replay_closed_loops` simulates a measured sweep's closed-loop levels (the report's replay)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from bstar.deployment import Deployment
from bstar.energy import DEFAULT_ELECTRICITY_USD_PER_KWH, energy_usd_per_mtok
from bstar.errors import BstarError
from bstar.specs.gpu import MAX_MEMORY_BYTES
from bstar.units import GiB


@dataclass(frozen=True, slots=True)
class StudyOptions:
    """Load (`rate` open loop, `concurrency` closed loop, or a `trace` file), request
    lengths (parse_lengths forms), levels (None: vllm serve's default for the GPU) and
    the scheduler's token budget, preemption mode and swap space."""

    max_num_seqs: tuple[int, ...] | None = None
    max_num_batched_tokens: int | None = None
    preemption: str = "recompute"
    swap_space_gib: float = 4.0
    rate: float | None = None
    concurrency: int | None = None
    trace: str | None = None
    think_time_s: float = 0.0
    input_len: str = "512"
    output_len: str = "256"
    num_requests: int | None = None
    seed: int = 0
    slo: str | None = None
    max_sim_time_s: float = 24 * 3600.0
    prefix_cached_tokens: int = 0  # of every prompt, already in the prefix cache
    capacity: bool = True  # each level's capacity line (`sustained`); off: the levels alone
    prompt_shape: Any = None  # bstar.sim.prefix.PromptShape: which prompts share tokens
    prefix_caching: bool = True  # vLLM V1's automatic prefix caching (--no-prefix-caching)
    # Speculative decoding (bstar.sim.speculative.SpecSim); None: plain decode.
    speculative: Any = None
    # SGLang's --num-continuous-decode-steps (SchedulerConfig.decode_steps_per_schedule) and
    # --scheduler-recv-interval (SchedulerConfig.recv_interval).
    decode_steps_per_schedule: int = 1
    scheduler_recv_interval: int = 1
    # TensorRT-LLM's attention-DP balance over the deployment's ranks (its
    # attention_dp_config timeout_iters and batching_wait_iters; bstar.sim.adp); 0: none.
    adp_timeout_iters: int = 0
    adp_batching_wait_iters: int = 0
    # The price each level's energy per output token is costed at (bstar.energy).
    electricity_usd_per_kwh: float = DEFAULT_ELECTRICITY_USD_PER_KWH


@dataclass(frozen=True, slots=True)
class Study:
    """Per-level summaries, the advice (None for one level), arrivals and token budget."""

    deployment: Deployment
    options: StudyOptions
    rows: list[Any]
    advice: Any
    arrivals: Any
    max_num_batched_tokens: int
    # Per level: the largest rate sustained (bstar.sim.capacity) and the latencies at
    # SUSTAINED_FRACTION of it; None where not computed.
    capacities: list[Any] | None = None

    def to_objects(self) -> list[dict[str, Any]]:
        """The simulate JSON contract, one object per level."""
        objs = [r.to_dict() for r in self.rows]
        for o, cap in zip(objs, self.capacities or [None] * len(objs), strict=True):
            if cap is not None:
                o["capacity"] = cap
            o["max_num_batched_tokens"] = self.max_num_batched_tokens
            j = o.get("joules_per_output_token")
            o["electricity_usd_per_kwh"] = self.options.electricity_usd_per_kwh
            o["energy_usd_per_mtok"] = None if j is None else energy_usd_per_mtok(
                j, self.options.electricity_usd_per_kwh)
            o["preemption_mode"] = self.options.preemption
            sp = self.options.speculative
            if sp is not None:
                o["speculative"] = {"num_speculative_tokens": sp.k,
                                    "acceptance_rate": sp.config.acceptance_rate,
                                    "drafter": sp.drafter.name,
                                    "lookahead_tokens": sp.lookahead_tokens}
            if self.advice is not None:
                o["recommended"] = o["max_num_seqs"] == self.advice.max_num_seqs
                o["sweep"] = self.advice.to_dict(knees=True)
        return objs


def _arrivals(o: StudyOptions) -> Any:
    from bstar.sim.traffic import ClosedLoop, Poisson, read_trace_file

    if o.rate is None and o.concurrency is None and o.trace is None:
        raise BstarError("give the load: --rate R (open loop), --concurrency N (closed loop) "
                         "or --trace FILE")
    if o.trace is not None:
        return read_trace_file(o.trace)
    if o.rate is not None:
        return Poisson(o.rate)
    assert o.concurrency is not None
    return ClosedLoop(o.concurrency, o.think_time_s, random_think=True)


def check_trace_options(o: StudyOptions, arrivals: Any) -> None:
    """Refuse a flag that a --trace replay would not use, rather than run without it
    (issue 40): think time paces a closed loop's users, and a trace gives every arrival; a
    trace that says which prompts share tokens (prefix ids or hash ids) keeps its own
    sharing, which the prompt-sharing flags would replace. Lengths are refused by the
    command (`given_lengths`), which knows which flags were typed."""
    from bstar.sim.traffic import Trace

    if not isinstance(arrivals, Trace):
        return
    if o.think_time_s:
        raise BstarError("--think-time-s with --trace: think time paces a closed loop, and "
                         "the trace gives every arrival; drop --think-time-s")
    if o.prompt_shape is not None and o.prompt_shape.active \
            and arrivals.prompt_ids is not None:
        raise BstarError(f"prompt-sharing flags with --trace: this {arrivals.format} trace "
                         "says which prompts share tokens itself; drop --shared-prefix-"
                         "tokens, --distinct-prompts and --multi-turn, or use a trace "
                         "without prefix or hash ids")


def run_study(d: Deployment, o: StudyOptions) -> Study:
    """Simulate every level of `o` on `d`; advise on the knee when there are several."""
    from bstar.engine_defaults import vllm_defaults
    from bstar.sim import SchedulerConfig, SimConfig, simulate_levels
    from bstar.sim.advice import advise
    from bstar.sim.metrics import parse_slo
    from bstar.sim.traffic import parse_lengths

    arrivals = _arrivals(o)
    check_trace_options(o, arrivals)
    defaults = vllm_defaults(d.gpu)
    levels = sorted(set(o.max_num_seqs or [defaults.max_num_seqs]))
    tokens = o.max_num_batched_tokens or defaults.max_num_batched_tokens
    if not 0 <= o.swap_space_gib * GiB <= MAX_MEMORY_BYTES:
        raise BstarError(f"--swap-space-gib must be between 0 and {MAX_MEMORY_BYTES // GiB} "
                         f"GiB, got {o.swap_space_gib:g}")
    if (o.adp_timeout_iters or o.adp_batching_wait_iters) and d.data_parallel < 2:
        raise BstarError("--attention-dp-timeout-iters and --attention-dp-batching-wait-iters "
                         "balance attention data-parallel ranks: give --data-parallel-size "
                         "(or --enable-dp-attention) too")
    cfg = SimConfig(SchedulerConfig(levels[0], tokens, o.preemption,
                                    decode_steps_per_schedule=o.decode_steps_per_schedule,
                                    recv_interval=o.scheduler_recv_interval,
                                    dp_ranks=d.data_parallel,
                                    adp_timeout_iters=o.adp_timeout_iters,
                                    adp_batching_wait_iters=o.adp_batching_wait_iters),
                    swap_space_bytes=round(o.swap_space_gib * GiB),
                    max_sim_time_s=o.max_sim_time_s, prefix_caching=o.prefix_caching,
                    speculative=o.speculative)
    slo = parse_slo(o.slo) if o.slo else None
    num_requests = o.num_requests
    if num_requests is None:
        num_requests = len(arrivals.arrival_s) if o.trace is not None else 1000
    if o.prefix_cached_tokens < 0:
        raise BstarError("--prefix-cached-tokens must not be negative")
    rows = simulate_levels(d, levels, arrivals, parse_lengths(o.input_len, "--input-len"),
                           parse_lengths(o.output_len, "--output-len"), num_requests,
                           o.seed, cfg, slo, cached_prefix_tokens=o.prefix_cached_tokens,
                           prompts=o.prompt_shape)
    advice = advise(rows, slo) if len(rows) > 1 else None
    caps = [sustained(d, replace(cfg, scheduler=replace(cfg.scheduler, max_num_seqs=m)),
                      arrivals, parse_lengths(o.input_len), parse_lengths(o.output_len),
                      num_requests, o.seed, slo, o.prefix_cached_tokens, o.prompt_shape)
            for m in levels] if o.capacity else None
    return Study(d, o, rows, advice, arrivals, tokens, caps)


SUSTAINED_FRACTION = 0.9  # the operating point reported beside the capacity (search's cap)


def sustained(d: Deployment, cfg: Any, arrivals: Any, input_len: Any, output_len: Any,
              num_requests: int, seed: int, slo: Any = None,
              prefix_cached_tokens: int = 0, prompt_shape: Any = None) -> dict[str, Any]:
    """The largest rate this level sustains for requests like the study's (its capacity:
    bstar.sim.capacity, the definition `bstar search` uses) and the latencies of a Poisson
    load at SUSTAINED_FRACTION of it, on the capacity probes' sample of the requests (the
    first `sample_size(max_num_seqs)`): at a steady rate more requests only narrow the
    percentiles, and the level's own run above has all of them."""
    import numpy as np

    from bstar.sim import Poisson, make_workload, simulate, summarize
    from bstar.sim.capacity import capacity, head, sample_size

    rng = np.random.default_rng(seed)
    unit = make_workload(arrivals, input_len, output_len, num_requests, rng)
    if prefix_cached_tokens:
        unit = replace(unit, cached_tokens=np.minimum(unit.prompt_tokens, prefix_cached_tokens))
    if prompt_shape is not None:
        from bstar.sim.prefix import shape_workload

        unit = shape_workload(unit, prompt_shape)
    cap, _ = capacity(d, cfg, unit)
    out: dict[str, Any] = cap.to_dict()
    if cap.capacity_req_s <= 0:
        return out | {"at_rate_req_s": None}
    rate = SUSTAINED_FRACTION * cap.capacity_req_s
    part = head(unit, sample_size(cfg.scheduler.max_num_seqs))
    w = replace(part, arrival_s=Poisson(rate).arrivals(rng, part.num_requests), num_users=0)
    s = summarize(simulate(d, cfg, w), slo)
    return out | {"at_rate_req_s": rate, "at_rate_fraction": SUSTAINED_FRACTION,
                  "ttft_ms": s.ttft_ms, "tpot_ms": s.tpot_ms, "e2e_ms": s.e2e_ms}


def replay_closed_loops(d: Deployment, levels: list[tuple[int, int]], prompt_tokens: int,
                        output_tokens: int, num_requests: int, seed: int = 0
                        ) -> list[dict[str, Any]]:
    """The simulator at each level given as (closed-loop users, server batch cap), every
    request `prompt_tokens` in and `output_tokens` out: what a sweep of those levels would
    measure if the cost model were right, scheduling and queueing included, under the
    GPU's default token budget as `vllm serve` runs it (`engine_defaults.vllm_defaults`). One
    simulate JSON object per level, with `batch`: the running-batch bound min(users, cap)."""
    from bstar.engine_defaults import vllm_defaults
    from bstar.fit.points import level_batch
    from bstar.sim import ClosedLoop, SchedulerConfig, SimConfig, simulate_levels
    from bstar.sim.traffic import parse_lengths

    budget = vllm_defaults(d.gpu).max_num_batched_tokens
    rows = []
    for users, cap in levels:
        r = simulate_levels(d, [cap], ClosedLoop(users), parse_lengths(str(prompt_tokens)),
                            parse_lengths(str(output_tokens)), num_requests, seed,
                            SimConfig(SchedulerConfig(cap, budget)))[0].to_dict()
        rows.append({"batch": level_batch({"concurrency": users, "max_num_seqs": cap}), **r})
    return rows
