"""The unit of load: drive N streams (closed loop) or Poisson arrivals (open loop) from a
request source and yield each record as it finishes.

A worker holds no global state: everything it needs comes in as arguments and everything
it learns goes out as records, so the same worker can later run in other processes or on
other machines (Ray) when one client cannot drive a fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from typing import Any, Protocol, TypeVar

from bstar.loadgen.client import RequestRecord, RequestSpec

T = TypeVar("T")


def event_loop_name() -> str:
    """The event loop the load runs on: "uvloop" when it is installed (`pip install
    'bstar[uvloop]'`: the bench measured the client's CPU per token 9-30% lower on it) and
    not turned off with BSTAR_EVENT_LOOP=asyncio, else "asyncio"."""
    if os.environ.get("BSTAR_EVENT_LOOP", "").lower() == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


_INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _built_whole(factory: Callable[[], asyncio.AbstractEventLoop]
                 ) -> Callable[[], asyncio.AbstractEventLoop]:
    """`factory` with Ctrl-C, SIGTERM and SIGHUP held back while it runs: their Python
    handlers only note them, and run once the loop is whole. A signal whose handler raises
    (KeyboardInterrupt, the sweep's Terminated) inside the loop's constructor left a
    half-built loop whose `__del__` printed a traceback ("'_UnixSelectorEventLoop' object has
    no attribute '_debug'"): a demo signalled between two levels did so in CI. The thread's
    signal mask, tried first, does not hold a signal sent to the process: any thread that
    does not block it takes it, and Python runs the handler in the main thread at its next
    bytecode ('_signal_handlers' missing, in a full run of the suite on 2026-12-07). So the
    handlers are held at Python's level. A loop whose signal's handler raises once it is
    whole is closed. Only the main thread sets handlers."""
    def make() -> asyncio.AbstractEventLoop:
        if threading.current_thread() is not threading.main_thread():
            return factory()
        noted: list[tuple[int, Any]] = []

        def note(signum: int, frame: Any) -> None:
            noted.append((signum, frame))

        old = {sig: h for sig in _INTERRUPTS if callable(h := signal.getsignal(sig))}
        for sig in old:
            signal.signal(sig, note)
        loop: asyncio.AbstractEventLoop | None = None
        try:
            loop = factory()
            return loop
        finally:
            for sig, h in old.items():
                signal.signal(sig, h)
            try:
                for signum, frame in noted:  # each handler, once the loop is whole
                    old[signum](signum, frame)
            except BaseException:
                if loop is not None:
                    loop.close()
                raise
    return make


def run_loop(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)` on the event loop `event_loop_name()` names (Ctrl-C behaves
    the same on both: the main task is cancelled, then KeyboardInterrupt). A signal that
    lands while the loop is being built waits until it is whole (`_built_whole`), and a
    coroutine a signal kept from starting is closed, not left to warn."""
    if event_loop_name() == "uvloop":
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    else:
        factory = asyncio.new_event_loop
    try:
        with asyncio.Runner(loop_factory=_built_whole(factory)) as runner:
            return runner.run(coro)
    finally:
        coro.close()  # a no-op once it ran


_frozen = 0  # nesting depth of steady_gc


@contextlib.contextmanager
def steady_gc() -> Iterator[None]:
    """Keep the collector's pauses out of the measured gaps: collect once, then freeze
    what exists (the client, its session, the specs) into the permanent generation, so
    the collections a level triggers only scan what the level allocates. Without it a
    full collection over a 256-stream level's objects stalls every stream at once
    (`python bench/client_gc.py --streams 256 --repeats 5`, 2026-12-01: the longest pause
    in a level 38.4 ms, 11.8 ms frozen; medians of 5). vLLM's engine freezes its start-up
    objects for the same reason. The collector stays on: a long level still frees its
    cycles. Enter it before the level's clock starts: the one collection it runs takes long
    in a big process."""
    global _frozen
    if _frozen == 0:
        gc.collect()
        gc.freeze()
    _frozen += 1
    try:
        yield
    finally:
        _frozen -= 1
        if _frozen == 0:
            gc.unfreeze()


class Sender(Protocol):
    async def send(self, spec: RequestSpec, *, deadline: float | None = None) -> RequestRecord:
        ...


async def _send(sender: Sender, spec: RequestSpec, deadline: float | None) -> RequestRecord:
    """One request's record, whatever its send raised: a failure the client did not turn
    into a record (a bug, an odd server) is stored as error kind "client" instead of
    ending the stream and losing the request unseen."""
    try:
        return await sender.send(spec, deadline=deadline)
    except Exception as e:
        from bstar.loadgen.stream import short

        return RequestRecord(index=spec.index, ok=False, start_s=time.time(),
                             warmup=spec.warmup, error_kind="client",
                             error=short(f"{type(e).__name__}: {e}"),
                             expected_prompt_tokens=spec.expected_prompt_tokens,
                             expected_output_tokens=spec.max_tokens)


async def drive(
    sender: Sender,
    requests: Iterable[RequestSpec],
    *,
    concurrency: int | None = None,
    rate: float | None = None,
    deadline: float | None = None,
    stop: asyncio.Event | None = None,
    seed: int = 0,
) -> AsyncIterator[RequestRecord]:
    """Send `requests`, yielding records in completion order.

    Closed loop (`concurrency=N`): N streams, each sending its next request as soon as
    the previous one finished. Open loop (`rate=R` requests/s): Poisson arrivals, each
    request sent on arrival whatever is in flight (`concurrency`, if also given, caps
    the in-flight count). No request starts after `deadline` (time.monotonic) or once
    `stop` is set; requests in flight at the deadline end with error_kind "time_limit".
    Long on purpose: one scheduler loop (closed loop, Poisson arrivals, deadline, stop)
    whose tasks and queue must share one frame to yield records in completion order.
    """
    if concurrency is None and rate is None:
        raise ValueError("give concurrency, rate or both")
    it: Iterator[RequestSpec] = iter(requests)
    queue: asyncio.Queue[RequestRecord | None] = asyncio.Queue()

    def may_start() -> bool:
        if stop is not None and stop.is_set():
            return False
        return deadline is None or time.monotonic() < deadline

    async def closed_stream() -> None:
        try:
            while may_start():
                spec = next(it, None)
                if spec is None:
                    return
                queue.put_nowait(await _send(sender, spec, deadline))
        finally:
            queue.put_nowait(None)

    async def open_arrivals() -> None:
        assert rate is not None
        import numpy as np

        from bstar.stats import poisson_gaps_s

        rng = np.random.default_rng(seed)
        cap = asyncio.Semaphore(concurrency) if concurrency else None
        inflight: set[asyncio.Task[None]] = set()

        async def one(spec: RequestSpec) -> None:
            try:
                queue.put_nowait(await _send(sender, spec, deadline))
            finally:
                if cap is not None:
                    cap.release()

        try:
            next_t = time.monotonic()
            while may_start():
                spec = next(it, None)
                if spec is None:
                    break
                delay = next_t - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                    if not may_start():
                        break
                if cap is not None:
                    await cap.acquire()
                task = asyncio.create_task(one(spec))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
                next_t += float(poisson_gaps_s(rate, rng, 1)[0])
            if inflight:
                await asyncio.gather(*inflight)
        finally:
            queue.put_nowait(None)

    if rate is not None:
        tasks = [asyncio.create_task(open_arrivals())]
    else:
        assert concurrency is not None
        tasks = [asyncio.create_task(closed_stream()) for _ in range(concurrency)]
    remaining = len(tasks)
    try:
        while remaining:
            rec = await queue.get()
            if rec is None:
                remaining -= 1
                continue
            yield rec
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
