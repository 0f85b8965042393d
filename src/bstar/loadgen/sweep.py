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
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import shlex
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from bstar.errors import BstarError
from bstar.loadgen.client import OpenAIClient, RequestRecord
from bstar.loadgen.metrics import summarize
from bstar.loadgen.scrape import Scraper
from bstar.loadgen.store import LevelRow, Store, utc_now
from bstar.loadgen.worker import drive
from bstar.loadgen.workload import TokenCounter, Workload, build_requests

# Level statuses that count as done: resume skips them. A level stopped by the error-rate
# rule or its time limit still measured what it measured; re-running would not change why.
DONE_STATUSES = ("completed", "stopped_errors", "time_limit")
_CONNECTION_KINDS = ("connect", "reset")

EventFn = Callable[[str, dict[str, Any]], None]


@dataclass
class SweepConfig:
    """Everything a sweep needs except the API key (passed apart, never stored)."""

    url: str | None = None
    served_model: str | None = None  # None: the first model /v1/models lists
    endpoint: str = "completions"  # or "chat"
    concurrency: list[int] | None = None
    rate: list[float] | None = None
    max_num_seqs: list[int] | None = None
    server_cmd: str | None = None
    input_len: int = 128
    output_len: int = 128
    num_requests: int = 64  # measured requests per level
    warmup_requests: int | None = None  # None: one per stream
    level_time_limit_s: float = 300.0
    request_timeout_s: float = 600.0
    health_timeout_s: float = 600.0
    seed: int = 0
    prompts_file: str | None = None
    slo: dict[str, float] = field(default_factory=dict)
    max_error_rate: float = 0.5
    min_requests_for_error_rule: int = 8
    ignore_eos: bool = True
    scrape_interval_s: float = 0.5
    model: str | None = None  # cost-model preset/config (for predictions)
    gpu: str | None = None
    deployment_args: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if self.endpoint not in ("completions", "chat"):
            raise BstarError(f"--endpoint must be completions or chat, got {self.endpoint}")
        if self.concurrency and self.rate:
            raise BstarError("give --concurrency or --rate, not both")
        if not (self.concurrency or self.rate or self.max_num_seqs):
            raise BstarError("give --concurrency, --rate or --max-num-seqs")
        if self.max_num_seqs and not self.server_cmd:
            raise BstarError("--max-num-seqs needs --server-cmd (bstar restarts the server "
                             "for each value)")
        if self.server_cmd and "{max_num_seqs}" not in self.server_cmd and self.max_num_seqs:
            raise BstarError("--server-cmd must contain {max_num_seqs}")
        if not self.url and not self.server_cmd:
            raise BstarError("give --url (or --server-cmd to let bstar start the server)")
        if self.input_len < 1 or self.output_len < 1 or self.num_requests < 1:
            raise BstarError("--input-len, --output-len and --num-requests must be >= 1")
        if not 0 <= self.max_error_rate <= 1:
            raise BstarError("--max-error-rate must be in [0, 1]")
        if self.url:
            host = urllib.parse.urlsplit(self.url).hostname
            if not host:
                raise BstarError(f"--url {self.url!r} is not a URL (http://host:port)")

    def levels(self) -> list[LevelPlan]:
        loads: list[tuple[int | None, float | None]]
        if self.rate:
            loads = [(None, r) for r in self.rate]
        elif self.concurrency:
            loads = [(c, None) for c in self.concurrency]
        else:
            loads = [(None, None)]
        out: list[LevelPlan] = []
        for mns in self.max_num_seqs or [None]:
            for conc, rate in loads:
                if conc is None and rate is None:
                    conc = mns  # fill exactly the server's batch cap
                out.append(LevelPlan(len(out), conc, rate, mns))
        return out

    def to_options(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> SweepConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in options.items() if k in known})


@dataclass(frozen=True)
class LevelPlan:
    idx: int
    concurrency: int | None
    rate: float | None
    max_num_seqs: int | None

    @property
    def batch(self) -> int | None:
        """The batch the server can run at this level (for the knee and the cost model)."""
        vals = [v for v in (self.concurrency, self.max_num_seqs) if v]
        return min(vals) if vals else None

    def label(self) -> str:
        parts = []
        if self.max_num_seqs is not None:
            parts.append(f"max_num_seqs={self.max_num_seqs}")
        if self.concurrency is not None:
            parts.append(f"concurrency={self.concurrency}")
        if self.rate is not None:
            parts.append(f"rate={self.rate:g}/s")
        return " ".join(parts)


