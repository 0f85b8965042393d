"""Write InferenceMAX's H200 closed-loop runs as a runs table for `bstar validate`.

    python bench/to_inferencemax.py H200-RUNS.csv > data/inferencemax/runs.csv

The input is the H200 rows of SemiAnalysis InferenceMAX's official aggregates, as committed in
the public fork faradawn/InferenceMAX at commit 7a9f0000072e8f2f75455144c08e896efaf50e32,
files official_data/agg_{gptoss,dsr1}_{1k1k,1k8k,8k1k}.json (one CSV row per JSON row, with
the source file, isl and osl added). data/inferencemax/README.md says what each column is.

Per run, from the row: the model (a bundled preset, by its Hugging Face repo), tensor and
expert parallel sizes, the engine, the concurrency and the stated lengths; times converted
from seconds to ms (rounded to 0.1 us). From the benchmark scripts at that commit (the same
for every row of an engine, data/inferencemax/README.md): the workload and the engine flags
below. Nothing is fitted or typed per row.

The client (kimbochen/bench_serving's benchmark_serving.py, `sample_random_requests`) draws
every prompt length and every output length uniformly from the integers
[int(L x range_ratio), L] with range_ratio 0.8, and the server generates each output in full
(--ignore-eos): the table gives those ranges, not the stated lengths.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bstar.runs_table import COLUMNS  # noqa: E402
from bstar.specs.presets import get_model  # noqa: E402

COMMIT = "7a9f0000072e8f2f75455144c08e896efaf50e32"
SOURCE = f"faradawn/InferenceMAX@{COMMIT[:7]} {{file}}"
RANGE_RATIO = 0.8  # --random-range-ratio of every run
PROMPTS_PER_USER = 10  # --num-prompts = 10 x CONC
ENGINES = {"vllm": "vllm", "sglang": "sglang", "trt": "trt-llm"}
VERSIONS = {"vllm": "v0.11.0"}  # the README of the source names vLLM's only
GPUS = {"h200": "h200"}


def _flags(engine: str, conc: int, isl: int, osl: int) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) the benchmark scripts give the engine."""
    if engine == "vllm":  # --max-num-seqs CONC, max-num-batched-tokens 8192
        return conc, 8192
    if engine == "sglang":  # --max-running-requests 512 (1k/1k) or 256, chunked prefill 32k
        return (512 if (isl, osl) == (1024, 1024) else 256), 32768
    # trtllm-serve: max_batch_size CONC; the scripts set no max_num_tokens, so TensorRT-LLM's
    # default of 8192 tokens per step stands.
    return conc, 8192


def _ms(seconds: str) -> float:
    return round(float(seconds) * 1e3, 4)


def _low(n: int) -> int:
    return int(n * RANGE_RATIO)


def run_row(r: dict[str, str]) -> dict[str, Any]:
    eng = r["framework"]
    conc, isl, osl, tp = int(r["conc"]), int(r["isl"]), int(r["osl"]), int(r["tp"])
    seqs, tokens = _flags(eng, conc, isl, osl)
    model = get_model(r["model"]).name  # a bundled preset, by its Hugging Face repo
    dp = r["dp_attention"].lower() == "true"
    return {
        "run": f"{model}-{ENGINES[eng]}-tp{tp}-ep{r['ep']}{'-dpa' if dp else ''}"
               f"-{isl // 1024}k{osl // 1024}k-c{conc}",
        "model": model, "gpu": GPUS[r["hw"]], "num_gpus": tp, "expert_parallel": r["ep"],
        "dp_attention": str(dp).lower(), "engine": ENGINES[eng],
        "engine_version": VERSIONS.get(eng, ""), "dtype": r["precision"],
        "max_num_seqs": seqs, "max_num_batched_tokens": tokens, "concurrency": conc,
        "num_prompts": PROMPTS_PER_USER * conc,
        "prompt_len_min": _low(isl), "prompt_len_max": isl,
        "output_len_min": _low(osl), "output_len_max": osl, "ignore_eos": "true",
        "ttft_mean_ms": _ms(r["mean_ttft"]), "ttft_median_ms": _ms(r["median_ttft"]),
        "ttft_p99_ms": _ms(r["p99_ttft"]),
        "tpot_mean_ms": _ms(r["mean_tpot"]), "tpot_median_ms": _ms(r["median_tpot"]),
        "tpot_p99_ms": _ms(r["p99_tpot"]), "itl_mean_ms": _ms(r["mean_itl"]),
        "e2e_mean_ms": _ms(r["mean_e2el"]), "e2e_median_ms": _ms(r["median_e2el"]),
        "e2e_p99_ms": _ms(r["p99_e2el"]),
        "output_tok_s_per_gpu": round(float(r["output_tput_per_gpu"]), 4),
        "total_tok_s_per_gpu": round(float(r["tput_per_gpu"]), 4),
        # SGLang streams its tokens in chunks of --stream-interval and sends its first chunk
        # with the N-th token: N from the run's own chunk gap over its time per token.
        "first_chunk_tokens": max(1, round(float(r["mean_itl"]) / float(r["mean_tpot"])))
        if eng == "sglang" else 1,
        "source": SOURCE.format(file=r["file"]),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0], newline="", encoding="utf-8") as f:
        rows = [run_row(r) for r in csv.DictReader(f) if r["hw"] in GPUS]
    rows.sort(key=lambda r: (r["model"], r["engine"], r["num_gpus"], r["dp_attention"],
                             r["prompt_len_max"], r["output_len_max"], r["concurrency"]))
    w = csv.DictWriter(sys.stdout, fieldnames=list(COLUMNS), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
