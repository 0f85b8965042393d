"""The one price of an engine step. Pure, no I/O.

Every prediction of time in bstar goes through `price`: the plan's decode curve
(`roofline.decode_step`), a prompt's prefill (`roofline.prefill_s`), each step of the
simulator (`sim/steptime.py`), calibration's fit (`calibrate.py`) and validation. A fitted
efficiency or engine term therefore means the same thing everywhere.

A step is described twice:

1. `StepWork`: what the step does, per GPU, as seconds at the datasheet rates (bytes / HBM
   bandwidth, FLOPs / dense peak): the weight read and GEMMs of its T tokens, the decode
   attention's KV stream and FLOPs, a prompt chunk's attention, the all-reduces. Exact
   arithmetic over the model's layer groups (`ModelSpec.layer_groups`), independent of any
   efficiency. Built by `StepShape` (the deployment's per-GPU constants) for a decode batch,
   a run of decode steps, a prefill or any mixed set of scheduled sequences.
2. `price(work, params)`: the time of each step at the efficiencies and engine terms in
   `params` (a `Efficiency` or a mapping with its field names):

    weight GEMMs        roof(weight_s / eta_w(dtype), gemm_s / eta_c)
    decode attention    roof((kv_s + score_bytes * score_s) / eta_kv, decode_attention_s / eta_c)
    chunk attention     roof(chunk_tiles_kv_s / eta_kv, chunk_attention_s / eta_attn)
    fixed               layers * (layer_s + decode_layer_s [decoding] + chunk_layer_s [chunk])
                        + moe_layers * moe_layer_s
                        (+ what layers x eager_layer_s exceeds the kernels by, in a step of
                         more than graph_max_tokens tokens: run outside CUDA graphs)
                        + comm_s + allreduce_calls * allreduce_latency_s
                        + overhead_s + overhead_per_seq_s * sequences
                        + prompt_token_s * prompt chunks' tokens (not divided by TP)

where the GEMMs' compute counts the routed experts' FLOPs at the fused-MoE kernels' rate,
expert_gemm_s / (eta_c * moe_compute) (docs/cost-model.md, "2026 models"; on the peak of
deployment.expert_compute), and roof(a, b) = (a^k + b^k)^(1/k), k = roof_sharpness (a hard
max at inf). With `grouped` false (cost model 1) one max over memory and compute totals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from bstar.deployment import EFFICIENCY_FIELDS, expert_compute
from bstar.parallel import allreduce_rounds as allreduce_rounds  # step's name for callers
from bstar.parallel import comm_terms, experts_touched_max_fraction, routed_tokens_max_ratio
from bstar.parallel import expert_fraction_read as expert_fraction_read

if TYPE_CHECKING:
    from bstar.deployment import Deployment

FloatArray = npt.NDArray[np.float64]

ATTENTION_TILE_TOKENS = 128  # query rows per block of FlashAttention-2's forward kernel


def roof(memory_s: npt.ArrayLike, compute_s: npt.ArrayLike, sharpness: float) -> FloatArray:
    """Time of a kernel group bound by two resources: the soft maximum (m^k + c^k)^(1/k),
    the hard max at k = inf. At k = 2 a kernel at its ridge takes sqrt(2) x either roof: an
    H200 bf16 GEMM of 256 rows streamed at 0.64-0.74x 1 row's rate (data/h200/gemv.jsonl)."""
    m = np.asarray(memory_s, dtype=np.float64)
    c = np.asarray(compute_s, dtype=np.float64)
    if math.isinf(sharpness):
        return np.maximum(m, c)
    hi = np.maximum(np.maximum(m, c), 1e-300)  # scaled: no overflow, exact at 0
    return hi * ((m / hi) ** sharpness + (c / hi) ** sharpness) ** (1.0 / sharpness)


