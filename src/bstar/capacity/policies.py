"""Scaling policies: how many replicas run in each interval of a demand curve. Pure.

Every policy works from `required[i]` = ceil(demand_i / rate per replica at the SLO): the
per-interval minimum, the fewest replicas that each serve at most the rate `bstar search`
found meets the SLO. A policy's answer is a list of replicas, each with the time it was
started (billing begins), the time it is ready (it takes requests) and the time it was
removed (billing ends), so both what is paid and what serves are exact at any instant.

- static: max(required) replicas for the whole curve, ready from the start (the peak's
  search answer);
- reactive: at each interval's start the autoscaler sees that interval's demand (a perfect
  short-term signal: with no provisioning delay it is never below the minimum) and asks for
  `required[i]`; a replica asked for is paid from then on and ready `delay_s` later. It
  scales down only to the largest `required` of the last `cooldown_s` (Kubernetes' scale-
  down stabilisation window), cancelling replicas still starting before ready ones;
- scheduled: one target per period of the day (hourly by default), the largest `required`
  the history saw in that period; replicas for a period are started `delay_s` before it so
  they are ready at its start, and removed at its end when the next period needs fewer.

The curve starts warm: `required[0]` (static: the peak's, scheduled: the first period's)
replicas are ready at its first instant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bstar.capacity.demand import DemandCurve
from bstar.errors import BstarError

POLICIES = ("static", "reactive", "scheduled")
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Settings:
    """The policies' knobs: the provisioning delay (asked for -> ready), the reactive
    cool-down, and the scheduled policy's period and history (None: the curve itself)."""

    delay_s: float = 0.0
    cooldown_s: float = 600.0
    period_s: float = 3600.0
    history: DemandCurve | None = None
    # Which ramp intervals are replayed through the simulator: "all" of them, or only
    # "overloaded" ones (load per ready replica past its capacity) and the interval after.
    replay: str = "all"

    def __post_init__(self) -> None:
        for name, v in (("--provision-delay-s", self.delay_s),
                        ("--cooldown-s", self.cooldown_s)):
            if not (v >= 0 and math.isfinite(v)):
                raise BstarError(f"{name} must be a finite number of seconds >= 0, got {v}")
        if self.replay not in ("all", "overloaded"):
            raise BstarError(f"--replay must be all or overloaded, got {self.replay!r}")
        if not (self.period_s > 0 and math.isfinite(self.period_s)):
            raise BstarError(f"--schedule-period-s must be positive, got {self.period_s}")

    def to_dict(self) -> dict[str, object]:
        return {"provision_delay_s": self.delay_s, "cooldown_s": self.cooldown_s,
                "schedule_period_s": self.period_s, "replay": self.replay,
                "history": "the demand curve itself" if self.history is None
                else self.history.source}


@dataclass(frozen=True, slots=True)
class Replica:
    start_s: float  # paid from here
    ready_s: float  # takes requests from here
    removed_s: float = math.inf  # paid and serving until here


@dataclass(frozen=True, slots=True)
class Schedule:
    policy: str
    replicas: tuple[Replica, ...]
    t0_s: float
    t1_s: float

    def _steps(self) -> tuple[npt.NDArray[np.float64], IntArray]:
        """The serving count as a step function: event times and the count from each."""
        ev = [(r.ready_s, 1) for r in self.replicas if r.ready_s < r.removed_s]
        ev += [(r.removed_s, -1) for r in self.replicas
               if r.ready_s < r.removed_s and math.isfinite(r.removed_s)]
        ev.sort()
        t = np.array([-math.inf] + [e[0] for e in ev])
        n = np.cumsum(np.array([0] + [e[1] for e in ev], dtype=np.int64))
        return t, n

    def provisioned(self, times: npt.ArrayLike) -> IntArray:
        """Replicas paid for at each instant (started, not removed)."""
        t = np.asarray(times, dtype=np.float64)[:, None]
        start = np.array([r.start_s for r in self.replicas])[None, :]
        gone = np.array([r.removed_s for r in self.replicas])[None, :]
        return ((start <= t) & (t < gone)).sum(axis=1).astype(np.int64)

    def ready(self, times: npt.ArrayLike) -> IntArray:
        """Replicas serving at each instant."""
        t, n = self._steps()
        return n[np.searchsorted(t, np.asarray(times, dtype=np.float64), "right") - 1]

    def min_ready(self, starts: npt.ArrayLike, interval_s: float) -> IntArray:
        """The fewest replicas serving at any instant of each [start, start + interval)."""
        t, n = self._steps()
        a = np.asarray(starts, dtype=np.float64)
        lo = np.searchsorted(t, a, "right") - 1
        hi = np.searchsorted(t, a + interval_s, "left") - 1
        return np.array([n[i:max(i, j) + 1].min() for i, j in zip(lo, hi, strict=True)],
                        dtype=np.int64)

    def ready_ids(self, t: float) -> list[int]:
        """Indices of the replicas serving at instant t, in order."""
        return [i for i, r in enumerate(self.replicas) if r.ready_s <= t < r.removed_s]

    def replica_seconds(self) -> float:
        """Replica-seconds paid over the curve."""
        return sum(max(0.0, min(r.removed_s, self.t1_s) - max(r.start_s, self.t0_s))
                   for r in self.replicas)


