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
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bstar.errors import BstarError
from bstar.fit.points import read_columns
from bstar.stages_table import Stage, _float, _int

REQUIRED = ("run", "model", "gpu", "num_gpus", "engine", "max_num_seqs",
            "max_num_batched_tokens", "concurrency", "num_prompts", "prompt_len_min",
            "prompt_len_max", "output_len_min", "output_len_max", "ttft_mean_ms",
            "tpot_mean_ms", "e2e_mean_ms", "source")
# Every column, in the order bench/to_inferencemax.py writes them.
COLUMNS = ("run", "model", "gpu", "num_gpus", "expert_parallel", "dp_attention", "engine",
           "engine_version", "dtype", "max_num_seqs", "max_num_batched_tokens", "concurrency",
           "num_prompts", "prompt_len_min", "prompt_len_max", "output_len_min",
           "output_len_max", "ignore_eos", "ttft_mean_ms", "ttft_median_ms", "ttft_p99_ms",
           "tpot_mean_ms", "tpot_median_ms", "tpot_p99_ms", "itl_mean_ms", "e2e_mean_ms",
           "e2e_median_ms", "e2e_p99_ms", "output_tok_s_per_gpu", "total_tok_s_per_gpu",
           "first_chunk_tokens", "source")


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
            "num_gpus", "max_num_seqs", "max_num_batched_tokens", "concurrency",
            "num_prompts", "prompt_len_min", "prompt_len_max", "output_len_min",
            "output_len_max")}
        for lo, hi in (("prompt_len_min", "prompt_len_max"),
                       ("output_len_min", "output_len_max")):
            if ints[lo] > ints[hi]:
                raise BstarError(f"{at}: {lo} {ints[lo]} is above {hi} {ints[hi]}")
        ttft, tpot, e2e = (_float(r, k, at, required=True) or 0.0
                           for k in ("ttft_mean_ms", "tpot_mean_ms", "e2e_mean_ms"))
        out_s = _float(r, "output_tok_s_per_gpu", at)
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
            requests_sent=ints["num_prompts"], requests_ok=ints["num_prompts"],
            tpot_mean_ms=tpot,
            output_tok_s=None if out_s is None else out_s * ints["num_gpus"],
            where=at, base_dir=str(base_dir) if base_dir else "",
            output_len_min=ints["output_len_min"], warmup_fraction=0.0,
            expert_parallel=_int(r, "expert_parallel", at) or 1,
            dp_attention=_flag(r.get("dp_attention", ""), at, "dp_attention"),
            first_chunk_tokens=_int(r, "first_chunk_tokens", at) or 1))
    if not out:
        raise BstarError(f"{where}: no rows")
    return out


def load_runs(path: str | Path) -> list[Stage]:
    """Read a runs table from a file (paths in it are relative to its folder)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise BstarError(f"{p}: cannot read: {e}") from None
    return runs_from_csv(text, str(p), p.resolve().parent)