def weight_stream(weight_bits: int, params: Any) -> float:
    """Weight-streaming efficiency for weights of `weight_bits`: the bandwidth efficiency,
    times the dequantizing GEMMs' fraction for 8- and 4-bit weights."""
    p = params_dict(params)
    if weight_bits <= 4:
        return p["bandwidth"] * p["int4_weight_stream"]
    if weight_bits <= 8:
        return p["bandwidth"] * p["fp8_weight_stream"]
    return p["bandwidth"]


# ---- what a step does ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StepWork:
    """What each of a set of steps does, per GPU, in seconds at the datasheet rates
    (arrays aligned by step). `price` turns it into time."""

    num_seqs: FloatArray  # sequences scheduled (decoding + prompt chunks)
    num_tokens: FloatArray  # tokens computed (decode: 1 a sequence; a chunk: its length)
    num_decode: FloatArray
    num_chunks: FloatArray
    weight_s: FloatArray  # weight bytes read / HBM bandwidth (all of them)
    weight16_s: FloatArray  # ... of which kept 16-bit in a quantized checkpoint
    gemm_s: FloatArray  # GEMM FLOPs / dense peak
    expert_gemm_s: FloatArray  # ... of which the routed experts' (fused-MoE kernels)
    kv_s: FloatArray  # decode KV bytes (and fixed states) / HBM bandwidth
    score_s: FloatArray  # an unfused attention's score traffic per score byte / bandwidth
    decode_attention_s: FloatArray  # decode attention FLOPs / dense peak
    chunk_kv_s: FloatArray  # prompt chunks' K/V read once / bandwidth
    chunk_tiles_kv_s: FloatArray  # ... once per query tile
    chunk_attention_s: FloatArray  # chunk attention FLOPs / (peak x occupancy)
    chunk_attention_at_gemm_rate_s: FloatArray  # chunk attention FLOPs / peak
    comm_s: FloatArray  # all-reduce bytes / link bandwidth
    allreduce_calls: FloatArray  # latency units of the all-reduces (0 without sequences)
    num_layers: int
    weight_bits: int
    moe_layers: int = 0  # layers with routed experts: each runs the fused-MoE kernels

    @property
    def size(self) -> int:
        return int(self.num_seqs.size)


@dataclass(frozen=True, slots=True)
class StepParts:
    """A priced step's parts in seconds (arrays); `step_s` is their sum."""

    gemm_s: FloatArray
    decode_attention_s: FloatArray
    chunk_attention_s: FloatArray
    kernels_s: FloatArray  # the three groups (or cost model 1's one max)
    layers_s: FloatArray
    comm_s: FloatArray
    overhead_s: FloatArray
    memory_s: FloatArray  # totals on the memory roof (for regimes and intensity)
    compute_s: FloatArray  # totals on the compute roof

    @property
    def step_s(self) -> FloatArray:
        return self.kernels_s + self.layers_s + self.comm_s + self.overhead_s


_FIELDS = EFFICIENCY_FIELDS


def params_dict(params: Any) -> Mapping[str, Any]:
    """`params` as a mapping of Efficiency's field names (an Efficiency is read once)."""
    return params if isinstance(params, Mapping) else {k: getattr(params, k) for k in _FIELDS}


def concat(works: list[StepWork]) -> StepWork:
    """Several StepWorks of one deployment as one (arrays joined in order)."""
    first = works[0]
    arrays = {f: np.concatenate([getattr(w, f) for w in works])
              for f in StepWork.__slots__
              if f not in ("num_layers", "weight_bits", "moe_layers")}
    return StepWork(**arrays, num_layers=first.num_layers, weight_bits=first.weight_bits,
                    moe_layers=first.moe_layers)


