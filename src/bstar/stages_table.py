"""A stages table: one row per load stage of a real server. A load generator sent requests at
a rate (or with a concurrency) for a duration, and measured each request's TTFT and E2E.
`data/vllm-h100/stages.csv` is one (its README says what each column is). Required columns:
stage, model, gpu, num_gpus, engine, max_num_seqs, max_num_batched_tokens, arrival,
duration_s, prompt_len_p50, output_len, ttft_mean_ms, e2e_mean_ms, source; `rate_req_s` for
the open-loop arrivals (constant, poisson), `concurrency` for a closed loop. `model` is a
bundled preset or a config.json path, `gpu` a catalog id or a GPU file (paths relative to
the table's folder). `bstar.validate_stages` simulates and scores each stage."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from bstar.errors import BstarError
from bstar.fit.points import read_columns
from bstar.stats import per_request_tpot

REQUIRED = ("stage", "model", "gpu", "num_gpus", "engine", "max_num_seqs",
            "max_num_batched_tokens", "arrival", "duration_s", "prompt_len_p50",
            "output_len", "ttft_mean_ms", "e2e_mean_ms", "source")
# Every column, in the order bench/to_stages.py writes them.
COLUMNS = ("stage", "model", "gpu", "num_gpus", "engine", "engine_version", "dtype",
           "max_num_seqs", "max_num_batched_tokens", "max_model_len", "arrival", "rate_req_s",
           "concurrency", "duration_s", "prompt_len_min", "prompt_len_p10", "prompt_len_p25",
           "prompt_len_p50", "prompt_len_p75", "prompt_len_p90", "prompt_len_p99",
           "prompt_len_max", "shared_prefix_len", "distinct_prompts", "output_len",
           "ignore_eos", "requests_sent", "requests_ok", "requests_failed", "ttft_mean_ms",
           "ttft_p50_ms", "ttft_p90_ms", "e2e_mean_ms", "e2e_p50_ms", "e2e_p90_ms", "tpot_mean_ms",
           "tpot_p90_ms", "output_tok_s", "source", "note")
ARRIVALS = ("constant", "poisson", "concurrency")
# The prompt-length percentiles a table may give, as quantiles (min and max: 0 and 1).
PROMPT_QUANTILES = (("prompt_len_min", 0.0), ("prompt_len_p10", 0.10),
                    ("prompt_len_p25", 0.25), ("prompt_len_p50", 0.50),
                    ("prompt_len_p75", 0.75), ("prompt_len_p90", 0.90),
                    ("prompt_len_p99", 0.99), ("prompt_len_max", 1.0))


def is_stages_table(header: Sequence[str]) -> bool:
    return "arrival" in header and "duration_s" in header


@dataclass(frozen=True, slots=True)
class Stage:
    """One measured load stage (times in ms, as the table gives them)."""

    stage: str
    model: str
    gpu: str
    num_gpus: int
    engine: str
    max_num_seqs: int
    max_num_batched_tokens: int
    arrival: str
    duration_s: float
    prompt_len: tuple[tuple[float, float], ...]  # (quantile, tokens), quantile ascending
    output_len: int
    ttft_mean_ms: float
    e2e_mean_ms: float
    source: str
    rate_req_s: float | None = None
    concurrency: int | None = None
    engine_version: str = ""
    dtype: str = ""
    max_model_len: int = 0
    shared_prefix_len: int = 0
    # The workload repeats this many prompts in turn (0: every prompt is new): after the
    # first round each request finds its whole prompt in the prefix cache.
    distinct_prompts: int = 0
    ignore_eos: bool = True
    requests_sent: int = 0
    requests_ok: int = 0
    requests_failed: int = 0
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p90_ms: float | None = None
    tpot_mean_ms: float = 0.0  # (E2E mean - TTFT mean) / (output_len - 1) when not given
    tpot_p90_ms: float | None = None
    output_tok_s: float | None = None
    where: str = ""
    base_dir: str = ""
    # A closed-loop run (bstar.runs_table): outputs drawn uniformly from the integers
    # [output_len_min, output_len] (0: every output is output_len long); the fraction of the
    # first requests left out of the figures (None: the simulator's warm-up); the expert
    # parallel size and whether attention runs data parallel.
    output_len_min: int = 0
    warmup_fraction: float | None = None
    # The client warmed the server up before the run's requests and waited for it (InferenceX's
    # benchmark_serving gathers its --num-warmups requests first): the run starts with all
    # its users at once on an idle server that has paid any cold start.
    warmed_up: bool = False
    expert_parallel: int = 1
    dp_attention: bool = False
    # Attention data-parallel ranks (num_gpus / data_parallel GPUs each); speculative
    # decoding: the method ("": none), draft tokens per step, a stated acceptance (None: fit).
    data_parallel: int = 1
    spec_method: str = ""
    num_speculative_tokens: int = 0
    acceptance_rate: float | None = None
    # Tokens the engine's first stream chunk waits for (1: the first token streams at once,
    # as SGLang does whatever its --stream-interval: `len(req.output_ids) == 1` streams).
    first_chunk_tokens: int = 1
    # The engine's settings as the run's server set them (bstar.runs_table; None, "" or 0:
    # the engine's default for the GPU): its memory fraction (vLLM --gpu-memory-utilization,
    # SGLang --mem-fraction-static, TensorRT-LLM free_gpu_memory_fraction), KV cache dtype,
    # KV block size, CUDA graph mode (none, piecewise, full, full_and_piecewise,
    # full_decode_only) and the largest step a captured graph runs, decode steps per
    # scheduling round (SGLang --num-continuous-decode-steps), decode rounds between two
    # looks at the request queue (SGLang --scheduler-recv-interval) and stream interval
    # (tokens per stream chunk after the first: SGLang streams the first token at once).
    memory_fraction: float | None = None
    kv_cache_dtype: str = ""
    block_size: int = 0
    cuda_graph_mode: str = ""
    cuda_graph_max_tokens: int = 0
    decode_steps_per_schedule: int = 1
    scheduler_recv_interval: int = 1
    stream_interval: int = 0
    # TensorRT-LLM's attention-DP balance (attention_dp_config with enable_balance:
    # timeout_iters, batching_wait_iters; 0: no balance; bstar.sim.adp).
    attention_dp_timeout_iters: int = 0
    attention_dp_batching_wait_iters: int = 0

    @property
    def group(self) -> tuple[str, str]:
        return (self.gpu, self.engine)

    @property
    def label(self) -> str:
        load = (f"{self.rate_req_s:g} req/s" if self.rate_req_s is not None
                else f"{self.concurrency} users")
        return f"{self.stage} ({load})"

    @property
    def failed_fraction(self) -> float:
        sent = self.requests_sent or self.requests_ok + self.requests_failed
        return self.requests_failed / sent if sent else 0.0

    def measured(self) -> dict[str, float]:
        return {"e2e_mean_ms": self.e2e_mean_ms, "ttft_mean_ms": self.ttft_mean_ms,
                "tpot_mean_ms": self.tpot_mean_ms}


def _cell(r: Mapping[str, str], k: str) -> str:
    return (r.get(k) or "").strip()


def _float(r: Mapping[str, str], k: str, at: str, required: bool = False,
           positive: bool = True) -> float | None:
    v = _cell(r, k).replace(",", "")
    if not v:
        if required:
            raise BstarError(f"{at}: {k} is required")
        return None
    try:
        x = float(v)
    except ValueError:
        raise BstarError(f"{at}: {k} {v!r} is not a number") from None
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        raise BstarError(f"{at}: {k} must be {'positive' if positive else '>= 0'}, got {v}")
    return x


# The largest count a table cell may hold (GPUs, tokens, requests): past it the number is
# a typo or an attack, and simulating it would never end.
MAX_COUNT = 10**9


def _int(r: Mapping[str, str], k: str, at: str, required: bool = False,
         minimum: int = 1, maximum: int = MAX_COUNT) -> int | None:
    v = _cell(r, k)
    if not v:
        if required:
            raise BstarError(f"{at}: {k} is required")
        return None
    try:
        n = int(float(v)) if float(v).is_integer() else None
    except ValueError:
        n = None
    if n is None:
        raise BstarError(f"{at}: {k} {v!r} is not an integer")
    if n < minimum:
        raise BstarError(f"{at}: {k} must be >= {minimum}, got {n}")
    if n > maximum:
        raise BstarError(f"{at}: {k} must be <= {maximum}, got {v}")
    return n


def stages_from_csv(text: str, where: str = "table", base_dir: Path | None = None
                    ) -> list[Stage]:
    """Parse a stages table (header row; lines starting with # are comments)."""
    table = read_columns(text, where, REQUIRED, COLUMNS)
    out = []
    for cells, at in table.rows():
        r = {h: (c or "").strip() for h, c in cells.items()}
        arrival = r["arrival"].lower()
        if arrival not in ARRIVALS:
            raise BstarError(f"{at}: arrival {r['arrival']!r} is not one of "
                             f"{', '.join(ARRIVALS)}")
        rate = _float(r, "rate_req_s", at)
        users = _int(r, "concurrency", at)
        if arrival == "concurrency" and users is None:
            raise BstarError(f"{at}: a closed loop (arrival concurrency) needs concurrency")
        if arrival != "concurrency" and rate is None:
            raise BstarError(f"{at}: arrival {arrival} needs rate_req_s")
        if not r["source"]:
            raise BstarError(f"{at}: every row needs its source")
        quant = []
        for k, q in PROMPT_QUANTILES:
            x = _float(r, k, at, required=k == "prompt_len_p50")
            if x is not None:
                quant.append((q, x))
        tokens = [x for _, x in quant]
        if any(b < a for a, b in pairwise(tokens)):
            raise BstarError(f"{at}: the prompt-length percentiles must not decrease")
        output_len = _int(r, "output_len", at, required=True)
        assert output_len is not None
        ttft = _float(r, "ttft_mean_ms", at, required=True)
        e2e = _float(r, "e2e_mean_ms", at, required=True)
        assert ttft is not None and e2e is not None
        tpot = _float(r, "tpot_mean_ms", at)
        if tpot is None and output_len > 1:
            tpot = per_request_tpot(e2e, ttft, output_len)
        eos = _cell(r, "ignore_eos").lower()
        if eos not in ("", "true", "false", "1", "0", "yes", "no"):
            raise BstarError(f"{at}: ignore_eos {eos!r} is not true or false")

        def count(k: str, r: dict[str, str] = r, at: str = at) -> int:
            return _int(r, k, at, minimum=0) or 0

        duration = _float(r, "duration_s", at, required=True)
        assert duration is not None
        out.append(Stage(
            stage=r["stage"] or at, model=r["model"], gpu=r["gpu"],
            num_gpus=_int(r, "num_gpus", at, required=True) or 1, engine=r["engine"],
            max_num_seqs=_int(r, "max_num_seqs", at, required=True) or 1,
            max_num_batched_tokens=_int(r, "max_num_batched_tokens", at, required=True) or 1,
            arrival=arrival, duration_s=duration, prompt_len=tuple(quant),
            output_len=output_len, ttft_mean_ms=ttft, e2e_mean_ms=e2e, source=r["source"],
            rate_req_s=rate, concurrency=users, engine_version=_cell(r, "engine_version"),
            dtype=_cell(r, "dtype"), max_model_len=count("max_model_len"),
            shared_prefix_len=count("shared_prefix_len"),
            distinct_prompts=count("distinct_prompts"),
            ignore_eos=eos not in ("false", "0", "no"),
            requests_sent=count("requests_sent"), requests_ok=count("requests_ok"),
            requests_failed=count("requests_failed"),
            ttft_p50_ms=_float(r, "ttft_p50_ms", at), ttft_p90_ms=_float(r, "ttft_p90_ms", at),
            e2e_p50_ms=_float(r, "e2e_p50_ms", at), e2e_p90_ms=_float(r, "e2e_p90_ms", at),
            tpot_mean_ms=tpot or 0.0, tpot_p90_ms=_float(r, "tpot_p90_ms", at),
            output_tok_s=_float(r, "output_tok_s", at), where=at,
            base_dir=str(base_dir) if base_dir else ""))
    if not out:
        raise BstarError(f"{where}: no rows")
    return out


def load_stages(path: str | Path) -> list[Stage]:
    """Read a stages table from a file (paths in it are relative to its folder)."""
    from bstar import safeio

    p = Path(path)
    text = safeio.read_text(p, safeio.MAX_TABLE_BYTES, "stages table (UTF-8 CSV)")
    return stages_from_csv(text, str(p), p.resolve().parent)

