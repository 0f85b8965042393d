"""Time of one engine step with a mixed batch (prefill chunks + decode tokens), for the
simulator and the capacity search.

No formula of its own: `StepCoefficients` binds a deployment's per-GPU constants
(`bstar.step.StepShape`) to its efficiencies, and every step is priced by `bstar.step.price`,
the same function the plan's curve (`roofline.decode_step`), prefill (`roofline.prefill_s`)
and calibration use. So:

- a step of B decode sequences all at context s costs `roofline.decode_step(d, [B], s)`;
- a step that prefills one prompt of n tokens from scratch costs `roofline.prefill_s(d, n)`.

The simulator prices one step at a time, ~10^5 of them per run, and numpy's cost per call on
one-element arrays was two thirds of a step (docs/simulate.md, "Speed"). So `OneStep` prices
a single scheduled step (`batch_step_s`) with the same arithmetic in Python floats:
`StepShape.scheduled_sums`' floats through `_work` and `price_parts` line by line.
tests/test_sim_onestep.py holds it equal to `step.price(shape.scheduled(...))` (rel 1e-12)
over random steps of dense, MoE, MLA, windowed, state and tensor-parallel deployments with
every field of Efficiency drawn at random, so a term added to `price` and not here fails it.

Per step, over the scheduled sequences i, each computing n_i new tokens on top of c_i already
in the KV cache (decode: n_i = 1; a prompt chunk: n_i > 1), the work is: T = sum n_i tokens
through the weight GEMMs (weights read once), decode attention over sum_dec held(c_i + 1),
and each chunk's attention over its causal area reading its keys once per 128-query tile
(bstar.step has the formula). A small chunk's GEMM rows are priced by the soft roof of the
weight GEMMs, not hidden under the weight read by one max over the step (measured: a
128-token chunk on 64 decoding sequences adds 2.0 ms on an H200; docs/cost-model.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from bstar import step as st
from bstar.deployment import Deployment

FloatArray = npt.NDArray[np.float64]
# Decode runs up to this many steps are priced one step at a time (OneStep): cheaper than
# numpy's fixed cost per call on this machine (55 us a run against ~3 us a step).
SHORT_RUN_STEPS = 16
MAX_CHUNK_TERMS = 4096
# ndarray.sum() without its Python wrapper (as bstar.sim.sequence.sum_of, a layer up).
sum_of = np.add.reduce
# `decode_run_until` prices at most this many steps one at a time before giving the run to
# numpy whole.
UNTIL_STEPS = 64


@dataclass(frozen=True, slots=True)
class StepCoefficients:
    """A deployment's step shape and efficiencies: what the simulator prices steps with."""

    shape: st.StepShape
    eff: Any  # Efficiency, or a mapping of its fields
    one: OneStep = field(init=False, repr=False, compare=False)
    linear: tuple[tuple[bool, float, float, float, float], ...] | None = field(
        init=False, repr=False, compare=False)
    full_only: bool = field(init=False, repr=False, compare=False)
    # `batch_step_s`' chunk terms per set of prompt chunks (at most MAX_CHUNK_TERMS).
    chunk_terms: dict[tuple[str, str, bytes, bytes], tuple[float, ...]] = field(
        init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "one", OneStep(self.shape, self.eff))
        # Per layer group (kv, state, score, attention per position), when every group reads
        # all it holds or a fixed state: then a decode run's held sums are linear in the step
        # (`StepShape.decode_run`) and `_linear_run` prices a short one without arrays.
        linear = all(g.kind == "state" or (g.kind == "full" and not g.window_tokens)
                     for g in self.shape.groups)
        object.__setattr__(self, "chunk_terms", {})
        object.__setattr__(self, "full_only", all(
            g.kind == "full" and not g.window_tokens for g in self.shape.groups))
        object.__setattr__(self, "linear", tuple(
            (g.kind == "state", g.kv_s_per_token, g.state_s_per_seq, g.score_s_per_pos,
             g.decode_attention_s_per_pos) for g in self.shape.groups) if linear else None)

    def decode_step_s(self, num_seqs: npt.ArrayLike,
                      held_sums: tuple[npt.ArrayLike, ...] | None = None) -> FloatArray:
        """Pure-decode steps of `num_seqs` sequences whose held tokens sum, per layer group,
        to `held_sums` (None: no tokens held, the floor of a step)."""
        b = np.atleast_1d(np.asarray(num_seqs, dtype=np.float64))
        if held_sums is None:
            held_sums = tuple(np.zeros_like(b) for _ in self.shape.groups)
        return st.price(self.shape.decode_held(b, held_sums), self.eff)

    def decode_run_step_s(self, start_tokens: npt.ArrayLike, num_steps: int) -> FloatArray:
        """Times of `num_steps` consecutive pure-decode steps of the same sequences (a short
        run priced step by step by `OneStep`: numpy's cost per call is most of a short one)."""
        if num_steps <= SHORT_RUN_STEPS and self.linear is not None:
            return np.array(self._linear_run(start_tokens, num_steps))
        w = self.shape.decode_run(start_tokens, num_steps)
        if num_steps > SHORT_RUN_STEPS:
            return st.price(w, self.eff)
        return np.array(self.one.price_work(w))

    def decode_run_until(self, start_tokens: npt.ArrayLike, max_steps: int, start_s: float,
                         stop_s: float, extra: int) -> list[float] | None:
        """The first steps of `decode_run_step_s(start_tokens, max_steps)`, priced one at a
        time as `_linear_run` prices them, through the `extra`-th step from the first whose
        end (start_s plus the running sum, as the engine's cumsum adds them) is at or past
        `stop_s`, and at most max_steps: the simulator cuts a decode run there when a
        request arrives, usually long before the run's last step. None (price the run
        whole) for a shape `_linear_run` does not take, or when the stop lies past
        UNTIL_STEPS steps."""
        if self.linear is None:
            return None
        return self._linear_steps(start_tokens, max_steps, start_s, stop_s, extra,
                                  UNTIL_STEPS)

    def _linear_run(self, start_tokens: npt.ArrayLike, num_steps: int) -> list[float]:
        """`price_work(decode_run(start_tokens, num_steps))` in Python floats, for shapes
        whose groups are all full layers or states (`linear`): the same sums in the same
        order as `decode_held` and `_work` take them (tests/test_sim_onestep.py holds the
        two equal)."""
        out = self._linear_steps(start_tokens, num_steps, 0.0, math.inf, 1, num_steps)
        assert out is not None
        return out

    def _linear_steps(self, start_tokens: npt.ArrayLike, max_steps: int, start_s: float,
                      stop_s: float, extra: int, limit: int) -> list[float] | None:
        """`_linear_run`'s steps through `decode_run_until`'s cut (None past `limit`)."""
        groups = self.linear
        assert groups is not None
        c = np.asarray(start_tokens)
        b = float(c.size)
        # A sum of token counts: exact in any order (decode_run sums the sorted floats).
        c_sum = float(sum_of(c))
        price = self.one.price
        out: list[float] = []
        acc = 0.0
        last = max_steps
        j = 0
        while j < last:
            j += 1
            if j > limit:
                return None
            h = c_sum + b * float(j)
            kv = score = attn = 0.0
            for is_state, kv_tok, state_seq, score_pos, attn_pos in groups:
                hg = 0.0 if is_state else h
                kv = kv + kv_tok * hg + state_seq * b
                score = score + score_pos * hg
                attn = attn + attn_pos * hg
            dt = price(b, b, 0.0, b, kv, score, attn, 0.0, 0.0, 0.0, 0.0)
            out.append(dt)
            acc += dt
            if last == max_steps and start_s + acc >= stop_s:
                last = min(max_steps, j - 1 + extra)
        return out

    def batch_step_s(self, start_tokens: npt.ArrayLike, new_tokens: npt.ArrayLike) -> float:
        """One step over sequences each computing `new_tokens` on top of `start_tokens`."""
        n = np.asarray(new_tokens).ravel()
        if n.size == 0:
            return 0.0
        if not self.full_only:
            return self.one.price(*self.shape.scheduled_sums(start_tokens, new_tokens))
        # Full layers only: `scheduled_sums`' floats, its decode part from two sums and its
        # chunk part (a function of the chunks alone) from `scheduled_sums` of the chunks,
        # kept per set of chunks: most steps of a study prefill the same prompt shapes.
        c = np.asarray(start_tokens).ravel()
        t = float(sum_of(n))
        chunk = n > 1
        num_chunks = int(np.count_nonzero(chunk))
        if num_chunks:
            cf, nf = c[chunk], n[chunk]
            key = (cf.dtype.str, nf.dtype.str, cf.tobytes(), nf.tobytes())
            terms = self.chunk_terms.get(key)
            if terms is None:
                if len(self.chunk_terms) >= MAX_CHUNK_TERMS:
                    self.chunk_terms.clear()
                terms = self.chunk_terms[key] = self.shape.scheduled_sums(cf, nf)[7:]
            # Token counts: exact in any order, as `scheduled_sums` sums them in floats.
            h = float(sum_of(c)) + t - float(sum_of(cf)) - float(sum_of(nf))
        else:
            terms = (0.0, 0.0, 0.0, 0.0)
            h = float(sum_of(c)) + t
        b = float(n.size)
        num_dec = float(n.size - num_chunks)
        kv = score = attn = 0.0
        for _, kv_tok, state_seq, score_pos, attn_pos in self.linear or ():
            kv += kv_tok * h + state_seq * num_dec
            score += score_pos * h
            attn += attn_pos * h
        return self.one.price(b, num_dec, float(num_chunks), t, kv, score, attn, *terms)


