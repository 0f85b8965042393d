"""Where evaluations run, behind one interface: in this process, in a local process pool, or
on a Ray cluster (a local one started on this machine, or an existing one by address).

Every backend runs the same pure function on the same picklable tasks and yields
`(index, result)` as results finish, so the answer does not depend on the backend; only the
order results arrive in and the time they take do. Tasks are submitted in the order given
(the runner puts the longest first, so the last ones to finish are short).

Ray is an optional extra (`pip install 'bstar[ray]'`) and is imported only by its backend.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from bstar.errors import BstarError

Fn = Callable[[Any], Any]


def _warm(_: int) -> float:
    """Import what an evaluation needs, so start-up is not charged to the first task."""
    import bstar.search.evaluate  # noqa: F401

    time.sleep(0.05)  # keep each warm-up on its own worker
    return time.time()


# How long `--ray HOST:PORT` waits for the cluster's port before giving up (Ray itself
# retries a dead address for minutes).
RAY_CONNECT_TIMEOUT_S = 5.0
# How often a pool worker checks that the process that started it is alive (the portable
# net under Linux's PR_SET_PDEATHSIG).
PARENT_POLL_S = 1.0


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(PARENT_POLL_S)
        if os.getppid() != parent_pid:
            os._exit(1)


def _die_with_parent(parent_pid: int) -> None:
    """A pool worker's initializer: the worker ends when the search that started it does,
    even when that one is SIGKILLed and cannot shut its pool down (issue 19). On Linux the
    kernel delivers SIGKILL on the parent's death (prctl PR_SET_PDEATHSIG); everywhere a
    daemon thread polls the parent's pid."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before the line above took effect
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True,
                     name="bstar-parent-watch").start()


def ray_address(address: str) -> tuple[str, str] | None:
    """(host, port) of a HOST:PORT or ray://HOST:PORT address, None for "auto"; any other
    string is a one-line BstarError (Ray's own parser raises a bare ValueError)."""
    if address == "auto":
        return None
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or not host or any(c.isspace() for c in host):
        raise BstarError(f"--ray {address!r} is not a Ray address: give HOST:PORT, "
                         "ray://HOST:PORT or auto (or --ray alone for a local cluster)")
    return host, port