def required(curve: DemandCurve, rate_per_replica_req_s: float) -> IntArray:
    """The per-interval minimum: ceil(demand / rate per replica), at least 1 (a relative
    epsilon: a demand of exactly k replicas' rate needs k)."""
    if not rate_per_replica_req_s > 0:
        raise BstarError("the rate per replica at the SLO must be positive")
    need = np.ceil(curve.rates / rate_per_replica_req_s * (1 - 1e-9)).astype(np.int64)
    return np.maximum(need, 1)


def static(curve: DemandCurve, need: IntArray) -> Schedule:
    t0, t1 = curve.start_s, curve.start_s + curve.duration_s
    return Schedule("static", tuple(Replica(t0, t0) for _ in range(int(need.max()))), t0, t1)


def reactive(curve: DemandCurve, need: IntArray, s: Settings) -> Schedule:
    t0, t1 = curve.start_s, curve.start_s + curve.duration_s
    reps: list[Replica] = [Replica(t0, t0) for _ in range(int(need[0]))]
    active = list(range(len(reps)))  # indices not removed, oldest first
    starts = curve.starts_s
    for i, t in enumerate(starts):
        t = float(t)
        target = int(need[i])
        if target > len(active):
            for _ in range(target - len(active)):
                reps.append(Replica(t, t + s.delay_s))
                active.append(len(reps) - 1)
            continue
        # Scale down to the most the stabilisation window asked for (this interval's
        # included), cancelling replicas still starting first, then the newest ready.
        window = need[(starts > t - s.cooldown_s - 1e-9) & (starts <= t)]
        keep = max(target, int(window.max()))
        while len(active) > keep:
            starting = [j for j in active if reps[j].ready_s > t]
            j = starting[-1] if starting else active[-1]
            reps[j] = Replica(reps[j].start_s, reps[j].ready_s, t)
            active.remove(j)
    return Schedule("reactive", tuple(reps), t0, t1)


def period_targets(history: DemandCurve, rate_per_replica_req_s: float,
                   period_s: float) -> dict[int, int]:
    """Per period of the day (index of `period_s` since midnight of the history's clock):
    the largest per-interval minimum the history saw in it."""
    need = required(history, rate_per_replica_req_s)
    slots = _slot(history.starts_s, period_s)
    out: dict[int, int] = {}
    for k, n in zip(slots.tolist(), need.tolist(), strict=True):
        out[k] = max(out.get(k, 0), n)
    return out


def _slot(t: npt.ArrayLike, period_s: float) -> IntArray:
    per_day = max(1, round(86_400.0 / period_s))
    return (np.floor(np.asarray(t, dtype=np.float64) / period_s).astype(np.int64)) % per_day


def scheduled(curve: DemandCurve, rate_per_replica_req_s: float, s: Settings) -> Schedule:
    t0, t1 = curve.start_s, curve.start_s + curve.duration_s
    targets = period_targets(s.history or curve, rate_per_replica_req_s, s.period_s)
    fallback = max(targets.values())  # a period the history never saw: its busiest

    def target(t: float) -> int:
        return targets.get(int(_slot([t], s.period_s)[0]), fallback)

    reps: list[Replica] = [Replica(t0, t0) for _ in range(target(t0))]
    active = list(range(len(reps)))
    h = (math.floor(t0 / s.period_s) + 1) * s.period_s
    while h < t1:
        want = target(h)
        if want > len(active):
            for _ in range(want - len(active)):
                reps.append(Replica(max(t0, h - s.delay_s), h))
                active.append(len(reps) - 1)
        while len(active) > want:
            j = active.pop()
            reps[j] = Replica(reps[j].start_s, reps[j].ready_s, h)
        h += s.period_s
    return Schedule("scheduled", tuple(reps), t0, t1)


def schedule(policy: str, curve: DemandCurve, rate_per_replica_req_s: float,
             s: Settings) -> Schedule:
    need = required(curve, rate_per_replica_req_s)
    if policy == "static":
        return static(curve, need)
    if policy == "reactive":
        return reactive(curve, need, s)
    if policy == "scheduled":
        return scheduled(curve, rate_per_replica_req_s, s)
    raise BstarError(f"unknown policy {policy!r}: one of {', '.join(POLICIES)}")
