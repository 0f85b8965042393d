"""Start and stop real inference servers as child processes, on 127.0.0.1 only.

bstar measures live OpenAI-compatible servers; its tests and `bstar demo` start them
here. Every server runs as a child process in its own process group, so stopping it
stops everything it spawned (vLLM forks an engine process), and its output goes to a
log file that is kept for post-mortems and quoted in `ServerStartError`.

Only the standard library is used here: the health polling must work in the lightest
install, and the sweep reuses `ManagedServer` for arbitrary `--server-cmd` commands.

The child that hosts llama.cpp (through `xllamacpp`) is `run_llamacpp`, started as
    python -m bstar.commands.host llamacpp --model tiny.gguf --port 8080 ...
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

HOST = "127.0.0.1"
_LOG_TAIL_BYTES = 4000


class ServerStartError(RuntimeError):
    """The server exited or was not healthy in time. The message ends with its log tail."""

    def __init__(self, message: str, log_path: Path | None, log_tail: str) -> None:
        self.log_path = log_path
        self.log_tail = log_tail
        where = f" (log: {log_path})" if log_path else ""
        super().__init__(f"{message}{where}\n--- log tail ---\n{log_tail}")


def free_port(host: str = HOST) -> int:
    """A TCP port free right now on `host` (the OS picks it; a tiny race remains)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# Proxies must never see traffic to a local server: an http_proxy in the environment
# would otherwise route 127.0.0.1 through it and health checks would time out.
_NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    """True when GET `url` answers 2xx (a 503 'loading model' counts as not yet)."""
    try:
        with _NO_PROXY_OPENER.open(url, timeout=timeout_s) as resp:
            return 200 <= int(resp.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _log_tail(path: Path | None, nbytes: int = _LOG_TAIL_BYTES) -> str:
    if path is None or not path.exists():
        return "(no log)"
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - nbytes))
        return f.read().decode("utf-8", "replace")


# Servers still running at interpreter exit are stopped, so a failing test or a
# Ctrl-C in the demo does not leave a server holding CPU and ports.
_LIVE: weakref.WeakSet[ManagedServer] = weakref.WeakSet()


@atexit.register
def _stop_all_live() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop()


class ManagedServer:
    """Run `cmd` in its own process group; wait until `health_url` answers 2xx.

    `env` holds variables laid over the current environment (None: inherit as is).
    The log (stdout and stderr together) goes to `log_path`, or to a temporary file
    that is kept after stop so it can be read. `url` is informational (the base URL
    clients should use); it defaults to the scheme and host of `health_url`.
    """

    def __init__(
        self,
        cmd: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        health_url: str,
        timeout_s: float = 120.0,
        log_path: str | os.PathLike[str] | None = None,
        url: str | None = None,
        cwd: str | os.PathLike[str] | None = None,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self.cmd = [str(c) for c in cmd]
        self.env = dict(env) if env is not None else None
        self.health_url = health_url
        self.timeout_s = timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.cwd = cwd
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="bstar-server-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        if url is None:
            parsed = urllib.parse.urlsplit(health_url)
            url = f"{parsed.scheme}://{parsed.netloc}"
        self.url = url
        self.process: subprocess.Popen[bytes] | None = None
        self.start_time_s: float | None = None  # seconds from spawn to healthy

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> Self:
        if self.process is not None:
            raise RuntimeError("server already started")
        env = None
        if self.env is not None:
            env = {**os.environ, **self.env}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with self.log_path.open("ab") as log:
            from bstar.redact import redact

            # The command as run, its secrets masked (a --server-cmd's --api-key K).
            log.write(f"$ {redact(' '.join(self.cmd))}\n".encode())
            log.flush()
            # start_new_session: the child leads a new process group, so stop() can
            # signal everything it spawns without touching our own group.
            self.process = subprocess.Popen(
                self.cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
            )
        _LIVE.add(self)
        try:
            self._wait_healthy(t0)
        except BaseException:
            self.stop()
            raise
        self.start_time_s = time.monotonic() - t0
        return self

    def _wait_healthy(self, t0: float) -> None:
        assert self.process is not None
        deadline = t0 + self.timeout_s
        delay = 0.05
        while True:
            code = self.process.poll()
            if code is not None:
                raise ServerStartError(
                    f"server exited with code {code} before it was healthy: {self.cmd[0]}",
                    self.log_path,
                    _log_tail(self.log_path),
                )
            if http_ok(self.health_url):
                return
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"server not healthy at {self.health_url} after {self.timeout_s:.0f} s",
                    self.log_path,
                    _log_tail(self.log_path),
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> int | None:
        """SIGTERM the process group, then SIGKILL it after `stop_timeout_s`.

        Returns the leader's exit code (None if it was never started). Safe to call
        twice.
        """
        proc = self.process
        if proc is None:
            return None
        _LIVE.discard(self)
        pgid = proc.pid  # leader of its own session: pgid == pid
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=self.stop_timeout_s)
        # Children of the leader (vLLM's engine core) may outlive it: kill the group
        # whatever the leader did.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        try:
            code: int | None = proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        # Orphaned grandchildren are reaped by init, not by us: wait briefly until the
        # group is empty, so a caller that starts the next server finds CPU and memory
        # free. Bounded, because an init that never reaps leaves zombies forever.
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.05)
        return code

    def log_tail(self, nbytes: int = _LOG_TAIL_BYTES) -> str:
        return _log_tail(self.log_path, nbytes)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# -- llama.cpp (xllamacpp) ---------------------------------------------------------------


