"""A curves table: one row per (model, GPU, engine, lengths, batch) measurement, as
`data/published/curves.csv` (transcribed public curves), `data/h200/curves.csv` (decode steps
measured on an H200) and `data/cpu/curves.csv` (bstar sweeps of vLLM on this machine's CPU)
write it. Required columns: model, gpu, num_gpus, engine, batch, batch_kind, source; at least
one measured column of step_ms, itl_ms, tpot_ms, throughput_tok_s. `model` is a bundled preset
(id, alias or its Hugging Face repo id) or a config.json path; `gpu` a catalog id or a GPU
file (`bstar probe -o`); paths are relative to the table's folder. Nothing is fetched.
`bstar.validate_curves` scores the cost model against it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bstar.errors import BstarError
from bstar.fit.points import read_columns

REQUIRED = ("model", "gpu", "num_gpus", "engine", "batch", "batch_kind", "source")
OPTIONAL = ("engine_version", "dtype", "kv_dtype", "input_len", "output_len",
            "context_tokens", "dataset", "step_ms", "tpot_ms", "itl_ms", "throughput_tok_s",
            "ttft_ms", "note")
BATCH_KINDS = ("step", "static", "max_num_seqs", "concurrency")
STEP_COLUMNS = ("step_ms", "itl_ms", "tpot_ms")  # the first one given is the row's step


def is_curves_table(header: Sequence[str]) -> bool:
    return "batch_kind" in header


@dataclass(frozen=True, slots=True)
class CurveRow:
    model: str
    gpu: str
    num_gpus: int
    engine: str
    batch: int
    batch_kind: str
    source: str
    engine_version: str = ""
    dtype: str = ""
    kv_dtype: str = ""
    input_len: int = 0
    output_len: int = 0
    context_tokens: int = 0
    step_ms: float | None = None
    step_column: str = ""
    throughput_tok_s: float | None = None
    where: str = ""
    base_dir: str = ""

    @property
    def context(self) -> int:
        return self.context_tokens or self.input_len + self.output_len // 2

    @property
    def group(self) -> tuple[str, str]:
        return (self.gpu, self.engine)

    @property
    def curve(self) -> tuple[Any, ...]:
        return (self.model, self.gpu, self.num_gpus, self.engine, self.engine_version,
                self.dtype, self.input_len, self.output_len, self.context_tokens,
                self.batch_kind)

    @property
    def curve_label(self) -> str:
        lengths = (f"ctx {self.context_tokens}" if self.context_tokens
                   else f"{self.input_len}/{self.output_len}")
        tp = f" tp{self.num_gpus}" if self.num_gpus > 1 else ""
        dt = f" {self.dtype}" if self.dtype else ""
        return f"{Path(self.model).stem if self._is_path(self.model) else self.model}{tp}{dt} " \
               f"{lengths} {self.batch_kind}"

    @staticmethod
    def _is_path(s: str) -> bool:
        return s.endswith((".json", ".toml")) or s.startswith((".", "/"))


def _number(r: dict[str, str], k: str, at: str) -> float | None:
    v = r.get(k, "").strip().replace(",", "")
    if not v:
        return None
    try:
        x = float(v)
    except ValueError:
        raise BstarError(f"{at}: {k} {v!r} is not a number") from None
    if not (x > 0 and math.isfinite(x)):
        raise BstarError(f"{at}: {k} must be positive, got {v}")
    return x


def _count(r: dict[str, str], k: str, at: str, required: bool = False) -> int:
    v = r.get(k, "").strip()
    if not v:
        if required:
            raise BstarError(f"{at}: {k} is required")
        return 0
    try:
        n = int(v)
    except ValueError:
        raise BstarError(f"{at}: {k} {v!r} is not an integer") from None
    if n < (1 if required else 0):
        raise BstarError(f"{at}: {k} must be >= 1, got {n}")
    return n


def curves_from_csv(text: str, where: str = "table", base_dir: Path | None = None
                    ) -> list[CurveRow]:
    """Parse a curves table (header row; lines starting with # are comments)."""
    table = read_columns(text, where, REQUIRED, REQUIRED + OPTIONAL)
    rows = []
    for cells, at in table.rows():
        r = {h: (c or "").strip() for h, c in cells.items()}
        if r["batch_kind"] not in BATCH_KINDS:
            raise BstarError(f"{at}: batch_kind {r['batch_kind']!r} is not one of "
                             f"{', '.join(BATCH_KINDS)}")
        if not r["source"]:
            raise BstarError(f"{at}: every row needs its source")
        step_col = next((k for k in STEP_COLUMNS if r.get(k)), "")
        step = _number(r, step_col, at) if step_col else None
        tput = _number(r, "throughput_tok_s", at)
        _number(r, "ttft_ms", at)  # checked, not scored
        if step is None and tput is None:
            raise BstarError(f"{at}: no measurement (give one of {', '.join(STEP_COLUMNS)} "
                             "or throughput_tok_s)")
        rows.append(CurveRow(
            model=r["model"], gpu=r["gpu"], num_gpus=_count(r, "num_gpus", at, True),
            engine=r["engine"], batch=_count(r, "batch", at, True), batch_kind=r["batch_kind"],
            source=r["source"], engine_version=r.get("engine_version", ""),
            dtype=r.get("dtype", ""), kv_dtype=r.get("kv_dtype", ""),
            input_len=_count(r, "input_len", at), output_len=_count(r, "output_len", at),
            context_tokens=_count(r, "context_tokens", at), step_ms=step,
            step_column=step_col, throughput_tok_s=tput, where=at,
            base_dir=str(base_dir) if base_dir else ""))
    if not rows:
        raise BstarError(f"{where}: no rows")
    return rows