def price_parts(w: StepWork, params: Any) -> StepParts:
    """Each step's parts at the efficiencies and engine terms of `params` (an Efficiency,
    or a mapping of its field names; `grouped` and `roof_sharpness` default to cost model
    2's soft roof when the mapping lacks them)."""
    p = params_dict(params)
    grouped = bool(p.get("grouped", True))
    k = float(p.get("roof_sharpness", 2.0))
    has_dec = w.num_decode > 0
    has_chunk = w.num_chunks > 0
    kv_eff = p["kv_bandwidth"] if grouped else p["bandwidth"]
    # A quantized checkpoint streams its quantized weights through dequantizing GEMMs and
    # the modules it keeps 16-bit (attention, routers, norms) at the 16-bit rate.
    weight_mem = (w.weight_s - w.weight16_s) / weight_stream(w.weight_bits, p) \
        + w.weight16_s / weight_stream(16, p)
    gemm_c = w.gemm_s / p["compute"]
    if grouped and w.moe_layers:  # the routed experts' GEMMs at the fused-MoE kernels' rate
        moe_c = float(p.get("moe_compute", 1.0))
        gemm_c = gemm_c + w.expert_gemm_s * (1.0 / moe_c - 1.0) / p["compute"]
    kv_mem = (w.kv_s + p["score_bytes"] * w.score_s) / kv_eff
    attn_c = w.decode_attention_s / p["compute"]
    chunk_mem = w.chunk_tiles_kv_s / kv_eff
    chunk_c = w.chunk_attention_s / p["attention_compute"]
    zero = np.zeros_like(w.num_seqs)
    if grouped:
        gemm = roof(weight_mem, gemm_c, k)
        dec = np.where(has_dec, roof(kv_mem, attn_c, k), 0.0)
        chunk = np.where(has_chunk, roof(chunk_mem, chunk_c, k), 0.0)
        kernels = gemm + dec + chunk
        layers = w.num_layers * (p["layer_s"] + p["decode_layer_s"] * has_dec
                                 + p["chunk_layer_s"] * has_chunk) \
            + w.moe_layers * float(p.get("moe_layer_s", 0.0))
        # A step past the engine's captured CUDA graphs launches every kernel from the CPU:
        # the GPU cannot run faster than the launches (the kernels hide them when longer).
        cap = float(p.get("graph_max_tokens", 0.0))
        if cap > 0 and float(p.get("eager_layer_s", 0.0)) > 0:
            floor = w.num_layers * float(p["eager_layer_s"])
            layers = layers + np.where(w.num_tokens > cap,
                                       np.maximum(floor - kernels - layers, 0.0), 0.0)
        memory = weight_mem + kv_mem + chunk_mem
        compute = gemm_c + attn_c + chunk_c
    else:
        memory = weight_mem + kv_mem + w.chunk_kv_s / p["bandwidth"]
        compute = gemm_c + attn_c + w.chunk_attention_at_gemm_rate_s / p["compute"]
        kernels = np.maximum(memory, compute)
        gemm, dec, chunk = kernels, zero, zero
        layers = w.num_layers * p["layer_s"] + zero
    active = w.num_seqs > 0
    comm = np.where(active, w.comm_s + w.allreduce_calls * p["allreduce_latency_s"], 0.0)
    prompt = np.where(w.num_chunks > 0, w.num_tokens - w.num_decode, 0.0)  # chunks' tokens
    overhead = np.where(active, p["overhead_s"] + p["overhead_per_seq_s"] * w.num_seqs
                        + float(p.get("prompt_token_s", 0.0)) * prompt, 0.0)
    return StepParts(gemm, dec, chunk, np.where(active, kernels, 0.0),
                     np.where(active, layers, 0.0), comm, overhead, memory, compute)


def price(w: StepWork, params: Any) -> FloatArray:
    """Each step's time in seconds (see the module docstring for the formula)."""
    return price_parts(w, params).step_s


# ---- a deployment's per-GPU constants ----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GroupShape:
    """One layer group's per-GPU constants, all layers of the group together, in seconds at
    the datasheet rates per token held (or per sequence for a fixed state)."""

    kind: str
    window_tokens: int
    kv_s_per_token: float
    state_s_per_seq: float
    decode_attention_s_per_pos: float
    score_s_per_pos: float  # per score byte
    prefill_attention_s_per_pair: float
    group: Any  # the LayerGroup (its `held`)

    def held(self, tokens: npt.ArrayLike) -> FloatArray:
        """Tokens a step reads per layer for sequences holding `tokens` (LayerGroup.read)."""
        return np.asarray(self.group.read(np.asarray(tokens, dtype=np.float64)),
                          dtype=np.float64)


