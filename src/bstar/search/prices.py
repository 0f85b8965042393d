"""GPU prices from a user's TOML file (`--price FILE.toml`). bstar ships no prices of its
own: a price is a fact about one provider, one contract and one day. The file says when
and where its figures were seen:

    as_of = "2026-05-01"            # required: the date the prices were read
    currency = "USD"
    note = "on-demand list prices, one GPU"

    [gpus.h100-sxm]                 # a GPU catalog id (or a GPU file's id)
    per_gpu_hour = 3.00
    source = "https://..."
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bstar import safeio
from bstar.errors import BstarError


@dataclass(frozen=True, slots=True)
class Price:
    per_gpu_hour: float
    source: str = ""


@dataclass(frozen=True, slots=True)
class PriceTable:
    as_of: str
    currency: str
    gpus: dict[str, Price]
    path: str = ""
    note: str = ""

    def get(self, gpu_id: str) -> Price | None:
        return self.gpus.get(gpu_id.lower())

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "as_of": self.as_of, "currency": self.currency,
                "note": self.note,
                "gpus": {k: {"per_gpu_hour": p.per_gpu_hour, "source": p.source}
                         for k, p in self.gpus.items()}}


def parse_prices(text: str, where: str = "price file") -> PriceTable:
    data = safeio.parse_toml(text, where)
    as_of = data.get("as_of")
    if not as_of or isinstance(as_of, dict | list):
        raise BstarError(f"{where}: say when the prices were read: as_of = \"YYYY-MM-DD\"")
    gpus = data.get("gpus")
    if not isinstance(gpus, dict) or not gpus:
        raise BstarError(f"{where}: no [gpus.ID] tables with per_gpu_hour")
    out = {}
    for gid, v in gpus.items():
        if not isinstance(v, dict) or "per_gpu_hour" not in v:
            raise BstarError(f"{where}: [gpus.{gid}] needs per_gpu_hour")
        p = v["per_gpu_hour"]
        if isinstance(p, bool) or not isinstance(p, int | float) or not (
                p > 0 and math.isfinite(p)):
            raise BstarError(f"{where}: [gpus.{gid}] per_gpu_hour must be a positive finite "
                             f"number, got {p!r}")
        out[str(gid).lower()] = Price(float(p), str(v.get("source", "")))
    return PriceTable(str(as_of), str(data.get("currency", "USD")), out, where,
                      str(data.get("note", "")))


def load_prices(path: str | Path) -> PriceTable:
    p = Path(path)
    return parse_prices(safeio.read_text(p, what="price file (TOML)"), str(p))
