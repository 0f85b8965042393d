"""A disaggregated deployment (xPyD) as one object, and its plan. No I/O beyond building
each side's deployment from its names (`DeploymentOptions.build`).

P prefill workers and D decode workers, each a tensor-parallel instance of its own GPU, TP,
EP and attention-DP sizes and engine limits (`WorkerSpec`). A request is prefilled on one
prefill worker, its KV crosses the link to one decode worker (bstar.kv_link), and that
worker decodes it. docs/disaggregation.md walks through the arithmetic; in short:

    prefill step       the step of the prompts one prefill step holds (max_num_seqs and the
                       token budget max_num_batched_tokens; a longer prompt is chunked),
                       priced by bstar.step
    mu_p               prefill requests/s per prefill worker = prompts per step / step time
    decode batch S     min(max_num_seqs, B_mem) per decode worker (max_num_seqs unset: the
                       aggregated plan's recommendation at the request's full context)
    TPOT(b)            the decode step at b sequences of prompt + output/2 tokens
    mu_d(b)            decode requests/s per decode worker = b / (output x TPOT(b))
    P:D ratio          mu_d(S) / mu_p: prefill workers per decode worker that balance them
    TTFT               the engine's request overhead (EngineBehaviour) + prefill queue +
                       prefill + KV transfer + first decode step (+ the wait for a
                       decode slot when every slot is full)
    TPOT               the decode side's, at the batch the load gives

At a load (`--concurrency` users in a closed loop, or `--rate` requests/s) the operating
point is the throughput X whose requests in flight match it (Little's law over the whole
loop, `operating_point`): the decode batch b(X) solves D b = X x output x TPOT(b), and the
prefill queue is an M/D/1 queue at utilization X / (P mu_p). Past a side's capacity the
extra requests wait in front of that side.

Each side is priced with bstar.step at its tensor-parallel size. Expert parallel and
attention data parallel are carried on `WorkerSpec` and passed to the deployment when it has
the fields for them; until then a side is priced as tensor parallel and says so
(`priced_as`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from bstar import roofline as rl
from bstar import specdec as sd
from bstar import step as _step
from bstar.deployment import Deployment
from bstar.disagg_load import OperatingPoint, operating_point
from bstar.errors import BstarError
from bstar.kv_link import LINK_KINDS, KvTransfer, default_link_kind, kv_link, kv_transfer
from bstar.options import DeploymentOptions
from bstar.specdec import SpecConfig

__all__ = ["DEFAULT_PREFILL_BUDGET", "DecodeSide", "DisaggPlan", "DisaggregatedDeployment",
           "OperatingPoint", "PrefillSide", "WorkerSpec", "decode_side", "operating_point",
           "plan_disaggregated", "prefill_side", "side_deployment"]  # the load: disagg_load

# SGLang's --max-prefill-tokens in the public Dynamo recipes (16384 is its own default):
# the prefill step's token budget when a side gives none.
DEFAULT_PREFILL_BUDGET = 8192
MAX_WORKERS = 4096  # workers of a side, and a worker's TP, EP and DP sizes
MAX_LIMIT = 1 << 24  # an engine limit (sequences, tokens) past this is a typo
SIDES = ("prefill", "decode")


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """One side's workers: how many, each one's parallel layout and engine limits.

    - `workers`: instances of this side; `tp`: each one's tensor-parallel size (its GPUs);
      `ep`: expert-parallel size; `dp`: attention data-parallel size (SGLang's
      --dp-size with --enable-dp-attention; TensorRT-LLM's enable_attention_dp: dp = tp).
    - `max_num_seqs`, `max_num_batched_tokens`: the engine's limits per worker (None: a
      prefill side's budget is DEFAULT_PREFILL_BUDGET; a decode side's cap is the plan's
      recommendation).
    - `gpu`, `gpu_util`: this side's GPU and memory fraction (None: the deployment's).
    """

    workers: int = 1
    tp: int = 1
    ep: int = 1
    dp: int = 1
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu: str | None = None
    gpu_util: float | None = None

    def __post_init__(self) -> None:
        for name in ("workers", "tp", "ep", "dp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise BstarError(f"{name} must be a positive integer, got {v!r}")
            if v > MAX_WORKERS:
                raise BstarError(f"{name} must be at most {MAX_WORKERS}, got {v}")
        if self.tp % self.dp:
            raise BstarError(f"attention DP size {self.dp} must divide the TP size {self.tp}")
        if self.ep > self.tp:
            raise BstarError(f"expert-parallel size {self.ep} is larger than the worker's "
                             f"{self.tp} GPUs")
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)
                                  or not 1 <= v <= MAX_LIMIT):
                raise BstarError(f"{name} must be an integer in 1..{MAX_LIMIT:,}, got {v!r}")

    @property
    def num_gpus(self) -> int:
        """GPUs of this side, all workers together."""
        return self.workers * self.tp

    @property
    def attention_tp(self) -> int:
        """Ways each sequence's attention (and KV) is sharded: TP / attention DP."""
        return self.tp // self.dp

    def to_dict(self) -> dict[str, Any]:
        return {"workers": self.workers, "tp": self.tp, "ep": self.ep, "dp": self.dp,
                "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "gpu": self.gpu, "gpu_util": self.gpu_util}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> WorkerSpec:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise BstarError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: "
                             f"{', '.join(sorted(known))}")
        try:
            return cls(**data)
        except TypeError as e:
            raise BstarError(f"{where}: {e}") from None


