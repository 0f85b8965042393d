"""`bstar sweep --workers N` and `--ray`: a level's streams split over worker processes or
Ray actors give the same level results as one process against the fixed-rate token server
(bench/token_server.py on 127.0.0.1): the same requests, prompts and exact tokens, every
record stored once, the level's boundaries holding every record. Nothing here asserts a
timing threshold that load on the machine could break; durations are only checked against
what the fixed-rate server makes physically necessary."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bstar.loadgen.client import RequestSpec
from bstar.loadgen.sweep import SweepConfig, SweepResult, run_sweep
from bstar.loadgen.workers import WorkerJob, split_level

pytest.importorskip("aiohttp", reason="needs aiohttp (a base dependency)")

from conftest import TokenServerFactory

INTERVAL_MS = 5
OUT = 10
LEVELS = [1, 3, 8]
NUM = 24


def _cfg(url: str, **kw: Any) -> SweepConfig:
    base: dict[str, Any] = {"url": url, "served_model": "tiny", "concurrency": LEVELS,
                            "input_len": 8, "output_len": OUT, "num_requests": NUM,
                            "request_timeout_s": 60, "level_time_limit_s": 120,
                            "scrape_interval_s": 0.2, "seed": 1234}
    base.update(kw)
    return SweepConfig(**base)


def _shape(res: SweepResult) -> list[tuple[Any, ...]]:
    """What load cannot change: per level, its load, status, counts and exact tokens."""
    out = []
    for lv in res.levels:
        s = lv.stats or {}
        out.append((lv.concurrency, lv.status, s.get("requests"), s.get("completed"),
                    s.get("errors"), s.get("output_tokens"), s.get("input_tokens"),
                    s.get("token_source"), s.get("prompts_sha256")))
    return out


def _check_store(db: Path, res: SweepResult) -> None:
    """Every request of every level stored exactly once, warm-up apart, and each level's
    duration holding its records (they all ran inside the level's boundaries)."""
    con = sqlite3.connect(db)
    try:
        for lv in res.levels:
            (level_id,) = con.execute("SELECT id FROM levels WHERE run_id = ? AND idx = ?",
                                      (res.run_id, lv.idx)).fetchone()
            rows = con.execute("SELECT idx, warmup, start_s, e2e_s, output_tokens, ok FROM "
                               "requests WHERE level_id = ?", (level_id,)).fetchall()
            measured = [r for r in rows if not r[1]]
            warm = [r for r in rows if r[1]]
            assert sorted(r[0] for r in measured) == list(range(NUM))  # none lost, none twice
            assert sorted(r[0] for r in warm) == list(range(-lv.concurrency, 0))
            assert all(r[5] and r[4] == OUT for r in measured)
            span = max(r[2] + r[3] for r in measured) - min(r[2] for r in measured)
            assert lv.stats is not None
            # The level starts before its first request and ends with its last one (the
            # wall clock the records carry and the monotonic one agree over seconds).
            assert lv.stats["duration_s"] >= span - 0.02
            # A fixed-rate server cannot stream faster than its interval: rounds of OUT
            # tokens each, at least (OUT - 1) intervals apart.
            rounds = -(-NUM // lv.concurrency)
            assert lv.stats["duration_s"] >= rounds * (OUT - 1) * INTERVAL_MS / 1e3
    finally:
        con.close()


def test_split_level_is_an_exact_partition() -> None:
    specs = [RequestSpec(i, 4, prompt=str(i)) for i in range(50)]
    warm = [RequestSpec(-i - 1, 4, prompt=str(i)) for i in range(7)]
    base = WorkerJob(url="http://127.0.0.1:1", model="m", endpoint="completions",
                     api_key="sk-never-shown", request_timeout_s=1, extra_body={}, warm=[],
                     specs=[], concurrency=None, rate=None, seed=0, level_time_limit_s=1)
    assert "sk-never-shown" not in repr(base)
    for workers, streams in ((3, 7), (4, 2), (1, 5), (8, 8)):
        jobs = split_level(specs, warm, workers=workers, concurrency=streams, rate=None,
                           seed=3, base=base)
        assert len(jobs) == min(workers, streams)
        assert sum(j.concurrency or 0 for j in jobs) == streams
        assert sorted(s.index for j in jobs for s in j.specs) == list(range(50))
        assert sorted(s.index for j in jobs for s in j.warm) == sorted(s.index for s in warm)
        for j in jobs:  # each worker's streams carry its share of the requests
            assert abs(len(j.specs) - len(specs) * (j.concurrency or 0) / streams) <= (
                j.concurrency or 0)
    jobs = split_level(specs, warm, workers=4, concurrency=None, rate=10.0, seed=3,
                       base=base)
    assert sum(j.rate or 0 for j in jobs) == pytest.approx(10.0)
    assert len({j.seed for j in jobs}) == 4  # independent Poisson streams
    assert sorted(s.index for j in jobs for s in j.specs) == list(range(50))


@pytest.mark.slow  # over 1.4 s on the 2-core machine: the fast loop stays under a minute
def test_workers_give_the_one_process_results(token_server: TokenServerFactory,
                                               tmp_path: Path) -> None:
    srv = token_server(interval_ms=INTERVAL_MS)
    one = run_sweep(_cfg(srv.url), db=tmp_path / "one.db")
    two = run_sweep(_cfg(srv.url, workers=2), db=tmp_path / "two.db")
    assert one.status == two.status == "completed"
    assert _shape(two) == _shape(one)
    assert two.run["options"]["workers"] == 2
    _check_store(tmp_path / "one.db", one)
    _check_store(tmp_path / "two.db", two)
    for a, b in zip(one.levels, two.levels, strict=True):
        # Within noise: the same fixed-rate server streams the same tokens per second.
        assert a.stats and b.stats
        assert b.stats["throughput_tok_s"] == pytest.approx(a.stats["throughput_tok_s"],
                                                            rel=0.5)


@pytest.mark.slow  # over 1.4 s on the 2-core machine: the fast loop stays under a minute
def test_workers_open_loop_sends_every_request_once(token_server: TokenServerFactory,
                                                    tmp_path: Path) -> None:
    srv = token_server(interval_ms=2)
    db = tmp_path / "r.db"
    res = run_sweep(_cfg(srv.url, concurrency=None, rate=[40.0], workers=3,
                         warmup_requests=0), db=db)
    assert res.status == "completed"
    s = res.levels[0].stats or {}
    assert (s["requests"], s["completed"], s["output_tokens"]) == (NUM, NUM, NUM * OUT)
    con = sqlite3.connect(db)
    idx = [r[0] for r in con.execute("SELECT idx FROM requests WHERE warmup = 0")]
    con.close()
    assert Counter(idx) == Counter(range(NUM))


@pytest.mark.slow  # over 1.4 s on the 2-core machine: the fast loop stays under a minute
@pytest.mark.ray
def test_ray_actors_give_the_one_process_results(token_server: TokenServerFactory,
                                                 tmp_path: Path) -> None:
    pytest.importorskip("ray")
    srv = token_server(interval_ms=INTERVAL_MS)
    one = run_sweep(_cfg(srv.url), db=tmp_path / "one.db")
    ray = run_sweep(_cfg(srv.url, workers=2, ray="local"), db=tmp_path / "ray.db")
    assert one.status == ray.status == "completed"
    assert _shape(ray) == _shape(one)
    _check_store(tmp_path / "ray.db", ray)
