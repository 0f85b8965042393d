"""Write InferenceMAX's closed-loop runs (H200, B200, MI300X) as a runs table for
`bstar validate`.

    python bench/to_inferencemax.py H200-RUNS.csv B200-RUNS.csv MI300X-RUNS.csv \
        > data/inferencemax/runs.csv

The input is the rows of SemiAnalysis InferenceMAX's official aggregates for these GPUs, as
committed in the public fork faradawn/InferenceMAX at commit
7a9f0000072e8f2f75455144c08e896efaf50e32, files
official_data/agg_{gptoss,dsr1}_{1k1k,1k8k,8k1k}.json (one CSV row per JSON row, with the
source file, isl and osl added). data/inferencemax/README.md says what each column is.

Per run, from the row: the model (a bundled preset, by its Hugging Face repo), tensor and
expert parallel sizes, the engine, the concurrency and the stated lengths; times converted
from seconds to ms (rounded to 0.1 us). From the benchmark scripts at that commit (the same
for every row of a GPU x engine, data/inferencemax/README.md): the workload and the engine
flags below, which differ by GPU (memory fraction, KV dtype, block size, CUDA graphs, decode
steps per scheduling round, the scheduler's receive interval, stream interval). Nothing is
fitted or typed per row.

The client (kimbochen/bench_serving's benchmark_serving.py, `sample_random_requests`) draws
every prompt length and every output length uniformly from the integers
[int(L x range_ratio), L] with range_ratio 0.8, and the server generates each output in full
(--ignore-eos): the table gives those ranges, not the stated lengths.
"""

from __future__ import annotations

import csv
import functools
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bstar.engine_defaults import TRT_LLM_MAX_BATCH_SIZE, vllm_batch_defaults  # noqa: E402
from bstar.runs_table import COLUMNS  # noqa: E402
from bstar.specs.gpu import get_gpu  # noqa: E402
from bstar.specs.presets import get_model  # noqa: E402

COMMIT = "7a9f0000072e8f2f75455144c08e896efaf50e32"
SOURCE = f"faradawn/InferenceMAX@{COMMIT[:7]} {{file}}"
RANGE_RATIO = 0.8  # --random-range-ratio of every run
PROMPTS_PER_USER = 10  # --num-prompts = 10 x CONC
ENGINES = {"vllm": "vllm", "sglang": "sglang", "trt": "trt-llm"}
# The source's README names vLLM's version for the H200 runs only.
VERSIONS = {("h200", "vllm"): "v0.11.0"}
GPUS = {"h200": "h200", "b200": "b200", "mi300x": "mi300x"}
MI300X_SGLANG_MEMORY = 0.8  # dsr1_fp8_mi300x_docker.sh: --mem-fraction-static 0.8


@functools.cache
def sglang_default_running(model: str, gpu: str, tp: int, memory_fraction: float) -> int:
    """SGLang's default --max-running-requests for the deployment (bstar.plan's rule, over
    its KV pool): the MI300X script leaves it at that default, far above every run's
    concurrency (64 at most), so it never binds a closed loop."""
    from bstar.options import DeploymentOptions
    from bstar.plan import sglang_default_cap

    d = DeploymentOptions(model=model, gpu=gpu, num_gpus=tp, gpu_util=memory_fraction).build()
    return sglang_default_cap(d, 0)


def vllm_default_graph_tokens(max_num_seqs: int) -> int:
    """vLLM's largest captured CUDA graph when the script sets no cuda-graph-sizes:
    min(2 x max_num_seqs, 512) (vllm/config: the default cuda_graph_sizes)."""
    return min(2 * max_num_seqs, 512)


