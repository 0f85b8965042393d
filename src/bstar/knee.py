"""Knee rules on any throughput-vs-batch curve: predicted, fitted, measured or simulated.
Pure (numpy only), no I/O.

A curve is three aligned arrays: `batch` (positive, distinct; sorted here), `throughput_tok_s`
(output tokens per second of the whole server) and, where a rule needs it, `tpot_ms` (per-request
time between tokens). Each rule returns a `Knee`: the batch it picks (or None) and the reason in
words, so a caller can print it as is.

    step_knee      seed 000: the first batch whose amortized time per token (= 1/throughput)
                   improves by less than 5% on the previous point.
    doubling_knee  seed 004: the batch whose next doubling gains less than 15% throughput.
    bca_knee       Recasens et al. 2025, "Mind the Memory Gap: Unveiling GPU Bottlenecks in
                   Large-Batch LLM Inference" (arXiv:2503.08311, IEEE CLOUD 2025), Batching
                   Configuration Advisor: the first batch past which throughput gains less than
                   epsilon per added sequence (by default 10% of what a running sequence
                   yields there, T(B)/B), while per-request latency stays within
                   L x the latency at a reference batch (their B = 32, L = 5).
    slo_knee       the largest batch whose per-request TPOT (or E2E, or any latency) meets a limit.

Every throughput rule skips a blip: a step (or doubling, or BCA slope) that fails its threshold
counts only if no later one still gains it, on a measured curve as on a predicted one (a
concave predicted curve never has one; a noisy measured curve often does). One function
decides it for all three (`_first_plateau`). docs/fit.md "Knees".

The rules depend on the grid they are given (a 5% step between 64 and 128 is not a 5% step
between 64 and 65); the seeds use powers of two, and `pow2_grid` makes one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bstar.errors import BstarError

FloatArray = npt.NDArray[np.float64]

DEFAULT_STEP = 0.05  # seed 000
DEFAULT_DOUBLING = 0.15  # seed 004
# Recasens et al.'s advisor: latency bound L x latency at B = 32 (their code: L = 5, B = 32).
DEFAULT_BCA_LATENCY_FACTOR = 5.0
DEFAULT_BCA_REFERENCE_BATCH = 32
# Their epsilon is absolute (requests/s per added sequence) and so tied to their workload; ours
# defaults to a fraction of what a running sequence yields at the batch judged (T(B)/B):
# dT/dB < 0.1 T/B, i.e. d ln T / d ln B < 0.1, which means the same on any model, throughput
# unit and batch. (It was T(B0)/B0, the smallest batch's: a curve whose first point is high,
# as a noisy measured one often is, then looked flat from the start, 36.8, 36.3, 40.3, 53.0,
# 57.3 tok/s over 1-16 gave a knee at 1 though 4 -> 8 gains 31%; issue 41.) An absolute
# epsilon_tok_s overrides it.
DEFAULT_BCA_EPSILON_FRACTION = 0.10


@dataclass(frozen=True, slots=True)
class Knee:
    """A rule's pick. `batch` is None when the rule does not fire on this curve."""

    rule: str  # "step", "doubling", "bca", "sla"
    batch: int | None
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {"rule": self.rule, "batch": self.batch, "reason": self.reason}


def pow2_grid(top: float, start: int = 1) -> list[int]:
    """Powers of two from `start` up to `top` (at least [start])."""
    out, b = [start], start * 2
    while b <= top:
        out.append(b)
        b *= 2
    return out


def _curve(batch: npt.ArrayLike, *columns: npt.ArrayLike | None,
           min_points: int = 2) -> tuple[FloatArray, ...]:
    b = np.asarray(batch, dtype=np.float64).ravel()
    cols = [None if c is None else np.asarray(c, dtype=np.float64).ravel() for c in columns]
    if b.size < min_points:
        raise BstarError(f"a knee needs at least {min_points} points, got {b.size}")
    for c in cols:
        if c is not None and c.size != b.size:
            raise BstarError(f"curve arrays differ in length ({b.size} batches, {c.size} "
                             "values)")
    if not np.all(np.isfinite(b)) or np.any(b <= 0):
        raise BstarError("batch sizes must be positive")
    order = np.argsort(b, kind="stable")
    b = b[order]
    if np.any(np.diff(b) == 0):
        raise BstarError(f"batch {b[np.flatnonzero(np.diff(b) == 0)[0]]:g} appears twice on "
                         "the curve")
    out = [b]
    for c in cols:
        if c is None:
            out.append(np.full(b.size, np.nan))
            continue
        c = c[order]
        if not np.all(np.isfinite(c)) or np.any(c <= 0):
            raise BstarError("curve values must be positive and finite")
        out.append(c)
    return tuple(out)


