"""Formatting with explicit units: GB is 1e9 bytes, GiB is 2**30, and output says which."""

from __future__ import annotations

from collections.abc import Sequence

GB = 10**9
GiB = 2**30
J_PER_KWH = 3.6e6
# $/kWh energy is costed at when --electricity-usd-per-kwh is not given (bstar.energy,
# docs/energy.md): a round figure of the order of US commercial and industrial tariffs.
# Here, not in bstar.energy, so that the flag's help does not import numpy.
DEFAULT_ELECTRICITY_USD_PER_KWH = 0.10
MiB = 2**20
KiB = 2**10


def fmt_bytes(n: float) -> str:
    """'16.06 GB (14.96 GiB)': both, so nobody has to guess which 'GB' is meant."""
    if abs(n) >= GB / 10:
        return f"{n / GB:.2f} GB ({n / GiB:.2f} GiB)"
    if abs(n) >= 10**6:
        return f"{n / 10**6:.1f} MB ({n / MiB:.1f} MiB)"
    return f"{n / 10**3:.1f} kB ({n / KiB:.1f} KiB)"


def fmt_bytes_binary(n: int, signed: bool = False) -> str:
    """'1.50 GiB', '48.00 MiB' or '4,096 B': binary units only, for pools counted in blocks
    (`signed`: '+' before a positive difference)."""
    sign = ("+" if n >= 0 else "-") if signed else ("-" if n < 0 else "")
    a = abs(n)
    if a >= GiB:
        return f"{sign}{a / GiB:.2f} GiB"
    if a >= MiB:
        return f"{sign}{a / MiB:.2f} MiB"
    return f"{sign}{a:,} B"


def fmt_count(n: float) -> str:
    for div, suf in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suf}"
    return f"{n:g}"


def fmt_ms(ms: float | None, decimals: int = 2, missing: str = "–") -> str:
    """A time in milliseconds with the digits it needs: whole ms from 100 ms (thousands
    separated), `decimals` places from 1 ms, one more below; `missing` for None (an en dash
    on a page, '-' in a terminal)."""
    if ms is None:
        return missing
    if ms >= 100:
        return f"{ms:,.0f}"
    return f"{ms:.{decimals}f}" if ms >= 1 else f"{ms:.{decimals + 1}f}"


def fmt_num(v: float | None, digits: int = 1, missing: str = "–") -> str:
    """A number with thousands separated and `digits` places; `missing` for None."""
    return missing if v is None else f"{v:,.{digits}f}"


def sparkline(values: Sequence[float]) -> str:
    """A text bar of a curve for terminals without plots."""
    bars = "▁▂▃▄▅▆▇█"
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = hi - lo or 1.0
    return "".join(bars[min(7, int((v - lo) / span * 7.999))] for v in values)
