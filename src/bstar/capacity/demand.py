"""Demand curves: requests per second per interval over a day (or any span). Pure: text or a
parsed trace in, a `DemandCurve` out; reading the file is the caller's job (bstar.safeio).

Three sources:
- a trace's arrivals (any format `bstar simulate --trace` reads), counted per interval;
- a CSV of (time, rate): `time_s,rate_req_s` rows, each rate holding from its time to the
  next row's (the last one for one interval); the rows are resampled onto the interval;
- a generated diurnal day (`diurnal`): a cosine between a trough and a peak, plus seeded
  bursts that multiply the rate for a few minutes.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bstar.errors import BstarError
from bstar.sim.traffic import Trace

FloatArray = npt.NDArray[np.float64]
MAX_INTERVALS = 100_000  # a week of one-minute intervals is 10,080
DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class DemandCurve:
    """Mean arrival rate (requests/s over the fleet) in each interval of `interval_s`,
    the first starting at `start_s`; `source` says where it came from."""

    interval_s: float
    rates_req_s: tuple[float, ...]
    start_s: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        if not (self.interval_s > 0 and math.isfinite(self.interval_s)):
            raise BstarError(f"--interval-s must be a positive number of seconds, got "
                             f"{self.interval_s}")
        if not self.rates_req_s:
            raise BstarError("the demand curve has no intervals")
        if len(self.rates_req_s) > MAX_INTERVALS:
            raise BstarError(f"the demand curve has {len(self.rates_req_s):,} intervals, over "
                             f"{MAX_INTERVALS:,}: give a longer --interval-s")
        for i, r in enumerate(self.rates_req_s):
            if not (r >= 0 and math.isfinite(r)):
                raise BstarError(f"the demand curve's interval {i}: the rate must be a finite "
                                 f"number of requests/s >= 0, got {r}")
        if max(self.rates_req_s) <= 0:
            raise BstarError("the demand curve is zero everywhere: nothing to serve")

    @property
    def rates(self) -> FloatArray:
        return np.asarray(self.rates_req_s, dtype=np.float64)

    @property
    def starts_s(self) -> FloatArray:
        return self.start_s + self.interval_s * np.arange(len(self.rates_req_s))

    @property
    def duration_s(self) -> float:
        return self.interval_s * len(self.rates_req_s)

    @property
    def peak_req_s(self) -> float:
        return float(max(self.rates_req_s))

    def requests(self) -> float:
        """Requests over the curve (the rate times the interval, summed)."""
        return float(self.rates.sum() * self.interval_s)


def from_trace(trace: Trace, interval_s: float) -> DemandCurve:
    """The trace's arrivals counted per interval, from its first arrival (t = 0 for the
    published formats) to its last; each count over the interval is the rate."""
    a = np.sort(np.asarray(trace.arrival_s, dtype=np.float64))
    a = a - a[0]
    n = max(1, math.ceil((float(a[-1]) + 1e-9) / interval_s))
    if n > MAX_INTERVALS:
        raise BstarError(f"the trace spans {n:,} intervals of {interval_s:g} s, over "
                         f"{MAX_INTERVALS:,}: give a longer --interval-s")
    counts = np.bincount(np.minimum((a // interval_s).astype(np.int64), n - 1), minlength=n)
    return DemandCurve(interval_s, tuple(float(c) / interval_s for c in counts), 0.0,
                       f"{trace.describe()}, {interval_s:g} s intervals")


def parse_rate_csv(text: str, interval_s: float, where: str = "demand CSV") -> DemandCurve:
    """A CSV with a header naming `time_s` and `rate_req_s` (times ascending, seconds; rates
    requests/s). Each rate holds from its row's time to the next row's (the last row's to the
    end of the interval one interval past it); each interval of the curve, from the first
    time on, is the time-weighted mean."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise BstarError(f"{where}: empty; expected a header time_s,rate_req_s and rows")
    try:
        table = list(csv.reader(io.StringIO("\n".join(lines))))
    except csv.Error as e:
        raise BstarError(f"{where}: not a readable CSV table ({e})") from None
    header = [h.strip() for h in table[0]]
    if "time_s" not in header or "rate_req_s" not in header:
        raise BstarError(f"{where}: header {','.join(header)}: expected columns time_s and "
                         "rate_req_s")
    it, ir = header.index("time_s"), header.index("rate_req_s")
    times: list[float] = []
    rates: list[float] = []
    for n, row in enumerate(table[1:], 2):
        try:
            t, r = float(row[it]), float(row[ir])
        except (IndexError, ValueError):
            raise BstarError(f"{where}: line {n}: time_s and rate_req_s must be numbers, got "
                             f"{','.join(row)[:80]!r}") from None
        if not (math.isfinite(t) and math.isfinite(r) and r >= 0):
            raise BstarError(f"{where}: line {n}: time_s must be finite and rate_req_s a "
                             f"finite rate >= 0, got {t:g}, {r:g}")
        if times and t <= times[-1]:
            raise BstarError(f"{where}: line {n}: time_s {t:g} does not follow {times[-1]:g} "
                             "(times must ascend)")
        times.append(t)
        rates.append(r)
    if not times:
        raise BstarError(f"{where}: no rows under the header")
    t0 = times[0]
    span = times[-1] - t0 + interval_s
    n = math.ceil(span / interval_s - 1e-9)
    if n > MAX_INTERVALS:
        raise BstarError(f"{where}: {n:,} intervals of {interval_s:g} s, over "
                         f"{MAX_INTERVALS:,}: give a longer --interval-s")
    ends = [*times[1:], t0 + n * interval_s]  # the last rate to the end of its interval
    out = []
    for k in range(n):
        a, b = t0 + k * interval_s, t0 + (k + 1) * interval_s
        total = 0.0
        for s, e, r in zip(times, ends, rates, strict=True):
            lo, hi = max(a, s), min(b, e)
            if hi > lo:
                total += r * (hi - lo)
        out.append(total / interval_s)
    return DemandCurve(interval_s, tuple(out), t0, f"{where}, {interval_s:g} s intervals")


