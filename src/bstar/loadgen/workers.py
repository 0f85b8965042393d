"""Load from many event loops: a level's streams split over N worker processes on this
machine (`bstar sweep --workers N`) or over N Ray actors (`--ray [ADDRESS]`), their records
merged into the one store by the sweep's process.

One Python event loop follows about 256 streams before its own queueing shows in the tails
it measures (docs/sweep.md, "Client overhead"); past that, each worker runs `drive` on its
own loop over its share of the streams and requests. The split is exact and seeded:

- closed loop: stream s belongs to worker s mod N, request i to the stream i mod C, so each
  worker owns its streams and every request is sent exactly once;
- open loop: request i goes to worker i mod N, which draws Poisson arrivals at R / N with
  its own seed (the sum of N independent Poisson processes at R / N is one at R).

Exact level boundaries: every worker warms up first (its own connections), then all wait
for one start instant on CLOCK_MONOTONIC (system-wide on Linux: `time.monotonic` and
`time.perf_counter`, the client's clocks, both read it), so the measured phase starts
together, and each ends when its last request does. The level's duration is the longest
worker's (each measured from the common start on the same clock), its percentiles are
computed by the sweep over all workers' records. A Ray actor on another machine converts
the start instant through the wall clock (NTP-synchronised hosts: off by their skew).

Each worker sends its records back in small batches while the level runs (stored as they
come); a stop (the error-rate rule) ends the workers' new requests, and an abort (Ctrl-C)
cancels requests in flight and returns every record already finished. A worker process
exits with the sweep's process (it watches its parent) and ignores SIGINT.

The API key travels to the workers in the job (process pipe or Ray's object store), is
held in their client's header only, and is never logged or stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from bstar.errors import BstarError
from bstar.loadgen.client import OpenAIClient, RequestRecord, RequestSpec
from bstar.redact import clip

POLL_S = 0.05  # how often the sweep collects records from its workers
START_MARGIN_S = 0.2  # the common start instant, this far after every worker is warm
ABORT_WAIT_S = 10.0  # how long an abort waits for workers to return their last records


def _boot_id() -> str:
    """The kernel's boot id: two processes with the same one share CLOCK_MONOTONIC."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class StartAt:
    """One instant for every worker: on CLOCK_MONOTONIC where they share the kernel,
    else through the wall clock."""

    mono_s: float
    wall_s: float
    boot_id: str

    @classmethod
    def after(cls, delay_s: float) -> StartAt:
        return cls(time.monotonic() + delay_s, time.time() + delay_s, _boot_id())

    def local_mono_s(self) -> float:
        if self.boot_id and self.boot_id == _boot_id():
            return self.mono_s
        return time.monotonic() + (self.wall_s - time.time())


@dataclass
class WorkerJob:
    """One worker's share of a level (picklable: it crosses a pipe or Ray)."""

    url: str
    model: str
    endpoint: str
    api_key: str | None
    request_timeout_s: float
    extra_body: dict[str, Any]
    warm: list[RequestSpec]
    specs: list[RequestSpec]
    concurrency: int | None
    rate: float | None
    seed: int
    level_time_limit_s: float

    def __repr__(self) -> str:  # never shows the key
        return (f"WorkerJob({self.url!r}, streams={self.concurrency}, rate={self.rate}, "
                f"requests={len(self.specs)})")


@dataclass
class WorkerDone:
    """How a worker's measured phase ended."""

    duration_s: float  # from the common start to its last record
    cpu_s: float  # the worker process's CPU over the measured phase
    error: str | None = None  # what went wrong inside the worker, if anything