@dataclass(frozen=True, slots=True)
class StepShape:
    """A deployment's per-GPU constants at the datasheet rates: what `StepWork` is built
    from. `shape(d)` builds it; the efficiencies are not in it."""

    dense_weight_s: float  # read every step whatever the batch (a tied table included)
    weight_s_per_token: float  # looked-up rows of an untied input embedding
    expert_weight_s: float  # MoE routed experts, read in the fraction touched
    dense16_weight_s: float  # of dense_weight_s (and the looked-up rows), kept 16-bit
    expert16_weight_s: float  # of expert_weight_s, kept 16-bit
    top_k: int
    num_experts: int
    gemm_s_per_token: float
    expert_gemm_s_per_token: float
    moe_layers: int
    groups: tuple[GroupShape, ...]
    comm_s_per_token: float  # all-reduce bytes per token / link bandwidth
    allreduce_calls: float  # latency units per step: 2 per layer x log2(N)
    heads_per_gpu: int
    num_sms: int  # 0: unknown (no occupancy limit)
    num_layers: int
    weight_bits: int
    hbm_bandwidth_bytes_s: float
    expert_parallel: int = 1  # EP ranks: the step waits for the busiest one

    # -- building blocks --
    def expert_read_fraction(self, num_tokens: npt.ArrayLike) -> FloatArray:
        """Fraction of a GPU's expert bytes the step reads: the experts touched
        (`expert_fraction_read`), on the busiest rank under EP
        (`experts_touched_max_fraction`)."""
        return experts_touched_max_fraction(num_tokens, self.top_k, self.num_experts,
                                            self.expert_parallel)

    def kv_bytes_per_token(self) -> float:
        """KV bytes per token of context on each GPU (layers that cache tokens)."""
        return sum(g.kv_s_per_token for g in self.groups if g.kind != "state") \
            * self.hbm_bandwidth_bytes_s

    def weight_s(self, num_tokens: npt.ArrayLike, only_16bit: bool = False) -> FloatArray:
        """Weight read time of a step of `num_tokens` tokens (or of its 16-bit part)."""
        t = np.asarray(num_tokens, dtype=np.float64)
        dense, expert = (self.dense16_weight_s, self.expert16_weight_s) if only_16bit \
            else (self.dense_weight_s, self.expert_weight_s)
        w = dense + self.weight_s_per_token * t
        if self.num_experts:
            w = w + expert * self.expert_read_fraction(t)
        return np.asarray(w, dtype=np.float64)

    def expert_gemm_extra_s(self, num_tokens: npt.ArrayLike) -> FloatArray:
        """The routed experts' GEMM time the busiest EP rank adds over the mean rank's
        (`routed_tokens_max_ratio`: 0 without EP)."""
        t = np.asarray(num_tokens, dtype=np.float64)
        return self.expert_gemm_s_per_token * t * (routed_tokens_max_ratio(
            t, self.top_k, self.num_experts, self.expert_parallel) - 1.0)

    def kv_s_per_seq(self, tokens: npt.ArrayLike) -> FloatArray:
        """KV (and state) read time of one sequence holding `tokens`, at the datasheet rate."""
        t = np.asarray(tokens, dtype=np.float64)
        return sum((g.kv_s_per_token * g.held(t) + g.state_s_per_seq for g in self.groups),
                   np.zeros_like(t))

    def _work(self, num_seqs: FloatArray, num_decode: FloatArray, num_chunks: FloatArray,
              num_tokens: FloatArray, kv: FloatArray, score: FloatArray, dec_attn: FloatArray,
              chunk_kv: FloatArray | None = None, chunk_tiles_kv: FloatArray | None = None,
              chunk_attn: FloatArray | None = None,
              chunk_attn_gemm: FloatArray | None = None) -> StepWork:
        zero = np.zeros_like(num_seqs)
        return StepWork(
            num_seqs=num_seqs, num_tokens=np.asarray(num_tokens, dtype=np.float64) + zero,
            num_decode=num_decode, num_chunks=num_chunks,
            weight_s=self.weight_s(num_tokens),
            weight16_s=self.weight_s(num_tokens, only_16bit=True),
            gemm_s=self.gemm_s_per_token * num_tokens + self.expert_gemm_extra_s(num_tokens),
            expert_gemm_s=self.expert_gemm_s_per_token * num_tokens
            + self.expert_gemm_extra_s(num_tokens),
            kv_s=kv, score_s=score, decode_attention_s=dec_attn,
            chunk_kv_s=zero if chunk_kv is None else chunk_kv,
            chunk_tiles_kv_s=zero if chunk_tiles_kv is None else chunk_tiles_kv,
            chunk_attention_s=zero if chunk_attn is None else chunk_attn,
            chunk_attention_at_gemm_rate_s=zero if chunk_attn_gemm is None else chunk_attn_gemm,
            comm_s=self.comm_s_per_token * num_tokens,
            allreduce_calls=np.where(num_seqs > 0, self.allreduce_calls, 0.0),
            num_layers=self.num_layers, weight_bits=self.weight_bits,
            moe_layers=self.moe_layers)

    # -- decode --
    def decode_held(self, num_seqs: npt.ArrayLike,
                    held_sums: tuple[npt.ArrayLike, ...]) -> StepWork:
        """Pure-decode steps of `num_seqs` sequences whose held tokens (after this step's
        token) sum, per layer group, to `held_sums[g]` (a fixed state counts per sequence)."""
        b = np.atleast_1d(np.asarray(num_seqs, dtype=np.float64))
        kv = np.zeros_like(b)
        score = np.zeros_like(b)
        attn = np.zeros_like(b)
        for g, hs in zip(self.groups, held_sums, strict=True):
            h = np.asarray(hs, dtype=np.float64)
            kv = kv + g.kv_s_per_token * h + g.state_s_per_seq * b
            score = score + g.score_s_per_pos * h
            attn = attn + g.decode_attention_s_per_pos * h
        return self._work(b, b, np.zeros_like(b), b, kv, score, attn)

    def decode(self, num_seqs: npt.ArrayLike, context_tokens: int | float) -> StepWork:
        """Pure-decode steps of `num_seqs` sequences each holding `context_tokens` (this
        step's token included): the plan's curve."""
        b = np.atleast_1d(np.asarray(num_seqs, dtype=np.float64))
        return self.decode_held(b, tuple(b * float(g.held(context_tokens))
                                         for g in self.groups))

    def verify(self, num_seqs: npt.ArrayLike, context_tokens: int | float,
               num_tokens: int) -> StepWork:
        """Steps of `num_seqs` sequences that each compute `num_tokens` query tokens over
        one KV read (speculative decoding's verify step, bstar.specdec): each sequence holds
        `context_tokens` once they are in. The weights stream once for B x num_tokens token
        rows; the decode attention reads the KV once and does num_tokens x the FLOPs (and
        score traffic) of one token (docs/cost-model.md, "Speculative decoding")."""
        b = np.atleast_1d(np.asarray(num_seqs, dtype=np.float64))
        q = float(num_tokens)
        kv = np.zeros_like(b)
        score = np.zeros_like(b)
        attn = np.zeros_like(b)
        for g in self.groups:
            h = b * float(g.held(context_tokens))
            kv = kv + g.kv_s_per_token * h + g.state_s_per_seq * b
            score = score + g.score_s_per_pos * h * q
            attn = attn + g.decode_attention_s_per_pos * h * q
        return self._work(b, b, np.zeros_like(b), b * q, kv, score, attn)

    def decode_run(self, start_tokens: npt.ArrayLike, num_steps: int) -> StepWork:
        """`num_steps` consecutive pure-decode steps of the same sequences: in step j
        (0-based) sequence i computes one token on top of start_i + j. Full layers' sums are
        linear in j; a window's use sorted prefix sums; other kinds sum directly."""
        c = np.sort(np.asarray(start_tokens, dtype=np.float64))
        b = c.size
        added = np.arange(1, num_steps + 1, dtype=np.float64)
        sums = []
        for g in self.groups:
            # "full" and "sliding" read what they hold (LayerGroup.read): closed forms.
            if g.kind == "state":
                sums.append(np.zeros(num_steps))
            elif g.kind == "full" and not g.window_tokens:
                sums.append(c.sum() + b * added)
            elif g.kind == "sliding":
                # sum_i min(c_i + s, w) = sum_{c_i < w - s} (c_i + s) + w * #{c_i >= w - s}
                w = g.window_tokens
                prefix = np.concatenate([[0.0], np.cumsum(c)])
                m = np.searchsorted(c, w - added, side="left")
                sums.append(prefix[m] + m * added + (b - m) * w)
            else:
                sums.append(g.held(c[None, :] + added[:, None]).sum(axis=1))
        return self.decode_held(np.full(num_steps, float(b)), tuple(sums))

    # -- any scheduled set --
    def scheduled(self, start_tokens: npt.ArrayLike, new_tokens: npt.ArrayLike) -> StepWork:
        """One step over sequences each computing `new_tokens` on top of `start_tokens`
        (decode: 1 new token; a prompt chunk: more)."""
        one = np.ones(1)
        return self._work(*(one * v for v in self.scheduled_sums(start_tokens, new_tokens)))

    def scheduled_sums(self, start_tokens: npt.ArrayLike,
                       new_tokens: npt.ArrayLike) -> tuple[float, ...]:
        """`scheduled`'s step as the floats `_work` takes (sequences, decodes, chunks,
        tokens, decode KV / score / attention, chunk KV / tiles / attention / at the GEMM
        rate): what `StepPricer` prices without arrays."""
        c = np.asarray(start_tokens, dtype=np.float64).ravel()
        n = np.asarray(new_tokens, dtype=np.float64).ravel()
        end = c + n
        chunk = n > 1
        num_chunks = int(np.count_nonzero(chunk))
        num_dec = c.size - num_chunks
        d_end = end[~chunk] if num_chunks else end
        kv = score = attn = 0.0
        d_sum = float(d_end.sum())
        for g in self.groups:  # a full layer without a window reads all it holds
            h = d_sum if g.kind == "full" and not g.window_tokens else float(g.held(d_end).sum())
            kv += g.kv_s_per_token * h + g.state_s_per_seq * float(num_dec)
            score += g.score_s_per_pos * h
            attn += g.decode_attention_s_per_pos * h
        ckv = ctiles = cattn = cattn_g = 0.0
        if num_chunks:
            cf, nf = c[chunk], n[chunk]
            ef = cf + nf
            tiles = np.ceil(nf / ATTENTION_TILE_TOKENS)
            occ = 1.0
            if self.num_sms:
                occ = min(1.0, self.heads_per_gpu * float(tiles.sum()) / self.num_sms)
            per_seq = self.kv_s_per_seq(ef)
            ckv = float(per_seq.sum())
            ctiles = float((per_seq * tiles).sum())
            area = 0.0
            for g in self.groups:
                area += g.prefill_attention_s_per_pair * float(
                    g.group.prefill_pairs(cf, ef).sum())
            cattn = area / occ
            cattn_g = area
        return (float(c.size), float(num_dec), float(num_chunks), float(n.sum()), kv, score,
                attn, ckv, ctiles, cattn, cattn_g)

    def prefill(self, prompt_tokens: int, batch: int = 1) -> StepWork:
        """The step that prefills `batch` prompts of `prompt_tokens` from scratch."""
        return self.scheduled(np.zeros(batch), np.full(batch, float(prompt_tokens)))


