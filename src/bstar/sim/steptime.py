"""Time of one engine step with a mixed batch (prefill chunks + decode tokens), priced by the
same kernel groups as `bstar.roofline` and reducing to it exactly:

- a step of B decode sequences all at context s costs `roofline.decode_step(d, [B], s)`;
- a step that prefills one prompt of n tokens from scratch costs `roofline.prefill_s(d, n)`
  (plus the per-sequence overhead that decode steps also pay).

Per step, over the scheduled sequences i, each computing n_i new tokens on top of c_i already
in the KV cache (decode: n_i = 1; a prompt chunk: n_i > 1):

    tokens T               sum n_i                      (weights read once: W_read(T))
    weight GEMMs           roof(W_read(T) / BW_w, 2 * P_matmul * T / peak_c)
    decode attention       roof((sum_dec kv_bytes(c_i + 1) + scores) / BW_kv,
                                per_pos * sum_dec held(c_i + 1) / peak_c)
    chunk attention        roof(sum_chunk kv_bytes(c_i + n_i) * ceil(n_i / 128) / BW_kv,
                                2*H*d * sum_chunk ((c+n) held(c+n) - c held(c)) / (peak_attn * occ))
    fixed                  layers * (layer_s + decode_layer_s [if decoding]
                                     + chunk_layer_s [if a chunk runs])
                           + all-reduces(T) + overhead_s + overhead_per_seq_s * S

A small chunk's GEMM rows are priced by the soft roof of the weight GEMMs, not hidden under
the weight read by one max over the step (measured: a 128-token chunk on 64 decoding
sequences adds 2.0 ms on an H200; docs/cost-model.md). With `grouped=False` (IDEAL) the step
is one max over its totals, as cost model 1 priced it.

The simulator prices thousands of steps, so the model's per-layer sums are folded once into
a few coefficients (`StepCoefficients`); the functions below are numpy-vectorized.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bstar import roofline as rl

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class StepCoefficients:
    """Per-GPU constants of one step; built by `coefficients(d)` from the deployment."""

    dense_weight_bytes: float  # read every step, whatever the batch
    weight_bytes_per_token: float  # looked-up rows of an untied input embedding
    expert_weight_bytes: float  # MoE routed experts, read in the fraction touched
    top_k: int
    num_experts: int
    kv_bytes_per_token_full: float  # summed over full-attention layers
    kv_bytes_per_token_window: float  # summed over sliding-window layers
    window_tokens: int  # 0: no sliding-window layers
    decode_flops_per_pos_full: float  # attention FLOPs per (new token, cached token)
    decode_flops_per_pos_window: float
    score_bytes_per_pos_full: float  # unfused attention's scores per (new, cached) token
    score_bytes_per_pos_window: float
    prefill_flops_per_pair_full: float  # attention FLOPs per causal (query, key) area unit
    prefill_flops_per_pair_window: float
    matmul_flops_per_token: float
    weight_bandwidth_bytes_s: float  # effective: datasheet x efficiency
    kv_bandwidth_bytes_s: float
    flops_s: float  # effective, GEMMs and decode attention
    attention_flops_s: float  # effective, prefill/chunk attention before occupancy
    heads_per_gpu: int
    num_sms: int  # 0: unknown (no occupancy limit)
    sharpness: float
    grouped: bool
    layers_s: float  # fixed per step: num_layers * layer_s
    decode_layers_s: float  # when any sequence decodes
    chunk_layers_s: float  # when any prompt chunk runs
    comm_s_fixed: float  # all-reduce latency per step (tensor parallel), 0 for one GPU
    comm_s_per_token: float
    overhead_s: float
    overhead_per_seq_s: float

    def held(self, tokens: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Tokens of KV held by full layers and by sliding-window layers."""
        if self.window_tokens:
            return tokens, np.minimum(tokens, self.window_tokens)
        return tokens, tokens

    def kv_bytes(self, tokens: FloatArray) -> FloatArray:
        full, win = self.held(tokens)
        return self.kv_bytes_per_token_full * full + self.kv_bytes_per_token_window * win

    def prefill_attention_flops(self, start_tokens: FloatArray,
                                new_tokens: FloatArray) -> FloatArray:
        end = start_tokens + new_tokens
        end_full, end_win = self.held(end)
        start_full, start_win = self.held(start_tokens)
        return (self.prefill_flops_per_pair_full * (end * end_full - start_tokens * start_full)
                + self.prefill_flops_per_pair_window * (end * end_win - start_tokens * start_win))

    def weight_bytes_read(self, num_tokens: FloatArray) -> FloatArray:
        w = self.dense_weight_bytes + self.weight_bytes_per_token * num_tokens
        if self.num_experts:
            w = w + self.expert_weight_bytes * rl.expert_fraction_read(
                num_tokens, self.top_k, self.num_experts)
        return w

    def _roof(self, m: FloatArray, c: FloatArray) -> FloatArray:
        return rl.roof(m, c, self.sharpness)

    def decode_step_s(self, num_seqs: npt.ArrayLike, held_full: npt.ArrayLike,
                      held_win: npt.ArrayLike) -> FloatArray:
        """Pure-decode steps: `num_seqs` sequences whose held KV tokens (after this step's
        token) sum to held_full over full layers and held_win over windowed ones."""
        b = np.asarray(num_seqs, dtype=np.float64)
        hf = np.asarray(held_full, dtype=np.float64)
        hw = np.asarray(held_win, dtype=np.float64)
        w_mem = self.weight_bytes_read(b) / self.weight_bandwidth_bytes_s
        gemm_c = self.matmul_flops_per_token * b / self.flops_s
        kv = self.kv_bytes_per_token_full * hf + self.kv_bytes_per_token_window * hw
        scores = self.score_bytes_per_pos_full * hf + self.score_bytes_per_pos_window * hw
        attn = self.decode_flops_per_pos_full * hf + self.decode_flops_per_pos_window * hw
        kv_mem = (kv + scores) / self.kv_bandwidth_bytes_s
        attn_c = attn / self.flops_s
        if self.grouped:
            kernels = self._roof(w_mem, gemm_c) + self._roof(kv_mem, attn_c)
        else:
            kernels = np.maximum(w_mem + kv_mem, gemm_c + attn_c)
        comm = np.where(b > 0, self.comm_s_fixed + self.comm_s_per_token * b, 0.0)
        fixed = np.where(b > 0, self.layers_s + self.decode_layers_s, 0.0)
        return kernels + fixed + comm + self.overhead_s + self.overhead_per_seq_s * b

    def decode_run_step_s(self, start_tokens: npt.ArrayLike, num_steps: int) -> FloatArray:
        """Times of `num_steps` consecutive pure-decode steps of the same sequences: in step
        j (0-based) sequence i computes one token on top of start_i + j. Vectorized over the
        steps: the full-layer sums are linear in j, the windowed ones use sorted prefix sums."""
        c = np.sort(np.asarray(start_tokens, dtype=np.float64))
        b = c.size
        held = np.arange(1, num_steps + 1, dtype=np.float64)  # tokens added by step j
        full_sum = c.sum() + b * held
        if self.window_tokens:
            # sum_i min(c_i + s, w) = sum_{c_i < w - s} (c_i + s) + w * #{c_i >= w - s}
            prefix = np.concatenate([[0.0], np.cumsum(c)])
            m = np.searchsorted(c, self.window_tokens - held, side="left")
            win_sum = prefix[m] + m * held + (b - m) * self.window_tokens
        else:
            win_sum = full_sum
        return self.decode_step_s(np.full(num_steps, float(b)), full_sum, win_sum)

    def step_terms(self, start_tokens: npt.ArrayLike, new_tokens: npt.ArrayLike) -> StepTerms:
        """The parts of one step over sequences each computing `new_tokens` on top of
        `start_tokens` (decode: 1 new token; a prompt chunk: more), at this deployment's
        rates: what `price` (and calibration, which rescales the rates) turns into time."""
        c = np.asarray(start_tokens)
        n = np.asarray(new_tokens)
        end = c + n
        w = self.window_tokens
        chunk = n > 1
        dec = ~chunk
        d_end = end[dec]
        d_full = float(d_end.sum())
        d_win = float(np.minimum(d_end, w).sum()) if w else d_full
        num_tokens = float(n.sum())
        t = StepTerms(
            num_seqs=float(c.size), num_decode=float(dec.sum()), num_chunks=float(chunk.sum()),
            weight_s=float(self.weight_bytes_read(np.float64(num_tokens)))
            / self.weight_bandwidth_bytes_s,
            gemm_s=self.matmul_flops_per_token * num_tokens / self.flops_s,
            kv_s=(self.kv_bytes_per_token_full * d_full + self.kv_bytes_per_token_window * d_win)
            / self.kv_bandwidth_bytes_s,
            score_s=(self.score_bytes_per_pos_full * d_full
                     + self.score_bytes_per_pos_window * d_win) / self.kv_bandwidth_bytes_s,
            decode_attention_s=(self.decode_flops_per_pos_full * d_full
                                + self.decode_flops_per_pos_window * d_win) / self.flops_s,
            comm_s=self.comm_s_fixed + self.comm_s_per_token * num_tokens if c.size else 0.0)
        if chunk.any():
            cf, nf = c[chunk].astype(np.float64), n[chunk].astype(np.float64)
            tiles = np.ceil(nf / rl.ATTENTION_TILE_TOKENS)
            occ = 1.0
            if self.num_sms:
                occ = min(1.0, self.heads_per_gpu * float(tiles.sum()) / self.num_sms)
            t.chunk_kv_s = float(self.kv_bytes(cf + nf).sum()) / self.kv_bandwidth_bytes_s
            t.chunk_tiles_kv_s = float((self.kv_bytes(cf + nf) * tiles).sum()) \
                / self.kv_bandwidth_bytes_s
            flops = float(self.prefill_attention_flops(cf, nf).sum())
            t.chunk_attention_s = flops / (self.attention_flops_s * occ)
            t.chunk_attention_at_gemm_rate_s = flops / self.flops_s
        return t

    def price(self, t: StepTerms) -> float:
        """Step time of `t`: per kernel group (grouped) or one max over the totals."""
        if t.num_seqs == 0:
            return 0.0
        roof = self._roof
        if self.grouped:
            kernels = float(roof(t.weight_s, t.gemm_s))
            fixed = self.layers_s
            if t.num_decode:
                kernels += float(roof(t.kv_s + t.score_s, t.decode_attention_s))
                fixed += self.decode_layers_s
            if t.num_chunks:
                kernels += float(roof(t.chunk_tiles_kv_s, t.chunk_attention_s))
                fixed += self.chunk_layers_s
        else:
            kernels = max(t.weight_s + t.kv_s + t.score_s + t.chunk_kv_s,
                          t.gemm_s + t.decode_attention_s + t.chunk_attention_at_gemm_rate_s)
            fixed = self.layers_s
        return kernels + fixed + t.comm_s + self.overhead_s + self.overhead_per_seq_s * t.num_seqs

    def batch_step_s(self, start_tokens: npt.ArrayLike, new_tokens: npt.ArrayLike) -> float:
        """One step over sequences each computing `new_tokens` on top of `start_tokens`."""
        n = np.asarray(new_tokens)
        if n.size == 0:
            return 0.0
        if not (n > 1).any():  # pure decode: the vectorized path, same arithmetic
            c = np.asarray(start_tokens)
            end = c + n
            w = self.window_tokens
            full = float(end.sum())
            win = float(np.minimum(end, w).sum()) if w else full
            return float(self.decode_step_s(float(c.size), full, win))
        return self.price(self.step_terms(start_tokens, new_tokens))


