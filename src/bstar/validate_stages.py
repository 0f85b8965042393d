"""`bstar validate STAGES.csv`: the simulator against measured load stages.

A stages table has one row per load stage of a real server: a load generator sent requests
at a rate (or with a concurrency) for a duration, and measured each request's TTFT and E2E.
`data/vllm-h100/stages.csv` is one (its README says what each column is). Required columns:
stage, model, gpu, num_gpus, engine, max_num_seqs, max_num_batched_tokens, arrival,
duration_s, prompt_len_p50, output_len, ttft_mean_ms, e2e_mean_ms, source; `rate_req_s` for
the open-loop arrivals (constant, poisson), `concurrency` for a closed loop. `model` is a
bundled preset or a config.json path, `gpu` a catalog id or a GPU file (paths relative to
the table's folder).

Each stage is simulated like for like (`simulate_stage`): the stage's deployment
(`stage_deployment`, through `bstar.deployment.DeploymentOptions`), its scheduler
(max_num_seqs, max_num_batched_tokens), its arrival process at its rate (constant: fixed
gaps of 1/rate, as inference-perf's constant load sends; poisson: exponential gaps), its
prompt lengths drawn from the table's percentiles (`draw_prompt_lengths`: the
piecewise-linear inverse CDF through min, p10, p25, p50, p75, p90, p99 and max) and its
fixed output length (`ignore_eos`), the shared system prompt as prefix-cache hits
(`shared_prefix_len`; vLLM V1 caches prefixes by default). Every step is priced by
`bstar.step.price` through the simulator. To stay fast, a stage is simulated for at most
MAX_WINDOW_S seconds of arrivals (and MAX_REQUESTS requests); the first WARMUP_FRACTION of
the requests (an empty server's warm-up) are left out of the figures.

Scored per stage: the means of E2E, TTFT and the time per output token (E2E - TTFT) /
(output_len - 1), |predicted / measured - 1|, and the saturation state (`saturation_state`):

- TTFT growth g = (TTFT p90 - TTFT p50) / (0.4 x window): under a queue that grows through
  the stage, a request arriving at time t waits about g x t with g = rate / capacity - 1, so
  TTFT is uniform over the window and its p90 and p50 lie 0.4 x g x window apart. A steady
  server's TTFT does not grow: g is ~0 (1e-5 on the shared stages).
- "queue growing" when g > GROWTH_LIMIT (the server serves under ~98% of what is offered) or
  more than FAILED_LIMIT of the requests failed (timed out: the client gave up on a queue);
  else "steady": what the measured row shows (`measured_state`, from its TTFT p50, p90,
  duration and failures). The simulation has every request's wait, so its state
  (`predicted_state`) is `bstar.sim.capacity.queue_grows`, the one definition `bstar
  simulate` and `bstar search` use: the slope of the wait against arrival time over the
  second half of the arrivals, above the same GROWTH_LIMIT (or a run cut off at its time
  limit). Its g from the percentiles is reported beside it.

The latency errors are aggregated over the stages the data measure as steady: an overloaded
stage's TTFT and E2E are set by how long it ran and by the client's timeout, not by the
server's speed. Overloaded stages are scored on their state (and show their growth).

Per GPU x engine (`score_stages`), three ways: generic (the default efficiencies), profile
(the engine's bundled profile, or `engine=`), and leave one model out (`fit_stages`: the
parameters in `fit` fitted by `bstar.calibrate.fit_efficiency` to the OTHER models' steady
stages, from the generic defaults, in log space over their E2E, TTFT and per-token means,
each simulated for at most FIT_WINDOW_S; then predicting the stages of the model left out).

For a loop over candidate efficiencies (a profile fit): `load_stages(path)` once, then
`evaluate(stages, eff)` -> (per-stage `StageScore`s, `Summary`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bstar import roofline as rl
from bstar.errors import BstarError
from bstar.fit.points import read_columns
from bstar.sim.capacity import GROWTH_SLOPE

if TYPE_CHECKING:
    from bstar.sim.traffic import Workload

REQUIRED = ("stage", "model", "gpu", "num_gpus", "engine", "max_num_seqs",
            "max_num_batched_tokens", "arrival", "duration_s", "prompt_len_p50",
            "output_len", "ttft_mean_ms", "e2e_mean_ms", "source")
# Every column, in the order bench/to_stages.py writes them.
COLUMNS = ("stage", "model", "gpu", "num_gpus", "engine", "engine_version", "dtype",
           "max_num_seqs", "max_num_batched_tokens", "max_model_len", "arrival", "rate_req_s",
           "concurrency", "duration_s", "prompt_len_min", "prompt_len_p10", "prompt_len_p25",
           "prompt_len_p50", "prompt_len_p75", "prompt_len_p90", "prompt_len_p99",
           "prompt_len_max", "shared_prefix_len", "distinct_prompts", "output_len",
           "ignore_eos", "requests_sent", "requests_ok", "requests_failed", "ttft_mean_ms",
           "ttft_p50_ms", "ttft_p90_ms", "e2e_mean_ms", "e2e_p50_ms", "e2e_p90_ms", "tpot_mean_ms",
           "tpot_p90_ms", "output_tok_s", "source", "note")
ARRIVALS = ("constant", "poisson", "concurrency")
# The prompt-length percentiles a table may give, as quantiles (min and max: 0 and 1).
PROMPT_QUANTILES = (("prompt_len_min", 0.0), ("prompt_len_p10", 0.10),
                    ("prompt_len_p25", 0.25), ("prompt_len_p50", 0.50),
                    ("prompt_len_p75", 0.75), ("prompt_len_p90", 0.90),
                    ("prompt_len_p99", 0.99), ("prompt_len_max", 1.0))
METRICS = ("e2e_mean_ms", "ttft_mean_ms", "tpot_mean_ms")

# How much of a stage is simulated: the whole table (12 stages) in ~15 s on one core.
MAX_WINDOW_S = 150.0  # seconds of arrivals (the measured stages ran 600-1200 s)
MAX_REQUESTS = 4000
WARMUP_FRACTION = 0.1  # the first requests meet an empty server: left out of the figures
FIT_WINDOW_S = 40.0  # per stage and evaluation, inside a leave-one-model-out fit
FIT_ITERATIONS = 3
# Saturation (module docstring).
GROWTH_LIMIT = GROWTH_SLOPE  # 0.02 s of wait per s of arrivals: the capacity's definition
FAILED_LIMIT = 0.01
STEADY, GROWING = "steady", "queue growing"
# What a stage's leave-one-model-out fit calibrates (and what bench/accuracy.py
# --fit-profiles fits the vllm profile's terms to): the KV stream of the engine's attention,
# its CPU time per step and its fixed work per request. The all-reduce latency and the time
# per running sequence stay stated guesses: one TP-1 and one TP-2 model cannot tell a
# per-step cost from a per-all-reduce one, nor the per-sequence cost from the KV stream
# (fitted with them, `--fit` drives terms to their bounds: docs/cost-model.md).
DEFAULT_FIT = ("kv_bandwidth", "overhead_s", "request_overhead_s")


def is_stages_table(header: Sequence[str]) -> bool:
    return "arrival" in header and "duration_s" in header


# ---- the table --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Stage:
    """One measured load stage (times in ms, as the table gives them)."""

    stage: str
    model: str
    gpu: str
    num_gpus: int
    engine: str
    max_num_seqs: int
    max_num_batched_tokens: int
    arrival: str
    duration_s: float
    prompt_len: tuple[tuple[float, float], ...]  # (quantile, tokens), quantile ascending
    output_len: int
    ttft_mean_ms: float
    e2e_mean_ms: float
    source: str
    rate_req_s: float | None = None
    concurrency: int | None = None
    engine_version: str = ""
    dtype: str = ""
    max_model_len: int = 0
    shared_prefix_len: int = 0
    # The workload repeats this many prompts in turn (0: every prompt is new): after the
    # first round each request finds its whole prompt in the prefix cache.
    distinct_prompts: int = 0
    ignore_eos: bool = True
    requests_sent: int = 0
    requests_ok: int = 0
    requests_failed: int = 0
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p90_ms: float | None = None
    tpot_mean_ms: float = 0.0  # (E2E mean - TTFT mean) / (output_len - 1) when not given
    tpot_p90_ms: float | None = None
    output_tok_s: float | None = None
    where: str = ""
    base_dir: str = ""

    @property
    def group(self) -> tuple[str, str]:
        return (self.gpu, self.engine)

    @property
    def label(self) -> str:
        load = (f"{self.rate_req_s:g} req/s" if self.rate_req_s is not None
                else f"{self.concurrency} users")
        return f"{self.stage} ({load})"

    @property
    def failed_fraction(self) -> float:
        sent = self.requests_sent or self.requests_ok + self.requests_failed
        return self.requests_failed / sent if sent else 0.0

    def measured(self) -> dict[str, float]:
        return {"e2e_mean_ms": self.e2e_mean_ms, "ttft_mean_ms": self.ttft_mean_ms,
                "tpot_mean_ms": self.tpot_mean_ms}


def _cell(r: Mapping[str, str], k: str) -> str:
    return (r.get(k) or "").strip()


def _float(r: Mapping[str, str], k: str, at: str, required: bool = False,
           positive: bool = True) -> float | None:
    v = _cell(r, k).replace(",", "")
    if not v:
        if required:
            raise BstarError(f"{at}: {k} is required")
        return None
    try:
        x = float(v)
    except ValueError:
        raise BstarError(f"{at}: {k} {v!r} is not a number") from None
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        raise BstarError(f"{at}: {k} must be {'positive' if positive else '>= 0'}, got {v}")
    return x


def _int(r: Mapping[str, str], k: str, at: str, required: bool = False,
         minimum: int = 1) -> int | None:
    v = _cell(r, k)
    if not v:
        if required:
            raise BstarError(f"{at}: {k} is required")
        return None
    try:
        n = int(float(v)) if float(v).is_integer() else None
    except ValueError:
        n = None
    if n is None:
        raise BstarError(f"{at}: {k} {v!r} is not an integer")
    if n < minimum:
        raise BstarError(f"{at}: {k} must be >= {minimum}, got {n}")
    return n


def stages_from_csv(text: str, where: str = "table", base_dir: Path | None = None
                    ) -> list[Stage]:
    """Parse a stages table (header row; lines starting with # are comments)."""
    table = read_columns(text, where, REQUIRED, COLUMNS)
    out = []
    for cells, at in table.rows():
        r = {h: (c or "").strip() for h, c in cells.items()}
        arrival = r["arrival"].lower()
        if arrival not in ARRIVALS:
            raise BstarError(f"{at}: arrival {r['arrival']!r} is not one of "
                             f"{', '.join(ARRIVALS)}")
        rate = _float(r, "rate_req_s", at)
        users = _int(r, "concurrency", at)
        if arrival == "concurrency" and users is None:
            raise BstarError(f"{at}: a closed loop (arrival concurrency) needs concurrency")
        if arrival != "concurrency" and rate is None:
            raise BstarError(f"{at}: arrival {arrival} needs rate_req_s")
        if not r["source"]:
            raise BstarError(f"{at}: every row needs its source")
        quant = []
        for k, q in PROMPT_QUANTILES:
            x = _float(r, k, at, required=k == "prompt_len_p50")
            if x is not None:
                quant.append((q, x))
        tokens = [x for _, x in quant]
        if any(b < a for a, b in pairwise(tokens)):
            raise BstarError(f"{at}: the prompt-length percentiles must not decrease")
        output_len = _int(r, "output_len", at, required=True)
        assert output_len is not None
        ttft = _float(r, "ttft_mean_ms", at, required=True)
        e2e = _float(r, "e2e_mean_ms", at, required=True)
        assert ttft is not None and e2e is not None
        tpot = _float(r, "tpot_mean_ms", at)
        if tpot is None and output_len > 1:
            tpot = (e2e - ttft) / (output_len - 1)
        eos = _cell(r, "ignore_eos").lower()
        if eos not in ("", "true", "false", "1", "0", "yes", "no"):
            raise BstarError(f"{at}: ignore_eos {eos!r} is not true or false")

        def count(k: str, r: dict[str, str] = r, at: str = at) -> int:
            return _int(r, k, at, minimum=0) or 0

        duration = _float(r, "duration_s", at, required=True)
        assert duration is not None
        out.append(Stage(
            stage=r["stage"] or at, model=r["model"], gpu=r["gpu"],
            num_gpus=_int(r, "num_gpus", at, required=True) or 1, engine=r["engine"],
            max_num_seqs=_int(r, "max_num_seqs", at, required=True) or 1,
            max_num_batched_tokens=_int(r, "max_num_batched_tokens", at, required=True) or 1,
            arrival=arrival, duration_s=duration, prompt_len=tuple(quant),
            output_len=output_len, ttft_mean_ms=ttft, e2e_mean_ms=e2e, source=r["source"],
            rate_req_s=rate, concurrency=users, engine_version=_cell(r, "engine_version"),
            dtype=_cell(r, "dtype"), max_model_len=count("max_model_len"),
            shared_prefix_len=count("shared_prefix_len"),
            distinct_prompts=count("distinct_prompts"),
            ignore_eos=eos not in ("false", "0", "no"),
            requests_sent=count("requests_sent"), requests_ok=count("requests_ok"),
            requests_failed=count("requests_failed"),
            ttft_p50_ms=_float(r, "ttft_p50_ms", at), ttft_p90_ms=_float(r, "ttft_p90_ms", at),
            e2e_p50_ms=_float(r, "e2e_p50_ms", at), e2e_p90_ms=_float(r, "e2e_p90_ms", at),
            tpot_mean_ms=tpot or 0.0, tpot_p90_ms=_float(r, "tpot_p90_ms", at),
            output_tok_s=_float(r, "output_tok_s", at), where=at,
            base_dir=str(base_dir) if base_dir else ""))
    if not out:
        raise BstarError(f"{where}: no rows")
    return out


def load_stages(path: str | Path) -> list[Stage]:
    """Read a stages table from a file (paths in it are relative to its folder)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BstarError(f"{p}: cannot read: {e}") from None
    return stages_from_csv(text, str(p), p.resolve().parent)


# ---- one stage's workload and simulation -------------------------------------------------
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
    `prefix_cache`, every prompt's first `shared_prefix_len` tokens are prefix-cache hits
    (`Workload.cached_tokens`; whole blocks, as vLLM's cache: the shared system prompts of a
    stage stay cached once its first requests have run), and where the workload repeats
    `distinct_prompts` prompts in turn, every repeat is a hit on its whole prompt."""
    from bstar.sim.traffic import Workload

    rng = np.random.default_rng(seed)
    k = stage.distinct_prompts
    if k:  # the same k prompts in turn: draw their lengths once
        inp = np.resize(draw_prompt_lengths(stage, rng, k), num_requests)
    else:
        inp = draw_prompt_lengths(stage, rng, num_requests)
    out = np.full(num_requests, stage.output_len, dtype=np.int64)
    cached = None
    if prefix_cache and (stage.shared_prefix_len or k):
        cached = np.minimum(inp, stage.shared_prefix_len)
        if k:  # a repeated prompt is a hit whole (the engine computes its last block)
            cached[k:] = inp[k:]
    if stage.arrival == "concurrency":
        assert stage.concurrency is not None
        return Workload(inp, out, None, stage.concurrency, np.zeros(num_requests),
                        cached_tokens=cached)
    assert stage.rate_req_s is not None
    if stage.arrival == "constant":
        arrival = np.arange(num_requests, dtype=np.float64) / stage.rate_req_s
    else:
        arrival = np.cumsum(rng.exponential(1.0 / stage.rate_req_s, size=num_requests))
    return Workload(inp, out, arrival, cached_tokens=cached)


_DTYPES = {"fp16": "fp16", "bf16": "bf16", "fp8": "fp8", "fp32": "fp32", "int4": "int4",
           "int8": "int8", "float16": "fp16", "bfloat16": "bf16"}
_DEPLOYMENTS: dict[tuple[Any, ...], rl.Deployment] = {}


def _resolve(name: str, base_dir: str) -> str:
    is_path = name.endswith((".json", ".toml")) or name.startswith((".", "/"))
    if is_path and base_dir and not Path(name).is_absolute():
        return str(Path(base_dir) / name)
    return name


def stage_deployment(stage: Stage, engine: str | None = None,
                     eff: rl.Efficiency | None = None) -> rl.Deployment:
    """The stage's deployment: its model, GPU, TP and dtype with the engine profile `engine`
    (default: the stage's own engine), through `DeploymentOptions` (vLLM's memory defaults:
    gpu_util 0.9); `eff` replaces the profile's efficiencies. Built once per setting."""
    from bstar.deployment import DeploymentOptions

    dtype = _DTYPES.get(stage.dtype.lower(), "")
    opts = DeploymentOptions(model=_resolve(stage.model, stage.base_dir),
                             gpu=_resolve(stage.gpu, stage.base_dir), num_gpus=stage.num_gpus,
                             weight_dtype=dtype,
                             kv_dtype=dtype if dtype in ("fp16", "bf16", "fp32") else "bf16",
                             engine=stage.engine if engine is None else engine)
    key = tuple(opts.to_dict().values())
    d = _DEPLOYMENTS.get(key)
    if d is None:
        d = _DEPLOYMENTS[key] = opts.build()
    return d if eff is None else d.with_eff(eff)


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


def capacity_req_s(rate_req_s: float | None, growth: float | None,
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




def simulate_stage(stage: Stage, eff: rl.Efficiency | None = None, *,
                   engine: str | None = None, deployment: rl.Deployment | None = None,
                   max_window_s: float = MAX_WINDOW_S, max_requests: int = MAX_REQUESTS,
                   seed: int = 0, prefix_cache: bool = True) -> StagePrediction:
    """Simulate one stage like for like (module docstring). The deployment is
    `deployment` if given, else `stage_deployment(stage, engine, eff)`."""
    from bstar.sim import SchedulerConfig, SimConfig, simulate
    from bstar.sim.metrics import percentiles

    d = deployment if deployment is not None else stage_deployment(stage, engine, eff)
    n = stage_requests(stage, max_window_s, max_requests)
    w = stage_workload(stage, n, seed, prefix_cache)
    cfg = SimConfig(SchedulerConfig(stage.max_num_seqs, stage.max_num_batched_tokens))
    run = simulate(d, cfg, w)
    r = run.requests
    skip = int(n * WARMUP_FRACTION) if n >= 10 else 0
    keep = np.zeros(n, dtype=bool)
    keep[np.argsort(r.arrival_s, kind="stable")[skip:]] = True
    keep &= r.done
    arrival, first, finish = r.arrival_s[keep], r.first_token_s[keep], r.finish_s[keep]
    out_tok = r.output_tokens[keep]
    ttft, e2e = first - arrival, finish - arrival
    multi = out_tok > 1
    tpot = (e2e[multi] - ttft[multi]) / (out_tok[multi] - 1)
    t, e, p = percentiles(ttft * 1e3), percentiles(e2e * 1e3), percentiles(tpot * 1e3)
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


def predicted_state(run: Any) -> str:
    """The simulated state: "queue growing" when `bstar.sim.capacity.queue_grows` (the
    wait's slope against arrival time over the second half of the arrivals, above the same
    0.02 s per s: the one definition `bstar simulate` and `bstar search` use) or when the
    run was cut off at its time limit; else "steady"."""
    from bstar.sim.capacity import queue_grows

    if run.workload.closed_loop:
        return GROWING if run.truncated else STEADY
    return GROWING if run.truncated or queue_grows(run) else STEADY


# ---- scoring -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StageScore:
    """One stage under one set of efficiencies: its prediction and errors."""

    stage: Stage
    prediction: StagePrediction
    errors: dict[str, float]  # metric -> predicted / measured - 1
    measured_state: str

    @property
    def state_right(self) -> bool:
        return self.prediction.state == self.measured_state

    @property
    def latency_scored(self) -> bool:
        """Whether its latency errors count in the aggregates: measured steady."""
        return self.measured_state == STEADY

    def to_dict(self) -> dict[str, Any]:
        p = self.prediction
        return {**p.to_dict(), "errors": self.errors, "state_right": self.state_right,
                "capacity_req_s": capacity_req_s(self.stage.rate_req_s, p.ttft_growth,
                                                 p.state)}


def score_stage(stage: Stage, prediction: StagePrediction) -> StageScore:
    meas = stage.measured()
    pv = prediction.values()
    errors = {k: pv[k] / v - 1.0 for k, v in meas.items()
              if v > 0 and math.isfinite(pv[k])}
    return StageScore(stage, prediction, errors, measured_state(stage))


def _mean(x: Sequence[float]) -> float | None:
    return float(np.mean(np.abs(x))) if len(x) else None


def _median(x: Sequence[float]) -> float | None:
    return float(np.median(np.abs(x))) if len(x) else None


@dataclass(frozen=True, slots=True)
class Summary:
    """Aggregates of one way of predicting over a set of stages: mean and median of
    |predicted / measured - 1| per metric over the measured-steady stages, and how many
    saturation states the prediction got right (of all stages)."""

    stages: int
    latency_stages: int
    mean_abs: dict[str, float | None]
    median_abs: dict[str, float | None]
    states_right: int
    wrong_states: tuple[str, ...]  # stage names

    def to_dict(self) -> dict[str, Any]:
        return {"stages": self.stages, "latency_stages": self.latency_stages,
                **{k: {"mean": self.mean_abs[k], "median": self.median_abs[k]}
                   for k in METRICS},
                "states_right": self.states_right, "states_total": self.stages,
                "wrong_states": list(self.wrong_states)}


def summarize_scores(scores: Sequence[StageScore]) -> Summary:
    errs: dict[str, list[float]] = {k: [] for k in METRICS}
    lat = [s for s in scores if s.latency_scored]
    for s in lat:
        for k, v in s.errors.items():
            errs[k].append(v)
    return Summary(len(scores), len(lat), {k: _mean(v) for k, v in errs.items()},
                   {k: _median(v) for k, v in errs.items()},
                   sum(s.state_right for s in scores),
                   tuple(s.stage.stage for s in scores if not s.state_right))


def evaluate(stages: Sequence[Stage], eff: rl.Efficiency | None = None, *,
             engine: str | None = None, max_window_s: float = MAX_WINDOW_S,
             max_requests: int = MAX_REQUESTS, seed: int = 0
             ) -> tuple[list[StageScore], Summary]:
    """Every stage simulated at `eff` (None: the engine profile's, `engine` or the stage's)
    and scored: the call for a loop over candidate efficiencies."""
    scores = [score_stage(s, simulate_stage(s, eff, engine=engine, max_window_s=max_window_s,
                                            max_requests=max_requests, seed=seed))
              for s in stages]
    return scores, summarize_scores(scores)


def _with_values(prior: rl.Efficiency, values: Mapping[str, float]) -> rl.Efficiency:
    """`prior` with `values`; a stream or rate not given follows its lead at the prior's
    ratio, as in bstar.calibrate.fit_efficiency (kv_bandwidth follows bandwidth)."""
    from bstar.calibrate import _FOLLOWS

    out = dict(values)
    for k, lead in _FOLLOWS.items():
        if lead in values and k not in values:
            out[k] = min(getattr(prior, k) * values[lead] / getattr(prior, lead), 1.0)
    return replace(prior, **out)


def _monotone(slope: np.ndarray, pairs: Sequence[tuple[int, str, float]]) -> np.ndarray:
    """A parameter that makes a step cost more makes every latency of a stage longer: a
    mean moving against its stage's per-token time (E2E when there is none) moves by the
    phase of arrivals against step ends, not by the parameter, and its slope is set to 0
    (a 0.2 ms wobble of a 15 ms TTFT outweighed E2E's true slope in a robust fit)."""
    out = slope.copy()
    ref: dict[int, float] = {}
    for j, (i, k, _) in enumerate(pairs):
        if k == "tpot_mean_ms" or (k == "e2e_mean_ms" and i not in ref):
            ref[i] = float(slope[j])
    for j, (i, _, _) in enumerate(pairs):
        if out[j] * ref.get(i, 0.0) < 0:
            out[j] = 0.0
    return out


def fit_stages(stages: Sequence[Stage], prior: rl.Efficiency, fit: Sequence[str],
               max_window_s: float = FIT_WINDOW_S, seed: int = 0,
               iterations: int = FIT_ITERATIONS) -> rl.Efficiency | None:
    """The parameters `fit` fitted to the stages' measured E2E, TTFT and per-token means
    (the measured-steady stages), each stage simulated for at most `max_window_s`. None when
    they cannot determine them.

    A simulation costs ~0.3 s a stage, too much for a least-squares fit that calls it a few
    hundred times, so the fit runs on a surrogate refreshed by simulation (Gauss-Newton with
    a line search): around the current values every predicted mean is log-linear in the
    parameters, with slopes from one simulation per parameter (a 10% step; a slope against
    the stage's per-token time is noise, set to 0: `_monotone`);
    bstar.calibrate.fit_efficiency (log space, robust, bounded) fits the parameters to the
    measurements through that surrogate; the simulation at the result is kept if its robust
    cost is lower (else the step is halved, twice at most); `iterations` times. About
    (len(fit) + 2) x iterations simulations of each stage."""
    from bstar.calibrate import _SCALE, _UPPER, ROBUST_SCALE, fit_efficiency

    steady = [s for s in stages if measured_state(s) == STEADY]
    fit = tuple(k for k in dict.fromkeys(fit) if k != "allreduce_latency_s"
                or any(s.num_gpus > 1 for s in steady))
    pairs = [(i, k, v) for i, s in enumerate(steady) for k, v in s.measured().items()
             if v > 0]
    if not fit or len(pairs) < len(fit) + 1:
        return None
    base = {i: stage_deployment(s) for i, s in enumerate(steady)}
    log_meas = np.log([v for _, _, v in pairs])

    def simulate_at(values: Mapping[str, float]) -> np.ndarray:
        """log of the predicted means, aligned with `pairs`."""
        e = _with_values(prior, values)
        preds = {i: simulate_stage(s, deployment=base[i].with_eff(e),
                                   max_window_s=max_window_s, seed=seed).values()
                 for i, s in enumerate(steady)}
        y = np.array([preds[i][k] for i, k, _ in pairs])
        return np.log(np.where(np.isfinite(y) & (y > 0), y, 1e9))

    def cost(log_y: np.ndarray) -> float:  # least_squares' soft_l1 at fit_efficiency's scale
        z = ((log_y - log_meas) / ROBUST_SCALE) ** 2
        return float(np.sum(2.0 * (np.sqrt(1.0 + z) - 1.0)))

    x = {k: float(getattr(prior, k)) for k in fit}
    y = simulate_at(x)
    c = cost(y)
    for _ in range(iterations):
        slopes = {}
        for k in fit:
            h = 0.1 * x[k] if x[k] > 0 else 0.1 * _SCALE[k]
            if x[k] + h > _UPPER.get(k, math.inf):
                h = -h
            slopes[k] = _monotone((simulate_at({**x, k: x[k] + h}) - y) / h, pairs)
        x0, y0 = dict(x), y

        def surrogate(v: Mapping[str, float], x0: dict[str, float] = x0,
                      y0: np.ndarray = y0,
                      slopes: dict[str, np.ndarray] = slopes) -> np.ndarray:
            return np.exp(y0 + sum(slopes[k] * (v[k] - x0[k]) for k in fit))

        new = fit_efficiency(surrogate, np.exp(log_meas), _with_values(prior, x0), fit).eff
        step = {k: float(getattr(new, k)) - x0[k] for k in fit}
        for shrink in (1.0, 0.5, 0.25):
            trial = {k: x0[k] + shrink * step[k] for k in fit}
            y_trial = simulate_at(trial)
            if cost(y_trial) < c:
                x, y, c = trial, y_trial, cost(y_trial)
                break
        else:
            break  # no step lowers the simulated cost: done
        if all(abs(step[k]) <= 0.01 * max(abs(x0[k]), 1e-12) for k in fit):
            break
    return _with_values(prior, x)


@dataclass
class StagesGroup:
    """One GPU x engine: per-stage scores and summaries, generic / profile / LOMO."""

    gpu: str
    engine: str
    profile: str | None
    profile_basis: str | None
    fit: tuple[str, ...]
    models: list[str]
    scores: dict[str, list[StageScore]]  # "generic", "profile", "lomo" -> one per stage
    summaries: dict[str, Summary]
    lomo_eff: dict[str, dict[str, float]]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        stages = []
        by_way = {way: {id(sc.stage): sc for sc in ss} for way, ss in self.scores.items()}
        for sc in self.scores["generic"]:
            s = sc.stage
            stages.append({
                "stage": s.stage, "model": s.model, "num_gpus": s.num_gpus,
                "arrival": s.arrival, "rate_req_s": s.rate_req_s,
                "concurrency": s.concurrency, "duration_s": s.duration_s,
                "output_len": s.output_len,
                "measured": {**s.measured(), "ttft_p90_ms": s.ttft_p90_ms,
                             "e2e_p90_ms": s.e2e_p90_ms, "requests_failed": s.requests_failed,
                             "ttft_growth": measured_growth(s), "state": sc.measured_state,
                             "capacity_req_s": capacity_req_s(
                                 s.rate_req_s, measured_growth(s), sc.measured_state)},
                "latency_scored": sc.latency_scored,
                "predicted": {way: (m[id(s)].to_dict() if id(s) in m else None)
                              for way, m in by_way.items()}})
        return {"gpu": self.gpu, "engine": self.engine, "profile": self.profile,
                "profile_basis": self.profile_basis, "fit": list(self.fit),
                "models": self.models,
                "summary": {k: v.to_dict() for k, v in self.summaries.items()},
                "stages": stages, "lomo_eff": self.lomo_eff, "notes": self.notes}


@dataclass
class StagesValidation:
    groups: list[StagesGroup]
    skipped: list[dict[str, str]]
    settings: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "stages", "settings": self.settings,
                "groups": [g.to_dict() for g in self.groups], "skipped": self.skipped}


def score_stages(stages: Sequence[Stage], fit: Sequence[str] = DEFAULT_FIT, *,
                 engine: str | None = None, lomo: bool = True,
                 max_window_s: float = MAX_WINDOW_S, max_requests: int = MAX_REQUESTS,
                 fit_window_s: float = FIT_WINDOW_S, seed: int = 0,
                 progress: Callable[[str], None] | None = None) -> StagesValidation:
    """Every stage scored per GPU x engine: generic, profile (`engine`, else each group's own)
    and, with `lomo` and two models or more, leave one model out (fitting `fit`)."""
    from bstar.engines import get_engine

    generic = rl.Efficiency()
    usable, skipped, seen = [], [], set()
    for s in stages:
        try:
            stage_deployment(s, engine)
        except BstarError as e:
            if (s.model, s.gpu, str(e)) not in seen:
                skipped.append({"stage": s.stage, "model": s.model, "gpu": s.gpu,
                                "reason": str(e)})
                seen.add((s.model, s.gpu, str(e)))
            continue
        usable.append(s)
    by_group: dict[tuple[str, str], list[Stage]] = defaultdict(list)
    for s in usable:
        by_group[s.group].append(s)
    kw = {"max_window_s": max_window_s, "max_requests": max_requests, "seed": seed}
    groups = []
    for (gpu, eng), ss in by_group.items():
        notes: list[str] = []
        prof = get_engine(engine or eng)
        prof_eff = prof.efficiency()
        if progress:
            progress(f"{gpu} x {eng}: generic and {prof.name} profile, {len(ss)} stages")
        preds: dict[rl.Efficiency, list[StageScore]] = {}
        scores: dict[str, list[StageScore]] = {}
        for way, e in (("generic", generic), ("profile", prof_eff)):
            if e not in preds:  # the vllm profile is the generic defaults: simulated once
                preds[e] = [score_stage(s, simulate_stage(s, e, engine=engine, **kw))
                            for s in ss]
            scores[way] = preds[e]
        models = sorted({s.model for s in ss})
        lomo_eff: dict[str, dict[str, float]] = {}
        if lomo and len(models) > 1:
            held: list[StageScore] = []
            # The engine's structure (its scheduling lag, per-layer costs) is kept; the terms
            # fitted start from the generic defaults, so the held-out model's data are in none.
            start = replace(prof_eff, **{k: getattr(generic, k) for k in fit})
            for m in models:
                if progress:
                    progress(f"{gpu} x {eng}: fitting {', '.join(fit)} without {m}")
                train = [s for s in ss if s.model != m]
                e = fit_stages(train, start, fit, fit_window_s, seed)
                if e is None:
                    notes.append(f"{m}: the other models' steady stages cannot determine "
                                 f"{', '.join(fit)}")
                    continue
                lomo_eff[m] = {k: getattr(e, k) for k in fit}
                held += [score_stage(s, simulate_stage(s, e, engine=engine, **kw))
                         for s in ss if s.model == m]
            order = {id(s): i for i, s in enumerate(ss)}
            scores["lomo"] = sorted(held, key=lambda sc: order[id(sc.stage)])
        elif lomo:
            notes.append("one model: no leave-one-model-out figure")
        if prof.basis == "fitted":
            notes.append(f"the {prof.name} profile is fitted: where it was fitted to these "
                         "stages, its figure is in-sample")
        groups.append(StagesGroup(gpu, eng, prof.name, prof.basis, tuple(fit), models, scores,
                                  {k: summarize_scores(v) for k, v in scores.items()},
                                  lomo_eff, notes))
    settings = {"max_window_s": max_window_s, "max_requests": max_requests,
                "warmup_fraction": WARMUP_FRACTION, "fit_window_s": fit_window_s,
                "fit_iterations": FIT_ITERATIONS,
                "seed": seed, "growth_limit": GROWTH_LIMIT, "failed_limit": FAILED_LIMIT}
    return StagesValidation(groups, skipped, settings)
