"""Level execution of a sweep (`bstar.loadgen.sweep.run_sweep` drives it): per level,
start the server when the sweep restarts it, measure (`_Runner._measure`), classify what
was measured (`_Runner._classify`) and store it (`_Runner._finish`); plus the cost model's
prediction for a level (`predict_level`)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import shlex
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from bstar.loadgen.client import OpenAIClient, RequestRecord, RequestSpec
from bstar.loadgen.config import LevelPlan, SweepConfig
from bstar.loadgen.metrics import summarize
from bstar.loadgen.scrape import Scraper
from bstar.loadgen.store import Store
from bstar.loadgen.worker import drive, run_loop, steady_gc
from bstar.loadgen.workers import LoadPool, WorkerJob, split_level
from bstar.loadgen.workload import PromptSpec, TokenCounter, build_requests
from bstar.redact import clip, redact_obj

# Level statuses that count as done: resume skips them. A level stopped by the error-rate
# rule or its time limit still measured what it measured; re-running would not change why.
DONE_STATUSES = ("completed", "stopped_errors", "time_limit")
_CONNECTION_KINDS = ("connect", "reset")

EventFn = Callable[[str, dict[str, Any]], None]


# ---- cost model -----------------------------------------------------------------------------


def predict_level(deployment: Any, batch: int | None, context_tokens: int,
                  input_len: int = 0, output_len: int = 0) -> dict[str, Any]:
    """The cost model at this level's batch, each figure the quantity the level measures:
    `tpot_ms` the decode step (a request's TPOT); `throughput_tok_s` the output tokens per
    second a loop of B streams measures, prefill included, B x O / (prefill(B x I) + O x
    step) as `bstar validate` predicts it (with the lengths; B / step without them, and
    `throughput_basis` says which); `decode_throughput_tok_s` = B / step. {} when no batch."""
    from bstar import roofline as rl

    if not batch:
        return {}
    c = rl.curve(deployment, [batch], context_tokens)
    decode_tput = float(c.throughput_tok_s[0])
    tput, basis = decode_tput, "decode_only"
    if input_len > 0 and output_len > 0:
        tput = rl.batch_output_tok_s(deployment, batch, input_len, output_len, context_tokens)
        basis = "incl_prefill"
    return {
        "batch": batch,
        "context_tokens": context_tokens,
        "tpot_ms": float(c.tpot_s[0]) * 1e3,
        "throughput_tok_s": tput,
        "throughput_basis": basis,
        "decode_throughput_tok_s": decode_tput,
        "regime": c.regime[0],
        "b_mem": int(rl.b_mem(deployment, context_tokens)),
        "b_star": float(rl.b_star(deployment, context_tokens)),
    }


# ---- running --------------------------------------------------------------------------------


class _Runner:
    """Runs the levels of one sweep: starts the server per level when asked, measures each
    level (`_measure`), says what its numbers mean (`_classify`) and stores it (`_finish`).
    `session_factory` gives the HTTP session each client uses (None: a real aiohttp one;
    tests pass an in-process fake)."""

    def __init__(self, cfg: SweepConfig, store: Store, run_id: str, api_key: str | None,
                 on_event: EventFn | None, deployment: Any,
                 session_factory: Callable[[], Any] | None = None,
                 pool: LoadPool | None = None) -> None:
        self.cfg = cfg
        # Worker processes or Ray actors that send a level's load (--workers / --ray);
        # None: this process's event loop sends it.
        self.pool = pool
        # The level being measured and what it has so far (an interrupted level is stored
        # with the statistics of what it measured).
        self._live: tuple[int, _Measured] | None = None
        self.session_factory = session_factory
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
            if kind != "request":  # a request's event holds numbers and an error kind only
                # Printed as it is (the progress display): a detail may quote the URL with
                # its credentials or a server's text with a key.
                data = redact_obj(data)
            self.on_event(kind, data)

    def say_power_source(self) -> None:
        """Whether GPU power is sampled (NVML, AMD SMI) or why not: said once per sweep;
        each level then samples it, or not, quietly (bstar.loadgen.gpu_telemetry)."""
        from bstar.loadgen.gpu_telemetry import power_source

        source, line = power_source()
        self.emit("power_source", source=source, detail=line)

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
                run_loop(self._level(lv, level_id, attempt, url))
            except BaseException as e:
                with contextlib.suppress(Exception):
                    status = ("interrupted" if isinstance(e, KeyboardInterrupt |
                                                          asyncio.CancelledError) else "failed")
                    # What the level measured before it stopped is stored with it: its
                    # requests are in the store, and its row says how many.
                    duration_s, stats = self._partial(level_id)
                    self.store.finish_level(level_id, status=status,
                                            status_detail=clip(f"{type(e).__name__}: {e}", 300),
                                            duration_s=duration_s, stats=stats)
                raise
            finally:
                self._stop_server()

    def _partial(self, level_id: int) -> tuple[float | None, dict[str, Any] | None]:
        """(duration, statistics) of the measured requests a level stored before it was
        interrupted or failed; (None, None) when it stored none."""
        recs: list[RequestRecord]
        if self._live is not None and self._live[0] == level_id:
            m = self._live[1]
            recs = list(m.recs)
            t0 = m.t0
            if self.pool is not None and self.pool.started_at is not None:
                t0 = self.pool.started_at.mono_s  # the workers' common start
            duration = time.monotonic() - t0 if t0 is not None else None
        else:
            recs = [r for r in self.store.requests(level_id) if not r.warmup]
            duration = None
        if not recs:
            return duration, None
        if duration is None:  # the span of the requests themselves (wall clock)
            duration = (max(r.start_s + (r.e2e_s or 0.0) for r in recs)
                        - min(r.start_s for r in recs))
        stats = summarize(recs, duration, self.cfg.slo).to_dict() if duration > 0 else None
        return duration, stats

    async def _discover(self, client: OpenAIClient) -> str | None:
        """Model name and server version; None on success, else why the server is unusable."""
        # --request-timeout bounds this call too (a server that accepts and never answers).
        status, body = await client.get_json(
            "/v1/models", timeout_s=min(10.0, self.cfg.request_timeout_s))
        if status == 0:
            if isinstance(body, str) and body.startswith("no answer"):
                return f"server not answering at {client.base_url}: {body}"
            return f"server unreachable at {client.base_url}: {body}"
        if status in (401, 403):
            return f"HTTP {status} from /v1/models: check --api-key / OPENAI_API_KEY"
        if status == 200 and isinstance(body, dict):
            data = body.get("data")
            # Model ids are the server's text: only strings count (an object or a number
            # where an id goes is skipped, not sent back as the model).
            ids = [m["id"] for m in (data if isinstance(data, list) else [])
                   if isinstance(m, dict) and isinstance(m.get("id"), str)]
            if self.served_model is None:
                if not ids:
                    return "/v1/models lists no model; give --served-model"
                self.served_model = ids[0]
                self.store.update_run(self.run_id, served_model=self.served_model)
            elif ids and self.served_model not in ids:
                return (f"model {self.served_model!r} is not served here; /v1/models "
                        f"lists {ids}")
        elif self.served_model is None:
            return (f"{client.base_url}/v1/models answered HTTP {status}; give "
                    f"--served-model")
        run = self.store.get_run(self.run_id) or {}
        if not run.get("server_version"):
            version = None
            st, v = await client.get_json("/version")
            if st == 200 and isinstance(v, dict) and v.get("version"):
                version = clip(f"vllm {v['version']}" if "vllm" not in str(v)
                               else str(v["version"]), 200)
            else:
                st, p = await client.get_json("/props")
                if st == 200 and isinstance(p, dict) and p.get("build_info"):
                    version = clip(f"llama.cpp {p['build_info']}", 200)
            if version:
                self.store.update_run(self.run_id, server_version=version)
        return None

    def _client(self, url: str, wl: PromptSpec | None = None) -> OpenAIClient:
        cfg = self.cfg
        return OpenAIClient(url, self.served_model or "",
                            endpoint=wl.endpoint if wl else "completions",  # type: ignore[arg-type]
                            api_key=self.api_key, request_timeout_s=cfg.request_timeout_s,
                            extra_body=wl.extra_body() if wl else None,
                            session=self.session_factory() if self.session_factory else None)

    async def _level(self, lv: LevelPlan, level_id: int, attempt: int, url: str) -> None:
        m = await self._measure(lv, level_id, attempt, url)
        if m is None:
            return
        status, detail = await self._classify(m, url)
        self._finish(lv, level_id, m, status, detail)

    async def _measure(self, lv: LevelPlan, level_id: int, attempt: int,
                       url: str) -> _Measured | None:
        """Discover the server, warm up, then load it at the level's concurrency or rate
        until the requests, the time limit or the error-rate rule end it; every request is
        stored as it finishes. None when the server is unusable (the level is stored as
        server_failed)."""
        cfg = self.cfg
        wl = PromptSpec(cfg.input_len, cfg.output_len, cfg.seed or 0, cfg.endpoint,
                      cfg.prompts_file, cfg.ignore_eos)
        async with self._client(url, wl) as client:
            problem = await self._discover(client)
            if problem:
                self.fatal = problem
                self.store.finish_level(level_id, status="server_failed", status_detail=problem)
                self.emit("level_end", level=lv.idx, status="server_failed", detail=problem)
                return None
            client.model = self.served_model or ""
            counter, seed, reqs = await self._warm_up(client, wl, lv, level_id, attempt, url)
            scraper = Scraper(client, interval_s=cfg.scrape_interval_s,
                              tokens_per_seq=cfg.input_len + cfg.output_len)
            await scraper.start()
            m = _Measured(counter_method=counter.method, prompt_seed=seed,
                          prompts_sha256=_digest(reqs),
                          url_tried=f"{client.base_url}{client.path}")
            self._live = (level_id, m)
            # Collect and freeze before the clock starts (worker.steady_gc): the level's
            # collections then scan only what it allocates.
            with steady_gc():
                stop = asyncio.Event()
                t0 = time.monotonic()
                m.t0 = t0
                cpu0 = time.process_time()
                batches: AsyncIterator[list[RequestRecord]]
                if self.pool is not None:
                    batches = self.pool.measure()  # as the workers return them
                else:
                    batches = _one_by_one(drive(client, reqs, concurrency=lv.concurrency,
                                                rate=lv.rate, deadline=t0 + cfg.level_time_limit_s,
                                                stop=stop, seed=seed))
                errors = 0
                async for batch in batches:
                    for rec in batch:  # stored as they come, one transaction per batch
                        self.store.add_request(level_id, rec, commit=False)
                        m.recs.append(rec)
                        errors += not rec.ok
                    self.store.commit()
                    for rec in batch:
                        self.emit("request", level=lv.idx, ok=rec.ok, done=len(m.recs),
                                  errors=errors, output_tokens=rec.output_tokens,
                                  elapsed_s=time.monotonic() - t0, error_kind=rec.error_kind)
                    if (not stop.is_set() and len(m.recs) >= cfg.min_requests_for_error_rule
                            and errors / len(m.recs) > cfg.max_error_rate):
                        stop.set()
                        if self.pool is not None:
                            self.pool.request_stop()
                        m.stopped = (f"error rate {errors}/{len(m.recs)} over --max-error-rate "
                                     f"{cfg.max_error_rate:g}: {_kinds(m.recs)}")
                m.client_cpu_s = time.process_time() - cpu0
            if self.pool is not None:
                # The level ran from the workers' common start to the last one's end, each
                # timed on the same monotonic clock; their CPU adds to this process's.
                m.duration_s = self.pool.outcome.duration_s
                m.client_cpu_s += self.pool.outcome.cpu_s
                m.worker_errors = self.pool.outcome.errors
            else:
                m.duration_s = time.monotonic() - t0
            m.server = (await scraper.stop()).to_dict()
            self._live = None
        return m

    async def _warm_up(self, client: OpenAIClient, wl: PromptSpec, lv: LevelPlan, level_id: int,
                       attempt: int, url: str) -> tuple[TokenCounter, int, list[RequestSpec]]:
        """Build the level's prompts (warm-up and measured, stored), then run the warm-up
        requests (here or in the load workers). Returns the token counter, the level's
        prompt seed and the measured requests."""
        cfg = self.cfg
        counter = TokenCounter(client)
        await counter.setup(chat=wl.endpoint == "chat")
        streams = lv.concurrency or max(1, math.ceil(lv.rate or 1))
        n_warm = cfg.warmup_requests if cfg.warmup_requests is not None else streams
        # Seeds differ per level and attempt: no prompt repeats across levels, so a
        # prefix cache cannot serve a level from an earlier one.
        seed = (cfg.seed or 0) * 1_000_003 + lv.idx * 1009 + attempt
        warm = await build_requests(client, wl, num=n_warm, first_index=-n_warm,
                                    seed=seed, counter=counter, warmup=True)
        reqs = await build_requests(client, wl, num=cfg.num_requests, first_index=0,
                                    seed=seed, counter=counter)
        self.store.add_prompts(level_id, warm + reqs)
        self.emit("level_start", level=lv.idx, label=lv.label(), total=cfg.num_requests,
                  warmup=n_warm, token_count=counter.method)
        if self.pool is not None:
            jobs = split_level(
                reqs, warm, workers=self.pool.workers, concurrency=lv.concurrency,
                rate=lv.rate, seed=seed,
                base=WorkerJob(url=url, model=client.model, endpoint=wl.endpoint,
                               api_key=self.api_key,
                               request_timeout_s=cfg.request_timeout_s,
                               extra_body=wl.extra_body(), warm=[], specs=[],
                               concurrency=None, rate=None, seed=seed,
                               level_time_limit_s=cfg.level_time_limit_s))
            for rec in await self.pool.warm(jobs):
                self.store.add_request(level_id, rec)
        elif warm:
            async for rec in drive(client, warm, concurrency=lv.concurrency or streams):
                self.store.add_request(level_id, rec)
        return counter, seed, reqs

    async def _classify(self, m: _Measured, url: str) -> tuple[str, str | None]:
        """The level's status and why: completed, stopped_errors, time_limit or
        server_died (a server bstar did not start is then given up on: `fatal`)."""
        cfg, recs = self.cfg, m.recs
        status, detail = ("stopped_errors", m.stopped) if m.stopped else ("completed", None)
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
            elif not await self._reachable(url):
                status, detail = "server_died", f"server stopped answering at {url}"
                if proc is None:  # a server bstar started is restarted for the next level
                    self.fatal = detail
        if status in ("completed", "time_limit") and recs and len(bad) == len(recs):
            # Nothing succeeded: the level measured no throughput; resume retries it.
            status, detail = "failed", f"every request failed: {_kinds(recs)}"
        if m.worker_errors:
            status = "failed"
            detail = "; ".join(filter(None, [detail, *(f"load worker: {e}"
                                                      for e in m.worker_errors)]))
        if status == "completed" and bad:
            detail = f"{len(bad)} failed requests: {_kinds(recs)}"
        if recs and len(bad) == len(recs) and all(r.http_status == 404 for r in recs):
            # Every request got the same 404: the URL is wrong, not the load. Say which.
            detail = (f"{detail or _kinds(recs)}; every request answered HTTP 404 from "
                      f"{m.url_tried}: check --url (the server's root or its /v1 base) "
                      f"and --served-model")
        return status, detail

    async def _reachable(self, url: str) -> bool:
        async with self._client(url) as c:
            status, _ = await c.get_json("/v1/models", timeout_s=5.0)
        return 0 < status < 500

    def _finish(self, lv: LevelPlan, level_id: int, m: _Measured, status: str,
                detail: str | None) -> None:
        """Statistics, the cost model's prediction at the level's batch, into the store."""
        cfg = self.cfg
        stats = summarize(m.recs, m.duration_s, cfg.slo).to_dict()
        # The client's own CPU while it measured (bench/client_bench.py says how much load
        # it sustains on how much CPU); a client near a full core distorts what it measures.
        stats["client_cpu_s"] = m.client_cpu_s
        # How prompt lengths were fitted: "tokenize", "usage" or "estimate" (see workload).
        stats["prompt_token_count_method"] = m.counter_method
        stats["client_cpu_pct"] = (100 * m.client_cpu_s / m.duration_s if m.duration_s > 0
                                   else None)
        # What was sent: the level's prompt seed and a digest of its measured prompts (the
        # prompts themselves are in the store's `prompts` table).
        stats["prompt_seed"] = m.prompt_seed
        stats["prompts_sha256"] = m.prompts_sha256
        cached = [r.cached_prompt_tokens for r in m.recs if r.cached_prompt_tokens is not None]
        stats["cached_prompt_tokens"] = sum(cached) if cached else None
        predicted = None
        if self.deployment is not None:
            batch = lv.batch
            if batch is None and stats["e2e_ms"]["mean"]:
                # Open loop: Little's law gives the mean number in the system.
                batch = max(1, round(stats["request_rate_req_s"] * stats["e2e_ms"]["mean"]
                                     / 1e3))
            ctx = cfg.input_len + cfg.output_len // 2
            predicted = predict_level(self.deployment, batch, ctx, cfg.input_len,
                                      cfg.output_len) or None
        self.store.finish_level(level_id, status=status, status_detail=detail,
                                duration_s=m.duration_s, stats=stats, server=m.server,
                                predicted=predicted)
        self.emit("level_end", level=lv.idx, status=status, detail=detail, stats=stats,
                  server=m.server)


@dataclass
class _Measured:
    """What one level measured, before anyone says what it means."""

    counter_method: str
    prompt_seed: int = 0
    prompts_sha256: str = ""
    url_tried: str = ""
    recs: list[RequestRecord] = field(default_factory=list)
    stopped: str | None = None  # why the error-rate rule stopped the level
    t0: float | None = None  # time.monotonic() at the start of the measured phase
    duration_s: float = 0.0
    worker_errors: list[str] = field(default_factory=list)  # failures inside load workers
    client_cpu_s: float = 0.0
    server: dict[str, Any] = field(default_factory=dict)


async def _one_by_one(records: AsyncIterator[RequestRecord]
                      ) -> AsyncIterator[list[RequestRecord]]:
    async for rec in records:
        yield [rec]


def _digest(specs: list[Any]) -> str:
    import hashlib
    import json

    h = hashlib.sha256()
    for sp in specs:
        h.update(json.dumps([sp.index, sp.prompt, sp.messages]).encode())
    return h.hexdigest()


def _kinds(recs: list[RequestRecord]) -> str:
    from collections import Counter

    c = Counter(r.error_kind for r in recs if not r.ok)
    return ", ".join(f"{k} x{n}" for k, n in c.most_common())