def _b(x: float) -> str:
    """A batch size as a reason prints it: 8, not 8.0 (a count, not a unit to format)."""
    return f"{x:g}"


def _first_plateau(ratios: npt.ArrayLike, ok: npt.ArrayLike | None = None
                   ) -> tuple[int | None, list[int]]:
    """The knee rules' one plateau test, on each step's gain over its threshold (`ratios`,
    under 1: the step fails the threshold): the first step n under 1 (and `ok[n]`, where
    given) after which every step stays under 1, and the steps under 1 before it that a
    later step outgrew (blips, skipped). (None, blips) when no step qualifies."""
    r = np.asarray(ratios, dtype=np.float64)
    later = np.full(r.size, -np.inf)  # later[n]: the largest ratio after step n
    if r.size > 1:
        later[:-1] = np.maximum.accumulate(r[::-1])[::-1][1:]
    allowed = np.ones(r.size, dtype=bool) if ok is None else np.asarray(ok, dtype=bool)
    skipped: list[int] = []
    for n in range(r.size):
        if r[n] < 1 and later[n] < 1 and allowed[n]:
            return n, skipped
        if r[n] < 1 and later[n] >= 1:
            skipped.append(n)
    return None, skipped


def step_knee(batch: npt.ArrayLike, throughput_tok_s: npt.ArrayLike,
              threshold: float = DEFAULT_STEP) -> Knee:
    """Seed 000: "the point where TPOT improvement drops below 5% compared to the previous step
    is the practical B*". Its TPOT curve is the amortized one, step / B = 1/throughput, so the
    improvement at B_i is 1 - A_i/A_{i-1} = 1 - T_{i-1}/T_i. Returns that B_i (as the seed says:
    "set max_num_seqs to that value"). A step under the threshold counts only if no later step
    still improves by the threshold or more: a small step followed by a large one is a blip
    (noise on a measured curve), not the plateau, and the reason names the blips skipped."""
    b, t = _curve(batch, throughput_tok_s)
    amort = 1.0 / t
    gains = 1.0 - amort[1:] / amort[:-1]
    n, blips = _first_plateau(gains / threshold)
    skipped = [f"B={_b(b[k + 1])} ({gains[k] * 100:.1f}%)" for k in blips]
    if n is not None:
        i = n + 1
        return Knee("step", int(b[i]),
                    f"amortized time per token at B={_b(b[i])} improves "
                    f"{gains[n] * 100:.1f}% on B={_b(b[i - 1])} (< {threshold * 100:g}% per "
                    f"step, seed 000){_blips(skipped, 'step')}")
    last = float(gains[-1])
    every = "the last step improves" if skipped else "every step improves"
    return Knee("step", None,
                f"{every} amortized time per token by >= {threshold * 100:g}% "
                f"(last: {last * 100:.1f}% from B={_b(b[-2])} to {_b(b[-1])})"
                f"{_blips(skipped, 'step')}; the knee lies past the curve")


def _blips(skipped: list[str], what: str) -> str:
    """The words for steps under a threshold that a later step outgrew (not the knee)."""
    if not skipped:
        return ""
    return (f"; {', '.join(skipped)} fell under it but a later {what} still gains it "
            "(a blip, skipped)")


