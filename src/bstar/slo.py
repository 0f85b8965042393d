"""Per-request latency objectives (`--slo ttft:500,tpot:50,e2e:3000`): one type, one parser,
one check of which requests meet them (`Slo.met`), shared by the sweep, the simulator and
the recommendation."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bstar.errors import BstarError

SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")
METRICS = ("ttft", "tpot", "e2e")  # the same objectives by metric (the sweep's stored form)


@dataclass(frozen=True, slots=True)
class Slo:
    """Per-request latency objectives, ms; None = not constrained."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def __post_init__(self) -> None:
        for k in SLO_KEYS:
            v = getattr(self, k)
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise BstarError(f"SLO {k} must be a positive finite number of ms, got {v}")

    @property
    def empty(self) -> bool:
        return all(getattr(self, k) is None for k in SLO_KEYS)

    def to_dict(self) -> dict[str, float]:
        """{"ttft_ms": ...}, the objectives set (the simulate JSON's `slo`)."""
        return {k: v for k in SLO_KEYS if (v := getattr(self, k)) is not None}

    def by_metric(self) -> dict[str, float]:
        """{"ttft": ms, ...}, the objectives set (the sweep's stored options and stats)."""
        return {m: v for m, k in zip(METRICS, SLO_KEYS, strict=True)
                if (v := getattr(self, k)) is not None}

    def met(self, ttft_s: npt.ArrayLike, tpot_s: npt.ArrayLike,
            e2e_s: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """Which requests meet every objective set, from their TTFT, TPOT and E2E in seconds
        (aligned per request): each time at most its objective, in ms. A request without a
        TPOT (one output token) passes the TPOT objective when given 0; NaN (a time that was
        not measured) fails any objective set on it. Goodput counts these requests."""
        times = [np.asarray(x, dtype=np.float64) for x in (ttft_s, tpot_s, e2e_s)]
        ok = np.ones(np.broadcast_shapes(*(t.shape for t in times)), dtype=bool)
        for k, t in zip(SLO_KEYS, times, strict=True):
            limit_ms = getattr(self, k)
            if limit_ms is not None:
                ok &= t * 1e3 <= limit_ms
        return ok

    @classmethod
    def coerce(cls, value: Slo | Mapping[str, float] | None) -> Slo:
        """An Slo from itself, None, or a mapping keyed by metric or by `*_ms` field."""
        if value is None:
            return cls()
        if isinstance(value, Slo):
            return value
        return cls(**{_field(k): float(v) for k, v in value.items()})


def _field(key: str) -> str:
    k = key.strip().lower()
    k = k if k.endswith("_ms") else k + "_ms"
    if k not in SLO_KEYS:
        raise BstarError(f"unknown SLO {key!r}: use ttft, tpot or e2e, e.g. ttft:500,tpot:50")
    return k


def parse_slo(text: str | None) -> Slo:
    """'ttft:500,tpot:50,e2e:3000' (ms; `key=ms` and the _ms suffix are accepted; empty or
    None: no objective). Unknown keys, a key given twice, non-numbers, values <= 0 and
    non-finite values are BstarErrors."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in (text or "").split(",") if p.strip()):
        key, sep, val = part.partition(":")
        if not sep:
            key, sep, val = part.partition("=")
        if not sep:
            raise BstarError(f"bad --slo item {part!r}: expected ttft:MS, tpot:MS or e2e:MS")
        k = _field(key)
        if k in out:
            raise BstarError(f"--slo gives {k.removesuffix('_ms')} twice ({part!r}); "
                             "give each objective once")
        try:
            out[k] = float(val)
        except ValueError:
            raise BstarError(f"bad --slo value {val!r} for {key.strip()}: expected "
                             "milliseconds") from None
    return Slo(**out)