def _flags(gpu: str, engine: str, conc: int, isl: int, osl: int, model: str = "",
           tp: int = 1, dp: bool = False) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) the benchmark scripts give the engine."""
    if engine == "vllm":
        if gpu == "h200":  # --max-num-seqs CONC, max-num-batched-tokens 8192
            return conc, 8192
        if gpu == "b200":  # --max-num-seqs 512, max-num-batched-tokens 8192
            return 512, 8192
        # MI300X: neither flag; vLLM's defaults for a GPU of 70 GiB or more stand
        d = vllm_batch_defaults(get_gpu(gpu).memory_bytes, get_gpu(gpu).name)
        return d.max_num_seqs, d.max_num_batched_tokens
    if engine == "sglang":
        if gpu == "h200":  # --max-running-requests 512 (1k/1k) or 256, chunked prefill 32k
            return (512 if (isl, osl) == (1024, 1024) else 256), 32768
        if gpu == "b200":  # --max-running-requests 128, --chunked-prefill-size 32768
            return 128, 32768
        # MI300X: --chunked-prefill-size 196608, its --mem-fraction-static
        return sglang_default_running(model, gpu, tp, MI300X_SGLANG_MEMORY), 196608
    # TensorRT-LLM's limits are a rank's; the table's are the server's (every rank's).
    ranks = tp if dp else 1
    if model == "gpt-oss-120b":  # gptoss_fp4_h200_trt_slurm.sh: --max_batch_size CONC,
        return conc * ranks, 20000 * ranks  # --max_num_tokens 20000
    # dsr1_fp8_h200_trt_slurm.sh: no --max_batch_size (trtllm-serve's default, 2048), and
    # --max_num_tokens (CONC + ISL + 64) rounded up to 64
    return TRT_LLM_MAX_BATCH_SIZE * ranks, (conc + isl + 64 + 63) // 64 * 64 * ranks


def _settings(gpu: str, engine: str, model: str, max_num_seqs: int, conc: int,
              dp: bool = False) -> dict[str, Any]:
    """The server settings each GPU's script gives the engine (data/inferencemax/README.md);
    blank where the script leaves the engine's default."""
    s: dict[str, Any] = {}
    if engine == "vllm":
        s["memory_fraction"] = 0.95 if gpu == "mi300x" else 0.9
        if gpu == "h200":  # compilation-config cudagraph_mode PIECEWISE, cuda-graph-sizes 2048
            s["cuda_graph_mode"], s["cuda_graph_max_tokens"] = "piecewise", 2048
        elif gpu == "b200":  # FULL_AND_PIECEWISE, cuda-graph-sizes 2048
            s["cuda_graph_mode"], s["cuda_graph_max_tokens"] = "full_and_piecewise", 2048
        else:  # MI300X: FULL_AND_PIECEWISE, vLLM's default capture sizes; --block-size 64
            s["cuda_graph_mode"] = "full_and_piecewise"
            s["cuda_graph_max_tokens"] = vllm_default_graph_tokens(max_num_seqs)
            s["block_size"] = 64
    elif engine == "sglang":
        # SGLang captures decode batches only, up to --cuda-graph-max-bs
        s["cuda_graph_mode"] = "full_decode_only"
        if gpu == "h200":
            s.update(memory_fraction=0.82, cuda_graph_max_tokens=512, stream_interval=10)
        elif gpu == "b200":
            # --scheduler-recv-interval 10 below 16 users, else 30
            s.update(memory_fraction=0.82, cuda_graph_max_tokens=128, stream_interval=30,
                     kv_cache_dtype="fp8_e4m3", scheduler_recv_interval=10 if conc < 16 else 30)
        else:  # MI300X: --num-continuous-decode-steps 4, SGLang's stream interval default 1
            s.update(memory_fraction=MI300X_SGLANG_MEMORY, cuda_graph_max_tokens=128,
                     decode_steps_per_schedule=4)
    elif engine == "trt" and model == "gpt-oss-120b":
        # gptoss_fp4_h200_trt_slurm.sh: free_gpu_memory_fraction 0.85, cuda_graph_config
        # max_batch_size CONC (decode graphs), stream_interval 20
        s.update(memory_fraction=0.85, cuda_graph_mode="full_decode_only",
                 cuda_graph_max_tokens=conc, stream_interval=20)
    elif engine == "trt":
        # dsr1_fp8_h200_trt_slurm.sh: kv_cache_config dtype fp8, free_gpu_memory_fraction
        # 0.75, cuda_graph_config max_batch_size 128 (decode graphs), stream_interval 10
        s.update(memory_fraction=0.75, kv_cache_dtype="fp8", cuda_graph_mode="full_decode_only",
                 cuda_graph_max_tokens=128, stream_interval=10)
    if engine == "trt" and dp:
        # dsr1_fp8_h200_trt_slurm.sh with attention DP: attention_dp_config enable_balance
        # true, timeout_iters 60, batching_wait_iters 0 (bstar.sim.adp)
        s.update(attention_dp_timeout_iters=60, attention_dp_batching_wait_iters=0)
    return s


def _ms(seconds: str) -> float:
    return round(float(seconds) * 1e3, 4)


def _low(n: int) -> int:
    return int(n * RANGE_RATIO)


def run_row(r: dict[str, str]) -> dict[str, Any]:
    eng, gpu = r["framework"], GPUS[r["hw"]]
    conc, isl, osl, tp = int(r["conc"]), int(r["isl"]), int(r["osl"]), int(r["tp"])
    model = get_model(r["model"]).name  # a bundled preset, by its Hugging Face repo
    dp = r["dp_attention"].lower() == "true"
    seqs, tokens = _flags(gpu, eng, conc, isl, osl, model, tp, dp)
    return {
        "run": f"{gpu}-{model}-{ENGINES[eng]}-tp{tp}-ep{r['ep']}{'-dpa' if dp else ''}"
               f"-{isl // 1024}k{osl // 1024}k-c{conc}",
        "model": model, "gpu": gpu, "num_gpus": tp, "expert_parallel": r["ep"],
        "dp_attention": str(dp).lower(), "engine": ENGINES[eng],
        "engine_version": VERSIONS.get((gpu, eng), ""), "dtype": r["precision"],
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
        # with the N-th token: the runs table reads it from stream_interval.
        **_settings(gpu, eng, model, seqs, conc, dp),
        "source": SOURCE.format(file=r["file"]),
    }


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    rows = []
    for path in argv:
        with open(path, newline="", encoding="utf-8") as f:
            rows += [run_row(r) for r in csv.DictReader(f) if r["hw"] in GPUS]
    rows.sort(key=lambda r: (r["gpu"], r["model"], r["engine"], r["num_gpus"],
                             r["dp_attention"], r["prompt_len_max"], r["output_len_max"],
                             r["concurrency"]))
    w = csv.DictWriter(sys.stdout, fieldnames=list(COLUMNS), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