def coefficients(d: Deployment) -> StepCoefficients:
    """The simulator's step pricer for a deployment (its shape, its efficiencies)."""
    return StepCoefficients(st.shape(d), st.params_dict(d.eff))


class OneStep:
    """`step.price` of one step given as `StepShape.scheduled_sums`' floats, in Python floats
    (see the module docstring): `_work`'s per-token terms, then `price_parts`, in its order."""

    __slots__ = ("cap", "eager_layer_s", "grouped", "k", "kv_eff", "moe_c", "moe_layer_s", "p",
                 "prompt_token_s", "shape", "ws", "ws16")

    def __init__(self, shape: st.StepShape, params: Any) -> None:
        p = st.params_dict(params)
        self.shape, self.p = shape, p
        self.grouped = bool(p.get("grouped", True))
        self.k = float(p.get("roof_sharpness", 2.0))
        self.kv_eff = p["kv_bandwidth"] if self.grouped else p["bandwidth"]
        self.ws = st.weight_stream(shape.weight_bits, p)
        self.ws16 = st.weight_stream(16, p)
        self.moe_c = float(p.get("moe_compute", 1.0))
        self.moe_layer_s = float(p.get("moe_layer_s", 0.0))
        self.cap = float(p.get("graph_max_tokens", 0.0))
        self.eager_layer_s = float(p.get("eager_layer_s", 0.0))
        self.prompt_token_s = float(p.get("prompt_token_s", 0.0))

    def roof(self, m: float, c: float) -> float:
        """`step.roof` of two floats (a negative one, which the formula should never give,
        is left to numpy, as `price` would: Python's power would turn it complex)."""
        k = self.k
        if math.isinf(k):
            return max(m, c)
        if m < 0 or c < 0:
            return float(st.roof(m, c, k))
        hi = max(m, c, 1e-300)
        return hi * ((m / hi) ** k + (c / hi) ** k) ** (1.0 / k)

    def price_work(self, w: st.StepWork) -> list[float]:
        """Each step of `w` (`price(w, params)` as a list)."""
        cols = [getattr(w, f).tolist() for f in _WORK_FIELDS]
        return [self.price(*row) for row in zip(*cols, strict=True)]

    def price(self, num_seqs: float, num_decode: float, num_chunks: float, num_tokens: float,
              kv: float, score: float, dec_attn: float, chunk_kv: float, chunk_tiles_kv: float,
              chunk_attn: float, chunk_attn_gemm: float, gemm_tokens: float | None = None,
              overhead: bool = True) -> float:
        """The step's time in seconds (0 without sequences, as `price_parts`).

        For a speculative verify step (`bstar.specdec._verify_work`) `gemm_tokens` is the
        token rows the weights, the dense GEMMs and the all-reduces see (the step's tokens
        and the drafts), `num_tokens` the step's own; `overhead=False` leaves out the
        overhead terms (`kernels_s + layers_s + comm_s` of `price_parts`, a drafter pass)."""
        if not num_seqs > 0:
            return 0.0
        s, p, t = self.shape, self.p, num_tokens
        g = t if gemm_tokens is None else gemm_tokens
        weight_s = s.dense_weight_s + s.weight_s_per_token * g  # StepShape.weight_s
        weight16_s = s.dense16_weight_s + s.weight_s_per_token * g
        if s.num_experts:
            frac = 1.0 - (1.0 - s.top_k / s.num_experts) ** g if s.expert_parallel <= 1 \
                else float(s.expert_read_fraction(g))  # StepShape.expert_read_fraction
            weight_s = weight_s + s.expert_weight_s * frac
            weight16_s = weight16_s + s.expert16_weight_s * frac
        weight_mem = (weight_s - weight16_s) / self.ws + weight16_s / self.ws16
        gemm_c = s.gemm_s_per_token * g / p["compute"]
        if s.expert_parallel > 1:  # the busiest EP rank's extra routed tokens
            gemm_c = gemm_c + float(s.expert_gemm_extra_s(g)) * (
                1.0 / self.moe_c if self.grouped else 1.0) / p["compute"]
        if self.grouped and s.moe_layers:
            gemm_c = gemm_c + s.expert_gemm_s_per_token * t * (1.0 / self.moe_c - 1.0) \
                / p["compute"]
        kv_mem = (kv + p["score_bytes"] * score) / self.kv_eff
        attn_c = dec_attn / p["compute"]
        if self.grouped:
            has_dec, has_chunk = num_decode > 0, num_chunks > 0
            kernels = self.roof(weight_mem, gemm_c) \
                + (self.roof(kv_mem, attn_c) if has_dec else 0.0) \
                + (self.roof(chunk_tiles_kv / self.kv_eff, chunk_attn / p["attention_compute"])
                   if has_chunk else 0.0)
            layers = s.num_layers * (p["layer_s"] + p["decode_layer_s"] * has_dec
                                     + p["chunk_layer_s"] * has_chunk) \
                + s.moe_layers * self.moe_layer_s
            if self.cap > 0 and self.eager_layer_s > 0 and t > self.cap:
                layers = layers + max(s.num_layers * self.eager_layer_s - kernels - layers,
                                      0.0)
        else:
            memory = weight_mem + kv_mem + chunk_kv / p["bandwidth"]
            compute = gemm_c + attn_c + chunk_attn_gemm / p["compute"]
            kernels = max(memory, compute)
            layers = s.num_layers * p["layer_s"]
        comm = s.comm_s_per_token * g + s.allreduce_calls * p["allreduce_latency_s"]
        if not overhead:
            return kernels + layers + comm
        return kernels + layers + comm + (
            p["overhead_s"] + p["overhead_per_seq_s"] * num_seqs
            + (self.prompt_token_s * (t - num_decode) if num_chunks > 0 else 0.0))


# `price`'s arguments: what `StepShape._work` takes, read back from a StepWork.
_WORK_FIELDS = ("num_seqs", "num_decode", "num_chunks", "num_tokens", "kv_s", "score_s",
                "decode_attention_s", "chunk_kv_s", "chunk_tiles_kv_s", "chunk_attention_s",
                "chunk_attention_at_gemm_rate_s")
