"""Write InferenceX's aggregated DeepSeek-R1 runs on H200 as a runs table for
`bstar validate`.

    python bench/to_inferencex.py RUNS.csv > data/inferencex-h200/runs.csv

The input is SemiAnalysis InferenceX's H200 benchmark rows as its dashboard's API returns them
(flattened one row per run; data/inferencex-h200/README.md names the public file). Only the
aggregated rows (`disagg` false: one 8-GPU server) are written; the disaggregated ones need
the disaggregated runs form.

Per run, from the row: tensor, expert and attention-data-parallel sizes, the engine and its
container, MTP or not, the concurrency and the stated lengths; times converted from seconds to
ms. From the benchmark scripts (SemiAnalysisAI/InferenceX,
`benchmarks/single_node/fixed_seq_len/dsr1_fp8_h200{,_mtp,_trt,_trt_mtp}.sh`; the same for
every row of an engine, data/inferencex-h200/README.md): the engine flags below and the
number of draft tokens. Nothing is fitted or typed per row.

GPUs: an aggregated run is one server of `prefill_tp` GPUs on one node (`is_multinode`
false). Nine TensorRT-LLM rows state 64 GPUs; their per-GPU throughput is the run's tokens
over 8 GPUs (tokens per second over the client's span / 8 agrees with `m_output_tput_per_gpu`
to 3%, / 64 would be 8x off), so the table gives the 8 GPUs the server used.

Attention data parallel (`prefill_dp_attention` true, TensorRT-LLM's enable_attention_dp):
every GPU is an attention rank of its own (attention TP 1): data_parallel = TP = 8, the
MTP script gives each rank max_batch_size = CONC / TP, and both scripts balance the ranks
(attention_dp_config: enable_balance, timeout_iters 60, batching_wait_iters 0).

The client draws each prompt and output length uniformly from the integers [int(0.8 L), L]
and generates every output in full. Since SemiAnalysisAI/InferenceX@d053ae24e (2026-01-21) it
first sends 2 x CONC warm-up requests, waits for them and does not count them
(`warmup_prompts`): a run dated after that day is read as warmed up, one dated before as
started cold (a blank `warmup_prompts`; 9 of the 15 TensorRT-LLM runs, none of SGLang's).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bstar.engine_defaults import TRT_LLM_MAX_BATCH_SIZE  # noqa: E402
from bstar.runs_table import COLUMNS  # noqa: E402

SOURCE = "SemiAnalysis InferenceX dashboard API (benchmarks.json, hardware h200)"
RANGE_RATIO = 0.8  # --random-range-ratio
PROMPTS_PER_USER = 10  # --num-prompts = 10 x CONC
WARMUP_PER_USER = 2  # benchmark_lib.sh: 2 x CONC warm-up requests, not counted
# The warm-up came with SemiAnalysisAI/InferenceX@d053ae24e (2026-01-21 17:53 UTC, #480:
# benchmark_lib.sh passes --num-warmups 2 x CONC): a run dated after that day warmed its
# server up; one dated before it started cold.
WARMUP_SINCE = "2026-01-22"
ENGINES = {"sglang": "sglang", "trt": "trt-llm"}
MODEL = "deepseek-v3"  # DeepSeek-R1-0528: the deepseek-v3 preset's architecture
# dsr1_fp8_h200_mtp.sh: --speculative-num-steps 2, --speculative-num-draft-tokens 3, topk 1
SGLANG_MTP_TOKENS = 2
# dsr1_fp8_h200_trt_mtp.sh: num_nextn_predict_layers 3, or 1 with attention DP
TRT_MTP_TOKENS = {False: 3, True: 1}


def _flags(engine: str, conc: int, isl: int, osl: int, tp: int, dp: bool, mtp: int
           ) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) of the server (all its attention ranks)."""
    if engine == "sglang":  # --max-running-requests 512 (1k/1k) or 256, chunked prefill 32k
        return (512 if (isl, osl) == (1024, 1024) else 256), 32768
    if mtp:  # max_batch_size CONC (CONC / TP a rank with attention DP)
        per_rank = max(1, conc // tp) if dp else conc
        tokens = ((mtp + 1) * per_rank + isl + 64 + 63) // 64 * 64
        ranks = tp if dp else 1  # the table's limits are the server's: every rank's
        return per_rank * ranks, tokens * ranks
    tokens = max(8192, (conc + isl + 64 + 63) // 64 * 64)
    return TRT_LLM_MAX_BATCH_SIZE, tokens  # the non-MTP script sets no max_batch_size


def _settings(engine: str, dp: bool) -> dict[str, Any]:
    if engine == "sglang":  # --mem-fraction-static 0.82, --cuda-graph-max-bs 512 (or 256)
        return {"memory_fraction": 0.82, "cuda_graph_mode": "full_decode_only",
                "stream_interval": 10}
    # kv_cache_config dtype fp8, free_gpu_memory_fraction 0.75; cuda_graph_config
    # max_batch_size 128; stream_interval 10; with attention DP, attention_dp_config
    # enable_balance true, timeout_iters 60, batching_wait_iters 0 (bstar.sim.adp)
    return {"memory_fraction": 0.75, "kv_cache_dtype": "fp8", "cuda_graph_mode":
            "full_decode_only", "cuda_graph_max_tokens": 128, "stream_interval": 10,
            **({"attention_dp_timeout_iters": 60, "attention_dp_batching_wait_iters": 0}
               if dp else {})}


def _ms(seconds: str) -> float:
    return round(float(seconds) * 1e3, 4)


def _low(n: int) -> int:
    return int(n * RANGE_RATIO)


def run_row(r: dict[str, str]) -> dict[str, Any]:
    eng = r["framework"]
    conc, isl, osl, tp = int(r["conc"]), int(r["isl"]), int(r["osl"]), int(r["prefill_tp"])
    ep = int(r["prefill_ep"])
    dp = r["prefill_dp_attention"].lower() == "true"
    spec = r["spec_method"]
    mtp = 0
    if spec == "mtp":
        mtp = SGLANG_MTP_TOKENS if eng == "sglang" else TRT_MTP_TOKENS[dp]
    seqs, tokens = _flags(eng, conc, isl, osl, tp, dp, mtp)
    graph = 512 if eng == "sglang" and (isl, osl) == (1024, 1024) else 256
    settings = _settings(eng, dp)
    if eng == "sglang":
        settings["cuda_graph_max_tokens"] = graph
    return {
        "run": f"h200-{MODEL}-{ENGINES[eng]}-tp{tp}-ep{ep}{'-dpa' if dp else ''}"
               f"{'-mtp' if mtp else ''}-{isl // 1024}k{osl // 1024}k-c{conc}",
        "model": MODEL, "gpu": "h200", "num_gpus": tp, "expert_parallel": ep,
        "dp_attention": str(dp).lower(), "data_parallel": tp if dp else 1,
        "engine": ENGINES[eng], "engine_version": r["image"].rsplit(":", 1)[-1]
        if r["image"] else "", "dtype": r["precision"],
        "max_num_seqs": seqs, "max_num_batched_tokens": tokens, "concurrency": conc,
        "num_prompts": PROMPTS_PER_USER * conc,
        "warmup_prompts": WARMUP_PER_USER * conc if r["date"] >= WARMUP_SINCE else "",
        "prompt_len_min": _low(isl), "prompt_len_max": isl,
        "output_len_min": _low(osl), "output_len_max": osl, "ignore_eos": "true",
        "spec_method": spec if mtp else "", "num_speculative_tokens": mtp or "",
        "ttft_mean_ms": _ms(r["m_mean_ttft"]), "ttft_median_ms": _ms(r["m_median_ttft"]),
        "ttft_p99_ms": _ms(r["m_p99_ttft"]),
        "tpot_mean_ms": _ms(r["m_mean_tpot"]), "tpot_median_ms": _ms(r["m_median_tpot"]),
        "tpot_p99_ms": _ms(r["m_p99_tpot"]), "itl_mean_ms": _ms(r["m_mean_itl"]),
        "e2e_mean_ms": _ms(r["m_mean_e2el"]), "e2e_median_ms": _ms(r["m_median_e2el"]),
        "e2e_p99_ms": _ms(r["m_p99_e2el"]),
        "output_tok_s_per_gpu": round(float(r["m_output_tput_per_gpu"]), 4),
        "total_tok_s_per_gpu": round(float(r["m_tput_per_gpu"]), 4),
        **settings,
        "source": f"{SOURCE}, {r['date']}, {r['run_url']}",
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0], newline="", encoding="utf-8") as f:
        rows = [run_row(r) for r in csv.DictReader(f)
                if r["hardware"] == "h200" and r["disagg"].lower() == "false"
                and r["is_multinode"].lower() == "false"]
    rows.sort(key=lambda r: (r["engine"], r["spec_method"], r["dp_attention"],
                             r["prompt_len_max"], r["output_len_max"], r["concurrency"]))
    w = csv.DictWriter(sys.stdout, fieldnames=list(COLUMNS), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
