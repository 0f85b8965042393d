"""Speculative decoding as a step kind: its price, its speedup over plain decode, where it
stops paying. Pure, no I/O (a draft model's spec is loaded by the caller).

One speculative step of a batch of B sequences, each holding s tokens, with k draft tokens
(docs/cost-model.md, "Speculative decoding"):

    draft       k drafter passes: the first over the k + 1 tokens the last verify step
                scored (vLLM V1's EagleProposer runs the drafter over the target's
                scheduled tokens), then k - 1 passes of one token; priced by bstar.step on
                the drafter's own shape, without the engine's per-step CPU overhead (the
                passes run inside the engine's one step). n-gram lookup: no GPU work.
    verify      one target step of B x (k + 1) query tokens over one KV read
                (StepShape.verify): weights once, attention FLOPs x (k + 1)
    reject      the rejection sampler reads the target's probabilities, B x (k + 1) x vocab
                fp32 values, at the weight-stream bandwidth
    tokens      E[tokens per step] = (1 - a^(k+1)) / (1 - a)  (Leviathan et al. 2023, eq. 1:
                each draft token accepted independently with probability a, the first
                rejection ends the run, the verify step adds one token of its own)

Per-request time per output token is step / E; throughput B x E / step; the speedup over
plain decode at the same batch E x plain_step / spec_step. Memory: the drafter's weights
(EAGLE and MTP share the target's embedding and LM head) leave the KV pool, its KV cache
joins each sequence's, and each sequence holds k lookahead slots (vLLM's
num_lookahead_tokens).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from bstar import roofline as rl
from bstar import step as _step
from bstar.deployment import Deployment
from bstar.errors import BstarError
from bstar.kv_pool import kv_bytes_per_seq_allocated
from bstar.specs.model import ModelSpec

FloatArray = npt.NDArray[np.float64]

DRAFTER_KINDS = ("eagle", "mtp", "ngram")
AUTO_DRAFTER = "auto"  # mtp when the target ships MTP layers, else eagle
MAX_SPECULATIVE_TOKENS = 16
BEST_K_RANGE = tuple(range(1, 9))  # K the "best K" search tries (vLLM examples use 1-7)
PROB_BYTES = 4  # the rejection sampler's fp32 probabilities
# Model types whose published checkpoints ship MTP layers even where a config omits the
# count (Qwen3-Next's mtp_num_hidden_layers = 1; DeepSeek-V3/R1 num_nextn_predict_layers).
MTP_MODEL_TYPES = ("deepseek_v3", "deepseek_v32", "qwen3_next", "glm4_moe")


def expected_tokens(acceptance_rate: float, num_speculative_tokens: int) -> float:
    """Tokens one speculative step yields per sequence: (1 - a^(k+1)) / (1 - a), k + 1 at
    a = 1 (Leviathan et al. 2023, eq. 1)."""
    a, k = float(acceptance_rate), int(num_speculative_tokens)
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def acceptance_for(tokens_per_step: float, num_speculative_tokens: int) -> float:
    """The per-token acceptance rate a whose expected tokens per step equal a measured
    `tokens_per_step` (e.g. a sweep level's `spec_tokens_per_step`): the inverse of
    `expected_tokens` by bisection, clipped to [0, 1]."""
    k = int(num_speculative_tokens)
    if tokens_per_step <= 1.0:
        return 0.0
    if tokens_per_step >= k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if expected_tokens(mid, k) < tokens_per_step:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def acceptance_from_levels(levels: list[dict[str, Any]], num_speculative_tokens: int) -> float:
    """The acceptance rate a sweep measured on the user's own traffic: the levels' vLLM
    `spec_decode` counters (each level's `server` object of `bstar sweep --json`, or the
    level itself: `spec_num_accepted_tokens` and `spec_tokens_per_step`) pooled over the
    levels, tokens per step = generated / (generated - accepted), then `acceptance_for` at
    K. A level without the counters (speculation off, another engine) is skipped."""
    generated = accepted = 0.0
    for lvl in levels:
        srv = lvl.get("server") or lvl
        acc, tps = srv.get("spec_num_accepted_tokens"), srv.get("spec_tokens_per_step")
        if acc is None or tps is None or tps <= 1.0:
            continue
        generated += float(tps) * float(acc) / (float(tps) - 1.0)  # tps = g / (g - acc)
        accepted += float(acc)
    if generated <= 0.0:
        raise BstarError("the run's levels hold no speculative-decoding counters (vLLM's "
                         "spec_decode_* on /metrics): was speculation on?")
    return acceptance_for(generated / (generated - accepted), num_speculative_tokens)


@dataclass(frozen=True, slots=True)
class SpecConfig:
    """What the flags say: K draft tokens, the per-token acceptance rate, the drafter
    ("auto", "eagle", "mtp", "ngram" or a draft model's preset/config)."""

    num_speculative_tokens: int
    acceptance_rate: float
    drafter: str = AUTO_DRAFTER

    def __post_init__(self) -> None:
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise BstarError("--num-speculative-tokens must be in "
                             f"1..{MAX_SPECULATIVE_TOKENS}, got {self.num_speculative_tokens}")
        if not 0.0 <= self.acceptance_rate <= 1.0:
            raise BstarError(f"--acceptance-rate must be in [0, 1], got {self.acceptance_rate}")
        if not self.drafter:
            raise BstarError("--drafter must name eagle, mtp, ngram or a model")

    @property
    def expected_tokens(self) -> float:
        return expected_tokens(self.acceptance_rate, self.num_speculative_tokens)


@dataclass(frozen=True, slots=True)
class Drafter:
    """A drafter priced from its own shape. `deployment` is None for n-gram lookup (CPU)."""

    kind: str  # eagle, mtp, ngram, model
    name: str
    deployment: Deployment | None
    resident_bytes_per_gpu: int  # weights it adds to each GPU (shared tables excluded)

    @property
    def on_gpu(self) -> bool:
        return self.deployment is not None


def _one_layer(m: ModelSpec, name: str, moe: bool) -> ModelSpec:
    """One full-attention decoder layer of the target's widths (with the target's
    embedding and LM head): an EAGLE head (dense MLP) or an MTP layer (the target's MLP)."""
    keep_moe = moe and m.is_moe
    mlp = "moe" if keep_moe else "dense"
    kw: dict[str, Any] = {}
    if not keep_moe:
        kw = {"num_experts": 0, "num_experts_per_tok": 0, "moe_intermediate_size": 0,
              "shared_intermediate_size": 0, "shared_expert_gate": False,
              "router_bias": False}
        if m.is_moe and m.intermediate_size <= 0:
            kw["intermediate_size"] = m.moe_intermediate_size
    return replace(m, name=name, num_layers=1, sliding_layers=(),
                   layer_kinds=("dsa",) if m.layer_kinds[:1] == ("dsa",) else (),
                   mlp_kinds=(mlp,), num_dense_layers=0, mtp_layers=0, vision=(),
                   linear_heads=m.linear_heads if m.layer_kinds else (),
                   attention_chunk=0, **kw)


def _shared_tables_bytes(m: ModelSpec) -> int:
    """The embedding and (untied) LM head an EAGLE head or MTP layer shares with its target."""
    tables = 1 if m.tie_word_embeddings else 2
    return tables * m.vocab_size * m.hidden_size * 2


def make_drafter(d: Deployment, drafter: str, draft_model: ModelSpec | None = None) -> Drafter:
    """The drafter `drafter` names for target deployment `d` ("auto": MTP when the target
    ships MTP layers, else EAGLE). A separate draft model comes as `draft_model` (loaded by
    the caller) and runs on the target's GPUs with its tensor parallelism."""
    m = d.model
    kind = drafter
    if kind == AUTO_DRAFTER:
        kind = "mtp" if has_mtp(m) else "eagle"
    if kind == "ngram":
        return Drafter("ngram", "ngram", None, 0)
    if kind in ("eagle", "mtp"):
        if kind == "mtp" and not has_mtp(m):
            raise BstarError(f"{m.name} has no multi-token-prediction layers "
                             "(num_nextn_predict_layers / mtp_num_hidden_layers); use "
                             "--drafter eagle, ngram or a draft model")
        spec = _one_layer(m, f"{m.name}-{kind}", moe=kind == "mtp")
        dd = replace(d, model=spec)
        resident = max(0, spec.weight_bytes(d.weight) - _shared_tables_bytes(spec))
        return Drafter(kind, kind, dd, math.ceil(resident / d.num_gpus))
    if draft_model is None:
        raise BstarError(f"--drafter {drafter!r}: load the draft model's spec first")
    if draft_model.vocab_size != m.vocab_size:
        raise BstarError(f"draft model {draft_model.name} has vocabulary "
                         f"{draft_model.vocab_size}, the target {m.vocab_size}: a draft model "
                         "must share the target's tokenizer")
    dd = replace(d, model=draft_model, weight_dtype="")
    return Drafter("model", draft_model.name, dd, rl.weight_bytes_per_gpu(dd))


def has_mtp(m: ModelSpec) -> bool:
    return m.mtp_layers > 0 or m.model_type in MTP_MODEL_TYPES


# ---- the price of a speculative step -------------------------------------------------------
def draft_s(dr: Drafter, batch: npt.ArrayLike, context_tokens: float,
            k: int) -> FloatArray:
    """GPU time of the k drafter passes of one step (no engine overhead: they run inside
    the target's step). The first pass runs over the k + 1 scored tokens, the rest over
    one token each, the drafter's KV growing by one token a pass."""
    b = np.atleast_1d(np.asarray(batch, dtype=np.float64))
    if dr.deployment is None:
        return np.zeros_like(b)
    dd = dr.deployment
    sh = _step.shape(dd)
    works = [sh.verify(b, context_tokens + k, k + 1)]
    works += [sh.decode(b, context_tokens + k + j) for j in range(1, k)]
    total = np.zeros_like(b)
    for w in works:
        p = _step.price_parts(w, dd.eff)
        total = total + p.kernels_s + p.layers_s + p.comm_s
    return total


def verify_s(d: Deployment, batch: npt.ArrayLike, context_tokens: float,
             k: int) -> FloatArray:
    """The target's verify step: k + 1 query tokens per sequence over one KV read, plus
    the rejection sampler's read of B x (k + 1) x vocab fp32 probabilities."""
    b = np.atleast_1d(np.asarray(batch, dtype=np.float64))
    work = _step.shape(d).verify(b, context_tokens + k, k + 1)
    reject_bytes = b * (k + 1) * d.model.vocab_size * PROB_BYTES
    reject = reject_bytes / (d.gpu.hbm_bandwidth_bytes_s * d.eff.bandwidth)
    return _step.price(work, d.eff) + reject


def spec_step_s(d: Deployment, dr: Drafter, batch: npt.ArrayLike, context_tokens: float,
                k: int) -> FloatArray:
    """One speculative step (draft + verify + reject) at each batch, seconds. The
    sequences hold `context_tokens` before the step, as in the plain decode curve."""
    return verify_s(d, batch, context_tokens, k) + draft_s(dr, batch, context_tokens, k)


def lookahead_slots(dr: Drafter, k: int) -> int:
    """KV slots a sequence holds past its tokens: the k drafts being verified, and for an
    EAGLE head or MTP layer k more (vLLM V1's scheduler sets num_lookahead_tokens = k for
    them: the drafter writes its next proposals' KV)."""
    return 2 * k if dr.kind in ("eagle", "mtp") else k


def b_mem(d: Deployment, dr: Drafter | None, context_tokens: int, k: int = 0) -> int:
    """The feasible pool in sequences, with the drafter when there is one (the one rule the
    plan's recommendation, its break-even and the speedup's running batch use): without
    (`dr` None) `roofline.b_mem`; with, the KV pool less the drafter's weights over each
    sequence's KV (its lookahead slots included) plus its drafter KV. The simulator's pool
    (`sim.speculative.num_blocks`) is the same in blocks (tests/test_crosscheck.py)."""
    if dr is None:
        return rl.b_mem(d, context_tokens)
    pool = rl.kv_pool_bytes(d) - dr.resident_bytes_per_gpu
    held = context_tokens + lookahead_slots(dr, k)
    per_seq = kv_bytes_per_seq_allocated(d, held)
    if dr.deployment is not None:
        per_seq += kv_bytes_per_seq_allocated(dr.deployment, held)
    return max(0, math.floor(pool / per_seq))


def speedup(d: Deployment, dr: Drafter, batch: npt.ArrayLike, context_tokens: int, k: int,
            acceptance_rate: float) -> tuple[FloatArray, FloatArray]:
    """(speedup over plain decode, a running request's time per output token with
    speculation, s) at each batch: output tokens per second with speculation over without,
    each batch capped by its own memory (B_mem plain, B_mem with the drafter)."""
    b = np.atleast_1d(np.asarray(batch, dtype=np.float64))
    bm_plain = max(1, b_mem(d, None, context_tokens))
    bm_spec = max(1, b_mem(d, dr, context_tokens, k))
    run_plain = np.minimum(b, bm_plain)
    run_spec = np.minimum(b, bm_spec)
    plain_tput = run_plain / rl.decode_step(d, run_plain, context_tokens).step_s
    e = expected_tokens(acceptance_rate, k)
    step = spec_step_s(d, dr, run_spec, context_tokens, k)
    spec_tput = run_spec * e / step
    return spec_tput / plain_tput, step / e


def break_even_batch(d: Deployment, dr: Drafter, context_tokens: int, k: int,
                     acceptance_rate: float) -> int | None:
    """The smallest batch up to B_mem with the drafter (the most sequences that run with
    speculation on) at which it stops paying (speedup at most 1); None when it pays at every
    batch up to there."""
    bm = max(1, b_mem(d, dr, context_tokens, k))
    grid = np.arange(1, bm + 1, dtype=np.float64)
    s, _ = speedup(d, dr, grid, context_tokens, k, acceptance_rate)
    idx = np.flatnonzero(s <= 1.0)
    return int(grid[idx[0]]) if idx.size else None


def best_k(d: Deployment, dr: Drafter, batch: npt.ArrayLike, context_tokens: int,
           acceptance_rate: float) -> tuple[npt.NDArray[np.int64], FloatArray]:
    """The K in BEST_K_RANGE with the largest speedup at each batch, and that speedup; K = 0
    (speculation off, speedup 1) where no K pays."""
    b = np.atleast_1d(np.asarray(batch, dtype=np.float64))
    table = np.stack([speedup(d, dr, b, context_tokens, k, acceptance_rate)[0]
                      for k in BEST_K_RANGE])
    i = np.argmax(table, axis=0)
    best = table[i, np.arange(b.size)]
    ks = np.where(best > 1.0, np.asarray(BEST_K_RANGE)[i], 0)
    return ks.astype(np.int64), np.where(best > 1.0, best, 1.0)


# ---- the plan's speculative section -----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SpecPlan:
    """Speculation at one context: the speedup over plain decode on the plan's batches,
    where it stops paying, the best K per batch, and what to set."""

    config: SpecConfig
    drafter: Drafter
    context_tokens: int
    b_mem: int  # with the drafter and k lookahead slots
    batch: npt.NDArray[np.int64]
    speedup: FloatArray
    tpot_s: FloatArray  # a running request's time per output token with speculation
    plain_tpot_s: FloatArray  # ... without (the plain step of the running batch)
    best_k: npt.NDArray[np.int64]
    best_speedup: FloatArray
    break_even_batch: int | None
    max_num_seqs: int  # the plan's pick on the pool with the drafter (at most b_mem)

    def advice(self) -> str:
        n, m = self.max_num_seqs, self.break_even_batch
        if m is None:
            return (f"set --max-num-seqs {n} and keep speculation on: it pays at every batch "
                    f"up to B_mem with the drafter ({self.b_mem}; the step's weight and KV "
                    "reads are shared by the k + 1 verified tokens, and they outweigh the "
                    "extra compute here)")
        if m <= 1:
            return f"set --max-num-seqs {n} and leave speculation off: it pays at no batch"
        if m > n:
            return (f"set --max-num-seqs {n} and keep speculation on: it pays up to batch "
                    f"{m - 1}, above the cap")
        return f"set --max-num-seqs {n} and turn speculation on below batch {m}"

    def flags(self) -> dict[str, str]:
        return engine_flags(self.config, self.drafter, self.break_even_batch)

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "num_speculative_tokens": c.num_speculative_tokens,
            "acceptance_rate": c.acceptance_rate,
            "drafter": self.drafter.name, "drafter_kind": self.drafter.kind,
            "drafter_bytes_per_gpu": self.drafter.resident_bytes_per_gpu,
            "expected_tokens_per_step": c.expected_tokens,
            "b_mem": self.b_mem,
            "curve": [{"batch": int(self.batch[i]), "speedup": float(self.speedup[i]),
                       "tpot_ms": float(self.tpot_s[i] * 1e3),
                       "plain_tpot_ms": float(self.plain_tpot_s[i] * 1e3),
                       "best_num_speculative_tokens": int(self.best_k[i]),
                       "best_speedup": float(self.best_speedup[i])}
                      for i in range(self.batch.size)],
            "break_even_batch": self.break_even_batch,
            "recommendation": {"max_num_seqs": self.max_num_seqs,
                               "speculate_below_batch": self.break_even_batch,
                               "reason": self.advice(), "flags": self.flags()},
        }


def plan_context(d: Deployment, dr: Drafter, cfg: SpecConfig, context_tokens: int,
                 batches: npt.ArrayLike, max_num_seqs: int) -> SpecPlan:
    """Speculation at one context on the plan's batch grid."""
    b = np.atleast_1d(np.asarray(batches, dtype=np.int64))
    k, a = cfg.num_speculative_tokens, cfg.acceptance_rate
    s, tpot = speedup(d, dr, b, context_tokens, k, a)
    ks, best = best_k(d, dr, b, context_tokens, a)
    return SpecPlan(cfg, dr, context_tokens, b_mem(d, dr, context_tokens, k), b, s, tpot,
                    rl.curve(d, b, context_tokens).step_s, ks, best,
                    break_even_batch(d, dr, context_tokens, k, a), max_num_seqs)


# vLLM's speculative-config "method" and SGLang's --speculative-algorithm per drafter kind
# (vLLM docs "Speculative Decoding", v0.11; SGLang docs "Speculative Decoding", v0.5).
_VLLM_METHOD = {"eagle": "eagle3", "mtp": "mtp", "ngram": "ngram"}
_SGLANG_ALGORITHM = {"eagle": "EAGLE3", "mtp": "NEXTN", "ngram": "NGRAM", "model": "STANDALONE"}


def engine_flags(cfg: SpecConfig, dr: Drafter, disable_batch: int | None) -> dict[str, str]:
    """The speculation in vLLM's and SGLang's words. EAGLE heads and draft models name
    their checkpoint (a placeholder for the EAGLE head, which bstar does not pick)."""
    k = cfg.num_speculative_tokens
    conf: dict[str, Any] = {}
    if dr.kind in _VLLM_METHOD:
        conf["method"] = _VLLM_METHOD[dr.kind]
    if dr.kind == "eagle":
        conf["model"] = "<EAGLE-3 head checkpoint>"
    elif dr.kind == "model":
        conf["model"] = dr.name
    conf["num_speculative_tokens"] = k
    if dr.kind == "ngram":
        conf |= {"prompt_lookup_max": 4, "prompt_lookup_min": 2}
    if disable_batch is not None and disable_batch > 1:
        conf["disable_by_batch_size"] = disable_batch
    sgl = (f"--speculative-algorithm {_SGLANG_ALGORITHM[dr.kind]} --speculative-num-steps {k} "
           f"--speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}")
    if dr.kind == "eagle":
        sgl += " --speculative-draft-model-path <EAGLE-3 head checkpoint>"
    elif dr.kind == "model":
        sgl += f" --speculative-draft-model-path {dr.name}"
    return {"vllm": f"--speculative-config '{json.dumps(conf)}'", "sglang": sgl}


# ---- a scheduled step with speculation (the simulator's) --------------------------------------
def _verify_work(sh: _step.StepShape, start: FloatArray, new: FloatArray,
                 k: int) -> _step.StepWork:
    """A scheduled step whose decoding sequences (new == 1) each verify k + 1 tokens: their
    KV is read once at held(start + 1 + k), their attention does k + 1 tokens' FLOPs and the
    GEMMs run over k more rows each; prompt chunks as in StepShape.scheduled."""
    dec = new == 1
    nd = float(dec.sum())
    w = sh.scheduled(start + k * dec, new)
    if not nd:
        return w
    t = np.atleast_1d(np.asarray(float(new.sum()) + k * nd))
    q = k + 1
    # Every term that counts the step's token rows takes the k extra rows of each decoding
    # sequence, as StepShape.verify's do (the routed experts' GEMMs and the row count
    # included: tests/test_crosscheck.py found them left at one row a sequence).
    return replace(w, num_tokens=t, weight_s=sh.weight_s(t),
                   weight16_s=sh.weight_s(t, only_16bit=True),
                   gemm_s=sh.gemm_s_per_token * t + sh.expert_gemm_extra_s(t),
                   expert_gemm_s=sh.expert_gemm_s_per_token * t + sh.expert_gemm_extra_s(t),
                   comm_s=sh.comm_s_per_token * t,
                   decode_attention_s=w.decode_attention_s * q, score_s=w.score_s * q)


def scheduled_step_s(d: Deployment, dr: Drafter, start_tokens: npt.ArrayLike,
                     new_tokens: npt.ArrayLike, k: int) -> float:
    """One scheduled step with speculation (the simulator's step): every decoding sequence
    (one new token on top of `start_tokens`) verifies k + 1 tokens; the drafter's first pass
    runs over the step's tokens, its other k - 1 passes over the decoding sequences. For
    B sequences at one context it equals `spec_step_s` (tests/test_specdec.py)."""
    c = np.asarray(start_tokens, dtype=np.float64).ravel()
    n = np.asarray(new_tokens, dtype=np.float64).ravel()
    if n.size == 0:
        return 0.0
    dec = n == 1
    nd = float(dec.sum())
    total = float(_step.price(_verify_work(_step.shape(d), c, n, k), d.eff)[0])
    total += nd * (k + 1) * d.model.vocab_size * PROB_BYTES \
        / (d.gpu.hbm_bandwidth_bytes_s * d.eff.bandwidth)
    if dr.deployment is not None:
        dd = dr.deployment
        sh = _step.shape(dd)
        works = [_verify_work(sh, c, n, k)]
        if nd:
            cd = c[dec] + k
            works += [sh.scheduled(cd + j, np.ones_like(cd)) for j in range(1, k)]
        for w in works:
            p = _step.price_parts(w, dd.eff)
            total += float((p.kernels_s + p.layers_s + p.comm_s)[0])
    return total


def accepted_drafts(rng: np.random.Generator, acceptance_rate: float, k: int,
                    n: int) -> npt.NDArray[np.int64]:
    """Draft tokens accepted per sequence in one step: the leading successes of k
    Bernoulli(a) trials (geometric, truncated at k), the draw the expected-tokens formula
    averages (E[accepted] + 1 = (1 - a^(k+1)) / (1 - a))."""
    if acceptance_rate >= 1.0:
        return np.full(n, k, dtype=np.int64)
    if acceptance_rate <= 0.0:
        return np.zeros(n, dtype=np.int64)
    first_reject = rng.geometric(1.0 - acceptance_rate, size=n)  # trials to the first reject
    return np.minimum(first_reject - 1, k).astype(np.int64)