def split_level(specs: list[RequestSpec], warm: list[RequestSpec], *, workers: int,
                concurrency: int | None, rate: float | None, seed: int,
                base: WorkerJob) -> list[WorkerJob]:
    """The workers' shares (module docstring); workers left without streams get none."""
    jobs: list[WorkerJob] = []
    if rate is not None:
        cap = concurrency
        for k in range(workers):
            mine = specs[k::workers]
            if not mine:
                continue
            share = None if cap is None else max(1, cap // workers + (k < cap % workers))
            jobs.append(replace(base, warm=warm[k::workers], specs=mine, concurrency=share,
                                rate=rate / workers, seed=seed * 1_000_003 + k))
        return jobs
    assert concurrency is not None
    streams = concurrency
    for k in range(min(workers, streams)):
        mine_streams = len(range(k, streams, workers))
        # request i runs on stream i mod C; stream s on worker s mod N
        mine = [sp for i, sp in enumerate(specs) if (i % streams) % workers == k]
        w = [sp for i, sp in enumerate(warm) if (i % streams) % workers == k]
        jobs.append(replace(base, warm=w, specs=mine, concurrency=mine_streams, rate=None,
                            seed=seed))
    return jobs


# ---- the worker: the same object in a process or as a Ray actor ------------------------------


class LoadWorker:
    """Runs its share of each level: `warm(job)` (returns the warm-up records), `go(start)`
    (the measured phase, in the background), `drain()` (the records finished since the
    last call, and WorkerDone once the phase ended), `stop(cancel)`.

    Its methods are async and run on the worker's one event loop (a Ray async actor's, or
    the worker process's)."""

    def __init__(self) -> None:
        self._job: WorkerJob | None = None
        self._client: OpenAIClient | None = None
        self._client_key: tuple[Any, ...] | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._out: list[RequestRecord] = []
        self._done: WorkerDone | None = None

    async def _client_for(self, job: WorkerJob) -> OpenAIClient:
        key = (job.url, job.model, job.endpoint, job.request_timeout_s,
               tuple(sorted(job.extra_body.items())))
        if self._client is not None and key == self._client_key:
            return self._client
        await self.close()
        client = OpenAIClient(job.url, job.model, endpoint=job.endpoint,  # type: ignore[arg-type]
                              api_key=job.api_key, request_timeout_s=job.request_timeout_s,
                              extra_body=job.extra_body)
        await client.__aenter__()
        self._client, self._client_key = client, key
        return client

    async def warm(self, job: WorkerJob) -> list[RequestRecord]:
        from bstar.loadgen.worker import drive

        self._job = job
        self._out, self._done = [], None
        client = await self._client_for(job)
        out: list[RequestRecord] = []
        if job.warm:
            streams = job.concurrency or max(1, len(job.warm))
            async for rec in drive(client, job.warm, concurrency=streams):
                out.append(rec)
        return out

    async def go(self, start: StartAt) -> None:
        assert self._job is not None, "warm(job) first"
        self._stop = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._measure(self._job, start))

    async def _measure(self, job: WorkerJob, start: StartAt) -> None:
        from bstar.loadgen.worker import drive, steady_gc

        assert self._client is not None and self._stop is not None
        t0 = start.local_mono_s()
        error = None
        with steady_gc():  # before the common start: its one collection is not measured
            delay = t0 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            cpu0 = time.process_time()
            try:
                async for rec in drive(self._client, job.specs, concurrency=job.concurrency,
                                       rate=job.rate, deadline=t0 + job.level_time_limit_s,
                                       stop=self._stop, seed=job.seed):
                    self._out.append(rec)
            except asyncio.CancelledError:
                error = "aborted"
            except Exception as e:  # a worker's failure is reported, never silent
                error = clip(f"{type(e).__name__}: {e}", 300)
        self._done = WorkerDone(duration_s=time.monotonic() - t0,
                                cpu_s=time.process_time() - cpu0, error=error)

    async def drain(self) -> tuple[list[RequestRecord], WorkerDone | None]:
        out, self._out = self._out, []
        done = self._done
        if done is not None:
            self._done = None
        return out, done

    async def stop(self, cancel: bool = False) -> None:
        if self._stop is not None:
            self._stop.set()
        if cancel and self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.__aexit__(None, None, None)
            self._client = None


# ---- worker processes -------------------------------------------------------------------------


def _process_main(conn: Any, parent_pid: int) -> None:
    """A worker process: one event loop, commands from the sweep over `conn`."""
    from bstar.loadgen.worker import run_loop

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the sweep's to handle
    run_loop(_serve(conn, parent_pid))


