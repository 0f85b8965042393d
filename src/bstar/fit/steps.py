"""One measured step, the unit `bstar calibrate` fits to: a decode step of `batch`
sequences, or a mixed one with a prompt chunk. `bstar.fit.points` reads them from files and
sweeps; `bstar.step.StepShape` prices what `Point.scheduled` says ran."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bstar.errors import BstarError


@dataclass(frozen=True, slots=True)
class Point:
    """One measured step: `batch` sequences decoding together, each holding about
    `context_tokens` of KV, plus (a mixed step) one prompt chunk of `chunk_tokens` new tokens
    on top of `chunk_start` cached ones; one step takes `step_s` (= per-request TPOT/ITL)."""

    batch: int
    context_tokens: int
    step_s: float
    label: str = ""
    chunk_tokens: int = 0
    chunk_start: int = 0

    def __post_init__(self) -> None:
        where = f"point {self.label or ''}"
        if self.chunk_tokens < 0 or self.chunk_start < 0:
            raise BstarError(f"{where}: chunk_tokens and chunk_start must not be negative")
        if self.batch < (0 if self.chunk_tokens else 1):
            raise BstarError(f"{where}: batch must be at least 1, got {self.batch}")
        if self.context_tokens < 1:
            raise BstarError(f"{where}: context_tokens must be at least 1")
        if not (self.step_s > 0 and math.isfinite(self.step_s)):
            raise BstarError(f"{where}: step time must be a positive number, "
                             f"got {self.step_s}")

    @property
    def mixed(self) -> bool:
        return self.chunk_tokens > 0

    def scheduled(self) -> tuple[np.ndarray, np.ndarray]:
        """(start, new) tokens of every scheduled sequence, as the simulator prices them."""
        start = [self.context_tokens - 1] * self.batch
        new = [1] * self.batch
        if self.chunk_tokens:
            start.append(self.chunk_start)
            new.append(self.chunk_tokens)
        return np.array(start, dtype=np.int64), np.array(new, dtype=np.int64)