@dataclass(frozen=True, slots=True)
class DisaggregatedDeployment:
    """P prefill workers and D decode workers of one model, and the link between them.
    `options` names the model, engine, dtypes and efficiencies both sides share (its
    num_gpus is not used: each side has its own TP)."""

    options: DeploymentOptions
    prefill: WorkerSpec
    decode: WorkerSpec
    link: str = ""  # one of kv_link.LINK_KINDS; "": by topology (default_link_kind)
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        if self.link and self.link not in LINK_KINDS:
            raise BstarError(f"unknown KV link {self.link!r}; one of {', '.join(LINK_KINDS)}")
        if self.gpus_per_node < 1:
            raise BstarError(f"gpus_per_node must be positive, got {self.gpus_per_node}")

    @property
    def num_gpus(self) -> int:
        return self.prefill.num_gpus + self.decode.num_gpus

    def side(self, name: str) -> WorkerSpec:
        return self.prefill if name == "prefill" else self.decode

    def to_dict(self) -> dict[str, Any]:
        return {"prefill": self.prefill.to_dict(), "decode": self.decode.to_dict(),
                "link": self.link, "gpus_per_node": self.gpus_per_node}

    @classmethod
    def from_mapping(cls, data: dict[str, Any], options: DeploymentOptions,
                     where: str) -> DisaggregatedDeployment:
        """From a deployment file's tables (docs/disaggregation.md, "A deployment file"):
        `[prefill]` and `[decode]` (WorkerSpec's keys), top-level `link`, `gpus_per_node`,
        and `model`, `gpu`, `engine`, `kv_dtype`, `dtype` over `options`."""
        top = {"prefill", "decode", "link", "gpus_per_node", "model", "gpu", "engine",
               "kv_dtype", "dtype"}
        unknown = set(data) - top
        if unknown:
            raise BstarError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: "
                             f"{', '.join(sorted(top))}")
        for s in SIDES:
            if not isinstance(data.get(s), dict):
                raise BstarError(f"{where}: needs a [{s}] table")
        over: dict[str, Any] = {}
        for k, f in (("model", "model"), ("gpu", "gpu"), ("engine", "engine"),
                     ("kv_dtype", "kv_dtype"), ("dtype", "weight_dtype")):
            if k in data:
                if not isinstance(data[k], str):
                    raise BstarError(f"{where}: {k} must be a string")
                over[f] = data[k]
        link = data.get("link", "")
        gpn = data.get("gpus_per_node", 8)
        if not isinstance(link, str) or isinstance(gpn, bool) or not isinstance(gpn, int):
            raise BstarError(f"{where}: link must be a string and gpus_per_node an integer")
        return cls(replace(options, **over) if over else options,
                   WorkerSpec.from_dict(data["prefill"], f"{where} [prefill]"),
                   WorkerSpec.from_dict(data["decode"], f"{where} [decode]"), link, gpn)


