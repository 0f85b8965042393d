"""One load stage simulated like for like (`simulate_stage`; the package docstring says how),
and its saturation state, measured or simulated (`saturation_state`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bstar.deployment import NO_GRAPHS, Deployment, Efficiency, EngineBehaviour
from bstar.engine_defaults import BLOCK_SIZE, GPU_MEMORY_UTILIZATION
from bstar.sim.capacity import GROWTH_SLOPE
from bstar.specs.precision import kv_dtype_for, weight_dtype_for
from bstar.stages_table import Stage
from bstar.stats import per_request_tpot, percentiles_ms, poisson_gaps_s

if TYPE_CHECKING:
    from bstar.sim.traffic import Workload

# How much of a stage is simulated: the whole table (12 stages) in ~15 s on one core.
MAX_WINDOW_S = 150.0  # seconds of arrivals (the measured stages ran 600-1200 s)
MAX_REQUESTS = 4000
WARMUP_FRACTION = 0.1  # the first requests meet an empty server: left out of the figures
# Saturation (the package docstring).
GROWTH_LIMIT = GROWTH_SLOPE  # 0.02 s of wait per s of arrivals: the capacity's definition
FAILED_LIMIT = 0.01
STEADY, GROWING = "steady", "queue growing"


def draw_prompt_lengths(stage: Stage, rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` prompt lengths from the stage's percentiles: the piecewise-linear inverse CDF
    through the given (quantile, tokens) points, held flat beyond the first and last (without
    min and max, 10% of the draws sit at p10 and 1% at p99)."""
    q = np.array([a for a, _ in stage.prompt_len])
    x = np.array([b for _, b in stage.prompt_len])
    u = rng.random(n)
    return np.maximum(np.rint(np.interp(u, q, x)), 1).astype(np.int64)


def stage_requests(stage: Stage, max_window_s: float = MAX_WINDOW_S,
                   max_requests: int = MAX_REQUESTS) -> int:
    """How many requests the simulation sends: the stage's, up to `max_window_s` seconds of
    its arrivals and `max_requests`."""
    if stage.rate_req_s is not None and stage.arrival != "concurrency":
        n = stage.rate_req_s * min(stage.duration_s, max_window_s)
    else:
        n = stage.requests_sent or max_requests
    return max(1, min(round(n), max_requests))


def stage_workload(stage: Stage, num_requests: int, seed: int = 0,
                   prefix_cache: bool = True) -> Workload:
    """The stage's requests: its arrival process and lengths (a closed loop for
    `concurrency`, whose users send the next request as soon as one finishes). With
    `prefix_cache`, the requests carry their prompt identity and the simulator's prefix cache
    finds the hits (`bstar.sim.prefix_cache`): every prompt starts with the stage's one
    `shared_prefix_len`-token system prompt, and where the workload repeats
    `distinct_prompts` prompts in turn, request i sends prompt i mod k again.

    A constant-rate client sends request i at i/rate, but the engine's step clock is not
    locked to the client's: each request reaches the scheduler after the API server's
    variable delay, and real step times vary. A simulated lattice of arrivals against the
    simulated lattice of steps does lock, so each request is drawn at a uniform point of its
    own 1/rate slot: the rate stays exact, and its phase against the steps is uniform."""
    from bstar.sim.traffic import Workload

    rng = np.random.default_rng(seed)
    k = stage.distinct_prompts
    if k:  # the same k prompts in turn: draw their lengths once
        inp = np.resize(draw_prompt_lengths(stage, rng, k), num_requests)
    else:
        inp = draw_prompt_lengths(stage, rng, num_requests)
    out = np.full(num_requests, stage.output_len, dtype=np.int64)
    if stage.output_len_min:  # bench_serving's random lengths: uniform integers
        out = rng.integers(stage.output_len_min, stage.output_len + 1, size=num_requests)
    ids = stage_prompt_ids(inp, stage.shared_prefix_len, k) \
        if prefix_cache and (stage.shared_prefix_len or k) else None
    if stage.arrival == "concurrency":
        assert stage.concurrency is not None
        return Workload(inp, out, None, stage.concurrency, np.zeros(num_requests),
                        prompt_ids=ids)
    assert stage.rate_req_s is not None
    if stage.arrival == "constant":
        # One request per slot of 1/rate, at a uniform point of its slot: the rate is the
        # client's, and the phase against the engine's steps is random, as on a real server
        # (docs/simulate.md, "Checked against a real vLLM under load").
        slot = np.arange(num_requests, dtype=np.float64)
        arrival = (slot + rng.uniform(0.0, 1.0, size=num_requests)) / stage.rate_req_s
    else:
        arrival = np.cumsum(poisson_gaps_s(stage.rate_req_s, rng, num_requests))
    return Workload(inp, out, arrival, prompt_ids=ids)


