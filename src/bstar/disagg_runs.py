"""A disaggregated runs table: one row per closed-loop benchmark run of a disaggregated
deployment (xPyD), and its score against `bstar.disaggregate`'s plan
(data/inferencex-h200/disagg_runs.csv; its README says what each column is).

A row is a run of `concurrency` users in a closed loop sending `num_prompts` requests with
prompt and output lengths uniform in their [min, max] ranges (every output in full), on
`prefill_workers` prefill workers and `decode_workers` decode workers of the named layouts,
the KV crossing `kv_link`. Its own file format, apart from the aggregated runs table
(bstar.runs_table): a side's layout and workers do not fit that table's columns.

Required columns: run, model, gpu, engine, prefill_workers, prefill_tp, decode_workers,
decode_tp, concurrency, num_prompts, prompt_len_min, prompt_len_max, output_len_min,
output_len_max, ttft_mean_ms, tpot_mean_ms, source. Optional (blank: 1 for a layout, the
engine's default for a limit): each side's `_ep`, `_dp`, `_max_num_seqs`,
`_max_num_batched_tokens`; `kv_cache_dtype`, `dtype`, `kv_link`, `spec_method` (`none` or
`mtp`) with `num_speculative_tokens` (draft tokens a step; required for `mtp`), and the
measured medians, E2E and output tokens/s per GPU.

Scoring (`score_disagg_runs`): the plan at the run's mean prompt and output lengths and its
concurrency (`plan_disaggregated(..., concurrency=N)`): TPOT from the decode side, TTFT =
request overhead + prefill queue + prefill + transfer + first decode step (+ decode wait),
each against the measured mean, |predicted / measured - 1|; medians of those.

An MTP run's decode side is priced as `bstar.specdec` prices a speculative step (the
DeepSeek MTP layer as the drafter, K = `num_speculative_tokens` drafts, verify + draft
passes, the drafter's weights and KV out of the pool) over the tokens a step yields at the
acceptance rate a. The rows state no acceptance, so a is an input, never a constant, by the
rule `bstar validate` applies to aggregated runs (bstar.validate_runs): the `acceptance`
given, else fitted leave one run out, the median of the acceptances the OTHER MTP runs of
the same engine and K imply (`implied_acceptance`: the a at which the plan's TPOT equals
the measured mean). A run with no such other run is skipped, with the reason. Each MTP
run's implied acceptance is printed beside it. The two-pool simulation (`--simulate`) runs
an MTP run's decode side speculatively at the same acceptance (`bstar.sim.disagg`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bstar import specdec
from bstar.acceptance import implied_acceptance as implied_from_tpot
from bstar.acceptance import leave_one_out_acceptance
from bstar.errors import BstarError
from bstar.fit.points import read_columns
from bstar.specdec import MAX_SPECULATIVE_TOKENS
from bstar.stages_table import _float, _int

REQUIRED = ("run", "model", "gpu", "engine", "prefill_workers", "prefill_tp",
            "decode_workers", "decode_tp", "concurrency", "num_prompts", "prompt_len_min",
            "prompt_len_max", "output_len_min", "output_len_max", "ttft_mean_ms",
            "tpot_mean_ms", "source")
SIDE_COLUMNS = ("workers", "tp", "ep", "dp", "max_num_seqs", "max_num_batched_tokens")
# Every column, in the order bench/to_inferencex_disagg.py writes them.
COLUMNS = ("run", "model", "gpu", "engine", "engine_version", "dtype", "kv_cache_dtype",
           "spec_method", "num_speculative_tokens",
           *(f"prefill_{c}" for c in SIDE_COLUMNS), *(f"decode_{c}" for c in SIDE_COLUMNS),
           "kv_link", "concurrency", "num_prompts", "prompt_len_min", "prompt_len_max",
           "output_len_min", "output_len_max", "ttft_mean_ms", "ttft_median_ms",
           "tpot_mean_ms", "tpot_median_ms", "e2e_mean_ms", "output_tok_s_per_gpu", "date",
           "source")
SPEC_METHODS = ("", "none", "mtp")
ACCEPTANCE_TOL = 1e-4  # the implied acceptance's bracket width (plans are cheap) ...
TPOT_RTOL = 1e-6  # ... or the plan's TPOT within this of the measured


@dataclass(frozen=True, slots=True)
class DisaggRun:
    """One row: the deployment by name, the closed loop, and what was measured."""

    run: str
    model: str
    gpu: str
    engine: str
    sides: dict[str, dict[str, int | None]]  # "prefill"/"decode" -> SIDE_COLUMNS
    concurrency: int
    num_prompts: int
    prompt_len: tuple[int, int]
    output_len: tuple[int, int]
    ttft_mean_ms: float
    tpot_mean_ms: float
    source: str
    where: str = ""
    engine_version: str = ""
    dtype: str = ""
    kv_cache_dtype: str = ""
    spec_method: str = "none"
    num_speculative_tokens: int | None = None
    kv_link: str = ""
    ttft_median_ms: float | None = None
    tpot_median_ms: float | None = None
    e2e_mean_ms: float | None = None
    output_tok_s_per_gpu: float | None = None

    @property
    def prompt_tokens(self) -> int:
        """The mean prompt length of the uniform range (what the plan is priced at)."""
        return round(sum(self.prompt_len) / 2)

    @property
    def output_tokens(self) -> int:
        return round(sum(self.output_len) / 2)

    @property
    def has_dp_or_ep(self) -> bool:
        return any((s["dp"] or 1) > 1 or (s["ep"] or 1) > 1 for s in self.sides.values())


def disagg_runs_from_csv(text: str, where: str = "table") -> list[DisaggRun]:
    """Parse a disaggregated runs table (header row; lines starting with # are comments)."""
    from bstar.kv_link import LINK_KINDS

    table = read_columns(text, where, REQUIRED, COLUMNS)
    out = []
    for cells, at in table.rows():
        r = {h: (c or "").strip() for h, c in cells.items()}
        if not r["source"]:
            raise BstarError(f"{at}: every row needs its source")
        sides: dict[str, dict[str, int | None]] = {}
        for side in ("prefill", "decode"):
            sides[side] = {c: _int(r, f"{side}_{c}", at, required=c in ("workers", "tp"),
                                   maximum=4096 if c in ("workers", "tp", "ep", "dp")
                                   else 1 << 24)
                           for c in SIDE_COLUMNS}
        ints = {k: _int(r, k, at, required=True) or 1 for k in (
            "concurrency", "num_prompts", "prompt_len_min", "prompt_len_max",
            "output_len_min", "output_len_max")}
        for lo, hi in (("prompt_len_min", "prompt_len_max"),
                       ("output_len_min", "output_len_max")):
            if ints[lo] > ints[hi]:
                raise BstarError(f"{at}: {lo} {ints[lo]} is above {hi} {ints[hi]}")
        spec = r.get("spec_method", "").lower()
        if spec not in SPEC_METHODS:
            raise BstarError(f"{at}: spec_method {r['spec_method']!r} is not none or mtp")
        k = _int(r, "num_speculative_tokens", at, maximum=MAX_SPECULATIVE_TOKENS)
        if spec == "mtp" and k is None:
            raise BstarError(f"{at}: an mtp run needs num_speculative_tokens (draft tokens a "
                             "step)")
        link = r.get("kv_link", "")
        if link and link not in LINK_KINDS:
            raise BstarError(f"{at}: kv_link {link!r} is not one of {', '.join(LINK_KINDS)}")
        out.append(DisaggRun(
            run=r["run"] or at, model=r["model"], gpu=r["gpu"], engine=r["engine"],
            sides=sides, concurrency=ints["concurrency"], num_prompts=ints["num_prompts"],
            prompt_len=(ints["prompt_len_min"], ints["prompt_len_max"]),
            output_len=(ints["output_len_min"], ints["output_len_max"]),
            ttft_mean_ms=_float(r, "ttft_mean_ms", at, required=True) or 0.0,
            tpot_mean_ms=_float(r, "tpot_mean_ms", at, required=True) or 0.0,
            source=r["source"], where=at, engine_version=r.get("engine_version", ""),
            dtype=r.get("dtype", ""), kv_cache_dtype=r.get("kv_cache_dtype", ""),
            spec_method=spec or "none", num_speculative_tokens=k if spec == "mtp" else None,
            kv_link=link,
            ttft_median_ms=_float(r, "ttft_median_ms", at),
            tpot_median_ms=_float(r, "tpot_median_ms", at),
            e2e_mean_ms=_float(r, "e2e_mean_ms", at),
            output_tok_s_per_gpu=_float(r, "output_tok_s_per_gpu", at)))
    if not out:
        raise BstarError(f"{where}: no rows")
    return out


def load_disagg_runs(path: str | Path) -> list[DisaggRun]:
    """Read a disaggregated runs table from a file (bstar.safeio bounds it)."""
    from bstar.safeio import MAX_TABLE_BYTES, read_text

    return disagg_runs_from_csv(read_text(path, MAX_TABLE_BYTES, "disaggregated runs table"),
                                str(path))


def run_deployment(run: DisaggRun) -> Any:
    """The run's DisaggregatedDeployment (bstar.disaggregate)."""
    from bstar.disaggregate import DisaggregatedDeployment, WorkerSpec
    from bstar.options import DeploymentOptions

    o = DeploymentOptions(model=run.model, gpu=run.gpu, engine=run.engine,
                          weight_dtype=run.dtype, kv_dtype=run.kv_cache_dtype or "bf16")
    specs = {side: WorkerSpec(**{k: v for k, v in s.items() if v is not None})
             for side, s in run.sides.items()}
    return DisaggregatedDeployment(o, specs["prefill"], specs["decode"], run.kv_link)


@dataclass(frozen=True, slots=True)
class DisaggScore:
    """One run: measured and predicted TPOT and TTFT, or why it was skipped."""

    run: DisaggRun
    predicted_tpot_ms: float | None = None
    predicted_ttft_ms: float | None = None
    bound: str = ""
    priced_as: str = ""
    skipped: str = ""
    # `bstar.sim.disagg`'s means over the run's own requests (None: not simulated)
    simulated_tpot_ms: float | None = None
    simulated_ttft_ms: float | None = None
    simulated_ttft_median_ms: float | None = None
    # MTP runs: the acceptance priced, the one the run implies, and how the first was chosen
    acceptance_used: float | None = None
    acceptance_implied: float | None = None
    acceptance_basis: str = ""
    # MTP runs: plain / speculative TPOT of the plan; the measured one against the twin
    # without speculation (`speculative_twin`), when one ran
    predicted_speedup: float | None = None
    twin: str | None = None
    measured_speedup: float | None = None

    @property
    def tpot_error(self) -> float | None:
        if self.predicted_tpot_ms is None:
            return None
        return self.predicted_tpot_ms / self.run.tpot_mean_ms - 1.0

    @property
    def ttft_error(self) -> float | None:
        if self.predicted_ttft_ms is None:
            return None
        return self.predicted_ttft_ms / self.run.ttft_mean_ms - 1.0

    @property
    def ttft_median_error(self) -> float | None:
        """The plan's TTFT against the measured median (a steady state has no bursts: the
        median is the request it describes)."""
        if self.predicted_ttft_ms is None or not self.run.ttft_median_ms:
            return None
        return self.predicted_ttft_ms / self.run.ttft_median_ms - 1.0

    @property
    def simulated_ttft_median_error(self) -> float | None:
        if self.simulated_ttft_median_ms is None or not self.run.ttft_median_ms:
            return None
        return self.simulated_ttft_median_ms / self.run.ttft_median_ms - 1.0

    @property
    def simulated_tpot_error(self) -> float | None:
        if self.simulated_tpot_ms is None:
            return None
        return self.simulated_tpot_ms / self.run.tpot_mean_ms - 1.0

    @property
    def simulated_ttft_error(self) -> float | None:
        if self.simulated_ttft_ms is None:
            return None
        return self.simulated_ttft_ms / self.run.ttft_mean_ms - 1.0

    def to_dict(self) -> dict[str, Any]:
        r = self.run
        return {"run": r.run, "engine": r.engine, "spec_method": r.spec_method,
                "layout": f"{r.sides['prefill']['workers']}P{r.sides['decode']['workers']}D",
                "prefill": r.sides["prefill"], "decode": r.sides["decode"],
                "concurrency": r.concurrency, "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens,
                "measured": {"tpot_mean_ms": r.tpot_mean_ms, "ttft_mean_ms": r.ttft_mean_ms,
                             "ttft_median_ms": r.ttft_median_ms},
                "predicted": {"tpot_ms": self.predicted_tpot_ms,
                              "ttft_ms": self.predicted_ttft_ms, "bound": self.bound,
                              "priced_as": self.priced_as},
                "errors": {"tpot": self.tpot_error, "ttft": self.ttft_error,
                           "ttft_vs_median": self.ttft_median_error},
                "simulated": None if self.simulated_tpot_ms is None else {
                    "tpot_mean_ms": self.simulated_tpot_ms,
                    "ttft_mean_ms": self.simulated_ttft_ms,
                    "ttft_median_ms": self.simulated_ttft_median_ms,
                    "errors": {"tpot": self.simulated_tpot_error,
                               "ttft": self.simulated_ttft_error,
                               "ttft_median": self.simulated_ttft_median_error}},
                "acceptance": None if r.spec_method != "mtp" else {
                    "used": self.acceptance_used, "implied": self.acceptance_implied,
                    "basis": self.acceptance_basis,
                    "num_speculative_tokens": r.num_speculative_tokens,
                    "predicted_speedup": self.predicted_speedup, "twin": self.twin,
                    "measured_speedup": self.measured_speedup},
                "skipped": self.skipped or None}


def _median_abs(values: Sequence[float | None]) -> float | None:
    v = [abs(x) for x in values if x is not None]
    return float(np.median(v)) if v else None


def summary(scores: Sequence[DisaggScore]) -> dict[str, Any]:
    """Median |error| of TPOT and TTFT over the scored runs, all of them and the runs priced
    without EP or attention DP apart (those are priced as tensor parallel today)."""
    scored = [s for s in scores if not s.skipped]
    tp_only = [s for s in scored if not s.run.has_dp_or_ep]
    out: dict[str, Any] = {"runs": len(scores), "scored": len(scored),
                           "skipped": len(scores) - len(scored)}
    for name, group in (("all", scored), ("tp_only", tp_only),
                        ("with_ep_or_dp", [s for s in scored if s.run.has_dp_or_ep]),
                        ("without_mtp", [s for s in scored if s.run.spec_method != "mtp"]),
                        ("mtp", [s for s in scored if s.run.spec_method == "mtp"])):
        out[name] = {"runs": len(group),
                     "tpot_median_abs_error": _median_abs([s.tpot_error for s in group]),
                     "ttft_median_abs_error": _median_abs([s.ttft_error for s in group]),
                     "ttft_vs_measured_median_abs_error": _median_abs(
                         [s.ttft_median_error for s in group]),
                     "simulated_tpot_median_abs_error": _median_abs(
                         [s.simulated_tpot_error for s in group]),
                     "simulated_ttft_median_abs_error": _median_abs(
                         [s.simulated_ttft_error for s in group]),
                     "simulated_ttft_median_vs_measured_median_abs_error": _median_abs(
                         [s.simulated_ttft_median_error for s in group])}
    return out


def plan_for_run(r: DisaggRun, acceptance: float | None = None) -> Any:
    """The plan at the run's concurrency and mean lengths; an MTP run's decode side
    speculative at `acceptance`."""
    from bstar.disaggregate import plan_disaggregated

    spec = (None if r.spec_method != "mtp" or acceptance is None
            else specdec.SpecConfig(r.num_speculative_tokens or 1, acceptance, "mtp"))
    return plan_disaggregated(run_deployment(r), r.prompt_tokens, r.output_tokens,
                              concurrency=r.concurrency, speculative=spec)


def implied_acceptance(r: DisaggRun) -> float | None:
    """The acceptance rate at which the plan's TPOT equals the run's measured mean
    (`bstar.acceptance.implied_acceptance`, to ACCEPTANCE_TOL or TPOT_RTOL); 0 or 1 when the
    measurement lies past either end; None for a run without speculation."""
    if r.spec_method != "mtp":
        return None
    return implied_from_tpot(
        lambda a: float(plan_for_run(r, a).at_load.tpot_s * 1e3), r.tpot_mean_ms,
        ACCEPTANCE_TOL, TPOT_RTOL)


def acceptances(runs: Sequence[DisaggRun], acceptance: float | None = None
                ) -> dict[str, tuple[float | None, float | None, str]]:
    """Per MTP run: (acceptance used, acceptance it implies, how the first was chosen), by
    the module docstring's rule (`bstar.acceptance.leave_one_out_acceptance` over the runs of the
    same engine and K); the used one None when no other run gives one."""
    mtp = [r for r in runs if r.spec_method == "mtp"]
    implied: dict[str, float | None] = {}
    for r in mtp:
        try:
            implied[r.run] = implied_acceptance(r)
        except BstarError:
            implied[r.run] = None
    groups = {r.run: (r.engine, r.num_speculative_tokens) for r in mtp}
    out: dict[str, tuple[float | None, float | None, str]] = {}
    for r in mtp:
        if acceptance is not None:
            out[r.run] = (acceptance, implied[r.run], "stated")
            continue
        fitted, n = leave_one_out_acceptance(r.run, implied, groups)
        out[r.run] = (fitted, implied[r.run],
                      f"leave one out: median of {n} other {r.engine} MTP run(s) at K "
                      f"{r.num_speculative_tokens}" if n else
                      f"no other {r.engine} MTP run at K {r.num_speculative_tokens} "
                      "implies one")
    return out


def speculative_twin(r: DisaggRun, runs: Sequence[DisaggRun]) -> DisaggRun | None:
    """The run of the same model, GPU, engine, layout (each side's workers, TP, EP, DP),
    lengths and concurrency without speculation, if one ran (its TPOT over the MTP run's is
    the measured speedup)."""
    for o in runs:
        if (o.spec_method != "mtp" and (o.model, o.gpu, o.engine, o.sides, o.prompt_len,
                                         o.output_len, o.concurrency)
                == (r.model, r.gpu, r.engine, r.sides, r.prompt_len, r.output_len,
                    r.concurrency)):
            return o
    return None


def score_disagg_runs(runs: Sequence[DisaggRun], simulate: bool = False,
                      seed: int = 0, acceptance: float | None = None) -> list[DisaggScore]:
    """Each run against the plan at its concurrency (module docstring); an MTP run at the
    acceptance `acceptances` gives it (skipped where none). With
    `simulate`, also against `bstar.sim.disagg` running the run's own closed loop (its
    users all starting at t = 0, its requests and length ranges, every request counted)."""
    acc = acceptances(runs, acceptance)
    out = []
    for r in runs:
        spec_fields: dict[str, Any] = {}
        if r.spec_method == "mtp":
            used, implied, how = acc[r.run]
            spec_fields = {"acceptance_used": used, "acceptance_implied": implied,
                           "acceptance_basis": how}
            if used is None:
                out.append(DisaggScore(r, skipped=f"speculative decoding (MTP): {how}",
                                       **spec_fields))
                continue
        try:
            p = plan_for_run(r, spec_fields.get("acceptance_used"))
        except BstarError as e:
            out.append(DisaggScore(r, skipped=str(e), **spec_fields))
            continue
        a = p.at_load
        if r.spec_method == "mtp":  # the plan's speedup, and the measured one where a twin ran
            plain = plan_for_run(r).at_load.tpot_s
            twin = speculative_twin(r, runs)
            spec_fields |= {"predicted_speedup": plain / a.tpot_s,
                            "twin": None if twin is None else twin.run,
                            "measured_speedup": None if twin is None
                            else twin.tpot_mean_ms / r.tpot_mean_ms}
        sim: dict[str, float | None] = {}
        if simulate:
            from bstar.sim.disagg import simulate_plan

            res = simulate_plan(p, num_requests=r.num_prompts, prompt_len=r.prompt_len,
                                output_len=r.output_len, concurrency=r.concurrency,
                                seed=seed)
            sim = {"simulated_tpot_ms": float(res.tpot_s.mean() * 1e3),
                   "simulated_ttft_ms": float(res.ttft_s.mean() * 1e3),
                   "simulated_ttft_median_ms": float(np.median(res.ttft_s) * 1e3)}
        out.append(DisaggScore(r, a.tpot_s * 1e3, a.ttft_s * 1e3, a.bound,
                               "/".join(f"{k}:{v}" for k, v in p.priced_as.items()), **sim,
                               **spec_fields))
    return out
