"""Repeated sweeps are comparable: without --seed each run sends prompts of its own (so
the server's prefix cache cannot serve a repeat), the store keeps what was sent, --seed
replays a run's prompts exactly, and the server's prefix-cache hits are reported.

bench/token_server.py caches whole prompts (a repeat counts all its tokens as cached, in
usage and in vLLM-style /metrics counters), so a replay shows up as cache hits.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiohttp")

from bstar.cli import main
from bstar.loadgen.scrape import parse_prometheus, snapshot
from bstar.loadgen.store import Store
from conftest import TokenServerFactory
from ptyterm import run_in_pty

INPUT_LEN = 24


def sweep(url: str, db: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    rc = main(["sweep", "--url", url, "--served-model", "tiny", "--concurrency", "1,2",
               "--input-len", str(INPUT_LEN), "--output-len", "4", "--num-requests", "4",
               "--warmup-requests", "0", "--db", str(db), "--json", "--quiet", *extra])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0, d["status_detail"]
    return d


def sent(db: Path, run_id: str) -> list[list[str]]:
    """The prompts each level sent, from the store."""
    with Store(db) as st:
        return [[p["prompt"] for p in st.prompts(lv.id)] for lv in st.levels(run_id)]


@pytest.mark.slow  # starts the token server
def test_runs_without_seed_send_new_prompts(token_server: TokenServerFactory, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    srv = token_server(interval_ms=1)
    db = tmp_path / "r.db"
    a = sweep(srv.url, db, capsys)
    b = sweep(srv.url, db, capsys)
    pa, pb = sent(db, a["run_id"]), sent(db, b["run_id"])
    assert [len(lv) for lv in pa] == [4, 4] and [len(lv) for lv in pb] == [4, 4]
    flat_a = {p for lv in pa for p in lv}
    flat_b = {p for lv in pb for p in lv}
    assert len(flat_a) == 8 and len(flat_b) == 8  # unique per level and request
    assert not flat_a & flat_b  # and per run
    # Each prompt is still exactly INPUT_LEN tokens (the token server: one char per token).
    assert all(len(p) == INPUT_LEN for p in flat_a | flat_b)
    assert a["options"]["seed"] != b["options"]["seed"]  # the seed drawn is recorded
    for lv in a["levels"] + b["levels"]:
        assert lv["prefix_cache_hit_rate"] == 0.0
        assert lv["server"]["prefix_cache_hit_tokens"] == 0
    with sqlite3.connect(db) as con:
        (n,) = con.execute("SELECT COUNT(*) FROM prompts").fetchone()
    assert n == 16


@pytest.mark.slow  # starts the token server
def test_same_seed_replays_the_prompts_and_shows_the_cache(
        token_server: TokenServerFactory, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    srv = token_server(interval_ms=1)
    db = tmp_path / "r.db"
    a = sweep(srv.url, db, capsys, "--seed", "7")
    b = sweep(srv.url, db, capsys, "--seed", "7")
    assert sent(db, a["run_id"]) == sent(db, b["run_id"])
    assert a["options"]["seed"] == b["options"]["seed"] == 7
    for la, lb in zip(a["levels"], b["levels"], strict=True):
        assert la["prefix_cache_hit_rate"] == 0.0  # first time: nothing cached
        # The replay is served from the cache, and the output says so.
        assert lb["prefix_cache_hit_rate"] == 1.0
        assert lb["server"]["prefix_cache_hit_tokens"] == 4 * INPUT_LEN
    # A seed drawn by a run replays it too.
    c = sweep(srv.url, db, capsys, "--seed", str(b["options"]["seed"]))
    assert sent(db, c["run_id"]) == sent(db, b["run_id"])


@pytest.mark.slow  # starts the token server
def test_replay_shows_in_the_terminal(token_server: TokenServerFactory, tmp_path: Path) -> None:
    srv = token_server(interval_ms=1)
    db = tmp_path / "r.db"
    args = ["sweep", "--url", srv.url, "--concurrency", "1", "--input-len", "16",
            "--output-len", "4", "--num-requests", "3", "--warmup-requests", "0",
            "--db", str(db), "--quiet"]
    rc, first = run_in_pty(args, columns=80)
    assert rc == 0, first
    assert "prefix cache" not in first
    seed = re.search(r"--seed (\d+) replays", first)
    assert seed, first
    rc, again = run_in_pty([*args, "--seed", seed.group(1)], columns=80)
    assert rc == 0, again
    line = next(ln for ln in again.splitlines() if "prefix cache" in ln)
    assert "48 of 48 prompt tokens (100%)" in line and len(line) <= 80


def test_prefix_cache_counters_vllm_and_llamacpp() -> None:
    vllm = snapshot(parse_prometheus(
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0\n'
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 250.0\n'))
    assert (vllm.prefix_cache_queries_total, vllm.prefix_cache_hits_total) == (1000, 250)
    # llama.cpp counts processed prompt tokens apart from the cached ones.
    lcpp = snapshot(parse_prometheus("llamacpp:prompt_tokens_total 117\n"
                                     "llamacpp:prompt_tokens_cached_total 115\n"))
    assert (lcpp.prefix_cache_queries_total, lcpp.prefix_cache_hits_total) == (232, 115)
    none = snapshot(parse_prometheus("vllm:num_requests_running 1\n"))
    assert none.prefix_cache_hits_total is None and none.prefix_cache_queries_total is None