def shape(d: Deployment) -> StepShape:
    """The deployment's per-GPU constants at the datasheet rates (cached by what they depend
    on, not the efficiencies: a calibration prices the same shape many times)."""
    key = (d.model, d.gpu, d.num_gpus, d.weight.name, d.kv.name, d.expert_parallel,
           d.data_parallel)
    try:
        return _SHAPES[key]
    except TypeError:  # an unhashable part (a GPU file's raw table): build it each time
        return _shape_uncached(d)
    except KeyError:
        pass
    s = _shape_uncached(d)
    if len(_SHAPES) > 512:
        _SHAPES.clear()
    _SHAPES[key] = s
    return s


def _shape_uncached(d: Deployment) -> StepShape:
    m, g, n = d.model, d.gpu, d.num_gpus
    dp, ta = d.data_parallel, d.attention_tp  # DP ranks of ta GPUs (Deployment)
    bw = g.hbm_bandwidth_bytes_s
    peak = g.peak_flops(d.weight.compute)
    expert_peak = g.peak_flops(expert_compute(g, d.weight))
    dense, expert, embed = m.weight_bytes_parts(d.weight)
    dense16, expert16 = m.weight_bytes_16bit(d.weight)
    per_token = 0.0
    if m.tie_word_embeddings:
        dense += embed  # the table is the LM head: read in full every step
        dense16 += embed  # embeddings stay 16-bit
    else:
        per_token = m.hidden_size * 2  # one looked-up row of the input table per token
    kv_bytes = d.kv.bits / 8
    groups = []
    for lg in m.layer_groups():
        div = lg.shard_divisor(ta)
        # a rank reads its own sequences' KV (1 / dp of it, balanced) at its attention TP
        groups.append(GroupShape(
            kind=lg.kind, window_tokens=lg.window_tokens,
            kv_s_per_token=lg.num_layers * lg.kv_values_per_token_per_gpu(ta) * kv_bytes
            / bw / dp,
            state_s_per_seq=lg.num_layers * lg.state_bytes_per_seq_per_gpu(div) / bw / dp,
            decode_attention_s_per_pos=lg.num_layers * lg.decode_flops_per_pos / n / peak,
            score_s_per_pos=lg.num_layers * lg.query_heads / n / bw,
            prefill_attention_s_per_pair=lg.num_layers * lg.prefill_flops_per_pair / n / peak,
            group=lg))
    comm_per_token, rounds = comm_terms(d)
    return StepShape(
        dense_weight_s=dense / ta / bw, weight_s_per_token=per_token / ta / bw / dp,
        expert_weight_s=expert / n / bw if m.is_moe else 0.0,
        dense16_weight_s=dense16 / ta / bw, expert16_weight_s=expert16 / n / bw if m.is_moe
        else 0.0,
        top_k=m.num_experts_per_tok if m.is_moe else 0,
        num_experts=m.num_experts if m.is_moe else 0,
        gemm_s_per_token=2 * (m.matmul_params_per_token - m.expert_matmul_params_per_token)
        / n / peak + 2 * m.expert_matmul_params_per_token / n / expert_peak,
        expert_gemm_s_per_token=2 * m.expert_matmul_params_per_token / n / expert_peak,
        moe_layers=m.num_moe_layers if m.is_moe else 0,
        groups=tuple(groups), comm_s_per_token=comm_per_token,
        allreduce_calls=rounds,
        heads_per_gpu=max(1, -(-m.num_heads // ta)), num_sms=g.num_sms,
        num_layers=m.num_layers, weight_bits=d.weight.bits, hbm_bandwidth_bytes_s=bw,
        expert_parallel=d.expert_parallel if m.is_moe else 1)


_SHAPES: dict[Any, StepShape] = {}