class LlamaCppServer(ManagedServer):
    """llama.cpp's server on a GGUF file, hosted by `xllamacpp` in a child process.

    `n_parallel` is the number of slots (the most sequences decoded together);
    `ctx_per_slot` the context each slot gets (llama.cpp's n_ctx is the total).
    Metrics (`/metrics`) and slots (`/slots`) endpoints are on. Needs `bstar[llamacpp]`.
    """

    def __init__(
        self,
        gguf_path: str | os.PathLike[str],
        *,
        port: int | None = None,
        n_parallel: int = 16,
        ctx_per_slot: int = 2048,
        threads: int = 2,
        alias: str = "tiny",
        timeout_s: float = 60.0,
        log_path: str | os.PathLike[str] | None = None,
        python: str | None = None,
        poll: int = 0,
    ) -> None:
        self.gguf_path = Path(gguf_path)
        if not self.gguf_path.is_file():
            raise FileNotFoundError(f"GGUF model not found: {self.gguf_path}")
        self.port = port if port is not None else free_port()
        self.n_parallel = n_parallel
        self.ctx_per_slot = ctx_per_slot
        self.threads = threads
        self.alias = alias
        cmd = [
            python or sys.executable,
            "-m",
            "bstar.commands.host",
            "llamacpp",
            "--model",
            str(self.gguf_path),
            "--port",
            str(self.port),
            "--n-parallel",
            str(n_parallel),
            "--ctx-per-slot",
            str(ctx_per_slot),
            "--threads",
            str(threads),
            "--alias",
            alias,
            "--poll",
            str(poll),
        ]
        super().__init__(
            cmd,
            health_url=f"http://{HOST}:{self.port}/health",
            timeout_s=timeout_s,
            log_path=log_path,
        )


def run_llamacpp(gguf_path: str, port: int, *, n_parallel: int = 16, ctx_per_slot: int = 2048,
                 threads: int = 2, alias: str = "tiny", poll: int = 0) -> int:
    """Child-process body: host llama.cpp until SIGTERM or until our parent dies."""
    try:
        import xllamacpp
    except ImportError:
        print(
            "bstar: the llama.cpp server needs xllamacpp; "
            "install the extra: pip install 'bstar[llamacpp]'",
            file=sys.stderr,
        )
        return 2

    p = xllamacpp.CommonParams()
    p.model.path = gguf_path
    p.model_alias = {alias}
    p.hostnames = [HOST]
    p.port = port
    p.n_parallel = n_parallel
    # n_ctx is the total over all slots; each slot gets n_ctx / n_parallel.
    p.n_ctx = n_parallel * ctx_per_slot
    p.cont_batching = True
    p.endpoint_metrics = True
    p.endpoint_slots = True
    p.use_jinja = True
    p.cpuparams.n_threads = threads
    p.cpuparams_batch.n_threads = threads
    # llama.cpp's worker threads spin ("poll", 0-100, default 50) waiting for the next
    # graph instead of sleeping. On a few shared cores that spinning takes CPU from
    # everything else (the client measuring it, other servers, other tests); 0 sleeps.
    p.cpuparams.poll = poll
    p.cpuparams_batch.poll = poll
    # Do not let llama.cpp shrink the context to "fit" memory: the slot sizes are
    # part of the experiment. No web UI, no network look-ups.
    p.fit_params = False
    p.ui = False
    p.offline = True

    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    parent = os.getppid()
    server = xllamacpp.Server(p)  # serves in background threads until deleted
    print(f"bstar: llama.cpp serving {gguf_path} on http://{HOST}:{port}", flush=True)
    # If the parent is killed hard, no SIGTERM comes: reparenting is the sign to go.
    while not stop and os.getppid() == parent:
        time.sleep(0.2)
    del server
    return 0


