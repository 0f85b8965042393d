"""Write InferenceX's disaggregated H200 runs (Dynamo + SGLang, Dynamo + TensorRT-LLM) as a
disaggregated runs table (bstar.disagg_runs) for `python bench/disagg_validate.py`.

    python bench/to_inferencex_disagg.py RUNS.csv > data/inferencex-h200/disagg_runs.csv

RUNS.csv: the 50 H200 rows of SemiAnalysis InferenceX's dashboard fixture
(vngcloud/InferenceX-app@7fe6d62, packages/app/cypress/fixtures/api/benchmarks.json, one row
per run; data/inferencex-h200/disagg_runs.md says what each column is). Only its rows with
`disagg` true are written.

Per run, from the row: each side's TP, EP, attention DP (`*_dp_attention` true: DP = TP, the
engines' DP attention over every rank of the worker) and worker count; the engine; the
concurrency; the stated lengths as the client's uniform ranges [0.8 L, L]; the measured
means and medians, seconds converted to ms. Stated for every row, not read from it (the H200
runs' recipes are not public; the public Dynamo recipes for other GPUs in
SemiAnalysisAI/InferenceX benchmarks/multi_node/srt-slurm-recipes/ set these):
- KV cache dtype fp8 (SGLang kv-cache-dtype fp8_e4m3, TensorRT-LLM kv_cache_config dtype fp8);
- the KV link: InfiniBand NDR between nodes (every worker is one 8-GPU node here);
- the prefill step's limits: SGLang max-prefill-tokens 8192; TensorRT-LLM max_batch_size 1
  and max_num_tokens ISL + 128 per attention rank (so DP ranks x that per worker);
- the decode cap: concurrency / decode workers, rounded up (the recipes size each decode
  worker's batch to its share of the concurrency), so that the cap never binds a closed loop;
- an MTP run's draft tokens per step: the aggregated H200 MTP scripts' count for the engine
  (bench/to_inferencex.py: SGLang 2; TensorRT-LLM 3, or 1 with attention DP on the decode
  side), assumed, as the disaggregated recipes are not public.
Nothing is fitted or typed per row.
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bstar.disagg_runs import COLUMNS  # noqa: E402
from to_inferencex import SGLANG_MTP_TOKENS, TRT_MTP_TOKENS  # noqa: E402

SOURCE = "vngcloud/InferenceX-app@7fe6d62 packages/app/cypress/fixtures/api/benchmarks.json"
RANGE_RATIO = 0.8  # --random-range-ratio of every run
PROMPTS_PER_USER = 10  # --num-prompts = 10 x CONC
ENGINES = {"dynamo-sglang": "sglang", "dynamo-trt": "trt-llm"}
MODELS = {"dsr1": "deepseek-r1-0528"}
SGLANG_PREFILL_TOKENS = 8192  # --max-prefill-tokens in the public SGLang Dynamo recipes
TRT_TOKENS_OVER_ISL = 128  # max_num_tokens = ISL + 128 in the public TensorRT-LLM recipes


def _truth(v: str) -> bool:
    return v.strip().lower() in ("true", "1", "yes")


def side(row: dict[str, str], name: str, engine: str, isl: int, conc: int) -> dict[str, Any]:
    tp = int(row[f"{name}_tp"])
    dp = tp if _truth(row[f"{name}_dp_attention"]) else 1
    workers = int(row[f"{name}_num_workers"])
    out: dict[str, Any] = {"workers": workers, "tp": tp, "ep": int(row[f"{name}_ep"]),
                           "dp": dp, "max_num_seqs": "", "max_num_batched_tokens": ""}
    if name == "prefill":
        if engine == "sglang":
            out["max_num_batched_tokens"] = max(SGLANG_PREFILL_TOKENS, isl)
        else:  # one prompt per attention rank a step
            out["max_num_seqs"] = dp
            out["max_num_batched_tokens"] = dp * (isl + TRT_TOKENS_OVER_ISL)
    else:
        out["max_num_seqs"] = math.ceil(conc / workers)
    return out


def convert(rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        if not _truth(r["disagg"]):
            continue
        engine = ENGINES[r["framework"]]
        isl, osl, conc = int(r["isl"]), int(r["osl"]), int(r["conc"])
        sides = {n: side(r, n, engine, isl, conc) for n in ("prefill", "decode")}
        name = (f"{r['framework']}-{r['spec_method']}-{sides['prefill']['workers']}p"
                f"{sides['decode']['workers']}d-isl{isl}-osl{osl}-c{conc}")
        row: dict[str, Any] = {
            "run": name, "model": MODELS[r["model"]], "gpu": r["hardware"], "engine": engine,
            "engine_version": r["image"], "dtype": "", "kv_cache_dtype": "fp8",
            "spec_method": r["spec_method"], "kv_link": "ib-ndr", "concurrency": conc,
            "num_prompts": PROMPTS_PER_USER * conc,
            "prompt_len_min": int(isl * RANGE_RATIO), "prompt_len_max": isl,
            "output_len_min": int(osl * RANGE_RATIO), "output_len_max": osl,
            "ttft_mean_ms": _ms(r["m_mean_ttft"]), "ttft_median_ms": _ms(r["m_median_ttft"]),
            "tpot_mean_ms": _ms(r["m_mean_tpot"]), "tpot_median_ms": _ms(r["m_median_tpot"]),
            "e2e_mean_ms": _ms(r["m_mean_e2el"]),
            "output_tok_s_per_gpu": round(float(r["m_output_tput_per_gpu"]), 4),
            "date": r["date"], "source": f"{SOURCE} {r['run_url']}"}
        for n, s in sides.items():
            row.update({f"{n}_{k}": v for k, v in s.items()})
        if r["spec_method"] == "mtp":
            row["num_speculative_tokens"] = (
                SGLANG_MTP_TOKENS if engine == "sglang"
                else TRT_MTP_TOKENS[sides["decode"]["dp"] > 1])
        out.append(row)
    return out


def _ms(seconds: str) -> float:
    return round(float(seconds) * 1e3, 4)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0], newline="", encoding="utf-8") as f:
        rows = convert(list(csv.DictReader(f)))
    w = csv.DictWriter(sys.stdout, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