def stage_prompt_ids(inp: np.ndarray, shared_prefix_len: int, k: int) -> Any:
    """Request i's prompt: the shared system prompt (as much of it as the prompt holds),
    then prompt i mod k's own tokens (request i's own where k is 0)."""
    from bstar.sim.prefix import PromptIds

    system, own, answer = 1, 2 << 40, 4 << 40
    segments = []
    for i, p in enumerate(inp.tolist()):
        s = min(p, shared_prefix_len)
        body = ((own + (i % k if k else i), p - s),) if p > s else ()
        segments.append(((system, s), *body) if s else body)
    return PromptIds(tuple(segments), tuple(answer + i for i in range(inp.size)))


_DEPLOYMENTS: dict[tuple[Any, ...], Deployment] = {}


def _resolve(name: str, base_dir: str) -> str:
    is_path = name.endswith((".json", ".toml")) or name.startswith((".", "/"))
    if is_path and base_dir and not Path(name).is_absolute():
        return str(Path(base_dir) / name)
    return name


def stage_deployment(stage: Stage, engine: str | None = None,
                     eff: Efficiency | None = None,
                     behaviour: EngineBehaviour | None = None) -> Deployment:
    """The stage's deployment: its model, GPU, TP, weight and KV dtypes, memory fraction
    and KV block size (blank: vLLM's defaults, gpu_util 0.9 and 16-token blocks; the KV cache
    in the weights' 16-bit dtype, else bf16: the engines' `auto`) with the engine profile
    `engine` (default: the stage's own engine), through `DeploymentOptions`; `eff` replaces
    the profile's efficiencies, `behaviour` its behaviour. The run's CUDA graph settings
    apply over either (`graph_settings`). A dtype name is read as `bstar plan --dtype`
    reads it (bstar.specs.precision.weight_dtype_for): `fp4` is the checkpoint's MXFP4 or
    NVFP4, an unknown name is refused. Built once per setting."""
    from bstar.options import DeploymentOptions
    from bstar.specs.presets import get_model

    where = stage.where or stage.stage
    model = _resolve(stage.model, stage.base_dir)
    checkpoint = get_model(model).default_dtype
    dtype = weight_dtype_for(stage.dtype, checkpoint, f"{where}: dtype")
    weights = dtype or checkpoint
    kv = kv_dtype_for(stage.kv_cache_dtype,
                      weights if weights in ("fp16", "bf16", "fp32") else "bf16",
                      f"{where}: kv_cache_dtype")
    opts = DeploymentOptions(model=model,
                             gpu=_resolve(stage.gpu, stage.base_dir), num_gpus=stage.num_gpus,
                             weight_dtype=dtype, kv_dtype=kv,
                             gpu_util=stage.memory_fraction or GPU_MEMORY_UTILIZATION,
                             block_size=stage.block_size or BLOCK_SIZE,
                             engine=stage.engine if engine is None else engine,
                             expert_parallel=stage.expert_parallel,
                             data_parallel=stage.data_parallel)
    trt = stage.engine == "trt-llm"  # the run's own server: its fraction is of free memory
    key = (*opts.to_dict().values(), trt)
    d = _DEPLOYMENTS.get(key)
    if d is None:
        if trt:
            opts = replace(opts, gpu_util=_trt_gpu_util(opts, stage.memory_fraction))
        d = _DEPLOYMENTS[key] = opts.build()
    d = d if eff is None else d.with_eff(eff)
    d = d.with_eff(graph_settings(stage, d.eff))
    return d if behaviour is None else d.with_behaviour(behaviour)


def _trt_gpu_util(opts: Any, free_fraction: float | None) -> float:
    """A TensorRT-LLM run's free_gpu_memory_fraction (blank: its default) as gpu_util
    (bstar.engine_defaults.gpu_util_for_free_fraction), on the run's weights and reserve."""
    from bstar.engine_defaults import (
        TRT_LLM_FREE_GPU_MEMORY_FRACTION,
        gpu_util_for_free_fraction,
    )
    from bstar.roofline import weight_bytes_per_gpu

    d = replace(opts, gpu_util=1.0).build()
    return gpu_util_for_free_fraction(free_fraction or TRT_LLM_FREE_GPU_MEMORY_FRACTION,
                                      d.gpu.memory_bytes, weight_bytes_per_gpu(d),
                                      d.reserve_bytes)


