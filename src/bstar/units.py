"""Formatting with explicit units: GB is 1e9 bytes, GiB is 2**30, and output says which."""

from __future__ import annotations

from collections.abc import Sequence

GB = 10**9
GiB = 2**30
MiB = 2**20
KiB = 2**10


def fmt_bytes(n: float) -> str:
    """'16.06 GB (14.96 GiB)': both, so nobody has to guess which 'GB' is meant."""
    if abs(n) >= GB / 10:
        return f"{n / GB:.2f} GB ({n / GiB:.2f} GiB)"
    if abs(n) >= 10**6:
        return f"{n / 10**6:.1f} MB ({n / MiB:.1f} MiB)"
    return f"{n / 10**3:.1f} kB ({n / KiB:.1f} KiB)"


def fmt_count(n: float) -> str:
    for div, suf in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suf}"
    return f"{n:g}"


def fmt_ms(s: float) -> str:
    ms = s * 1e3
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 1:
        return f"{ms:.2f}"
    return f"{ms:.3f}"


def sparkline(values: Sequence[float]) -> str:
    """A text bar of a curve for terminals without plots."""
    bars = "▁▂▃▄▅▆▇█"
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = hi - lo or 1.0
    return "".join(bars[min(7, int((v - lo) / span * 7.999))] for v in values)