def side_deployment(options: DeploymentOptions, spec: WorkerSpec) -> tuple[Deployment, str]:
    """One worker of a side as a Deployment, and how it is priced: "tp" (tensor parallel
    over its GPUs) or "tp+ep+dp" where the side runs expert or attention data parallel (the
    step then prices the busiest EP rank, the MoE all-to-all and each DP rank's own KV:
    bstar.parallel, docs/cost-model.md)."""
    o = replace(options, num_gpus=spec.tp, gpu=spec.gpu or options.gpu,
                gpu_util=options.gpu_util if spec.gpu_util is None else spec.gpu_util,
                expert_parallel=spec.ep, data_parallel=spec.dp)
    return o.build(), "tp+ep+dp" if spec.ep > 1 or spec.dp > 1 else "tp"


# ---- the prefill side ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PrefillSide:
    """One prefill worker at a prompt length: what a step holds and what it delivers."""

    prompt_tokens: int
    budget_tokens: int  # the step's token budget (max_num_batched_tokens)
    prompts_per_step: int  # whole prompts one step holds (1 when a prompt is chunked)
    chunks_per_prompt: int
    step_s: float  # a full step (all its prompts; a chunked prompt: all its chunks)
    alone_s: float  # one prompt prefilled on an idle worker
    req_s: float  # prefill requests/s per worker at full steps (mu_p)

    @property
    def tok_s(self) -> float:
        return self.req_s * self.prompt_tokens

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "budget_tokens": self.budget_tokens,
                "prompts_per_step": self.prompts_per_step,
                "chunks_per_prompt": self.chunks_per_prompt, "step_ms": self.step_s * 1e3,
                "prefill_ms": self.alone_s * 1e3, "tok_s_per_worker": self.tok_s,
                "req_s_per_worker": self.req_s}


def _prompt_steps_s(d: Deployment, prompt_tokens: int, budget: int, prompts: int) -> float:
    """Time of the steps that prefill `prompts` prompts of `prompt_tokens` together, chunks
    of at most `budget` tokens each (one prompt when it is longer than the budget)."""
    sh = _step.shape(d)
    if prompt_tokens <= budget:
        return float(_step.price(sh.prefill(prompt_tokens, prompts), d.eff)[0])
    total = 0.0
    for start in range(0, prompt_tokens, budget):
        n = min(budget, prompt_tokens - start)
        total += float(_step.price(sh.scheduled([float(start)], [float(n)]), d.eff)[0])
    return total


