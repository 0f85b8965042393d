"""Time of one engine step with a mixed batch (prefill chunks + decode tokens), priced by the
same roofline as `bstar.roofline` and reducing to it exactly:

- a step of B decode sequences all at context s costs `roofline.decode_step(d, [B], s)`;
- a step that prefills one prompt of n tokens from scratch costs `roofline.prefill_s(d, n)`
  (plus the per-sequence overhead that decode steps also pay).

Per step, over the scheduled sequences i, each computing n_i new tokens on top of c_i already
in the KV cache (decode: n_i = 1):

    tokens T            sum n_i                      (weights read once: W_read(T))
    KV bytes            sum kv_bytes(c_i + n_i)      (read the old KV, write the new)
    FLOPs               2 * P_matmul * T + attention
      decode            per_pos * held(c_i + 1)      (roofline.attention_flops_per_token)
      prefill chunk     causal area of rows c..c+n:  2*H*d * ((c+n) held(c+n) - c held(c))
    step time           max(bytes / BW_eff, FLOPs / peak_eff) + all-reduces(T) + overhead(S)

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
    prefill_flops_per_pair_full: float  # attention FLOPs per causal (query, key) area unit
    prefill_flops_per_pair_window: float
    matmul_flops_per_token: float
    bandwidth_bytes_s: float  # effective: datasheet x efficiency
    flops_s: float  # effective
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

    def decode_attention_flops(self, context_tokens: FloatArray) -> FloatArray:
        full, win = self.held(context_tokens)
        return self.decode_flops_per_pos_full * full + self.decode_flops_per_pos_window * win

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

    def step_s(self, num_tokens: npt.ArrayLike, num_seqs: npt.ArrayLike,
               kv_bytes: npt.ArrayLike, attention_flops: npt.ArrayLike) -> FloatArray:
        """Step time from a step's totals (each may be an array: one entry per step)."""
        t = np.asarray(num_tokens, dtype=np.float64)
        memory_s = (self.weight_bytes_read(t) + np.asarray(kv_bytes)) / self.bandwidth_bytes_s
        compute_s = (self.matmul_flops_per_token * t + np.asarray(attention_flops)) / self.flops_s
        comm_s = np.where(t > 0, self.comm_s_fixed + self.comm_s_per_token * t, 0.0)
        return np.maximum(memory_s, compute_s) + comm_s + self.overhead_s \
            + self.overhead_per_seq_s * np.asarray(num_seqs, dtype=np.float64)

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
        kv = self.kv_bytes_per_token_full * full_sum + self.kv_bytes_per_token_window * win_sum
        attn = self.decode_flops_per_pos_full * full_sum \
            + self.decode_flops_per_pos_window * win_sum
        return self.step_s(np.full(num_steps, float(b)), float(b), kv, attn)

    def scalar_step_s(self, num_tokens: float, num_seqs: float, kv_bytes: float,
                      attention_flops: float) -> float:
        """`step_s` for one step in plain floats: the simulator calls it every step, where
        numpy's per-call overhead on scalars would dominate."""
        w = self.dense_weight_bytes + self.weight_bytes_per_token * num_tokens
        if self.num_experts:
            w += self.expert_weight_bytes * (1.0 - (1.0 - self.top_k / self.num_experts)
                                             ** num_tokens)
        memory_s = (w + kv_bytes) / self.bandwidth_bytes_s
        compute_s = (self.matmul_flops_per_token * num_tokens + attention_flops) / self.flops_s
        comm_s = self.comm_s_fixed + self.comm_s_per_token * num_tokens if num_tokens else 0.0
        return max(memory_s, compute_s) + comm_s + self.overhead_s \
            + self.overhead_per_seq_s * num_seqs

    def batch_step_s(self, start_tokens: npt.ArrayLike, new_tokens: npt.ArrayLike) -> float:
        """One step over sequences each computing `new_tokens` on top of `start_tokens`
        (decode: 1 new token)."""
        c = np.asarray(start_tokens)
        n = np.asarray(new_tokens)
        if c.size == 0:
            return 0.0
        end = c + n
        w = self.window_tokens
        end_full = float(end.sum())
        end_win = float(np.minimum(end, w).sum()) if w else end_full
        kv = self.kv_bytes_per_token_full * end_full + self.kv_bytes_per_token_window * end_win
        chunk = n > 1
        if chunk.any():
            dec = ~chunk
            d_full = float(end[dec].sum())
            d_win = float(np.minimum(end[dec], w).sum()) if w else d_full
            cf, nf = c[chunk].astype(np.float64), n[chunk].astype(np.float64)
            attn = float(self.prefill_attention_flops(cf, nf).sum())
        else:
            d_full, d_win, attn = end_full, end_win, 0.0
        attn += self.decode_flops_per_pos_full * d_full + self.decode_flops_per_pos_window * d_win
        return self.scalar_step_s(float(n.sum()), float(c.size), kv, attn)


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
    comm0 = float(rl.allreduce_s(d, np.array([0.0]))[0])
    comm1 = float(rl.allreduce_s(d, np.array([1.0]))[0])
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
        prefill_flops_per_pair_full=per_pair * num_full / n,
        prefill_flops_per_pair_window=per_pair * num_window / n,
        matmul_flops_per_token=2 * m.matmul_params_per_token / n,
        bandwidth_bytes_s=g.hbm_bandwidth_bytes_s * e.bandwidth,
        flops_s=g.peak_flops(d.weight.compute) * e.compute,
        comm_s_fixed=comm0, comm_s_per_token=comm1 - comm0,
        overhead_s=e.overhead_s, overhead_per_seq_s=e.overhead_per_seq_s)