def ray_reachable(address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """A BstarError, within `timeout_s`, when nothing listens at a HOST:PORT (or
    ray://HOST:PORT) Ray address; "auto" is left to Ray."""
    parts = ray_address(address)
    if parts is None:
        return
    host, port = parts
    host = host.strip("[]") or "127.0.0.1"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return
    except (OSError, ValueError, OverflowError) as e:
        raise BstarError(f"cannot reach the Ray cluster at {address}: "
                         f"{getattr(e, 'strerror', None) or e or 'timed out'} "
                         "(start one with `ray start --head`, or use --ray alone for a "
                         "local cluster)") from None


class TaskFailed(BstarError):
    """A task the backend could not finish past its retries (a worker killed twice, a dead
    raylet): `index` is the item's place in the `imap_unordered` call, `why` one line.
    The search words it with the candidate's name (search.run)."""

    def __init__(self, index: int, why: str) -> None:
        self.index = index
        self.why = why
        super().__init__(why)


class Backend:
    name = "in-process"
    workers = 1

    def start(self) -> None:
        pass

    def imap_unordered(self, fn: Fn, items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        for i, x in enumerate(items):
            yield i, fn(x)

    def close(self) -> None:
        pass

    def describe(self) -> str:
        return self.name

    def __enter__(self) -> Backend:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InProcess(Backend):
    pass


class ProcessPool(Backend):
    """`jobs` worker processes on this machine (concurrent.futures)."""

    name = "processes"

    def __init__(self, jobs: int) -> None:
        if jobs < 1:
            raise BstarError(f"--jobs must be at least 1, got {jobs}")
        self.workers = jobs
        self._pool: ProcessPoolExecutor | None = None

    def start(self) -> None:
        import multiprocessing as mp

        # fork where the platform has it: workers start in milliseconds with bstar already
        # imported. The pool is started before any progress-bar thread exists.
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        self._pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context(method),
                                         initializer=_die_with_parent,
                                         initargs=(os.getpid(),))
        list(self._pool.map(_warm, range(self.workers)))

    def imap_unordered(self, fn: Fn, items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        assert self._pool is not None, "start() first"
        futures: dict[Future[Any], int] = {self._pool.submit(fn, x): i
                                           for i, x in enumerate(items)}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    yield futures[f], f.result()
        finally:
            for f in pending:
                f.cancel()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def describe(self) -> str:
        return f"{self.workers} local processes"


# Each Ray task is retried once when its worker dies (a node lost, a worker OOM-killed);
# a second death fails the search in one line (TaskFailed), and --resume re-runs what is
# left.
RAY_MAX_RETRIES = 1


def _first_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:300] + ("..." if len(text) > 300 else "")


class RayBackend(Backend):
    """Ray tasks. `address` None starts a local cluster of `num_cpus` on this machine
    (stopped on close); an address ("HOST:PORT", "ray://HOST:PORT" or "auto") joins an
    existing one, shipping this bstar package to its workers.

    The local cluster is asked for node address 127.0.0.1, but Ray resolves a loopback
    address to the machine's reachable one and (2.60, observed) its GCS server listens on
    all interfaces: Ray's token authentication, on by default, is what keeps it private."""

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        self.address = address
        self.num_cpus = num_cpus
        self.workers = num_cpus or 0
        self.start_s = 0.0
        self._ray: Any = None
        self._remote: dict[Fn, Any] = {}
        self.raylet_report = ""  # the cluster's last report about itself (hold_raylet_reports)
        self._unhold: Callable[[], None] | None = None

    def start(self) -> None:
        try:
            import ray
        except ImportError:
            raise BstarError("--ray needs Ray: pip install 'bstar[ray]'") from None
        self._ray = ray
        t0 = time.perf_counter()
        init_ray(ray, self.address, self.num_cpus or os.cpu_count() or 1)
        self._unhold = hold_raylet_reports(lambda line: setattr(self, "raylet_report", line))
        self.workers = int(ray.cluster_resources().get("CPU", 1))
        warm = ray.remote(num_cpus=1)(_warm)
        ray.get([warm.remote(i) for i in range(self.workers)])
        self.start_s = time.perf_counter() - t0

    def imap_unordered(self, fn: Fn, items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        ray = self._ray
        assert ray is not None, "start() first"
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = ray.remote(num_cpus=1,
                                                   max_retries=RAY_MAX_RETRIES)(fn)
        refs = {remote.remote(x): i for i, x in enumerate(items)}
        pending = list(refs)
        current: int | None = None  # the item whose result is being fetched
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    current = refs[ref]
                    value = ray.get(ref)
                    current = None
                    yield refs[ref], value
        except ray.exceptions.RayError as e:
            # Ray's own failures, past the task's retry (a worker killed twice:
            # WorkerCrashedError; a dead raylet: LocalRayletDiedError; a node lost; the
            # memory monitor): one line naming the task (-1: Ray failed while waiting, no
            # task's result in hand). An error the task itself raised (RayTaskError, a
            # BstarError too when the task's was) is the task's, raised as it is.
            if isinstance(e, ray.exceptions.RayTaskError):
                raise
            said = f"; Ray said: {self.raylet_report}" if self.raylet_report else ""
            raise TaskFailed(-1 if current is None else current,
                             f"{type(e).__name__} on Ray ({_first_line(e)}), after "
                             f"{RAY_MAX_RETRIES} retry{said}") from None
        finally:
            for ref in pending:
                # A dead raylet cannot cancel: what it ran died with it.
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)

    def close(self) -> None:
        if self._ray is not None:
            self._ray.shutdown()
            self._ray = None
        unhold, self._unhold = self._unhold, None
        if unhold is not None:
            unhold()

    def describe(self) -> str:
        where = "local cluster on this machine" if self.address is None else self.address
        return f"Ray ({where}, {self.workers} CPUs)"


def make_backend(jobs: int | None = None, ray: str | None = None) -> Backend:
    """`ray`: None (no Ray), "local" (start one here with `jobs` CPUs, default all)
    or an address. Without Ray, jobs > 1 is a process pool, else this process."""
    if ray is not None:
        if ray != "local":
            ray_address(ray)  # a malformed address fails now, before any work
        return RayBackend(None if ray == "local" else ray, jobs if ray == "local" else None)
    return ProcessPool(jobs) if jobs and jobs > 1 else InProcess()


def init_ray(ray: Any, address: str | None, num_cpus: int) -> None:
    """Start a local Ray cluster on this machine (`address` None: `num_cpus` CPUs, no
    dashboard, node address 127.0.0.1) or join the one at `address` (reachable first: Ray
    itself retries an address nobody listens at for a minute or more), shipping bstar's
    own package to its workers. Ray's log lines stay off the driver. `search --ray` and
    `sweep --ray` both start Ray here."""
    if address is None:
        ray.init(num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                 log_to_driver=False, configure_logging=False)
        return
    import bstar

    ray_reachable(address)
    ray.init(address=address, log_to_driver=False, configure_logging=False,
             runtime_env={"py_modules": [str(Path(bstar.__file__).parent)]})


def hold_raylet_reports(on_report: Callable[[str], None]) -> Callable[[], None] | None:
    """Ray's driver prints what the cluster reports about itself, a dead raylet's last
    20 log lines first, from a background thread (Ray 2.60: `ray._private.worker.
    listen_error_messages` calls the module's `print_to_stdstream` with pid "raylet"),
    whatever `log_to_driver` says: about 40 lines around bstar's own one-line error
    (issue 40). They are kept, not printed: `on_report` gets the first line of each, for
    the caller's one-line error, and Ray's own logs hold the rest. Returns the call that
    restores Ray's printer (None when nothing was replaced). Ray's private name is looked
    up, not required: a Ray without it prints as before. Used by `search --ray` and by
    `sweep --ray`'s load actors (loadgen/workers.py)."""
    import importlib

    try:
        rw = importlib.import_module("ray._private.worker")
    except ImportError:
        return None
    original = getattr(rw, "print_to_stdstream", None)
    if original is None or getattr(original, "_bstar_held", False):
        return None

    def held(data: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(data, dict) and data.get("pid") == "raylet":
            lines = data.get("lines") or [""]
            on_report((str(lines[0]).strip().splitlines() or [""])[0])
            return None
        return original(data, *args, **kwargs)

    held._bstar_held = True  # type: ignore[attr-defined]
    rw.print_to_stdstream = held
    return lambda: setattr(rw, "print_to_stdstream", original)
