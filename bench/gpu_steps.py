"""Measure real decode, mixed (chunked-prefill) and GEMV steps on a GPU, as JSONL.

This is the harness behind `data/h200/*.jsonl` (see `data/README.md`). It is not a serving
engine: it times the step an engine runs, with random bf16 weights of a model's exact
shapes, captured once in a CUDA graph and replayed (median of CUDA-event timings), so
Python launch overhead is gone and what remains is the GPU's own time.

One decode step, per layer: norm, fused QKV GEMM (+bias where the model has one), write of
the new token's K/V into a contiguous `[batch, kv_heads, context, head_dim]` cache,
attention over `context` cached tokens (two batched GEMMs and an fp32 softmax), O GEMM,
norm, FFN (fused gate/up + SiLU x up + down, or up + ReLU + down for OPT); then the final
norm, the LM head and a greedy argmax. No rotary embedding (elementwise, negligible).

A mixed step (`kind: "mixed"`) is what vLLM's chunked prefill runs: `batch` sequences
decoding at `context` tokens plus one prompt chunk of `chunk_tokens` new tokens on top of
`chunk_start` cached tokens of the same prompt. The GEMMs run over batch + chunk rows; the
chunk's causal attention covers `chunk_start + chunk_tokens` keys; the LM head runs over
the batch's rows plus the chunk's last token, as vLLM does.

A GEMV row (`kind: "gemv"`) times `x[rows, K] @ W[N, K]^T` over a chain of distinct
matrices totalling >= 1 GiB (far past L2), for the weight-stream efficiency by matrix size.

    python bench/gpu_steps.py --out steps.jsonl              # everything, ~4 min on an H200
    python bench/gpu_steps.py --device cpu --quick --out x   # a smoke run of the harness
    python bench/gpu_steps.py --models internlm-20b,opt-2.7b --out heldout.jsonl

Needs PyTorch (CUDA for real figures). Only the model configs bundled with bstar are read.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "src" / "bstar" / "presets" / "models"


class Shapes:
    """The tensor shapes of one decoder-only model, read from its HF config.json."""

    def __init__(self, name: str, cfg: dict[str, Any], num_layers: int | None = None) -> None:
        self.name = name
        self.hidden = int(cfg["hidden_size"])
        self.num_layers = int(num_layers or cfg["num_hidden_layers"])
        self.num_heads = int(cfg["num_attention_heads"])
        self.num_kv_heads = int(cfg.get("num_key_value_heads") or self.num_heads)
        self.head_dim = int(cfg.get("head_dim") or self.hidden // self.num_heads)
        self.opt = cfg.get("model_type") == "opt"
        self.ffn = int(cfg.get("ffn_dim") or cfg["intermediate_size"])
        self.gated = not self.opt
        self.vocab = int(cfg["vocab_size"])
        tied = cfg.get("tie_word_embeddings")
        # HF's default: OPT and Gemma tie the LM head to the embedding table.
        self.tied = bool(tied) if tied is not None else (
            self.opt or str(cfg.get("model_type", "")).startswith("gemma"))
        self.qkv_bias = self.opt or cfg.get("model_type") == "qwen2"
        self.bias = self.opt  # OPT has biases on every linear layer

    @classmethod
    def preset(cls, name: str, num_layers: int | None = None) -> Shapes:
        cfg = json.loads((PRESETS / f"{name.split('@')[0]}.json").read_text())
        return cls(name, cfg, num_layers)

    @property
    def q_out(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_out(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, elem_bytes: int = 2) -> int:
        return 2 * self.num_layers * self.kv_out * elem_bytes


class Model:
    """Random weights of `shapes` on `device`; `weight_bytes` counts every tensor made."""

    def __init__(self, s: Shapes, device: str, dtype: torch.dtype, fp8: bool = False) -> None:
        self.s, self.device, self.dtype, self.fp8 = s, device, dtype, fp8
        self.weight_bytes = 0

        def mat(n: int, k: int) -> Any:
            w = torch.randn(n, k, device=device, dtype=dtype) * 0.02
            if fp8:
                w8 = w.to(torch.float8_e4m3fn)
                del w
                self.weight_bytes += w8.numel() + 4  # + the per-tensor fp32 scale
                return (w8.t(), torch.ones((), device=device, dtype=torch.float32))
            self.weight_bytes += w.numel() * w.element_size()
            return w

        def vec(n: int) -> torch.Tensor:
            v = torch.randn(n, device=device, dtype=dtype) * 0.02
            self.weight_bytes += v.numel() * v.element_size()
            return v

        h = s.hidden
        self.embed = torch.randn(s.vocab, h, device=device, dtype=dtype) * 0.02
        self.weight_bytes += self.embed.numel() * self.embed.element_size()
        self.layers = []
        for _ in range(s.num_layers):
            layer = {
                "norm1": vec(h), "norm2": vec(h),
                "qkv": mat(s.q_out + 2 * s.kv_out, h),
                "qkv_b": vec(s.q_out + 2 * s.kv_out) if s.qkv_bias else None,
                "o": mat(h, s.q_out), "o_b": vec(h) if s.bias else None,
                "up": mat((2 if s.gated else 1) * s.ffn, h),
                "up_b": vec(s.ffn) if s.bias else None,
                "down": mat(h, s.ffn), "down_b": vec(h) if s.bias else None,
            }
            self.layers.append(layer)
        self.final_norm = vec(h)
        # The LM head stays in the activation dtype (vLLM leaves it unquantized under fp8).
        if s.tied:
            self.lm_head = self.embed
        else:
            self.lm_head = torch.randn(s.vocab, h, device=device, dtype=dtype) * 0.02
            self.weight_bytes += self.lm_head.numel() * self.lm_head.element_size()

    def linear(self, x: torch.Tensor, w: Any, b: torch.Tensor | None) -> torch.Tensor:
        if isinstance(w, tuple):
            wt, scale = w
            rows = x.shape[0]
            pad = (-rows) % 16  # _scaled_mm wants row counts divisible by 16
            xp = F.pad(x, (0, 0, 0, pad)) if pad else x
            y = torch._scaled_mm(xp.to(torch.float8_e4m3fn), wt, scale_a=scale, scale_b=scale,
                                 out_dtype=self.dtype)[:rows]
            return y + b if b is not None else y
        return F.linear(x, w, b)

    def norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self.s.opt:
            return F.layer_norm(x, (x.shape[-1],), w)
        return F.rms_norm(x, (x.shape[-1],), w, 1e-5)

    def ffn(self, x: torch.Tensor, layer: dict[str, Any]) -> torch.Tensor:
        up = self.linear(x, layer["up"], layer["up_b"])
        if self.s.gated:
            g, u = up.chunk(2, dim=-1)
            act = F.silu(g) * u
        else:
            act = F.relu(up)
        return self.linear(act, layer["down"], layer["down_b"])


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [B, kvh, group, hd] against k, v [B, kvh, ctx, hd]: two batched GEMMs, fp32 softmax."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.matmul(probs, v)


class StepInputs:
    """Static buffers for one (batch, context, chunk) step: KV caches carved from a pool."""

    def __init__(self, m: Model, pool: torch.Tensor, batch: int, context: int,
                 chunk_tokens: int, chunk_start: int) -> None:
        s = m.s
        self.batch, self.context = batch, context
        self.chunk_tokens, self.chunk_start = chunk_tokens, chunk_start
        offset = 0

        def carve(*shape: int) -> torch.Tensor:
            nonlocal offset
            n = math.prod(shape)
            if offset + n > pool.numel():
                raise MemoryError("KV pool too small for this point")
            t = pool[offset:offset + n].view(*shape)
            offset += n
            return t

        self.k = [carve(batch, s.num_kv_heads, context, s.head_dim) for _ in range(s.num_layers)]
        self.v = [carve(batch, s.num_kv_heads, context, s.head_dim) for _ in range(s.num_layers)]
        span = chunk_start + chunk_tokens
        self.ck = [carve(1, s.num_kv_heads, span, s.head_dim) for _ in range(s.num_layers)]
        self.cv = [carve(1, s.num_kv_heads, span, s.head_dim) for _ in range(s.num_layers)]
        self.kv_bytes = offset * pool.element_size()
        self.tokens = torch.randint(0, s.vocab, (batch + chunk_tokens,), device=pool.device)
        self.mask = None
        if chunk_tokens and chunk_start:
            i = torch.arange(chunk_tokens, device=pool.device)[:, None]
            j = torch.arange(span, device=pool.device)[None, :]
            self.mask = j <= chunk_start + i  # causal, offset by the cached prefix


def step(m: Model, inp: StepInputs) -> torch.Tensor:
    """One engine step; returns the greedy next token of every row that samples."""
    s, b, n = m.s, inp.batch, inp.chunk_tokens
    x = m.embed[inp.tokens]
    group = s.num_heads // s.num_kv_heads
    for li, layer in enumerate(m.layers):
        h = m.norm(x, layer["norm1"])
        qkv = m.linear(h, layer["qkv"], layer["qkv_b"])
        q, k, v = qkv.split([s.q_out, s.kv_out, s.kv_out], dim=-1)
        outs = []
        if b:
            qd = q[:b].view(b, s.num_kv_heads, group, s.head_dim)
            pos = inp.context - 1
            inp.k[li][:, :, pos] = k[:b].view(b, s.num_kv_heads, s.head_dim)
            inp.v[li][:, :, pos] = v[:b].view(b, s.num_kv_heads, s.head_dim)
            outs.append(decode_attention(qd, inp.k[li], inp.v[li]).reshape(b, s.q_out))
        if n:
            c0 = inp.chunk_start
            inp.ck[li][0, :, c0:] = k[b:].view(n, s.num_kv_heads, s.head_dim).transpose(0, 1)
            inp.cv[li][0, :, c0:] = v[b:].view(n, s.num_kv_heads, s.head_dim).transpose(0, 1)
            qc = q[b:].view(n, s.num_heads, s.head_dim).transpose(0, 1).unsqueeze(0)
            if inp.mask is None:  # a prompt's first chunk: flash attention, causal
                oc = F.scaled_dot_product_attention(qc, inp.ck[li], inp.cv[li],
                                                    is_causal=True, enable_gqa=group > 1)
            else:  # on top of a cached prefix: the masked (memory-efficient) kernel, which
                # takes no grouped K/V, so the chunk's keys are expanded to every head
                kc = inp.ck[li].repeat_interleave(group, dim=1)
                vc = inp.cv[li].repeat_interleave(group, dim=1)
                oc = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=inp.mask)
            outs.append(oc[0].transpose(0, 1).reshape(n, s.q_out))
        attn = outs[0] if len(outs) == 1 else torch.cat(outs)
        x = x + m.linear(attn, layer["o"], layer["o_b"])
        x = x + m.ffn(m.norm(x, layer["norm2"]), layer)
    rows = x[:b] if not n else torch.cat([x[:b], x[-1:]])  # decode rows + the chunk's last
    logits = m.linear(m.norm(rows, m.final_norm), m.lm_head, None)
    return logits.argmax(-1)


def time_fn(fn: Callable[[], Any], device: str, replays: int) -> dict[str, float]:
    """Median/min/max ms of `fn`: captured in a CUDA graph and replayed on CUDA."""
    if device == "cuda":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        for _ in range(3):
            graph.replay()
        times = []
        for _ in range(replays):
            a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            z.record()
            z.synchronize()
            times.append(a.elapsed_time(z))
        del graph
    else:
        fn()
        times = []
        for _ in range(max(3, replays // 5)):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return {"ms": statistics.median(times), "ms_min": min(times), "ms_max": max(times)}


def eager_ms(fn: Callable[[], Any], device: str) -> float:
    """The same step launched from Python each time (no graph): median of 10."""
    times = []
    for _ in range(12):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[2:])


class Writer:
    def __init__(self, path: Path) -> None:
        self.f = path.open("a")

    def __call__(self, row: dict[str, Any]) -> None:
        self.f.write(json.dumps(row) + "\n")
        self.f.flush()
        keys = ("kind", "model", "context", "batch", "chunk_tokens", "chunk_start", "step_ms",
                "rows", "n", "k", "bytes_s")
        print(" ".join(f"{k}={row[k]}" for k in keys if k in row), flush=True)


def free_bytes(device: str) -> int:
    if device == "cuda":
        return int(torch.cuda.mem_get_info()[0])
    return 2 * 2**30


def run_model(name: str, grid: list[tuple[int, list[int]]], mixed: list[tuple[int, int, int]],
              args: argparse.Namespace, out: Writer, *, fp8: bool = False,
              num_layers: int | None = None, eager_at: tuple[int, ...] = (1, 64)) -> None:
    s = Shapes.preset(name, num_layers)
    label = name + ("@fp8" if fp8 else "") + (f"@{num_layers}l" if num_layers else "")
    dev, dtype = args.device, torch.bfloat16
    m = Model(s, dev, dtype, fp8=fp8)
    out({"kind": "weights", "model": label, "weight_bytes": m.weight_bytes,
         "num_layers": s.num_layers, "weight_dtype": "fp8_e4m3" if fp8 else "bf16"})
    headroom_bytes = 6 * 2**30 if dev == "cuda" else 0  # activations, graph pools, cuBLAS
    budget = min(free_bytes(dev) - headroom_bytes, args.kv_budget_bytes)
    pool = torch.empty(budget // 2, device=dev, dtype=dtype)
    pool.normal_(0, 1)
    with torch.inference_mode():
        for context, batches in grid:
            for batch in batches:
                if batch * context * s.kv_bytes_per_token() > budget:
                    continue
                inp = StepInputs(m, pool, batch, context, 0, 0)
                r = time_fn(partial(step, m, inp), dev, args.replays)
                row = {"kind": "decode", "model": label, "context": context, "batch": batch,
                       "kv_bytes": inp.kv_bytes, "weight_bytes": m.weight_bytes,
                       "step_ms": r["ms"], "step_ms_min": r["ms_min"], "step_ms_max": r["ms_max"]}
                if context == grid[0][0] and batch in eager_at:
                    row["eager_step_ms"] = eager_ms(partial(step, m, inp), dev)
                row["effective_bytes_s"] = (m.weight_bytes + inp.kv_bytes) / (r["ms"] / 1e3)
                out(row)
                del inp
        for batch, chunk_tokens, chunk_start in mixed:
            context = args.mixed_context
            try:
                inp = StepInputs(m, pool, batch, context, chunk_tokens, chunk_start)
            except MemoryError:  # this shape's KV does not fit the pool: skip the point
                continue
            r = time_fn(partial(step, m, inp), dev, args.replays)
            out({"kind": "mixed", "model": label, "batch": batch, "context": context,
                 "chunk_tokens": chunk_tokens, "chunk_start": chunk_start,
                 "weight_bytes": m.weight_bytes, "kv_bytes": inp.kv_bytes,
                 "step_ms": r["ms"], "step_ms_min": r["ms_min"], "step_ms_max": r["ms_max"]})
            del inp
    del pool, m
    if dev == "cuda":
        torch.cuda.empty_cache()


def gemv_chain(x: torch.Tensor, ws: list[torch.Tensor], ys: list[torch.Tensor]) -> None:
    for w, y in zip(ws, ys, strict=True):
        torch.matmul(x, w.t(), out=y)


GEMV_SHAPES = [(1024, 1024), (2048, 2048), (4096, 1024), (2560, 2560), (4096, 4096),
              (6144, 4096), (8192, 8192), (4096, 14336), (28672, 4096), (128256, 4096)]


def run_gemv(args: argparse.Namespace, out: Writer,
             shapes: list[tuple[int, int]] = GEMV_SHAPES) -> None:
    dev = args.device
    total_bytes = args.gemv_bytes
    with torch.inference_mode():
        for n, k in shapes:
            count = max(2, math.ceil(total_bytes / (2 * n * k)))
            ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(count)]
            for rows in (1, 16, 64, 256):
                x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
                ys = [torch.empty(rows, n, device=dev, dtype=torch.bfloat16) for _ in ws]

                r = time_fn(partial(gemv_chain, x, ws, ys), dev, args.replays)
                per_ms = r["ms"] / count
                moved = 2 * (n * k + rows * (n + k))
                out({"kind": "gemv", "n": n, "k": k, "rows": rows, "matrices": count,
                     "matrix_bytes": 2 * n * k, "ms_per_matrix": per_ms,
                     "bytes_s": moved / (per_ms / 1e3),
                     "flops_s": 2 * rows * n * k / (per_ms / 1e3)})
            del ws
            if dev == "cuda":
                torch.cuda.empty_cache()


def env_row(device: str) -> dict[str, Any]:
    row: dict[str, Any] = {"kind": "env", "torch": torch.__version__, "device": device}
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        row.update(gpu=p.name, total_memory=p.total_memory, sms=p.multi_processor_count,
                   cuda=torch.version.cuda)
        try:
            q = "name,driver_version,clocks.max.sm,clocks.max.mem,memory.total"
            smi = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            row["nvidia_smi"] = smi.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="tiny grid (smoke test of the harness)")
    ap.add_argument("--only", default="", help="comma list of parts: models,mixed,mixed2,gemv,fp8")
    ap.add_argument("--models", default="",
                    help="comma list of bundled presets: decode curves of just these, at "
                         "--contexts (held-out checks; replaces --only)")
    ap.add_argument("--contexts", default="512,2048",
                    help="contexts for --models (default 512,2048)")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--kv-budget-gb", type=float, default=100.0)
    ap.add_argument("--mixed-context", type=int, default=1024)
    args = ap.parse_args(argv)
    args.kv_budget_bytes = int(args.kv_budget_gb * 1e9)
    args.gemv_bytes = 2**30
    parts = set(args.only.split(",")) if args.only else {"models", "mixed", "gemv", "fp8"}
    out = Writer(args.out)
    out(env_row(args.device))
    if args.quick:
        args.kv_budget_bytes, args.gemv_bytes, args.mixed_context = 2**28, 2**24, 256
        run_model("opt-1.3b", [(128, [1, 4])], [(4, 32, 0), (4, 32, 64), (0, 64, 0)], args,
                  out, num_layers=2, eager_at=(1,))
        run_model("qwen2.5-7b", [(128, [2])], [(2, 16, 32)], args, out, num_layers=1,
                  eager_at=())
        run_gemv(args, out, shapes=[(256, 256), (512, 128)])
        return 0
    decode_grid = [(512, [1, 4, 16, 32, 64, 128, 256, 512, 1024]),
                   (2048, [1, 4, 16, 32, 64, 128, 256]),
                   (8192, [1, 4, 16, 32, 64])]
    small_grid = [(512, [1, 4, 16, 64, 256]), (2048, [1, 16, 64]), (8192, [1, 16])]
    mixed_grid = [(b, n, c) for b in (0, 16, 64, 256) for n in (0, 128, 512, 2048)
                  for c in (0, 4096) if (b, n) != (0, 0) and not (n == 0 and c)]
    t0 = time.time()
    if args.models:
        batches = [1, 4, 16, 32, 64, 128, 256, 512, 1024]
        grid = [(int(c), batches) for c in args.contexts.split(",")]
        for name in args.models.split(","):
            try:
                run_model(name, grid, [], args, out, eager_at=())
            except Exception as exc:  # record and go on: one model must not cost the rest
                out({"kind": "error", "model": name, "error": repr(exc)[:300]})
        print(f"done in {time.time() - t0:.1f} s", file=sys.stderr)
        return 0
    if "mixed" in parts:
        run_model("llama-3-8b", small_grid, mixed_grid, args, out)
    if "mixed2" in parts:  # the same mixes on other shapes: does the step model transfer?
        for name in ("llama-2-7b", "qwen2.5-7b", "opt-1.3b"):
            run_model(name, [], mixed_grid, args, out)
    if "models" in parts:
        for name in ("llama-2-7b", "mistral-7b", "qwen2.5-7b", "opt-1.3b", "opt-6.7b",
                     "llama-2-13b"):
            try:
                run_model(name, decode_grid, [], args, out)
            except Exception as exc:  # record and go on: one model must not cost the rest
                out({"kind": "error", "model": name, "error": repr(exc)[:300]})
        run_model("llama-3-8b", small_grid, [], args, out, num_layers=8)
    if "gemv" in parts:
        run_gemv(args, out)
    if "fp8" in parts and args.device == "cuda":
        try:
            run_model("llama-3-8b", small_grid, [], args, out, fp8=True)
        except Exception as exc:
            out({"kind": "error", "model": "llama-3-8b@fp8", "error": repr(exc)[:300]})
    print(f"done in {time.time() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