def graph_settings(stage: Stage, eff: Efficiency) -> Efficiency:
    """`eff` with the run's CUDA graph settings: no graphs (`cuda_graph_mode` none) puts every
    step past the capture limit; a stated `cuda_graph_max_tokens` is the limit; else the
    profile's stands."""
    if stage.cuda_graph_mode == "none":
        return replace(eff, graph_max_tokens=NO_GRAPHS)
    if stage.cuda_graph_max_tokens:
        return replace(eff, graph_max_tokens=float(stage.cuda_graph_max_tokens))
    return eff


@dataclass(frozen=True, slots=True)
class StagePrediction:
    """What the simulator predicts for a stage, from the requests after the warm-up."""

    requests: int  # simulated
    scored: int  # after the warm-up
    window_s: float  # the scored requests' arrivals span this
    ttft_mean_ms: float
    ttft_p50_ms: float
    ttft_p90_ms: float
    e2e_mean_ms: float
    e2e_p50_ms: float
    e2e_p90_ms: float
    tpot_mean_ms: float
    tpot_p90_ms: float
    output_tok_s: float  # scored requests' tokens / (their last finish - first arrival)
    ttft_growth: float
    state: str
    preemptions: int
    truncated: bool

    def values(self) -> dict[str, float]:
        return {"e2e_mean_ms": self.e2e_mean_ms, "ttft_mean_ms": self.ttft_mean_ms,
                "tpot_mean_ms": self.tpot_mean_ms}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def ttft_growth(ttft_p50_s: float, ttft_p90_s: float, window_s: float) -> float:
    """TTFT's growth per second of the stage, g = (p90 - p50) / (0.4 x window): a queue
    growing through the window makes TTFT about g x t for a request arriving at t (uniform
    over the window, so p90 - p50 = 0.4 g window); g = rate / capacity - 1 there."""
    return max(0.0, ttft_p90_s - ttft_p50_s) / (0.4 * window_s) if window_s > 0 else 0.0


def growing_stage_capacity_req_s(rate_req_s: float | None, growth: float | None,
                   state: str) -> float | None:
    """Requests per second a growing stage's server completes, rate / (1 + g) (module
    docstring); None for a steady stage (its capacity is only known to be above the rate)
    or a closed loop."""
    if state != GROWING or rate_req_s is None or growth is None or growth <= 0:
        return None
    return rate_req_s / (1.0 + growth)


def saturation_state(growth: float, failed_fraction: float = 0.0,
                     growth_limit: float = GROWTH_LIMIT,
                     failed_limit: float = FAILED_LIMIT) -> str:
    """"queue growing" when TTFT grows faster than `growth_limit` seconds per second of the
    stage, or more than `failed_limit` of the requests failed; else "steady"."""
    return GROWING if growth > growth_limit or failed_fraction > failed_limit else STEADY


def measured_growth(stage: Stage) -> float | None:
    if stage.ttft_p50_ms is None or stage.ttft_p90_ms is None:
        return None
    return ttft_growth(stage.ttft_p50_ms / 1e3, stage.ttft_p90_ms / 1e3, stage.duration_s)


def measured_state(stage: Stage) -> str:
    """The state the data show: `saturation_state` of the stage's TTFT growth (its p50 and
    p90 over its duration; 0 when the table lacks them) and failed fraction."""
    return saturation_state(measured_growth(stage) or 0.0, stage.failed_fraction)




