"""llama.cpp started by bstar (and by the test fixtures) does not spin its threads: polling
is off (`cpuparams.poll = 0`), so an idle server leaves the shared cores to the tests and
clients that run next to it."""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
import types
import urllib.request
from typing import Any

import pytest

from bstar import servers
from bstar.servers import LlamaCppServer


def test_child_starts_llamacpp_with_polling_off(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []

    class Params:
        def __init__(self) -> None:
            self.model = types.SimpleNamespace(path="")
            self.cpuparams = types.SimpleNamespace(n_threads=0, poll=50)  # llama.cpp: 50
            self.cpuparams_batch = types.SimpleNamespace(n_threads=0, poll=50)
            made.append(self)

    fake = types.ModuleType("xllamacpp")
    fake.CommonParams = Params  # type: ignore[attr-defined]
    fake.Server = lambda p: object()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "xllamacpp", fake)
    # The child serves until its parent goes: a parent pid that changes ends it at once.
    ppids = itertools.count(1000)
    monkeypatch.setattr(servers.os, "getppid", lambda: next(ppids))
    monkeypatch.setattr(servers.signal, "signal", lambda *a: None)
    from bstar.commands import host  # the child's entry point (python -m bstar.commands.host)

    assert host.main(["llamacpp", "--model", "m.gguf", "--port", "1", "--threads", "2"]) == 0
    (p,) = made
    assert p.cpuparams.poll == 0 and p.cpuparams_batch.poll == 0
    assert p.cpuparams.n_threads == 2


def test_server_command_passes_poll(tmp_path: Any) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    cmd = LlamaCppServer(gguf, port=1).cmd
    assert cmd[cmd.index("--poll") + 1] == "0"
    cmd = LlamaCppServer(gguf, port=1, poll=50).cmd
    assert cmd[cmd.index("--poll") + 1] == "50"


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of every thread of `pid` (Linux /proc)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_idle_llamacpp_uses_no_cpu(llamacpp_server: LlamaCppServer) -> None:
    body = json.dumps({"model": "tiny", "prompt": "hello world " * 4, "max_tokens": 16,
                       "ignore_eos": True}).encode()
    for _ in range(2):  # work first: threads that poll would keep spinning after it
        req = urllib.request.Request(llamacpp_server.url + "/v1/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            r.read()
    assert llamacpp_server.process is not None
    pid = llamacpp_server.process.pid
    time.sleep(0.3)
    c0, t0 = _cpu_s(pid), time.monotonic()
    time.sleep(2.0)
    share = (_cpu_s(pid) - c0) / (time.monotonic() - t0)
    # Measured idle: 0.00-0.01 of a core; the bound leaves room for a busy shared machine.
    assert share < 0.1, f"idle llama.cpp used {share:.0%} of a core"
