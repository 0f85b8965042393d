"""A runs table: one row per closed-loop benchmark run of a real server, as InferenceMAX
publishes them (`data/inferencemax/runs.csv`; its README says what each column is).

A run is `concurrency` users in a closed loop (each sends its next request as soon as its
last one finished; all start at t = 0) sending `num_prompts` requests in all, whose prompt
and output lengths are drawn uniformly from [prompt_len_min, prompt_len_max] and
[output_len_min, output_len_max] (bench_serving's random dataset; the server generates each
output in full: ignore_eos). The client measures every request from its start: nothing is
left out as warm-up.

Each row becomes a `bstar.stages_table.Stage` (arrival "concurrency", the uniform prompt
lengths as their min and max percentiles, `output_len_min`, no warm-up), so `bstar validate`
simulates and scores it with the load-stage machinery (`bstar.validate_runs`).

Required columns: run, model, gpu, num_gpus, engine, max_num_seqs, max_num_batched_tokens,
concurrency, num_prompts, prompt_len_min, prompt_len_max, output_len_min, output_len_max,
ttft_mean_ms, tpot_mean_ms, e2e_mean_ms, source.

Optional columns say how the run's server was set, so that every run is read like for like
(a blank cell, or a table without the column: the engine's default for that GPU):
`memory_fraction` (vLLM --gpu-memory-utilization, SGLang --mem-fraction-static,
TensorRT-LLM free_gpu_memory_fraction), `kv_cache_dtype` (any name `bstar plan --kv-dtype`
takes, engines' spellings too: fp8_e4m3, auto), `block_size` (KV block, tokens),
`cuda_graph_mode` (none, piecewise, full, full_and_piecewise, full_decode_only),
`cuda_graph_max_tokens` (the largest step a captured graph runs), `decode_steps_per_schedule`
(SGLang --num-continuous-decode-steps), `scheduler_recv_interval` (SGLang
--scheduler-recv-interval: decode rounds between two looks at the request queue) and
`stream_interval` (tokens per stream chunk: the ITL's chunks; SGLang streams a request's
first token at once, so it does not delay TTFT: `first_chunk_tokens` says when an engine's
first chunk waits), and TensorRT-LLM's attention-DP balance, `attention_dp_timeout_iters`
and `attention_dp_batching_wait_iters` (its attention_dp_config with enable_balance; blank:
no balance, TensorRT-LLM's default; bstar.sim.adp). docs/cost-model.md ("2026 models on
real engines") says how the simulator honours each.

Parallel layout (issue 38): `expert_parallel` (the experts split over that many GPUs, each
holding whole experts; 1: tensor-parallel experts), `dp_attention` and `data_parallel`
(attention runs data parallel in that many ranks of num_gpus / data_parallel GPUs each; a
true `dp_attention` with a blank `data_parallel` is num_gpus ranks, TensorRT-LLM's and
SGLang's enable-dp-attention at attention TP 1). `warmup_prompts`: requests the client sends
first, waits for and leaves out of the figures (InferenceX's 2 x CONC; benchmark_serving
gathers them before the run starts). They are not simulated: the run's `num_prompts` start
as above, from an idle server, all `concurrency` users at once, and a warm one (no
`cold_start_s`). Speculative decoding:
`spec_method` (mtp, eagle, ngram; blank: none), `num_speculative_tokens` (draft tokens a
step verifies) and `acceptance_rate` (a stated per-token acceptance; blank: `bstar
validate` fits it, bstar.validate_runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bstar.errors import BstarError
from bstar.fit.points import read_columns
from bstar.specs.precision import check_weight_dtype, kv_dtype_for
from bstar.stages_table import Stage, _float, _int

REQUIRED = ("run", "model", "gpu", "num_gpus", "engine", "max_num_seqs",
            "max_num_batched_tokens", "concurrency", "num_prompts", "prompt_len_min",
            "prompt_len_max", "output_len_min", "output_len_max", "ttft_mean_ms",
            "tpot_mean_ms", "e2e_mean_ms", "source")
# Every column, in the order bench/to_inferencemax.py writes them.
COLUMNS = ("run", "model", "gpu", "num_gpus", "expert_parallel", "dp_attention",
           "data_parallel", "engine", "engine_version", "dtype", "max_num_seqs",
           "max_num_batched_tokens", "concurrency", "num_prompts", "warmup_prompts",
           "prompt_len_min", "prompt_len_max", "output_len_min", "output_len_max",
           "ignore_eos", "spec_method", "num_speculative_tokens", "acceptance_rate",
           "ttft_mean_ms", "ttft_median_ms", "ttft_p99_ms",
           "tpot_mean_ms", "tpot_median_ms", "tpot_p99_ms", "itl_mean_ms", "e2e_mean_ms",
           "e2e_median_ms", "e2e_p99_ms", "output_tok_s_per_gpu", "total_tok_s_per_gpu",
           "first_chunk_tokens", "memory_fraction", "kv_cache_dtype", "block_size",
           "cuda_graph_mode", "cuda_graph_max_tokens", "decode_steps_per_schedule",
           "scheduler_recv_interval", "stream_interval", "attention_dp_timeout_iters",
           "attention_dp_batching_wait_iters", "source")
# vLLM's CUDAGraphMode names (vllm/config/compilation.py), lower case; SGLang and
# TensorRT-LLM capture full decode graphs up to a batch size: full_decode_only.
CUDA_GRAPH_MODES = ("none", "piecewise", "full", "full_and_piecewise", "full_decode_only")
MAX_NUM_GPUS = 4096  # a table's num_gpus past this is a typo, not a deployment


def is_runs_table(header: Sequence[str]) -> bool:
    return "num_prompts" in header and "output_len_max" in header


def _flag(value: str, at: str, name: str) -> bool:
    v = value.strip().lower()
    if v not in ("", "true", "false", "1", "0", "yes", "no"):
        raise BstarError(f"{at}: {name} {value!r} is not true or false")
    return v in ("true", "1", "yes")


def runs_from_csv(text: str, where: str = "table", base_dir: Path | None = None
                  ) -> list[Stage]:
    """Parse a runs table (header row; lines starting with # are comments) into stages."""
    table = read_columns(text, where, REQUIRED, COLUMNS)
    out = []
    for cells, at in table.rows():
        r = {h: (c or "").strip() for h, c in cells.items()}
        if not r["source"]:
            raise BstarError(f"{at}: every row needs its source")
        ints = {k: _int(r, k, at, required=True) or 1 for k in (
            "max_num_seqs", "max_num_batched_tokens", "concurrency",
            "num_prompts", "prompt_len_min", "prompt_len_max", "output_len_min",
            "output_len_max")}
        ints["num_gpus"] = _int(r, "num_gpus", at, required=True,
                                maximum=MAX_NUM_GPUS) or 1
        for lo, hi in (("prompt_len_min", "prompt_len_max"),
                       ("output_len_min", "output_len_max")):
            if ints[lo] > ints[hi]:
                raise BstarError(f"{at}: {lo} {ints[lo]} is above {hi} {ints[hi]}")
        ttft, tpot, e2e = (_float(r, k, at, required=True) or 0.0
                           for k in ("ttft_mean_ms", "tpot_mean_ms", "e2e_mean_ms"))
        out_s = _float(r, "output_tok_s_per_gpu", at)
        settings = _settings(r, at)
        layout = _layout(r, at, ints["num_gpus"])
        warm = _int(r, "warmup_prompts", at, minimum=0) or 0
        sent = ints["num_prompts"]
        out.append(Stage(
            stage=r["run"] or at, model=r["model"], gpu=r["gpu"], num_gpus=ints["num_gpus"],
            engine=r["engine"], max_num_seqs=ints["max_num_seqs"],
            max_num_batched_tokens=ints["max_num_batched_tokens"], arrival="concurrency",
            # unknown; a closed loop's state is not read from its TTFT growth
            duration_s=1.0,
            prompt_len=((0.0, float(ints["prompt_len_min"])),
                        (1.0, float(ints["prompt_len_max"]))),
            output_len=ints["output_len_max"], ttft_mean_ms=ttft, e2e_mean_ms=e2e,
            source=r["source"], concurrency=ints["concurrency"],
            engine_version=r.get("engine_version", ""), dtype=r.get("dtype", ""),
            ignore_eos=not r.get("ignore_eos") or _flag(r["ignore_eos"], at, "ignore_eos"),
            requests_sent=sent, requests_ok=sent,
            tpot_mean_ms=tpot, ttft_p50_ms=_float(r, "ttft_median_ms", at),
            output_tok_s=None if out_s is None else out_s * ints["num_gpus"],
            where=at, base_dir=str(base_dir) if base_dir else "",
            output_len_min=ints["output_len_min"], warmup_fraction=0.0, warmed_up=warm > 0,
            **layout,
            first_chunk_tokens=_int(r, "first_chunk_tokens", at) or 1, **settings))
    if not out:
        raise BstarError(f"{where}: no rows")
    return out


def _layout(r: dict[str, str], at: str, num_gpus: int) -> dict[str, Any]:
    """The run's parallel layout and speculation (module docstring), checked."""
    ep = _int(r, "expert_parallel", at) or 1
    dpa = _flag(r.get("dp_attention", ""), at, "dp_attention")
    dp = _int(r, "data_parallel", at) or (num_gpus if dpa else 1)
    for name, v in (("expert_parallel", ep), ("data_parallel", dp)):
        if num_gpus % v:
            raise BstarError(f"{at}: {name} {v} does not divide num_gpus {num_gpus}")
    method = r.get("spec_method", "").lower()
    k = _int(r, "num_speculative_tokens", at) or 0
    if method in ("", "none"):
        method, k = "", 0
    elif k < 1:
        raise BstarError(f"{at}: spec_method {method} needs num_speculative_tokens")
    a = _float(r, "acceptance_rate", at)
    if a is not None and not 0 < a <= 1:
        raise BstarError(f"{at}: acceptance_rate must be in (0, 1], got {a}")
    return {"expert_parallel": ep, "dp_attention": dp > 1, "data_parallel": dp,
            "spec_method": method, "num_speculative_tokens": k, "acceptance_rate": a}


def _settings(r: dict[str, str], at: str) -> dict[str, Any]:
    """The run's optional server settings (module docstring), checked; blank: default."""
    frac = _float(r, "memory_fraction", at)
    if frac is not None and not 0 < frac <= 1:
        raise BstarError(f"{at}: memory_fraction must be in (0, 1], got {r['memory_fraction']}")
    check_weight_dtype(r.get("dtype", ""), f"{at}: dtype")
    kv = r.get("kv_cache_dtype", "")
    if kv:
        kv_dtype_for(kv, where=f"{at}: kv_cache_dtype")  # refuses an unknown name
    mode = r.get("cuda_graph_mode", "").lower()
    if mode and mode not in CUDA_GRAPH_MODES:
        raise BstarError(f"{at}: cuda_graph_mode {r['cuda_graph_mode']!r} is not one of "
                         f"{', '.join(CUDA_GRAPH_MODES)}")
    return {"memory_fraction": frac, "kv_cache_dtype": kv, "cuda_graph_mode": mode,
            "block_size": _int(r, "block_size", at, maximum=1 << 16) or 0,
            "cuda_graph_max_tokens": _int(r, "cuda_graph_max_tokens", at) or 0,
            "decode_steps_per_schedule": _int(r, "decode_steps_per_schedule", at,
                                              maximum=1024) or 1,
            "scheduler_recv_interval": _int(r, "scheduler_recv_interval", at,
                                            maximum=1024) or 1,
            "stream_interval": _int(r, "stream_interval", at, maximum=1 << 20) or 0,
            "attention_dp_timeout_iters": _int(r, "attention_dp_timeout_iters", at,
                                               minimum=0, maximum=1 << 20) or 0,
            "attention_dp_batching_wait_iters": _int(r, "attention_dp_batching_wait_iters",
                                                     at, minimum=0, maximum=1 << 20) or 0}


def load_runs(path: str | Path) -> list[Stage]:
    """Read a runs table from a file (paths in it are relative to its folder)."""
    from bstar import safeio

    p = Path(path)
    text = safeio.read_text(p, safeio.MAX_TABLE_BYTES, "runs table")
    return runs_from_csv(text, str(p), p.resolve().parent)