# -- vLLM on CPU ---------------------------------------------------------------------------


def vllm_cpu_command(
    python: str | os.PathLike[str],
    model_dir: str | os.PathLike[str],
    *,
    port: int,
    max_num_seqs: int,
    max_model_len: int = 2048,
    served_name: str = "tiny",
    kv_cache_memory_bytes: int | None = None,
) -> list[str]:
    """The command that starts vLLM's OpenAI server on CPU for `model_dir`.

    `python -m vllm.entrypoints...` because the `vllm` console script fails under the
    `vllm-cpu` distribution name. float32 matches the weights on disk; eager mode
    starts in ~50 s where compiled mode takes 100-150 s and runs no faster here.
    `kv_cache_memory_bytes`: an exact KV pool (vLLM's --kv-cache-memory-bytes; then leave
    VLLM_CPU_KVCACHE_SPACE out of the environment, which would override it in whole GiB).
    """
    extra = ([] if kv_cache_memory_bytes is None
             else ["--kv-cache-memory-bytes", str(kv_cache_memory_bytes)])
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_name,
        "--host",
        HOST,
        "--port",
        str(port),
        "--max-num-seqs",
        str(max_num_seqs),
        "--max-model-len",
        str(max_model_len),
        "--dtype",
        "float32",
        "--enforce-eager",
        *extra,
    ]


def _count_cpus(spec: str) -> int:
    """Number of CPUs in a list like '0-1' or '0,2-3'."""
    n = 0
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            n += int(hi) - int(lo) + 1
        else:
            n += 1
    return max(n, 1)


def vllm_cpu_env(threads: str = "0-1", kv_cache_gib: float | None = 1) -> dict[str, str]:
    """Environment for vLLM on CPU: bind OpenMP to `threads`, reserve no core.

    By default vLLM keeps one core for its API process; on a 2-core machine that
    halves the engine, so both cores go to the engine. The hub and usage-stats
    variables keep it from reaching for the network, which is not there.
    `kv_cache_gib` None leaves VLLM_CPU_KVCACHE_SPACE out (for --kv-cache-memory-bytes).
    """
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "" if kv_cache_gib is None else f"{kv_cache_gib:g}",
        "VLLM_CPU_OMP_THREADS_BIND": threads,
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "OMP_NUM_THREADS": str(_count_cpus(threads)),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if kv_cache_gib is None:
        del env["VLLM_CPU_KVCACHE_SPACE"]
    return env


def vllm_cpu_server(
    python: str | os.PathLike[str],
    model_dir: str | os.PathLike[str],
    *,
    max_num_seqs: int,
    port: int | None = None,
    max_model_len: int = 2048,
    served_name: str = "tiny",
    threads: str = "0-1",
    kv_cache_gib: float = 1,
    timeout_s: float = 300.0,
    log_path: str | os.PathLike[str] | None = None,
) -> ManagedServer:
    """A ManagedServer (not yet started) running vLLM on CPU; use it with `with`."""
    port = port if port is not None else free_port()
    return ManagedServer(
        vllm_cpu_command(
            python,
            model_dir,
            port=port,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            served_name=served_name,
        ),
        env=vllm_cpu_env(threads, kv_cache_gib),
        health_url=f"http://{HOST}:{port}/health",
        timeout_s=timeout_s,
        log_path=log_path,
    )