@dataclass(slots=True)
class StepTerms:
    """One step's parts in seconds at the deployment's rates (chunk terms 0 without one)."""

    num_seqs: float
    num_decode: float
    num_chunks: float
    weight_s: float  # weight bytes read / weight-stream rate
    gemm_s: float  # GEMM FLOPs / GEMM rate
    kv_s: float  # decode KV bytes / KV-stream rate
    score_s: float  # unfused attention's score bytes / KV-stream rate
    decode_attention_s: float
    comm_s: float
    chunk_kv_s: float = 0.0  # K/V of the chunks' keys, read once
    chunk_tiles_kv_s: float = 0.0  # ... once per query tile
    chunk_attention_s: float = 0.0  # at the attention rate, occupancy included
    chunk_attention_at_gemm_rate_s: float = 0.0  # cost model 1's pricing


def coefficients(d: rl.Deployment) -> StepCoefficients:
    """Fold the model's per-layer sums into per-GPU coefficients, mirroring
    `roofline.decode_step` / `roofline.prefill_s` term by term (tests hold them equal)."""
    m, g, e, n = d.model, d.gpu, d.eff, d.num_gpus
    dense, expert, embed = m.weight_bytes_parts(d.weight)
    per_token = 0.0
    if m.tie_word_embeddings:
        dense += embed  # the table is the LM head: read in full every step
    else:
        per_token = m.hidden_size * 2  # one looked-up row of the input table per token
    sliding = m.sliding_layers or (False,) * m.num_layers
    window = m.sliding_window
    num_window = sum(1 for s in sliding if s and window) if window else 0
    num_full = m.num_layers - num_window
    kv_layer_bytes = m.kv_values_per_token_per_layer_per_gpu(1) * d.kv.bits // 8
    kv_div = 1 if m.is_mla else n  # an MLA latent replicates on every GPU
    # attention_flops_per_token(1) holds one token per layer: per_pos * num_layers.
    per_pos = m.attention_flops_per_token(1) / m.num_layers
    # prefill_s: 2 * s * held * heads * head_dim per layer (QK^T and AV over the triangle).
    per_pair = 2 * m.num_heads * m.head_dim
    score = e.score_bytes * m.num_heads
    comm0 = float(rl.allreduce_s(d, np.array([0.0]))[0])
    comm1 = float(rl.allreduce_s(d, np.array([1.0]))[0])
    peak = g.peak_flops(d.weight.compute)
    bw = g.hbm_bandwidth_bytes_s
    return StepCoefficients(
        dense_weight_bytes=dense / n, weight_bytes_per_token=per_token / n,
        expert_weight_bytes=expert / n if m.is_moe else 0.0,
        top_k=m.num_experts_per_tok if m.is_moe else 0,
        num_experts=m.num_experts if m.is_moe else 0,
        kv_bytes_per_token_full=kv_layer_bytes * num_full / kv_div,
        kv_bytes_per_token_window=kv_layer_bytes * num_window / kv_div,
        window_tokens=window if num_window else 0,
        decode_flops_per_pos_full=per_pos * num_full / n,
        decode_flops_per_pos_window=per_pos * num_window / n,
        score_bytes_per_pos_full=score * num_full / n,
        score_bytes_per_pos_window=score * num_window / n,
        prefill_flops_per_pair_full=per_pair * num_full / n,
        prefill_flops_per_pair_window=per_pair * num_window / n,
        matmul_flops_per_token=2 * m.matmul_params_per_token / n,
        weight_bandwidth_bytes_s=bw * e.weight_stream(d.weight),
        kv_bandwidth_bytes_s=bw * e.kv_stream(),
        flops_s=peak * e.compute, attention_flops_s=peak * e.attention_compute,
        heads_per_gpu=max(1, -(-m.num_heads // n)), num_sms=g.num_sms,
        sharpness=e.roof_sharpness, grouped=e.grouped,
        layers_s=m.num_layers * e.layer_s, decode_layers_s=m.num_layers * e.decode_layer_s,
        chunk_layers_s=m.num_layers * e.chunk_layer_s,
        comm_s_fixed=comm0, comm_s_per_token=comm1 - comm0,
        overhead_s=e.overhead_s, overhead_per_seq_s=e.overhead_per_seq_s)