def doubling_knee(batch: npt.ArrayLike, throughput_tok_s: npt.ArrayLike,
                  threshold: float = DEFAULT_DOUBLING) -> Knee:
    """Seed 004: "set max_batch_size to the point where the marginal throughput gain of the
    next doubling is under 15%". Each point B_i is compared with the throughput at B_i/2; a
    doubling B_i/2 -> B_i that gains less than `threshold` makes B_i/2 the knee. Where
    B_i/2 is not on the curve (non-power-of-two spacing) its throughput is interpolated
    linearly in log2(batch) between its neighbours, and the reason says so. On measured curves
    a small gain can be followed by a large one (noise, or a curve that is not concave): the
    knee is the first doubling after which every doubling gains less than `threshold`."""
    b, t = _curve(batch, throughput_tok_s)
    log2_b = np.log2(b)  # once: an interpolation is then a binary search, not O(n)
    steps: list[tuple[float, float, float, str]] = []  # (half, B, gain, how)
    for i in range(b.size):
        half = b[i] / 2
        if half < b[0] * (1 - 1e-9):
            continue
        # b is sorted and unique: only b[k-1] and b[k] can be close to half (the first
        # match in index order, as np.isclose over the whole array would give).
        k = int(np.searchsorted(b, half))
        j = next((i for i in (k - 1, k) if 0 <= i < b.size
                  and abs(b[i] - half) <= 1e-8 + 1e-9 * abs(half)), None)
        if j is not None:
            t_half, how = float(t[j]), ""
        else:
            t_half = float(np.interp(math.log2(half), log2_b, t))
            how = (f"; throughput at B={_b(half)} interpolated in log2(batch) between "
                   f"B={_b(b[k - 1])} and B={_b(b[k])}")
        steps.append((half, float(b[i]), float(t[i] / t_half - 1.0), how))
    if not steps:
        return Knee("doubling", None,
                    f"the curve spans less than one doubling (B={_b(b[0])}..{_b(b[-1])})")
    # The knee is where the gains stay small: a small gain followed by a large one is a dip
    # in a measured (noisy, or not yet saturated) curve, not the plateau.
    n, _blips_skipped = _first_plateau([g / threshold for _h, _b_, g, _w in steps])
    if n is not None:
        half, bi, gain, how = steps[n]
        later = (f"; no later doubling gains {threshold * 100:g}% or more"
                 if n + 1 < len(steps) else "")
        return Knee("doubling", max(1, math.floor(half)),
                    f"doubling B={_b(half)} -> {_b(bi)} gains {gain * 100:.1f}% "
                    f"throughput (< {threshold * 100:g}% per doubling, seed 004){later}{how}")
    half, bi, gain, _ = steps[-1]
    return Knee("doubling", None,
                f"the last doubling gains >= {threshold * 100:g}% throughput ({gain * 100:.1f}% "
                f"into B={_b(bi)}); the knee lies past the curve")


def bca_knee(batch: npt.ArrayLike, throughput_tok_s: npt.ArrayLike, tpot_ms: npt.ArrayLike,
             *, epsilon_tok_s: float | None = None,
             epsilon_fraction: float = DEFAULT_BCA_EPSILON_FRACTION,
             latency_factor: float = DEFAULT_BCA_LATENCY_FACTOR,
             reference_batch: float = DEFAULT_BCA_REFERENCE_BATCH) -> Knee:
    """Batching Configuration Advisor (Recasens et al. 2025, arXiv:2503.08311): B_opt is the
    first batch at which the throughput gain per added sequence, dT/dB, falls under epsilon
    (and stays under it: a flat slope followed by one of epsilon or more is a blip) while
    per-request latency stays within `latency_factor` x its value at the reference batch
    (the point nearest `reference_batch` in log2 distance).

    dT/dB at B_i is the slope to the next point, (T_{i+1} - T_i)/(B_{i+1} - B_i), as in the
    authors' advisor code (vLLMBatchingMemoryGap, benchmarks/definitive_results/advisor): B_i
    is the last batch worth filling, the one past which the curve is flat. Epsilon is
    `epsilon_tok_s` when given, else `epsilon_fraction` x T(B_i)/B_i, what a running sequence
    yields at the batch judged (see DEFAULT_BCA_EPSILON_FRACTION). When the latency bound
    binds before the plateau, no batch meets both; the largest batch within the bound is
    returned instead (the fallback the authors' code takes), and the reason says so.
    """
    b, t, lat = _curve(batch, throughput_tok_s, tpot_ms)
    if epsilon_tok_s is not None and epsilon_tok_s <= 0:
        raise BstarError("BCA epsilon must be positive")
    if latency_factor <= 0 or reference_batch <= 0:
        raise BstarError("BCA latency factor and reference batch must be positive")
    # epsilon at each point but the last (the slope runs to the next point)
    eps = np.full(b.size - 1, epsilon_tok_s) if epsilon_tok_s is not None \
        else epsilon_fraction * t[:-1] / b[:-1]

    def eps_txt(i: int) -> str:
        if epsilon_tok_s is not None:
            return f"{eps[i]:,.3g} tok/s"
        return (f"{eps[i]:,.3g} tok/s = {epsilon_fraction * 100:g}% of "
                f"T(B={_b(b[i])})/{_b(b[i])}")

    r = int(np.argmin(np.abs(np.log2(b) - math.log2(reference_batch))))
    limit = latency_factor * lat[r]
    lim_txt = (f"TPOT <= {latency_factor:g} x {lat[r]:.3g} ms at reference B={_b(b[r])} "
               f"= {limit:.3g} ms")
    slope = np.diff(t) / np.diff(b)
    ok = lat <= limit * (1 + 1e-12)
    # a flat slope counts only if no later one gains its epsilon (a blip otherwise)
    i, _blips_skipped = _first_plateau(slope / eps, ok[:-1])
    if i is not None:
        return Knee("bca", int(b[i]),
                    f"past B={_b(b[i])} throughput gains {slope[i]:,.3g} tok/s per added "
                    f"sequence (< epsilon, {eps_txt(i)}) and {lim_txt} holds there "
                    "(BCA, Recasens et al. 2025)")
    within = np.flatnonzero(ok)
    if within.size == 0:
        return Knee("bca", None, f"no batch meets {lim_txt}")
    last = int(within[-1])
    if last < b.size - 1:
        return Knee("bca", int(b[last]),
                    f"latency binds before the plateau: throughput still gains >= epsilon "
                    f"({eps_txt(last)}) wherever {lim_txt}; B={_b(b[last])} is the largest batch "
                    "within it (BCA, Recasens et al. 2025)")
    return Knee("bca", None,
                f"throughput still gains >= epsilon ({eps_txt(b.size - 2)}) at the end of the "
                f"curve "
                f"(B={_b(b[-1])}); the plateau lies past it")