class SweepInterrupted(Exception):
    """Ctrl-C: what was measured is stored; `bstar sweep --resume RUN_ID` finishes."""

    def __init__(self, run_id: str, db: str) -> None:
        self.run_id = run_id
        self.db = db
        super().__init__(f"interrupted; resume with: bstar sweep --resume {run_id} --db {db}")


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
        return LevelPlan(self.idx, self.concurrency, self.rate, self.max_num_seqs).batch

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
    sla: list[Any] = []
    for key in ("tpot", "ttft", "e2e"):
        if key not in slo:
            continue
        vals = [(by_batch[b].stats[f"{key}_ms"] or {}).get("p99") for b in batches]
        if any(v is None or not v > 0 for v in vals):
            continue
        sla.append(knee_mod.sla_knee(batches, vals, slo[key], what=f"p99 {key.upper()}"))
    if sla:
        bound = min(sla, key=lambda k: -1 if k.batch is None else k.batch)
        out["rules"]["sla"] = bound.to_dict()
        out["sla_batch"] = bound.batch
    # The seeds' two rules (000: step under 5%, 004: doubling under 15%); the earlier
    # knee wins, since past it throughput is flat within the rule and only latency grows.
    fired = [k for k in (knees["step"], knees["doubling"]) if k.batch is not None]
    if fired:
        k = min(fired, key=lambda k: k.batch or 0)
        rec = {"max_num_seqs": k.batch, "reason": f"measured knee ({k.rule} rule): {k.reason}",
               "bound": "knee"}
    else:
        step = knees["step"]
        rec = {"max_num_seqs": batches[-1],
               "reason": f"no knee within the sweep ({step.reason}); the largest level "
                         f"measured, B={batches[-1]}; sweep further to find the knee",
               "bound": "sweep_end"}
    if sla:
        if out.get("sla_batch") is None:
            rec = {"max_num_seqs": batches[0], "reason": f"no level meets the SLO: "
                   f"{bound.reason}", "bound": "sla-unmet"}
        elif out["sla_batch"] < rec["max_num_seqs"]:
            rec = {"max_num_seqs": out["sla_batch"],
                   "reason": f"SLO: {bound.reason} (unconstrained: {rec['max_num_seqs']})",
                   "bound": "sla"}
    return out, rec


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


# ---- cost model -----------------------------------------------------------------------------


def predict_level(deployment: Any, batch: int | None, context_tokens: int) -> dict[str, Any]:
    """The cost model's decode step at this level's batch (None fields when no batch)."""
    from bstar import roofline as rl

    if not batch:
        return {}
    c = rl.curve(deployment, [batch], context_tokens)
    return {
        "batch": batch,
        "context_tokens": context_tokens,
        "tpot_ms": float(c.tpot_s[0]) * 1e3,
        "throughput_tok_s": float(c.throughput_tok_s[0]),
        "regime": c.regime[0],
        "b_mem": int(rl.b_mem(deployment, context_tokens)),
        "b_star": float(rl.b_star(deployment, context_tokens)),
    }


# ---- running --------------------------------------------------------------------------------