async def _serve(conn: Any, parent_pid: int) -> None:
    loop = asyncio.get_running_loop()
    worker = LoadWorker()
    try:
        while True:
            # A thread waits on the pipe (a second's wait at a time, releasing the GIL):
            # the loop's own fd watching of a pipe does not survive uvloop here.
            if not await loop.run_in_executor(None, conn.poll, 1.0):
                if os.getppid() != parent_pid:
                    return  # the sweep is gone: so is its load
                continue
            try:
                method, args = conn.recv()
            except (EOFError, OSError):
                return
            if method == "exit":
                return
            try:
                reply: Any = ("ok", await getattr(worker, method)(*args))
            except Exception as e:
                reply = ("error", clip(f"{type(e).__name__}: {e}", 300))
            conn.send(reply)
    finally:
        await worker.close()


class _ProcessHandle:
    """The sweep's end of one worker process."""

    def __init__(self, ctx: Any) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_process_main, args=(child, os.getpid()), daemon=True,
                                name="bstar-load-worker")
        self.proc.start()
        child.close()
        self._owed = 0  # replies sent for calls that were cancelled before reading them

    async def call(self, method: str, *args: Any) -> Any:
        """One call at a time (LoadPool never overlaps two on one worker; each level may
        run on a fresh event loop, so the handle holds no loop-bound lock)."""
        while self._owed:  # a cancelled call's reply: not this call's
            await self._reply()
            self._owed -= 1
        self.conn.send((method, args))
        self._owed += 1
        status, value = await self._reply()
        self._owed -= 1
        if status != "ok":
            raise BstarError(f"load worker: {value}")
        return value

    async def _reply(self) -> Any:
        # Polled, not a thread blocked in recv: a cancelled call leaves nothing reading
        # the pipe behind it, so the next call reads its own reply.
        wait_s = 0.001
        while not self.conn.poll():
            if not self.proc.is_alive():
                raise BstarError(f"load worker exited (code {self.proc.exitcode})")
            await asyncio.sleep(wait_s)
            wait_s = min(0.02, wait_s * 2)
        return self.conn.recv()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.send(("exit", ()))
        self.proc.join(2.0)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(2.0)
        self.conn.close()


class _RayHandle:
    def __init__(self, ray: Any, actor: Any, pool: LoadPool) -> None:
        self.ray = ray
        self.actor = actor
        self.pool = pool

    async def call(self, method: str, *args: Any) -> Any:
        """Ray's own failures (an actor lost, a dead raylet) end the sweep with one line, as
        in `search --ray`; an error the worker's method raised is raised as it is."""
        try:
            return await getattr(self.actor, method).remote(*args)
        except self.ray.exceptions.RayError as e:
            if isinstance(e, self.ray.exceptions.RayTaskError):
                raise
            said = f"; Ray said: {self.pool.raylet_report}" if self.pool.raylet_report else ""
            raise BstarError(f"load worker lost on Ray ({type(e).__name__}: "
                             f"{(str(e).strip().splitlines() or [''])[0][:200]}){said}") from None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ray.kill(self.actor)


# ---- the pool the sweep drives ------------------------------------------------------------


@dataclass
class LevelOutcome:
    duration_s: float = 0.0
    cpu_s: float = 0.0
    errors: list[str] = field(default_factory=list)


