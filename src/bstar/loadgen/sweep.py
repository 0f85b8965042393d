"""The sweep: load a live server level by level, store every request, find the knee.

Library API (the CLI, `bstar report` and calibration call this):

    cfg = SweepConfig(url="http://127.0.0.1:8000", served_model="tiny",
                      concurrency=[1, 2, 4, 8], input_len=64, output_len=64, num_requests=32)
    result = run_sweep(cfg, db="runs.db")          # -> SweepResult
    result.to_dict()                                # the `bstar sweep --json` contract
    load_result("runs.db", result.run_id)           # the same object, from the store

With `server_cmd` and `max_num_seqs`, each value restarts the server (seed 000's
procedure): the command is formatted with {max_num_seqs} and {port}, started in its own
process group, waited on for health, stopped after its level; its log is kept next to the
DB and its path stored with the level.

`SweepConfig` and `LevelPlan` are defined in `bstar.loadgen.config` (the runner reads them
too) and exported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bstar.errors import BstarError
from bstar.fit.points import level_batch
from bstar.loadgen.config import LevelPlan, SweepConfig
from bstar.loadgen.runner import DONE_STATUSES, EventFn, _Runner, predict_level
from bstar.loadgen.store import LevelRow, Store, utc_now
from bstar.recommend import Recommendation, SloBound, tightest
from bstar.redact import clip

__all__ = ["DONE_STATUSES", "LevelPlan", "LevelResult", "SweepConfig", "SweepInterrupted",
           "SweepResult", "Terminated", "compare_results", "load_result", "predict_level",
           "run_sweep", "signals_as_interrupts", "verdict"]


class SweepInterrupted(Exception):
    """Ctrl-C, SIGTERM or SIGHUP: what was measured is stored, the server bstar started is
    stopped; `bstar sweep --resume RUN_ID` finishes."""

    def __init__(self, run_id: str, db: str) -> None:
        self.run_id = run_id
        self.db = db
        super().__init__(f"interrupted; resume with: bstar sweep --resume {run_id} --db {db}")


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP during a sweep, raised where Ctrl-C's KeyboardInterrupt would be,
    so both take one path: the level and the run are stored as interrupted and the
    `--server-cmd` process group is stopped (with the default action the process died on
    the spot, its server left running under init and its run "running")."""

    def __init__(self, signum: int) -> None:
        self.signal_name = signal.Signals(signum).name
        super().__init__(self.signal_name)