class _Runner:
    def __init__(self, cfg: SweepConfig, store: Store, run_id: str, api_key: str | None,
                 on_event: EventFn | None, deployment: Any) -> None:
        self.cfg = cfg
        self.store = store
        self.run_id = run_id
        self.api_key = api_key
        self.on_event = on_event or (lambda kind, data: None)
        self.deployment = deployment
        self.server: Any = None
        self.served_model = cfg.served_model
        self.fatal: str | None = None

    def emit(self, kind: str, **data: Any) -> None:
        with contextlib.suppress(Exception):  # a display error must not lose a run
            self.on_event(kind, data)

    def _start_server(self, lv: LevelPlan, level_id: int, attempt: int) -> str:
        from bstar.servers import ManagedServer, free_port

        cfg = self.cfg
        assert cfg.server_cmd is not None
        port = None
        if cfg.url:
            port = urllib.parse.urlsplit(cfg.url).port
        port = port or free_port()
        cmd = cfg.server_cmd.format(max_num_seqs=lv.max_num_seqs, port=port)
        log = (self.store.logs_dir / self.run_id /
               f"level{lv.idx}-mns{lv.max_num_seqs}-a{attempt}.log")
        self.store.set_level_log(level_id, str(log))
        url = f"http://127.0.0.1:{port}"
        self.emit("server_start", level=lv.idx, cmd=cmd, log=str(log))
        self.server = ManagedServer(shlex.split(cmd), health_url=url + "/health",
                                    timeout_s=cfg.health_timeout_s, log_path=log, url=url)
        self.server.start()
        self.emit("server_ready", level=lv.idx, start_s=self.server.start_time_s)
        return url

    def _stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def run(self, levels: list[LevelPlan]) -> None:
        done = {r.idx for r in self.store.levels(self.run_id) if r.status in DONE_STATUSES}
        for lv in levels:
            if lv.idx in done:
                continue
            if self.fatal:
                break
            level_id, attempt = self.store.start_level(
                self.run_id, lv.idx, concurrency=lv.concurrency, rate=lv.rate,
                max_num_seqs=lv.max_num_seqs)
            try:
                url = self.cfg.url or ""
                if self.cfg.server_cmd:
                    from bstar.servers import ServerStartError

                    try:
                        url = self._start_server(lv, level_id, attempt)
                    except ServerStartError as e:
                        first = str(e).splitlines()[0]
                        self.store.finish_level(level_id, status="server_failed",
                                                status_detail=first)
                        self.emit("level_end", level=lv.idx, status="server_failed",
                                  detail=first)
                        continue
                asyncio.run(self._level(lv, level_id, attempt, url))
            except BaseException as e:
                with contextlib.suppress(Exception):
                    status = ("interrupted" if isinstance(e, KeyboardInterrupt |
                                                          asyncio.CancelledError) else "failed")
                    self.store.finish_level(level_id, status=status,
                                            status_detail=f"{type(e).__name__}: {e}"[:300])
                raise
            finally:
                self._stop_server()

    async def _discover(self, client: OpenAIClient) -> str | None:
        """Model name and server version; None on success, else why the server is unusable."""
        status, body = await client.get_json("/v1/models")
        if status == 0:
            return f"server unreachable at {client.base_url}: {body}"
        if status in (401, 403):
            return f"HTTP {status} from /v1/models: check --api-key / OPENAI_API_KEY"
        if status == 200 and isinstance(body, dict):
            ids = [m.get("id") for m in body.get("data") or [] if isinstance(m, dict)]
            if self.served_model is None:
                if not ids:
                    return "/v1/models lists no model; give --served-model"
                self.served_model = ids[0]
                self.store.conn.execute("UPDATE runs SET served_model = ? WHERE id = ?",
                                        (self.served_model, self.run_id))
                self.store.conn.commit()
            elif ids and self.served_model not in ids:
                return (f"model {self.served_model!r} is not served here; /v1/models "
                        f"lists {ids}")
        elif self.served_model is None:
            return f"/v1/models answered HTTP {status}; give --served-model"
        run = self.store.get_run(self.run_id) or {}
        if not run.get("server_version"):
            version = None
            st, v = await client.get_json("/version")
            if st == 200 and isinstance(v, dict) and v.get("version"):
                version = f"vllm {v['version']}" if "vllm" not in str(v) else str(v["version"])
            else:
                st, p = await client.get_json("/props")
                if st == 200 and isinstance(p, dict) and p.get("build_info"):
                    version = f"llama.cpp {p['build_info']}"
            if version:
                self.store.update_run(self.run_id, server_version=version)
        return None

    async def _level(self, lv: LevelPlan, level_id: int, attempt: int, url: str) -> None:
        cfg = self.cfg
        wl = Workload(cfg.input_len, cfg.output_len, cfg.seed, cfg.endpoint,
                      cfg.prompts_file, cfg.ignore_eos)
        async with OpenAIClient(url, cfg.served_model or "", endpoint=wl.endpoint,  # type: ignore[arg-type]
                                api_key=self.api_key, request_timeout_s=cfg.request_timeout_s,
                                extra_body=wl.extra_body()) as client:
            problem = await self._discover(client)
            if problem:
                self.fatal = problem
                self.store.finish_level(level_id, status="server_failed", status_detail=problem)
                self.emit("level_end", level=lv.idx, status="server_failed", detail=problem)
                return
            client.model = self.served_model or ""
            counter = TokenCounter(client)
            await counter.setup(chat=wl.endpoint == "chat")
            streams = lv.concurrency or max(1, math.ceil(lv.rate or 1))
            n_warm = cfg.warmup_requests if cfg.warmup_requests is not None else streams
            # Seeds differ per level and attempt: no prompt repeats across levels, so a
            # prefix cache cannot serve a level from an earlier one.
            seed = cfg.seed * 1_000_003 + lv.idx * 1009 + attempt
            warm = await build_requests(client, wl, num=n_warm, first_index=-n_warm,
                                        seed=seed, counter=counter, warmup=True)
            reqs = await build_requests(client, wl, num=cfg.num_requests, first_index=0,
                                        seed=seed, counter=counter)
            self.emit("level_start", level=lv.idx, label=lv.label(), total=cfg.num_requests,
                      warmup=n_warm, token_count=counter.method)
            if warm:
                async for rec in drive(client, warm, concurrency=lv.concurrency or streams):
                    self.store.add_request(level_id, rec)
            scraper = Scraper(client, interval_s=cfg.scrape_interval_s,
                              tokens_per_seq=cfg.input_len + cfg.output_len)
            await scraper.start()
            stop = asyncio.Event()
            t0 = time.monotonic()
            cpu0 = time.process_time()
            deadline = t0 + cfg.level_time_limit_s
            recs: list[RequestRecord] = []
            status, detail = "completed", None
            async for rec in drive(client, reqs, concurrency=lv.concurrency, rate=lv.rate,
                                   deadline=deadline, stop=stop, seed=seed):
                self.store.add_request(level_id, rec)
                recs.append(rec)
                errors = sum(1 for r in recs if not r.ok)
                self.emit("request", level=lv.idx, ok=rec.ok, done=len(recs), errors=errors,
                          output_tokens=rec.output_tokens, elapsed_s=time.monotonic() - t0,
                          error_kind=rec.error_kind)
                if (not stop.is_set() and len(recs) >= cfg.min_requests_for_error_rule
                        and errors / len(recs) > cfg.max_error_rate):
                    stop.set()
                    status = "stopped_errors"
                    detail = (f"error rate {errors}/{len(recs)} over --max-error-rate "
                              f"{cfg.max_error_rate:g}: {_kinds(recs)}")
            duration = time.monotonic() - t0
            client_cpu_s = time.process_time() - cpu0
            server_stats = await scraper.stop()
        if status == "completed" and len(recs) < cfg.num_requests:
            status = "time_limit"
            detail = (f"level time limit {cfg.level_time_limit_s:g} s reached after "
                      f"{len(recs)} of {cfg.num_requests} requests")
        elif status == "completed" and any(r.error_kind == "time_limit" for r in recs):
            status = "time_limit"
            detail = f"level time limit {cfg.level_time_limit_s:g} s cut requests in flight"
        bad = [r for r in recs if not r.ok]
        if recs and bad and all(r.error_kind in _CONNECTION_KINDS for r in bad[-3:]):
            # The last failures were lost connections: is the server gone?
            proc = self.server.process if self.server is not None else None
            code = None
            if proc is not None:
                # The reset can reach us before the exit is reaped: wait a moment for it.
                with contextlib.suppress(Exception):
                    code = await asyncio.to_thread(proc.wait, 2.0)
            if code is not None:
                status, detail = "server_died", f"server exited (code {code}) mid-level"
            elif not await _reachable(url):
                status, detail = "server_died", f"server stopped answering at {url}"
                if proc is None:  # a server bstar started is restarted for the next level
                    self.fatal = detail
        if status == "completed" and bad:
            detail = f"{len(bad)} failed requests: {_kinds(recs)}"
        stats = summarize(recs, duration, cfg.slo).to_dict()
        # The client's own CPU while it measured (bench/client_bench.py says how much load
        # it sustains on how much CPU); a client near a full core distorts what it measures.
        stats["client_cpu_s"] = client_cpu_s
        # How prompt lengths were fitted: "tokenize", "usage" or "estimate" (see workload).
        stats["prompt_token_count_method"] = counter.method
        stats["client_cpu_pct"] = 100 * client_cpu_s / duration if duration > 0 else None
        predicted = None
        if self.deployment is not None:
            batch = lv.batch
            if batch is None and stats["e2e_ms"]["mean"]:
                # Open loop: Little's law gives the mean number in the system.
                batch = max(1, round(stats["request_rate_s"] * stats["e2e_ms"]["mean"] / 1e3))
            ctx = cfg.input_len + cfg.output_len // 2
            predicted = predict_level(self.deployment, batch, ctx) or None
        self.store.finish_level(level_id, status=status, status_detail=detail,
                                duration_s=duration, stats=stats,
                                server=server_stats.to_dict(), predicted=predicted)
        self.emit("level_end", level=lv.idx, status=status, detail=detail, stats=stats,
                  server=server_stats.to_dict())