def prefill_side(d: Deployment, spec: WorkerSpec, prompt_tokens: int) -> PrefillSide:
    """A prefill worker's full step at `prompt_tokens`: as many whole prompts as the token
    budget and max_num_seqs allow (a longer prompt alone, in chunks of the budget)."""
    budget = spec.max_num_batched_tokens or max(DEFAULT_PREFILL_BUDGET, 1)
    k = max(1, budget // prompt_tokens)
    if spec.max_num_seqs is not None:
        k = min(k, spec.max_num_seqs)
    chunks = max(1, math.ceil(prompt_tokens / budget))
    step_s = _prompt_steps_s(d, prompt_tokens, budget, k)
    alone_s = step_s if k == 1 else _prompt_steps_s(d, prompt_tokens, budget, 1)
    return PrefillSide(prompt_tokens, budget, k, chunks, step_s, alone_s, k / step_s)


# ---- the decode side ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DecodeSide:
    """One decode worker at a prompt/output mix: the batch it holds and its TPOT there."""

    context_tokens: int  # what a sequence holds on average while it decodes
    max_context_tokens: int  # prompt + output: what the pool must hold per sequence
    b_mem: int
    max_num_seqs: int  # the engine's cap (given, or the plan's recommendation)
    cap_source: str  # "given" or "recommendation"
    batch: int  # min(max_num_seqs, b_mem)
    tpot_s: float  # at `batch`
    output_tokens: int
    # TPOT on a grid of batches 1..batch (one vectorized pricing; `tpot_at` interpolates)
    grid_batch: np.ndarray = field(repr=False, compare=False)
    grid_tpot_s: np.ndarray = field(repr=False, compare=False)
    # Speculative decoding on this side (its drafter resolved: "auto" named), or None.
    speculative: SpecConfig | None = None

    def tpot_at(self, batch: float) -> float:
        """TPOT (the decode step) at a mean batch per worker (at least one sequence runs)."""
        return float(np.interp(max(batch, 1.0), self.grid_batch, self.grid_tpot_s))

    def req_s_at(self, batch: float) -> float:
        """Decode requests/s per worker at `batch`: each holds a slot for `output` steps."""
        return batch / (self.output_tokens * self.tpot_at(batch))

    @property
    def req_s(self) -> float:
        return self.batch / (self.output_tokens * self.tpot_s)

    def to_dict(self) -> dict[str, Any]:
        return {"context_tokens": self.context_tokens,
                "max_context_tokens": self.max_context_tokens, "b_mem": self.b_mem,
                "max_num_seqs": self.max_num_seqs, "max_num_seqs_source": self.cap_source,
                "batch": self.batch, "tpot_ms": self.tpot_s * 1e3,
                "req_s_per_worker": self.req_s,
                "output_tok_s_per_worker": self.req_s * self.output_tokens,
                "speculative": None if (sp := self.speculative) is None else {
                    "drafter": sp.drafter, "num_speculative_tokens": sp.num_speculative_tokens,
                    "acceptance_rate": sp.acceptance_rate,
                    "tokens_per_step": sp.expected_tokens}}


def decode_side(d: Deployment, spec: WorkerSpec, prompt_tokens: int,
                output_tokens: int, speculative: SpecConfig | None = None) -> DecodeSide:
    """A decode worker's batch (min of its cap and B_mem at prompt + output) and TPOT there,
    each sequence holding prompt + output/2 on average. With attention DP, each of the dp
    ranks holds its own sequences: B_mem counts every rank's pool (the deployment carries
    the ranks; docs/disaggregation.md). With `speculative`, every step is a speculative one
    (`bstar.specdec.spec_step_s`: verify + draft passes) and TPOT is that step over the
    tokens it yields at the acceptance rate; B_mem leaves the drafter's weights and KV out
    of the pool (`specdec.b_mem`)."""
    ctx_max = prompt_tokens + output_tokens
    ctx = prompt_tokens + output_tokens // 2
    dr = None if speculative is None else sd.make_drafter(d, speculative.drafter)
    k = 0 if speculative is None else speculative.num_speculative_tokens
    # with attention DP, every rank's pool (roofline.kv_pool_bytes)
    bm = sd.b_mem(d, dr, ctx_max, k)
    if bm < 1:
        raise BstarError(f"{d.model.name} does not fit a sequence of {ctx_max} tokens on a "
                         f"decode worker of {d.num_gpus} x {d.gpu.id}")
    if spec.max_num_seqs is not None:
        cap, source = spec.max_num_seqs, "given"
    else:
        from bstar.plan import make_plan

        cap = make_plan(d, (ctx_max,), [1]).contexts[0].recommendation.max_num_seqs
        source = "recommendation"
    b = max(1, min(cap, bm))
    grid = np.unique(np.concatenate([np.linspace(1.0, float(b), 257),
                                     np.arange(1.0, min(b, 64) + 1.0)]))
    if speculative is None or dr is None:
        tpots = rl.decode_step(d, grid, ctx).step_s
    else:
        tpots = sd.spec_step_s(d, dr, grid, ctx, k) / speculative.expected_tokens
        speculative = replace(speculative, drafter=dr.name)
    return DecodeSide(ctx, ctx_max, bm, cap, source, b, float(tpots[-1]), output_tokens,
                      grid, tpots, speculative)


# ---- the plan -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DisaggPlan:
    """`bstar plan --disaggregate`: each side, the transfer, the P:D ratio, one load."""

    deployment: DisaggregatedDeployment
    prefill_d: Deployment
    decode_d: Deployment
    priced_as: dict[str, str]
    prompt_tokens: int
    output_tokens: int
    prefill: PrefillSide
    decode: DecodeSide
    transfer: KvTransfer
    at_load: OperatingPoint
    warnings: tuple[str, ...] = ()

    @property
    def ratio(self) -> float:
        """Prefill workers per decode worker that balance the two sides: mu_d(S) / mu_p."""
        return self.decode.req_s / self.prefill.req_s

    @property
    def capacity_req_s(self) -> float:
        return min(self.deployment.prefill.workers * self.prefill.req_s,
                   self.deployment.decode.workers * self.decode.req_s)

    @property
    def bound(self) -> str:
        """The side that limits the deployment's throughput at its worker counts."""
        p = self.deployment.prefill.workers * self.prefill.req_s
        d = self.deployment.decode.workers * self.decode.req_s
        return "prefill" if p < d else "decode"

    def to_dict(self) -> dict[str, Any]:
        dd = self.deployment
        d = self.decode_d
        sides = {}
        for name, spec, dep, body in (("prefill", dd.prefill, self.prefill_d,
                                       self.prefill.to_dict()),
                                      ("decode", dd.decode, d, self.decode.to_dict())):
            sides[name] = {"workers": spec.workers, "gpu": dep.gpu.id, "tp": spec.tp,
                           "ep": spec.ep, "dp": spec.dp, "num_gpus": spec.num_gpus,
                           "priced_as": self.priced_as[name],
                           "max_num_seqs": spec.max_num_seqs,
                           "max_num_batched_tokens": spec.max_num_batched_tokens,
                           "gpu_util": dep.gpu_util} | body
        sides["decode"]["max_num_seqs"] = self.decode.max_num_seqs
        r = self.ratio
        return {
            "layout": "disaggregated", "model": d.model.name, "engine": d.engine,
            "weight_dtype": d.weight.name, "kv_dtype": d.kv.name,
            "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
            "num_gpus": dd.num_gpus,
            "prefill": sides["prefill"], "decode": sides["decode"],
            "transfer": self.transfer.to_dict(),
            "ratio": {"prefill_per_decode": r,
                      "balanced_prefill_workers": math.ceil(dd.decode.workers * r - 1e-9),
                      "balanced_decode_workers": max(1, math.floor(dd.prefill.workers / r
                                                                   + 1e-9)),
                      "bound": self.bound, "capacity_req_s": self.capacity_req_s},
            "at_load": self.at_load.to_dict(),
            "warnings": list(self.warnings),
            "units": {"bytes": "exact bytes", "times": "ms",
                      "ttft_ms": "prefill queue + prefill + KV transfer + first decode "
                                 "step (+ decode wait when every decode slot is full)"},
        }


def plan_disaggregated(dd: DisaggregatedDeployment, prompt_tokens: int, output_tokens: int,
                       *, concurrency: int | None = None,
                       rate_req_s: float | None = None,
                       speculative: SpecConfig | None = None) -> DisaggPlan:
    """Each side's step, batch and rate at `prompt_tokens` in and `output_tokens` out, the KV
    transfer between them, the P:D ratio that balances them, and the deployment at one load
    (`operating_point`). `speculative`: the decode side decodes speculatively
    (`decode_side`)."""
    if prompt_tokens < 1 or output_tokens < 1:
        raise BstarError("prompt and output lengths must be at least 1 token")
    if concurrency is not None and rate_req_s is not None:
        raise BstarError("give --concurrency or --rate, not both")
    pd, p_priced = side_deployment(dd.options, dd.prefill)
    dd_, d_priced = side_deployment(dd.options, dd.decode)
    from bstar.plan import check_tensor_parallel

    check_tensor_parallel(pd)
    check_tensor_parallel(dd_)
    pre = prefill_side(pd, dd.prefill, prompt_tokens)
    dec = decode_side(dd_, dd.decode, prompt_tokens, output_tokens, speculative)
    kind = dd.link or default_link_kind(dd_.gpu, dd.num_gpus, dd.gpus_per_node)
    link = kv_link(kind, dd_.gpu)
    tr = kv_transfer(dd_.model, dd_.kv, prompt_tokens, dd.decode.attention_tp, link)
    warnings = []
    for name, priced, spec in (("prefill", p_priced, dd.prefill),
                               ("decode", d_priced, dd.decode)):
        if priced == "tp" and (spec.ep > 1 or spec.dp > 1):
            warnings.append(f"{name}: EP {spec.ep} / attention DP {spec.dp} priced as tensor "
                            f"parallel over {spec.tp} GPUs (bstar.step has no EP/DP terms "
                            "yet)")
    if pd.kv.name != dd_.kv.name:
        warnings.append(f"prefill KV dtype {pd.kv.name} differs from decode's {dd_.kv.name}")
    front_s = pd.behaviour.request_overhead_s + pd.behaviour.front_token_s * prompt_tokens
    op = operating_point(pre, dec, tr, dd.prefill.workers, dd.decode.workers, dd.num_gpus,
                         request_overhead_s=front_s, concurrency=concurrency, rate_req_s=rate_req_s)
    return DisaggPlan(dd, pd, dd_, {"prefill": p_priced, "decode": d_priced}, prompt_tokens,
                      output_tokens, pre, dec, tr, op, tuple(warnings))