def slo_knee(batch: npt.ArrayLike, latency_ms: npt.ArrayLike, limit_ms: float,
             what: str = "per-request TPOT") -> Knee:
    """The largest batch whose latency (`what`: per-request TPOT, p99 TPOT, E2E ...) meets
    `limit_ms`, counting up from the smallest batch: a noisy point that meets the limit again
    after a violation is not trusted (an SLA wants the batch below the first violation), and
    the reason mentions it."""
    b, lat = _curve(batch, latency_ms, min_points=1)
    if not limit_ms > 0:
        raise BstarError(f"the {what} limit must be positive, got {limit_ms}")
    bad = np.flatnonzero(lat > limit_ms)
    if bad.size == 0:
        return Knee("sla", int(b[-1]),
                    f"{what} <= {limit_ms:g} ms at every batch up to B={_b(b[-1])} "
                    f"({lat[-1]:.3g} ms there); the limit may allow more")
    first = int(bad[0])
    if first == 0:
        return Knee("sla", None, f"{what} is {lat[0]:.3g} ms already at B={_b(b[0])}, over "
                                 f"the {limit_ms:g} ms limit")
    later = [f"B={_b(x)}" for x in b[first + 1:][lat[first + 1:] <= limit_ms]]
    note = (f"; {', '.join(later)} meet it again, but after a violation (noise?)"
            if later else "")
    return Knee("sla", int(b[first - 1]),
                f"{what} is {lat[first - 1]:.3g} ms at B={_b(b[first - 1])} and "
                f"{lat[first]:.3g} ms at B={_b(b[first])}, over the {limit_ms:g} ms limit"
                f"{note}")


def all_knees(batch: npt.ArrayLike, throughput_tok_s: npt.ArrayLike,
              tpot_ms: npt.ArrayLike | None = None, *, step: float = DEFAULT_STEP,
              doubling_grid: tuple[npt.ArrayLike, npt.ArrayLike] | None = None,
              doubling: float = DEFAULT_DOUBLING, max_tpot_ms: float | None = None,
              bca_epsilon_tok_s: float | None = None,
              bca_epsilon_fraction: float = DEFAULT_BCA_EPSILON_FRACTION,
              bca_latency_factor: float = DEFAULT_BCA_LATENCY_FACTOR,
              bca_reference_batch: float = DEFAULT_BCA_REFERENCE_BATCH) -> dict[str, Knee]:
    """The knee set of a curve, assembled here only (the plan's predicted curve, a sweep's
    measured one, the fit's fitted and measured ones, the simulator's levels, validation's
    curves): step and doubling always; BCA when TPOT is given; SLA when TPOT and
    `max_tpot_ms` are given. Keyed by rule name, in that order. `doubling_grid` (batch,
    throughput): where the curve can be read at any batch (the plan's), seed 004's rule reads
    this finer grid instead, so its knee need not be a power of two."""
    db, dt = doubling_grid if doubling_grid is not None else (batch, throughput_tok_s)
    out = {"step": step_knee(batch, throughput_tok_s, step),
           "doubling": doubling_knee(db, dt, doubling)}
    if tpot_ms is not None:
        out["bca"] = bca_knee(batch, throughput_tok_s, tpot_ms,
                              epsilon_tok_s=bca_epsilon_tok_s,
                              epsilon_fraction=bca_epsilon_fraction,
                              latency_factor=bca_latency_factor,
                              reference_batch=bca_reference_batch)
        if max_tpot_ms is not None:
            out["sla"] = slo_knee(batch, tpot_ms, max_tpot_ms)
    return out