def _kinds(recs: list[RequestRecord]) -> str:
    from collections import Counter

    c = Counter(r.error_kind for r in recs if not r.ok)
    return ", ".join(f"{k} x{n}" for k, n in c.most_common())


async def _reachable(url: str) -> bool:
    import aiohttp

    try:
        async with aiohttp.ClientSession(trust_env=False) as s, s.get(
                url.rstrip("/") + "/v1/models", timeout=aiohttp.ClientTimeout(total=5)) as r:
            return r.status < 500
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False


def run_sweep(cfg: SweepConfig | None = None, *, db: str | Path | None = None,
              api_key: str | None = None, resume: str | None = None,
              on_event: EventFn | None = None, deployment: Any = None,
              bstar_version: str | None = None) -> SweepResult:
    """Run (or resume) a sweep; every request is stored as it finishes.

    Raises SweepInterrupted on Ctrl-C (the run is marked interrupted and can be resumed).
    """
    from bstar import __version__

    store = Store(db)
    try:
        if resume:
            run = store.get_run(resume)
            if run is None:
                raise BstarError(f"no run {resume!r} in {store.path}")
            run_id = run["id"]
            cfg = SweepConfig.from_options(run["options"] or {})
            store.update_run(run_id, status="running", status_detail="resumed",
                             finished_at=None)
        else:
            if cfg is None:
                raise BstarError("run_sweep needs a SweepConfig or resume=RUN_ID")
            cfg.validate()
            run_id = store.create_run(
                url=cfg.url or "(started by bstar)", served_model=cfg.served_model,
                model=cfg.model, gpu=cfg.gpu, options=cfg.to_options(),
                bstar_version=bstar_version or __version__)
        levels = cfg.levels()
        runner = _Runner(cfg, store, run_id, api_key, on_event, deployment)
        runner.emit("run_start", run_id=run_id, db=str(store.path), levels=len(levels))
        try:
            runner.run(levels)
        except (KeyboardInterrupt, asyncio.CancelledError):
            store.update_run(run_id, status="interrupted", finished_at=utc_now(),
                             status_detail="interrupted (Ctrl-C); resume with --resume")
            raise SweepInterrupted(run_id, str(store.path)) from None
        except BaseException as e:
            store.update_run(run_id, status="failed", finished_at=utc_now(),
                             status_detail=f"{type(e).__name__}: {e}"[:500])
            raise
        rows = store.levels(run_id)
        statuses = {r.idx: r.status for r in rows}
        missing = [lv.idx for lv in levels if statuses.get(lv.idx) not in DONE_STATUSES]
        if runner.fatal:
            status, detail = "failed", runner.fatal
        elif rows and not any((r.stats or {}).get("completed") for r in rows):
            status = "failed"
            detail = "no request succeeded: " + "; ".join(
                f"{levels[r.idx].label()}: {r.status_detail or r.status}" for r in rows)
        elif missing:
            status = "incomplete"
            detail = "levels not completed: " + ", ".join(
                f"{levels[i].label()} ({statuses.get(i, 'not run')})" for i in missing)
        elif any(r.status != "completed" or (r.stats or {}).get("errors") for r in rows):
            status = "completed_with_errors"
            detail = "; ".join(f"{levels[r.idx].label()}: {r.status_detail or r.status}"
                               for r in rows if r.status != "completed"
                               or (r.stats or {}).get("errors"))
        else:
            status, detail = "completed", None
        store.update_run(run_id, status=status, status_detail=detail, finished_at=utc_now())
        if runner.served_model and not cfg.served_model:
            store.conn.execute("UPDATE runs SET served_model = ? WHERE id = ?",
                               (runner.served_model, run_id))
            store.conn.commit()
        result = load_result(store, run_id)
        store.update_run(run_id, result={"knee": result.knee,
                                         "recommendation": result.recommendation})
        result.run = store.get_run(run_id) or result.run
        return result
    finally:
        store.close()