def diurnal(peak_req_s: float, trough_req_s: float, interval_s: float = 60.0,
            duration_s: float = DAY_S, bursts: int = 0, burst_factor: float = 1.5,
            burst_s: float = 300.0, peak_hour: float = 14.0, seed: int = 0) -> DemandCurve:
    """A generated day: the rate follows a cosine from `trough_req_s` (12 hours from the
    peak) to `peak_req_s` at `peak_hour`, and `bursts` bursts (start times drawn from
    `seed`, uniform over the span) multiply it by `burst_factor` for `burst_s` each. The
    peak of the curve is then up to `peak_req_s x burst_factor`."""
    if not (0 <= trough_req_s <= peak_req_s and peak_req_s > 0 and math.isfinite(peak_req_s)):
        raise BstarError(f"a diurnal day needs 0 <= trough <= peak, peak > 0, got "
                         f"{trough_req_s:g}..{peak_req_s:g}")
    if bursts < 0 or not burst_factor >= 1 or not burst_s > 0:
        raise BstarError("bursts need a count >= 0, a factor >= 1 and a length > 0 s")
    n = math.ceil(duration_s / interval_s - 1e-9)
    if not 1 <= n <= MAX_INTERVALS:
        raise BstarError(f"a diurnal day of {duration_s:g} s in {interval_s:g} s intervals "
                         f"has {n:,} intervals: 1..{MAX_INTERVALS:,}")
    mid = (np.arange(n) + 0.5) * interval_s
    phase = 2 * np.pi * (mid / 3600.0 - peak_hour) / 24.0
    rate = trough_req_s + (peak_req_s - trough_req_s) * 0.5 * (1 + np.cos(phase))
    rng = np.random.default_rng(seed)
    for start in rng.uniform(0, max(duration_s - burst_s, 0.0), size=bursts):
        on = (mid >= start) & (mid < start + burst_s)
        rate[on] *= burst_factor
    src = (f"diurnal {trough_req_s:g}..{peak_req_s:g} req/s (peak at {peak_hour:g} h)"
           + (f", {bursts} bursts x{burst_factor:g} for {burst_s:g} s (seed {seed})"
              if bursts else "") + f", {interval_s:g} s intervals")
    return DemandCurve(interval_s, tuple(float(x) for x in rate), 0.0, src)
