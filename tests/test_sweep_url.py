"""`--url` takes the server's root or the `/v1` base every OpenAI client uses; a level whose
every request answers 404 says which URL it tried (bench/token_server.py as the server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiohttp")

from bstar.cli import main
from bstar.loadgen.client import server_root
from bstar.loadgen.sweep import SweepConfig, run_sweep
from conftest import TokenServerFactory
from ptyterm import run_in_pty


def cfg(url: str, **kw: Any) -> SweepConfig:
    base: dict[str, Any] = {"url": url, "served_model": "tiny", "concurrency": [2],
                            "input_len": 8, "output_len": 4, "num_requests": 6,
                            "warmup_requests": 0, "request_timeout_s": 30,
                            "level_time_limit_s": 30, "scrape_interval_s": 0.2}
    base.update(kw)
    return SweepConfig(**base)


@pytest.mark.parametrize("given", ["http://h:8000", "http://h:8000/", "http://h:8000/v1",
                                   "http://h:8000/v1/", " http://h:8000/v1 "])
def test_server_root_strips_the_v1_base(given: str) -> None:
    assert server_root(given) == "http://h:8000"


def test_server_root_keeps_a_path_prefix() -> None:
    assert server_root("http://h/proxy/v1") == "http://h/proxy"


@pytest.mark.slow  # starts the token server
def test_v1_base_url_sweeps_like_the_root(token_server: TokenServerFactory,
                                          tmp_path: Path) -> None:
    srv = token_server(interval_ms=2)
    db = tmp_path / "r.db"
    with_v1 = run_sweep(cfg(srv.url + "/v1"), db=db).to_dict()
    root = run_sweep(cfg(srv.url), db=db).to_dict()
    for d in (with_v1, root):
        assert d["status"] == "completed", d["status_detail"]
        lv = d["levels"][0]
        assert lv["requests"] == 6 and lv["errors"] == 0 and lv["error_kinds"] == {}


@pytest.mark.slow  # starts the token server
def test_v1_base_url_through_the_cli(token_server: TokenServerFactory, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    srv = token_server(interval_ms=2)
    rc = main(["sweep", "--url", srv.url + "/v1/", "--concurrency", "1", "--input-len", "8",
               "--output-len", "4", "--num-requests", "3", "--db", str(tmp_path / "r.db"),
               "--json", "--quiet"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0, d["status_detail"]
    assert d["served_model"] == "tiny"  # /v1/models was found at the root, not /v1/v1
    assert d["levels"][0]["errors"] == 0


@pytest.mark.slow  # starts the token server
def test_all_404_names_the_url_tried(token_server: TokenServerFactory,
                                     tmp_path: Path) -> None:
    srv = token_server(interval_ms=2)
    d = run_sweep(cfg(srv.url + "/openai"), db=tmp_path / "r.db").to_dict()
    lv = d["levels"][0]
    assert lv["error_kinds"] == {"http_404": 6}
    assert f"{srv.url}/openai/v1/completions" in lv["status_detail"]
    assert "--url" in lv["status_detail"]


@pytest.mark.slow  # starts the token server
def test_all_404_url_in_the_terminal_at_80_columns(token_server: TokenServerFactory,
                                                   tmp_path: Path) -> None:
    srv = token_server(interval_ms=2)
    rc, out = run_in_pty(["sweep", "--url", srv.url + "/openai", "--served-model", "tiny",
                          "--concurrency", "1", "--input-len", "8", "--output-len", "4",
                          "--num-requests", "3", "--db", str(tmp_path / "r.db"), "--quiet"],
                         columns=80)
    assert rc == 1, out
    assert "Traceback" not in out
    # The URL tried is shown whole (not wrapped mid-URL), so it can be checked and copied.
    assert f"{srv.url}/openai/v1/completions" in out