def simulate_stage(stage: Stage, eff: Efficiency | None = None, *,
                   engine: str | None = None, deployment: Deployment | None = None,
                   max_window_s: float = MAX_WINDOW_S, max_requests: int = MAX_REQUESTS,
                   seed: int = 0, prefix_cache: bool = True,
                   behaviour: EngineBehaviour | None = None,
                   workload: Workload | None = None) -> StagePrediction:
    """Simulate one stage like for like (the package docstring). The deployment is
    `deployment` if given, else `stage_deployment(stage, engine, eff, behaviour)`; the
    requests are `workload` if given (e.g. the stage read back from a trace), else
    `stage_workload`'s."""
    from bstar.sim import SchedulerConfig, SimConfig, simulate

    d = (deployment if deployment is not None
         else stage_deployment(stage, engine, eff, behaviour))
    if workload is None:
        n = stage_requests(stage, max_window_s, max_requests)
        w = stage_workload(stage, n, seed, prefix_cache)
    else:
        n, w = len(workload.prompt_tokens), workload
    cfg = SimConfig(SchedulerConfig(stage.max_num_seqs, stage.max_num_batched_tokens,
                                    decode_steps_per_schedule=stage.decode_steps_per_schedule,
                                    recv_interval=stage.scheduler_recv_interval,
                                    dp_ranks=stage.data_parallel,
                                    adp_timeout_iters=stage.attention_dp_timeout_iters,
                                    adp_batching_wait_iters=(
                                        stage.attention_dp_batching_wait_iters)),
                    speculative=stage_speculation(stage, d, seed),
                    cold_start_s=0.0 if stage.warmed_up else d.behaviour.cold_start_s)
    run = simulate(d, cfg, w)
    r = run.requests
    warmup = WARMUP_FRACTION if stage.warmup_fraction is None else stage.warmup_fraction
    skip = int(n * warmup) if n >= 10 else 0
    keep = np.zeros(n, dtype=bool)
    keep[np.argsort(r.arrival_s, kind="stable")[skip:]] = True
    keep &= r.done
    arrival, first, finish = r.arrival_s[keep], r.first_token_s[keep], r.finish_s[keep]
    out_tok = r.output_tokens[keep]
    if stage.first_chunk_tokens > 1:  # the first chunk leaves with its N-th token
        first = first_chunk_s(first, finish, out_tok, stage.first_chunk_tokens)
    ttft, e2e = first - arrival, finish - arrival
    multi = out_tok > 1
    tpot = per_request_tpot(e2e[multi], ttft[multi], out_tok[multi])
    t, e, p = percentiles_ms(ttft), percentiles_ms(e2e), percentiles_ms(tpot)
    window = float(arrival.max() - arrival.min()) if arrival.size > 1 else 0.0
    span = float(finish.max() - arrival.min()) if arrival.size else 0.0
    growth = ttft_growth((t["p50"] or 0.0) / 1e3, (t["p90"] or 0.0) / 1e3, window)

    def num(x: float | None) -> float:
        return math.nan if x is None else float(x)

    pred = StagePrediction(
        requests=n, scored=int(keep.sum()), window_s=window,
        ttft_mean_ms=num(t["mean"]), ttft_p50_ms=num(t["p50"]), ttft_p90_ms=num(t["p90"]),
        e2e_mean_ms=num(e["mean"]), e2e_p50_ms=num(e["p50"]), e2e_p90_ms=num(e["p90"]),
        tpot_mean_ms=num(p["mean"]), tpot_p90_ms=num(p["p90"]),
        output_tok_s=float(out_tok.sum() / span) if span > 0 else 0.0,
        ttft_growth=growth, state=predicted_state(run), preemptions=run.num_preemptions,
        truncated=run.truncated)
    return pred


def stage_speculation(stage: Stage, d: Deployment, seed: int = 0) -> Any:
    """The run's speculative decoding for the simulator (`bstar.sim.speculative.SpecSim`):
    its method and draft tokens at its `acceptance_rate`, which must be stated or filled in
    by the caller (bstar.validate_runs fits it); None for a run without speculation."""
    if not stage.spec_method:
        return None
    from bstar.errors import BstarError
    from bstar.sim.speculative import SpecSim
    from bstar.specdec import SpecConfig, make_drafter

    if stage.acceptance_rate is None:
        raise BstarError(f"{stage.where or stage.stage}: speculative run without an "
                         "acceptance rate (state acceptance_rate or let validate fit it)")
    cfg = SpecConfig(stage.num_speculative_tokens, stage.acceptance_rate, stage.spec_method)
    return SpecSim(cfg, make_drafter(d, stage.spec_method), seed)


def first_chunk_s(first_token_s: np.ndarray, finish_s: np.ndarray, output_tokens: np.ndarray,
                  chunk_tokens: int) -> np.ndarray:
    """When the client sees each request's first chunk if the engine streams its first
    `chunk_tokens` tokens together (SGLang's stream interval): the first token's time plus
    chunk_tokens - 1 of the request's own decode steps (its mean time per output token),
    never past its end."""
    steps = np.maximum(output_tokens - 1, 1)
    per_token = (finish_s - first_token_s) / steps
    extra = np.minimum(chunk_tokens - 1, output_tokens - 1) * per_token
    return np.asarray(first_token_s + extra, dtype=np.float64)


def predicted_state(run: Any) -> str:
    """The simulated state: "queue growing" when `bstar.sim.capacity.queue_grows` (the
    wait's slope against arrival time over the second half of the arrivals, above the same
    0.02 s per s: the one definition `bstar simulate` and `bstar search` use) or when the
    run was cut off at its time limit; else "steady"."""
    from bstar.sim.capacity import queue_grows

    if run.workload.closed_loop:
        return GROWING if run.truncated else STEADY
    return GROWING if run.truncated or queue_grows(run) else STEADY
