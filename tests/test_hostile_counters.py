"""Counters that lie (issue 40, item 1): prefix-cache counters that fall between two scrapes
(a restarted server), report more hits than queries, or are not finite. Checked where they
enter: the scraper starts a new segment at a fall and says so; a stored run's or a profile's
counters are read by one reader that refuses, by the counter's name, what no cache can
count; `calibrate -o` writes only a profile `--profile` loads back."""

from __future__ import annotations

import asyncio
import math
import re
from pathlib import Path
from typing import Any

import pytest

from bstar import calibrate as cal
from bstar.cli import main
from bstar.errors import BstarError
from bstar.loadgen.client import RequestRecord
from bstar.loadgen.measured import measured_traffic, traffic_from_profile
from bstar.loadgen.scrape import Scraper, read_snapshot
from bstar.loadgen.store import Store
from test_profile_workload import stored_sweep as calibration_sweep


def _metrics(hits: float, queries: float) -> str:
    return (f"vllm:prefix_cache_hits_total {hits}\n"
            f"vllm:prefix_cache_queries_total {queries}\n")


def scraped(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    """The level stats a Scraper reports over these successive (hits, queries) scrapes."""
    scraper = Scraper(client=None)
    texts = iter(pairs)

    async def read() -> tuple[Any, None]:
        return read_snapshot(_metrics(*next(texts))), None

    scraper._read = read  # type: ignore[method-assign]

    async def go() -> None:
        for _ in pairs:
            await scraper._scrape_once()

    asyncio.run(go())
    return scraper.stats().to_dict()


def test_a_counter_that_falls_starts_a_new_segment() -> None:
    # 1000 -> 1600 hits, then the server restarts and counts 0 -> 300 again.
    st = scraped([(1000, 2000), (1600, 3000), (100, 400), (300, 900)])
    assert st["prefix_cache_segments"] == 2
    want_hits, want_queries = (1600 - 1000) + 300, (3000 - 2000) + 900
    assert st["prefix_cache_hit_tokens"] == want_hits
    assert st["prefix_cache_query_tokens"] == want_queries
    assert st["prefix_cache_hit_rate"] == pytest.approx(want_hits / want_queries)
    assert 0 <= st["prefix_cache_hit_rate"] <= 1
    # No fall: one segment, the plain increase.
    st = scraped([(10, 100), (60, 300)])
    assert (st["prefix_cache_segments"], st["prefix_cache_hit_tokens"],
            st["prefix_cache_query_tokens"]) == (1, 50, 200)


def test_hits_above_queries_are_refused_by_name() -> None:
    st = scraped([(0, 0), (5000, 10)])
    assert st["prefix_cache_hit_tokens"] is None and st["prefix_cache_hit_rate"] is None
    assert "prefix_cache_hits" in st["prefix_cache_refused"]


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-5", "1e300"])
def test_a_counter_that_is_no_count_is_refused_by_name(value: str) -> None:
    # Left out of the level's counts (the increase runs between the scrapes that were
    # counts), and the level says which counter and what it held.
    st = scraped([(10, 100), (value, 200), (60, 300)])  # type: ignore[list-item]
    assert "vllm:prefix_cache_hits_total" in st["prefix_cache_refused"]
    assert (st["prefix_cache_hit_tokens"], st["prefix_cache_query_tokens"]) == (50, 200)


def lying_run(db: Path, server: dict[str, Any]) -> str:
    """One level of 20 completed 100-token prompts whose server counters are `server`."""
    with Store(db) as s:
        rid = s.create_run(url="http://127.0.0.1:1/v1", served_model="m", model="llama-3-8b",
                           gpu="h100-sxm", options={}, bstar_version="test", run_id="run-lie")
        lid, _ = s.start_level(rid, 0, concurrency=4, rate=None, max_num_seqs=None)
        for i in range(20):
            s.add_request(lid, RequestRecord(index=i, ok=True, start_s=0.0, ttft_s=0.1,
                                             e2e_s=1.0, prompt_tokens=100, output_tokens=50))
        s.finish_level(lid, status="completed", server=server)
        s.update_run(rid, status="completed")
    return rid


LIES = {
    # hits 50x the queries: the hit rate was 5000%, the prompts 50,001 tokens
    "hits-above-queries": ({"prefix_cache_hit_tokens": 100_000,
                            "prefix_cache_query_tokens": 2000}, "prefix_cache_hit_tokens"),
    # a counter that fell, stored as a negative increase: -5000%
    "fell": ({"prefix_cache_hit_tokens": -100_000, "prefix_cache_query_tokens": 2000},
             "prefix_cache_hit_tokens"),
    "nan": ({"prefix_cache_hit_tokens": 10, "prefix_cache_query_tokens": math.nan},
            "prefix_cache_query_tokens"),
    "inf": ({"prefix_cache_hit_tokens": math.inf, "prefix_cache_query_tokens": 2000},
            "prefix_cache_hit_tokens"),
}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_stored_run_with_lying_counters_is_refused_by_name(
        lie: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server, counter = LIES[lie]
    db = tmp_path / "runs.db"
    lying_run(db, server)
    with pytest.raises(BstarError, match=counter):
        measured_traffic(db, "run-lie")
    assert main(["simulate", "--from-run", "run-lie", "--runs-db", str(db), "--rate", "2",
                 "--num-requests", "10", "--max-num-seqs", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bstar: error:") and "\n" not in err and counter in err
    assert "--shared-prefix-tokens" not in err  # a flag the user never gave


def test_a_profile_workload_with_lying_counters_is_refused_by_name(tmp_path: Path) -> None:
    p = tmp_path / "p.toml"
    for tab, counter in (("prefix_cache_hit_tokens = 900\nprefix_cache_query_tokens = 10",
                          "prefix_cache_hit_tokens"),
                         ("prefix_cache_hit_tokens = 9", "prefix_cache_query_tokens"),
                         ("prefix_cache_hit_tokens = nan\nprefix_cache_query_tokens = 10",
                          "prefix_cache_hit_tokens")):
        p.write_text(f"[workload]\nrun = 'r'\n{tab}\nprompt_tokens = [100]\n"
                     "output_tokens = [10]\n")
        with pytest.raises(BstarError, match=f"{p}: {counter}"):
            traffic_from_profile(p)


def test_calibrate_o_of_a_run_with_lying_counters_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db, prof = tmp_path / "runs.db", tmp_path / "p.toml"
    calibration_sweep(db, 50.0)  # hits 50 x the queries
    assert main(["calibrate", "run-hit", "--db", str(db), "--model", "llama-3-8b", "--gpu",
                 "a100-80gb-sxm", "--fit", "bandwidth,overhead_s", "-o", str(prof)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "prefix_cache_hit_tokens" in err
    assert not prof.exists()


@pytest.mark.slow  # a calibration fit: about 2 s on the shared machine
def test_calibrate_o_writes_only_what_profile_loads_back(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    db, prof = tmp_path / "runs.db", tmp_path / "p.toml"
    calibration_sweep(db, 0.5)
    real = cal.profile_toml
    # A writer that puts down what the reader refuses (a value past the schema's range).
    monkeypatch.setattr(cal, "profile_toml", lambda c: re.sub(
        r"(?m)^request_overhead_s = .*$", "request_overhead_s = 1e308", real(c)))
    assert main(["calibrate", "run-hit", "--db", str(db), "--model", "llama-3-8b", "--gpu",
                 "a100-80gb-sxm", "--fit", "bandwidth,overhead_s", "-o", str(prof)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "not written" in err and "request_overhead_s" in err
    assert not prof.exists()
