"""Policy: every max_num_seqs bstar recommends is decided here, with the reason that bound
it, and printed as each engine's flags.

- `Recommendation.from_cost_model`: the knee of the predicted throughput curve, B_mem's
  band and a TPOT SLA (`bstar plan`, `bstar compare`); B* under --ideal.
- `Recommendation.from_curve`: knees on a measured (`bstar sweep`), fitted (`bstar fit`)
  or simulated (`bstar simulate`) throughput curve, capped by SLOs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from bstar.knee import Knee

# Seed 000: when B* is close to B_mem, cap at 80-90% of B_mem; 85% is the middle.
MEMORY_HEADROOM = 0.85


@dataclass(frozen=True, slots=True)
class Recommendation:
    """A max_num_seqs, why, and what bound it.

    `bound` is one of: from the cost model "knee", "b_mem" (and, for --ideal's seed
    rule, "b_star", "compute"); from a curve
    "knee", "sweep_end" (measured), "max-level" (simulated), "none" (fitted: no knee),
    "load" (simulated: the offered load, not the server, sets throughput),
    "single-level"; from an SLO "sla", "sla-unmet". `knees` are the rules' picks it was
    chosen from (empty under --ideal's seed rule); `source` the curve they were found on
    ("cost-model", "measured", "fitted", "simulated").
    """

    max_num_seqs: int
    reason: str
    bound: str
    knees: dict[str, Knee] = field(default_factory=dict)
    rule: str | None = None  # the knee rule it followed ("step", "doubling", "sla", ...)
    source: str = ""

    @property
    def knee(self) -> Knee | None:
        """The knee every picture marks beside this recommendation: the earliest pick of its
        source's throughput rules (`MARKED_RULES`), the one it followed when a knee bound
        it, and the one it would have followed when memory, an SLA or the load bound it
        instead; None when no rule fired."""
        return _earliest(self.knees, MARKED_RULES.get(self.source, ()))

    def to_dict(self, knees: bool = False) -> dict[str, Any]:
        """max_num_seqs, reason and bound; `knee` (the marked knee) when one fired, and
        with `knees` every rule's pick."""
        out: dict[str, Any] = {"max_num_seqs": self.max_num_seqs, "reason": self.reason,
                               "bound": self.bound}
        marked = self.knee
        if marked is not None:
            out["knee"] = marked.to_dict()
        if knees:
            out["knees"] = {k: v.to_dict() for k, v in self.knees.items()}
        return out

    @classmethod
    def from_cost_model(cls, b_star: float, b_mem: int, compute_crossover: float | None = None,
                        sla_batch: int | None = None, max_tpot_ms: float | None = None,
                        tpot_at_1_ms: float | None = None,
                        knees: Mapping[str, Knee] | None = None) -> Recommendation:
        """The cost model's pick. With `knees` of the predicted throughput curve (cost
        model 2, `plan.predicted_knees`): the knee by seed 004's doubling rule, capped at 85%
        of B_mem (seed 000's 80-90% band) and by the per-request TPOT SLA; seed 000's
        5%-per-step knee rides along in `knees`. Why the knee and not B*: past B* each
        sequence still buys throughput until the curve flattens, and on real H200 curves the
        measured knee sits 1.3-10x above B* (`bench/accuracy.py`, docs/seeds.md).

        Without `knees` (--ideal: the seeds' arithmetic, and the `recommend()` API of old):
        seed 000's rule, B* when it fits well inside B_mem, else 85% of B_mem, lowered to
        the compute crossover when that comes first."""
        rec = cls._cost_model_pick(b_star, b_mem, compute_crossover, knees)
        if max_tpot_ms is not None:
            if sla_batch is None or sla_batch < 1:
                at1 = f" (batch 1 already takes {tpot_at_1_ms:.2f} ms)" if tpot_at_1_ms else ""
                rec = cls(1, f"no batch meets TPOT <= {max_tpot_ms:g} ms{at1}; the SLA needs "
                          "faster hardware or more GPUs", "sla-unmet", rec.knees, "sla")
            elif sla_batch < rec.max_num_seqs:
                rec = cls(
                    sla_batch, f"latency SLA: per-request TPOT <= {max_tpot_ms:g} ms holds up "
                    f"to B = {sla_batch} (unconstrained: {rec.max_num_seqs}, {rec.bound})",
                    "sla", rec.knees, "sla")
        return replace(rec, source="cost-model")

    @classmethod
    def _cost_model_pick(cls, b_star: float, b_mem: int, compute_crossover: float | None,
                         knees: Mapping[str, Knee] | None) -> Recommendation:
        """`from_cost_model` before the SLA."""
        cap = max(1, math.floor(MEMORY_HEADROOM * b_mem))
        doubling = (knees or {}).get("doubling")
        if knees is not None and doubling is not None:
            k = doubling.batch
            if k is not None and k <= cap:
                rec = cls(k, f"predicted knee (doubling rule): {doubling.reason}; "
                          f"B* = {b_star:.2f} marks where saturation begins", "knee",
                          dict(knees), "doubling")
            else:
                why = (f"the predicted knee B = {k} is past it" if k is not None
                       else "throughput still gains 15% per doubling up to B_mem")
                rec = cls(cap, f"memory binds: {why}; 85% of B_mem = {b_mem} leaves "
                          "headroom against preemption (seed 000: 80-90%)", "b_mem",
                          dict(knees), "doubling")
        elif b_star <= MEMORY_HEADROOM * b_mem:
            rec = cls(
                max(1, math.floor(b_star)),
                f"B* = {b_star:.2f} (KV bytes read per step reach the weight bytes; past it "
                f"each added sequence buys less) fits within 85% of B_mem = {b_mem}", "b_star")
        else:
            rec = cls(
                cap,
                f"memory binds: B* = {b_star:.2f} is above 85% of B_mem = {b_mem}; 85% of "
                "B_mem leaves headroom against preemption (seed 000: 80-90%)", "b_mem")
        if knees is None and compute_crossover is not None \
                and compute_crossover < rec.max_num_seqs:
            rec = cls(
                max(1, math.floor(compute_crossover)),
                f"compute roof at B = {compute_crossover:.1f}: past it throughput is flat and "
                f"only latency grows (B* = {b_star:.2f}, B_mem = {b_mem})", "compute")
        return rec

    @classmethod
    def from_curve(cls, source: CurveSource, batches: Sequence[int],
                   knees: Mapping[str, Knee], sla: Sequence[SloBound] = (),
                   load: tuple[int, str] | None = None) -> Recommendation:
        """The pick on a measured, fitted or simulated throughput curve (`batches`, sorted,
        the levels or the grid the `knees` were found on):

        1. `load` (simulated only: a level on the plateau that the load, not the server,
           bounds; the caller finds it) wins; else the earliest knee of the source's
           throughput rules (`THROUGHPUT_RULES`): past it throughput is flat within the
           rule and only latency grows; else the largest batch (no knee on the curve).
        2. Every SLO must hold: the tightest `sla` bound caps the pick; one that no batch
           meets gives the smallest batch ("sla-unmet").
        """
        words = _WORDS[source]
        pick = _earliest(knees, THROUGHPUT_RULES[source])
        rule: str | None = None
        if load is not None:
            value, reason, bound = load[0], load[1], "load"
        elif pick is not None:
            assert pick.batch is not None
            value, bound, rule = pick.batch, "knee", pick.rule
            reason = words["knee"].format(rule=pick.rule, reason=pick.reason)
        else:
            step = knees.get("step")
            value, bound = batches[-1], words["end_bound"]
            reason = words["end"].format(top=batches[-1], step=step.reason if step else "")
        all_knees = dict(knees)
        if sla:
            tight = tightest(sla)
            if tight.knee.batch is None:
                return cls(batches[0], words["sla_unmet"].format(
                    label=tight.label, reason=tight.knee.reason), "sla-unmet", all_knees, "sla",
                    source)
            if tight.knee.batch < value or (bound == "none" and tight.knee.batch <= value):
                reason = words["sla"].format(reason=tight.knee.reason, value=value)
                value, bound, rule = tight.knee.batch, "sla", "sla"
        return cls(value, reason, bound, all_knees, rule, source)


CurveSource = Literal["measured", "fitted", "simulated"]

# The knee rules whose earliest pick a curve's recommendation follows.
THROUGHPUT_RULES: dict[str, tuple[str, ...]] = {
    "measured": ("step", "doubling"),  # seeds 000 and 004
    "simulated": ("step", "doubling"),
    "fitted": ("doubling",),  # the fitted curve is smooth: seed 004's doubling rule
}
# The rules whose earliest pick a picture marks as the knee (`Recommendation.knee`): a
# curve's throughput rules; the cost model's pick starts from seed 004's doubling rule
# (`from_cost_model`), so its pictures mark that knee.
MARKED_RULES: dict[str, tuple[str, ...]] = {"cost-model": ("doubling",), **THROUGHPUT_RULES}


def _earliest(knees: Mapping[str, Knee], rules: Sequence[str]) -> Knee | None:
    """The fired knee of `rules` at the smallest batch (the first of `rules` on a tie)."""
    fired = [k for r in rules if (k := knees.get(r)) is not None and k.batch is not None]
    return min(fired, key=lambda k: k.batch or 0) if fired else None


_WORDS: dict[str, dict[str, str]] = {
    "measured": {
        "knee": "measured knee ({rule} rule): {reason}",
        "end_bound": "sweep_end",
        "end": "no knee within the sweep ({step}); the largest level measured, B={top}; "
               "sweep further to find the knee",
        "sla_unmet": "no level meets the SLO: {reason}",
        "sla": "SLO: {reason} (unconstrained: {value})"},
    "simulated": {
        "knee": "throughput knee ({rule} rule): {reason}",
        "end_bound": "max-level",
        "end": "throughput still rises at the largest level simulated ({top}); try larger "
               "--max-num-seqs",
        "sla_unmet": "no level meets {label}: {reason}",
        "sla": "latency SLA: {reason} (throughput alone would pick {value})"},
    "fitted": {
        "knee": "fitted knee ({rule} rule): {reason}",
        "end_bound": "none",
        "end": "no knee on the fitted curve up to B={top}",
        "sla_unmet": "no batch meets {label}: {reason}",
        "sla": "latency SLA: {reason} (throughput alone would pick {value})"},
}


@dataclass(frozen=True, slots=True)
class SloBound:
    """An SLO's knee (the largest batch meeting it) and its words, e.g. "p99 TPOT <= 50 ms"."""

    knee: Knee
    label: str = ""


def tightest(sla: Sequence[SloBound]) -> SloBound:
    """The SLO bound that binds: the smallest SLO batch, one that no batch meets first (the
    one rule for the tightest bound: `from_curve`, `loadgen/sweep.verdict`)."""
    return min(sla, key=lambda s: -1 if s.knee.batch is None else s.knee.batch)


def recommend(b_star: float, b_mem: int, compute_crossover: float | None = None,
              sla_batch: int | None = None, max_tpot_ms: float | None = None,
              tpot_at_1_ms: float | None = None) -> Recommendation:
    """`Recommendation.from_cost_model` (the name the library API has always had)."""
    return Recommendation.from_cost_model(b_star, b_mem, compute_crossover, sla_batch,
                                          max_tpot_ms, tpot_at_1_ms)


def engine_flags(max_num_seqs: int, gpu_util: float, num_gpus: int,
                 context_tokens: int) -> dict[str, str]:
    """The same cap in each engine's words."""
    tp_vllm = f" --tensor-parallel-size {num_gpus}" if num_gpus > 1 else ""
    tp_sgl = f" --tp {num_gpus}" if num_gpus > 1 else ""
    tp_trt = f" --tp_size {num_gpus}" if num_gpus > 1 else ""
    tp_tgi = f" --num-shard {num_gpus}" if num_gpus > 1 else ""
    return {
        "vllm": f"--max-num-seqs {max_num_seqs} --gpu-memory-utilization {gpu_util:g}"
                f"{tp_vllm}",
        "sglang": f"--max-running-requests {max_num_seqs} --mem-fraction-static {gpu_util:g}"
                  f"{tp_sgl}",
        "tensorrt-llm": f"--max_batch_size {max_num_seqs}{tp_trt}",
        "tgi": f"--max-batch-size {max_num_seqs} --max-batch-total-tokens "
               f"{max_num_seqs * context_tokens}{tp_tgi}",
    }