@contextlib.contextmanager
def signals_as_interrupts() -> Iterator[None]:
    """SIGTERM and SIGHUP raise `Terminated` while the sweep runs (once: a second signal
    during the clean-up is ignored so the clean-up finishes); the old handlers come back
    after. A signal whose Terminated a library on the way swallowed (a callback that
    catches everything) is raised again as the block ends: never lost. Only the main thread
    can set handlers; elsewhere, and for a signal the process ignores, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = 0

    def handler(signum: int, _frame: object) -> None:
        nonlocal fired
        if not fired:
            fired = signum
            raise Terminated(signum)

    # A signal ignored on purpose stays ignored (`nohup bstar sweep ...`: a closed terminal
    # must not stop the run).
    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)
           if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
    if fired:  # the body ended normally: something on the way swallowed the Terminated
        raise Terminated(fired)


# ---- results ----------------------------------------------------------------------------------


@dataclass
class LevelResult:
    idx: int
    concurrency: int | None
    rate: float | None
    max_num_seqs: int | None
    status: str
    status_detail: str | None
    attempt: int
    stats: dict[str, Any] | None
    server: dict[str, Any] | None
    predicted: dict[str, Any] | None
    server_log: str | None

    @property
    def batch(self) -> int | None:
        return level_batch(self)

    def to_dict(self) -> dict[str, Any]:
        s = self.stats or {}
        srv = self.server or {}
        empty = {"p50": None, "p90": None, "p99": None, "mean": None}
        d: dict[str, Any] = {}
        if self.max_num_seqs is not None:
            d["max_num_seqs"] = self.max_num_seqs
        d["concurrency"] = self.concurrency
        if self.rate is not None:
            d["rate"] = self.rate
        pred = None
        if self.predicted:
            pred = {"tpot_ms": self.predicted.get("tpot_ms"),
                    "throughput_tok_s": self.predicted.get("throughput_tok_s")}
            for k in ("batch", "context_tokens", "b_mem"):
                pred[k] = self.predicted.get(k)
            for k in ("throughput_basis", "decode_throughput_tok_s"):  # not in older runs
                if k in self.predicted:
                    pred[k] = self.predicted[k]
            tput = s.get("throughput_tok_s")
            if tput and pred["throughput_tok_s"]:
                pred["throughput_error"] = tput / pred["throughput_tok_s"] - 1.0
            tp = (s.get("tpot_ms") or {}).get("mean")
            if tp and pred["tpot_ms"]:
                pred["tpot_error"] = tp / pred["tpot_ms"] - 1.0
        d.update({
            "requests": s.get("requests", 0),
            "errors": s.get("errors", 0),
            "error_kinds": s.get("error_kinds", {}),
            "status": self.status,
            "status_detail": self.status_detail,
            "duration_s": s.get("duration_s"),
            "throughput_tok_s": s.get("throughput_tok_s"),
            "total_tok_s": s.get("total_tok_s"),
            "goodput_req_s": s.get("goodput_req_s"),
            "ttft_ms": s.get("ttft_ms", empty),
            "tpot_ms": s.get("tpot_ms", empty),
            "itl_ms": s.get("itl_ms", empty),
            "e2e_ms": s.get("e2e_ms", empty),
            "token_source": s.get("token_source"),
            "preemptions": srv.get("preemptions"),
            "prefix_cache_hit_rate": srv.get("prefix_cache_hit_rate"),
            "spec_tokens_per_step": srv.get("spec_tokens_per_step"),
            "kv_cache_usage_max": srv.get("kv_cache_usage_max"),
            "running_max": srv.get("running_max"),
            "waiting_max": srv.get("waiting_max"),
            "kv_capacity_seqs": srv.get("kv_capacity_seqs"),
            "server": srv or None,
            "predicted": pred,
            "server_log": self.server_log,
        })
        return d


@dataclass
class SweepResult:
    run_id: str
    db: str
    run: dict[str, Any]
    levels: list[LevelResult]
    knee: dict[str, Any]
    recommendation: dict[str, Any] | None

    @property
    def status(self) -> str:
        return str(self.run.get("status"))

    def to_dict(self) -> dict[str, Any]:
        run = self.run
        out = {
            "run_id": self.run_id,
            "db": self.db,
            "status": run.get("status"),
            "status_detail": run.get("status_detail"),
            "url": run.get("url"),
            "served_model": run.get("served_model"),
            "server_version": run.get("server_version"),
            "created_at": run.get("created_at"),
            "options": run.get("options"),
            "levels": [lv.to_dict() for lv in self.levels],
            "knee": self.knee,
            "recommendation": self.recommendation,
        }
        # Regime per level from /metrics, measured vs bstar's B_mem, preemption onset.
        from bstar.loadgen import regime

        kv = regime.analyze(out, {lv.idx: lv.predicted["regime"] for lv in self.levels
                                  if lv.predicted and lv.predicted.get("regime")})
        for lv_d, p in zip(out["levels"], (kv or {}).get("levels") or [], strict=False):
            lv_d["regime"] = p
        out["kv_regime"] = kv
        return out


def _level_result(row: LevelRow) -> LevelResult:
    return LevelResult(row.idx, row.concurrency, row.rate, row.max_num_seqs, row.status,
                       row.status_detail, row.attempt, row.stats, row.server, row.predicted,
                       row.server_log)


def verdict(levels: list[LevelResult], slo: dict[str, float]) -> tuple[dict[str, Any],
                                                                       dict[str, Any] | None]:
    """Knees by each rule over the measured curve, the SLA-bound batch, the recommendation."""
    from bstar import knee as knee_mod

    pts = [lv for lv in levels if lv.batch and lv.stats and lv.stats.get("completed")
           and (lv.stats.get("throughput_tok_s") or 0) > 0
           and (lv.stats.get("tpot_ms") or {}).get("mean")]
    by_batch: dict[int, LevelResult] = {}
    for lv in pts:  # one point per batch: with several loads per batch, the best throughput
        b = int(lv.batch or 0)
        if b not in by_batch or lv.stats["throughput_tok_s"] > by_batch[b].stats[
                "throughput_tok_s"]:
            by_batch[b] = lv
    batches = sorted(by_batch)
    axis = "max_num_seqs" if any(lv.max_num_seqs for lv in levels) else "concurrency"
    out: dict[str, Any] = {"axis": axis, "points": len(batches), "rules": {}}
    if len(batches) < 2:
        out["note"] = ("knee rules need at least two measured levels with a batch "
                       "(concurrency or max_num_seqs)")
        return out, None
    tput = [by_batch[b].stats["throughput_tok_s"] for b in batches]
    tpot = [by_batch[b].stats["tpot_ms"]["mean"] for b in batches]
    knees = knee_mod.all_knees(batches, tput, tpot)
    out["rules"] = {k: v.to_dict() for k, v in knees.items()}
    # SLA: every SLO must hold at p99 (TPOT, TTFT, E2E); the bound is the tightest.
    sla: list[SloBound] = []
    for key in ("tpot", "ttft", "e2e"):
        if key not in slo:
            continue
        vals = [(by_batch[b].stats[f"{key}_ms"] or {}).get("p99") for b in batches]
        if any(v is None or not v > 0 for v in vals):
            continue
        sla.append(SloBound(knee_mod.slo_knee(batches, vals, slo[key],
                                              what=f"p99 {key.upper()}")))
    if sla:
        bound = tightest(sla).knee
        out["rules"]["sla"] = bound.to_dict()
        out["sla_batch"] = bound.batch
    rec = Recommendation.from_curve("measured", batches, knees, sla)
    return out, rec.to_dict()


def load_result(db: str | Path | Store, run_id: str) -> SweepResult:
    store = db if isinstance(db, Store) else Store(db)
    try:
        run = store.get_run(run_id)
        if run is None:
            raise BstarError(f"no run {run_id!r} in {store.path}")
        levels = [_level_result(r) for r in store.levels(run["id"])]
        slo = (run.get("options") or {}).get("slo") or {}
        knee, rec = verdict(levels, slo)
        return SweepResult(run["id"], str(store.path), run, levels, knee, rec)
    finally:
        if not isinstance(db, Store):
            store.close()


def run_sweep(cfg: SweepConfig | None = None, *, db: str | Path | None = None,
              api_key: str | None = None, resume: str | None = None,
              on_event: EventFn | None = None, deployment: Any = None,
              bstar_version: str | None = None,
              session_factory: Callable[[], Any] | None = None,
              server_cmd: str | None = None) -> SweepResult:
    """Run (or resume) a sweep; every request is stored as it finishes. `deployment`: the
    cost model's, to predict each level; `session_factory`: the HTTP session each client
    uses (None: aiohttp; tests pass an in-process fake server's); `server_cmd`: on resume,
    the command to start the server with instead of the stored one (whose secrets were
    masked before it was stored).

    Raises SweepInterrupted on Ctrl-C, SIGTERM or SIGHUP (the run is marked interrupted,
    the server bstar started is stopped, and the run can be resumed).
    """
    with signals_as_interrupts():
        return _run_sweep(cfg, db, api_key, resume, on_event, deployment, bstar_version,
                          session_factory, server_cmd)


def _run_sweep(cfg: SweepConfig | None, db: str | Path | None, api_key: str | None,
               resume: str | None, on_event: EventFn | None, deployment: Any,
               bstar_version: str | None, session_factory: Callable[[], Any] | None,
               server_cmd: str | None) -> SweepResult:
    from bstar import __version__
    from bstar.redact import MASK, register_command, register_secret, register_url

    register_secret(api_key)  # masked in everything stored (loadgen/store.py) and printed
    if cfg is not None:
        register_url(cfg.url)
        register_command(cfg.server_cmd)
    register_command(server_cmd)
    store = Store(db)
    pool: Any = None
    try:
        if resume:
            run = store.get_run(resume)
            if run is None:
                raise BstarError(f"no run {resume!r} in {store.path}")
            run_id = run["id"]
            cfg = SweepConfig.from_options(run["options"] or {})
            if server_cmd:
                import dataclasses

                cfg = dataclasses.replace(cfg, server_cmd=server_cmd)
            elif cfg.server_cmd and MASK in cfg.server_cmd:
                raise BstarError("the stored --server-cmd had a secret masked before it was "
                                 "stored: give --server-cmd again with --resume")
            store.update_run(run_id, status="running", status_detail="resumed",
                             finished_at=None)
        else:
            if cfg is None:
                raise BstarError("run_sweep needs a SweepConfig or resume=RUN_ID")
            cfg.validate()
            if cfg.seed is None:
                import dataclasses
                import secrets

                # A copy: a caller's config stays seedless, so its next run is fresh too.
                cfg = dataclasses.replace(cfg, seed=secrets.randbits(48))
            run_id = store.create_run(
                url=cfg.url or "(started by bstar)", served_model=cfg.served_model,
                model=cfg.model, gpu=cfg.gpu, options=cfg.to_options(),
                bstar_version=bstar_version or __version__)
        levels = cfg.levels()
        if cfg.workers > 0 or cfg.ray is not None:
            from bstar.loadgen.workers import LoadPool

            pool = LoadPool(max(1, cfg.workers), cfg.ray)
        runner = _Runner(cfg, store, run_id, api_key, on_event, deployment, session_factory,
                         pool)
        runner.emit("run_start", run_id=run_id, db=str(store.path), levels=len(levels),
                    load=pool.describe() if pool is not None else "this process")
        runner.say_power_source()
        try:
            if pool is not None:
                pool.start()
            runner.run(levels)
        except (KeyboardInterrupt, asyncio.CancelledError) as e:
            why = e.signal_name if isinstance(e, Terminated) else "Ctrl-C"
            store.update_run(run_id, status="interrupted", finished_at=utc_now(),
                             status_detail=f"interrupted ({why}); resume with --resume")
            raise SweepInterrupted(run_id, str(store.path)) from None
        except BaseException as e:
            store.update_run(run_id, status="failed", finished_at=utc_now(),
                             status_detail=clip(f"{type(e).__name__}: {e}", 500))
            raise
        status, detail = _run_status(store.levels(run_id), levels, runner.fatal)
        store.update_run(run_id, status=status, status_detail=detail, finished_at=utc_now())
        if runner.served_model and not cfg.served_model:
            store.update_run(run_id, served_model=runner.served_model)
        result = load_result(store, run_id)
        store.update_run(run_id, result={"knee": result.knee,
                                         "recommendation": result.recommendation})
        result.run = store.get_run(run_id) or result.run
        return result
    finally:
        if pool is not None:
            pool.close()
        store.close()


def _run_status(rows: list[LevelRow], levels: list[LevelPlan],
                fatal: str | None) -> tuple[str, str | None]:
    """A finished run's status and its detail, from its stored levels."""
    statuses = {r.idx: r.status for r in rows}
    missing = [lv.idx for lv in levels if statuses.get(lv.idx) not in DONE_STATUSES]
    if fatal:
        return "failed", fatal
    if rows and not any((r.stats or {}).get("completed") for r in rows):
        return "failed", "no request succeeded: " + "; ".join(
            f"{levels[r.idx].label()}: {r.status_detail or r.status}" for r in rows)
    if missing:
        return "incomplete", "levels not completed: " + ", ".join(
            f"{levels[i].label()} ({statuses.get(i, 'not run')})" for i in missing)
    if any(r.status != "completed" or (r.stats or {}).get("errors") for r in rows):
        return "completed_with_errors", "; ".join(
            f"{levels[r.idx].label()}: {r.status_detail or r.status}"
            for r in rows if r.status != "completed" or (r.stats or {}).get("errors"))
    return "completed", None


def _level_key(lv: dict[str, Any]) -> tuple[Any, ...]:
    return (lv.get("max_num_seqs"), lv.get("concurrency"), lv.get("rate"))


def compare_results(results: list[SweepResult]) -> dict[str, Any]:
    """Runs side by side (`bstar runs compare --json`): one row per level key
    (max_num_seqs, concurrency, rate) in the order first seen, each run's figures there or
    None, and each run's recommendation."""
    dicts = [r.to_dict() for r in results]
    keys: list[tuple[Any, ...]] = []
    for d in dicts:
        keys += [k for k in map(_level_key, d["levels"]) if k not in keys]
    rows = []
    for k in keys:
        row: dict[str, Any] = {"max_num_seqs": k[0], "concurrency": k[1], "rate": k[2],
                               "runs": []}
        for d in dicts:
            lv = next((x for x in d["levels"] if _level_key(x) == k), None)
            row["runs"].append(None if lv is None else {
                "throughput_tok_s": lv["throughput_tok_s"],
                "tpot_ms_p50": lv["tpot_ms"]["p50"], "tpot_ms_p99": lv["tpot_ms"]["p99"],
                "ttft_ms_p99": lv["ttft_ms"]["p99"], "errors": lv["errors"],
                "preemptions": lv["preemptions"]})
        rows.append(row)
    return {"runs": [d["run_id"] for d in dicts],
            "recommendations": [d["recommendation"] for d in dicts], "levels": rows}


def resumed_options(db: str | None, run_id: str, model: str | None = None,
                    gpu: str | None = None) -> Any:
    """The deployment (`options.DeploymentOptions`) a resumed run predicts with: the one
    stored with run `run_id` (its --profile included), with a `model` or `gpu` given now
    in its place."""
    from bstar.options import DeploymentOptions

    with Store(db) as st:
        run = st.get_run(run_id)
    if run is None:
        raise BstarError(f"no run {run_id!r} in {db or 'the default DB'}")
    return DeploymentOptions.from_sweep_options(run["options"] or {}).with_target(model, gpu)