class LoadPool:
    """N workers kept for a whole sweep: `ray` None gives local processes, "local" a Ray
    cluster started on this machine, anything else a Ray address to join."""

    def __init__(self, workers: int, ray: str | None = None) -> None:
        if workers < 1:
            raise BstarError(f"--workers must be at least 1, got {workers}")
        self.workers = workers
        self.ray_address = ray
        self._handles: list[Any] = []
        self._ray: Any = None
        self._started_ray = False
        self.raylet_report = ""  # the cluster's last report about itself
        self._unhold: Any = None
        self._stop_requested = False
        self._level: list[Any] = []
        self.outcome = LevelOutcome()
        self.started_at: StartAt | None = None  # the common start of the level measuring

    def describe(self) -> str:
        if self.ray_address is None:
            return f"{self.workers} worker processes"
        where = "a local Ray cluster" if self.ray_address == "local" else self.ray_address
        return f"{self.workers} Ray actors ({where})"

    def start(self) -> None:
        if self.ray_address is None:
            import multiprocessing as mp

            # spawn: the sweep's process holds threads (progress display) and a DB handle.
            ctx = mp.get_context("spawn")
            self._handles = [_ProcessHandle(ctx) for _ in range(self.workers)]
            return
        try:
            import ray
        except ImportError:
            raise BstarError("--ray needs Ray: pip install 'bstar[ray]'") from None
        from bstar.search.backends import hold_raylet_reports, init_ray

        self._ray = ray
        if not ray.is_initialized():
            init_ray(ray, None if self.ray_address == "local" else self.ray_address,
                     max(self.workers, os.cpu_count() or 1))
            self._started_ray = True
        self._unhold = hold_raylet_reports(lambda line: setattr(self, "raylet_report", line))
        actor_cls = ray.remote(num_cpus=1, max_concurrency=1000)(LoadWorker)
        self._handles = [
            _RayHandle(ray, actor_cls.options(scheduling_strategy="SPREAD").remote(), self)
            for _ in range(self.workers)]

    def close(self) -> None:
        for h in self._handles:
            h.close()
        self._handles = []
        if self._started_ray and self._ray is not None:
            with contextlib.suppress(Exception):
                self._ray.shutdown()
        self._ray = None
        unhold, self._unhold = self._unhold, None
        if unhold is not None:
            unhold()

    def __enter__(self) -> LoadPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request_stop(self) -> None:
        """No new requests (the error-rate rule); requests in flight finish."""
        self._stop_requested = True

    async def warm(self, jobs: list[WorkerJob]) -> list[RequestRecord]:
        """Give each worker its share of the level and let it warm up (its own
        connections); returns the warm-up records."""
        self._stop_requested = False
        self.outcome = LevelOutcome()
        self.started_at = None
        self._level = self._handles[:len(jobs)]
        warm = await asyncio.gather(*(h.call("warm", j) for h, j in zip(self._level, jobs,
                                                                         strict=True)))
        return [rec for recs in warm for rec in recs]

    async def measure(self) -> AsyncIterator[list[RequestRecord]]:
        """Start every warmed worker at one instant, then yield the measured records in
        the batches the workers return them (each a few tens of milliseconds' worth, to
        store in one transaction); `outcome` then holds the level's duration and the
        workers' CPU. Cancelled (Ctrl-C), it cancels the workers' requests in flight and
        still yields every record they had finished, then re-raises."""
        handles = self._level
        start = self.started_at = StartAt.after(START_MARGIN_S)
        await asyncio.gather(*(h.call("go", start) for h in handles))
        pending = list(handles)
        stopped = False
        try:
            while pending:
                if self._stop_requested and not stopped:
                    stopped = True
                    await asyncio.gather(*(h.call("stop", False) for h in pending))
                results = await asyncio.gather(*(h.call("drain") for h in pending))
                batches, pending = self._collect(pending, results)
                for recs in batches:
                    yield recs
                if pending:
                    await asyncio.sleep(POLL_S)
        except (asyncio.CancelledError, KeyboardInterrupt):
            # Ctrl-C: cancel the requests in flight, keep every record already finished.
            async for recs in self._abort(pending):
                yield recs
            raise

    def _collect(self, pending: list[Any], results: list[Any]
                 ) -> tuple[list[list[RequestRecord]], list[Any]]:
        """One drain of every pending worker: the record batches it returned, and the
        workers still running (a finished one's outcome is added to the level's)."""
        batches, still = [], []
        for h, (recs, done) in zip(pending, results, strict=True):
            if recs:
                batches.append(recs)
            if done is None:
                still.append(h)
            else:
                self._finished(done)
        return batches, still

    def _finished(self, done: WorkerDone) -> None:
        o = self.outcome
        o.duration_s = max(o.duration_s, done.duration_s)
        o.cpu_s += done.cpu_s
        if done.error and done.error != "aborted":
            o.errors.append(done.error)

    async def _abort(self, pending: list[Any]) -> AsyncIterator[list[RequestRecord]]:
        deadline = time.monotonic() + ABORT_WAIT_S
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*(h.call("stop", True) for h in pending)),
                                   ABORT_WAIT_S)
        while pending and time.monotonic() < deadline:
            try:
                results = await asyncio.wait_for(
                    asyncio.gather(*(h.call("drain") for h in pending)),
                    max(0.1, deadline - time.monotonic()))
            except Exception:
                return
            batches, pending = self._collect(pending, results)
            for recs in batches:
                yield recs
